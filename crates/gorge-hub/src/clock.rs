//! Time for the hub, injectable so history-age tests never sleep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A monotonic millisecond clock; only differences between readings mean anything.
pub trait MillisClock: Send + Sync {
    fn now_ms(&self) -> u64;
}

/// The real clock: milliseconds since it was created.
#[derive(Debug)]
pub struct MonotonicClock {
    start: Instant,
}

impl MonotonicClock {
    pub fn new() -> Arc<Self> {
        Arc::new(MonotonicClock {
            start: Instant::now(),
        })
    }
}

impl MillisClock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug, Default)]
pub struct ManualMillisClock {
    now: AtomicU64,
}

impl ManualMillisClock {
    pub fn new() -> Arc<Self> {
        Arc::new(ManualMillisClock::default())
    }

    pub fn advance_ms(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl MillisClock for ManualMillisClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
