//! The retained message log behind `replay` and `history.*`: one log for all instances, read
//! per instance, bounded by entries, age and bytes, oldest dropped first.
//!
//! Expiry runs on every read as well as on every append, so `history.age` never exceeds the
//! age limit (Aphlict only purged on publish).

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

#[derive(Debug)]
pub(crate) struct Entry {
    pub instance: Arc<str>,
    pub at_ms: u64,
    pub subscribers: Box<[Box<str>]>,
    pub body: Bytes,
}

impl Entry {
    fn cost(&self) -> usize {
        self.body.len()
    }
}

#[derive(Debug)]
pub(crate) struct History {
    entries: VecDeque<Entry>,
    bytes: usize,
    limits: HistoryLimits,
}

impl History {
    pub fn new(limits: HistoryLimits) -> Self {
        History {
            entries: VecDeque::new(),
            bytes: 0,
            limits,
        }
    }

    /// Appends `entry` (stamped `now_ms`) and drops the oldest entries beyond any limit.
    pub fn append(&mut self, entry: Entry, now_ms: u64) {
        if self.limits.entries == 0 || entry.cost() > self.limits.bytes {
            self.expire(now_ms);
            return;
        }
        self.bytes += entry.cost();
        self.entries.push_back(entry);
        while self.entries.len() > self.limits.entries || self.bytes > self.limits.bytes {
            self.pop_oldest();
        }
        self.expire(now_ms);
    }

    /// Drops entries older than the age limit.
    pub fn expire(&mut self, now_ms: u64) {
        let oldest_kept = now_ms.saturating_sub(self.limits.age_ms);
        while self.entries.front().is_some_and(|e| e.at_ms < oldest_kept) {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some(e) = self.entries.pop_front() {
            self.bytes -= e.cost();
        }
    }

    /// Entries of `instance` stamped at or after `since_ms`, oldest first (after expiry).
    pub fn since<'a>(
        &'a mut self,
        instance: &'a str,
        since_ms: u64,
        now_ms: u64,
    ) -> impl Iterator<Item = &'a Entry> + 'a {
        self.expire(now_ms);
        self.entries
            .iter()
            .filter(move |e| &*e.instance == instance && e.at_ms >= since_ms)
    }

    /// `(entries, ms since the oldest entry)` of `instance`, after expiry.
    pub fn instance_summary(&mut self, instance: &str, now_ms: u64) -> (u64, Option<u64>) {
        self.expire(now_ms);
        let mut count = 0u64;
        let mut oldest = None;
        for e in self.entries.iter().filter(|e| &*e.instance == instance) {
            count += 1;
            oldest.get_or_insert(e.at_ms);
        }
        (count, oldest.map(|at| now_ms.saturating_sub(at)))
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
            subscribers: Box::new([]),
            body: Bytes::from_static(body),
        }
    }

    fn bodies<'a>(it: impl Iterator<Item = &'a Entry>) -> Vec<&'a [u8]> {
        it.map(|e| &e.body[..]).collect()
    }

    const LIMITS: HistoryLimits = HistoryLimits {
        entries: 3,
        age_ms: 1000,
        bytes: 10,
    };

    #[test]
    fn entry_limit_drops_oldest() {
        let mut h = History::new(LIMITS);
        for (i, b) in [b"a", b"b", b"c", b"d"].into_iter().enumerate() {
            h.append(entry("x", i as u64, b), i as u64);
        }
        assert_eq!(bodies(h.since("x", 0, 4)), [b"b", b"c", b"d"]);
        assert_eq!(h.totals(), (3, 3));
    }

    #[test]
    fn byte_limit_drops_oldest() {
        let mut h = History::new(LIMITS);
        h.append(entry("x", 0, b"123456"), 0);
        h.append(entry("x", 0, b"12345"), 0);
        assert_eq!(bodies(h.since("x", 0, 0)), [b"12345"]);
        assert_eq!(h.totals(), (1, 5));
    }

    #[test]
    fn an_entry_larger_than_the_byte_limit_is_not_kept() {
        let mut h = History::new(LIMITS);
        h.append(entry("x", 0, b"a"), 0);
        h.append(entry("x", 0, b"12345678901"), 0);
        assert_eq!(bodies(h.since("x", 0, 0)), [b"a"]);
    }

    #[test]
    fn age_limit_is_enforced_on_read() {
        let mut h = History::new(LIMITS);
        h.append(entry("x", 0, b"old"), 0);
        h.append(entry("x", 500, b"new"), 500);
        assert_eq!(h.instance_summary("x", 1000), (2, Some(1000)));
        assert_eq!(h.instance_summary("x", 1001), (1, Some(501)));
        assert_eq!(bodies(h.since("x", 0, 1501)), Vec::<&[u8]>::new());
        assert_eq!(h.instance_summary("x", 1501), (0, None));
        assert_eq!(h.totals(), (0, 0));
    }

    #[test]
    fn reads_are_per_instance_and_by_age() {
        let mut h = History::new(LIMITS);
        h.append(entry("a", 10, b"a1"), 10);
        h.append(entry("b", 20, b"b1"), 20);
        h.append(entry("a", 30, b"a2"), 30);
        assert_eq!(bodies(h.since("a", 0, 30)), [b"a1", b"a2"]);
        assert_eq!(bodies(h.since("a", 11, 30)), [b"a2"]);
        assert_eq!(bodies(h.since("b", 0, 30)), [b"b1"]);
        assert_eq!(h.instance_summary("a", 40), (2, Some(30)));
        assert_eq!(h.instance_summary("zzz", 40), (0, None));
    }
}
