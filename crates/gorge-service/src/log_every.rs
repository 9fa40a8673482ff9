//! A failure that repeats is logged once per interval with a count, never once per event: a
//! flood of bad input (garbage stream entries, a listener out of descriptors) must not turn
//! into a flood of log lines. [`LogEvery`] decides when a line is due and how many
//! occurrences it reports; the caller counts every occurrence in its metric as well, and
//! emits the line (its event declares a count field).
//!
//! The first occurrence is logged at once; later ones are counted until `interval` has passed
//! since the last line, and the next occurrence after that is logged with the number counted
//! since the last line (itself included). Occurrences that stop inside an interval are not
//! logged again: the metric has them.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One repeated failure's log rate: at most one line per interval, with a count.
#[derive(Debug)]
pub struct LogEvery {
    interval: Duration,
    state: Mutex<Pending>,
}

#[derive(Debug)]
struct Pending {
    /// When the last line was due; `None` before the first occurrence.
    last_line: Option<Instant>,
    /// Occurrences since that line.
    unlogged: u64,
}

impl LogEvery {
    /// At most one line per `interval`.
    pub const fn new(interval: Duration) -> LogEvery {
        LogEvery {
            interval,
            state: Mutex::new(Pending {
                last_line: None,
                unlogged: 0,
            }),
        }
    }

    /// Counts one occurrence now; see [`LogEvery::occurred_at`].
    pub fn occurred(&self) -> Option<u64> {
        self.occurred_at(Instant::now())
    }

    /// Counts one occurrence at `now`. `Some(n)` when a line is due, reporting `n`
    /// occurrences (this one and those held back since the last line); `None` while lines
    /// are held back.
    pub fn occurred_at(&self, now: Instant) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.unlogged += 1;
        let due = state
            .last_line
            .is_none_or(|at| now.saturating_duration_since(at) >= self.interval);
        if !due {
            return None;
        }
        state.last_line = Some(now);
        Some(std::mem::take(&mut state.unlogged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_occurrence_is_logged_then_one_line_per_interval_with_the_count() {
        let every = LogEvery::new(Duration::from_secs(10));
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(every.occurred_at(at(0)), Some(1));
        // 200 000 garbage entries within the interval: no line.
        for i in 1..200_000u64 {
            assert_eq!(every.occurred_at(at(i / 100)), None);
        }
        // The first one after the interval reports all of them and itself.
        assert_eq!(every.occurred_at(at(10_000)), Some(200_000));
        assert_eq!(every.occurred_at(at(10_001)), None);
        // A quiet spell: the next occurrence is logged at once.
        assert_eq!(every.occurred_at(at(60_000)), Some(2));
    }
}
