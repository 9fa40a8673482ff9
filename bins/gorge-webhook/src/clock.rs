//! The dispatcher's notion of "now": Unix seconds for the row columns, milliseconds for
//! its own short waits (hook rests, the result-write deadline, progress for readiness).
//!
//! Leases, retry backoff, the breaker window and every local rest are compared against
//! this clock, so tests can move time without sleeping through minutes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current Unix time in whole seconds (the precision of Phorge's columns).
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> u64;

    /// The same clock in milliseconds (for waits shorter than a second).
    fn now_millis(&self) -> u64 {
        self.now().saturating_mul(1000)
    }
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        self.now_millis() / 1000
    }

    fn now_millis(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to; clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    millis: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at `now` Unix seconds.
    pub fn new(now: u64) -> Self {
        Self {
            millis: Arc::new(AtomicU64::new(now * 1000)),
        }
    }

    pub fn set(&self, now: u64) {
        self.millis.store(now * 1000, Ordering::SeqCst);
    }

    pub fn advance(&self, secs: u64) {
        self.millis.fetch_add(secs * 1000, Ordering::SeqCst);
    }

    pub fn advance_millis(&self, millis: u64) {
        self.millis.fetch_add(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        self.now_millis() / 1000
    }

    fn now_millis(&self) -> u64 {
        self.millis.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_time() {
        let clock = ManualClock::new(1_000);
        let other = clock.clone();
        assert_eq!(clock.now(), 1_000);
        other.advance(5);
        assert_eq!(clock.now(), 1_005);
        clock.set(7);
        assert_eq!(other.now(), 7);
        clock.advance_millis(1500);
        assert_eq!((other.now(), other.now_millis()), (8, 8500));
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > 1_577_836_800);
    }
}
