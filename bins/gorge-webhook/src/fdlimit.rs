//! The status port's share of the open-file limit. Every connection is a file descriptor,
//! and a delivery needs some of its own: its outbound connection and its per-hook lock
//! connection, besides the query pool's. If idle connections to the status port could take
//! them all, every POST would fail for want of a descriptor. So the status port holds at
//! most [`status_connection_cap`] connections: the soft limit less the reserve
//! (`Config::fd_reserve`, the derived fact `status_fd_reserve`), the same shape as
//! gorge-notification's reserve for PHP's admin POSTs.

/// Descriptors every process needs whatever its settings: standard streams, the runtime's
/// epoll and eventfds, the listener, DNS lookups, the CA file read at startup.
pub const FD_BASE: usize = 64;

/// Status connections allowed even when the limit leaves nothing above the reserve: probes
/// and scrapes must still get through.
pub const MIN_STATUS_CONNECTIONS: usize = 8;

/// How many connections the status port may hold with a soft limit of `soft`: the limit
/// less `reserve`, at least [`MIN_STATUS_CONNECTIONS`]. `None` when there is no limit.
pub fn status_connection_cap(soft: Option<u64>, reserve: usize) -> Option<usize> {
    let soft = usize::try_from(soft?).unwrap_or(usize::MAX);
    Some(soft.saturating_sub(reserve).max(MIN_STATUS_CONNECTIONS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_kept_out_of_the_status_cap() {
        assert_eq!(status_connection_cap(None, 100), None);
        assert_eq!(status_connection_cap(Some(1024), 100), Some(924));
        assert_eq!(status_connection_cap(Some(50), 100), Some(8));
    }
}
