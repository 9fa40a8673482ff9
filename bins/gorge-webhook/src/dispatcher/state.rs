//! What this process is working on and remembers between rounds: rows and hooks in flight,
//! resting hooks, open breakers, rows that keep failing, and what was already logged once.
//!
//! Every collection is bounded ([`MAX_REMEMBERED`]); only plain data, no I/O under the lock.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::Dispatcher;

/// Most entries kept in each remembered set or map (rows that failed, keys logged once).
pub(super) const MAX_REMEMBERED: usize = 4096;

#[derive(Default)]
pub(super) struct LocalState {
    pub rows: HashSet<u64>,
    pub hooks: HashSet<String>,
    /// Hooks skipped for a reason that will not change at once (lock held by another
    /// process, breaker open), and until when (clock milliseconds) to leave them alone (the
    /// candidate query excludes them). Without this a backlog makes the loop re-poll at once
    /// after each skip and spin on the same hooks.
    pub resting: HashMap<String, u64>,
    pub open_breakers: HashSet<String>,
    /// Rows whose statements the server rejected, and how many times in a row.
    pub row_errors: HashMap<u64, u32>,
    /// Rows that can be neither delivered nor failed: skipped without a word from now on.
    pub quarantined: HashSet<u64>,
    /// A row's steps last ended in a database error (logged when this turns true).
    pub row_db_failing: bool,
    /// Keys of events logged once (`kind:key`).
    pub logged: HashSet<String>,
    /// Hooks whose lock was held elsewhere at their last try (see [`LockBusy`]).
    pub lock_busy: HashMap<String, LockBusy>,
    /// The last check of hooks locked elsewhere failed (logged when this turns true).
    pub lock_check_failing: bool,
    /// Rows whose blocked URI was logged and whose `hook`/`uri` result has not landed yet
    /// (a refused write leaves them queued: not logged again each poll).
    pub blocked_logged: HashSet<u64>,
}

/// A hook whose lock was found held by another session, as this process saw it (clock
/// milliseconds).
#[derive(Debug, Clone, Copy)]
pub(super) struct LockBusy {
    /// First found held (since this process last took it): the `lock_unavailable` gauges.
    /// A lock held for longer than any delivery takes is held by something that is not
    /// delivering (a session left behind by a dead connection).
    pub since: u64,
    /// The last try.
    pub last: u64,
    /// Start of the current run of tries no more than a gap apart: the hook's rest grows
    /// with it ([`lock_busy_rest`]). Tries far apart (the hook had no rows, or every
    /// slot was busy) say nothing about the lock in between, so the rest starts short again.
    pub run_since: u64,
}

/// Shortest rest of a hook whose lock is held elsewhere (before jitter). The holder is most
/// often another gorge-webhook process running through the hook's rows (`hold.rs`, at most
/// 1 s), or Phorge's worker sending one request: both let go soon, and a replica that
/// waited a whole poll interval for every such hook left most of the hooks idle (see
/// [`lock_busy_rest`]).
const LOCK_BUSY_REST_MIN: Duration = Duration::from_millis(50);

/// How long a hook whose lock was just found held elsewhere is left out of the candidate
/// query: as long as it has been found held at every try so far (`busy_for`, milliseconds),
/// at least [`LOCK_BUSY_REST_MIN`], at most the poll interval, then times `jitter` in
/// [0.5, 1.5) (so 25 ms to 1.5 poll intervals in all).
///
/// So the tries back off like doubling: a lock let go soon is taken again soon, one held
/// for long (a session left behind, a long delivery) is tried once per poll interval as
/// before. The jitter keeps replicas that lost the same lock from all trying again at the
/// same moment.
pub(super) fn lock_busy_rest(busy_for: u64, poll_interval: Duration, jitter: f64) -> Duration {
    let cap = poll_interval.as_millis() as u64;
    let base = busy_for.max(LOCK_BUSY_REST_MIN.as_millis() as u64).min(cap);
    Duration::from_millis((base as f64 * jitter.clamp(0.5, 1.5)) as u64)
}

