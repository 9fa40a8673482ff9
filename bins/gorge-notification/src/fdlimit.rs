//! The client port's share of the open-file limit. gorge-notification raises the soft limit
//! to the hard one at startup ([`gorge_service::fdlimit::raise_to_hard`]), so the configured
//! socket limit, not an accident of the environment, decides.
//!
//! Whatever the limit, browsers must never take the descriptors PHP's admin POSTs need: the
//! client port holds at most [`client_connection_cap`] connections, keeping a reserve for
//! the admin port, the peers, the logs and the runtime.

/// Descriptors kept out of the client port's reach: the admin port's connections, peer
/// relays, DNS, logging, the runtime's own (epoll, eventfds, pipes).
pub const FD_RESERVE: u64 = 256;

/// How many connections the client port may hold with a soft limit of `soft` (upgraded
/// sockets and connections not yet upgraded together): the limit less [`FD_RESERVE`], or
/// less a quarter of it when the limit is small. `None` when there is no limit.
pub fn client_connection_cap(soft: Option<u64>) -> Option<usize> {
    let soft = soft?;
    let reserve = FD_RESERVE.min(soft / 4);
    Some(usize::try_from(soft - reserve).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_kept_out_of_the_client_cap() {
        assert_eq!(client_connection_cap(None), None);
        assert_eq!(client_connection_cap(Some(20_000)), Some(19_744));
        assert_eq!(client_connection_cap(Some(1024)), Some(768));
        // Small limits keep a quarter.
        assert_eq!(client_connection_cap(Some(400)), Some(300));
        assert_eq!(client_connection_cap(Some(0)), Some(0));
    }
}
