//! History handed to and taken from peers: what a starting peer warms its history from
//! ([`Hub::retained`]), and a peer's history merged into this one's ([`Hub::warm_history`]).

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

use bytes::Bytes;

use super::Hub;
use crate::history::{Entry, Subscribers};

/// One retained message, as [`Hub::retained`] hands it out.
#[derive(Debug, Clone)]
pub struct Retained {
    /// The instance it was posted to.
    pub instance: Arc<str>,
    /// Milliseconds since it was accepted.
    pub age_ms: u64,
    /// The encoded frame.
    pub frame: Bytes,
}

/// A message from elsewhere for [`Hub::warm_history`].
#[derive(Debug, Clone)]
pub struct Warmed {
    /// The instance it was posted to.
    pub instance: String,
    /// The PHIDs it is for.
    pub subscribers: Vec<String>,
    /// The encoded frame.
    pub frame: Bytes,
    /// Milliseconds since it was accepted (where it was).
    pub age_ms: u64,
}

/// What [`Hub::warm_history`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WarmCounts {
    /// Entries added to history (before the history limits applied).
    pub kept: usize,
    /// Entries left out because the history already held the message.
    pub duplicates: usize,
    /// Entries left out because their instance name is too long.
    pub refused: usize,
}

impl Hub {
    /// Every instance's retained messages from the last `age_ms`, oldest first: what a
    /// starting peer warms its history from.
    pub fn retained(&self, age_ms: u64) -> Vec<Retained> {
        let now = self.clock.now_ms();
        let since = now.saturating_sub(age_ms);
        let mut state = self.lock();
        state.history.expire(now);
        state
            .history
            .iter()
            .filter(|entry| entry.at_ms >= since)
            .map(|entry| Retained {
                instance: entry.instance.clone(),
                age_ms: now - entry.at_ms,
                frame: entry.body.clone(),
            })
            .collect()
    }

    /// Adds messages this hub never delivered (a peer's history) to the history, in time
    /// order, leaving out those whose `identity` matches an entry already held or an earlier
    /// one of `entries` (a message that also came by relay is kept once). Nothing is
    /// delivered live; sockets get them by replay. Call it before any replay runs (history
    /// sequence numbers are given anew).
    pub fn warm_history<K: Eq + Hash>(
        &self,
        entries: Vec<Warmed>,
        identity: impl Fn(&Bytes) -> K,
    ) -> WarmCounts {
        let now = self.clock.now_ms();
        let mut counts = WarmCounts::default();
        // Identities are computed outside the lock; only those of the entries held now
        // (the few that arrived during warm-up) are computed under it.
        let keyed: Vec<(K, Warmed)> = entries
            .into_iter()
            .filter(|warmed| {
                let ok = self.instance_name_ok(&warmed.instance);
                counts.refused += usize::from(!ok);
                ok
            })
            .map(|warmed| (identity(&warmed.frame), warmed))
            .collect();
        let mut state = self.lock();
        let mut known: HashSet<K> = state.history.iter().map(|e| identity(&e.body)).collect();
        let mut merged = Vec::with_capacity(keyed.len());
        for (key, warmed) in keyed {
            if !known.insert(key) {
                counts.duplicates += 1;
                continue;
            }
            let instance = state
                .instances
                .get_key_value(warmed.instance.as_str())
                .map_or_else(|| Arc::from(warmed.instance.as_str()), |(k, _)| k.clone());
            merged.push(Entry {
                instance,
                at_ms: now.saturating_sub(warmed.age_ms),
                published: 0,
                subscribers: Subscribers::new(&warmed.subscribers),
                body: warmed.frame,
            });
            counts.kept += 1;
        }
        state.history.merge(merged, now);
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::testing::*;

    #[test]
    fn warmed_history_is_replayed_once_and_merged_by_time() {
        let (mut hub, clock) = hub();
        clock.advance_ms(10_000);
        // Arrived by relay during warm-up.
        publish(&mut hub, "default", &["A"], "u2");
        clock.advance_ms(1);
        let warmed = |body: &'static str, age_ms| Warmed {
            instance: "default".to_owned(),
            subscribers: strings(&["A"]),
            frame: Bytes::from_static(body.as_bytes()),
            age_ms,
        };
        // The peer also holds "u2" (its identity is the body here).
        let counts = hub.warm_history(
            vec![
                warmed("u1", 5_000),
                warmed("u2", 10),
                warmed("u3", 0),
                warmed("u1", 4_000),
            ],
            |frame| frame.clone(),
        );
        assert_eq!(
            counts,
            WarmCounts {
                kept: 2,
                duplicates: 2,
                refused: 0
            }
        );
        let s = subscribed(&hub, &["A"]);
        assert_eq!(hub.replay(&s, 60_000).queued, 3);
        assert_eq!(
            frames(&s),
            [
                Bytes::from_static(b"u1"),
                Bytes::from_static(b"u2"),
                Bytes::from_static(b"u3")
            ]
        );
        let retained: Vec<(u64, Bytes)> = hub
            .retained(60_000)
            .into_iter()
            .map(|r| (r.age_ms, r.frame))
            .collect();
        assert_eq!(
            retained,
            [
                (5_000, Bytes::from_static(b"u1")),
                (1, Bytes::from_static(b"u2")),
                (0, Bytes::from_static(b"u3"))
            ]
        );
        assert_eq!(hub.retained(1_000).len(), 2);
    }
}
