//! The reader: at start it loads the last `HISTORY_AGE_MS` of the stream into history and
//! opens the history gate (`/readyz`, `replay`); then it reads the stream from the last id on
//! its own connection (`XREAD BLOCK`), skips our own entries and takes the others in as
//! relayed messages. On any failure it reconnects with a jittered backoff and resumes from
//! the last id it read, so messages arrive late rather than never.
//!
//! On every connection it compares the epoch key with the one it saw before: a different one
//! means Redis restarted empty (the stream it resumed from is gone), counted and logged, and
//! reading starts again from the new stream's beginning. It also replaces a connection that
//! does not deliver our own entries back within [`PROBE_TIMEOUT`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::{
    lock, within, Backoff, ReaderLink, Shared, BLOCK, CALL_TIMEOUT, FIELD_FINGERPRINT,
    FIELD_INSTANCE, FIELD_MESSAGE, FIELD_PROBE, FIELD_SEQ, HYDRATE_WAIT, PROBE_TIMEOUT,
};
use crate::events;
use crate::ingest::{ingest_relayed, NotTaken};
use crate::state::ServerState;
use gorge_service::emit;

/// Entries one `XREAD` returns at most.
const READ_COUNT: usize = 256;

/// Origins (other servers' fingerprints) whose last sequence number is remembered; more are
/// forgotten oldest first. Far more than any cluster has servers, restarts included.
const MAX_ORIGINS: usize = 1024;

/// What the reader keeps across connections.
struct ReadState {
    /// The id to read after; `None` until the history was loaded.
    last_id: Option<String>,
    /// The epoch key's value on the last connection.
    epoch: Option<String>,
    origins: Origins,
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
    let mut cursor = ReadState {
        last_id: None,
        epoch: None,
        origins: Origins::default(),
    };
    let mut backoff = Backoff::new();
    let mut connected_before = false;
    loop {
        let error = match shared.connect(BLOCK + CALL_TIMEOUT).await {
            Ok(mut conn) => {
                if connected_before {
                    shared.metrics.broker_reconnects.inc();
                }
                connected_before = true;
                let error = session(
                    &shared,
                    &state,
                    &mut conn,
                    &mut cursor,
                    started,
                    &mut backoff,
                )
                .await;
                error
            }
            Err(error) => error,
        };
        shared.mark_down(&shared.reader_up, "reader", &error);
        backoff.wait().await;
    }
}

