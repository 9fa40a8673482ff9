//! The open-file limit, as both services read and raise it. Every socket is a file
//! descriptor, and distributions start services with a soft limit (often 1024) far below the
//! hard one. What each service keeps out of its unauthenticated port's reach (the client
//! port's reserve for PHP's admin POSTs, the status port's for deliveries) is its own, in its
//! `fdlimit` module; reading and raising the limit is here, once.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// The limit before and after raising; `None` is "unlimited".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimit {
    /// The soft limit the process started with.
    pub soft_before: Option<u64>,
    /// The soft limit now.
    pub soft: Option<u64>,
    /// The hard limit.
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

/// The soft open-file limit now (`None`: unlimited).
pub fn soft_limit() -> Option<u64> {
    getrlimit(Resource::Nofile).current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_ends_at_the_hard_limit_and_soft_limit_reads_it() {
        let (limit, err) = raise_to_hard();
        if err.is_none() {
            assert_eq!(limit.soft, limit.hard);
        }
        assert_eq!(soft_limit(), limit.soft);
    }
}
