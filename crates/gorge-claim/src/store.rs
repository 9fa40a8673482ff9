//! `ClaimStore`: the statements the webhook service runs against `{namespace}_herald`
//! (rows, hooks, breaker counts, stats), and the statement helpers the other modules share.
//!
//! Only `SELECT`/`UPDATE` on `herald_webhookrequest` and `SELECT` on `herald_webhook` here;
//! `SELECT` on the object and transaction tables of Phorge's applications is in
//! `object_load.rs`, `GET_LOCK` in `lock.rs`, connections in `conn.rs`. See the crate doc
//! for the row states. Reads that a poll round needs for each of its rows (hooks, breaker
//! counts, objects) take every row of the round at once.
//!
//! Every statement is bounded by [`StoreOptions::query_timeout`]; a connection whose
//! statement timed out is closed, never returned to the pool (a silently dead connection
//! would otherwise be handed out again). Columns are read as bytes and checked here, so a
//! row holding bytes that are not UTF-8 is reported as a [`BrokenRow`], never a panic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Pool, Row, Value};
use phorge_wire::values::{HookStatus, RequestResult, RequestStatus};

use crate::conn::{discard, lock_session_setup, pool_opts, Sessions};
use crate::error::ClaimError;
use crate::handover::{
    handed_over_sql, CandidateWindow, HandoverSample, NEWEST_ROWS_SQL, SAMPLE_ROWS,
    WINDOW_BOUNDS_SQL,
};
use crate::lock::{hook_lock_name, HookLock};

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

/// A `queued` row that may be claimed. Not ours until [`ClaimStore::claim`] says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The row's `id` (candidates come oldest id first).
    pub id: u64,
    /// The request's own PHID (`PHID-HWBR-…`).
    pub phid: String,
    /// The hook's PHID, the key of the per-hook lock and breaker.
    pub webhook_phid: String,
    /// The PHID of the object the request is about.
    pub object_phid: String,
    /// The raw `properties` column (JSON text as Phorge wrote it).
    pub properties: String,
    /// Also the payload's `action.epoch`.
    pub date_created: u64,
    /// The row version the claim compares against.
    pub date_modified: u64,
    /// When the last attempt ended (Unix seconds); 0 before the first.
    pub last_request_epoch: u64,
}

/// A candidate row that cannot be delivered as stored (e.g. a PHID that is not UTF-8).
/// It can still be addressed by id and version, so it can be failed for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenRow {
    /// The row's `id`.
    pub id: u64,
    /// The row version a failing compare-and-set is made against.
    pub date_modified: u64,
    /// The `properties` text when it could be read.
    pub properties: Option<String>,
    /// Which column is unusable, for the log.
    pub reason: &'static str,
    /// `LENGTH(properties)` when the text was left unread because it is longer than
    /// [`MAX_PROPERTIES_BYTES`] (or than the server's packet allows).
    pub oversized: Option<u64>,
}

/// What one candidate query found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Usable rows, oldest id first.
    pub rows: Vec<Candidate>,
    /// Rows that can be addressed but not delivered; the caller fails them.
    pub broken: Vec<BrokenRow>,
    /// Rows whose id or version could not be read (cannot be written to at all).
    pub unaddressable: usize,
    /// Rows returned by the server, all three kinds.
    pub fetched: usize,
}

/// Why an object's transactions were not checked against its transaction table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unchecked {
    /// The PHID type is not in Phorge's table (an extension application).
    UnknownType(String),
    /// The type has no Lisk table or no transaction table (e.g. `APPS`).
    NoTable(String),
    /// The server refused or did not know the table; `grant` is the statement that fixes it.
    Refused {
        /// The database (with its namespace) the table is in.
        database: String,
        /// The `GRANT SELECT …` that would let the service read it.
        grant: String,
        /// The server's error text.
        error: String,
    },
}

/// The object of a request, loaded as Phorge's worker loads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectLoad {
    /// The object exists. `transactions` is what the payload lists: the stored PHIDs that
    /// exist for this object, newest first — or, when `unchecked` says why that could not be
    /// looked up, the stored list as is.
    Found {
        /// The transaction PHIDs the payload lists.
        transactions: Vec<String>,
        /// Why the transactions could not be checked, when they could not.
        unchecked: Option<Unchecked>,
    },
    /// No such object (or a PHID without a type part): Phorge's `ERROR_OBJECT`.
    Missing,
}

