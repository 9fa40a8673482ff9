//! The hub itself: instances, their sockets and subscription index, and the state every other
//! job of the hub reads under one lock.
//!
//! One `std::sync::Mutex` guards the state; it is held only to change it and to list a
//! publish's targets (no I/O, no `.await`, no socket write). Publishing pushes frames into the
//! sockets' queues after the lock is let go, so frames reach each socket in publish order only
//! because there is one publisher: the [`Publisher`] that [`Hub::new`] hands out once, which
//! cannot be cloned and publishes through `&mut self`. Subscriptions are indexed per instance
//! by PHID, so delivering to one PHID among 50 000 sockets touches only the sockets that want
//! it. Replay, which a client can ask for at will, walks history in bounded slices and lets go
//! of the lock between them, and each socket's replays are rate-limited: no client can hold
//! the lock the publish path needs.
//!
//! Instances come in two kinds: *confirmed* ones — any instance the admin port
//! has published to, i.e. one Phorge itself names — and *anonymous* ones, named only by a
//! browser's URL. Each kind has its own table of `Limits::instances` slots, so anonymous
//! sockets on made-up `~names` can fill only the anonymous table and never keep a real
//! instance out. `default` needs no slot: it is always admitted.
//!
//! One job per module: `publish` (the [`Publisher`], planning and delivering a batch),
//! `replay`, `warm` (history handed to and taken from peers), `instances` (the two tables of
//! slots), `status` (counters and gauges) and `limits`; this one holds the state and the
//! sockets' lifecycle.

mod instances;
mod limits;
mod publish;
mod replay;
mod status;
#[cfg(test)]
mod testing;
mod warm;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use crate::clock::MillisClock;
use crate::history::{History, HistoryLimits};
use crate::send_queue::{CloseReason, QueueCaps, SendQueue};
use crate::subscriptions::{shrink_map, subscription_cost};

pub use crate::subscriptions::SocketId;
use instances::{Instance, DEFAULT_INSTANCE};
pub use limits::{ConnectError, InstanceNameTooLong, Limits};
pub use publish::{Publication, PublishCounts, Publisher};
use replay::ReplayBudget;
pub use replay::ReplayCounts;
pub use status::{HubStatus, HubUsage};
pub use warm::{Retained, WarmCounts, Warmed};

/// A joined socket: its id, instance and send queue. Give it back with
/// [`Hub::disconnect`].
#[derive(Debug)]
pub struct SocketHandle {
    id: SocketId,
    instance: Arc<str>,
    send_queue: Arc<SendQueue>,
}

impl SocketHandle {
    /// This socket's id, unique for the life of the hub.
    pub fn id(&self) -> SocketId {
        self.id
    }

    /// The instance the socket joined.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The socket's send queue, which its writer drains.
    pub fn send_queue(&self) -> &Arc<SendQueue> {
        &self.send_queue
    }
}

/// What one subscribe did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubscribeCounts {
    /// PHIDs newly subscribed (already subscribed ones are not counted again).
    pub added: usize,
    /// PHIDs refused by the per-socket limits (count, bytes) or the per-PHID length limit.
    pub ignored: usize,
    /// PHIDs refused because all sockets together hold the total subscription bytes and no
    /// socket could be closed to make room (the total is smaller than one socket's share).
    pub over_total: usize,
    /// Other sockets closed to make room under the total: each held the most at the time.
    pub evicted: usize,
    /// This socket held the most when the total was reached: it is closed (its
    /// subscriptions released) rather than any PHID being dropped silently.
    pub closed: bool,
}

#[derive(Debug)]
struct Socket {
    instance: Arc<str>,
    send_queue: Arc<SendQueue>,
    replays: ReplayBudget,
    /// The publish number when the socket's subscriptions last grew. Every message published
    /// after it that the socket wants now was delivered to it live, so a replay leaves those
    /// out: a browser subscribes on open and replays 100 ms later, and whatever arrived in
    /// between must not come twice on one connection.
    live_from: u64,
}

