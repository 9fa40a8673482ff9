//! A row becomes ours, and its result is written while it still is: the compare-and-set
//! claim on `dateModified` ([`ClaimStore::claim`]; a held hook's fresh rows together,
//! [`ClaimStore::claim_fresh`], and giving back those not delivered,
//! [`ClaimStore::unclaim_fresh`]), the result write ([`ClaimStore::write_result`], or on the
//! session of the hook's lock, [`ClaimStore::write_result_on`]), and failing a row that
//! cannot be claimed ([`ClaimStore::fail_unclaimable`]). One row's way from claim to result
//! is this file; finding the rows is `rows.rs`. See the crate doc for the row states.
//!
//! A batch claim's compare-and-set is "still fresh" per row (`status = 'queued' AND
//! dateModified = dateCreated AND lastRequestEpoch = 0`, a state no claim or write ever
//! returns a row to except [`ClaimStore::unclaim_fresh`]), and each row's new version is
//! `max(dateCreated + 1, now)` as a single claim's would be. Which rows were won can be told
//! from the count alone only when it is all or none: MariaDB has no `UPDATE … RETURNING`,
//! and a later `SELECT` cannot tell our version from another claimant's of the same second.
//! So a partial count (another process changed one of them in between: a claim it made
//! without the lock, for a hook it saw disabled or missing) counts as none won, and the rows
//! won wait out their lease like the row of a process that died, then go out once.
//!
//! Result writes of a hold's rows run on the lock's session: a session that died during a
//! POST fails that write (which is then retried on another connection) and the hold stops
//! before the hook's next POST, so the lock is never assumed for more than the row in flight.

use mysql_async::prelude::Queryable;
use mysql_async::Value;
use phorge_wire::values::{RequestResult, RequestStatus};

use crate::error::ClaimError;
use crate::handover::handed_over_sql;
use crate::lock::HookLock;
use crate::rows::Candidate;
use crate::store::{placeholders, ClaimStore};

/// A won claim: the row is ours while its `dateModified` is still `version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The row's `id`.
    pub id: u64,
    /// The `dateModified` the claim wrote; the result write compares against it.
    pub version: u64,
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

/// What a batch claim won.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchClaim {
    /// Every row, in the order given.
    All(Vec<Claim>),
    /// None of them.
    None,
    /// Some but not all: which ones cannot be told (see the module doc); none may be sent.
    Unclear,
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

/// Whether the row holds exactly what [`RESULT_WRITE_SQL`] writes (the same parameters, in
/// the same order, but for the claim version): asked after a result write whose answer was
/// lost, to tell "my earlier attempt landed" from "another process took the row over".
const RESULT_HELD_SQL: &str = "SELECT COUNT(*) FROM herald_webhookrequest \
WHERE status = ? AND lastRequestResult = ? AND lastRequestEpoch = ? AND dateModified = ? \
AND properties = ? AND id = ?";

/// The parameters of [`RESULT_WRITE_SQL`] for `write` of `claim` at `now`.
fn result_params(claim: &Claim, write: &ResultWrite, now: u64) -> Vec<Value> {
    let (last_epoch, version) = match write.epoch() {
        None => (0, claim.version),
        Some(epoch) => {
            let marker = claim.version.max(now).max(epoch);
            (marker, marker)
        }
    };
    vec![
        write.status().as_str().into(),
        write.result().as_str().into(),
        last_epoch.into(),
        version.into(),
        write.properties().into(),
        claim.id.into(),
        claim.version.into(),
    ]
}

/// Gives a claim back unused: the row returns to the version it had before the claim, while
/// it is still at the claim's version (nothing written since).
const UNCLAIM_SQL: &str = concat!(
    "UPDATE herald_webhookrequest SET dateModified = ? \
WHERE id = ? AND status = 'queued' AND dateModified = ? AND ",
    handed_over_sql!()
);

/// The batch claim after its `IN (` list; see the module doc.
const CLAIM_FRESH_SQL_TAIL: &str = concat!(
    ") AND status = 'queued' AND dateModified = dateCreated AND lastRequestEpoch = 0 AND ",
    handed_over_sql!()
);

/// Gives back rows claimed by [`ClaimStore::claim_fresh`] at `now`: only while each is still
/// at the version that claim wrote and has no result.
const UNCLAIM_FRESH_SQL_TAIL: &str = concat!(
    ") AND status = 'queued' AND lastRequestEpoch = 0 \
AND dateModified = GREATEST(dateCreated + 1, ?) AND ",
    handed_over_sql!()
);

impl ClaimStore {
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

