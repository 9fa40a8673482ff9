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
//! Both still left the anonymous memory at three times idle (4.4 MiB against 1.5 MiB after
//! 600 sockets of 4 096 PHIDs had gone), and not in arena tops: glibc's arenas were 99 %
//! free (170 KB in use each of 166 MB), yet 560 KiB of each client worker's arena stayed
//! resident. Those in-use chunks were the workers' own per-thread caches (`tcache`): each
//! thread keeps up to 7 chunks it freed of each of 64 small sizes (32 to 1 040 bytes) to
//! hand out again before its arena's, and after a release those are chunks of the attack,
//! scattered over the whole arena, each keeping its page resident (448 chunks: 1.75 MiB or
//! more per thread); `malloc_trim` cannot touch them because to the arena they are in use
//! (measured: with `GLIBC_TUNABLES=glibc.malloc.tcache_count=0` the same run ended at
//! 1.7 MiB anonymous). glibc has no call that empties a thread's cache, but a thread's
//! `malloc` takes from its cache first and a thread that exits gives its cache back, so
//! before trimming, each client worker allocates as many chunks of each cached size as the
//! cache holds ([`take_worker_caches`]), and a short-lived thread frees them and exits: the
//! scattered chunks go back to their arenas, where the trim finds them free. Measured
//! (`gorge-bench hogs`, 600 sockets): RSS 7.2–7.5 MiB idle, 8.1–8.6 MiB after (before:
//! 10.6–11.0), anonymous 1.5 → 1.7–1.9 MiB (before: 4.4–4.5).
//!
//! It is not free: it holds each arena's lock while it walks that arena's free chunks (a few
//! ms for a few hundred MiB), so it runs only after a large release, on a blocking thread,
//! and at most once per [`CHECK_EVERY`]: once the hub has released [`RELEASED_BYTES`] of
//! subscriptions or [`RELEASED_SOCKETS`] sockets since the last trim, and the release has
//! settled (nothing more released since the previous check, so the sockets' own buffers are
//! gone too), or it keeps going past four times that; emptying the workers' caches holds
//! each client worker for well under a millisecond (at most [`CACHE_ROUND_WAIT`] if another
//! worker is slow to take its turn). On a platform without glibc it does nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gorge_hub::Released;
use tokio::runtime::Handle;

use crate::state::ServerState;

/// How often the hub's release counters are looked at.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Subscription bytes released that make a trim worth its cost (about 64 sockets at the
/// per-socket maximum).
pub const RELEASED_BYTES: u64 = 32 << 20;

/// Sockets gone that make a trim worth its cost (each held its buffers, queue and task).
pub const RELEASED_SOCKETS: u64 = 2_000;

/// Connections ended (of either port, upgraded to a socket or not) that make a trim worth
/// its cost. Each held hyper's buffers and its task, freed on the worker that ran it;
/// connections that never become a socket (a burst of half-open handshakes, admin requests
/// that never finish) leave nothing in the hub's counters, and measured, 450 of them left
/// the server 30–70 % above its idle RSS until a trim.
pub const ENDED_CONNECTIONS: u64 = 256;

/// What the housekeeping looks at: the hub's release counters and the connections ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Freed {
    pub hub: Released,
    pub connections: u64,
}

/// Decides when to trim, from the hub's release counters and the connections ended.
#[derive(Debug, Default)]
pub struct TrimPolicy {
    /// The counters at the last trim.
    trimmed_at: Freed,
    /// The counters at the previous check.
    previous: Freed,
    /// A trim ran while a release was still going on: one more is due once it settles,
    /// whatever its size (else the release's tail would stay).
    tail_due: bool,
}

impl TrimPolicy {
    /// Whether to trim now; a `true` counts from here for the next one.
    pub fn should_trim(&mut self, now: Freed) -> bool {
        let hub = now.hub;
        let pending_bytes = hub.subscription_bytes - self.trimmed_at.hub.subscription_bytes;
        let pending_sockets = hub.sockets - self.trimmed_at.hub.sockets;
        let settled = hub == self.previous.hub;
        // Connections end all the time (every PHP POST, every scrape is one), so they never
        // "settle": a burst of them is over once the last check saw less than a quarter of
        // what ended since the last trim. A steady stream (no burst) also trims, about every
        // four checks' worth of its connections and never more often than every
        // [`ENDED_CONNECTIONS`]: well under a millisecond each on a process of this size.
        let pending_connections = now.connections - self.trimmed_at.connections;
        let connections_quiet =
            (now.connections - self.previous.connections) * 4 < pending_connections;
        self.previous = now;
        let past = |times: u64| {
            pending_bytes >= times * RELEASED_BYTES || pending_sockets >= times * RELEASED_SOCKETS
        };
        let tail = self.tail_due && hub != self.trimmed_at.hub;
        let connections = pending_connections >= ENDED_CONNECTIONS && connections_quiet;
        if ((past(1) || tail) && settled) || past(4) || connections {
            self.trimmed_at = now;
            self.tail_due = !settled;
            return true;
        }
        false
    }
}

