//! The hub itself: instances, their sockets and subscription index, publishing, replay and the
//! counters of `/status/`.
//!
//! One `std::sync::Mutex` guards the state; it is held only to compute targets and push into
//! queues (no I/O, no `.await`), which also gives every socket the messages in publish order.
//! Subscriptions are indexed per instance by PHID, so delivering to one PHID among 50 000
//! sockets touches only the sockets that want it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::clock::Clock;
use crate::history::{Entry, History, HistoryLimits};
use crate::outbound::{Outbound, Push, QueueCaps};

/// Every bound the hub enforces.
#[derive(Debug, Clone)]
pub struct Limits {
    pub queue_frames: usize,
    pub queue_bytes: usize,
    pub history_entries: usize,
    pub history_age_ms: u64,
    pub history_bytes: usize,
    pub subscriptions_per_socket: usize,
    pub phid_bytes: usize,
    pub instances: usize,
    pub instance_name_bytes: usize,
    pub sockets: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            queue_frames: 256,
            queue_bytes: 4 << 20,
            history_entries: 4096,
            history_age_ms: 60_000,
            history_bytes: 16 << 20,
            subscriptions_per_socket: 4096,
            phid_bytes: 512,
            instances: 1024,
            instance_name_bytes: 512,
            sockets: 100_000,
        }
    }
}

/// Identifies one socket for the life of the hub.
pub type SocketId = u64;

/// Why a socket could not join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectError {
    TooManySockets,
    TooManyInstances,
    InstanceNameTooLong,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConnectError::TooManySockets => "too many open sockets",
            ConnectError::TooManyInstances => "too many instances",
            ConnectError::InstanceNameTooLong => "instance name too long",
        })
    }
}

impl std::error::Error for ConnectError {}

/// A publish to an instance whose name exceeds the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceNameTooLong;

impl std::fmt::Display for InstanceNameTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("instance name too long")
    }
}

impl std::error::Error for InstanceNameTooLong {}

/// A joined socket: its id, instance and outbound queue. Give it back with
/// [`Hub::disconnect`].
#[derive(Debug)]
pub struct SocketHandle {
    id: SocketId,
    instance: Arc<str>,
    outbound: Arc<Outbound>,
}

impl SocketHandle {
    pub fn id(&self) -> SocketId {
        self.id
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    pub fn outbound(&self) -> &Arc<Outbound> {
        &self.outbound
    }
}

/// What one publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishOutcome {
    /// Frames queued for live delivery.
    pub queued: usize,
    /// Sockets whose queue overflowed on this publish (now closing with 1008).
    pub slow_consumers: usize,
    /// Frames discarded by those overflows.
    pub dropped_frames: usize,
    /// History size after the publish.
    pub history_entries: usize,
    pub history_bytes: usize,
}

/// What one subscribe did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubscribeOutcome {
    pub added: usize,
    /// PHIDs refused by the per-socket or per-PHID limit.
    pub ignored: usize,
}

/// What one replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplayOutcome {
    pub queued: usize,
    /// Matching frames that did not fit in the socket's queue (the oldest are skipped).
    pub dropped_frames: usize,
}

/// An instance's counters for `/status/` (uptime and version are the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubStatus {
    pub clients_active: u64,
    pub clients_total: u64,
    pub messages_in: u64,
    pub messages_out: u64,
    pub history_size: u64,
    pub history_age_ms: Option<u64>,
}

#[derive(Debug, Default)]
struct Instance {
    clients_active: u64,
    clients_total: u64,
    /// PHID → sockets subscribed to it (with their queues, so fan-out needs no second lookup).
    by_phid: HashMap<Arc<str>, HashMap<SocketId, Arc<Outbound>>>,
}

#[derive(Debug)]
struct Socket {
    instance: Arc<str>,
    subscriptions: HashSet<Arc<str>>,
    outbound: Arc<Outbound>,
}

#[derive(Debug)]
struct State {
    instances: HashMap<Arc<str>, Instance>,
    sockets: HashMap<SocketId, Socket>,
    history: History,
    next_id: SocketId,
    /// Sequence number of the last published message.
    published: u64,
}

/// The notification hub. Share it as `Arc<Hub>`.
pub struct Hub {
    state: Mutex<State>,
    limits: Limits,
    clock: Arc<dyn Clock>,
    messages_in: AtomicU64,
    messages_out: AtomicU64,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("limits", &self.limits).finish()
    }
}

