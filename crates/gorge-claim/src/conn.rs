//! Connections: pool options, and giving up a connection that may be dead.
//!
//! A connection whose statement timed out is never returned to a pool: it is closed in the
//! background ([`discard`]). That is enough for a query connection. A lock connection's
//! server session may still hold a per-hook `GET_LOCK` — a session whose client vanished
//! without a FIN (a fail-over behind NAT) lives on the server until its `wait_timeout` — so
//! [`Sessions::discard`] also ends that session with `KILL` from a fresh connection, and lock
//! sessions get a short `wait_timeout` as the backstop when even that cannot reach the server.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, PoolConstraints, PoolOpts};

/// Bound on closing a connection that timed out (it may be dead: nothing is waited for).
const DISCARD_TIMEOUT: Duration = Duration::from_secs(1);

/// Pool options: `min` to `max` connections, idle ones above `min` closed after `idle`.
///
/// Connections are not reset when they return to the pool: no statement leaves session
/// state behind, and a reset would cost a round trip and empty the prepared-statement cache
/// on every return. A lock connection asks for the reset itself while it holds a lock (see
/// `lock.rs`).
pub(crate) fn pool_opts(min: usize, max: usize, idle: Duration) -> PoolOpts {
    let max = max.max(1);
    let constraints =
        PoolConstraints::new(min.min(max), max).unwrap_or(mysql_async::DEFAULT_POOL_CONSTRAINTS);
    PoolOpts::default()
        .with_constraints(constraints)
        .with_inactive_connection_ttl(idle)
        .with_ttl_check_interval(idle.max(Duration::from_secs(1)))
        .with_reset_connection(false)
}

/// The statement that gives a lock session its short idle limit: the server ends a lock
/// session that has been silent for longer, and frees its lock with it.
pub(crate) fn lock_session_setup(timeout: Duration) -> String {
    format!("SET SESSION wait_timeout = {}", timeout.as_secs().max(1))
}

/// Closes a connection whose statement timed out, in the background and bounded: it may be
/// dead, and returning it to the pool would hand a dead session to the next caller.
/// `disconnect` marks it closed before any I/O, so even if the close itself times out the
/// pool only counts it as gone.
pub(crate) fn discard(conn: Conn) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(close(conn));
    }
}

async fn close(conn: Conn) {
    let _ = tokio::time::timeout(DISCARD_TIMEOUT, conn.disconnect()).await;
}

/// Ends the server sessions of lock connections given up on. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Sessions {
    /// Where to open the fresh connection a `KILL` is sent on.
    opts: Opts,
    timeout: Duration,
}

impl Sessions {
    pub(crate) fn new(opts: Opts, timeout: Duration) -> Sessions {
        Sessions { opts, timeout }
    }

    /// Closes `conn` like [`discard`] and, on a fresh connection, kills its server session
    /// (which frees any lock it holds). Both in the background, each bounded by the
    /// statement timeout; if the server cannot be reached at all, the session's short
    /// `wait_timeout` ends it.
    pub(crate) fn discard(&self, conn: Conn) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let id = conn.id();
        let sessions = self.clone();
        runtime.spawn(async move {
            tokio::join!(close(conn), sessions.kill(id));
        });
    }

    async fn kill(&self, id: u32) {
        let kill = async {
            let mut conn = Conn::new(self.opts.clone()).await?;
            // A user may always kill its own sessions. "Unknown thread id" (1094): the
            // session is already gone, which is all that was wanted.
            let out = conn.query_drop(format!("KILL CONNECTION {id}")).await;
            let _ = conn.disconnect().await;
            out
        };
        // Nothing more to do if it fails: the session's wait_timeout ends it.
        let _ = tokio::time::timeout(self.timeout, kill).await;
    }
}