/// A won claim: the row is ours while its `dateModified` is still `version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The row's `id`.
    pub id: u64,
    /// The `dateModified` the claim wrote; the result write compares against it.
    pub version: u64,
}

/// A `herald_webhook` row, as much of it as delivery needs.
#[derive(Clone, PartialEq, Eq)]
pub struct Hook {
    /// The hook's PHID (`PHID-HWBH-…`).
    pub phid: String,
    /// Where requests are POSTed, as stored.
    pub uri: String,
    /// Raw `status`; see [`Hook::hook_status`].
    pub status: String,
    /// The HMAC key (secret: never log it; `Debug` masks it).
    pub hmac_key: String,
}

impl Hook {
    /// The typed status; `None` for a value Phorge does not define.
    pub fn hook_status(&self) -> Option<HookStatus> {
        HookStatus::parse(&self.status)
    }
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hook")
            .field("phid", &self.phid)
            .field("uri", &self.uri)
            .field("status", &self.status)
            .field("hmac_key", &"********")
            .finish()
    }
}

/// What to write back into a claimed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultWrite {
    /// An HTTP attempt ended at `epoch` (Unix seconds): `sent`, or `queued`/`failed` after a
    /// failed attempt.
    Attempted {
        /// `sent`, or `queued`/`failed` after a failed attempt.
        status: RequestStatus,
        /// `okay` or `fail`.
        result: RequestResult,
        /// When the attempt ended (Unix seconds). `lastRequestEpoch` and `dateModified` are
        /// both set to at least this, the "not in flight" marker.
        epoch: u64,
        /// The complete new `properties` JSON text.
        properties: String,
    },
    /// No request was made (Phorge's hook errors: missing/disabled hook, blocked URI, missing
    /// object, unusable row): the row becomes `failed` / `none` / epoch 0.
    NotAttempted {
        /// The complete new `properties` JSON text.
        properties: String,
    },
}

impl ResultWrite {
    /// The `status` column written.
    pub fn status(&self) -> RequestStatus {
        match self {
            ResultWrite::Attempted { status, .. } => *status,
            ResultWrite::NotAttempted { .. } => RequestStatus::Failed,
        }
    }

    /// The `lastRequestResult` column written.
    pub fn result(&self) -> RequestResult {
        match self {
            ResultWrite::Attempted { result, .. } => *result,
            ResultWrite::NotAttempted { .. } => RequestResult::None,
        }
    }

    /// When the attempt ended; `None` when no request was made.
    pub fn epoch(&self) -> Option<u64> {
        match self {
            ResultWrite::Attempted { epoch, .. } => Some(*epoch),
            ResultWrite::NotAttempted { .. } => None,
        }
    }

    /// The complete new `properties` JSON text.
    pub fn properties(&self) -> &str {
        match self {
            ResultWrite::Attempted { properties, .. }
            | ResultWrite::NotAttempted { properties } => properties,
        }
    }
}

/// Row counts for `/api/webhook/stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Rows with status `queued`.
    pub queued: u64,
    /// Rows with status `sent`.
    pub sent: u64,
    /// Rows with status `failed`.
    pub failed: u64,
    /// Hooks with status `enabled` or `firehose`.
    pub active_hooks: u64,
}

/// The backlog, for a gauge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepth {
    /// Rows with status `queued`, in flight or waiting.
    pub queued: u64,
    /// `now - MIN(dateCreated)` over queued rows; `None` when nothing is queued.
    pub oldest_age_sec: Option<u64>,
}

/// One hook's part of the backlog, for the diagnostic API: counts and PHIDs only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookQueue {
    /// The hook's PHID.
    pub hook_phid: String,
    /// Its rows with status `queued` (Phorge's own included).
    pub queued: u64,
    /// `now - dateCreated` of its oldest queued row.
    pub oldest_age_sec: u64,
    /// The PHID of that row (the one Phorge's Herald webhook page lists first).
    pub oldest_request_phid: String,
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
    pool: Pool,
    locks: Pool,
    /// Ends the sessions of lock connections given up on.
    sessions: Sessions,
    locks_held: Arc<AtomicUsize>,
    window: Arc<CandidateWindow>,
    database: String,
    namespace: String,
    options: StoreOptions,
}

impl std::fmt::Debug for ClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimStore")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

