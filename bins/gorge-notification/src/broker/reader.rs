//! The reader: at start it loads the last `HISTORY_AGE_MS` of the stream into history and
//! opens the history gate (`/readyz`, `replay`); then it reads the stream from the last id on
//! its own connection, skips our own entries and takes the others in as relayed messages. On
//! any failure it reconnects with a jittered backoff and resumes from the last id it read, so
//! messages arrive late rather than never.
//!
//! Every read is size-aware ([`entries`](super::entries)): an entry larger than any message
//! can be is skipped by its id without its bytes leaving Redis, counted and logged (at most
//! once a minute per reason, with a count), as is an entry that is no message of this
//! service. So the reader never waits in a blocking `XREAD`, whose reply carries the entry
//! that ends the wait whole, however large (one 100 MB `XADD` was sent to every waiting
//! server). It waits for a doorbell instead: its connection speaks RESP3 with
//! `CLIENT TRACKING ON`, and before each read it `EXISTS`es the stream and this server's
//! probe key, so Redis pushes an invalidation — the key's name, nothing else — at the next
//! write to either. The push wakes it to read the key it names (one round trip more than
//! the blocking read: `EXISTS` and the reads go in one pipeline); with no push it reads
//! both every [`IDLE_READ`] anyway. The pushes only ever name keys this connection read (Redis's
//! default tracking mode), and nothing else can put one on the connection: the doorbell is
//! bounded whatever is written to Redis.
//!
//! On every connection it compares the epoch key with the one it saw before: a different one
//! means Redis restarted empty (the stream it resumed from is gone), counted and logged, and
//! reading starts again from the new stream's beginning.
//!
//! A watchdog beside it makes `broker_up` tell the truth: while one of our own entries has
//! not been read back within [`PROBE_TIMEOUT`] the reader is reported down, whatever holds it
//! (a connection that delivers nothing, a reply too large to arrive, a stalled hand-off to
//! the fan-out); it is up again once it reads our entry. A reader waiting on its connection
//! then gives the connection up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gorge_service::log_every::LogEvery;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, PushInfo, PushKind, Value};
use tokio::sync::Notify;

use super::entries::{
    has_more, id_millis, items_of, read_command, read_page, Call, Direction, Fields, Item,
    StreamEntry,
};
use super::origins::Origins;
use super::{
    lock, within, Backoff, ReaderLink, Shared, CALL_TIMEOUT, HYDRATE_WAIT, IDLE_READ, PROBE_TIMEOUT,
};
use crate::events;
use crate::ingest::{ingest_relayed, NotTaken};
use crate::state::ServerState;
use gorge_service::emit;

/// What an entry carries besides the message and the instance name: field names, the
/// fingerprint, the sequence number, and what stamping adds to the message (our fingerprint
/// in `touched`).
const ENTRY_OVERHEAD: usize = 1024;

/// A skipped entry's line, and a probe timeout's, are logged at most this often (per
/// reason), with the count since the last line.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// How often the watchdog looks for an overdue entry of ours.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// What the reader keeps across connections.
struct ReadState {
    /// The id to read after; `None` until the history was loaded.
    last_id: Option<String>,
    /// The id of the last probe entry read from our probe key.
    last_probe_id: String,
    /// The epoch key's value on the last connection.
    epoch: Option<String>,
    origins: Origins,
    /// Bytes of fields above which an entry is not read (an admin POST cannot carry it).
    entry_limit: usize,
    skipped: Skipped,
}

/// Why entries were skipped: one metric label, one log rate each.
#[derive(Debug, Clone, Copy)]
enum Skip {
    Oversized,
    NoMessage,
    Malformed,
    InstanceName,
}

impl Skip {
    const ALL: [Skip; 4] = [
        Skip::Oversized,
        Skip::NoMessage,
        Skip::Malformed,
        Skip::InstanceName,
    ];

    /// The `reason` label of `broker_skipped_total`.
    fn label(self) -> &'static str {
        match self {
            Skip::Oversized => "oversized",
            Skip::NoMessage => "no_message",
            Skip::Malformed => "malformed",
            Skip::InstanceName => "instance_name",
        }
    }
}

