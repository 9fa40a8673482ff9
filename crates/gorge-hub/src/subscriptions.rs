//! One instance's subscriptions, indexed both ways: PHID → sockets (what fan-out reads) and
//! socket → PHIDs (what replay, unsubscribe and disconnect read). One type owns both sides,
//! so they cannot drift apart, and it keeps the byte count the subscription limits check.
//!
//! Maps shrink when they empty out: after a burst of subscriptions ends, the memory goes back.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::send_queue::SendQueue;

/// Identifies one socket for the life of the hub.
pub type SocketId = u64;

/// What one subscription is charged, beyond the PHID's own bytes: the shared `Arc<str>`
/// header, the socket's set entry and the PHID index entries (measured hashbrown layouts,
/// rounded up).
pub const SUBSCRIPTION_OVERHEAD_BYTES: usize = 96;

/// The bytes a subscription to `phid` is charged against the limits.
pub fn subscription_cost(phid: &str) -> usize {
    phid.len() + SUBSCRIPTION_OVERHEAD_BYTES
}

#[derive(Debug, Default)]
struct SocketSubscriptions {
    phids: HashSet<Arc<str>>,
    bytes: usize,
}

/// The subscription index of one instance.
#[derive(Debug, Default)]
pub(crate) struct SubscriptionIndex {
    /// PHID → sockets subscribed to it (with their queues, so fan-out needs no second lookup).
    by_phid: HashMap<Arc<str>, HashMap<SocketId, Arc<SendQueue>>>,
    by_socket: HashMap<SocketId, SocketSubscriptions>,
}

impl SubscriptionIndex {
    /// Whether `socket` is subscribed to `phid`.
    pub fn contains(&self, socket: SocketId, phid: &str) -> bool {
        self.by_socket
            .get(&socket)
            .is_some_and(|s| s.phids.contains(phid))
    }

    /// `(subscriptions, charged bytes)` of `socket`.
    pub fn usage(&self, socket: SocketId) -> (usize, usize) {
        self.by_socket
            .get(&socket)
            .map_or((0, 0), |s| (s.phids.len(), s.bytes))
    }

    /// Whether `socket` is subscribed to any of `phids`.
    pub fn wants_any<'a>(
        &self,
        socket: SocketId,
        phids: impl IntoIterator<Item = &'a str>,
    ) -> bool {
        let Some(subscribed) = self.by_socket.get(&socket) else {
            return false;
        };
        phids.into_iter().any(|p| subscribed.phids.contains(p))
    }

    /// Subscribes `socket` to `phid`; returns the bytes charged (0 if it already was).
    pub fn insert(&mut self, socket: SocketId, send_queue: &Arc<SendQueue>, phid: String) -> usize {
        let subscribed = self.by_socket.entry(socket).or_default();
        if subscribed.phids.contains(phid.as_str()) {
            return 0;
        }
        let cost = subscription_cost(&phid);
        // Share one allocation per PHID between the index and every socket's set.
        let phid: Arc<str> = match self.by_phid.get_key_value(phid.as_str()) {
            Some((key, _)) => key.clone(),
            None => Arc::from(phid),
        };
        self.by_phid
            .entry(phid.clone())
            .or_default()
            .insert(socket, send_queue.clone());
        subscribed.phids.insert(phid);
        subscribed.bytes += cost;
        cost
    }

    /// Unsubscribes `socket` from `phid`; returns the bytes released.
    pub fn remove(&mut self, socket: SocketId, phid: &str) -> usize {
        let Some(subscribed) = self.by_socket.get_mut(&socket) else {
            return 0;
        };
        if !subscribed.phids.remove(phid) {
            return 0;
        }
        let cost = subscription_cost(phid);
        subscribed.bytes -= cost;
        if subscribed.phids.is_empty() {
            self.by_socket.remove(&socket);
        } else {
            shrink_set(&mut subscribed.phids);
        }
        self.unindex(socket, phid);
        shrink_map(&mut self.by_socket);
        cost
    }

    /// Drops every subscription of `socket`; returns the bytes released.
    pub fn remove_socket(&mut self, socket: SocketId) -> usize {
        let Some(subscribed) = self.by_socket.remove(&socket) else {
            return 0;
        };
        for phid in &subscribed.phids {
            self.unindex(socket, phid);
        }
        shrink_map(&mut self.by_socket);
        subscribed.bytes
    }

    fn unindex(&mut self, socket: SocketId, phid: &str) {
        if let Some(sockets) = self.by_phid.get_mut(phid) {
            sockets.remove(&socket);
            if sockets.is_empty() {
                self.by_phid.remove(phid);
                shrink_map(&mut self.by_phid);
            } else {
                shrink_map(sockets);
            }
        }
    }

    /// The sockets subscribed to `phid`, with their queues.
    pub fn sockets_for(&self, phid: &str) -> impl Iterator<Item = (SocketId, &Arc<SendQueue>)> {
        self.by_phid
            .get(phid)
            .into_iter()
            .flat_map(|sockets| sockets.iter().map(|(id, send_queue)| (*id, send_queue)))
    }
}

/// Gives memory back once a map is mostly empty (hash maps never shrink on their own).
pub(crate) fn shrink_map<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to_fit();
    }
}

fn shrink_set<K: std::hash::Hash + Eq>(set: &mut HashSet<K>) {
    if set.capacity() > 64 && set.len() < set.capacity() / 4 {
        set.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_queue() -> Arc<SendQueue> {
        Arc::new(SendQueue::default())
    }

    #[test]
    fn both_directions_agree() {
        let mut index = SubscriptionIndex::default();
        let (a, b) = (send_queue(), send_queue());
        assert_eq!(index.insert(1, &a, "P".into()), subscription_cost("P"));
        assert_eq!(index.insert(1, &a, "P".into()), 0);
        index.insert(2, &b, "P".into());
        index.insert(2, &b, "Q".into());
        let mut ids: Vec<_> = index.sockets_for("P").map(|(id, _)| id).collect();
        ids.sort();
        assert_eq!(ids, [1, 2]);
        assert!(index.contains(2, "Q") && !index.contains(1, "Q"));
        assert!(index.wants_any(1, ["X", "P"]));
        assert_eq!(index.usage(2), (2, 2 * subscription_cost("P")));

        assert_eq!(index.remove(2, "P"), subscription_cost("P"));
        assert_eq!(index.remove(2, "P"), 0);
        assert_eq!(index.sockets_for("P").count(), 1);
        assert_eq!(index.remove_socket(2), subscription_cost("Q"));
        assert_eq!(index.sockets_for("Q").count(), 0);
        assert_eq!(index.remove_socket(1), subscription_cost("P"));
        assert!(index.by_phid.is_empty() && index.by_socket.is_empty());
    }

    #[test]
    fn maps_shrink_after_a_burst() {
        let mut index = SubscriptionIndex::default();
        let a = send_queue();
        for i in 0..4096 {
            index.insert(1, &a, format!("PHID-{i}"));
        }
        let peak = index.by_phid.capacity();
        index.remove_socket(1);
        assert!(
            index.by_phid.capacity() < peak / 4,
            "{}",
            index.by_phid.capacity()
        );
    }
}
