//! `ClaimStore`: its pools, options and readiness checks, and the statement helpers the
//! other modules share. The statements themselves are grouped by job: finding rows for
//! delivery (candidates, a held hook's next rows) in `rows.rs`; a row's way from its claim to
//! its result in `claims.rs`; hooks and breaker counts in `hooks.rs`, objects and
//! transactions in `object_load.rs` (what a row's steps read); counts in `stats.rs`;
//! `GET_LOCK` and statements on the lock's session in `lock.rs`; connections in `conn.rs`.
//!
//! Every statement is bounded by [`StoreOptions::query_timeout`]; a connection whose
//! statement timed out is closed, never returned to the pool (a silently dead connection
//! would otherwise be handed out again).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Pool, Row, Value};

use crate::conn::{discard, lock_session_setup, pool_opts, Sessions};
use crate::error::ClaimError;
use crate::handover::CandidateWindow;

/// Lease and backoff, in seconds; independent of each other (see the crate doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimTiming {
    /// How long a claimed row without a result stays invisible to other claimants.
    pub lease_sec: u64,
    /// How long a failed `retry=forever` row waits before it is a candidate again.
    pub retry_backoff_sec: u64,
}

/// Limits of the store's two connection pools and statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// Bound on every statement, and on waiting for a connection from a pool.
    pub query_timeout: Duration,
    /// Connections for queries (polls, claims, result writes, the API).
    pub max_connections: usize,
    /// Connections that hold a per-hook lock across a POST (one per delivery in flight).
    pub max_lock_connections: usize,
    /// Idle connections above one (queries) or zero (locks) are closed after this long.
    pub idle_timeout: Duration,
    /// The server's `wait_timeout` for lock connections: a lock session silent for longer
    /// is ended by the server, which frees its lock. Must exceed the longest a lock is
    /// held without a statement (a POST, result-write retries within the claim's lease).
    pub lock_session_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            query_timeout: Duration::from_secs(10),
            max_connections: 4,
            max_lock_connections: 16,
            idle_timeout: Duration::from_secs(30),
            lock_session_timeout: Duration::from_secs(60),
        }
    }
}

/// Connection gauges of both pools (read from counters, no I/O).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolState {
    /// Query pool: open connections, idle or in use.
    pub connections: u64,
    /// Query pool: connections checked out.
    pub in_use: u64,
    /// Query pool: callers waiting for a connection.
    pub waiting: u64,
    /// Lock pool: open connections, idle or holding a lock.
    pub lock_connections: u64,
    /// Hook locks held right now (each on its own connection).
    pub locks_held: u64,
}

/// The claim protocol over one `{namespace}_herald` database. Cheap to clone (shared pools).
#[derive(Clone)]
pub struct ClaimStore {
    pub(crate) pool: Pool,
    pub(crate) locks: Pool,
    /// Ends the sessions of lock connections given up on.
    pub(crate) sessions: Sessions,
    pub(crate) locks_held: Arc<AtomicUsize>,
    pub(crate) window: Arc<CandidateWindow>,
    pub(crate) database: String,
    pub(crate) namespace: String,
    pub(crate) options: StoreOptions,
}

impl std::fmt::Debug for ClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimStore")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

/// Most values in one `IN` list.
pub(crate) const IN_CHUNK: usize = 512;

/// `values` as statement parameters, padded to a power of two by repeating the last one
/// (an `IN` list means the same), so the prepared-statement cache sees a few shapes.
pub(crate) fn padded<'a>(values: impl ExactSizeIterator<Item = &'a str>) -> Vec<Value> {
    let len = values.len().next_power_of_two();
    let mut out: Vec<Value> = values.map(Value::from).collect();
    if let Some(last) = out.last().cloned() {
        out.resize(len, last);
    }
    out
}

/// `?, ?, …` for `n` parameters.
pub(crate) fn placeholders(n: usize) -> String {
    let mut list = "?, ".repeat(n);
    list.truncate(list.len().saturating_sub(2));
    list
}

