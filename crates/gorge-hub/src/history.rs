//! The retained message log behind `replay` and `history.*`: one log for all instances, read
//! per instance, bounded by entries, age and bytes, oldest dropped first.
//!
//! Expiry runs on every read as well as on every append, so `history.age` never exceeds the
//! age limit (Aphlict only purged on publish). The byte limit counts everything an entry
//! keeps — the body, the subscriber list and the entry itself — not just the body: a message
//! of 1 MiB of subscribers used to cost many times its body. Subscriber lists are stored as
//! one string plus offsets, so each PHID costs its bytes and one offset, not an allocation.
//!
//! Entries carry consecutive sequence numbers, so a replay can walk the log in slices,
//! letting go of the hub lock in between, and find its place again in O(1).

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

/// Bounds of the log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HistoryLimits {
    pub entries: usize,
    pub age_ms: u64,
    pub bytes: usize,
}

/// A message's subscriber list, compactly: all PHIDs in one string, and where each ends.
#[derive(Debug, Default)]
pub(crate) struct Subscribers {
    text: Box<str>,
    ends: Box<[usize]>,
}

impl Subscribers {
    pub fn new(phids: &[String]) -> Self {
        let mut text = String::with_capacity(phids.iter().map(String::len).sum());
        let mut ends = Vec::with_capacity(phids.len());
        for phid in phids {
            text.push_str(phid);
            ends.push(text.len());
        }
        Subscribers {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(start, end)| &self.text[start..end])
    }

    fn heap_bytes(&self) -> usize {
        self.text.len() + std::mem::size_of_val(&*self.ends)
    }
}

#[derive(Debug)]
pub(crate) struct Entry {
    pub instance: Arc<str>,
    pub at_ms: u64,
    /// The hub's publish number when it was delivered live here; 0 for an entry that was
    /// never delivered here (warmed from a peer), which only replay hands out.
    pub published: u64,
    pub subscribers: Subscribers,
    pub body: Bytes,
}

impl Entry {
    /// Everything this entry keeps alive: the body, the subscriber list, the entry itself and
    /// the instance name (shared with the instance table, but it outlives an evicted instance).
    pub fn cost(&self) -> usize {
        self.body.len()
            + self.subscribers.heap_bytes()
            + self.instance.len()
            + std::mem::size_of::<Stored>()
    }
}

#[derive(Debug)]
pub(crate) struct Stored {
    pub seq: u64,
    pub entry: Entry,
}

#[derive(Debug)]
pub(crate) struct History {
    entries: VecDeque<Stored>,
    bytes: usize,
    next_seq: u64,
    limits: HistoryLimits,
}

impl History {
    pub fn new(limits: HistoryLimits) -> Self {
        History {
            entries: VecDeque::new(),
            bytes: 0,
            next_seq: 0,
            limits,
        }
    }

    /// Appends `entry` (stamped `now_ms`) and drops the oldest entries beyond any limit.
    pub fn append(&mut self, entry: Entry, now_ms: u64) {
        if self.fits(&entry) {
            self.push(entry);
        }
        self.trim(now_ms);
    }

    /// Whether `entry` can be retained at all under the limits.
    fn fits(&self, entry: &Entry) -> bool {
        self.limits.entries != 0 && entry.cost() <= self.limits.bytes
    }

    /// Stores `entry` as the newest, with the next sequence number.
    fn push(&mut self, entry: Entry) {
        self.bytes += entry.cost();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.push_back(Stored { seq, entry });
    }

    /// Drops the oldest entries beyond the entry and byte limits, then those past the age.
    fn trim(&mut self, now_ms: u64) {
        while self.entries.len() > self.limits.entries || self.bytes > self.limits.bytes {
            self.pop_oldest();
        }
        self.expire(now_ms);
    }

