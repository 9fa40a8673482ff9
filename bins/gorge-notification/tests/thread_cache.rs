//! Chunks a long-lived thread freed stay in its allocator cache, where `malloc_trim`
//! cannot hand their pages back, until the thread's cache is taken and given back
//! (`memory::take_thread_cache`, `memory::give_back`): what kept a client worker's arena
//! resident at hundreds of KiB after an attack's sockets had gone (issue 21 item 8).
//! Alone in its test binary: it reads the process's own resident size, which other tests
//! running meanwhile would move.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

mod common;

use gorge_notification::memory;

/// glibc's per-thread cache: 64 sizes of chunk, 7 of each.
const BINS: usize = 64;
const PER_BIN: usize = 7;
/// Rounds of one chunk of each cached size (about 35 KB a round, 35 MB in all): a burst of
/// subscriptions.
const ROUNDS: usize = 1000;

fn anon_kib() -> u64 {
    common::status_kib("self", "RssAnon:")
}

#[test]
fn a_threads_cache_given_back_is_trimmed() {
    let (kept, given_back) = std::thread::spawn(|| {
        let size = |bin: usize| 24 + 16 * bin;
        let mut burst: Vec<Vec<Vec<u8>>> = (0..ROUNDS)
            .map(|_| (0..BINS).map(|bin| Vec::with_capacity(size(bin))).collect())
            .collect();
        // The allocations emptied the thread's cache; it keeps the first 7 chunks of each
        // size freed after that. Those are taken each from a different round, spread over
        // the whole burst, as a closing socket's subscriptions are.
        let mut freed_first = Vec::with_capacity(BINS * PER_BIN);
        for spot in 0..BINS * PER_BIN {
            let (round, bin) = (spot * ROUNDS / (BINS * PER_BIN), spot / PER_BIN);
            freed_first.push(std::mem::take(&mut burst[round][bin]));
        }
        assert_eq!(freed_first.len(), BINS * PER_BIN);
        drop(freed_first);
        drop(burst);
        memory::release_free_memory();
        let before = anon_kib();

        memory::give_back(memory::take_thread_cache());
        memory::release_free_memory();
        let after = anon_kib();
        (before, after)
    })
    .join()
    .unwrap();
    eprintln!("anonymous: {kept} KiB with the cache kept, {given_back} KiB given back");
    // 448 chunks, each alone on its page (or two): 2.1 MiB measured; without taking the
    // cache, nothing (4 KiB).
    assert!(
        kept >= given_back + 1024,
        "{kept} KiB → {given_back} KiB: the cache's pages were not handed back"
    );
}