/// One [`LogEvery`] per [`Skip`].
struct Skipped([LogEvery; 4]);

impl Skipped {
    fn new() -> Skipped {
        Skipped(Skip::ALL.map(|_| LogEvery::new(LOG_EVERY)))
    }

    /// Counts entry `id` skipped for `why` (`detail` says more), logging when a line is due.
    fn skip(&self, shared: &Shared, why: Skip, id: &str, detail: &str) {
        shared.metrics.broker_skipped.with([why.label()]).inc();
        if let Some(count) = self.0[why as usize].occurred() {
            emit!(shared.log, events::NOTIFY_BROKER_BAD_ENTRY;
                "id" => id, "reason" => why.label(), "detail" => detail, "count" => count);
        }
    }
}

/// The reader task: history first, then the live stream. `state.history_gate` opens once
/// the history is loaded (or [`HYDRATE_WAIT`] passed). Runs until the process ends.
pub async fn run(link: ReaderLink, state: Arc<ServerState>) {
    let ReaderLink(shared) = link;
    let started = Instant::now();
    {
        let (state, log) = (state.clone(), shared.log.clone());
        tokio::spawn(async move {
            tokio::time::sleep(HYDRATE_WAIT).await;
            if state.history_gate.open() {
                emit!(log, events::NOTIFY_BROKER_NOT_HYDRATED;
                    "waited_ms" => HYDRATE_WAIT.as_millis() as u64);
            }
        });
    }
    tokio::spawn(watchdog(shared.clone()));
    let mut cursor = ReadState {
        last_id: None,
        last_probe_id: "0-0".into(),
        epoch: None,
        origins: Origins::default(),
        entry_limit: state.limits.max_admin_body_bytes
            + shared.instance_name_bytes
            + ENTRY_OVERHEAD,
        skipped: Skipped::new(),
    };
    let mut backoff = Backoff::new();
    let mut connected_before = false;
    loop {
        let doorbell = Arc::new(Doorbell::new(&shared));
        let ring = doorbell.clone();
        let config = AsyncConnectionConfig::new().set_push_sender(move |push: PushInfo| {
            ring.ring(push);
            Ok::<(), std::convert::Infallible>(())
        });
        let error = match shared.connect(&shared.reader_client, config).await {
            Ok(mut conn) => {
                if connected_before {
                    shared.metrics.broker_reconnects.inc();
                }
                connected_before = true;
                session(
                    &shared,
                    &state,
                    &mut conn,
                    &doorbell,
                    &mut cursor,
                    started,
                    &mut backoff,
                )
                .await
            }
            Err(error) => error,
        };
        shared.mark_down(&shared.reader_up, "reader", &error);
        backoff.wait().await;
    }
}