/// One connection's life: epoch check, history if not loaded yet, then reading until an
/// error, which it returns.
async fn session(
    shared: &Shared,
    state: &ServerState,
    conn: &mut MultiplexedConnection,
    cursor: &mut ReadState,
    started: Instant,
    backoff: &mut Backoff,
) -> redis::RedisError {
    if let Err(error) = check_epoch(shared, conn, cursor).await {
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
    shared.mark_up(&shared.reader_up, "reader");
    backoff.reset();
    loop {
        let last_id = cursor.last_id.clone().unwrap_or_else(|| "0-0".into());
        let mut xread = redis::cmd("XREAD");
        xread
            .arg("COUNT")
            .arg(READ_COUNT)
            .arg("BLOCK")
            .arg(BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&shared.stream_key)
            .arg(&last_id);
        let read = within(BLOCK + CALL_TIMEOUT, xread.query_async::<Value>(conn));
        let reply = tokio::select! {
            reply = read => reply,
            seq = probe_overdue(shared) => {
                shared.metrics.broker_probe_timeouts.inc();
                emit!(shared.log, events::NOTIFY_BROKER_PROBE_TIMEOUT;
                    "seq" => seq, "timeout_ms" => PROBE_TIMEOUT.as_millis() as u64);
                return super::timed_out();
            }
        };
        let entries = match reply {
            Ok(value) => read_reply(value),
            Err(error) => return error,
        };
        if entries.is_empty() {
            shared.metrics.broker_lag_seconds.set(0.0);
        }
        let now = wall_ms();
        for entry in entries {
            let id_ms = id_millis(&entry.id);
            cursor.last_id = Some(entry.id.clone());
            if take(shared, state, cursor, entry, 0).await {
                shared.metrics.broker_received.inc();
                let lag = now.saturating_sub(id_ms) as f64 / 1000.0;
                shared.metrics.broker_lag_seconds.set(lag);
            }
        }
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
/// Read newest first in pages of [`READ_COUNT`], and only as far back as the history keeps:
/// the age, the entries and the bytes of the history limits, so a stream holding large or
/// many entries costs this server no more than its history would.
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
    let mut kept: Vec<StreamEntry> = Vec::new();
    let mut bytes = 0usize;
    let mut last_id: Option<String> = None;
    let mut end = "+".to_string();
    'pages: loop {
        let value = within(
            CALL_TIMEOUT,
            redis::cmd("XREVRANGE")
                .arg(&shared.stream_key)
                .arg(&end)
                .arg("-")
                .arg("COUNT")
                .arg(READ_COUNT)
                .query_async::<Value>(&mut *conn),
        )
        .await?;
        let page = entries_of(value);
        let full = page.len() == READ_COUNT;
        for entry in page {
            last_id.get_or_insert_with(|| entry.id.clone());
            end = format!("({}", entry.id);
            bytes += entry
                .fields
                .iter()
                .map(|(n, v)| n.len() + v.len())
                .sum::<usize>();
            if now_ms.saturating_sub(id_millis(&entry.id)) > age_limit
                || kept.len() >= shared.max_entries
                || bytes > shared.max_bytes
            {
                break 'pages;
            }
            kept.push(entry);
        }
        if !full {
            break;
        }
    }
    let mut taken = 0u64;
    for entry in kept.into_iter().rev() {
        let age = now_ms.saturating_sub(id_millis(&entry.id));
        if take(shared, state, cursor, entry, age).await {
            taken += 1;
        }
    }
    shared.metrics.broker_hydrated_entries.inc_by(taken);
    cursor.last_id = Some(last_id.unwrap_or_else(|| "0-0".to_string()));
    Ok(taken)
}

/// Takes one entry in; returns whether it was another server's message, delivered here.
async fn take(
    shared: &Shared,
    state: &ServerState,
    cursor: &mut ReadState,
    entry: StreamEntry,
    age_ms: u64,
) -> bool {
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
        return false;
    }
    let (Some(instance), Some(message)) = (fields.instance, fields.message) else {
        emit!(shared.log, events::NOTIFY_BROKER_BAD_ENTRY;
            "id" => &entry.id, "reason" => "no instance or message field");
        return false;
    };
    let instance = String::from_utf8_lossy(instance);
    match ingest_relayed(state, &instance, message, age_ms).await {
        Ok(()) => true,
        Err(NotTaken::AlreadySeen) => false,
        Err(why) => {
            emit!(shared.log, events::NOTIFY_BROKER_BAD_ENTRY;
                "id" => &entry.id, "reason" => format!("{why:?}"));
            false
        }
    }
}

/// Our own entry `seq` came back: the connection delivers.
fn saw_own(shared: &Shared, seq: u64) {
    shared.own_seen.fetch_max(seq, Ordering::AcqRel);
    let mut unseen = lock(&shared.unseen_own);
    if unseen.is_some_and(|(expected, _)| expected <= seq) {
        *unseen = None;
    }
}

/// Completes (with its seq) once one of our entries has been acknowledged by Redis for longer
/// than [`PROBE_TIMEOUT`] without coming back to this reader; it is then forgotten, so the
/// next connection gets its own chance.
async fn probe_overdue(shared: &Shared) -> u64 {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut unseen = lock(&shared.unseen_own);
        if let Some((seq, since)) = *unseen {
            if since.elapsed() > PROBE_TIMEOUT {
                *unseen = None;
                return seq;
            }
        }
    }
}

/// The last sequence number seen from each other server, to keep the first copy of an entry
/// added twice.
#[derive(Default)]
struct Origins {
    last: HashMap<Vec<u8>, u64>,
    order: VecDeque<Vec<u8>>,
}

impl Origins {
    fn first_time(&mut self, fingerprint: &[u8], seq: u64) -> bool {
        if let Some(last) = self.last.get_mut(fingerprint) {
            if seq <= *last {
                return false;
            }
            *last = seq;
            return true;
        }
        if self.order.len() >= MAX_ORIGINS {
            if let Some(oldest) = self.order.pop_front() {
                self.last.remove(&oldest);
            }
        }
        self.order.push_back(fingerprint.to_vec());
        self.last.insert(fingerprint.to_vec(), seq);
        true
    }
}