    /// Claims `rows` (fresh rows of the hook `lock` holds, as [`ClaimStore::next_hook_rows`]
    /// found them) with one `UPDATE` on the lock's session, at `now`. An error gives the
    /// session up, as in [`ClaimStore::next_hook_rows`].
    pub async fn claim_fresh(
        &self,
        lock: &mut HookLock,
        rows: &[&Candidate],
        now: u64,
    ) -> Result<BatchClaim, ClaimError> {
        if rows.is_empty() {
            return Ok(BatchClaim::None);
        }
        let sql = format!(
            "UPDATE herald_webhookrequest SET dateModified = GREATEST(dateCreated + 1, ?) \
             WHERE id IN ({}{CLAIM_FRESH_SQL_TAIL}",
            placeholders(rows.len())
        );
        let mut params: Vec<Value> = vec![now.into()];
        params.extend(rows.iter().map(|row| Value::from(row.id)));
        let out = self.timed(lock.session()?.exec_drop(sql, params)).await;
        let (session, ()) = self.settle_on(lock, out, "batch claim")?;
        let affected = session.affected_rows();
        Ok(if affected == rows.len() as u64 {
            BatchClaim::All(
                rows.iter()
                    .map(|row| Claim {
                        id: row.id,
                        version: (row.date_created + 1).max(now),
                    })
                    .collect(),
            )
        } else if affected == 0 {
            BatchClaim::None
        } else {
            BatchClaim::Unclear
        })
    }

    /// Gives back rows of a [`ClaimStore::claim_fresh`] at `now` that were not delivered:
    /// fresh again, while still at that claim's version without a result. Returns how many
    /// were given back.
    pub async fn unclaim_fresh(&self, ids: &[u64], now: u64) -> Result<u64, ClaimError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let sql = format!(
            "UPDATE herald_webhookrequest SET dateModified = dateCreated \
             WHERE id IN ({}{UNCLAIM_FRESH_SQL_TAIL}",
            placeholders(ids.len())
        );
        let mut params: Vec<Value> = ids.iter().map(|id| Value::from(*id)).collect();
        params.push(now.into());
        let mut conn = self.conn().await?;
        let out = self.timed(conn.exec_drop(sql, params)).await;
        let (conn, ()) = self.settle(conn, out, "giving back claimed rows")?;
        Ok(conn.affected_rows())
    }

    /// Gives `claim` back without a result: the row returns to `seen_version` (its version
    /// before the claim), so the next claimant takes it at once instead of after the lease.
    /// Only for a claim nothing was sent for: the next claimant sends it. `false`: the row
    /// was no longer at the claim's version.
    pub async fn unclaim(&self, claim: &Claim, seen_version: u64) -> Result<bool, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec_drop(UNCLAIM_SQL, (seen_version, claim.id, claim.version)))
            .await;
        let (conn, ()) = self.settle(conn, out, "giving back a claim")?;
        Ok(conn.affected_rows() == 1)
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
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec_drop(RESULT_WRITE_SQL, result_params(claim, write, now)))
            .await;
        let (conn, ()) = self.settle(conn, out, "result write")?;
        Ok(conn.affected_rows() == 1)
    }

    /// Whether the row already holds `write` of `claim` at `now`, byte for byte: after an
    /// attempt of [`ClaimStore::write_result`] failed without an answer (the statement may
    /// have committed while its answer was lost), a retry that changes no row asks this
    /// before it calls the row taken over. A process that took the row over claimed it at a
    /// newer version and writes its own result, so it never matches.
    pub async fn holds_result(
        &self,
        claim: &Claim,
        write: &ResultWrite,
        now: u64,
    ) -> Result<bool, ClaimError> {
        let mut params = result_params(claim, write, now);
        params.truncate(6);
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec_first::<u64, _, _>(RESULT_HELD_SQL, params))
            .await;
        let (_, count) = self.settle(conn, out, "checking a result write")?;
        Ok(count == Some(1))
    }

    /// [`ClaimStore::write_result`] on the session of `lock`: a session that is gone fails
    /// the write (and is given up, as in [`ClaimStore::next_hook_rows`]), so a hold learns
    /// that its lock is lost before the hook's next POST. The caller retries a failed write
    /// through [`ClaimStore::write_result`].
    pub async fn write_result_on(
        &self,
        lock: &mut HookLock,
        claim: &Claim,
        write: &ResultWrite,
        now: u64,
    ) -> Result<bool, ClaimError> {
        let params = result_params(claim, write, now);
        let out = self
            .timed(lock.session()?.exec_drop(RESULT_WRITE_SQL, params))
            .await;
        let (session, ()) = self.settle_on(lock, out, "result write")?;
        Ok(session.affected_rows() == 1)
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
}
