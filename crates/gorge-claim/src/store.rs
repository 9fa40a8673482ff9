//! `ClaimStore`: every SQL statement the webhook service runs against `{namespace}_herald`.
//!
//! Only `SELECT`/`UPDATE` on `herald_webhookrequest` and `SELECT` on `herald_webhook`
//! (plus `GET_LOCK`, see `lock.rs`). See the crate doc for the row states.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Pool, Value};
use phorge_wire::values::{HookStatus, RequestResult, RequestStatus};

use crate::error::ClaimError;
use crate::lock::{hook_lock_name, HookLock};

/// Lease and backoff, in seconds; independent of each other (see the crate doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimTiming {
    /// How long a claimed row without a result stays invisible to other claimants.
    pub lease_sec: u64,
    /// How long a failed `retry=forever` row waits before it is a candidate again.
    pub retry_backoff_sec: u64,
}

/// A `queued` row that may be claimed. Not ours until [`ClaimStore::claim`] says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: u64,
    pub phid: String,
    pub webhook_phid: String,
    pub object_phid: String,
    /// The raw `properties` column (JSON text as Phorge wrote it).
    pub properties: String,
    /// Also the payload's `action.epoch`.
    pub date_created: u64,
    /// The row version the claim compares against.
    pub date_modified: u64,
    pub last_request_epoch: u64,
}

/// A won claim: the row is ours while its `dateModified` is still `version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub id: u64,
    pub version: u64,
}

/// A `herald_webhook` row, as much of it as delivery needs.
#[derive(Clone, PartialEq, Eq)]
pub struct Hook {
    pub phid: String,
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
pub struct RowOutcome {
    pub status: RequestStatus,
    pub result: RequestResult,
    /// When the HTTP attempt ended (Unix seconds), or `0` when no request was made
    /// (terminal pre-delivery failures: `lastRequestResult` `none`, status `failed`).
    pub epoch: u64,
    /// The complete new `properties` JSON text.
    pub properties: String,
}

/// Row counts for `/api/webhook/stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub queued: u64,
    pub sent: u64,
    pub failed: u64,
    /// Hooks with status `enabled` or `firehose`.
    pub active_hooks: u64,
}

/// The backlog, for a gauge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepth {
    pub queued: u64,
    /// `now - MIN(dateCreated)` over queued rows; `None` when nothing is queued.
    pub oldest_age_sec: Option<u64>,
}

/// Connection pool gauges (read from the driver's counters, no I/O).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolState {
    /// Open connections, idle or in use.
    pub connections: u64,
    /// Connections checked out (queries in progress and held hook locks).
    pub in_use: u64,
    /// Callers waiting for a connection.
    pub waiting: u64,
}

/// The claim protocol over one `{namespace}_herald` database. Cheap to clone (shared pool).
#[derive(Clone)]
pub struct ClaimStore {
    pool: Pool,
    database: String,
}

impl std::fmt::Debug for ClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimStore")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

/// The columns of the candidate query, in order.
type CandidateRow = (u64, String, String, String, String, u64, u64, u64);

/// The candidate query up to the optional hook exclusion; [`candidates_sql`] completes it.
const CANDIDATES_SQL_HEAD: &str = "\
SELECT id, phid, webhookPHID, objectPHID, properties, dateCreated, dateModified, lastRequestEpoch \
FROM herald_webhookrequest \
WHERE status = 'queued' AND ( \
  (dateModified = dateCreated AND lastRequestEpoch = 0) \
  OR (dateModified = lastRequestEpoch AND lastRequestEpoch <= ?) \
  OR (dateModified <> lastRequestEpoch AND dateModified <= ?) \
)";

/// Most hooks one candidate query leaves out (see [`ClaimStore::candidates`]). A power of
/// two, because exclusion lists are padded to powers of two.
pub const MAX_EXCLUDED_HOOKS: usize = 1024;

/// The candidate query with `excluded` placeholders in its `NOT IN` list (none: no list).
fn candidates_sql(excluded: usize) -> String {
    let mut sql = String::from(CANDIDATES_SQL_HEAD);
    if excluded > 0 {
        sql.push_str(" AND webhookPHID NOT IN (?");
        sql.push_str(&", ?".repeat(excluded - 1));
        sql.push(')');
    }
    sql.push_str(" ORDER BY id ASC LIMIT ?");
    sql
}

const CLAIM_SQL: &str = "\
UPDATE herald_webhookrequest SET dateModified = ? \
WHERE id = ? AND status = 'queued' AND dateModified = ?";

const OUTCOME_SQL: &str = "\
UPDATE herald_webhookrequest \
SET status = ?, lastRequestResult = ?, lastRequestEpoch = ?, dateModified = ?, properties = ? \
WHERE id = ? AND status = 'queued' AND dateModified = ?";