    /// Drops entries older than the age limit.
    pub fn expire(&mut self, now_ms: u64) {
        let oldest_kept = now_ms.saturating_sub(self.limits.age_ms);
        while self
            .entries
            .front()
            .is_some_and(|e| e.entry.at_ms < oldest_kept)
        {
            self.pop_oldest();
        }
        if self.entries.is_empty() && self.entries.capacity() > 64 {
            self.entries = VecDeque::new();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some(e) = self.entries.pop_front() {
            self.bytes -= e.entry.cost();
        }
    }

    /// The sequence number the next appended entry will get: every entry retained now has a
    /// smaller one.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Entries with a sequence number below `end_seq`, newest first (no expiry: call
    /// [`History::expire`] first).
    pub fn newest_before(&self, end_seq: u64) -> impl Iterator<Item = &Stored> {
        let first = self.entries.front().map_or(end_seq, |e| e.seq);
        let len = usize::try_from(end_seq.saturating_sub(first)).unwrap_or(usize::MAX);
        self.entries.range(..len.min(self.entries.len())).rev()
    }

    /// `(entries, ms since the oldest entry)` of `instance`, after expiry.
    pub fn instance_summary(&mut self, instance: &str, now_ms: u64) -> (u64, Option<u64>) {
        self.expire(now_ms);
        let mut count = 0u64;
        let mut oldest = None;
        for e in self
            .entries
            .iter()
            .map(|e| &e.entry)
            .filter(|e| &*e.instance == instance)
        {
            count += 1;
            oldest.get_or_insert(e.at_ms);
        }
        (count, oldest.map(|at| now_ms.saturating_sub(at)))
    }

    /// Merges `older` entries (from elsewhere: a peer's history) into the log, ordered by
    /// time (stable: equal times keep the log's order, merged entries first), then applies
    /// every limit. Sequence numbers are given anew, so no replay may be walking the log
    /// meanwhile (the caller gates replay until the merge is done).
    pub fn merge(&mut self, older: Vec<Entry>, now_ms: u64) {
        let mut all: Vec<Entry> = older;
        all.extend(self.entries.drain(..).map(|stored| stored.entry));
        all.sort_by_key(|entry| entry.at_ms);
        self.bytes = 0;
        for entry in all {
            if self.fits(&entry) {
                self.push(entry);
            }
        }
        self.trim(now_ms);
    }

    /// Every retained entry, oldest first (no expiry: call [`History::expire`] first).
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().map(|stored| &stored.entry)
    }

