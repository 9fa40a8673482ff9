//! The inbound budget of one browser socket: frames and bytes per second, each a token bucket
//! with a burst. A browser sends a handful of commands per page (subscribe, a replay after a
//! reconnect, the odd ping); a socket that sends more than its budget is not a browser, and
//! is closed with 1008 before its frames cost the server anything more.

use std::time::Duration;

use tokio::time::Instant;

/// The `GORGE_NOTIFICATION_INBOUND_*` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboundLimits {
    pub frames_per_second: u64,
    pub frames_burst: u64,
    pub bytes_per_second: u64,
    pub bytes_burst: u64,
}

/// Which budget a socket went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    Frames,
    Bytes,
}

/// Tokens refilled at `rate` per second up to `burst`; starts full.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
}

impl Bucket {
    fn new(rate: u64, burst: u64) -> Self {
        Bucket {
            rate: rate as f64,
            burst: burst as f64,
            tokens: burst as f64,
        }
    }

    fn refill(&mut self, elapsed: Duration) {
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(self.burst);
    }

    fn take(&mut self, n: u64) -> bool {
        self.tokens -= n as f64;
        self.tokens >= 0.0
    }
}

/// Both buckets of one socket.
#[derive(Debug)]
pub struct Budget {
    frames: Bucket,
    bytes: Bucket,
    last: Instant,
}

impl Budget {
    pub fn new(limits: InboundLimits, now: Instant) -> Self {
        Budget {
            frames: Bucket::new(limits.frames_per_second, limits.frames_burst),
            bytes: Bucket::new(limits.bytes_per_second, limits.bytes_burst),
            last: now,
        }
    }

    /// Charges `frames` frames and `bytes` bytes received by `now`; an error once either
    /// budget is spent (the socket is to be closed, so the buckets are not restored).
    pub fn charge(&mut self, frames: u64, bytes: u64, now: Instant) -> Result<(), Over> {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = now;
        self.frames.refill(elapsed);
        self.bytes.refill(elapsed);
        if !self.bytes.take(bytes) {
            return Err(Over::Bytes);
        }
        if !self.frames.take(frames) {
            return Err(Over::Frames);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: InboundLimits = InboundLimits {
        frames_per_second: 10,
        frames_burst: 20,
        bytes_per_second: 1000,
        bytes_burst: 4000,
    };

    #[test]
    fn the_burst_then_the_rate() {
        let start = Instant::now();
        let mut budget = Budget::new(LIMITS, start);
        for _ in 0..20 {
            assert_eq!(budget.charge(1, 0, start), Ok(()));
        }
        assert_eq!(budget.charge(1, 0, start), Err(Over::Frames));

        let mut budget = Budget::new(LIMITS, start);
        assert_eq!(budget.charge(20, 0, start), Ok(()));
        // A second refills 10 frames, not more.
        let later = start + Duration::from_secs(1);
        assert_eq!(budget.charge(10, 0, later), Ok(()));
        assert_eq!(budget.charge(1, 0, later), Err(Over::Frames));
    }

    #[test]
    fn a_steady_client_under_the_rate_never_runs_out() {
        let start = Instant::now();
        let mut budget = Budget::new(LIMITS, start);
        for i in 1..=1000u64 {
            let now = start + Duration::from_millis(100 * i);
            assert_eq!(budget.charge(1, 100, now), Ok(()), "at {i}");
        }
    }

    #[test]
    fn refill_stops_at_the_burst_and_bytes_count_too() {
        let start = Instant::now();
        let mut budget = Budget::new(LIMITS, start);
        let much_later = start + Duration::from_secs(3600);
        assert_eq!(budget.charge(0, 4000, much_later), Ok(()));
        assert_eq!(budget.charge(0, 1, much_later), Err(Over::Bytes));
    }
}
