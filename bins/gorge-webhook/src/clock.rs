//! The dispatcher's notion of "now": Unix seconds for the row columns, milliseconds for
//! its own short waits (hook rests, the result-write deadline, progress for readiness).
//!
//! Leases, retry backoff, the breaker window and every local rest are compared against
//! this clock, so tests can move time without sleeping through minutes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current Unix time. Unlike gorge-hub's `MillisClock` (milliseconds since
/// an arbitrary start), readings here are wall-clock times comparable with the row columns.
pub trait UnixClock: Send + Sync + 'static {
    /// Unix time in milliseconds (for waits shorter than a second).
    fn now_ms(&self) -> u64;

    /// The same clock in whole seconds (the precision of Phorge's `dateModified` and
    /// `lastRequestEpoch`).
    fn now_sec(&self) -> u64 {
        self.now_ms() / 1000
    }
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl UnixClock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to; clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualUnixClock {
    millis: Arc<AtomicU64>,
}

impl ManualUnixClock {
    /// A clock at `now_sec` Unix seconds.
    pub fn new(now_sec: u64) -> Self {
        Self {
            millis: Arc::new(AtomicU64::new(now_sec * 1000)),
        }
    }

    /// Jumps (forward or back) to `now_sec` Unix seconds, for every clone.
    pub fn set_sec(&self, now_sec: u64) {
        self.millis.store(now_sec * 1000, Ordering::SeqCst);
    }

    /// Moves forward by whole seconds.
    pub fn advance_sec(&self, secs: u64) {
        self.millis.fetch_add(secs * 1000, Ordering::SeqCst);
    }

    /// Moves forward by milliseconds (to cross a local rest without crossing a second).
    pub fn advance_ms(&self, ms: u64) {
        self.millis.fetch_add(ms, Ordering::SeqCst);
    }
}

impl UnixClock for ManualUnixClock {
    fn now_ms(&self) -> u64 {
        self.millis.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_time() {
        let clock = ManualUnixClock::new(1_000);
        let other = clock.clone();
        assert_eq!(clock.now_sec(), 1_000);
        other.advance_sec(5);
        assert_eq!(clock.now_sec(), 1_005);
        clock.set_sec(7);
        assert_eq!(other.now_sec(), 7);
        clock.advance_ms(1500);
        assert_eq!((other.now_sec(), other.now_ms()), (8, 8500));
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_sec() > 1_577_836_800);
    }
}
