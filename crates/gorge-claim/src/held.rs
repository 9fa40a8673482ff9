//! A hook's next rows, read on the session that holds the hook's lock.
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
//!
//! Result writes of a hold's rows run on the lock's session too
//! ([`ClaimStore::write_result_on`]): a session that died during a POST fails that write
//! (which is then retried on another connection) and the hold stops before the hook's next
//! POST, so the lock is never assumed for more than the row in flight.
//!
//! Finding is not claiming. The rows found are claimed together with
//! [`ClaimStore::claim_fresh`], one `UPDATE` for all of them, also on the lock's session:
//! each row's compare-and-set is "still fresh" (`status = 'queued' AND dateModified =
//! dateCreated AND lastRequestEpoch = 0`, a state no claim or write ever returns a row to
//! except [`ClaimStore::unclaim_fresh`]), and its new version is
//! `max(dateCreated + 1, now)` as a single claim's would be. Which rows were won can be told
//! from the count alone only when it is all or none: MariaDB has no `UPDATE … RETURNING`, and
//! a later `SELECT` cannot tell our version from another claimant's of the same second. So a
//! partial count (another process changed one of them in between: a claim it made without
//! the lock, for a hook it saw disabled or missing) counts as none won, and the rows won
//! wait out their lease like the row of a process that died, then go out once. Rows claimed
//! and not delivered when the hold ends are given back with [`ClaimStore::unclaim_fresh`].

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use crate::error::ClaimError;
use crate::handover::handed_over_sql;
use crate::lock::HookLock;
use crate::rows::{
    candidates_select, result_params, Batch, Candidate, Claim, ResultWrite, RESULT_WRITE_SQL,
};
use crate::store::{placeholders, ClaimStore, Timed};

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

impl ClaimStore {
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

    /// [`ClaimStore::settle`] for a statement on the session of `lock`: on an error or a
    /// timeout the session is given up ([`HookLock::give_up`]), so the lock is no longer
    /// assumed held.
    fn settle_on<'a, T>(
        &self,
        lock: &'a mut HookLock,
        out: Timed<T>,
        what: &'static str,
    ) -> Result<(&'a mut Conn, T), ClaimError> {
        match out {
            Ok(Ok(value)) => Ok((lock.session()?, value)),
            Ok(Err(err)) => {
                lock.give_up();
                Err(self.err(err))
            }
            Err(_) => {
                lock.give_up();
                Err(ClaimError::Timeout(what))
            }
        }
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
}

#[cfg(test)]
mod tests {
    use super::next_hook_rows_sql;

    #[test]
    fn the_scan_is_bounded_and_only_fresh_handed_over_rows_come_back() {
        let sql = next_hook_rows_sql();
        assert!(sql.contains("FORCE INDEX (key_ratelimit)"));
        assert!(sql.contains("ORDER BY id ASC LIMIT ?) AS scan"));
        assert!(sql.contains("dateModified = dateCreated"));
        assert!(sql.contains(r#""handedOverTo":"gorge-webhook""#));
    }
}