impl Hub {
    pub fn new(limits: Limits, clock: Arc<dyn Clock>) -> Self {
        let history = History::new(HistoryLimits {
            entries: limits.history_entries,
            age_ms: limits.history_age_ms,
            bytes: limits.history_bytes,
        });
        Hub {
            state: Mutex::new(State {
                instances: HashMap::new(),
                sockets: HashMap::new(),
                history,
                next_id: 1,
                published: 0,
            }),
            limits,
            clock,
            messages_in: AtomicU64::new(0),
            messages_out: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The bounds of every socket's outbound queue.
    pub fn caps(&self) -> QueueCaps {
        QueueCaps {
            frames: self.limits.queue_frames,
            bytes: self.limits.queue_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("hub lock poisoned")
    }

    /// Whether `name` is acceptable as an instance name.
    pub fn instance_name_ok(&self, name: &str) -> bool {
        name.len() <= self.limits.instance_name_bytes
    }

    /// Registers a new socket of `instance`.
    pub fn connect(&self, instance: &str) -> Result<SocketHandle, ConnectError> {
        if !self.instance_name_ok(instance) {
            return Err(ConnectError::InstanceNameTooLong);
        }
        let mut state = self.lock();
        if state.sockets.len() >= self.limits.sockets {
            return Err(ConnectError::TooManySockets);
        }
        let key = match state.instances.get_key_value(instance) {
            Some((key, _)) => key.clone(),
            None => {
                if state.instances.len() >= self.limits.instances {
                    // Forget an instance nobody is connected to rather than refuse forever
                    // once `limits.instances` distinct names have been seen.
                    let idle = state
                        .instances
                        .iter()
                        .find(|(_, i)| i.clients_active == 0)
                        .map(|(k, _)| k.clone());
                    match idle {
                        Some(idle) => {
                            state.instances.remove(&idle);
                        }
                        None => return Err(ConnectError::TooManyInstances),
                    }
                }
                let key: Arc<str> = Arc::from(instance);
                state.instances.insert(key.clone(), Instance::default());
                key
            }
        };
        let instance = state
            .instances
            .get_mut(&key)
            .expect("instance was just found or inserted");
        instance.clients_active += 1;
        instance.clients_total += 1;
        let id = state.next_id;
        state.next_id += 1;
        let outbound = Arc::new(Outbound::default());
        state.sockets.insert(
            id,
            Socket {
                instance: key.clone(),
                subscriptions: HashSet::new(),
                outbound: outbound.clone(),
            },
        );
        Ok(SocketHandle {
            id,
            instance: key,
            outbound,
        })
    }

    /// Removes a socket and its subscriptions.
    pub fn disconnect(&self, handle: &SocketHandle) {
        let mut state = self.lock();
        let Some(socket) = state.sockets.remove(&handle.id) else {
            return;
        };
        if let Some(instance) = state.instances.get_mut(&socket.instance) {
            instance.clients_active -= 1;
            for phid in &socket.subscriptions {
                remove_from_index(&mut instance.by_phid, phid, handle.id);
            }
        }
    }

    /// Adds PHIDs to a socket's subscriptions, up to the per-socket and per-PHID limits.
    pub fn subscribe(&self, handle: &SocketHandle, phids: Vec<String>) -> SubscribeOutcome {
        let mut outcome = SubscribeOutcome::default();
        let mut state = self.lock();
        let State {
            sockets, instances, ..
        } = &mut *state;
        let Some(socket) = sockets.get_mut(&handle.id) else {
            return outcome;
        };
        let Some(instance) = instances.get_mut(&socket.instance) else {
            return outcome;
        };
        for phid in phids {
            if socket.subscriptions.contains(phid.as_str()) {
                continue;
            }
            if phid.len() > self.limits.phid_bytes
                || socket.subscriptions.len() >= self.limits.subscriptions_per_socket
            {
                outcome.ignored += 1;
                continue;
            }
            // Share one allocation per PHID between the index and the socket's set.
            let phid: Arc<str> = match instance.by_phid.get_key_value(phid.as_str()) {
                Some((key, _)) => key.clone(),
                None => Arc::from(phid),
            };
            instance
                .by_phid
                .entry(phid.clone())
                .or_default()
                .insert(handle.id, socket.outbound.clone());
            socket.subscriptions.insert(phid);
            outcome.added += 1;
        }
        outcome
    }

    /// Removes PHIDs from a socket's subscriptions.
    pub fn unsubscribe(&self, handle: &SocketHandle, phids: &[String]) {
        let mut state = self.lock();
        let State {
            sockets, instances, ..
        } = &mut *state;
        let Some(socket) = sockets.get_mut(&handle.id) else {
            return;
        };
        let Some(instance) = instances.get_mut(&socket.instance) else {
            return;
        };
        for phid in phids {
            if socket.subscriptions.remove(phid.as_str()) {
                remove_from_index(&mut instance.by_phid, phid, handle.id);
            }
        }
    }

    /// Counts one message in `messages.in` (every POST that parsed, duplicates included, as
    /// Aphlict counts). The admin port counts when it accepts, before the fan-out runs.
    pub fn count_message_in(&self) {
        self.messages_in.fetch_add(1, Ordering::Relaxed);
    }

    /// Stores `frame` (an encoded message) in history and delivers the same bytes to every
    /// socket of `instance` subscribed to any of `subscribers`. The lock is held only to
    /// append and to list the targets; delivery happens after it, and never waits on a
    /// socket (an idle socket is written at once, a busy one queues, a full one closes).
    pub fn publish(
        &self,
        instance: &str,
        subscribers: &[String],
        frame: Bytes,
    ) -> Result<PublishOutcome, InstanceNameTooLong> {
        if !self.instance_name_ok(instance) {
            return Err(InstanceNameTooLong);
        }
        let caps = self.caps();
        let now = self.clock.now_ms();
        let mut outcome = PublishOutcome::default();
        let (seq, targets) = {
            let mut state = self.lock();
            state.published += 1;
            let seq = state.published;
            let State {
                instances, history, ..
            } = &mut *state;
            let instance_entry = instances.get_key_value(instance);
            let history_instance = match instance_entry {
                Some((key, _)) => key.clone(),
                None => Arc::from(instance),
            };
            let targets = instance_entry.map_or_else(Vec::new, |(_, target)| {
                targets(&target.by_phid, subscribers)
            });
            history.append(
                Entry {
                    instance: history_instance,
                    at_ms: now,
                    subscribers: subscribers.iter().map(|s| Box::from(s.as_str())).collect(),
                    body: frame.clone(),
                },
                now,
            );
            (outcome.history_entries, outcome.history_bytes) = history.totals();
            (seq, targets)
        };
        for outbound in &targets {
            // Counted before the write so `messages.out` never lags a frame a client holds.
            self.messages_out.fetch_add(1, Ordering::Relaxed);
            match outbound.push(frame.clone(), seq, caps) {
                Push::Written | Push::Queued => {
                    outcome.queued += 1;
                    continue;
                }
                Push::Overflowed { dropped } => {
                    outcome.slow_consumers += 1;
                    outcome.dropped_frames += dropped;
                }
                Push::Closing | Push::Replayed => {}
            }
            self.messages_out.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(outcome)
    }

    /// Queues this socket's instance's retained messages from the last `age_ms`, oldest first,
    /// filtered by the socket's subscriptions. Replay does not count in `messages.out`.
    pub fn replay(&self, handle: &SocketHandle, age_ms: u64) -> ReplayOutcome {
        let caps = self.caps();
        let now = self.clock.now_ms();
        let mut outcome = ReplayOutcome::default();
        let mut state = self.lock();
        let published = state.published;
        let State {
            sockets, history, ..
        } = &mut *state;
        let Some(socket) = sockets.get(&handle.id) else {
            return outcome;
        };
        // Live frames published so far are covered here; any still being delivered skip it.
        socket.outbound.mark_replayed(published);
        let matching: Vec<Bytes> = history
            .since(&socket.instance, now.saturating_sub(age_ms), now)
            .filter(|e| {
                e.subscribers
                    .iter()
                    .any(|p| socket.subscriptions.contains(&**p))
            })
            .map(|e| e.body.clone())
            .collect();
        // Keep the newest that fit; a replay must not make a healthy socket a slow consumer.
        let room = socket.outbound.room(caps);
        let skip = matching.len().saturating_sub(room);
        outcome.dropped_frames = skip;
        for body in matching.into_iter().skip(skip) {
            if socket.outbound.push_if_room(body, caps) {
                outcome.queued += 1;
            } else {
                outcome.dropped_frames += 1;
            }
        }
        outcome
    }

    /// `/status/` counters of `instance`; an unknown instance answers zeros and creates no
    /// state.
    pub fn status(&self, instance: &str) -> HubStatus {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let (clients_active, clients_total) = state
            .instances
            .get(instance)
            .map_or((0, 0), |i| (i.clients_active, i.clients_total));
        let (history_size, history_age_ms) = state.history.instance_summary(instance, now);
        HubStatus {
            clients_active,
            clients_total,
            messages_in: self.messages_in.load(Ordering::Relaxed),
            messages_out: self.messages_out.load(Ordering::Relaxed),
            history_size,
            history_age_ms,
        }
    }

    /// Open sockets, all instances.
    pub fn open_sockets(&self) -> usize {
        self.lock().sockets.len()
    }

    /// `(entries, bytes)` of the history after expiry.
    pub fn history_totals(&self) -> (usize, usize) {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        state.history.expire(now);
        state.history.totals()
    }

    /// The queues of every open socket (drain closes them one by one, outside the lock).
    pub fn outbounds(&self) -> Vec<Arc<Outbound>> {
        self.lock()
            .sockets
            .values()
            .map(|s| s.outbound.clone())
            .collect()
    }
}

/// The queues of the sockets subscribed to any of `subscribers`, each once.
fn targets(
    by_phid: &HashMap<Arc<str>, HashMap<SocketId, Arc<Outbound>>>,
    subscribers: &[String],
) -> Vec<Arc<Outbound>> {
    if let [only] = subscribers {
        return by_phid
            .get(only.as_str())
            .map_or_else(Vec::new, |s| s.values().cloned().collect());
    }
    let mut seen = HashSet::new();
    let mut targets = Vec::new();
    for sockets in subscribers.iter().filter_map(|p| by_phid.get(p.as_str())) {
        for (id, outbound) in sockets {
            if seen.insert(*id) {
                targets.push(outbound.clone());
            }
        }
    }
    targets
}

fn remove_from_index(
    by_phid: &mut HashMap<Arc<str>, HashMap<SocketId, Arc<Outbound>>>,
    phid: &str,
    id: SocketId,
) {
    if let Some(sockets) = by_phid.get_mut(phid) {
        sockets.remove(&id);
        if sockets.is_empty() {
            by_phid.remove(phid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::outbound::CloseReason;

    fn hub_with(limits: Limits) -> (Hub, Arc<ManualClock>) {
        let clock = ManualClock::new();
        (Hub::new(limits, clock.clone()), clock)
    }

    fn hub() -> (Hub, Arc<ManualClock>) {
        hub_with(Limits::default())
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn frames(handle: &SocketHandle) -> Vec<Bytes> {
        handle.outbound().take_frames()
    }

    fn publish(
        hub: &Hub,
        instance: &str,
        subscribers: &[&str],
        body: &'static str,
    ) -> PublishOutcome {
        hub.publish(
            instance,
            &strings(subscribers),
            Bytes::from_static(body.as_bytes()),
        )
        .unwrap()
    }

    #[test]
    fn delivers_to_matching_subscribers_only() {
        let (hub, _) = hub();
        let a = hub.connect("default").unwrap();
        let b = hub.connect("default").unwrap();
        hub.subscribe(&a, strings(&["PHID-A"]));
        hub.subscribe(&b, strings(&["PHID-B"]));
        let out = publish(&hub, "default", &["PHID-A", "PHID-X"], "m1");
        assert_eq!(out.queued, 1);
        assert_eq!(frames(&a), [Bytes::from_static(b"m1")]);
        assert!(frames(&b).is_empty());
    }

    #[test]
    fn a_socket_matching_several_subscribers_gets_one_frame() {
        let (hub, _) = hub();
        let a = hub.connect("default").unwrap();
        hub.subscribe(&a, strings(&["PHID-A", "PHID-B"]));
        assert_eq!(
            publish(&hub, "default", &["PHID-A", "PHID-B", "PHID-A"], "m").queued,
            1
        );
        assert_eq!(frames(&a).len(), 1);
    }

    #[test]
    fn fan_out_shares_one_buffer() {
        let (hub, _) = hub();
        let sockets: Vec<_> = (0..3).map(|_| hub.connect("default").unwrap()).collect();
        for s in &sockets {
            hub.subscribe(s, strings(&["PHID-A"]));
        }
        let body = Bytes::from(b"shared".to_vec());
        let ptr = body.as_ptr();
        hub.publish("default", &strings(&["PHID-A"]), body).unwrap();
        for s in &sockets {
            assert_eq!(frames(s)[0].as_ptr(), ptr);
        }
    }

    #[test]
    fn empty_or_missing_subscribers_reach_nobody() {
        let (hub, _) = hub();
        let a = hub.connect("default").unwrap();
        hub.subscribe(&a, strings(&["PHID-A"]));
        assert_eq!(publish(&hub, "default", &[], "m").queued, 0);
        assert!(frames(&a).is_empty());
    }

    #[test]
    fn unsubscribe_stops_delivery() {
        let (hub, _) = hub();
        let a = hub.connect("default").unwrap();
        hub.subscribe(&a, strings(&["PHID-A", "PHID-B"]));
        hub.unsubscribe(&a, &strings(&["PHID-A", "PHID-never"]));
        assert_eq!(publish(&hub, "default", &["PHID-A"], "m").queued, 0);
        assert_eq!(publish(&hub, "default", &["PHID-B"], "m").queued, 1);
    }

    #[test]
    fn instances_are_isolated() {
        let (hub, _) = hub();
        let a = hub.connect("a").unwrap();
        let b = hub.connect("b").unwrap();
        hub.subscribe(&a, strings(&["PHID-A"]));
        hub.subscribe(&b, strings(&["PHID-A"]));
        publish(&hub, "b", &["PHID-A"], "for-b");
        assert!(frames(&a).is_empty());
        assert_eq!(frames(&b), [Bytes::from_static(b"for-b")]);
        // Replay of a's history never includes b's messages.
        assert_eq!(hub.replay(&a, 60_000).queued, 0);
    }

    #[test]
    fn disconnect_removes_subscriptions_and_updates_counters() {
        let (hub, _) = hub();
        let a = hub.connect("default").unwrap();
        let b = hub.connect("default").unwrap();
        hub.subscribe(&a, strings(&["PHID-A"]));
        hub.disconnect(&a);
        hub.disconnect(&a);
        assert_eq!(publish(&hub, "default", &["PHID-A"], "m").queued, 0);
        let status = hub.status("default");
        assert_eq!((status.clients_active, status.clients_total), (1, 2));
        assert_eq!(hub.open_sockets(), 1);
        hub.disconnect(&b);
        assert_eq!(hub.open_sockets(), 0);
    }

    #[test]
    fn counters_follow_the_spec() {
        let (hub, _) = hub();
        let a = hub.connect("a").unwrap();
        let b = hub.connect("b").unwrap();
        hub.subscribe(&a, strings(&["P"]));
        hub.subscribe(&b, strings(&["P"]));
        publish(&hub, "a", &["P"], "1");
        publish(&hub, "b", &["P"], "2");
        publish(&hub, "b", &["nobody"], "3");
        // The admin port counts what it accepts; publish itself does not.
        for _ in 0..3 {
            hub.count_message_in();
        }
        hub.replay(&a, 60_000);
        let sa = hub.status("a");
        assert_eq!(sa.messages_in, 3);
        // Live frames only, all instances; the replay above does not count.
        assert_eq!(sa.messages_out, 2);
        assert_eq!((sa.clients_active, sa.clients_total), (1, 1));
        assert_eq!(sa.history_size, 1);
        assert_eq!(hub.status("b").history_size, 2);
    }

    #[test]
    fn status_of_unknown_instance_is_zero_and_creates_nothing() {
        let (hub, _) = hub_with(Limits {
            instances: 1,
            ..Limits::default()
        });
        let _a = hub.connect("a").unwrap();
        let s = hub.status("ghost");
        assert_eq!(
            s,
            HubStatus {
                clients_active: 0,
                clients_total: 0,
                messages_in: 0,
                messages_out: 0,
                history_size: 0,
                history_age_ms: None,
            }
        );
        // "ghost" took no instance slot: "a" is still the only one, and it is busy.
        assert_eq!(
            hub.connect("other").unwrap_err(),
            ConnectError::TooManyInstances
        );
    }

    #[test]
    fn history_age_is_null_when_empty_and_expires_on_read() {
        let (hub, clock) = hub();
        assert_eq!(hub.status("default").history_age_ms, None);
        publish(&hub, "default", &["P"], "m");
        clock.advance(250);
        assert_eq!(hub.status("default").history_age_ms, Some(250));
        clock.advance(60_000);
        let s = hub.status("default");
        assert_eq!((s.history_size, s.history_age_ms), (0, None));
    }

    #[test]
    fn replay_by_age_and_subscription_oldest_first() {
        let (hub, clock) = hub();
        publish(&hub, "default", &["A"], "old-a");
        clock.advance(10_000);
        publish(&hub, "default", &["B"], "b");
        publish(&hub, "default", &["A"], "new-a");
        clock.advance(1_000);
        let s = hub.connect("default").unwrap();
        hub.subscribe(&s, strings(&["A"]));
        assert_eq!(hub.replay(&s, 5_000).queued, 1);
        assert_eq!(frames(&s), [Bytes::from_static(b"new-a")]);
        assert_eq!(hub.replay(&s, 60_000).queued, 2);
        assert_eq!(
            frames(&s),
            [Bytes::from_static(b"old-a"), Bytes::from_static(b"new-a")]
        );
    }

    #[test]
    fn replay_never_overflows_the_queue() {
        let (hub, _) = hub_with(Limits {
            queue_frames: 2,
            ..Limits::default()
        });
        for body in ["1", "2", "3"] {
            publish(&hub, "default", &["A"], body);
        }
        let s = hub.connect("default").unwrap();
        hub.subscribe(&s, strings(&["A"]));
        let out = hub.replay(&s, 60_000);
        assert_eq!((out.queued, out.dropped_frames), (2, 1));
        assert_eq!(s.outbound().close_reason(), None);
        assert_eq!(
            frames(&s),
            [Bytes::from_static(b"2"), Bytes::from_static(b"3")]
        );
    }

    #[test]
    fn overflow_marks_only_the_slow_socket() {
        let (hub, _) = hub_with(Limits {
            queue_frames: 2,
            ..Limits::default()
        });
        let slow = hub.connect("default").unwrap();
        let fast = hub.connect("default").unwrap();
        hub.subscribe(&slow, strings(&["A"]));
        hub.subscribe(&fast, strings(&["A"]));
        let mut slow_consumers = 0;
        let mut dropped = 0;
        for _ in 0..5 {
            let out = publish(&hub, "default", &["A"], "m");
            slow_consumers += out.slow_consumers;
            dropped += out.dropped_frames;
            assert!(!frames(&fast).is_empty());
        }
        assert_eq!((slow_consumers, dropped), (1, 3));
        assert!(slow.outbound().take_frames().is_empty());
        assert_eq!(
            slow.outbound().close_reason(),
            Some(CloseReason::SlowConsumer)
        );
    }

    #[test]
    fn subscription_limits_ignore_and_count() {
        let (hub, _) = hub_with(Limits {
            subscriptions_per_socket: 2,
            phid_bytes: 4,
            ..Limits::default()
        });
        let s = hub.connect("default").unwrap();
        let out = hub.subscribe(&s, strings(&["A", "toolong", "A", "B", "C"]));
        assert_eq!(
            out,
            SubscribeOutcome {
                added: 2,
                ignored: 2
            }
        );
        assert_eq!(publish(&hub, "default", &["C"], "m").queued, 0);
        assert_eq!(publish(&hub, "default", &["B"], "m").queued, 1);
    }

    #[test]
    fn socket_and_instance_limits() {
        let (hub, _) = hub_with(Limits {
            sockets: 2,
            instances: 1,
            instance_name_bytes: 3,
            ..Limits::default()
        });
        let a = hub.connect("a").unwrap();
        assert_eq!(
            hub.connect("b").unwrap_err(),
            ConnectError::TooManyInstances
        );
        assert_eq!(
            hub.connect("long").unwrap_err(),
            ConnectError::InstanceNameTooLong
        );
        let _a2 = hub.connect("a").unwrap();
        assert_eq!(hub.connect("a").unwrap_err(), ConnectError::TooManySockets);
        assert_eq!(
            hub.publish("long", &[], Bytes::new()),
            Err(InstanceNameTooLong)
        );
        hub.disconnect(&a);
        hub.disconnect(&_a2);
        // Once "a" is idle it can be forgotten to make room for "b".
        let b = hub.connect("b").unwrap();
        assert_eq!(b.instance(), "b");
        assert_eq!(hub.status("a").clients_total, 0);
    }

    #[test]
    fn outbounds_lists_open_sockets() {
        let (hub, _) = hub();
        let a = hub.connect("a").unwrap();
        let _b = hub.connect("b").unwrap();
        assert_eq!(hub.outbounds().len(), 2);
        hub.disconnect(&a);
        assert_eq!(hub.outbounds().len(), 1);
    }
}
