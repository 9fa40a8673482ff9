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

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
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
pub use status::{HubStatus, HubUsage, Released};
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
    /// Every socket holding subscription bytes, ordered by them: the biggest holder, which
    /// the total closes first, is the last entry (no scan of every socket under the lock).
    holders: BTreeSet<(usize, SocketId)>,
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
    /// Subscription bytes released and sockets gone, since the start (what the binary's
    /// housekeeping reads to hand memory back after a large release).
    released_bytes: AtomicU64,
    released_sockets: AtomicU64,
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
                holders: BTreeSet::new(),
                history,
                next_id: 1,
                published: 0,
            }),
            limits,
            clock,
            messages_in: AtomicU64::new(0),
            messages_out: AtomicU64::new(0),
            released_bytes: AtomicU64::new(0),
            released_sockets: AtomicU64::new(0),
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
        }
        self.release_subscriptions(&mut state, &socket.instance, handle.id);
        self.released_sockets.fetch_add(1, Ordering::Relaxed);
        // Give the memory of a burst of sockets back once they are gone.
        shrink_map(&mut state.sockets);
    }

    fn count_released(&self, bytes: usize) {
        self.released_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Releases every subscription socket `id` holds in `instance`: out of the index, the
    /// total and `holders`, and counted as released. The bytes released, or `None` when
    /// there is no such instance.
    fn release_subscriptions(
        &self,
        state: &mut State,
        instance: &str,
        id: SocketId,
    ) -> Option<usize> {
        let freed = state
            .instances
            .get_mut(instance)?
            .subscriptions
            .remove_socket(id);
        state.subscription_bytes -= freed;
        state.holders.remove(&(freed, id));
        self.count_released(freed);
        Some(freed)
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
            match self.close_biggest(&mut state) {
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
            holders,
            ..
        } = state;
        let socket = sockets.get_mut(&handle.id)?;
        // A socket already closing (for instance, closed to make room) takes no more.
        if socket.send_queue.close_reason().is_some() {
            return None;
        }
        let instance = instances.get_mut(&socket.instance)?;
        let index = &mut instance.subscriptions;
        let (_, held_before) = index.usage(handle.id);
        let mut over = None;
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
                over = Some(phid);
                break;
            }
            *subscription_bytes += index.insert(handle.id, &socket.send_queue, phid);
            outcome.added += 1;
        }
        let (_, held) = index.usage(handle.id);
        move_holder(holders, handle.id, held_before, held);
        over
    }

    /// Closes the socket holding the most subscription bytes and releases them; its id, or
    /// `None` when no socket holds any. Run only at the total; the biggest holder is the
    /// last of `holders`, so this costs a few tree steps however many sockets are open.
    fn close_biggest(&self, state: &mut State) -> Option<SocketId> {
        let (bytes, id) = state.holders.pop_last()?;
        let socket = state.sockets.get(&id)?;
        socket.send_queue.close(CloseReason::TooManySubscriptions);
        let instance = socket.instance.clone();
        let freed = self.release_subscriptions(state, &instance, id)?;
        debug_assert_eq!(freed, bytes, "holders agree with the index");
        Some(id)
    }

    /// Removes PHIDs from a socket's subscriptions.
    pub fn unsubscribe(&self, handle: &SocketHandle, phids: &[String]) {
        let mut state = self.lock();
        let State {
            sockets,
            instances,
            subscription_bytes,
            holders,
            ..
        } = &mut *state;
        let Some(socket) = sockets.get(&handle.id) else {
            return;
        };
        let Some(instance) = instances.get_mut(&socket.instance) else {
            return;
        };
        let (_, held_before) = instance.subscriptions.usage(handle.id);
        for phid in phids {
            *subscription_bytes -= instance.subscriptions.remove(handle.id, phid);
        }
        let (_, held) = instance.subscriptions.usage(handle.id);
        move_holder(holders, handle.id, held_before, held);
        self.count_released(held_before - held);
    }

    /// The hub's clock, in ms (a message accepted now and published later keeps this time).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }
}

