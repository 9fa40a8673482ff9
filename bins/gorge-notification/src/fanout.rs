//! The fan-out worker: the admin port hands it each accepted message and answers PHP at once;
//! this thread stores the message and delivers it to every subscribed socket.
//!
//! Phorge's PHP posts synchronously inside the request of the user who acted, so nothing on
//! the admin path may scale with the number or slowness of subscribers. One thread keeps
//! messages in the order they were accepted; the hand-off is bounded in messages and bytes,
//! and a full hand-off refuses the POST (503) and counts it rather than grow. Messages that
//! arrive while a pass runs share the next one, so a socket gets them in one write.
//!
//! The thread holds the hub's one [`Publisher`]: nothing else can publish, so frames reach
//! each socket in the order the POSTs were accepted.
//!
//! A client cannot tell the hand-off from a synchronous publish: whatever reads or changes
//! what publishing depends on (a socket joining, its commands, a status read) gets the hub
//! only from [`Fanout::settled`], once every message accepted before has been delivered. So
//! a `pong` still proves every earlier POST's frame went first, and a socket that subscribes
//! after a POST was answered does not get that message live. What does not depend on
//! messages in the hand-off (counting a POST in, leaving, queue bounds, the drain, gauges)
//! uses [`HubNow`], which offers nothing else: there is no way to the whole hub around
//! `settled`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use gorge_hub::{
    Hub, HubUsage, Limits, Publication, Publisher, QueueCaps, Released, SendQueue, SocketHandle,
    MAX_BATCH,
};
use slog::Logger;
use tokio::sync::watch;

use crate::events;
use crate::metrics::Metrics;
use gorge_service::emit;

/// Messages waiting for the fan-out thread, at most.
pub const HANDOFF_MESSAGES: usize = 4096;

/// Bytes of messages waiting for the fan-out thread, at most.
pub const HANDOFF_BYTES: usize = 64 << 20;

/// Bytes of messages one fan-out pass takes at most (more waits for the next pass).
pub const BATCH_BYTES: usize = 1 << 20;

/// One accepted message.
#[derive(Clone)]
pub struct Job {
    pub instance: String,
    pub subscribers: Vec<String>,
    /// The encoded WebSocket frame.
    pub frame: Bytes,
    pub accepted_at: Instant,
    /// The hub's time of acceptance (set by [`Fanout::submit`], in acceptance order), so
    /// history ages from the POST, not from the moment the thread got to it.
    pub at_ms: u64,
}

/// The admin side of the hand-off.
pub struct Fanout {
    hub: Arc<Hub>,
    /// Sending and counting happen together, so `accepted` is the number of the last job
    /// in the channel.
    tx: Mutex<SyncSender<Job>>,
    accepted: AtomicU64,
    /// The `at_ms` of the last job handed over (changed only under `tx`'s lock).
    last_at_ms: AtomicU64,
    /// How many jobs the thread has finished.
    delivered: watch::Sender<u64>,
    waiting_bytes: Arc<AtomicUsize>,
}

/// The hand-off is full.
#[derive(Debug)]
pub struct Full;

impl Fanout {
    /// Starts the fan-out thread, which takes the hub's publisher.
    pub fn start(mut publisher: Publisher, metrics: Metrics, log: Logger) -> Fanout {
        let (tx, rx) = sync_channel::<Job>(HANDOFF_MESSAGES);
        let hub = publisher.hub().clone();
        let waiting_bytes = Arc::new(AtomicUsize::new(0));
        let waiting = waiting_bytes.clone();
        let delivered = watch::Sender::new(0);
        let done = delivered.clone();
        std::thread::Builder::new()
            .name("fanout".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let (batch, bytes) = take_batch(first, &rx);
                    waiting.fetch_sub(bytes, Ordering::Relaxed);
                    deliver(&mut publisher, &metrics, &log, &batch);
                    done.send_modify(|n| *n += batch.len() as u64);
                }
            })
            .expect("spawn the fan-out thread");
        Fanout {
            hub,
            tx: Mutex::new(tx),
            accepted: AtomicU64::new(0),
            last_at_ms: AtomicU64::new(0),
            delivered,
            waiting_bytes,
        }
    }

    /// The hub, once every message accepted so far has been delivered: the one way to the
    /// hub for whatever must see every POST already answered (see the module comment).
    pub async fn settled(&self) -> &Hub {
        let target = self.accepted.load(Ordering::Acquire);
        if *self.delivered.borrow() < target {
            let _ = self.delivered.subscribe().wait_for(|n| *n >= target).await;
        }
        &self.hub
    }

    /// The hub as it is now, for what does not depend on the hand-off ([`HubNow`]).
    pub fn hub_now(&self) -> HubNow {
        HubNow(self.hub.clone())
    }

    /// Hands a message over without waiting.
    pub fn submit(&self, job: Job) -> Result<(), Full> {
        self.submit_aged(job, 0)
    }

    /// [`Fanout::submit`] for a message accepted `age_ms` ago elsewhere (history loaded at
    /// start keeps each message's age, so it expires and replays as it would have there).
    ///
    /// Never older than the message handed over before it: the history is kept in hand-over
    /// order and a replay stops at the first message older than it asks for, so one aged
    /// message behind a newer one (a POST accepted here while the history was still loading)
    /// would hide the newer one from every replay. Such a message is taken as that young.
    pub fn submit_aged(&self, mut job: Job, age_ms: u64) -> Result<(), Full> {
        let len = job.frame.len();
        if self.waiting_bytes.fetch_add(len, Ordering::Relaxed) + len > HANDOFF_BYTES {
            self.waiting_bytes.fetch_sub(len, Ordering::Relaxed);
            return Err(Full);
        }
        let tx = self.tx.lock().expect("fan-out lock poisoned");
        let at_ms = self
            .hub
            .now_ms()
            .saturating_sub(age_ms)
            .max(self.last_at_ms.load(Ordering::Relaxed));
        self.last_at_ms.store(at_ms, Ordering::Relaxed);
        job.at_ms = at_ms;
        match tx.try_send(job) {
            Ok(()) => {
                self.accepted.fetch_add(1, Ordering::Release);
                Ok(())
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.waiting_bytes.fetch_sub(len, Ordering::Relaxed);
                Err(Full)
            }
        }
    }
}

