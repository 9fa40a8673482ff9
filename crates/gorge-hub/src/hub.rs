//! The hub itself: instances, their sockets and subscription index, publishing, replay and the
//! counters of `/status/`.
//!
//! One `std::sync::Mutex` guards the state; it is held only to compute targets and push into
//! queues (no I/O, no `.await`), which also gives every socket the messages in publish order.
//! Subscriptions are indexed per instance by PHID, so delivering to one PHID among 50 000
//! sockets touches only the sockets that want it. Replay, which a client can ask for at will,
//! walks history in bounded slices and lets go of the lock between them, and each socket's
//! replays are rate-limited: no client can hold the lock the publish path needs.
//!
//! Instances come in two kinds: *confirmed* ones — any instance the admin port
//! has published to, i.e. one Phorge itself names — and *anonymous* ones, named only by a
//! browser's URL. Each kind has its own table of `Limits::instances` slots, so anonymous
//! sockets on made-up `~names` can fill only the anonymous table and never keep a real
//! instance out. `default` needs no slot: it is always admitted.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::clock::MillisClock;
use crate::history::{Entry, History, HistoryLimits, Subscribers};
use crate::outbound::{Outbound, Push, QueueCaps};
use crate::subscriptions::{shrink_map, subscription_cost, SubscriptionIndex};

pub use crate::subscriptions::SocketId;

/// History entries (or, for entries with many subscribers, PHID lookups) one replay slice may
/// examine before it lets go of the hub lock.
const REPLAY_SLICE_WORK: usize = 256;

/// Every bound the hub enforces.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Frames one socket's outbound queue may hold before the socket is closed as a slow
    /// consumer.
    pub queue_frames: usize,
    /// Bytes one socket's outbound queue may hold, likewise.
    pub queue_bytes: usize,
    /// History entries kept for replay, all instances together (the oldest go first).
    pub history_entries: usize,
    /// Entries older than this are dropped from history.
    pub history_age_ms: u64,
    /// Bytes of history kept, all instances together.
    pub history_bytes: usize,
    /// PHIDs one socket may subscribe to.
    pub subscriptions_per_socket: usize,
    /// Bytes of subscriptions per socket (see [`crate::SUBSCRIPTION_OVERHEAD_BYTES`]).
    pub subscription_bytes_per_socket: usize,
    /// Bytes of subscriptions of all sockets together.
    pub subscription_bytes_total: usize,
    /// Longest PHID accepted in a subscription; longer ones are ignored.
    pub phid_bytes: usize,
    /// Slots per kind of instance (confirmed, anonymous).
    pub instances: usize,
    /// Longest instance name a socket or a POST may use.
    pub instance_name_bytes: usize,
    /// Open sockets, all instances together.
    pub sockets: usize,
    /// Replays a socket may ask for at once...
    pub replay_burst: u32,
    /// ...and one more per this many milliseconds.
    pub replay_refill_ms: u64,
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
            subscription_bytes_per_socket: 512 << 10,
            subscription_bytes_total: 256 << 20,
            phid_bytes: 512,
            instances: 1024,
            instance_name_bytes: 512,
            sockets: 100_000,
            replay_burst: 4,
            replay_refill_ms: 5_000,
        }
    }
}

/// Why a socket could not join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectError {
    /// [`Limits::sockets`] sockets are already open.
    TooManySockets,
    /// The instance is new and every slot of its kind ([`Limits::instances`]) is taken.
    TooManyInstances,
    /// The instance name is longer than [`Limits::instance_name_bytes`].
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
    /// This socket's id, unique for the life of the hub.
    pub fn id(&self) -> SocketId {
        self.id
    }

    /// The instance the socket joined.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The socket's outbound queue, which its writer drains.
    pub fn outbound(&self) -> &Arc<Outbound> {
        &self.outbound
    }
}

/// A batch ready to be written: every target socket with its frames, in order.
struct BatchPlan {
    sockets: Vec<Arc<Outbound>>,
    /// Socket `i`'s frames are `frames[starts[i]..starts[i + 1]]`.
    starts: Vec<usize>,
    frames: Vec<(Bytes, u64)>,
    /// For each frame, its message's index in the batch.
    messages: Vec<usize>,
    outcomes: Vec<Result<PublishCounts, InstanceNameTooLong>>,
    caps: QueueCaps,
}