/// Longest `properties` text a candidate query returns. A longer row is failed unread
/// (`invalid-row`): a row longer than the server's `max_allowed_packet` cannot be fetched at
/// all (the driver refuses the packet and the whole query fails), and a batch of rows near it
/// would hold hundreds of MiB. Phorge's own rows list a few dozen PHIDs (a few KiB).
pub const MAX_PROPERTIES_BYTES: u64 = 1 << 20;

/// Room left in a packet for a candidate row's other columns, when the server's
/// `max_allowed_packet` is below [`MAX_PROPERTIES_BYTES`] plus this.
const PACKET_HEADROOM_BYTES: u64 = 64 << 10;

/// The candidate query's columns, `properties` only when it is short enough to fetch (the
/// bound is evaluated by the server, which knows its own packet size), and its length.
pub(crate) fn candidates_select() -> String {
    format!(
        "SELECT id, phid, webhookPHID, objectPHID, \
         IF(LENGTH(properties) <= LEAST({MAX_PROPERTIES_BYTES}, \
            @@max_allowed_packet - {PACKET_HEADROOM_BYTES}), properties, NULL), \
         dateCreated, dateModified, lastRequestEpoch, LENGTH(properties) "
    )
}

/// The candidate query after its columns, up to the optional hook exclusion;
/// [`candidates_sql`] completes it. Only rows Phorge handed over, within the two id windows
/// of `handover.rs`.
const CANDIDATES_SQL_HEAD: &str = concat!(
    "FROM herald_webhookrequest \
WHERE status = 'queued' AND (id <= ? OR (id > ? AND id <= ?)) AND ( \
  (dateModified = dateCreated AND lastRequestEpoch = 0) \
  OR (dateModified = lastRequestEpoch AND lastRequestEpoch <= ?) \
  OR (dateModified <> lastRequestEpoch AND dateModified <= ?) \
) AND ",
    handed_over_sql!()
);

/// Most hooks one candidate query leaves out (see [`ClaimStore::candidates`]). A power of
/// two, because exclusion lists are padded to powers of two.
pub const MAX_EXCLUDED_HOOKS: usize = 1024;

/// The candidate query with `excluded` placeholders in its `NOT IN` list (none: no list).
fn candidates_sql(excluded: usize) -> String {
    let mut sql = candidates_select();
    sql.push_str(CANDIDATES_SQL_HEAD);
    if excluded > 0 {
        sql.push_str(" AND webhookPHID NOT IN (?");
        sql.push_str(&", ?".repeat(excluded - 1));
        sql.push(')');
    }
    sql.push_str(" ORDER BY id ASC LIMIT ?");
    sql
}

// Every write for delivery requires the hand-over marker too: a row Phorge took back is
// never claimed, failed or written by this service, whatever its version.
const CLAIM_SQL: &str = concat!(
    "UPDATE herald_webhookrequest SET dateModified = ? \
WHERE id = ? AND status = 'queued' AND dateModified = ? AND ",
    handed_over_sql!()
);

const RESULT_WRITE_SQL: &str = concat!(
    "UPDATE herald_webhookrequest \
SET status = ?, lastRequestResult = ?, lastRequestEpoch = ?, dateModified = ?, properties = ? \
WHERE id = ? AND status = 'queued' AND dateModified = ? AND ",
    handed_over_sql!()
);

const FAIL_UNCLAIMABLE_SQL: &str = concat!(
    "UPDATE herald_webhookrequest \
SET status = 'failed', lastRequestResult = 'none', lastRequestEpoch = 0, properties = ? \
WHERE id = ? AND status = 'queued' AND dateModified = ? AND ",
    handed_over_sql!()
);

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