#[derive(Debug)]
struct State {
    instances: HashMap<Arc<str>, Instance>,
    /// Confirmed instances in `instances` (`default` excluded).
    confirmed_instances: usize,
    sockets: HashMap<SocketId, Socket>,
    subscription_bytes: usize,
    history: History,
    next_id: SocketId,
    /// Sequence number of the last published message.
    published: u64,
}

/// The notification hub, shared as `Arc<Hub>`; publishing is its [`Publisher`]'s.
pub struct Hub {
    state: Mutex<State>,
    limits: Limits,
    clock: Arc<dyn MillisClock>,
    messages_in: AtomicU64,
    messages_out: AtomicU64,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("limits", &self.limits).finish()
    }
}

impl Hub {
    /// A hub enforcing `limits`, reading history age from `clock`, and its one
    /// [`Publisher`].
    pub fn new(limits: Limits, clock: Arc<dyn MillisClock>) -> (Arc<Hub>, Publisher) {
        let history = History::new(HistoryLimits {
            entries: limits.history_entries,
            age_ms: limits.history_age_ms,
            bytes: limits.history_bytes,
        });
        let hub = Arc::new(Hub {
            state: Mutex::new(State {
                instances: HashMap::new(),
                confirmed_instances: 0,
                sockets: HashMap::new(),
                subscription_bytes: 0,
                history,
                next_id: 1,
                published: 0,
            }),
            limits,
            clock,
            messages_in: AtomicU64::new(0),
            messages_out: AtomicU64::new(0),
        });
        (hub.clone(), Publisher::new(hub))
    }