impl BatchPlan {
    /// Writes (or queues) every socket's frames; one outcome per message, in order.
    fn deliver(self, hub: &Hub) -> Vec<Result<PublishCounts, InstanceNameTooLong>> {
        let mut outcomes = self.outcomes;
        for (socket, outbound) in self.sockets.iter().enumerate() {
            let range = self.starts[socket]..self.starts[socket + 1];
            let messages = &self.messages[range.clone()];
            // Counted before the write so `messages.out` never lags a frame a client holds.
            hub.messages_out
                .fetch_add(range.len() as u64, Ordering::Relaxed);
            outbound.push_batch(&self.frames[range], self.caps, |i, push| {
                let Some(Ok(outcome)) = outcomes.get_mut(messages[i]) else {
                    return;
                };
                match push {
                    Push::Written | Push::Queued => {
                        outcome.queued += 1;
                        return;
                    }
                    Push::Overflowed { dropped } => {
                        outcome.slow_consumers += 1;
                        outcome.dropped_frames += dropped;
                    }
                    Push::Closing | Push::Replayed => {}
                }
                hub.messages_out.fetch_sub(1, Ordering::Relaxed);
            });
        }
        outcomes
    }
}

/// One message for [`Hub::publish_batch`].
#[derive(Debug, Clone)]
pub struct Publication<'a> {
    /// The instance it was posted to.
    pub instance: &'a str,
    /// The PHIDs it is for: sockets subscribed to any of them get it.
    pub subscribers: &'a [String],
    /// The encoded frame, shared by every recipient and the history.
    pub frame: Bytes,
    /// When the message was accepted, by the hub's clock.
    pub at_ms: u64,
}

/// What one publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishCounts {
    /// Frames queued for live delivery.
    pub queued: usize,
    /// Sockets whose queue overflowed on this publish (now closing with 1008).
    pub slow_consumers: usize,
    /// Frames discarded by those overflows.
    pub dropped_frames: usize,
    /// History size after the publish.
    pub history_entries: usize,
    /// History bytes after the publish.
    pub history_bytes: usize,
}

/// What one subscribe did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubscribeCounts {
    /// PHIDs newly subscribed (already subscribed ones are not counted again).
    pub added: usize,
    /// PHIDs refused by the per-socket limits (count, bytes) or the per-PHID length limit.
    pub ignored: usize,
    /// PHIDs refused because all sockets together hold the total subscription bytes.
    pub over_total: usize,
}

/// What one replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplayCounts {
    /// History frames queued for the socket.
    pub queued: usize,
    /// Matching frames that did not fit in the socket's queue (the oldest are skipped).
    pub dropped_frames: usize,
    /// The socket asked for replays faster than its rate limit; nothing was replayed.
    pub refused: bool,
    /// How many times the replay took the hub lock (each hold examines a bounded slice).
    pub slices: usize,
}

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

/// An instance's counters for `/status/` (uptime and version are the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubStatus {
    /// Sockets of the instance open now.
    pub clients_active: u64,
    /// Sockets the instance has had since the hub started.
    pub clients_total: u64,
    /// Messages accepted, all instances (Aphlict's `messages.in`).
    pub messages_in: u64,
    /// Frames queued or written for live delivery, all instances; replays excluded.
    pub messages_out: u64,
    /// Retained history entries of the instance.
    pub history_size: u64,
    /// Milliseconds since the instance's oldest retained entry; `None` when it has none.
    pub history_age_ms: Option<u64>,
}

/// Global gauges of the hub, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HubUsage {
    /// Instances Phorge has published to (each holds a slot of its kind).
    pub confirmed_instances: usize,
    /// Instances named only by browsers' URLs (each holds a slot of its kind).
    pub anonymous_instances: usize,
    /// Bytes of subscriptions held by all sockets (see [`crate::subscription_cost`]).
    pub subscription_bytes: usize,
}

#[derive(Debug, Default)]
struct Instance {
    clients_active: u64,
    clients_total: u64,
    /// Published to by the admin port (see the module comment); `default` is neither kind.
    confirmed: bool,
    subscriptions: SubscriptionIndex,
}