/// Reads one candidate row; `Err(None)` when the row cannot even be addressed.
pub(crate) fn read_candidate(row: &mut Row) -> Result<Candidate, Option<BrokenRow>> {
    let (Some(id), Some(date_modified)) = (int(row, 0), int(row, 6)) else {
        return Err(None);
    };
    // NULL text with a length (the column is NOT NULL): left unread by the query's bound.
    let unread = matches!(row.as_ref(4), Some(Value::NULL));
    let oversized = int(row, 8).filter(|_| unread);
    let properties = text(row, 4);
    let broken = |reason, properties: Option<String>| {
        Err(Some(BrokenRow {
            id,
            date_modified,
            properties,
            reason,
            oversized,
        }))
    };
    if oversized.is_some() {
        return broken("properties is longer than the service reads", None);
    }
    let Some(phid) = text(row, 1) else {
        return broken("phid is not UTF-8 text", properties);
    };
    let Some(webhook_phid) = text(row, 2) else {
        return broken("webhookPHID is not UTF-8 text", properties);
    };
    let Some(object_phid) = text(row, 3) else {
        return broken("objectPHID is not UTF-8 text", properties);
    };
    let Some(properties) = properties else {
        return broken("properties is not UTF-8 text", None);
    };
    let (Some(date_created), Some(last_request_epoch)) = (int(row, 5), int(row, 7)) else {
        return broken(
            "dateCreated or lastRequestEpoch is not a number",
            Some(properties),
        );
    };
    Ok(Candidate {
        id,
        phid,
        webhook_phid,
        object_phid,
        properties,
        date_created,
        date_modified,
        last_request_epoch,
    })
}

