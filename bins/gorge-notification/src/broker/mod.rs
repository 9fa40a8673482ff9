//! Broker mode (docs/notification.md, "Broker mode"; spec §8b): the servers of a cluster
//! exchange messages through one Redis stream instead of relaying to each other, and the
//! stream is also the history a starting server loads, so it survives restarts of every node.
//!
//! A stream and not Pub/Sub: entry ids are time-ordered, which is what Aphlict's age-based
//! replay needs (load the last `HISTORY_AGE_MS` at start, resume from the last id read after an
//! outage), and entries wait for a reader that was away.
//!
//! - this module: the handle the admin port publishes through, the shared state, the keys and
//!   the entry fields;
//! - [`publisher`]: the one task that `XADD`s, from a bounded queue (the POST never waits);
//! - [`reader`]: the task that loads history at start, then reads the stream on its own
//!   connection, and reports the broker down while it makes no progress. It delivers into
//!   the server's state, so the service starts it ([`reader::run`]) with the [`ReaderLink`]
//!   that [`Broker::start`] returns: this module and the state it is part of never name each
//!   other's types in a circle;
//! - [`entries`]: entries as read, and the size-aware read that skips an oversized entry
//!   by its id;
//! - [`origins`]: which entries of each other server were taken (an entry added twice is
//!   taken once);
//! - [`metrics`], the `gorge_notification_broker_*` families.
//!
//! Keys under the prefix: `<prefix>:stream` (messages, the history), `<prefix>:epoch` (see
//! [`reader`]), `<prefix>:oversized` (marks of the stream's oversized entries, see
//! [`entries`]) and `<prefix>:probe:<fingerprint>`, each server's probe entry (one,
//! expiring), kept out of the stream so that idle servers' probes never take the history's
//! places.

mod entries;
mod metrics;
mod origins;
mod publisher;
pub mod reader;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ProtocolVersion};
use slog::Logger;
use tokio::sync::{mpsc, Notify};

use crate::config::BrokerConfig;
use crate::events;
use gorge_service::emit;
pub use metrics::BrokerMetrics;

/// Bound of every Redis call but the blocking read (connecting included).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The reader reads at least this often even when Redis pushes no invalidation (it pushes
/// one at the first write to the stream or our probe key after each read, so this is only
/// a floor).
const IDLE_READ: Duration = Duration::from_secs(5);

/// With nothing to publish for this long, the publisher adds a probe entry (to its probe
/// key, not the stream), so the reader always has one of our own entries to expect.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Our own entry (message or probe) must come back to the reader within this long after
/// Redis acknowledged it. Otherwise the reader makes no progress — its connection may look
/// healthy, with its blocking read pending, and deliver nothing; or a reply or the hand-off
/// to the fan-out holds it — and it is reported down until it reads our entry (a connection
/// it was waiting on is replaced). Shorter than a blocking read, which alone could only time
/// out after [`BLOCK`] plus slack.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A server's probe key expires this long after its last probe (the key of a server that
/// stopped goes by itself).
const PROBE_KEY_TTL: Duration = Duration::from_secs(60);

/// At startup, `/readyz` waits this long at most for the history to load. If Redis cannot
/// be reached by then the server becomes ready without it (PHP must reach some server) and
/// loads it when Redis answers.
pub const HYDRATE_WAIT: Duration = Duration::from_secs(15);

/// Reconnect backoff: doubled from the first to the last, each wait jittered down to half.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_LAST: Duration = Duration::from_secs(5);

/// Entry fields. A message entry has all but `probe`; a probe entry `fingerprint`, `seq` and
/// `probe`.
const FIELD_FINGERPRINT: &str = "fingerprint";
const FIELD_SEQ: &str = "seq";
const FIELD_INSTANCE: &str = "instance";
const FIELD_MESSAGE: &str = "message";
const FIELD_PROBE: &str = "probe";

/// One message waiting to be published.
struct Outgoing {
    instance: String,
    message: Bytes,
    queued_at: Instant,
}

/// The broker's publishing handle, what the admin port and the drain use: queue a message
/// for the stream, wait for the queue to empty.
pub struct Broker {
    shared: Arc<Shared>,
    queue: mpsc::Sender<Outgoing>,
}

/// What the reader task needs of the broker ([`reader::run`]): the connection settings, the
/// keys, the metrics and what it tells the publisher's probes.
pub struct ReaderLink(Arc<Shared>);