/// One connection's life: epoch check and tracking on, history if not loaded yet, then
/// reading until an error, which it returns. `doorbell` is rung by the connection's pushes.
async fn session(
    shared: &Shared,
    state: &ServerState,
    conn: &mut MultiplexedConnection,
    doorbell: &Doorbell,
    cursor: &mut ReadState,
    started: Instant,
    backoff: &mut Backoff,
) -> redis::RedisError {
    if let Err(error) = check_epoch(shared, conn, cursor).await {
        return error;
    }
    let tracking = redis::cmd("CLIENT").arg("TRACKING").arg("ON").to_owned();
    if let Err(error) = within(CALL_TIMEOUT, tracking.query_async::<()>(conn)).await {
        return error;
    }
    if cursor.last_id.is_none() {
        match hydrate(shared, state, conn, cursor).await {
            Ok(entries) => {
                emit!(shared.log, events::NOTIFY_BROKER_HYDRATED;
                    "entries" => entries, "elapsed_ms" => started.elapsed().as_millis() as u64);
                state.history_gate.open();
            }
            Err(error) => return error,
        }
    }
    backoff.reset();
    let mut overdue = shared.overdue.subscribe();
    let mut call = Call::ByHash;
    loop {
        // Arm the doorbell, then read the keys it rang for: Redis pushes at the first write
        // to either key after the `EXISTS`, so nothing added after these reads goes
        // unnoticed.
        let (read_probes, read_stream) = doorbell.take();
        let mut round = redis::pipe();
        round
            .cmd("EXISTS")
            .arg(&shared.stream_key)
            .arg(&shared.probe_key)
            .ignore();
        if read_probes {
            round.add_command(read_command(
                call,
                &shared.probe_key,
                None,
                Direction::Forward,
                Some(&cursor.last_probe_id),
                cursor.entry_limit,
            ));
        }
        if read_stream {
            round.add_command(read_command(
                call,
                &shared.stream_key,
                Some(shared.marks()),
                Direction::Forward,
                cursor.last_id.as_deref(),
                cursor.entry_limit,
            ));
        }
        let read = within(CALL_TIMEOUT, round.query_async::<Vec<Value>>(conn));
        shared.reader_in_call.store(true, Ordering::Release);
        let replies = unless_overdue(&mut overdue, read).await;
        shared.reader_in_call.store(false, Ordering::Release);
        let mut replies = match replies {
            Ok(replies) => replies.into_iter(),
            Err(error) => {
                // Not read: read both again.
                doorbell.ring_all();
                match call.after(&error) {
                    Some(again) => {
                        call = again;
                        continue;
                    }
                    None => return error,
                }
            }
        };
        let probes = match read_probes {
            true => replies.next().unwrap_or(Value::Nil),
            false => Value::Nil,
        };
        let entries = replies.next().unwrap_or(Value::Nil);
        call = Call::ByHash;
        for item in items_of(probes, cursor.entry_limit) {
            cursor.last_probe_id = item.id().to_string();
            if let Item::Entry(entry) = item {
                if let Some(seq) = Fields::of(&entry.fields).seq {
                    saw_own(shared, seq);
                }
            }
        }
        let more = has_more(&entries);
        take_all(shared, state, cursor, items_of(entries, cursor.entry_limit)).await;
        if more {
            // The reply ran out of entries or bytes before the stream's end: read on at once.
            doorbell.ring_stream();
            continue;
        }
        shared.metrics.broker_lag_seconds.set(0.0);
        let rung = async {
            // A push that came during the reads left its permit: this returns at once.
            if tokio::time::timeout(IDLE_READ, doorbell.rung.notified())
                .await
                .is_err()
            {
                doorbell.ring_all();
            }
            Ok(())
        };
        if let Err(error) = unless_overdue(&mut overdue, rung).await {
            return error;
        }
    }
}

/// What one connection's pushes say: which of the reader's keys changed since it last read
/// them, and a wake-up for the reader waiting for one to.
struct Doorbell {
    stream_key: Vec<u8>,
    probe_key: Vec<u8>,
    probe: AtomicBool,
    stream: AtomicBool,
    rung: Notify,
}

impl Doorbell {
    /// Rung for both keys: a new connection reads both first.
    fn new(shared: &Shared) -> Doorbell {
        Doorbell {
            stream_key: shared.stream_key.as_bytes().to_vec(),
            probe_key: shared.probe_key.as_bytes().to_vec(),
            probe: AtomicBool::new(true),
            stream: AtomicBool::new(true),
            rung: Notify::new(),
        }
    }

    /// One push of the connection: an invalidation of either key rings for it; one that
    /// names neither (another key a script read) rings nothing; any other push (a flush,
    /// the connection's end) rings for both.
    fn ring(&self, push: PushInfo) {
        let keys: Option<Vec<Vec<u8>>> = match (push.kind, push.data.first()) {
            (PushKind::Invalidate, Some(Value::Array(keys))) => Some(
                keys.iter()
                    .filter_map(|key| match key {
                        Value::BulkString(key) => Some(key.clone()),
                        _ => None,
                    })
                    .collect(),
            ),
            _ => None,
        };
        let Some(keys) = keys else {
            return self.ring_all();
        };
        let (probe, stream) = (
            keys.contains(&self.probe_key),
            keys.contains(&self.stream_key),
        );
        if probe {
            self.probe.store(true, Ordering::Release);
        }
        if stream {
            self.stream.store(true, Ordering::Release);
        }
        if probe || stream {
            self.rung.notify_one();
        }
    }