    /// Every bound the hub enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The bounds of every socket's send queue.
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
        let now = self.clock.now_ms();
        let mut state = self.lock();
        if state.sockets.len() >= self.limits.sockets {
            return Err(ConnectError::TooManySockets);
        }
        let key = match state.instances.get_key_value(instance) {
            Some((key, _)) => key.clone(),
            None => {
                if instance != DEFAULT_INSTANCE && !self.make_room(&mut state, false) {
                    return Err(ConnectError::TooManyInstances);
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
        let send_queue = Arc::new(SendQueue::default());
        let live_from = state.published;
        state.sockets.insert(
            id,
            Socket {
                instance: key.clone(),
                send_queue: send_queue.clone(),
                replays: ReplayBudget::new(&self.limits, now),
                live_from,
            },
        );
        Ok(SocketHandle {
            id,
            instance: key,
            send_queue,
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
            let freed = instance.subscriptions.remove_socket(handle.id);
            state.subscription_bytes -= freed;
        }
        // Give the memory of a burst of sockets back once they are gone.
        shrink_map(&mut state.sockets);
    }

    /// Adds PHIDs to a socket's subscriptions, up to the per-socket and per-PHID limits.
    ///
    /// When all sockets together hold the total, the socket holding the most is closed
    /// (its subscriptions released at once) until the PHID fits: a few sockets that filled
    /// the total cannot keep a newcomer's one PHID out. If this socket holds the most, it is
    /// the one closed; no PHID is ever dropped while the socket stays open unaware.
    pub fn subscribe(&self, handle: &SocketHandle, phids: Vec<String>) -> SubscribeCounts {
        let mut outcome = SubscribeCounts::default();
        let mut state = self.lock();
        let mut phids = VecDeque::from(phids);
        while let Some(over) = self.subscribe_some(&mut state, handle, &mut phids, &mut outcome) {
            match Self::close_biggest(&mut state) {
                Some(id) if id == handle.id => {
                    outcome.closed = true;
                    break;
                }
                // Each close releases bytes, so this ends.
                Some(_) => {
                    outcome.evicted += 1;
                    phids.push_front(over);
                }
                None => {
                    outcome.over_total += 1 + phids.len();
                    break;
                }
            }
        }
        if outcome.added > 0 {
            let published = state.published;
            if let Some(socket) = state.sockets.get_mut(&handle.id) {
                socket.live_from = published;
            }
        }
        outcome
    }

    /// Subscribes `phids` in order until one does not fit under the total; returns it.
    fn subscribe_some(
        &self,
        state: &mut State,
        handle: &SocketHandle,
        phids: &mut VecDeque<String>,
        outcome: &mut SubscribeCounts,
    ) -> Option<String> {
        let limits = &self.limits;
        let State {
            sockets,
            instances,
            subscription_bytes,
            ..
        } = state;
        let socket = sockets.get_mut(&handle.id)?;
        // A socket already closing (for instance, closed to make room) takes no more.
        if socket.send_queue.close_reason().is_some() {
            return None;
        }
        let instance = instances.get_mut(&socket.instance)?;
        let index = &mut instance.subscriptions;
        while let Some(phid) = phids.pop_front() {
            if index.contains(handle.id, &phid) {
                continue;
            }
            let cost = subscription_cost(&phid);
            let (count, bytes) = index.usage(handle.id);
            if phid.len() > limits.phid_bytes
                || count >= limits.subscriptions_per_socket
                || bytes + cost > limits.subscription_bytes_per_socket
            {
                outcome.ignored += 1;
                continue;
            }
            if *subscription_bytes + cost > limits.subscription_bytes_total {
                return Some(phid);
            }
            *subscription_bytes += index.insert(handle.id, &socket.send_queue, phid);
            outcome.added += 1;
        }
        None
    }

    /// Closes the socket holding the most subscription bytes and releases them; its id, or
    /// `None` when no socket holds any. A scan of every socket, run only at the total.
    fn close_biggest(state: &mut State) -> Option<SocketId> {
        let (id, _) = state
            .sockets
            .iter()
            .filter_map(|(id, socket)| {
                let instance = state.instances.get(&socket.instance)?;
                let (_, bytes) = instance.subscriptions.usage(*id);
                (bytes > 0).then_some((*id, bytes))
            })
            .max_by_key(|(_, bytes)| *bytes)?;
        let socket = state.sockets.get(&id)?;
        socket.send_queue.close(CloseReason::TooManySubscriptions);
        let instance = state.instances.get_mut(&socket.instance)?;
        let freed = instance.subscriptions.remove_socket(id);
        state.subscription_bytes -= freed;
        Some(id)
    }

    /// Removes PHIDs from a socket's subscriptions.
    pub fn unsubscribe(&self, handle: &SocketHandle, phids: &[String]) {
        let mut state = self.lock();
        let State {
            sockets,
            instances,
            subscription_bytes,
            ..
        } = &mut *state;
        let Some(socket) = sockets.get(&handle.id) else {
            return;
        };
        let Some(instance) = instances.get_mut(&socket.instance) else {
            return;
        };
        for phid in phids {
            *subscription_bytes -= instance.subscriptions.remove(handle.id, phid);
        }
    }

    /// The hub's clock, in ms (a message accepted now and published later keeps this time).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::testing::*;

    #[test]
    fn unsubscribe_stops_delivery() {
        let (mut hub, _) = hub();
        let a = subscribed(&hub, &["PHID-A", "PHID-B"]);
        hub.unsubscribe(&a, &strings(&["PHID-A", "PHID-never"]));
        assert_eq!(publish(&mut hub, "default", &["PHID-A"], "m").queued, 0);
        assert_eq!(publish(&mut hub, "default", &["PHID-B"], "m").queued, 1);
    }

    #[test]
    fn disconnect_removes_subscriptions_and_updates_counters() {
        let (mut hub, _) = hub();
        let a = hub.connect("default").unwrap();
        let b = hub.connect("default").unwrap();
        hub.subscribe(&a, strings(&["PHID-A"]));
        hub.disconnect(&a);
        hub.disconnect(&a);
        assert_eq!(publish(&mut hub, "default", &["PHID-A"], "m").queued, 0);
        let status = hub.status("default");
        assert_eq!((status.clients_active, status.clients_total), (1, 2));
        assert_eq!(hub.open_sockets(), 1);
        hub.disconnect(&b);
        assert_eq!(hub.open_sockets(), 0);
    }

    #[test]
    fn subscription_limits_ignore_and_count() {
        let (mut hub, _) = hub_with(Limits {
            subscriptions_per_socket: 2,
            phid_bytes: 4,
            ..Limits::default()
        });
        let s = hub.connect("default").unwrap();
        let out = hub.subscribe(&s, strings(&["A", "toolong", "A", "B", "C"]));
        assert_eq!(
            out,
            SubscribeCounts {
                added: 2,
                ignored: 2,
                ..SubscribeCounts::default()
            }
        );
        assert_eq!(publish(&mut hub, "default", &["C"], "m").queued, 0);
        assert_eq!(publish(&mut hub, "default", &["B"], "m").queued, 1);
    }

    #[test]
    fn subscription_bytes_are_bounded_per_socket_and_in_total() {
        let per_phid = subscription_cost("P-00");
        let (hub, _) = hub_with(Limits {
            subscription_bytes_per_socket: 3 * per_phid,
            subscription_bytes_total: 5 * per_phid,
            ..Limits::default()
        });
        let a = hub.connect("default").unwrap();
        let b = hub.connect("default").unwrap();
        let phids = |from: usize| (from..from + 4).map(|i| format!("P-{i:02}")).collect();
        assert_eq!(
            hub.subscribe(&a, phids(0)),
            SubscribeCounts {
                added: 3,
                ignored: 1,
                ..SubscribeCounts::default()
            }
        );
        // At the total, `a` holds the most: it is closed and released, `b` is served.
        assert_eq!(
            hub.subscribe(&b, phids(10)),
            SubscribeCounts {
                added: 3,
                ignored: 1,
                evicted: 1,
                ..SubscribeCounts::default()
            }
        );
        assert_eq!(
            a.send_queue().close_reason(),
            Some(CloseReason::TooManySubscriptions)
        );
        assert_eq!(b.send_queue().close_reason(), None);
        assert_eq!(hub.usage().subscription_bytes, 3 * per_phid);
        hub.unsubscribe(&b, &strings(&["P-10", "P-99"]));
        assert_eq!(hub.usage().subscription_bytes, 2 * per_phid);
        hub.disconnect(&a);
        hub.disconnect(&b);
        assert_eq!(hub.usage().subscription_bytes, 0);
    }

    #[test]
    fn a_newcomer_is_not_refused_by_the_sockets_that_filled_the_total() {
        let per_phid = subscription_cost("P-00");
        let (mut hub, _) = hub_with(Limits {
            subscription_bytes_total: 6 * per_phid,
            ..Limits::default()
        });
        let hog = hub.connect("default").unwrap();
        let small = hub.connect("default").unwrap();
        let names = |from: usize, n: usize| (from..from + n).map(|i| format!("P-{i:02}")).collect();
        assert_eq!(hub.subscribe(&hog, names(0, 4)).added, 4);
        assert_eq!(hub.subscribe(&small, names(20, 2)).added, 2);
        let newcomer = hub.connect("default").unwrap();
        let outcome = hub.subscribe(&newcomer, names(40, 1));
        assert_eq!(
            (outcome.added, outcome.evicted, outcome.over_total),
            (1, 1, 0)
        );
        assert_eq!(
            hog.send_queue().close_reason(),
            Some(CloseReason::TooManySubscriptions)
        );
        assert_eq!(small.send_queue().close_reason(), None);
        // The newcomer's message reaches it.
        assert_eq!(publish(&mut hub, "default", &["P-40"], "m").queued, 1);

        // A socket that itself holds the most when the total is reached is the one closed:
        // never left open with PHIDs silently dropped.
        let greedy = hub.connect("default").unwrap();
        assert_eq!(hub.subscribe(&greedy, names(60, 3)).added, 3);
        let outcome = hub.subscribe(&greedy, names(70, 4));
        assert!(outcome.closed, "{outcome:?}");
        assert_eq!(
            greedy.send_queue().close_reason(),
            Some(CloseReason::TooManySubscriptions)
        );
        assert_eq!(hub.usage().subscription_bytes, 3 * per_phid);
    }
}