/// How long a client worker that has given its cache waits for the others to give theirs
/// (so that it does not take another worker's turn); past it, the trim goes ahead with what
/// it has.
pub const CACHE_ROUND_WAIT: Duration = Duration::from_millis(100);

/// Checks the hub every [`CHECK_EVERY`] and trims after a large release, counting each trim.
/// `client_runtime` runs the sockets, whose workers freed the release (see the module's
/// comment); `ended_connections` counts the connections of every listener that ended.
pub async fn housekeeping(
    state: Arc<ServerState>,
    client_runtime: Handle,
    ended_connections: Arc<AtomicU64>,
) {
    let mut policy = TrimPolicy::default();
    let mut ticks = tokio::time::interval(CHECK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let now = Freed {
            hub: state.hub.released(),
            connections: ended_connections.load(Ordering::Relaxed),
        };
        if !policy.should_trim(now) {
            continue;
        }
        let cached = take_worker_caches(&client_runtime).await;
        if tokio::task::spawn_blocking(move || {
            give_back(cached);
            release_free_memory();
        })
        .await
        .is_ok()
        {
            state.metrics.memory_trims.inc();
        }
    }
}

/// Chunks taken out of threads' allocator caches (addresses, so they can cross threads), to
/// be handed back with [`give_back`].
#[derive(Debug, Default)]
pub struct CachedChunks(Vec<usize>);

impl CachedChunks {
    /// How many chunks were taken.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none were (always, without glibc).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Takes every chunk the calling thread's allocator cache holds (see the module's comment).
/// Give them back with [`give_back`], on any thread.
pub fn take_thread_cache() -> CachedChunks {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    return CachedChunks(glibc::take_thread_cache());
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    CachedChunks::default()
}

/// Frees `chunks` on a thread that then exits, so that they end up free in their arenas
/// rather than in a long-lived thread's cache; returns once it has exited.
pub fn give_back(chunks: CachedChunks) {
    if chunks.is_empty() {
        return;
    }
    let freeing = std::thread::Builder::new()
        .name("gorge-trim".into())
        .spawn(move || {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            glibc::free_all(chunks.0);
        });
    if let Ok(thread) = freeing {
        let _ = thread.join();
    }
}

/// Takes the allocator cache of each of `runtime`'s workers: one task per worker, each
/// taking the cache of the worker it runs on and then waiting (at most
/// [`CACHE_ROUND_WAIT`]) until every worker has given its own, so that no worker runs two of
/// them while another runs none.
pub async fn take_worker_caches(runtime: &Handle) -> CachedChunks {
    let round = Arc::new(CacheRound {
        workers: runtime.metrics().num_workers(),
        taken: std::sync::Mutex::default(),
        all_taken: std::sync::Condvar::new(),
    });
    let turns: Vec<_> = (0..round.workers)
        .map(|_| {
            let round = round.clone();
            runtime.spawn(async move { round.take_here() })
        })
        .collect();
    for turn in turns {
        let _ = turn.await;
    }
    let mut taken = round.taken.lock().unwrap_or_else(|e| e.into_inner());
    CachedChunks(std::mem::take(&mut taken.chunks))
}

/// One [`take_worker_caches`].
struct CacheRound {
    workers: usize,
    taken: std::sync::Mutex<Taken>,
    all_taken: std::sync::Condvar,
}

/// What a [`CacheRound`] has taken so far.
#[derive(Default)]
struct Taken {
    /// The threads that gave their cache.
    threads: Vec<std::thread::ThreadId>,
    /// The chunks they gave.
    chunks: Vec<usize>,
}

impl CacheRound {
    fn take_here(&self) {
        let me = std::thread::current().id();
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        if !taken.threads.contains(&me) {
            taken.threads.push(me);
            taken.chunks.extend(take_thread_cache().0);
            self.all_taken.notify_all();
        }
        // Blocks this worker briefly, on purpose: free, it could run another worker's turn.
        let _ = self
            .all_taken
            .wait_timeout_while(taken, CACHE_ROUND_WAIT, |taken| {
                taken.threads.len() < self.workers
            });
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
    use std::ffi::{c_int, c_void};

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
        fn malloc(size: usize) -> *mut c_void;
        fn free(ptr: *mut c_void);
    }