    fn ring_all(&self) {
        self.probe.store(true, Ordering::Release);
        self.ring_stream();
    }

    fn ring_stream(&self) {
        self.stream.store(true, Ordering::Release);
        self.rung.notify_one();
    }

    /// Which keys to read now, `(probe, stream)`; both are unrung until pushed again.
    fn take(&self) -> (bool, bool) {
        (
            self.probe.swap(false, Ordering::AcqRel),
            self.stream.swap(false, Ordering::AcqRel),
        )
    }
}

/// `read`, given up (as a timeout) if one of our entries becomes overdue meanwhile.
async fn unless_overdue<T>(
    overdue: &mut tokio::sync::watch::Receiver<u64>,
    read: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    // Only what becomes overdue during this read counts: a reader held elsewhere (taking a
    // long backlog in) has been reported down, but its connection is fine.
    overdue.mark_unchanged();
    tokio::select! {
        result = read => result,
        _ = overdue.changed() => Err(no_progress()),
    }
}

/// The error of a reader that did not read our entry back in time.
fn no_progress() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "no progress: our own entry was not read back within {} ms",
            PROBE_TIMEOUT.as_millis()
        ),
    ))
}

/// Takes `items` in, in order, moving the cursor past each.
async fn take_all(shared: &Shared, state: &ServerState, cursor: &mut ReadState, items: Vec<Item>) {
    let now = wall_ms();
    for item in items {
        cursor.last_id = Some(item.id().to_string());
        let id_ms = id_millis(item.id());
        if take(shared, state, cursor, item, 0).await {
            shared.metrics.broker_received.inc();
            let lag = now.saturating_sub(id_ms) as f64 / 1000.0;
            shared.metrics.broker_lag_seconds.set(lag);
        }
    }
}

/// Reports the reader down, and gives up a connection it waits on, each time one of our
/// entries has been acknowledged by Redis for longer than [`PROBE_TIMEOUT`] without the
/// reader reading it back; the entry is then forgotten, so the next one (a probe follows
/// within a second) gets its own chance. Not while the reader waits for the answer to a
/// read: that call's timeout ends it if Redis does not answer, and a Redis that answers
/// late (busy, not broken) is not a reader that makes no progress.
async fn watchdog(shared: Arc<Shared>) {
    let timeouts = LogEvery::new(LOG_EVERY);
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        // A read waiting for its answer is bounded by its own timeout: its end decides.
        if shared.reader_in_call.load(Ordering::Acquire) {
            continue;
        }
        let overdue = {
            let mut unseen = lock(&shared.unseen_own);
            match *unseen {
                Some((seq, since)) if since.elapsed() > PROBE_TIMEOUT => {
                    *unseen = None;
                    Some(seq)
                }
                _ => None,
            }
        };
        let Some(seq) = overdue else { continue };
        shared.metrics.broker_probe_timeouts.inc();
        if let Some(count) = timeouts.occurred() {
            emit!(shared.log, events::NOTIFY_BROKER_PROBE_TIMEOUT;
                "seq" => seq, "timeout_ms" => PROBE_TIMEOUT.as_millis() as u64,
                "count" => count);
        }
        shared.mark_down(&shared.reader_up, "reader", &no_progress());
        shared.overdue.send_modify(|n| *n += 1);
    }
}