/// The first job and those already waiting behind it, up to [`BATCH_BYTES`] and
/// [`MAX_BATCH`] messages. Waiting for more would delay the first; taking what is there
/// costs nothing and lets a socket get several frames in one write when messages arrive
/// faster than one pass over the sockets. Returns the jobs and their frames' bytes.
fn take_batch(first: Job, rx: &Receiver<Job>) -> (Vec<Job>, usize) {
    let mut bytes = first.frame.len();
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH && bytes < BATCH_BYTES {
        match rx.try_recv() {
            Ok(job) => {
                bytes += job.frame.len();
                batch.push(job);
            }
            Err(_) => break,
        }
    }
    (batch, bytes)
}

fn deliver(publisher: &mut Publisher, m: &Metrics, log: &Logger, batch: &[Job]) {
    let messages: Vec<Publication<'_>> = batch
        .iter()
        .map(|job| Publication {
            instance: &job.instance,
            subscribers: &job.subscribers,
            frame: job.frame.clone(),
            at_ms: job.at_ms,
        })
        .collect();
    let outcomes = publisher.publish_batch(&messages);
    m.fanout_batch_messages.observe(batch.len() as f64);
    let mut history = None;
    for (job, outcome) in batch.iter().zip(outcomes) {
        // The admin port checked the instance name already.
        let Ok(outcome) = outcome else {
            continue;
        };
        m.fanout_seconds
            .observe(job.accepted_at.elapsed().as_secs_f64());
        m.messages_out.inc_by(outcome.queued as u64);
        m.queue_dropped_frames.inc_by(outcome.dropped_frames as u64);
        m.slow_consumer_disconnects
            .inc_by(outcome.slow_consumers as u64);
        history = Some((outcome.history_entries, outcome.history_bytes));
        emit!(log, events::NOTIFY_MESSAGE_DELIVERED;
            "instance" => &job.instance, "subscribers" => job.subscribers.len(),
            "queued" => outcome.queued, "slow_consumers" => outcome.slow_consumers,
            "batch" => batch.len());
    }
    // The totals after the batch's last message are the history's size now.
    if let Some((entries, bytes)) = history {
        m.set_history(entries, bytes);
    }
}
/// The hub as it is now, without waiting for the messages still in the hand-off: only what
/// does not depend on them. Whatever must see every POST already answered (a socket joining,
/// its commands, `/status/`, `/history/`, warming history) takes the hub from
/// [`Fanout::settled`]; this type offers none of that, so no handler can skip the wait.
///
/// ```compile_fail
/// // Subscribing needs the settled hub: `HubNow` has no way to it.
/// fn subscribe(state: &gorge_notification::state::ServerState, socket: &gorge_hub::SocketHandle) {
///     let _ = state.hub.subscribe(socket, vec!["PHID-X".to_string()]);
/// }
/// ```
///
/// ```
/// // What compiles instead.
/// async fn subscribe(state: &gorge_notification::state::ServerState, socket: &gorge_hub::SocketHandle) {
///     let _ = state.fanout.settled().await.subscribe(socket, vec!["PHID-X".to_string()]);
/// }
/// ```
#[derive(Clone)]
pub struct HubNow(Arc<Hub>);

impl HubNow {
    /// The hub's clock, in milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }

    /// The hub's limits.
    pub fn limits(&self) -> &Limits {
        self.0.limits()
    }

    /// The bounds of every socket's send queue.
    pub fn caps(&self) -> QueueCaps {
        self.0.caps()
    }

    /// Whether `name` is a usable instance name (not over the length limit).
    pub fn instance_name_ok(&self, name: &str) -> bool {
        self.0.instance_name_ok(name)
    }

    /// Counts one message in (`/status/`'s `messages.in`).
    pub fn count_message_in(&self) {
        self.0.count_message_in()
    }

    /// A socket leaves.
    pub fn disconnect(&self, handle: &SocketHandle) {
        self.0.disconnect(handle)
    }

    /// Every open socket's send queue (the drain closes them).
    pub fn send_queues(&self) -> Vec<Arc<SendQueue>> {
        self.0.send_queues()
    }

    pub fn open_sockets(&self) -> usize {
        self.0.open_sockets()
    }

    /// What the hub holds, for the gauges.
    pub fn usage(&self) -> HubUsage {
        self.0.usage()
    }

    /// Memory released by closed sockets (when to hand it back to the system).
    pub fn released(&self) -> Released {
        self.0.released()
    }
}