    /// glibc's per-thread cache (`tcache`) defaults: 64 sizes of chunk, 32 to 1 040 bytes
    /// (requests of up to 1 032), 7 chunks of each.
    const TCACHE_BINS: usize = 64;
    const TCACHE_COUNT: usize = 7;

    /// `malloc` serves a size from the thread's cache while it has chunks of that size, so
    /// as many requests of each cached size as the cache holds empty it; the rest of the
    /// chunks come from the arena and go back to it with the others.
    pub fn take_thread_cache() -> Vec<usize> {
        // Larger than any cached size: allocating it takes nothing out of the cache.
        let mut chunks = Vec::with_capacity(TCACHE_BINS * TCACHE_COUNT);
        for bin in 0..TCACHE_BINS {
            // The request whose chunk is bin's size (32 + 16 × bin bytes with its header).
            let size = 24 + 16 * bin;
            for _ in 0..TCACHE_COUNT {
                // SAFETY: a plain allocation, freed only by `free_all`.
                let chunk = unsafe { malloc(size) };
                if !chunk.is_null() {
                    chunks.push(chunk as usize);
                }
            }
        }
        chunks
    }

    pub fn free_all(chunks: Vec<usize>) {
        for chunk in chunks {
            // SAFETY: each came from `malloc` in `take_thread_cache` and is freed once.
            unsafe { free(chunk as *mut c_void) };
        }
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

    fn released(subscription_bytes: u64, sockets: u64) -> Freed {
        Freed {
            hub: Released {
                subscription_bytes,
                sockets,
            },
            connections: 0,
        }
    }

    #[test]
    fn ended_connections_alone_trim_once_settled() {
        let mut policy = TrimPolicy::default();
        let ended = |connections| Freed {
            connections,
            ..Freed::default()
        };
        assert!(!policy.should_trim(ended(ENDED_CONNECTIONS - 1)));
        assert!(!policy.should_trim(ended(ENDED_CONNECTIONS - 1)));
        // A burst still ending: not yet.
        assert!(!policy.should_trim(ended(ENDED_CONNECTIONS + 200)));
        // Over (a few more, as PHP posts): trimmed once.
        assert!(policy.should_trim(ended(ENDED_CONNECTIONS + 210)));
        assert!(!policy.should_trim(ended(ENDED_CONNECTIONS + 220)));
        // A steady stream of 100 posts per check trims every 400 of them at most.
        let mut trims = 0;
        for step in 1..=100 {
            trims += usize::from(policy.should_trim(ended(ENDED_CONNECTIONS + 220 + step * 100)));
        }
        assert!((15..=25).contains(&trims), "{trims} trims");
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

    /// What a thread freed last stays in its cache, in use as far as its arena (and
    /// `malloc_trim`) knows, until the thread takes it back out: taking the cache returns
    /// exactly those chunks, so that they can be freed where they reach the arena.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn taking_a_threads_cache_takes_what_it_freed_last() {
        std::thread::spawn(|| {
            // Whatever the thread's start left in its cache, then 7 chunks freed last.
            let before = take_thread_cache();
            let freed: Vec<Box<[u8; 40]>> = (0..7).map(|_| Box::new([1; 40])).collect();
            let addresses: Vec<usize> = freed.iter().map(|b| &**b as *const _ as usize).collect();
            drop(freed);
            let taken = take_thread_cache();
            for address in &addresses {
                assert!(
                    taken.0.contains(address),
                    "{address:x} was left in the cache"
                );
            }
            assert_eq!(taken.len(), 64 * 7);
            give_back(before);
            give_back(taken);
        })
        .join()
        .unwrap();
    }

    /// Every worker of the client runtime gives its cache once, however the tasks are
    /// scheduled.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[tokio::test]
    async fn every_worker_gives_its_cache() {
        let workers = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        for _ in 0..5 {
            let taken = take_worker_caches(workers.handle()).await;
            assert_eq!(taken.len(), 2 * 64 * 7);
            give_back(taken);
        }
        workers.shutdown_background();
    }

    #[test]
    fn the_allocator_calls_are_callable() {
        configure_allocator();
        release_free_memory();
    }
}