/// Sets the epoch key if it is missing and reads it; a value other than last time's means
/// Redis lost its data (restarted without persistence, or flushed).
async fn check_epoch(
    shared: &Shared,
    conn: &mut MultiplexedConnection,
    cursor: &mut ReadState,
) -> redis::RedisResult<()> {
    let candidate = format!("{:016x}", rand::random::<u64>());
    let (_, epoch): (Value, String) = within(
        CALL_TIMEOUT,
        redis::pipe()
            .cmd("SET")
            .arg(&shared.epoch_key)
            .arg(&candidate)
            .arg("NX")
            .cmd("GET")
            .arg(&shared.epoch_key)
            .query_async(conn),
    )
    .await?;
    if let Some(before) = cursor.epoch.as_ref().filter(|before| **before != epoch) {
        shared.metrics.broker_epoch_changes.inc();
        emit!(shared.log, events::NOTIFY_BROKER_EPOCH_CHANGED;
            "before" => before, "now" => &epoch);
        if cursor.last_id.is_some() {
            // The stream we resumed from is gone; everything in the new one is new to us.
            cursor.last_id = Some("0-0".into());
        }
        cursor.last_probe_id = "0-0".into();
        // `origins` is kept: a fingerprint is one server process's, and its sequence
        // numbers only grow, whatever Redis lost. The new stream can hold an entry seen
        // before (a publisher retries an `XADD` whose answer the restart lost), and its
        // first copy was delivered already.
    }
    cursor.epoch = Some(epoch);
    Ok(())
}

/// Loads the entries of the last history age (by Redis's clock) into history, oldest first,
/// each with its age. Returns how many were taken.
///
/// Read newest first with the size-aware read, and only as far back as the history keeps:
/// the age, the entries and the bytes of the history limits, so a stream holding large or
/// many entries costs this server no more than its history would; an oversized entry is
/// skipped unread.
async fn hydrate(
    shared: &Shared,
    state: &ServerState,
    conn: &mut MultiplexedConnection,
    cursor: &mut ReadState,
) -> redis::RedisResult<u64> {
    let (seconds, micros): (u64, u64) =
        within(CALL_TIMEOUT, redis::cmd("TIME").query_async(&mut *conn)).await?;
    let now_ms = seconds * 1000 + micros / 1000;
    let age_limit = shared.history_age.as_millis() as u64;
    let mut kept: Vec<Item> = Vec::new();
    let mut entries = 0usize;
    let mut bytes = 0usize;
    let mut last_id: Option<String> = None;
    let mut before: Option<String> = None;
    'pages: loop {
        let page = read_page(
            conn,
            &shared.stream_key,
            Some(shared.marks()),
            Direction::Reverse,
            before.as_deref(),
            cursor.entry_limit,
        )
        .await?;
        if page.is_empty() {
            break;
        }
        for item in page {
            last_id.get_or_insert_with(|| item.id().to_string());
            before = Some(item.id().to_string());
            if now_ms.saturating_sub(id_millis(item.id())) > age_limit {
                break 'pages;
            }
            if let Item::Entry(entry) = &item {
                entries += 1;
                bytes += entry
                    .fields
                    .iter()
                    .map(|(n, v)| n.len() + v.len())
                    .sum::<usize>();
                if entries > shared.max_entries || bytes > shared.max_bytes {
                    break 'pages;
                }
            }
            kept.push(item);
        }
    }
    let mut taken = 0u64;
    for item in kept.into_iter().rev() {
        let age = now_ms.saturating_sub(id_millis(item.id()));
        if take(shared, state, cursor, item, age).await {
            taken += 1;
        }
    }
    shared.metrics.broker_hydrated_entries.inc_by(taken);
    cursor.last_id = Some(last_id.unwrap_or_else(|| "0-0".to_string()));
    Ok(taken)
}

