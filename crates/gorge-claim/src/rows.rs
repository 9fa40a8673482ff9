//! Rows of `herald_webhookrequest` for delivery: the candidate query (within the two id
//! windows of `handover.rs`), the compare-and-set claim, the result write, failing a row
//! that cannot be claimed or used, and the sample of the newest rows. See the crate doc for
//! the row states; a held hook's next rows are in `held.rs`.
//!
//! Columns are read as bytes and checked here, so a row holding bytes that are not UTF-8 is
//! reported as a [`BrokenRow`], never a panic. Every write for delivery requires the
//! hand-over marker.

use mysql_async::prelude::Queryable;
use mysql_async::{Row, Value};
use phorge_wire::values::{RequestResult, RequestStatus};

use crate::error::ClaimError;
use crate::handover::{
    handed_over_sql, CandidateWindow, HandoverSample, NEWEST_ROWS_SQL, SAMPLE_ROWS,
    WINDOW_BOUNDS_SQL,
};
use crate::store::{int, placeholders, text, ClaimStore, ClaimTiming};

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

impl Batch {
    /// Sorts the rows a candidate query returned into usable, broken and unaddressable.
    pub(crate) fn read(rows: Vec<Row>) -> Batch {
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
        batch
    }
}

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
        sql.push_str(&format!(
            " AND webhookPHID NOT IN ({})",
            placeholders(excluded)
        ));
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

pub(crate) const RESULT_WRITE_SQL: &str = concat!(
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

/// The parameters of [`RESULT_WRITE_SQL`] for `write` of `claim` at `now`.
pub(crate) fn result_params(claim: &Claim, write: &ResultWrite, now: u64) -> Vec<Value> {
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

/// Reads one candidate row; `Err(None)` when the row cannot even be addressed.
fn read_candidate(row: &mut Row) -> Result<Candidate, Option<BrokenRow>> {
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

impl ClaimStore {
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
        Ok(Batch::read(rows))
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
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec_drop(RESULT_WRITE_SQL, result_params(claim, write, now)))
            .await;
        let (conn, ()) = self.settle(conn, out, "result write")?;
        Ok(conn.affected_rows() == 1)
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