/// A column as text; `None` when NULL, missing or not UTF-8.
pub(crate) fn text(row: &mut Row, index: usize) -> Option<String> {
    let bytes: Vec<u8> = row.take_opt(index)?.ok()?;
    String::from_utf8(bytes).ok()
}

pub(crate) fn int(row: &mut Row, index: usize) -> Option<u64> {
    row.take_opt(index)?.ok()
}

/// The result of a statement raced against the timeout.
pub(crate) type Timed<T> = Result<Result<T, mysql_async::Error>, tokio::time::error::Elapsed>;

impl ClaimStore {
    /// A store on `database` (e.g. `phabricator_herald`) with default [`StoreOptions`].
    pub fn new(opts: Opts, database: &str) -> Self {
        Self::with_options(opts, database, StoreOptions::default())
    }

    /// A store on `database` of the server in `opts` (any database and pool options in
    /// `opts` are replaced). The namespace is `database` without its `_herald` suffix.
    /// Connects lazily: a down server or a missing database shows up as errors from the
    /// calls (see [`ClaimStore::ping`]), never here.
    pub fn with_options(opts: Opts, database: &str, options: StoreOptions) -> Self {
        let base = OptsBuilder::from_opts(opts).db_name(Some(database));
        let queries =
            base.clone()
                .pool_opts(pool_opts(1, options.max_connections, options.idle_timeout));
        let lock_timeout = options.lock_session_timeout.as_secs().max(1);
        let locks = base
            .clone()
            .setup(vec![lock_session_setup(options.lock_session_timeout)])
            // The driver does not hand out a pooled connection the server has ended.
            .wait_timeout(Some(lock_timeout as usize))
            .pool_opts(pool_opts(
                0,
                options.max_lock_connections,
                options.idle_timeout,
            ));
        ClaimStore {
            pool: Pool::new(queries),
            locks: Pool::new(locks),
            sessions: Sessions::new(base.into(), options.query_timeout),
            locks_held: Arc::new(AtomicUsize::new(0)),
            window: Arc::default(),
            database: database.to_owned(),
            namespace: database
                .strip_suffix("_herald")
                .unwrap_or(database)
                .to_owned(),
            options,
        }
    }