    /// `(entries, bytes)` of the whole log.
    pub fn totals(&self) -> (usize, usize) {
        (self.entries.len(), self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(instance: &str, at_ms: u64, body: &'static [u8]) -> Entry {
        Entry {
            instance: Arc::from(instance),
            at_ms,
            published: 0,
            subscribers: Subscribers::default(),
            body: Bytes::from_static(body),
        }
    }

    /// What an entry of instance "x" with no subscribers costs beyond its body.
    const FIXED: usize = std::mem::size_of::<Stored>() + 1;

    /// Bodies of `instance` stamped at or after `since_ms`, oldest first, after expiry.
    fn since(h: &mut History, instance: &str, since_ms: u64, now_ms: u64) -> Vec<Vec<u8>> {
        h.expire(now_ms);
        let mut found: Vec<Vec<u8>> = h
            .newest_before(h.next_seq())
            .map(|s| &s.entry)
            .filter(|e| &*e.instance == instance && e.at_ms >= since_ms)
            .map(|e| e.body.to_vec())
            .collect();
        found.reverse();
        found
    }

    /// Room for two small entries (the byte-limit tests).
    const LIMITS: HistoryLimits = HistoryLimits {
        entries: 3,
        age_ms: 1000,
        bytes: 10 + 2 * FIXED,
    };

    /// The entry and age limits alone.
    const ROOMY: HistoryLimits = HistoryLimits {
        bytes: 1 << 20,
        ..LIMITS
    };

    #[test]
    fn entry_limit_drops_oldest() {
        let mut h = History::new(ROOMY);
        for (i, b) in [b"a", b"b", b"c", b"d"].into_iter().enumerate() {
            h.append(entry("x", i as u64, b), i as u64);
        }
        assert_eq!(since(&mut h, "x", 0, 4), [b"b", b"c", b"d"]);
        assert_eq!(h.totals(), (3, 3 + 3 * FIXED));
    }

    #[test]
    fn byte_limit_drops_oldest() {
        let mut h = History::new(LIMITS);
        h.append(entry("x", 0, b"123456"), 0);
        h.append(entry("x", 0, b"12345"), 0);
        assert_eq!(since(&mut h, "x", 0, 0), [b"12345"]);
        assert_eq!(h.totals(), (1, 5 + FIXED));
    }

    #[test]
    fn an_entry_larger_than_the_byte_limit_is_not_kept() {
        let mut h = History::new(LIMITS);
        h.append(entry("x", 0, b"a"), 0);
        h.append(entry("x", 0, &[b'x'; 11 + FIXED]), 0);
        assert_eq!(since(&mut h, "x", 0, 0), [b"a"]);
    }

    #[test]
    fn age_limit_is_enforced_on_read() {
        let mut h = History::new(ROOMY);
        h.append(entry("x", 0, b"old"), 0);
        h.append(entry("x", 500, b"new"), 500);
        assert_eq!(h.instance_summary("x", 1000), (2, Some(1000)));
        assert_eq!(h.instance_summary("x", 1001), (1, Some(501)));
        assert_eq!(since(&mut h, "x", 0, 1501), Vec::<Vec<u8>>::new());
        assert_eq!(h.instance_summary("x", 1501), (0, None));
        assert_eq!(h.totals(), (0, 0));
    }

    #[test]
    fn reads_are_per_instance_and_by_age() {
        let mut h = History::new(ROOMY);
        h.append(entry("a", 10, b"a1"), 10);
        h.append(entry("b", 20, b"b1"), 20);
        h.append(entry("a", 30, b"a2"), 30);
        assert_eq!(since(&mut h, "a", 0, 30), [b"a1", b"a2"]);
        assert_eq!(since(&mut h, "a", 11, 30), [b"a2"]);
        assert_eq!(since(&mut h, "b", 0, 30), [b"b1"]);
        assert_eq!(h.instance_summary("a", 40), (2, Some(30)));
        assert_eq!(h.instance_summary("zzz", 40), (0, None));
    }

    #[test]
    fn the_byte_limit_counts_subscriber_lists() {
        let phids: Vec<String> = (0..1000).map(|i| format!("PHID-USER-{i:010}")).collect();
        let list = Subscribers::new(&phids);
        assert_eq!(list.len(), 1000);
        assert!(list.iter().eq(phids.iter().map(String::as_str)));
        let e = Entry {
            instance: Arc::from("x"),
            at_ms: 0,
            published: 0,
            subscribers: list,
            body: Bytes::from_static(b"{}"),
        };
        // 20 bytes of text and one 8-byte offset per PHID, on top of the body.
        assert_eq!(e.cost(), 2 + 1000 * (20 + 8) + FIXED);
        let mut h = History::new(HistoryLimits {
            entries: 10,
            age_ms: 1000,
            bytes: 2 * e.cost(),
        });
        let small = || Entry {
            instance: Arc::from("x"),
            at_ms: 0,
            published: 0,
            subscribers: Subscribers::new(&phids),
            body: Bytes::from_static(b"{}"),
        };
        for _ in 0..3 {
            h.append(small(), 0);
        }
        // Bodies alone (2 bytes each) would have kept all three.
        assert_eq!(h.totals(), (2, 2 * e.cost()));
    }

    #[test]
    fn merged_entries_take_their_place_by_time_and_the_limits_apply() {
        let mut h = History::new(ROOMY);
        h.append(entry("x", 20, b"live"), 20);
        h.merge(
            vec![
                entry("x", 5, b"w1"),
                entry("x", 25, b"w3"),
                entry("x", 10, b"w2"),
            ],
            30,
        );
        // Four by time; the entry limit (3) dropped the oldest.
        assert_eq!(since(&mut h, "x", 0, 30), [&b"w2"[..], b"live", b"w3"]);
        assert_eq!(h.newest_before(h.next_seq()).count(), 3);
        // Expired on the way in.
        h.merge(vec![entry("x", 0, b"ancient")], 1015);
        assert_eq!(since(&mut h, "x", 0, 1015), [&b"live"[..], b"w3"]);
    }

    #[test]
    fn newest_before_finds_its_place_after_eviction() {
        let mut h = History::new(ROOMY);
        for (i, b) in [b"a", b"b", b"c", b"d", b"e"].into_iter().enumerate() {
            h.append(entry("x", i as u64, b), i as u64);
        }
        // "a" and "b" (seq 0 and 1) are gone; seq 3 is "d".
        let bodies = |end| -> Vec<Vec<u8>> {
            h.newest_before(end)
                .map(|s| s.entry.body.to_vec())
                .collect()
        };
        assert_eq!(bodies(3), [b"c"]);
        assert_eq!(bodies(5), [b"e", b"d", b"c"]);
        assert_eq!(bodies(1), Vec::<Vec<u8>>::new());
        assert_eq!(bodies(99), [b"e", b"d", b"c"]);
    }
}