/// Takes one item in; returns whether it was another server's message, delivered here.
async fn take(
    shared: &Shared,
    state: &ServerState,
    cursor: &mut ReadState,
    item: Item,
    age_ms: u64,
) -> bool {
    let entry: StreamEntry = match item {
        Item::Entry(entry) => entry,
        Item::Oversized { id, bytes } => {
            let detail = format!(
                "{bytes} bytes, over the {} an admin POST can carry",
                cursor.entry_limit
            );
            cursor.skipped.skip(shared, Skip::Oversized, &id, &detail);
            return false;
        }
    };
    let fields = Fields::of(&entry.fields);
    if fields.fingerprint == Some(shared.fingerprint.as_bytes()) {
        if let Some(seq) = fields.seq {
            saw_own(shared, seq);
        }
        if !fields.probe {
            shared.metrics.broker_own_skipped.inc();
        }
        return false;
    }
    if let (Some(fingerprint), Some(seq)) = (fields.fingerprint, fields.seq) {
        if !cursor.origins.first_time(fingerprint, seq) {
            // The same entry added twice (an XADD retried after its answer was lost).
            return false;
        }
    }
    if fields.probe {
        // Another server's probe (servers of an earlier version add them to the stream).
        return false;
    }
    let (Some(instance), Some(message)) = (fields.instance, fields.message) else {
        let detail = "no instance or message field";
        cursor
            .skipped
            .skip(shared, Skip::NoMessage, &entry.id, detail);
        return false;
    };
    let instance = String::from_utf8_lossy(instance);
    match ingest_relayed(state, &instance, message, age_ms).await {
        Ok(()) => true,
        Err(NotTaken::AlreadySeen) => false,
        Err(NotTaken::Malformed) => {
            let detail = "the message is not a JSON object";
            cursor
                .skipped
                .skip(shared, Skip::Malformed, &entry.id, detail);
            false
        }
        Err(NotTaken::InstanceName) => {
            let detail = "the instance name is over the limit";
            cursor
                .skipped
                .skip(shared, Skip::InstanceName, &entry.id, detail);
            false
        }
    }
}

/// Our own entry `seq` came back: the reader makes progress. It is up once it has read back
/// the entry it was expected to (or any, when none is expected). A `seq` above every one
/// the publisher sent is not ours (a forged entry): it must not stand for ours.
fn saw_own(shared: &Shared, seq: u64) {
    if seq > shared.own_sent.load(Ordering::Acquire) {
        return;
    }
    shared.own_seen.fetch_max(seq, Ordering::AcqRel);
    let caught_up = {
        let mut unseen = lock(&shared.unseen_own);
        if unseen.is_some_and(|(expected, _)| expected <= seq) {
            *unseen = None;
        }
        unseen.is_none()
    };
    if caught_up {
        shared.mark_up(&shared.reader_up, "reader");
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doorbell() -> Doorbell {
        let doorbell = Doorbell {
            stream_key: b"p:stream".to_vec(),
            probe_key: b"p:probe:f".to_vec(),
            probe: AtomicBool::new(true),
            stream: AtomicBool::new(true),
            rung: Notify::new(),
        };
        assert_eq!(doorbell.take(), (true, true), "a new connection reads both");
        doorbell
    }

    fn invalidate(keys: &[&str]) -> PushInfo {
        PushInfo {
            kind: PushKind::Invalidate,
            data: vec![Value::Array(
                keys.iter()
                    .map(|key| Value::BulkString(key.as_bytes().to_vec()))
                    .collect(),
            )],
        }
    }

    #[test]
    fn the_doorbell_rings_for_the_keys_pushed() {
        let bell = doorbell();
        bell.ring(invalidate(&["p:stream"]));
        assert_eq!(bell.take(), (false, true));
        bell.ring(invalidate(&["p:probe:f"]));
        assert_eq!(bell.take(), (true, false));
        assert_eq!(bell.take(), (false, false), "taken once");

        // Another key a script read (the marks): nothing to read.
        let bell = doorbell();
        bell.ring(invalidate(&["p:oversized"]));
        assert_eq!(bell.take(), (false, false));

        // A flush (no key names) or the connection's end: read both.
        for push in [
            PushInfo {
                kind: PushKind::Invalidate,
                data: vec![Value::Nil],
            },
            PushInfo {
                kind: PushKind::Disconnection,
                data: vec![],
            },
        ] {
            let bell = doorbell();
            bell.ring(push);
            assert_eq!(bell.take(), (true, true));
        }
    }
}
