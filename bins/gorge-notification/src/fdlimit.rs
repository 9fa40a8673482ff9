//! The open-file limit: every socket is a file descriptor, and distributions start services
//! with a soft limit (often 1024) far below the hard one. Raising soft to hard at startup
//! lets the configured socket limit, not an accident of the environment, decide.

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