    /// The database this store works on.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The storage namespace (`phabricator` for `phabricator_herald`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(crate) async fn conn(&self) -> Result<Conn, ClaimError> {
        Self::conn_from(&self.pool, &self.options, &self.database).await
    }

    pub(crate) async fn conn_from(
        pool: &Pool,
        options: &StoreOptions,
        db: &str,
    ) -> Result<Conn, ClaimError> {
        match tokio::time::timeout(options.query_timeout, pool.get_conn()).await {
            Ok(conn) => conn.map_err(|e| ClaimError::from_driver(e, db)),
            Err(_) => Err(ClaimError::Timeout("waiting for a database connection")),
        }
    }

    /// The rows of the statement `sql(list)` for `values`, one statement per [`IN_CHUNK`]
    /// of them: `list` is the chunk's placeholders, [`padded`]; `extra` parameters follow
    /// the list's.
    pub(crate) async fn select_in(
        &self,
        values: &[&str],
        extra: &[Value],
        what: &'static str,
        sql: impl Fn(&str) -> String,
    ) -> Result<Vec<Row>, ClaimError> {
        let mut rows = Vec::new();
        for chunk in values.chunks(IN_CHUNK) {
            let mut params = padded(chunk.iter().copied());
            let sql = sql(&placeholders(params.len()));
            params.extend_from_slice(extra);
            let mut conn = self.conn().await?;
            let out = self.timed(conn.exec::<Row, _, _>(sql, params)).await;
            let (_conn, chunk_rows) = self.settle(conn, out, what)?;
            rows.extend(chunk_rows);
        }
        Ok(rows)
    }

    pub(crate) fn err(&self, err: mysql_async::Error) -> ClaimError {
        ClaimError::from_driver(err, &self.database)
    }

    /// Finishes a timed statement: on timeout the connection is closed (never reused).
    pub(crate) fn settle<T>(
        &self,
        conn: Conn,
        out: Timed<T>,
        what: &'static str,
    ) -> Result<(Conn, T), ClaimError> {
        match out {
            Ok(Ok(value)) => Ok((conn, value)),
            Ok(Err(err)) => Err(self.err(err)),
            Err(_) => {
                discard(conn);
                Err(ClaimError::Timeout(what))
            }
        }
    }

    /// Readiness: a round trip on the database. A missing database is
    /// [`ClaimError::UnknownDatabase`].
    pub async fn ping(&self) -> Result<(), ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.query_drop("SELECT 1 FROM herald_webhookrequest LIMIT 0"))
            .await;
        self.settle(conn, out, "readiness ping").map(|_| ())
    }

    /// Readiness: the first privilege this user lacks on `{namespace}_herald`, as the
    /// `GRANT` statement that adds it, or `None` when it has all three the service needs
    /// (`SELECT` and `UPDATE` on `herald_webhookrequest`, `SELECT` on `herald_webhook`).
    /// Each probe touches no row (`LIMIT 0`), and the `UPDATE` is only explained: `EXPLAIN`
    /// needs the privileges of the statement it explains but runs nothing, so the probe
    /// writes nothing to the binary log of Phorge's server. Any other error (no database,
    /// no table, no connection) is returned as is.
    pub async fn missing_grant(&self) -> Result<Option<String>, ClaimError> {
        const PROBES: [(&str, &str, &str); 3] = [
            (
                "SELECT",
                "herald_webhookrequest",
                "SELECT 1 FROM herald_webhookrequest LIMIT 0",
            ),
            (
                "UPDATE",
                "herald_webhookrequest",
                "EXPLAIN UPDATE herald_webhookrequest SET dateModified = dateModified WHERE FALSE",
            ),
            (
                "SELECT",
                "herald_webhook",
                "SELECT 1 FROM herald_webhook LIMIT 0",
            ),
        ];
        let mut conn = self.conn().await?;
        for (privilege, table, probe) in PROBES {
            let out = self.timed(conn.query_drop(probe)).await;
            match self.settle(conn, out, "privilege check") {
                Ok((next, ())) => conn = next,
                Err(err) if err.is_access_denied() => {
                    let mut conn = self.conn().await?;
                    let out = self
                        .timed(conn.query_first::<String, _>("SELECT CURRENT_USER()"))
                        .await;
                    let (_, user) = self.settle(conn, out, "privilege check")?;
                    // `gorge@127.0.0.1`, the account the server matched, as `'gorge'@'127.0.0.1'`.
                    let account = match user.as_deref().and_then(|u| u.rsplit_once('@')) {
                        Some((name, host)) => format!("'{name}'@'{host}'"),
                        None => "<gorge user>".to_string(),
                    };
                    return Ok(Some(format!(
                        "GRANT {privilege} ON `{}`.`{table}` TO {account}",
                        self.database
                    )));
                }
                Err(err) => return Err(err),
            }
        }
        Ok(None)
    }

    pub(crate) async fn timed<F: std::future::Future>(
        &self,
        fut: F,
    ) -> Result<F::Output, tokio::time::error::Elapsed> {
        tokio::time::timeout(self.options.query_timeout, fut).await
    }

    /// Pool gauges for `/metrics`.
    pub fn pool_state(&self) -> PoolState {
        use std::sync::atomic::Ordering::Relaxed;
        let queries = self.pool.metrics();
        let locks = self.locks.metrics();
        PoolState {
            connections: queries.connection_count.load(Relaxed) as u64,
            in_use: queries.connections_in_use.load(Relaxed) as u64,
            waiting: queries.active_wait_requests.load(Relaxed) as u64,
            lock_connections: locks.connection_count.load(Relaxed) as u64,
            locks_held: self.locks_held.load(Ordering::SeqCst) as u64,
        }
    }

    /// Disconnects both pools; waits until checked-out connections (held hook locks) are
    /// back. Call only after in-flight results are written.
    pub async fn close(self) {
        // Errors here mean connections were already gone: nothing left to clean up.
        let _ = self.pool.disconnect().await;
        let _ = self.locks.disconnect().await;
    }
}
