//! Which entries of each other server (origin, by fingerprint) the reader has taken, so that
//! an entry added twice is taken once: a publisher retries a pipeline whose answer was lost,
//! and Redis may have applied it already. A retried pipeline comes again before anything
//! newer from that server, so a copy's sequence number is at most [`BATCH_ENTRIES`] below
//! the highest one seen; the reader remembers exactly which of the last [`WINDOW`] numbers it
//! has taken.
//!
//! A number is never a gate on the others. Before, the highest number seen was the bar every
//! later entry had to pass: one entry `{fingerprint: A, seq: 2^64-1}`, from anything that can
//! write to the stream, made every server drop A's messages until A restarted. Now such an
//! entry is taken once; A's next entry, far below it, starts a new run of numbers for A (as
//! a new epoch would), and an entry a little ahead only marks its own number.
//!
//! [`BATCH_ENTRIES`]: super::publisher::BATCH_ENTRIES

use std::collections::{HashMap, VecDeque};

/// Sequence numbers remembered per origin, below the highest seen: far more than one
/// pipeline's entries (the most a retry can be behind).
const WINDOW: u64 = 4096;

const WORDS: usize = (WINDOW / 64) as usize;

/// Origins whose numbers are remembered; more are forgotten oldest first. Far more than any
/// cluster has servers, restarts included.
const MAX_ORIGINS: usize = 1024;

/// The numbers taken from each origin.
#[derive(Default)]
pub(super) struct Origins {
    seen: HashMap<Vec<u8>, SeqWindow>,
    order: VecDeque<Vec<u8>>,
}

impl Origins {
    /// Whether entry `seq` of `fingerprint` is taken now (not a copy of one taken before).
    pub fn first_time(&mut self, fingerprint: &[u8], seq: u64) -> bool {
        if let Some(window) = self.seen.get_mut(fingerprint) {
            return window.take(seq);
        }
        if self.order.len() >= MAX_ORIGINS {
            if let Some(oldest) = self.order.pop_front() {
                self.seen.remove(&oldest);
            }
        }
        self.order.push_back(fingerprint.to_vec());
        self.seen
            .insert(fingerprint.to_vec(), SeqWindow::starting_at(seq));
        true
    }
}

/// The numbers taken among `(highest - WINDOW, highest]`, one bit each.
struct SeqWindow {
    highest: u64,
    bits: [u64; WORDS],
}

impl SeqWindow {
    fn starting_at(seq: u64) -> SeqWindow {
        let mut window = SeqWindow {
            highest: seq,
            bits: [0; WORDS],
        };
        window.set(seq);
        window
    }

    /// Takes `seq` unless it was taken before.
    fn take(&mut self, seq: u64) -> bool {
        if seq > self.highest {
            // Ahead: the numbers passed over were never seen (or are trimmed); forget them.
            if seq - self.highest >= WINDOW {
                self.bits = [0; WORDS];
            } else {
                for skipped in self.highest + 1..=seq {
                    self.clear(skipped);
                }
            }
            self.highest = seq;
            self.set(seq);
            return true;
        }
        if self.highest - seq >= WINDOW {
            // Far below: not a retry's copy. A new run of numbers (the highest was a stray
            // entry's, or the origin's numbers started again).
            *self = SeqWindow::starting_at(seq);
            return true;
        }
        if self.is_set(seq) {
            return false;
        }
        self.set(seq);
        true
    }

    fn slot(seq: u64) -> (usize, u64) {
        let index = seq % WINDOW;
        ((index / 64) as usize, 1 << (index % 64))
    }

    fn set(&mut self, seq: u64) {
        let (word, bit) = Self::slot(seq);
        self.bits[word] |= bit;
    }

    fn clear(&mut self, seq: u64) {
        let (word, bit) = Self::slot(seq);
        self.bits[word] &= !bit;
    }

    fn is_set(&self, seq: u64) -> bool {
        let (word, bit) = Self::slot(seq);
        self.bits[word] & bit != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_added_twice_is_taken_once() {
        let mut origins = Origins::default();
        assert!(origins.first_time(b"a", 1));
        assert!(origins.first_time(b"b", 1));
        assert!(!origins.first_time(b"a", 1));
        assert!(origins.first_time(b"a", 2));
        assert!(!origins.first_time(b"a", 2));
        // A retried pipeline: 3..=5 again after 5.
        for seq in 3..=5 {
            assert!(origins.first_time(b"a", seq));
        }
        for seq in 3..=5 {
            assert!(!origins.first_time(b"a", seq), "{seq}");
        }
        assert!(origins.first_time(b"a", 6));
    }

    #[test]
    fn a_number_far_ahead_gates_nothing() {
        let mut origins = Origins::default();
        assert!(origins.first_time(b"a", 10));
        // The poison of issue 30: taken once, and A's next entries still are.
        assert!(origins.first_time(b"a", u64::MAX));
        assert!(!origins.first_time(b"a", u64::MAX));
        for seq in 11..20 {
            assert!(origins.first_time(b"a", seq), "{seq}");
        }
        assert!(!origins.first_time(b"a", 15));
        // A little ahead: only its own number is marked.
        assert!(origins.first_time(b"a", 30));
        for seq in 20..30 {
            assert!(origins.first_time(b"a", seq), "{seq}");
        }
        assert!(!origins.first_time(b"a", 30));
        // Far ahead (an outage: the entries between were trimmed), then copies of it.
        assert!(origins.first_time(b"a", 1_000_000));
        assert!(!origins.first_time(b"a", 1_000_000));
        assert!(origins.first_time(b"a", 999_999));
    }
}