/// The result of a statement raced against the timeout.
type Timed<T> = Result<Result<T, mysql_async::Error>, tokio::time::error::Elapsed>;

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

    async fn conn_from(pool: &Pool, options: &StoreOptions, db: &str) -> Result<Conn, ClaimError> {
        match tokio::time::timeout(options.query_timeout, pool.get_conn()).await {
            Ok(conn) => conn.map_err(|e| ClaimError::from_driver(e, db)),
            Err(_) => Err(ClaimError::Timeout("waiting for a database connection")),
        }
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

    /// Up to `limit` claimable rows that Phorge handed over, oldest id first, from the two
    /// windows of queued ids described in `handover.rs`, leaving out the rows of the hooks in
    /// `exclude_hooks` (hooks the caller would skip anyway), so that their backlog cannot
    /// fill the batch and hide the rows of other hooks.
    ///
    /// Only the first [`MAX_EXCLUDED_HOOKS`] entries are used: put the most important first.
    /// A hook past the cap is simply not excluded; its rows may come back, which costs batch
    /// room but is never wrong. The list is padded to a power of two (repeating its last
    /// entry) so that the driver's prepared-statement cache sees a dozen query shapes, not a
    /// thousand. The query is a range scan of the `key_status (status, id)` index over at
    /// most two windows; rows in them that are excluded or not handed over are read by the
    /// server, only not returned.
    pub async fn candidates(
        &self,
        now: u64,
        timing: &ClaimTiming,
        limit: usize,
        exclude_hooks: &[String],
    ) -> Result<Vec<Candidate>, ClaimError> {
        Ok(self.batch(now, timing, limit, exclude_hooks).await?.rows)
    }

    /// [`ClaimStore::candidates`] with the rows that cannot be used reported apart.
    pub async fn batch(
        &self,
        now: u64,
        timing: &ClaimTiming,
        limit: usize,
        exclude_hooks: &[String],
    ) -> Result<Batch, ClaimError> {
        let backoff_cutoff = now.saturating_sub(timing.retry_backoff_sec);
        let lease_cutoff = now.saturating_sub(timing.lease_sec);
        let mut conn = self.conn().await?;
        let ranges = match self.window.reuse(now) {
            Some(ranges) => ranges,
            None => {
                let size = CandidateWindow::size(limit);
                let cursor = self.window.cursor();
                let out = self
                    .timed(conn.exec_first::<(Option<u64>, Option<u64>), _, _>(
                        WINDOW_BOUNDS_SQL,
                        (size - 1, cursor, size - 1),
                    ))
                    .await;
                let (bounded, bounds) = self.settle(conn, out, "candidate window")?;
                conn = bounded;
                let (head_end, sweep_end) = bounds.unwrap_or((None, None));
                self.window.ranges(cursor, head_end, sweep_end)
            }
        };
        let excluded = &exclude_hooks[..exclude_hooks.len().min(MAX_EXCLUDED_HOOKS)];
        let placeholders = if excluded.is_empty() {
            0
        } else {
            excluded.len().next_power_of_two()
        };
        let mut params: Vec<Value> = Vec::with_capacity(placeholders + 6);
        params.push(ranges.head_end.into());
        params.push(ranges.sweep_start.into());
        params.push(ranges.sweep_end.into());
        params.push(backoff_cutoff.into());
        params.push(lease_cutoff.into());
        params.extend(excluded.iter().map(|hook| Value::from(hook.as_str())));
        if let Some(last) = excluded.last() {
            params.resize(5 + placeholders, Value::from(last.as_str()));
        }
        params.push((limit as u64).into());
        let out = self
            .timed(conn.exec::<Row, _, _>(candidates_sql(placeholders), params))
            .await;
        let (_conn, rows) = self.settle(conn, out, "candidate query")?;
        self.window.finished(ranges, now, rows.len() >= limit);
        let mut batch = Batch {
            fetched: rows.len(),
            ..Batch::default()
        };
        for mut row in rows {
            match read_candidate(&mut row) {
                Ok(candidate) => batch.rows.push(candidate),
                Err(Some(broken)) => batch.broken.push(broken),
                Err(None) => batch.unaddressable += 1,
            }
        }
        Ok(batch)
    }

    /// The [`SAMPLE_ROWS`] newest rows, whatever their status: is any of them handed over,
    /// and when was the newest created. A primary-key scan of a few rows, for telling
    /// "Phorge hands nothing over" from "nothing to do" (see `handover.rs`).
    pub async fn handover_sample(&self) -> Result<HandoverSample, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec::<(u64, Option<i64>), _, _>(NEWEST_ROWS_SQL, (SAMPLE_ROWS,)))
            .await;
        let (_conn, rows) = self.settle(conn, out, "hand-over sample")?;
        Ok(HandoverSample {
            newest_created: rows.first().map(|(created, _)| *created),
            any_marked: rows.iter().any(|(_, marked)| *marked == Some(1)),
        })
    }

    /// Fails a row for good without claiming it first: `failed`/`none`/epoch 0 with
    /// `properties`, if the row is still `queued` at `seen_version`. For rows that cannot be
    /// claimed (a version the claim UPDATE cannot advance) or used (a [`BrokenRow`]): the
    /// status change itself is the compare-and-set, so of two processes only one writes.
    pub async fn fail_unclaimable(
        &self,
        id: u64,
        seen_version: u64,
        properties: &str,
    ) -> Result<bool, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec_drop(FAIL_UNCLAIMABLE_SQL, (properties, id, seen_version)))
            .await;
        let (conn, ()) = self.settle(conn, out, "invalid-row write")?;
        Ok(conn.affected_rows() == 1)
    }

    /// Compare-and-set on the version seen in `candidate`. `None`: another claimant won.
    ///
    /// The new version is `max(seen + 1, now)`: the `+ 1` makes the version change even
    /// when insert and claim (or two claims) fall in the same second, so exactly one
    /// UPDATE can match. Won iff one row *changed* (`CLIENT_FOUND_ROWS` stays unset).
    pub async fn claim(
        &self,
        candidate: &Candidate,
        now: u64,
    ) -> Result<Option<Claim>, ClaimError> {
        let version = (candidate.date_modified + 1).max(now);
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec_drop(CLAIM_SQL, (version, candidate.id, candidate.date_modified)))
            .await;
        let (conn, ()) = self.settle(conn, out, "claim")?;
        Ok((conn.affected_rows() == 1).then_some(Claim {
            id: candidate.id,
            version,
        }))
    }

    /// Writes `write` if the row is still at `claim.version`; `false`: taken over (the
    /// caller counts and logs it, never retries).
    ///
    /// After an attempt, `lastRequestEpoch = dateModified = max(version, now, epoch)`: equal
    /// columns mark "result written, not in flight". Without one (always terminal),
    /// `lastRequestEpoch` stays 0 and `dateModified` keeps the claim version.
    pub async fn write_result(
        &self,
        claim: &Claim,
        write: &ResultWrite,
        now: u64,
    ) -> Result<bool, ClaimError> {
        let (last_epoch, version) = match write.epoch() {
            None => (0, claim.version),
            Some(epoch) => {
                let marker = claim.version.max(now).max(epoch);
                (marker, marker)
            }
        };
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec_drop(
                RESULT_WRITE_SQL,
                (
                    write.status().as_str(),
                    write.result().as_str(),
                    last_epoch,
                    version,
                    write.properties(),
                    claim.id,
                    claim.version,
                ),
            ))
            .await;
        let (conn, ()) = self.settle(conn, out, "result write")?;
        Ok(conn.affected_rows() == 1)
    }

    /// The hook row, or `None` when it does not exist. A hook whose columns are not UTF-8
    /// text is [`ClaimError::InvalidRow`].
    pub async fn load_hook(&self, phid: &str) -> Result<Option<Hook>, ClaimError> {
        match self.load_hooks(&[phid]).await?.remove(phid) {
            None => Ok(None),
            Some(Ok(hook)) => Ok(Some(hook)),
            Some(Err(why)) => Err(ClaimError::InvalidRow(why)),
        }
    }

    /// The hook rows of `phids` that exist, by PHID, in one query; `Err` for a hook whose
    /// columns are not UTF-8 text.
    pub async fn load_hooks(
        &self,
        phids: &[&str],
    ) -> Result<HashMap<String, Result<Hook, &'static str>>, ClaimError> {
        let mut hooks = HashMap::new();
        for chunk in phids.chunks(IN_CHUNK) {
            let params = padded(chunk.iter().copied());
            let sql = format!(
                "SELECT phid, webhookURI, status, hmacKey FROM herald_webhook WHERE phid IN ({})",
                placeholders(params.len())
            );
            let mut conn = self.conn().await?;
            let out = self.timed(conn.exec::<Row, _, _>(sql, params)).await;
            let (_conn, rows) = self.settle(conn, out, "hook query")?;
            for mut row in rows {
                // A PHID that matched a UTF-8 one is UTF-8 itself (the column is binary).
                let Some(phid) = text(&mut row, 0) else {
                    continue;
                };
                let hook = (|| {
                    Some(Hook {
                        phid: phid.clone(),
                        uri: text(&mut row, 1)?,
                        status: text(&mut row, 2)?,
                        hmac_key: text(&mut row, 3)?,
                    })
                })();
                hooks.insert(
                    phid,
                    hook.ok_or("a herald_webhook column is not UTF-8 text"),
                );
            }
        }
        Ok(hooks)
    }

    /// Circuit breaker input: rows of this hook whose last request failed at or after
    /// `since_epoch` (served by the `key_ratelimit` index).
    pub async fn recent_failures(
        &self,
        hook_phid: &str,
        since_epoch: u64,
    ) -> Result<u64, ClaimError> {
        let counts = self
            .recent_failures_by_hook(&[hook_phid], since_epoch)
            .await?;
        Ok(counts.get(hook_phid).copied().unwrap_or(0))
    }

    /// [`ClaimStore::recent_failures`] of each hook in `hook_phids`, in one query per
    /// 512 hooks; hooks without recent failures are absent.
    pub async fn recent_failures_by_hook(
        &self,
        hook_phids: &[&str],
        since_epoch: u64,
    ) -> Result<HashMap<String, u64>, ClaimError> {
        let mut counts = HashMap::new();
        for chunk in hook_phids.chunks(IN_CHUNK) {
            let mut params = padded(chunk.iter().copied());
            let sql = format!(
                "SELECT webhookPHID, COUNT(*) FROM herald_webhookrequest \
                 WHERE webhookPHID IN ({}) AND lastRequestResult = 'fail' \
                 AND lastRequestEpoch >= ? GROUP BY webhookPHID",
                placeholders(params.len())
            );
            params.push(since_epoch.into());
            let mut conn = self.conn().await?;
            let out = self.timed(conn.exec::<Row, _, _>(sql, params)).await;
            let (_conn, rows) = self.settle(conn, out, "breaker query")?;
            for mut row in rows {
                if let (Some(hook), Some(count)) = (text(&mut row, 0), int(&mut row, 1)) {
                    counts.insert(hook, count);
                }
            }
        }
        Ok(counts)
    }

    /// Takes the per-hook named lock (Phorge's name, see [`hook_lock_name`]) without
    /// waiting; `None`: another delivery of this hook (in any process, PHP's worker
    /// included) holds it. The lock lives on a connection of the lock pool owned by the
    /// [`HookLock`].
    pub async fn try_hook_lock(&self, hook_phid: &str) -> Result<Option<HookLock>, ClaimError> {
        let name = hook_lock_name(&self.namespace, hook_phid);
        let mut conn = Self::conn_from(&self.locks, &self.options, &self.database).await?;
        let out = self
            .timed(conn.exec_first::<Option<i64>, _, _>("SELECT GET_LOCK(?, 0)", (&name,)))
            .await;
        let got = match out {
            Ok(Ok(got)) => got,
            Ok(Err(err)) => return Err(self.err(err)),
            Err(_) => {
                // The server may have granted the lock to a session we cannot hear from.
                self.sessions.discard(conn);
                return Err(ClaimError::Timeout("GET_LOCK"));
            }
        };
        match got.flatten() {
            Some(1) => Ok(Some(HookLock::held(
                conn,
                name,
                Arc::clone(&self.locks_held),
                self.options.query_timeout,
                self.sessions.clone(),
            ))),
            Some(_) => Ok(None),
            None => Err(ClaimError::UnexpectedNull("GET_LOCK")),
        }
    }

    /// Request counts by status and the number of active hooks.
    pub async fn stats(&self) -> Result<Stats, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.query::<(String, u64), _>(
                "SELECT status, COUNT(*) FROM herald_webhookrequest GROUP BY status",
            ))
            .await;
        let (mut conn, by_status) = self.settle(conn, out, "stats query")?;
        let out = self
            .timed(conn.query_first::<u64, _>(
                "SELECT COUNT(*) FROM herald_webhook WHERE status IN ('enabled', 'firehose')",
            ))
            .await;
        let (_conn, active) = self.settle(conn, out, "stats query")?;
        let mut stats = Stats {
            active_hooks: active.unwrap_or(0),
            ..Stats::default()
        };
        for (status, count) in by_status {
            match RequestStatus::parse(&status) {
                Some(RequestStatus::Queued) => stats.queued = count,
                Some(RequestStatus::Sent) => stats.sent = count,
                Some(RequestStatus::Failed) => stats.failed = count,
                None => {}
            }
        }
        Ok(stats)
    }

    /// Number of hooks, whatever their status.
    pub async fn hook_count(&self) -> Result<u64, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.query_first::<u64, _>("SELECT COUNT(*) FROM herald_webhook"))
            .await;
        let (_conn, count) = self.settle(conn, out, "hook count")?;
        Ok(count.unwrap_or(0))
    }

    /// Queued rows and the age of the oldest one.
    pub async fn queue_depth(&self, now: u64) -> Result<QueueDepth, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.query_first::<(u64, Option<u64>), _>(
                "SELECT COUNT(*), MIN(dateCreated) FROM herald_webhookrequest WHERE status = 'queued'",
            ))
            .await;
        let (_conn, row) = self.settle(conn, out, "queue depth")?;
        let (queued, oldest) = row.unwrap_or((0, None));
        Ok(QueueDepth {
            queued,
            oldest_age_sec: oldest.map(|created| now.saturating_sub(created)),
        })
    }

    /// The hooks with queued rows, the one waiting longest first, at most `limit` of them.
    /// One grouped scan of the queued rows (the `key_status` index), then one row per hook.
    pub async fn queue_by_hook(&self, now: u64, limit: u64) -> Result<Vec<HookQueue>, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec::<(String, u64, u64, String), _, _>(
                "SELECT g.webhookPHID, g.queued, g.oldest, r.phid FROM \
                   (SELECT webhookPHID, COUNT(*) AS queued, MIN(dateCreated) AS oldest, \
                           MIN(id) AS first_id \
                    FROM herald_webhookrequest WHERE status = 'queued' \
                    GROUP BY webhookPHID ORDER BY first_id LIMIT ?) AS g \
                 JOIN herald_webhookrequest AS r ON r.id = g.first_id \
                 ORDER BY g.first_id",
                (limit,),
            ))
            .await;
        let (_conn, rows) = self.settle(conn, out, "queue by hook")?;
        Ok(rows
            .into_iter()
            .map(|(hook_phid, queued, oldest, phid)| HookQueue {
                hook_phid,
                queued,
                oldest_age_sec: now.saturating_sub(oldest),
                oldest_request_phid: phid,
            })
            .collect())
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

#[cfg(test)]
mod tests {
    use super::candidates_sql;

    #[test]
    fn exclusion_adds_one_placeholder_per_hook_before_the_limit() {
        assert!(candidates_sql(0).ends_with("%' ORDER BY id ASC LIMIT ?"));
        assert!(!candidates_sql(0).contains("NOT IN"));
        assert!(
            candidates_sql(1).ends_with("%' AND webhookPHID NOT IN (?) ORDER BY id ASC LIMIT ?")
        );
        assert!(candidates_sql(4)
            .ends_with("%' AND webhookPHID NOT IN (?, ?, ?, ?) ORDER BY id ASC LIMIT ?"));
    }
}