impl ClaimStore {
    /// A store on `database` (e.g. `phabricator_herald`) of the server in `opts`; any database
    /// name in `opts` is replaced. Connects lazily: a down server or a missing database shows
    /// up as errors from the calls (see [`ClaimStore::ping`]), never here.
    pub fn new(opts: Opts, database: &str) -> Self {
        let opts = OptsBuilder::from_opts(opts).db_name(Some(database));
        ClaimStore {
            pool: Pool::new(opts),
            database: database.to_owned(),
        }
    }

    /// The database this store works on.
    pub fn database(&self) -> &str {
        &self.database
    }

    async fn conn(&self) -> Result<Conn, ClaimError> {
        self.pool.get_conn().await.map_err(|e| self.err(e))
    }

    fn err(&self, err: mysql_async::Error) -> ClaimError {
        ClaimError::from_driver(err, &self.database)
    }

    /// Readiness: a round trip on the database. A missing database is
    /// [`ClaimError::UnknownDatabase`].
    pub async fn ping(&self) -> Result<(), ClaimError> {
        let mut conn = self.conn().await?;
        conn.query_drop("SELECT 1 FROM herald_webhookrequest LIMIT 0")
            .await
            .map_err(|e| self.err(e))
    }

    /// Up to `limit` claimable rows, oldest id first, leaving out the rows of the hooks in
    /// `exclude_hooks` (hooks the caller would skip anyway), so that their backlog cannot
    /// fill the batch and hide the rows of other hooks.
    ///
    /// Only the first [`MAX_EXCLUDED_HOOKS`] entries are used: put the most important first.
    /// A hook past the cap is simply not excluded; its rows may come back, which costs batch
    /// room but is never wrong. The list is padded to a power of two (repeating its last
    /// entry) so that the driver's prepared-statement cache sees a dozen query shapes, not a
    /// thousand. The query stays a scan of the `key_status (status, id)` index; excluded
    /// rows are still read by the server, only not returned.
    pub async fn candidates(
        &self,
        now: u64,
        timing: &ClaimTiming,
        limit: usize,
        exclude_hooks: &[String],
    ) -> Result<Vec<Candidate>, ClaimError> {
        let backoff_cutoff = now.saturating_sub(timing.retry_backoff_sec);
        let lease_cutoff = now.saturating_sub(timing.lease_sec);
        let excluded = &exclude_hooks[..exclude_hooks.len().min(MAX_EXCLUDED_HOOKS)];
        let placeholders = if excluded.is_empty() {
            0
        } else {
            excluded.len().next_power_of_two()
        };
        let mut params: Vec<Value> = Vec::with_capacity(placeholders + 3);
        params.push(backoff_cutoff.into());
        params.push(lease_cutoff.into());
        params.extend(excluded.iter().map(|hook| Value::from(hook.as_str())));
        if let Some(last) = excluded.last() {
            params.resize(2 + placeholders, Value::from(last.as_str()));
        }
        params.push((limit as u64).into());
        let mut conn = self.conn().await?;
        let rows: Vec<CandidateRow> = conn
            .exec(candidates_sql(placeholders), params)
            .await
            .map_err(|e| self.err(e))?;
        Ok(rows
            .into_iter()
            .map(
                |(
                    id,
                    phid,
                    webhook_phid,
                    object_phid,
                    properties,
                    date_created,
                    date_modified,
                    last_request_epoch,
                )| Candidate {
                    id,
                    phid,
                    webhook_phid,
                    object_phid,
                    properties,
                    date_created,
                    date_modified,
                    last_request_epoch,
                },
            )
            .collect())
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
        conn.exec_drop(CLAIM_SQL, (version, candidate.id, candidate.date_modified))
            .await
            .map_err(|e| self.err(e))?;
        Ok((conn.affected_rows() == 1).then_some(Claim {
            id: candidate.id,
            version,
        }))
    }

    /// Writes the outcome if the row is still at `claim.version`; `false`: taken over (the
    /// caller counts and logs it, never retries).
    ///
    /// With an attempt (`epoch != 0`), `lastRequestEpoch = dateModified = max(version, now,
    /// epoch)`: equal columns mark "result written, not in flight". Without one, status must
    /// be terminal; `lastRequestEpoch` stays 0 and `dateModified` keeps the claim version.
    pub async fn write_outcome(
        &self,
        claim: &Claim,
        outcome: &RowOutcome,
        now: u64,
    ) -> Result<bool, ClaimError> {
        let (last_epoch, version) = if outcome.epoch == 0 {
            if outcome.status == RequestStatus::Queued {
                // Such a write might change no column and so look "taken over"; and it
                // would leave the row looking in flight. Only terminal outcomes skip the POST.
                return Err(ClaimError::InvalidOutcome(
                    "an outcome without a request (epoch 0) must not stay queued",
                ));
            }
            (0, claim.version)
        } else {
            let marker = claim.version.max(now).max(outcome.epoch);
            (marker, marker)
        };
        let mut conn = self.conn().await?;
        conn.exec_drop(
            OUTCOME_SQL,
            (
                outcome.status.as_str(),
                outcome.result.as_str(),
                last_epoch,
                version,
                outcome.properties.as_str(),
                claim.id,
                claim.version,
            ),
        )
        .await
        .map_err(|e| self.err(e))?;
        Ok(conn.affected_rows() == 1)
    }