struct Shared {
    /// The publisher's client.
    client: Client,
    /// The reader's: RESP3, so that invalidation pushes arrive on its own connection.
    reader_client: Client,
    stream_key: String,
    epoch_key: String,
    /// The marks of the stream's oversized entries ([`entries`]).
    marks_key: String,
    /// This server's probe entry: `<prefix>:probe:<fingerprint>`.
    probe_key: String,
    fingerprint: String,
    /// Entries older than this are neither published late nor loaded at start.
    history_age: Duration,
    /// The stream is trimmed to about this many entries.
    max_entries: usize,
    /// At start, no more than this many bytes of entries are loaded (the history's bytes).
    max_bytes: usize,
    /// The longest instance name a message may carry (part of the largest entry).
    instance_name_bytes: usize,
    metrics: BrokerMetrics,
    log: Logger,
    publisher_up: Updown,
    reader_up: Updown,
    /// The first of our own entries Redis acknowledged that the reader has not seen yet,
    /// `(seq, when acknowledged)`.
    unseen_own: Mutex<Option<(u64, Instant)>>,
    /// Whether the reader waits for the answer to a read it sent: that wait is bounded by
    /// the call's own timeout ([`CALL_TIMEOUT`]), so the watchdog leaves it to that. A
    /// Redis busy for a while (copying a 100 MB entry into the read script once: 0.6 s)
    /// is not a reader making no progress.
    reader_in_call: AtomicBool,
    /// The highest seq of our own entries the reader has seen.
    own_seen: AtomicU64,
    /// The highest seq the publisher has sent (set before sending, so the reader may read
    /// an entry back before its answer arrives): an entry with our fingerprint and a higher
    /// seq is not ours (anything that can write to the stream can forge one) and must not
    /// stand for one the reader has yet to see.
    own_sent: AtomicU64,
    /// Counts the times one of our entries was overdue (see [`PROBE_TIMEOUT`]): a reader
    /// waiting on its connection when it changes gives the connection up.
    overdue: tokio::sync::watch::Sender<u64>,
    /// Messages queued or being published; the drain waits for zero.
    pending: AtomicUsize,
    /// Woken when `pending` drops to zero.
    idle: Notify,
}

/// One connection's state, logged once per change.
#[derive(Default)]
struct Updown {
    up: AtomicBool,
    /// Set once the first down was logged, so a server that never reached Redis logs it once.
    down_logged: AtomicBool,
}

impl Broker {
    /// Starts the publisher task of `config` (inside a Tokio runtime) and returns the
    /// publishing handle, and the link the reader is started with.
    pub fn start(
        config: &BrokerConfig,
        fingerprint: String,
        limits: &gorge_hub::Limits,
        metrics: BrokerMetrics,
        log: Logger,
    ) -> (Broker, ReaderLink) {
        let client = config.client().expect("validated with the configuration");
        let reader_client = config
            .client_speaking(ProtocolVersion::RESP3)
            .expect("validated with the configuration");
        let (queue, jobs) = mpsc::channel(config.queue_capacity.max(1));
        let shared = Arc::new(Shared {
            client,
            reader_client,
            stream_key: format!("{}:stream", config.prefix),
            epoch_key: format!("{}:epoch", config.prefix),
            marks_key: format!("{}:oversized", config.prefix),
            probe_key: format!("{}:probe:{fingerprint}", config.prefix),
            fingerprint,
            history_age: Duration::from_millis(limits.history_age_ms),
            // Never so few that a reader a moment behind finds its entries trimmed.
            max_entries: limits.history_entries.max(64),
            max_bytes: limits.history_bytes,
            instance_name_bytes: limits.instance_name_bytes,
            metrics,
            log,
            publisher_up: Updown::default(),
            reader_up: Updown::default(),
            unseen_own: Mutex::new(None),
            reader_in_call: AtomicBool::new(false),
            own_seen: AtomicU64::new(0),
            own_sent: AtomicU64::new(0),
            overdue: tokio::sync::watch::Sender::new(0),
            pending: AtomicUsize::new(0),
            idle: Notify::new(),
        });
        tokio::spawn(publisher::run(shared.clone(), jobs));
        (
            Broker {
                shared: shared.clone(),
                queue,
            },
            ReaderLink(shared),
        )
    }