/// Moves socket `id` in `holders` from `before` to `after` bytes (0: not a holder).
fn move_holder(
    holders: &mut BTreeSet<(usize, SocketId)>,
    id: SocketId,
    before: usize,
    after: usize,
) {
    if before == after {
        return;
    }
    if before > 0 {
        holders.remove(&(before, id));
    }
    if after > 0 {
        holders.insert((after, id));
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

    /// `holders` as a scan of every socket computes it (what `close_biggest` did before).
    fn scanned_holders(hub: &Hub) -> BTreeSet<(usize, SocketId)> {
        let state = hub.lock();
        state
            .sockets
            .iter()
            .filter_map(|(id, socket)| {
                let (_, bytes) = state.instances[&socket.instance].subscriptions.usage(*id);
                (bytes > 0).then_some((bytes, *id))
            })
            .collect()
    }

    #[test]
    fn the_holders_index_follows_every_change() {
        let per_phid = subscription_cost("P-000");
        let (hub, _) = hub_with(Limits {
            subscription_bytes_per_socket: 6 * per_phid,
            subscription_bytes_total: 40 * per_phid,
            ..Limits::default()
        });
        let mut open: Vec<SocketHandle> = Vec::new();
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        for step in 0..2000 {
            match next() % 5 {
                0 | 1 if open.len() < 30 => open.push(hub.connect("default").unwrap()),
                2 if !open.is_empty() => {
                    let socket = &open[next() % open.len()];
                    let phids = (0..1 + next() % 4).map(|_| format!("P-{:03}", next() % 60));
                    hub.subscribe(socket, phids.collect());
                }
                3 if !open.is_empty() => {
                    let socket = &open[next() % open.len()];
                    hub.unsubscribe(socket, &[format!("P-{:03}", next() % 60)]);
                }
                _ if !open.is_empty() => {
                    let socket = open.swap_remove(next() % open.len());
                    hub.disconnect(&socket);
                }
                _ => {}
            }
            let holders = hub.lock().holders.clone();
            assert_eq!(holders, scanned_holders(&hub), "step {step}");
            let total: usize = holders.iter().map(|(bytes, _)| bytes).sum();
            assert_eq!(total, hub.usage().subscription_bytes, "step {step}");
        }
    }

    /// Time for `newcomers` subscribes that each close the biggest holder, with `bystanders`
    /// other sockets holding one PHID each (the best of three runs).
    fn evictions_took(bystanders: usize, newcomers: usize) -> std::time::Duration {
        let per_phid = subscription_cost("P-00000000");
        let big = 8 * per_phid;
        (0..3)
            .map(|_| {
                let (hub, _) = hub_with(Limits {
                    subscription_bytes_total: bystanders * per_phid + newcomers * big,
                    ..Limits::default()
                });
                let mut keep = Vec::new();
                for i in 0..bystanders {
                    keep.push(subscribed(&hub, &[&format!("P-{i:08}")]));
                }
                let phids = |from: usize| (from..from + 8).map(|i| format!("Q-{i:08}")).collect();
                for i in 0..newcomers {
                    let hog = hub.connect("default").unwrap();
                    assert_eq!(hub.subscribe(&hog, phids(i * 8)).added, 8);
                    keep.push(hog);
                }
                let started = std::time::Instant::now();
                for i in 0..newcomers {
                    let newcomer = hub.connect("default").unwrap();
                    let outcome = hub.subscribe(&newcomer, phids((newcomers + i) * 8));
                    assert_eq!((outcome.added, outcome.evicted), (8, 1));
                    keep.push(newcomer);
                }
                started.elapsed()
            })
            .min()
            .unwrap()
    }

    /// Closing the biggest holder at the total no longer scans every socket under the hub
    /// lock: with 100 times more sockets open, the same evictions take about as long. Before
    /// (a scan per eviction), they took about 100 times longer.
    #[test]
    fn evictions_cost_the_same_however_many_sockets_are_open() {
        let few = evictions_took(200, 200);
        let many = evictions_took(20_000, 200);
        eprintln!("200 evictions: {few:?} among 400 sockets, {many:?} among 20 200");
        assert!(
            many < few * 10 + std::time::Duration::from_millis(5),
            "{many:?} against {few:?}"
        );
    }
}