/// One stream entry: its id and its field/value pairs.
struct StreamEntry {
    id: String,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The fields this service writes, borrowed from an entry.
#[derive(Default)]
struct Fields<'a> {
    fingerprint: Option<&'a [u8]>,
    seq: Option<u64>,
    instance: Option<&'a [u8]>,
    message: Option<&'a [u8]>,
    probe: bool,
}

impl<'a> Fields<'a> {
    fn of(pairs: &'a [(Vec<u8>, Vec<u8>)]) -> Self {
        let mut fields = Fields::default();
        for (name, value) in pairs {
            match std::str::from_utf8(name) {
                Ok(FIELD_FINGERPRINT) => fields.fingerprint = Some(value),
                Ok(FIELD_SEQ) => {
                    fields.seq = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok())
                }
                Ok(FIELD_INSTANCE) => fields.instance = Some(value),
                Ok(FIELD_MESSAGE) => fields.message = Some(value),
                Ok(FIELD_PROBE) => fields.probe = true,
                _ => {}
            }
        }
        fields
    }
}

/// The entries of an `XREAD` reply: nil, or `[[stream, [entry, …]]]` (RESP2) or a map of
/// stream to entries (RESP3).
fn read_reply(value: Value) -> Vec<StreamEntry> {
    match value {
        Value::Array(streams) => streams
            .into_iter()
            .flat_map(|stream| match stream {
                Value::Array(mut pair) if pair.len() == 2 => entries_of(pair.remove(1)),
                _ => Vec::new(),
            })
            .collect(),
        Value::Map(streams) => streams
            .into_iter()
            .flat_map(|(_, entries)| entries_of(entries))
            .collect(),
        _ => Vec::new(),
    }
}

/// The entries of an `XRANGE`/`XREVRANGE` reply: `[[id, [field, value, …]], …]`.
fn entries_of(value: Value) -> Vec<StreamEntry> {
    let Value::Array(items) = value else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| {
            let Value::Array(mut parts) = item else {
                return None;
            };
            if parts.len() != 2 {
                return None;
            }
            let fields = parts.pop()?;
            let id = bytes_of(parts.pop()?)?;
            let Value::Array(flat) = fields else {
                return None;
            };
            let mut values = flat.into_iter().filter_map(bytes_of);
            let mut fields = Vec::new();
            while let (Some(name), Some(value)) = (values.next(), values.next()) {
                fields.push((name, value));
            }
            Some(StreamEntry {
                id: String::from_utf8(id).ok()?,
                fields,
            })
        })
        .collect()
}

fn bytes_of(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        _ => None,
    }
}

/// The millisecond part of a stream id (`<ms>-<seq>`).
fn id_millis(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn xread_replies_parse_into_entries() {
        let entry = |id: &str, fields: &[&str]| {
            Value::Array(vec![
                bulk(id),
                Value::Array(fields.iter().map(|f| bulk(f)).collect()),
            ])
        };
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("s"),
            Value::Array(vec![
                entry("1-0", &["fingerprint", "a", "seq", "7", "probe", "1"]),
                entry("2-5", &["instance", "x", "message", "{}"]),
            ]),
        ])]);
        let entries = read_reply(reply);
        assert_eq!(entries.len(), 2);
        let first = Fields::of(&entries[0].fields);
        assert_eq!(
            (first.fingerprint, first.seq, first.probe),
            (Some(&b"a"[..]), Some(7), true)
        );
        let second = Fields::of(&entries[1].fields);
        assert_eq!(entries[1].id, "2-5");
        assert_eq!(
            (second.instance, second.message, second.probe),
            (Some(&b"x"[..]), Some(&b"{}"[..]), false)
        );
        assert!(read_reply(Value::Nil).is_empty());
        assert_eq!(id_millis("1733300000123-4"), 1_733_300_000_123);
    }

    #[test]
    fn an_entry_added_twice_is_taken_once() {
        let mut origins = Origins::default();
        assert!(origins.first_time(b"a", 1));
        assert!(origins.first_time(b"b", 1));
        assert!(!origins.first_time(b"a", 1));
        assert!(origins.first_time(b"a", 2));
        assert!(!origins.first_time(b"a", 2));
    }
}