    /// Queues a stamped message for the stream if it entered the cluster here (nobody but us
    /// in `touched`). Never waits: a full queue drops it and counts.
    pub fn publish(&self, instance: &str, stamped_body: Bytes, touched: &[String]) {
        let own = self.shared.fingerprint.as_str();
        if !touched.iter().all(|fingerprint| fingerprint == own) {
            return;
        }
        let outgoing = Outgoing {
            instance: instance.to_owned(),
            message: stamped_body,
            queued_at: Instant::now(),
        };
        // Counted before sending, so the publisher finishing it first never underflows.
        self.shared.pending.fetch_add(1, Ordering::AcqRel);
        if self.queue.try_send(outgoing).is_err() {
            self.shared
                .metrics
                .broker_dropped
                .with(["queue_full"])
                .inc();
            self.shared.message_done();
        }
    }

    /// Waits up to `deadline` until every message queued so far is published (or dropped as
    /// too old): at SIGTERM, so that what PHP posted here last reaches the other servers.
    pub async fn flush(&self, deadline: Duration) {
        let shared = &self.shared;
        let until_idle = async {
            loop {
                let notified = shared.idle.notified();
                tokio::pin!(notified);
                // Registered before the check, so a wake-up in between is not lost.
                notified.as_mut().enable();
                if shared.pending.load(Ordering::Acquire) == 0 {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(deadline, until_idle).await.is_err() {
            emit!(shared.log, events::NOTIFY_BROKER_NOT_FLUSHED;
                "pending" => shared.pending.load(Ordering::Acquire),
                "deadline_ms" => deadline.as_millis() as u64);
        }
    }
}

impl Shared {
    /// Where the size-aware read marks the stream's oversized entries: kept for as long as
    /// the stream keeps an entry (the history age, trimmed every 10 s), and a minute more.
    fn marks(&self) -> entries::Marks<'_> {
        entries::Marks {
            key: &self.marks_key,
            keep_ms: self.history_age.as_millis() as u64 + 60_000,
        }
    }

    /// Called once for every message counted in `pending`, whatever became of it.
    fn message_done(&self) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// A new connection of `client` whose every answer must come within [`CALL_TIMEOUT`];
    /// `config` adds to that (the reader's push sender).
    async fn connect(
        &self,
        client: &Client,
        config: AsyncConnectionConfig,
    ) -> redis::RedisResult<MultiplexedConnection> {
        let config = config
            .set_connection_timeout(Some(CALL_TIMEOUT))
            .set_response_timeout(Some(CALL_TIMEOUT));
        match tokio::time::timeout(
            CALL_TIMEOUT,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        {
            Ok(connected) => connected,
            Err(_) => Err(timed_out()),
        }
    }

    /// Records that `side` works again (logged when it did not).
    fn mark_up(&self, side: &Updown, which: &'static str) {
        if !side.up.swap(true, Ordering::AcqRel) {
            side.down_logged.store(false, Ordering::Release);
            emit!(self.log, events::NOTIFY_BROKER_UP; "connection" => which);
        }
        self.set_up_gauge();
    }

    /// Records that `side` failed (logged once per outage, not per call).
    fn mark_down(&self, side: &Updown, which: &'static str, error: &redis::RedisError) {
        side.up.store(false, Ordering::Release);
        if !side.down_logged.swap(true, Ordering::AcqRel) {
            emit!(self.log, events::NOTIFY_BROKER_DOWN;
                "connection" => which, "error" => %error);
        }
        self.set_up_gauge();
    }

    fn set_up_gauge(&self) {
        let up = self.publisher_up.up.load(Ordering::Acquire)
            && self.reader_up.up.load(Ordering::Acquire);
        self.metrics.broker_up.set(i64::from(up));
    }
}

/// The error of a call that did not answer in time.
fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
}

/// Runs `call` within `limit`.
async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

/// Reconnect delays: doubling, each jittered into its upper half so that every server of a
/// cluster does not knock at the same instant when Redis comes back.
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            next: BACKOFF_FIRST,
        }
    }

    fn reset(&mut self) {
        self.next = BACKOFF_FIRST;
    }

    async fn wait(&mut self) {
        let full = self.next;
        self.next = (self.next * 2).min(BACKOFF_LAST);
        let half = full / 2;
        let jitter = rand::random_range(0..=half.as_millis() as u64);
        tokio::time::sleep(half + Duration::from_millis(jitter)).await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