/// A number in [0.5, 1.5) that differs between processes, hooks and moments (std's
/// randomly keyed hasher; no randomness crate needed for a jitter).
pub(super) fn jitter_of(hook: &str, now_ms: u64) -> f64 {
    use std::hash::BuildHasher;
    let hash = std::collections::hash_map::RandomState::new().hash_one((hook, now_ms));
    0.5 + (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// A hook not tried again within this long (clock milliseconds) is forgotten by
/// [`LocalState::lock_busy_summary`]: its rows are gone or its lock is no longer asked for.
const LOCK_BUSY_STALE_MS: u64 = 30_000;

impl LocalState {
    /// True the first time `key` is seen (bounded: once full, nothing more is logged).
    pub fn first_time(&mut self, key: String) -> bool {
        if self.logged.len() >= MAX_REMEMBERED {
            return false;
        }
        self.logged.insert(key)
    }

    /// True the first time `row`'s URI is refused, until its result lands (bounded: when
    /// full it starts over).
    pub fn blocked_first_time(&mut self, row: u64) -> bool {
        if self.blocked_logged.len() >= MAX_REMEMBERED {
            self.blocked_logged.clear();
        }
        self.blocked_logged.insert(row)
    }

    /// Counts one more rejected statement for `row`; returns the count.
    pub fn row_failed(&mut self, row: u64) -> u32 {
        if self.row_errors.len() >= MAX_REMEMBERED && !self.row_errors.contains_key(&row) {
            self.row_errors.clear();
        }
        let count = self.row_errors.entry(row).or_insert(0);
        *count += 1;
        *count
    }

    /// `hook`'s lock was held elsewhere at `now`; returns for how long (milliseconds) it
    /// has been found held at every try of the current run of tries: 0 the first time, and
    /// when the last try is more than `max_gap` ago (the lock may have been free in
    /// between). When the map is full and `hook` is not in it, `u64::MAX`: nothing is known,
    /// so the caller backs off as far as it can.
    pub fn lock_busy(&mut self, hook: &str, now: u64, max_gap: u64) -> u64 {
        if let Some(entry) = self.lock_busy.get_mut(hook) {
            if now.saturating_sub(entry.last) > max_gap {
                entry.run_since = now;
            }
            entry.last = now;
            now.saturating_sub(entry.run_since)
        } else if self.lock_busy.len() < MAX_REMEMBERED {
            self.lock_busy.insert(
                hook.to_owned(),
                LockBusy {
                    since: now,
                    last: now,
                    run_since: now,
                },
            );
            0
        } else {
            u64::MAX
        }
    }

    /// Hooks whose lock is still held elsewhere, and for how long the longest has been
    /// (milliseconds); forgets hooks not tried again lately.
    pub fn lock_busy_summary(&mut self, now: u64) -> (usize, u64) {
        self.lock_busy
            .retain(|_, busy| now.saturating_sub(busy.last) < LOCK_BUSY_STALE_MS);
        let longest = self
            .lock_busy
            .values()
            .map(|busy| now.saturating_sub(busy.since));
        (self.lock_busy.len(), longest.max().unwrap_or(0))
    }

    pub fn quarantine(&mut self, row: u64) {
        if self.quarantined.len() < MAX_REMEMBERED {
            self.quarantined.insert(row);
        }
    }
}

/// One row being worked on: releases the row, its hook and the concurrency slot on drop.
pub(super) struct Slot<'a> {
    pub dispatcher: &'a Dispatcher,
    pub row: u64,
    pub hook: &'a str,
    pub _permit: OwnedSemaphorePermit,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        {
            let mut state = self.dispatcher.local_state();
            state.rows.remove(&self.row);
            state.hooks.remove(self.hook);
        }
        self.dispatcher.metrics.in_flight.dec();
        // The permit (a field) is released right after this body; a poll loop woken by the
        // notification waits for a free slot before polling anyway.
        self.dispatcher.finished.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{jitter_of, lock_busy_rest, LocalState, MAX_REMEMBERED};

    const POLL: Duration = Duration::from_millis(1000);

    #[test]
    fn a_lock_found_held_for_the_first_time_is_tried_again_soon() {
        assert_eq!(lock_busy_rest(0, POLL, 1.0), Duration::from_millis(50));
        assert_eq!(lock_busy_rest(0, POLL, 0.5), Duration::from_millis(25));
    }

    #[test]
    fn the_rest_grows_with_how_long_the_lock_has_been_held_up_to_the_poll_interval() {
        assert_eq!(lock_busy_rest(120, POLL, 1.0), Duration::from_millis(120));
        assert_eq!(lock_busy_rest(900, POLL, 1.0), Duration::from_millis(900));
        assert_eq!(lock_busy_rest(60_000, POLL, 1.0), POLL);
        assert_eq!(
            lock_busy_rest(60_000, POLL, 1.49),
            Duration::from_millis(1490)
        );
        // A poll interval below the minimum caps the rest too.
        let fast = Duration::from_millis(20);
        assert_eq!(lock_busy_rest(0, fast, 1.0), fast);
    }

    #[test]
    fn jitter_stays_in_its_range_and_varies() {
        let samples: Vec<f64> = (0..200).map(|t| jitter_of("PHID-HWBH-x", t)).collect();
        assert!(
            samples.iter().all(|j| (0.5..1.5).contains(j)),
            "{samples:?}"
        );
        let low = samples.iter().filter(|j| **j < 1.0).count();
        assert!((40..160).contains(&low), "{low} of 200 below 1.0");
    }

    #[test]
    fn a_lock_found_held_try_after_try_counts_from_the_first_try() {
        let mut state = LocalState::default();
        assert_eq!(state.lock_busy("h", 1_000, 3_000), 0);
        assert_eq!(state.lock_busy("h", 1_050, 3_000), 50);
        assert_eq!(state.lock_busy("h", 2_500, 3_000), 1_500);
    }

    #[test]
    fn a_gap_longer_than_any_rest_starts_the_count_over_but_not_the_gauge() {
        let mut state = LocalState::default();
        state.lock_busy("h", 1_000, 3_000);
        state.lock_busy("h", 2_000, 3_000);
        // Quiet for 20 s: the lock may well have been free meanwhile.
        assert_eq!(state.lock_busy("h", 22_000, 3_000), 0);
        assert_eq!(state.lock_busy("h", 22_100, 3_000), 100);
        // The gauge still counts from the first try (stale only after 30 s without one).
        assert_eq!(state.lock_busy_summary(22_100), (1, 21_100));
    }

    #[test]
    fn a_hook_not_remembered_backs_off_fully() {
        let mut state = LocalState::default();
        for n in 0..MAX_REMEMBERED {
            state.lock_busy(&format!("h{n}"), 0, 3_000);
        }
        assert_eq!(state.lock_busy("one-more", 0, 3_000), u64::MAX);
        assert_eq!(state.lock_busy.len(), MAX_REMEMBERED);
    }
}
