//! The `uniqueID`s of the messages taken in recently, so that each is taken in once: in a
//! cluster the same message can come twice — by relay and in a peer's history at warm-up, or
//! again when a relay whose answer was lost is retried. Bounded like the history (entries and
//! age): a message older than that could not be replayed anyway.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

/// The `uniqueID`s taken in during the history window, bounded like the history (entries
/// and age): a message older than that could not be replayed anyway.
#[derive(Debug)]
pub struct RecentIds {
    limit: usize,
    age_ms: u64,
    state: Mutex<Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    ids: HashSet<u64>,
    /// `(id, taken in at)`, oldest first.
    order: VecDeque<(u64, u64)>,
}

impl RecentIds {
    pub fn new(limit: usize, age_ms: u64) -> RecentIds {
        RecentIds {
            limit,
            age_ms,
            state: Mutex::new(Recent::default()),
        }
    }

    /// Forgets `id` (it was not taken in after all).
    pub fn forget(&self, id: u64) {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.ids.remove(&id) {
            state.order.retain(|(other, _)| *other != id);
        }
    }

    /// True (and remembered) if `id` was not taken in within the window.
    pub fn first_time(&self, id: u64, now_ms: u64) -> bool {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let oldest = now_ms.saturating_sub(self.age_ms);
        while let Some(&(old, at)) = state.order.front() {
            if at >= oldest && state.order.len() < self.limit.max(1) {
                break;
            }
            state.order.pop_front();
            state.ids.remove(&old);
        }
        // Memory goes back after a burst.
        if state.order.len() < state.order.capacity() / 4 && state.order.capacity() > 1024 {
            state.order.shrink_to_fit();
            state.ids.shrink_to_fit();
        }
        if !state.ids.insert(id) {
            return false;
        }
        state.order.push_back((id, now_ms));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_taken_once_within_the_window() {
        let recent = RecentIds::new(2, 1000);
        assert!(recent.first_time(1, 0));
        assert!(!recent.first_time(1, 500));
        assert!(recent.first_time(2, 600));
        // Over the entry bound: the oldest (1) is forgotten.
        assert!(recent.first_time(3, 700));
        assert!(recent.first_time(1, 800));
        // Past the age: 2 and 3 are forgotten.
        assert!(recent.first_time(2, 1900));
    }
}
