//! Time for the hub, injectable so history-age tests never sleep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A monotonic millisecond clock; only differences between readings mean anything. (The
/// webhook's `UnixClock` is a different thing: wall-clock Unix time.)
pub trait MillisClock: Send + Sync {
    /// Milliseconds since an arbitrary start; never goes back.
    fn now_ms(&self) -> u64;
}

/// The real clock: milliseconds since it was created.
#[derive(Debug)]
pub struct MonotonicClock {
    start: Instant,
    /// What the clock read at `start`.
    offset_ms: u64,
}

impl MonotonicClock {
    /// A clock reading 0 now.
    pub fn new() -> Arc<Self> {
        Self::starting_at(0)
    }

    /// A clock reading `ms` now, so that a time up to `ms` in the past (a message loaded
    /// into history at start with its age) is still a reading of this clock.
    pub fn starting_at(ms: u64) -> Arc<Self> {
        Arc::new(MonotonicClock {
            start: Instant::now(),
            offset_ms: ms,
        })
    }
}

impl MillisClock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        elapsed.saturating_add(self.offset_ms)
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug, Default)]
pub struct ManualMillisClock {
    now: AtomicU64,
}

impl ManualMillisClock {
    /// A clock at 0.
    pub fn new() -> Arc<Self> {
        Arc::new(ManualMillisClock::default())
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl MillisClock for ManualMillisClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
