//! The open-file limit: every socket is a file descriptor, and distributions start services
//! with a soft limit (often 1024) far below the hard one. Raising soft to hard at startup
//! lets the configured socket limit, not an accident of the environment, decide.
//!
//! Whatever the limit, browsers must never take the descriptors PHP's admin POSTs need: the
//! client port holds at most [`client_connection_cap`] connections, keeping a reserve for
//! the admin port, the peers, the logs and the runtime.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// The limit before and after raising; `None` is "unlimited".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimit {
    pub soft_before: Option<u64>,
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one. Failing to raise it is not fatal: the
/// result says what the limit is, and the error why it stayed.
pub fn raise_to_hard() -> (FileLimit, Option<std::io::Error>) {
    let before = getrlimit(Resource::Nofile);
    let mut limit = FileLimit {
        soft_before: before.current,
        soft: before.current,
        hard: before.maximum,
    };
    if before.current == before.maximum {
        return (limit, None);
    }
    let raised = Rlimit {
        current: before.maximum,
        maximum: before.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            limit.soft = before.maximum;
            (limit, None)
        }
        Err(err) => (limit, Some(err.into())),
    }
}

/// Descriptors kept out of the client port's reach: the admin port's connections, peer
/// relays, DNS, logging, the runtime's own (epoll, eventfds, pipes).
pub const FD_RESERVE: u64 = 256;

/// The soft open-file limit now (`None`: unlimited).
pub fn soft_limit() -> Option<u64> {
    getrlimit(Resource::Nofile).current
}

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
