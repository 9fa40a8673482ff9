//! How long this process itself stood still: stopped (SIGSTOP, a frozen VM or container),
//! or starved of CPU. A delivery's deadline measures the receiver, but it runs on the wall
//! clock, and time this process could not run passes on it all the same: a receiver that
//! answered at once, its answer waiting in the socket while the process was stopped, would
//! be written as cURL's 28 (`timeout`), a failure of ours charged to the receiver; for a
//! `retry=forever` row, the request then goes again, a second delivery of one request
//! (chaos seeds 212 and 213, issue 32). The deliverer reads [`StallClock::stalled`] and
//! moves its deadline on by what the process stood still (`delivery.rs`).
//!
//! A ticker task on the runtime notes when it ran; a gap between two ticks longer than
//! [`STALL_THRESHOLD`] beyond the tick is time the runtime did not run. The gap going on now
//! (the ticker not yet run since the process came back) counts too, so a deadline that
//! fires first after a stop already sees it.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often the ticker runs.
const TICK: Duration = Duration::from_millis(100);

/// A gap beyond [`TICK`] shorter than this is ordinary scheduling, not a stall.
const STALL_THRESHOLD: Duration = Duration::from_millis(250);

/// Shared by the deliverer's clones; the ticker holds it weakly and ends with it.
#[derive(Debug, Clone)]
pub struct StallClock {
    inner: Option<Arc<Mutex<Ticks>>>,
}

#[derive(Debug)]
struct Ticks {
    last: Instant,
    /// Stalls seen by the ticker so far, added up.
    stalled: Duration,
}

impl StallClock {
    /// A clock whose ticker runs on the current tokio runtime; outside a runtime, one that
    /// never sees a stall.
    pub fn start() -> StallClock {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return StallClock { inner: None };
        };
        let ticks = Arc::new(Mutex::new(Ticks {
            last: Instant::now(),
            stalled: Duration::ZERO,
        }));
        runtime.spawn(tick(Arc::downgrade(&ticks)));
        StallClock { inner: Some(ticks) }
    }

    /// How long the process has stood still since the clock started, the stall going on now
    /// included. Only differences of two readings mean anything.
    pub fn stalled(&self) -> Duration {
        let Some(ticks) = &self.inner else {
            return Duration::ZERO;
        };
        let ticks = ticks.lock().unwrap_or_else(|e| e.into_inner());
        ticks.stalled + stall_in(ticks.last.elapsed())
    }
}

/// The part of a gap between two ticks that the process stood still.
fn stall_in(gap: Duration) -> Duration {
    let beyond = gap.saturating_sub(TICK);
    if beyond > STALL_THRESHOLD {
        beyond
    } else {
        Duration::ZERO
    }
}

async fn tick(ticks: Weak<Mutex<Ticks>>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(ticks) = ticks.upgrade() else { return };
        let mut ticks = ticks.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let gap = now.duration_since(ticks.last);
        ticks.stalled += stall_in(gap);
        ticks.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_gap_well_beyond_the_tick_is_a_stall() {
        assert_eq!(stall_in(Duration::from_millis(90)), Duration::ZERO);
        assert_eq!(stall_in(Duration::from_millis(300)), Duration::ZERO);
        assert_eq!(
            stall_in(Duration::from_millis(2_100)),
            Duration::from_secs(2)
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_runtime_is_seen_at_once_and_after_the_ticker_ran() {
        let clock = StallClock::start();
        tokio::time::sleep(TICK * 2).await;
        let before = clock.stalled();
        // The only thread of the runtime blocked: nothing on it runs, the ticker neither.
        std::thread::sleep(Duration::from_millis(1_500));
        let seen_now = clock.stalled() - before;
        assert!(seen_now >= Duration::from_millis(1_000), "{seen_now:?}");
        tokio::time::sleep(TICK * 2).await;
        let seen_later = clock.stalled() - before;
        assert!(seen_later >= seen_now, "{seen_later:?} < {seen_now:?}");
        assert!(seen_later < Duration::from_millis(2_500), "{seen_later:?}");
    }

    #[test]
    fn outside_a_runtime_nothing_is_seen() {
        let clock = StallClock::start();
        assert_eq!(clock.stalled(), Duration::ZERO);
    }
}
