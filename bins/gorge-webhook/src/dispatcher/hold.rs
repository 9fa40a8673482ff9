//! Holding a hook's lock across its consecutive rows.
//!
//! Phorge's worker takes the hook's named lock for each request; taking and releasing it
//! were two of the ~4.4 statements this service spent per row. Once a row of a hook has
//! been delivered (POSTed, answered 2xx, its `sent` result written), the process keeps the
//! lock and goes on with the hook's next fresh rows ([`gorge_claim::ClaimStore::next_hook_rows`], read
//! on the lock's own session, [`NEXT_ROWS`] at a time with their objects and transactions
//! in one query per table, and claimed together with [`gorge_claim::ClaimStore::claim_fresh`]), one
//! after the other: still at most one request in flight per hook, no POST before its row's
//! claim. Rows claimed and not delivered when the hold ends are given back fresh.
//!
//! The hold ends, and the lock is released, when:
//! - a row does not end in a landed `sent` result (a failure, a hook error, a lost claim, a
//!   database error): the next row starts over from a poll round, breaker check included;
//! - the hook has no more fresh rows (or the next one's `properties` cannot be parsed: the
//!   poll round fails it);
//! - shutdown begins;
//! - the bound is reached: [`HOLD_MAX_ROWS`] rows or [`HOLD_MAX`] since the lock was taken.
//!   Then the hook rests (is left out of the candidate query) for as long as the lock was
//!   held, so that while gorge drains a hook's backlog the lock is free at least half of
//!   the time, and Phorge's own worker (which tries `GET_LOCK` without waiting and yields
//!   for 15 s when it is taken) is never starved in mixed or rollback mode.
//!
//! The hook row and its breaker count are those the poll round read when the hold began;
//! the bound keeps them at most [`HOLD_MAX`] old (Phorge reads them per request). The lock
//! session's `wait_timeout` (`GORGE_WEBHOOK_MYSQL_LOCK_SESSION_TIMEOUT`) is far above the
//! bound, and every fetch of next rows runs on that session, so a hold never outlives it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use gorge_claim::{BatchClaim, Candidate, Claim, Hook, HookLock};

use super::Dispatcher;
use crate::events;
use gorge_service::emit;

/// Most rows delivered under one taking of a hook's lock (the first one included).
pub(super) const HOLD_MAX_ROWS: u32 = 32;

/// Longest a hook's lock is held for rows after the first (clock time).
pub(super) const HOLD_MAX: Duration = Duration::from_secs(1);

/// Next rows fetched at a time while holding a lock.
pub(super) const NEXT_ROWS: usize = 8;

/// A hook's lock, still held after a row, with what the poll round read for the hook.
pub(super) struct Held {
    pub lock: HookLock,
    pub hook: Hook,
    pub failures: u64,
    /// When the lock was taken (clock milliseconds).
    pub since: u64,
}

impl Dispatcher {
    /// Delivers the hook's next rows under `held` while `go_on` (the last row was
    /// delivered) and within the bound, then releases the lock. `after`: the id of the row
    /// delivered last.
    pub(super) async fn hold(&self, mut held: Held, mut after: u64, mut go_on: bool) {
        let since = held.since;
        let past_time_bound =
            || self.clock.now_ms().saturating_sub(since) >= HOLD_MAX.as_millis() as u64;
        let mut rows_done = 1u32;
        let mut bounded = false;
        while go_on {
            go_on = false;
            if rows_done >= HOLD_MAX_ROWS || past_time_bound() {
                bounded = true;
                break;
            }
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let want = NEXT_ROWS.min((HOLD_MAX_ROWS - rows_done) as usize);
            let next = match self
                .store
                .next_hook_rows(&mut held.lock, &held.hook.phid, after, want)
                .await
            {
                Ok(batch) => batch.rows,
                // The lock's session was given up; rows and the error are the poll's again.
                Err(_) => break,
            };
            let candidates: Vec<&Candidate> = next.iter().collect();
            let Ok(requests) = self.load_requests(&candidates).await else {
                break;
            };
            // The rows up to the first one that cannot go out here: unusable properties
            // (the poll round fails it), or a row this process already knows.
            let usable: Vec<_> = {
                let state = self.local_state();
                candidates
                    .into_iter()
                    .zip(requests)
                    .map_while(|(candidate, request)| {
                        if state.quarantined.contains(&candidate.id)
                            || state.rows.contains(&candidate.id)
                        {
                            return None;
                        }
                        request.ok().map(|request| (candidate, request))
                    })
                    .collect()
            };
            let rows: Vec<&Candidate> = usable.iter().map(|(candidate, _)| *candidate).collect();
            let claimed_at = self.clock.now_sec();
            // Each row's claim, in the order of `usable`, until its way takes it.
            let mut claims: Vec<Option<Claim>> = match self
                .store
                .claim_fresh(&mut held.lock, &rows, claimed_at)
                .await
            {
                Ok(BatchClaim::All(claims)) => claims.into_iter().map(Some).collect(),
                Ok(BatchClaim::None) => break,
                Ok(BatchClaim::Unclear) => {
                    self.metrics.claims_unclear.inc();
                    break;
                }
                Err(_) => break,
            };
            for ((candidate, request), claim) in usable.into_iter().zip(&mut claims) {
                go_on = false;
                if past_time_bound() {
                    bounded = true;
                    break;
                }
                self.local_state().rows.insert(candidate.id);
                self.metrics.held_rows.inc();
                // The row's way under the held lock, with the claim won for it; a claim its
                // way did not use comes back, to be given back below.
                let (end, unused) = self
                    .under_lock(
                        candidate,
                        &held.hook,
                        held.failures,
                        request,
                        &mut held.lock,
                        claim.take(),
                    )
                    .await;
                *claim = unused;
                go_on = end.delivered() && held.lock.is_held();
                self.finish(candidate, end).await;
                self.local_state().rows.remove(&candidate.id);
                rows_done += 1;
                after = candidate.id;
                if !go_on {
                    break;
                }
            }
            // Rows claimed with the others whose way did not take their claim (not
            // reached, or ended before the claim step) go back to fresh.
            let left: Vec<u64> = claims.iter().flatten().map(|claim| claim.id).collect();
            if !left.is_empty() {
                if let Ok(given_back) = self.store.unclaim_fresh(&left, claimed_at).await {
                    self.metrics.claims_given_back.inc_by(given_back);
                }
            }
        }
        let held_for = Duration::from_millis(self.clock.now_ms().saturating_sub(since));
        let hook = held.hook.phid;
        if let Err(err) = held.lock.release().await {
            // The server frees the lock with the session that the release just closed.
            emit!(self.log, events::WEBHOOK_LOCK_RELEASE_FAILED; "hook" => &hook, "error" => %err);
        }
        if bounded {
            self.metrics.hold_bounds.inc();
            self.rest(&hook, held_for);
        }
    }
}
