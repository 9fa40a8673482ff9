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
//! Finding is not claiming: each row is still claimed with its own compare-and-set.

use mysql_async::prelude::Queryable;
use mysql_async::{Row, Value};

use crate::error::ClaimError;
use crate::handover::handed_over_sql;
use crate::lock::HookLock;
use crate::store::{candidates_select, read_candidate, Batch, ClaimStore};

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
        let Some(session) = lock.session() else {
            return Err(ClaimError::Timeout("the hook lock's session was given up"));
        };
        let params: Vec<Value> = vec![
            hook_phid.into(),
            after_id.into(),
            HOOK_SCAN_ROWS.into(),
            (limit as u64).into(),
        ];
        let out = self
            .timed(session.exec::<Row, _, _>(next_hook_rows_sql(), params))
            .await;
        let rows = match out {
            Ok(Ok(rows)) => rows,
            Ok(Err(err)) => {
                lock.give_up();
                return Err(self.err(err));
            }
            Err(_) => {
                lock.give_up();
                return Err(ClaimError::Timeout("next rows of a held hook"));
            }
        };
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