/// A socket's replay allowance: a token bucket on the hub's clock.
#[derive(Debug)]
struct ReplayBudget {
    tokens: u32,
    refilled_at_ms: u64,
}

impl ReplayBudget {
    fn new(limits: &Limits, now_ms: u64) -> Self {
        ReplayBudget {
            tokens: limits.replay_burst,
            refilled_at_ms: now_ms,
        }
    }

    fn take(&mut self, limits: &Limits, now_ms: u64) -> bool {
        if self.tokens >= limits.replay_burst {
            self.refilled_at_ms = now_ms;
        } else if let Some(gained) = now_ms
            .saturating_sub(self.refilled_at_ms)
            .checked_div(limits.replay_refill_ms)
            .filter(|gained| *gained > 0)
        {
            let gained = u32::try_from(gained).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(gained).min(limits.replay_burst);
            self.refilled_at_ms += u64::from(gained) * limits.replay_refill_ms;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

#[derive(Debug)]
struct Socket {
    instance: Arc<str>,
    outbound: Arc<Outbound>,
    replays: ReplayBudget,
    /// The publish number when the socket's subscriptions last grew. Every message published
    /// after it that the socket wants now was delivered to it live, so a replay leaves those
    /// out: a browser subscribes on open and replays 100 ms later, and whatever arrived in
    /// between must not come twice on one connection.
    live_from: u64,
}

/// The instance every single-instance Phorge uses; it takes no slot.
const DEFAULT_INSTANCE: &str = "default";

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

impl State {
    fn anonymous_instances(&self) -> usize {
        let default = usize::from(self.instances.contains_key(DEFAULT_INSTANCE));
        self.instances.len() - self.confirmed_instances - default
    }
}

/// The notification hub. Share it as `Arc<Hub>`.
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
    /// A hub enforcing `limits`, reading history age from `clock`.
    pub fn new(limits: Limits, clock: Arc<dyn MillisClock>) -> Self {
        let history = History::new(HistoryLimits {
            entries: limits.history_entries,
            age_ms: limits.history_age_ms,
            bytes: limits.history_bytes,
        });
        Hub {
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
        }
    }

    /// Every bound the hub enforces.
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

    /// Makes room for one more instance of the given kind: true when its table has a free
    /// slot, or an idle instance of that kind (no open socket) could be forgotten.
    fn make_room(&self, state: &mut State, confirmed: bool) -> bool {
        let used = if confirmed {
            state.confirmed_instances
        } else {
            state.anonymous_instances()
        };
        if used < self.limits.instances {
            return true;
        }
        let idle = state
            .instances
            .iter()
            .find(|(k, i)| {
                i.confirmed == confirmed && i.clients_active == 0 && &***k != DEFAULT_INSTANCE
            })
            .map(|(k, _)| k.clone());
        match idle {
            Some(idle) => {
                state.instances.remove(&idle);
                if confirmed {
                    state.confirmed_instances -= 1;
                }
                true
            }
            None => false,
        }
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
        let outbound = Arc::new(Outbound::default());
        let live_from = state.published;
        state.sockets.insert(
            id,
            Socket {
                instance: key.clone(),
                outbound: outbound.clone(),
                replays: ReplayBudget::new(&self.limits, now),
                live_from,
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
            let freed = instance.subscriptions.remove_socket(handle.id);
            state.subscription_bytes -= freed;
        }
        // Give the memory of a burst of sockets back once they are gone.
        shrink_map(&mut state.sockets);
    }

    /// Adds PHIDs to a socket's subscriptions, up to the per-socket, per-PHID and total
    /// limits.
    pub fn subscribe(&self, handle: &SocketHandle, phids: Vec<String>) -> SubscribeCounts {
        let limits = &self.limits;
        let mut outcome = SubscribeCounts::default();
        let mut state = self.lock();
        let State {
            sockets,
            instances,
            subscription_bytes,
            published,
            ..
        } = &mut *state;
        let Some(socket) = sockets.get_mut(&handle.id) else {
            return outcome;
        };
        let Some(instance) = instances.get_mut(&socket.instance) else {
            return outcome;
        };
        let index = &mut instance.subscriptions;
        for phid in phids {
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
                outcome.over_total += 1;
                continue;
            }
            *subscription_bytes += index.insert(handle.id, &socket.outbound, phid);
            outcome.added += 1;
        }
        if outcome.added > 0 {
            socket.live_from = *published;
        }
        outcome
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

    /// Marks `instance` confirmed (the admin port published to it), creating its state if
    /// its table has room.
    fn confirm(&self, state: &mut State, instance: &str) {
        if instance == DEFAULT_INSTANCE {
            return;
        }
        match state.instances.get(instance).map(|i| i.confirmed) {
            Some(true) => {}
            Some(false) => {
                if self.make_room(state, true) {
                    if let Some(i) = state.instances.get_mut(instance) {
                        i.confirmed = true;
                        state.confirmed_instances += 1;
                    }
                }
            }
            None => {
                if self.make_room(state, true) {
                    state.instances.insert(
                        Arc::from(instance),
                        Instance {
                            confirmed: true,
                            ..Instance::default()
                        },
                    );
                    state.confirmed_instances += 1;
                }
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
    ) -> Result<PublishCounts, InstanceNameTooLong> {
        let message = Publication {
            instance,
            subscribers,
            frame,
            at_ms: self.clock.now_ms(),
        };
        self.publish_batch(std::slice::from_ref(&message))
            .pop()
            .expect("one outcome per message")
    }

    /// The hub's clock, in ms (a message accepted now and published later keeps this time).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Publishes messages in order, exactly as [`Hub::publish`] of each in turn would,
    /// except that each socket gets all of its frames of the batch in one write (the
    /// fan-out batches the messages that arrived while it was busy). One outcome per
    /// message, in order.
    pub fn publish_batch(
        &self,
        batch: &[Publication<'_>],
    ) -> Vec<Result<PublishCounts, InstanceNameTooLong>> {
        self.plan_batch(batch).deliver(self)
    }

    /// The first half of [`Hub::publish_batch`], under the hub lock: numbers the messages,
    /// stores them in history and lists each target socket with its frames. Delivering
    /// the plan writes to the sockets, without the lock.
    fn plan_batch(&self, batch: &[Publication<'_>]) -> BatchPlan {
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut sockets: Vec<Arc<Outbound>> = Vec::new();
        // (socket, message, seq) for every frame, in message order.
        let mut hits: Vec<(usize, usize, u64)> = Vec::new();
        let mut socket_of: HashMap<*const Outbound, usize> = HashMap::new();
        {
            let mut state = self.lock();
            for (index, message) in batch.iter().enumerate() {
                if !self.instance_name_ok(message.instance) {
                    outcomes.push(Err(InstanceNameTooLong));
                    continue;
                }
                let (seq, targets, (history_entries, history_bytes)) =
                    self.append_locked(&mut state, message);
                outcomes.push(Ok(PublishCounts {
                    history_entries,
                    history_bytes,
                    ..PublishCounts::default()
                }));
                hits.reserve(targets.len());
                for outbound in targets {
                    // One message's targets are distinct already; only a batch can repeat one.
                    let socket = if batch.len() == 1 {
                        sockets.len()
                    } else {
                        *socket_of
                            .entry(Arc::as_ptr(&outbound))
                            .or_insert(sockets.len())
                    };
                    if socket == sockets.len() {
                        sockets.push(outbound);
                    }
                    hits.push((socket, index, seq));
                }
            }
        }
        // Each socket's frames side by side, in message order (a counting sort: no
        // allocation per socket).
        let mut starts = vec![0usize; sockets.len() + 1];
        for &(socket, _, _) in &hits {
            starts[socket + 1] += 1;
        }
        for socket in 0..sockets.len() {
            starts[socket + 1] += starts[socket];
        }
        let mut next = starts.clone();
        let mut frames = vec![(Bytes::new(), 0); hits.len()];
        let mut messages = vec![0; hits.len()];
        for (socket, index, seq) in hits {
            let at = next[socket];
            next[socket] += 1;
            frames[at] = (batch[index].frame.clone(), seq);
            messages[at] = index;
        }
        BatchPlan {
            sockets,
            starts,
            frames,
            messages,
            outcomes,
            caps: self.caps(),
        }
    }

    /// Numbers one message, stores it in history and lists its target sockets, under the
    /// hub lock. Returns the number, the targets and the history's totals after it.
    fn append_locked(
        &self,
        state: &mut State,
        message: &Publication<'_>,
    ) -> (u64, Vec<Arc<Outbound>>, (usize, usize)) {
        state.published += 1;
        let seq = state.published;
        self.confirm(state, message.instance);
        let State {
            instances, history, ..
        } = state;
        let instance_entry = instances.get_key_value(message.instance);
        let history_instance = match instance_entry {
            Some((key, _)) => key.clone(),
            None => Arc::from(message.instance),
        };
        let targets = instance_entry.map_or_else(Vec::new, |(_, target)| {
            targets(&target.subscriptions, message.subscribers)
        });
        history.append(
            Entry {
                instance: history_instance,
                at_ms: message.at_ms,
                published: seq,
                subscribers: Subscribers::new(message.subscribers),
                body: message.frame.clone(),
            },
            message.at_ms,
        );
        (seq, targets, history.totals())
    }

    /// Queues this socket's instance's retained messages from the last `age_ms`, oldest first,
    /// filtered by the socket's subscriptions. Replay does not count in `messages.out`.
    ///
    /// Refused (and reported) beyond the socket's replay rate. History is walked newest first
    /// in slices of bounded work, letting go of the lock between slices so publishing never
    /// waits for more than one slice; only what fits in the socket's queue is kept.
    pub fn replay(&self, handle: &SocketHandle, age_ms: u64) -> ReplayCounts {
        self.replay_between_slices(handle, age_ms, std::thread::yield_now)
    }

    /// [`Hub::replay`], calling `between` each time it has let go of the lock.
    fn replay_between_slices(
        &self,
        handle: &SocketHandle,
        age_ms: u64,
        mut between: impl FnMut(),
    ) -> ReplayCounts {
        let caps = self.caps();
        let now = self.clock.now_ms();
        let since = now.saturating_sub(age_ms);
        let mut outcome = ReplayCounts::default();
        let mut state = self.lock();
        outcome.slices = 1;
        let (room, live_from) = {
            let Some(socket) = state.sockets.get_mut(&handle.id) else {
                return outcome;
            };
            if !socket.replays.take(&self.limits, now) {
                outcome.refused = true;
                return outcome;
            }
            (socket.outbound.room(caps), socket.live_from)
        };
        state.history.expire(now);
        // Messages published after `live_from` that the socket wants reach it live, not by
        // replay; those published before it and still being delivered skip this socket (it
        // gets them here).
        handle
            .outbound
            .mark_replayed(live_from.min(state.published));
        let mut cursor = state.history.next_seq();
        // Newest first; reversed before queueing.
        let mut picked: Vec<Bytes> = Vec::new();
        loop {
            let State {
                instances, history, ..
            } = &*state;
            let Some(index) = instances.get(&handle.instance).map(|i| &i.subscriptions) else {
                break;
            };
            let mut work = 0;
            let mut finished = true;
            for stored in history.newest_before(cursor) {
                let entry = &stored.entry;
                if entry.at_ms < since {
                    break;
                }
                cursor = stored.seq;
                work += 1;
                if entry.instance == handle.instance && entry.published <= live_from {
                    work += entry.subscribers.len();
                    if index.wants_any(handle.id, entry.subscribers.iter()) {
                        if picked.len() < room {
                            picked.push(entry.body.clone());
                        } else {
                            outcome.dropped_frames += 1;
                        }
                    }
                }
                if work >= REPLAY_SLICE_WORK {
                    finished = false;
                    break;
                }
            }
            if finished {
                break;
            }
            drop(state);
            between();
            state = self.lock();
            outcome.slices += 1;
            if !state.sockets.contains_key(&handle.id) {
                return outcome;
            }
        }
        // Still under the lock: no publish slips in between these frames.
        for body in picked.into_iter().rev() {
            if handle.outbound.push_if_room(body, caps) {
                outcome.queued += 1;
            } else {
                outcome.dropped_frames += 1;
            }
        }
        outcome
    }

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

    /// Instance and subscription gauges.
    pub fn usage(&self) -> HubUsage {
        let state = self.lock();
        HubUsage {
            confirmed_instances: state.confirmed_instances,
            anonymous_instances: state.anonymous_instances(),
            subscription_bytes: state.subscription_bytes,
        }
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
fn targets(index: &SubscriptionIndex, subscribers: &[String]) -> Vec<Arc<Outbound>> {
    if let [only] = subscribers {
        return index
            .sockets_for(only)
            .map(|(_, outbound)| outbound.clone())
            .collect();
    }
    let mut seen = HashSet::new();
    let mut targets = Vec::new();
    for phid in subscribers {
        for (id, outbound) in index.sockets_for(phid) {
            if seen.insert(id) {
                targets.push(outbound.clone());
            }
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualMillisClock;
    use crate::outbound::CloseReason;

    fn hub_with(limits: Limits) -> (Hub, Arc<ManualMillisClock>) {
        let clock = ManualMillisClock::new();
        (Hub::new(limits, clock.clone()), clock)
    }

    fn hub() -> (Hub, Arc<ManualMillisClock>) {
        hub_with(Limits::default())
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn frames(handle: &SocketHandle) -> Vec<Bytes> {
        handle.outbound().take_frames()
    }

    /// A socket of the default instance subscribed to `phids`.
    fn subscribed(hub: &Hub, phids: &[&str]) -> SocketHandle {
        let socket = hub.connect("default").unwrap();
        hub.subscribe(&socket, strings(phids));
        socket
    }

    fn publish(
        hub: &Hub,
        instance: &str,
        subscribers: &[&str],
        body: &'static str,
    ) -> PublishCounts {
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
    fn a_batch_publishes_like_one_message_after_another() {
        let (hub, _) = hub();
        let a = hub.connect("default").unwrap();
        let b = hub.connect("default").unwrap();
        hub.subscribe(&a, strings(&["PHID-A"]));
        hub.subscribe(&b, strings(&["PHID-B"]));
        let (to_a, to_b) = (strings(&["PHID-A"]), strings(&["PHID-B", "PHID-A"]));
        let long = "i".repeat(1000);
        let message = |instance, subscribers, body: &'static str| Publication {
            instance,
            subscribers,
            frame: Bytes::from_static(body.as_bytes()),
            at_ms: 0,
        };
        let outcomes = hub.publish_batch(&[
            message("default", &to_a, "m1"),
            message(&long, &to_a, "refused"),
            message("default", &to_b, "m2"),
            message("default", &to_a, "m3"),
        ]);
        let queued: Vec<Option<usize>> = outcomes
            .iter()
            .map(|o| o.as_ref().ok().map(|o| o.queued))
            .collect();
        assert_eq!(queued, [Some(1), None, Some(2), Some(1)]);
        assert_eq!(outcomes[3].as_ref().unwrap().history_entries, 3);
        assert_eq!(
            frames(&a),
            [
                Bytes::from_static(b"m1"),
                Bytes::from_static(b"m2"),
                Bytes::from_static(b"m3")
            ]
        );
        assert_eq!(frames(&b), [Bytes::from_static(b"m2")]);
        assert_eq!(hub.status("default").messages_out, 4);
    }

    #[test]
    fn a_socket_matching_several_subscribers_gets_one_frame() {
        let (hub, _) = hub();
        let a = subscribed(&hub, &["PHID-A", "PHID-B"]);
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
        let a = subscribed(&hub, &["PHID-A"]);
        assert_eq!(publish(&hub, "default", &[], "m").queued, 0);
        assert!(frames(&a).is_empty());
    }

    #[test]
    fn unsubscribe_stops_delivery() {
        let (hub, _) = hub();
        let a = subscribed(&hub, &["PHID-A", "PHID-B"]);
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
        assert_eq!(hub.status("a").messages_in, 0);
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
        clock.advance_ms(250);
        assert_eq!(hub.status("default").history_age_ms, Some(250));
        clock.advance_ms(60_000);
        let s = hub.status("default");
        assert_eq!((s.history_size, s.history_age_ms), (0, None));
    }

    #[test]
    fn replay_by_age_and_subscription_oldest_first() {
        let (hub, clock) = hub();
        publish(&hub, "default", &["A"], "old-a");
        clock.advance_ms(10_000);
        publish(&hub, "default", &["B"], "b");
        publish(&hub, "default", &["A"], "new-a");
        clock.advance_ms(1_000);
        let s = subscribed(&hub, &["A"]);
        assert_eq!(hub.replay(&s, 5_000).queued, 1);
        assert_eq!(frames(&s), [Bytes::from_static(b"new-a")]);
        assert_eq!(hub.replay(&s, 60_000).queued, 2);
        assert_eq!(
            frames(&s),
            [Bytes::from_static(b"old-a"), Bytes::from_static(b"new-a")]
        );
    }

    #[test]
    fn a_replay_leaves_out_what_the_socket_got_live() {
        // A browser subscribes on open and replays 100 ms later: what was published in
        // between reached it live and must not come again on the same connection.
        let (hub, _clock) = hub();
        publish(&hub, "default", &["A"], "before");
        let s = subscribed(&hub, &["A"]);
        publish(&hub, "default", &["A"], "live");
        assert_eq!(frames(&s), [Bytes::from_static(b"live")]);
        assert_eq!(hub.replay(&s, 60_000).queued, 1);
        assert_eq!(frames(&s), [Bytes::from_static(b"before")]);
        // Subscribing to more PHIDs: what the new ones match was not delivered live.
        publish(&hub, "default", &["B"], "b");
        hub.subscribe(&s, strings(&["B"]));
        publish(&hub, "default", &["B"], "b-live");
        assert_eq!(frames(&s), [Bytes::from_static(b"b-live")]);
        hub.replay(&s, 60_000);
        assert_eq!(
            frames(&s),
            [
                Bytes::from_static(b"before"),
                Bytes::from_static(b"live"),
                Bytes::from_static(b"b")
            ]
        );
    }

    #[test]
    fn warmed_history_is_replayed_once_and_merged_by_time() {
        let (hub, clock) = hub();
        clock.advance_ms(10_000);
        // Arrived by relay during warm-up.
        publish(&hub, "default", &["A"], "u2");
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

    #[test]
    fn replay_never_overflows_the_queue() {
        let (hub, _) = hub_with(Limits {
            queue_frames: 2,
            ..Limits::default()
        });
        for body in ["1", "2", "3"] {
            publish(&hub, "default", &["A"], body);
        }
        let s = subscribed(&hub, &["A"]);
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
            SubscribeCounts {
                added: 2,
                ignored: 2,
                over_total: 0,
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

    #[test]
    fn replay_lets_go_of_the_lock_between_bounded_slices() {
        // Room for the publishes made meanwhile, so none of the 4096 is evicted.
        let (hub, _) = hub_with(Limits {
            history_entries: 8192,
            ..Limits::default()
        });
        for i in 0..4096 {
            let body = Bytes::from(format!("m{i}"));
            hub.publish("default", &strings(&["A"]), body).unwrap();
        }
        let s = subscribed(&hub, &["A"]);
        let mut published_meanwhile = 0;
        // Publishing on this very thread would deadlock if the replay still held the lock.
        let out = hub.replay_between_slices(&s, 60_000, || {
            hub.publish("default", &strings(&["B"]), Bytes::from_static(b"x"))
                .unwrap();
            published_meanwhile += 1;
        });
        // 256 newest fit the queue; the walk still goes over all 4096 entries, in slices.
        assert_eq!((out.queued, out.dropped_frames), (256, 4096 - 256));
        assert!(out.slices >= 4096 * 2 / REPLAY_SLICE_WORK, "{out:?}");
        assert_eq!(published_meanwhile, out.slices - 1);
        let got = frames(&s);
        assert_eq!(got.first().unwrap(), &Bytes::from("m3840"));
        assert_eq!(got.last().unwrap(), &Bytes::from("m4095"));
    }

    #[test]
    fn a_message_with_many_subscribers_costs_one_slice_at_most_once() {
        let (hub, _) = hub();
        let many: Vec<String> = (0..1000).map(|i| format!("P{i}")).collect();
        hub.publish("default", &many, Bytes::from_static(b"big"))
            .unwrap();
        hub.publish("default", &strings(&["P999"]), Bytes::from_static(b"small"))
            .unwrap();
        let s = subscribed(&hub, &["P999"]);
        let out = hub.replay(&s, 60_000);
        assert_eq!((out.queued, out.slices), (2, 2));
        assert_eq!(
            frames(&s),
            [Bytes::from_static(b"big"), Bytes::from_static(b"small")]
        );
    }

    #[test]
    fn replays_are_rate_limited_per_socket() {
        let (hub, clock) = hub_with(Limits {
            replay_burst: 2,
            replay_refill_ms: 1_000,
            ..Limits::default()
        });
        publish(&hub, "default", &["A"], "m");
        let s = hub.connect("default").unwrap();
        let other = hub.connect("default").unwrap();
        hub.subscribe(&s, strings(&["A"]));
        hub.subscribe(&other, strings(&["A"]));
        let refused = |out: ReplayCounts| (out.refused, out.queued);
        assert_eq!(refused(hub.replay(&s, 60_000)), (false, 1));
        assert_eq!(refused(hub.replay(&s, 60_000)), (false, 1));
        assert_eq!(refused(hub.replay(&s, 60_000)), (true, 0));
        // Another socket has its own allowance.
        assert_eq!(refused(hub.replay(&other, 60_000)), (false, 1));
        clock.advance_ms(999);
        assert_eq!(refused(hub.replay(&s, 60_000)), (true, 0));
        clock.advance_ms(1);
        assert_eq!(refused(hub.replay(&s, 60_000)), (false, 1));
        assert_eq!(refused(hub.replay(&s, 60_000)), (true, 0));
        // A long pause refills up to the burst, not beyond.
        clock.advance_ms(10_000);
        for _ in 0..2 {
            assert_eq!(refused(hub.replay(&s, 60_000)), (false, 1));
        }
        assert_eq!(refused(hub.replay(&s, 60_000)), (true, 0));
    }

    #[test]
    fn anonymous_names_cannot_keep_real_instances_out() {
        let (hub, _) = hub();
        let squatters: Vec<_> = (0..1024)
            .map(|i| hub.connect(&format!("squat{i}")).unwrap())
            .collect();
        assert_eq!(
            hub.connect("squat-extra").unwrap_err(),
            ConnectError::TooManyInstances
        );
        // `default` is always a real instance.
        let _d = hub.connect("default").unwrap();
        // Once PHP has posted to an instance, its browsers get in whatever the squatters do.
        assert_eq!(
            hub.connect("acme").unwrap_err(),
            ConnectError::TooManyInstances
        );
        publish(&hub, "acme", &["P"], "hello");
        let acme = hub.connect("acme").unwrap();
        hub.subscribe(&acme, strings(&["P"]));
        assert_eq!(hub.replay(&acme, 60_000).queued, 1);
        assert_eq!(publish(&hub, "acme", &["P"], "live").queued, 1);
        let usage = hub.usage();
        assert_eq!(
            (usage.confirmed_instances, usage.anonymous_instances),
            (1, 1024)
        );
        // The squatters' own table still reclaims idle slots.
        hub.disconnect(&squatters[0]);
        hub.connect("squat-extra").unwrap();
    }

    #[test]
    fn confirmed_instances_have_their_own_bounded_table() {
        let (hub, _) = hub_with(Limits {
            instances: 2,
            ..Limits::default()
        });
        let _d = hub.connect("default").unwrap();
        let a = hub.connect("a").unwrap();
        publish(&hub, "a", &[], "promotes a");
        publish(&hub, "z", &[], "confirms z, idle");
        publish(&hub, "default", &[], "default takes no slot");
        let _z = hub.connect("z").unwrap();
        publish(&hub, "b", &[], "no room: a and z are busy");
        assert_eq!(hub.usage().confirmed_instances, 2);
        // "b" was not confirmed, but a browser can still open it as an anonymous instance.
        let _b = hub.connect("b").unwrap();
        hub.disconnect(&a);
        publish(&hub, "c", &[], "takes idle a's slot");
        assert_eq!(hub.status("a").clients_total, 0);
        let usage = hub.usage();
        assert_eq!(
            (usage.confirmed_instances, usage.anonymous_instances),
            (2, 1)
        );
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
                over_total: 0
            }
        );
        assert_eq!(
            hub.subscribe(&b, phids(10)),
            SubscribeCounts {
                added: 2,
                ignored: 0,
                over_total: 2
            }
        );
        assert_eq!(hub.usage().subscription_bytes, 5 * per_phid);
        hub.unsubscribe(&a, &strings(&["P-00", "P-99"]));
        assert_eq!(hub.usage().subscription_bytes, 4 * per_phid);
        hub.disconnect(&a);
        hub.disconnect(&b);
        assert_eq!(hub.usage().subscription_bytes, 0);
    }
}
