//! Finding rows of `herald_webhookrequest` for delivery: the candidate query (within the two
//! id windows of `handover.rs`), a held hook's next fresh rows, and the sample of the newest
//! rows. Finding is not claiming: a row found here is ours only after `claims.rs` won it.
//! See the crate doc for the row states.
//!
//! Columns are read as bytes and checked here, so a row holding bytes that are not UTF-8 is
//! reported as a [`BrokenRow`], never a panic.
//!
//! A process that has just delivered a row of a hook, and still holds that hook's named lock,
//! goes on with the hook's next fresh rows instead of releasing the lock and taking it again
//! for each of them (two statements per row saved). [`ClaimStore::next_hook_rows`] finds them:
//!
//! - only fresh rows (`lastRequestResult = 'none' AND lastRequestEpoch = 0`, never attempted,
//!   never claimed: `dateModified = dateCreated`), queued and handed over; retries and rows
//!   whose lease ran out are left to the poll round's candidate query;
//! - through Phorge's `key_ratelimit (webhookPHID, lastRequestResult, lastRequestEpoch)`
//!   index, whose entries also carry the primary key and so are in id order for one hook:
//!   the inner query reads at most [`HOOK_SCAN_ROWS`] index entries after the last row
//!   delivered, however many of the hook's rows are Phorge's own or already finished;
//! - on the lock's own session: if that session is gone (killed, its network path dead),
//!   the query fails and the caller stops, so no row is found for delivery under a lock that
//!   is no longer held. A failed or timed-out query gives the session up (closed and
//!   killed, which frees the lock).

use mysql_async::prelude::Queryable;
use mysql_async::{Row, Value};

use crate::error::ClaimError;
use crate::handover::{
    handed_over_sql, CandidateWindow, HandoverSample, NEWEST_ROWS_SQL, SAMPLE_ROWS,
    WINDOW_BOUNDS_SQL,
};
use crate::lock::HookLock;
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

/// Most `key_ratelimit` entries one [`ClaimStore::next_hook_rows`] query reads.
pub const HOOK_SCAN_ROWS: u64 = 32;

/// The next-rows query after its columns: a bounded, index-only scan of the hook's fresh
/// rows after an id, then the rows themselves, filtered as the candidate query filters a
/// fresh row.
const NEXT_HOOK_ROWS_SQL_TAIL: &str = concat!(
    "FROM (SELECT id AS scan_id FROM herald_webhookrequest FORCE INDEX (key_ratelimit) \
WHERE webhookPHID = ? AND lastRequestResult = 'none' AND lastRequestEpoch = 0 AND id > ? \
ORDER BY id ASC LIMIT ?) AS scan \
JOIN herald_webhookrequest ON id = scan_id \
WHERE status = 'queued' AND dateModified = dateCreated AND ",
    handed_over_sql!(),
    " ORDER BY id ASC LIMIT ?"
);

fn next_hook_rows_sql() -> String {
    let mut sql = candidates_select();
    sql.push_str(NEXT_HOOK_ROWS_SQL_TAIL);
    sql
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

    /// Up to `limit` fresh, handed-over rows of `hook_phid` with ids above `after_id`,
    /// oldest first, read on the session of `lock` (see the module doc). An error gives the
    /// lock's session up: the caller must not deliver under it any more
    /// ([`HookLock::is_held`] is false).
    pub async fn next_hook_rows(
        &self,
        lock: &mut HookLock,
        hook_phid: &str,
        after_id: u64,
        limit: usize,
    ) -> Result<Batch, ClaimError> {
        let params: Vec<Value> = vec![
            hook_phid.into(),
            after_id.into(),
            HOOK_SCAN_ROWS.into(),
            (limit as u64).into(),
        ];
        let out = self
            .timed(
                lock.session()?
                    .exec::<Row, _, _>(next_hook_rows_sql(), params),
            )
            .await;
        let (_session, rows) = self.settle_on(lock, out, "next rows of a held hook")?;
        Ok(Batch::read(rows))
    }
}

#[cfg(test)]
mod tests {
    use super::{candidates_sql, next_hook_rows_sql};

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

    #[test]
    fn the_scan_is_bounded_and_only_fresh_handed_over_rows_come_back() {
        let sql = next_hook_rows_sql();
        assert!(sql.contains("FORCE INDEX (key_ratelimit)"));
        assert!(sql.contains("ORDER BY id ASC LIMIT ?) AS scan"));
        assert!(sql.contains("dateModified = dateCreated"));
        assert!(sql.contains(r#""handedOverTo":"gorge-webhook""#));
    }
}
