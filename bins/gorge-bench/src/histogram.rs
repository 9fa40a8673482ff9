//! Lock-free latency histogram shared by many reader tasks.
//!
//! Log-linear buckets (exact below 128 µs, then 64 sub-buckets per power of two, so a
//! reported percentile is at most ~1.6 % above the true value) keep recording to one atomic
//! increment, which matters when 10 000 sockets record a frame each on two cores.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

const LINEAR: u64 = 128;
const SUB_BUCKETS: u64 = 64;
/// Linear part plus one group of sub-buckets per power of two from 2^7 to 2^63.
const BUCKETS: usize = (LINEAR + 57 * SUB_BUCKETS) as usize;

/// Counts of microsecond values.
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    max: AtomicU64,
}

/// Percentiles of one histogram, in milliseconds for reading.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

fn bucket_index(value: u64) -> usize {
    if value < LINEAR {
        return value as usize;
    }
    let top_bit = 63 - value.leading_zeros() as u64; // >= 7
    let shift = top_bit - 6;
    let top = value >> shift; // in [64, 128)
    (LINEAR + (top_bit - 7) * SUB_BUCKETS + (top - SUB_BUCKETS)) as usize
}

/// Largest value that lands in bucket `index` (percentiles round up, never flatter).
fn bucket_upper(index: usize) -> u64 {
    let index = index as u64;
    if index < LINEAR {
        return index;
    }
    let k = index - LINEAR;
    let top_bit = k / SUB_BUCKETS + 7;
    let top = k % SUB_BUCKETS + SUB_BUCKETS;
    let shift = top_bit - 6;
    ((top + 1) << shift).saturating_sub(1)
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    pub fn new() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    pub fn record(&self, micros: u64) {
        self.buckets[bucket_index(micros)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(micros, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Value (µs) at quantile `q` in [0, 1]: the smallest bucket bound that covers
    /// `ceil(q * count)` samples, capped at the exact maximum. 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let count = self.count();
        if count == 0 {
            return 0;
        }
        let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
        let max = self.max.load(Ordering::Relaxed);
        let mut seen = 0;
        for (index, bucket) in self.buckets.iter().enumerate() {
            seen += bucket.load(Ordering::Relaxed);
            if seen >= rank {
                return bucket_upper(index).min(max);
            }
        }
        max
    }

    pub fn percentiles(&self) -> Percentiles {
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            count: self.count(),
            p50_ms: ms(self.quantile(0.50)),
            p99_ms: ms(self.quantile(0.99)),
            max_ms: ms(self.max.load(Ordering::Relaxed)),
        }
    }
}

/// Percentile of an already collected list (µs), same rank rule as [`Histogram::quantile`].
pub fn quantile_of(values: &mut [u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// [`Percentiles`] of a list of microsecond values.
pub fn percentiles_of(values: &mut [u64]) -> Percentiles {
    let p50 = quantile_of(values, 0.50);
    let p99 = quantile_of(values, 0.99);
    Percentiles {
        count: values.len() as u64,
        p50_ms: p50 as f64 / 1000.0,
        p99_ms: p99 as f64 / 1000.0,
        max_ms: values.iter().copied().max().unwrap_or(0) as f64 / 1000.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact() {
        let h = Histogram::new();
        for v in 1..=100 {
            h.record(v);
        }
        assert_eq!(h.quantile(0.50), 50);
        assert_eq!(h.quantile(0.99), 99);
        assert_eq!(h.quantile(1.0), 100);
    }

    #[test]
    fn large_values_round_up_within_two_percent() {
        let h = Histogram::new();
        for v in [1_000u64, 10_000, 123_456, 5_000_000, 77_777_777] {
            let one = Histogram::new();
            one.record(v);
            one.record(u64::MAX / 4);
            let got = one.quantile(0.5);
            assert!(got >= v && got as f64 <= v as f64 * 1.016, "{v} -> {got}");
            h.record(v);
        }
        assert_eq!(h.quantile(1.0), 77_777_777, "the maximum is exact");
    }

    #[test]
    fn bucket_bounds_are_contiguous() {
        for index in LINEAR as usize..BUCKETS - 1 {
            assert_eq!(bucket_index(bucket_upper(index)), index);
            assert_eq!(bucket_index(bucket_upper(index) + 1), index + 1);
        }
    }

    #[test]
    fn empty_histogram_reports_zero() {
        assert_eq!(Histogram::new().quantile(0.99), 0);
        assert_eq!(quantile_of(&mut [], 0.99), 0);
    }

    #[test]
    fn list_quantile_uses_nearest_rank() {
        let mut values: Vec<u64> = (1..=1000).rev().collect();
        assert_eq!(quantile_of(&mut values, 0.99), 990);
        assert_eq!(quantile_of(&mut values, 0.50), 500);
        let p = percentiles_of(&mut values);
        assert_eq!((p.count, p.p99_ms, p.max_ms), (1000, 0.99, 1.0));
    }
}