    /// The hook row, or `None` when it does not exist.
    pub async fn load_hook(&self, phid: &str) -> Result<Option<Hook>, ClaimError> {
        let mut conn = self.conn().await?;
        let row: Option<(String, String, String, String)> = conn
            .exec_first(
                "SELECT phid, webhookURI, status, hmacKey FROM herald_webhook WHERE phid = ?",
                (phid,),
            )
            .await
            .map_err(|e| self.err(e))?;
        Ok(row.map(|(phid, uri, status, hmac_key)| Hook {
            phid,
            uri,
            status,
            hmac_key,
        }))
    }

    /// Circuit breaker input: rows of this hook whose last request failed at or after
    /// `since_epoch` (served by the `key_ratelimit` index).
    pub async fn recent_failures(
        &self,
        hook_phid: &str,
        since_epoch: u64,
    ) -> Result<u64, ClaimError> {
        let mut conn = self.conn().await?;
        let count: Option<u64> = conn
            .exec_first(
                "SELECT COUNT(*) FROM herald_webhookrequest \
                 WHERE webhookPHID = ? AND lastRequestResult = 'fail' AND lastRequestEpoch >= ?",
                (hook_phid, since_epoch),
            )
            .await
            .map_err(|e| self.err(e))?;
        Ok(count.unwrap_or(0))
    }

    /// Takes the per-hook named lock without waiting; `None`: another delivery of this hook
    /// (in any process) holds it. The lock lives on a connection owned by the [`HookLock`].
    pub async fn try_hook_lock(&self, hook_phid: &str) -> Result<Option<HookLock>, ClaimError> {
        let name = hook_lock_name(hook_phid);
        let mut conn = self.conn().await?;
        let got: Option<Option<i64>> = conn
            .exec_first("SELECT GET_LOCK(?, 0)", (&name,))
            .await
            .map_err(|e| self.err(e))?;
        match got.flatten() {
            Some(1) => Ok(Some(HookLock::held(conn, name))),
            Some(_) => Ok(None),
            None => Err(ClaimError::UnexpectedNull("GET_LOCK")),
        }
    }

    /// Request counts by status and the number of active hooks.
    pub async fn stats(&self) -> Result<Stats, ClaimError> {
        let mut conn = self.conn().await?;
        let by_status: Vec<(String, u64)> = conn
            .query("SELECT status, COUNT(*) FROM herald_webhookrequest GROUP BY status")
            .await
            .map_err(|e| self.err(e))?;
        let active: Option<u64> = conn
            .query_first(
                "SELECT COUNT(*) FROM herald_webhook WHERE status IN ('enabled', 'firehose')",
            )
            .await
            .map_err(|e| self.err(e))?;
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
        let count: Option<u64> = conn
            .query_first("SELECT COUNT(*) FROM herald_webhook")
            .await
            .map_err(|e| self.err(e))?;
        Ok(count.unwrap_or(0))
    }

    /// Queued rows and the age of the oldest one.
    pub async fn queue_depth(&self, now: u64) -> Result<QueueDepth, ClaimError> {
        let mut conn = self.conn().await?;
        let row: Option<(u64, Option<u64>)> = conn
            .query_first(
                "SELECT COUNT(*), MIN(dateCreated) FROM herald_webhookrequest WHERE status = 'queued'",
            )
            .await
            .map_err(|e| self.err(e))?;
        let (queued, oldest) = row.unwrap_or((0, None));
        Ok(QueueDepth {
            queued,
            oldest_age_sec: oldest.map(|created| now.saturating_sub(created)),
        })
    }

    /// Pool gauges for `/metrics`.
    pub fn pool_state(&self) -> PoolState {
        use std::sync::atomic::Ordering::Relaxed;
        let metrics = self.pool.metrics();
        PoolState {
            connections: metrics.connection_count.load(Relaxed) as u64,
            in_use: metrics.connections_in_use.load(Relaxed) as u64,
            waiting: metrics.active_wait_requests.load(Relaxed) as u64,
        }
    }

    /// Disconnects the pool; waits until checked-out connections (held hook locks) are back.
    /// Call only after in-flight results are written.
    pub async fn close(self) {
        // Errors here mean connections were already gone: nothing left to clean up.
        let _ = self.pool.disconnect().await;
    }
}

#[cfg(test)]
mod tests {
    use super::candidates_sql;

    #[test]
    fn exclusion_adds_one_placeholder_per_hook_before_the_limit() {
        assert!(candidates_sql(0).ends_with(") ORDER BY id ASC LIMIT ?"));
        assert!(!candidates_sql(0).contains("NOT IN"));
        assert!(candidates_sql(1).ends_with(") AND webhookPHID NOT IN (?) ORDER BY id ASC LIMIT ?"));
        assert!(candidates_sql(4)
            .ends_with(") AND webhookPHID NOT IN (?, ?, ?, ?) ORDER BY id ASC LIMIT ?"));
    }
}
