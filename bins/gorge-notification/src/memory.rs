//! Giving freed memory back to the system after a burst of subscriptions goes away.
//!
//! Why this exists: glibc's `free` keeps freed chunks in its arenas and returns memory to the
//! kernel only from the top of a heap. Hundreds of anonymous sockets holding 512 KiB of
//! subscriptions each leave, when they close, hundreds of MiB of free chunks interleaved
//! with the few live allocations made meanwhile, so nothing is at the top: measured, RSS
//! stayed at 287 MB of a 320 MB peak after every attacker had gone. `malloc_trim(0)` walks
//! every arena and hands each whole free page back (`MADV_DONTNEED`); the pages are mapped
//! again only if they are used again.
//!
//! Trimming alone leaves the tops of the worker threads' arenas: glibc raises its mmap
//! threshold (and with it the trim threshold, to twice as much) each time a large block it
//! had mmapped is freed, so after the hub's big tables are freed, the arenas keep up to tens
//! of MiB at their top, which `malloc_trim` does not touch outside the main arena (measured:
//! 29.6 MB after, against 17.3 MB idle). [`configure_allocator`] fixes the mmap threshold
//! at glibc's default (128 KiB), which switches that adjustment off: blocks that large are
//! mmapped and unmapped on free, and arena tops are trimmed on free as they shrink. Both
//! together: 18.5 MB after, against 17.6 MB idle.
//!
//! It is not free: it holds each arena's lock while it walks that arena's free chunks (a few
//! ms for a few hundred MiB), so it runs only after a large release, on a blocking thread,
//! and at most once per [`CHECK_EVERY`]: once the hub has released [`RELEASED_BYTES`] of
//! subscriptions or [`RELEASED_SOCKETS`] sockets since the last trim, and the release has
//! settled (nothing more released since the previous check, so the sockets' own buffers are
//! gone too), or it keeps going past four times that. On a platform without glibc it does
//! nothing.

use std::sync::Arc;
use std::time::Duration;

use gorge_hub::Released;

use crate::state::ServerState;

/// How often the hub's release counters are looked at.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Subscription bytes released that make a trim worth its cost (about 64 sockets at the
/// per-socket maximum).
pub const RELEASED_BYTES: u64 = 32 << 20;

/// Sockets gone that make a trim worth its cost (each held its buffers, queue and task).
pub const RELEASED_SOCKETS: u64 = 2_000;

/// Decides when to trim, from the hub's release counters.
#[derive(Debug, Default)]
pub struct TrimPolicy {
    /// The counters at the last trim.
    trimmed_at: Released,
    /// The counters at the previous check.
    previous: Released,
    /// A trim ran while a release was still going on: one more is due once it settles,
    /// whatever its size (else the release's tail would stay).
    tail_due: bool,
}

impl TrimPolicy {
    /// Whether to trim now; a `true` counts from here for the next one.
    pub fn should_trim(&mut self, now: Released) -> bool {
        let pending_bytes = now.subscription_bytes - self.trimmed_at.subscription_bytes;
        let pending_sockets = now.sockets - self.trimmed_at.sockets;
        let settled = now == self.previous;
        self.previous = now;
        let large = pending_bytes >= RELEASED_BYTES || pending_sockets >= RELEASED_SOCKETS;
        let huge = pending_bytes >= 4 * RELEASED_BYTES || pending_sockets >= 4 * RELEASED_SOCKETS;
        let tail = self.tail_due && settled && now != self.trimmed_at;
        if ((large || tail) && settled) || huge {
            self.trimmed_at = now;
            self.tail_due = !settled;
            return true;
        }
        false
    }
}

/// Checks the hub every [`CHECK_EVERY`] and trims after a large release, counting each trim.
pub async fn housekeeping(state: Arc<ServerState>) {
    let mut policy = TrimPolicy::default();
    let mut ticks = tokio::time::interval(CHECK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if policy.should_trim(state.hub.released())
            && tokio::task::spawn_blocking(release_free_memory)
                .await
                .is_ok()
        {
            state.metrics.memory_trims.inc();
        }
    }
}

/// Fixes glibc's mmap threshold at its default (see the module's comment); call once at
/// startup, before the runtime's threads exist. A no-op elsewhere.
pub fn configure_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::fix_mmap_threshold();
}

/// Returns free heap pages to the system (glibc); a no-op elsewhere.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::malloc_trim_all();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
mod glibc {
    use std::ffi::c_int;

    /// `M_MMAP_THRESHOLD` of glibc's `<malloc.h>`.
    const M_MMAP_THRESHOLD: c_int = -3;
    /// glibc's default mmap threshold.
    const MMAP_THRESHOLD_BYTES: c_int = 128 * 1024;

    extern "C" {
        /// glibc: releases free memory from every arena; `pad` bytes are left at the top
        /// of the main heap. Returns 1 if any memory was released.
        fn malloc_trim(pad: usize) -> c_int;
        /// glibc: sets one allocator parameter; returns 1 on success.
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }

    pub fn fix_mmap_threshold() {
        // SAFETY: mallopt takes two integers and only changes the allocator's parameters
        // under its own lock.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        }
    }

    pub fn malloc_trim_all() {
        // SAFETY: malloc_trim takes no pointer and only reorganises the allocator's own
        // free lists under its arena locks; it is safe to call from any thread at any time.
        unsafe {
            malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(subscription_bytes: u64, sockets: u64) -> Released {
        Released {
            subscription_bytes,
            sockets,
        }
    }

    #[test]
    fn trims_once_a_large_release_has_settled() {
        let mut policy = TrimPolicy::default();
        // Small releases: nothing to give back.
        for step in 0..10 {
            assert!(!policy.should_trim(released(step << 20, step)));
            assert!(!policy.should_trim(released(step << 20, step)));
        }
        // The attackers leave over two checks; the trim comes once they are all gone.
        assert!(!policy.should_trim(released(30 << 20, 40)));
        assert!(!policy.should_trim(released(50 << 20, 90)));
        assert!(policy.should_trim(released(50 << 20, 90)));
        assert!(!policy.should_trim(released(50 << 20, 90)));
        // Sockets alone count too.
        assert!(!policy.should_trim(released(50 << 20, 90 + RELEASED_SOCKETS)));
        assert!(policy.should_trim(released(50 << 20, 90 + RELEASED_SOCKETS)));
    }

    #[test]
    fn a_release_that_never_settles_is_trimmed_past_four_times_the_amount() {
        let mut policy = TrimPolicy::default();
        let mut trims = 0;
        for step in 1..=36u64 {
            trims += usize::from(policy.should_trim(released(step * (8 << 20), step)));
        }
        // 288 MiB released in steps of 8 MiB, never settled: a trim per 128 MiB.
        assert_eq!(trims, 2);
    }

    #[test]
    fn the_tail_of_a_long_release_is_trimmed_when_it_settles() {
        let mut policy = TrimPolicy::default();
        // 140 MiB released while still going: a trim.
        assert!(!policy.should_trim(released(100 << 20, 0)));
        assert!(policy.should_trim(released(140 << 20, 0)));
        // 10 more MiB, then nothing more: the tail is trimmed once, though under 32 MiB.
        assert!(!policy.should_trim(released(150 << 20, 0)));
        assert!(policy.should_trim(released(150 << 20, 0)));
        assert!(!policy.should_trim(released(150 << 20, 0)));
        assert!(!policy.should_trim(released(151 << 20, 0)));
        assert!(!policy.should_trim(released(151 << 20, 0)));
    }

    #[test]
    fn the_allocator_calls_are_callable() {
        configure_allocator();
        release_free_memory();
    }
}
