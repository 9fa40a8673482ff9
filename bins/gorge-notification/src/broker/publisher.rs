//! The publisher: one task, one connection, `XADD`s the queued messages in order.
//!
//! Whatever is queued when the publisher gets to it goes in one pipeline (one round trip, up
//! to [`BATCH_ENTRIES`] entries and [`BATCH_BYTES`]): one `XADD` per round trip would cap the
//! rate at one message per round trip, and a round trip is what a loaded machine or a remote
//! Redis makes long; messages then wait in the queue behind each other, which is the
//! cross-node latency of every one of them.
//!
//! A batch whose pipeline failed or timed out is retried whole on a new connection (after a
//! jittered backoff), each message until it is older than the history age; meanwhile the
//! queue fills and the admin port drops and counts what does not fit. A retried `XADD` may
//! have been applied already (Redis paused, answer lost): every entry carries this server's
//! fingerprint and a sequence number, and readers keep the first of each. With nothing to
//! publish for [`PROBE_INTERVAL`](super::PROBE_INTERVAL) a probe entry is added, for the
//! reader to expect: to this server's probe key, trimmed to that one entry and expiring, not
//! to the stream. One probe per idle server per second in the stream would take the
//! history's places: past about 68 idle servers the 4 096 entries held less than the 60 s
//! a starting server loads.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use tokio::sync::mpsc;

use super::{
    lock, within, Backoff, Outgoing, Shared, CALL_TIMEOUT, FIELD_FINGERPRINT, FIELD_INSTANCE,
    FIELD_MESSAGE, FIELD_PROBE, FIELD_SEQ, PROBE_INTERVAL, PROBE_KEY_TTL,
};

/// How often the stream is trimmed by age (it is trimmed by entries on every `XADD`).
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Entries one pipeline adds at most.
pub(super) const BATCH_ENTRIES: usize = 256;

/// Message bytes one pipeline carries at most (a single larger message goes alone).
const BATCH_BYTES: usize = 1 << 20;

/// What one `XADD` adds.
enum Item {
    Message(Outgoing),
    Probe,
}

pub(super) async fn run(shared: Arc<Shared>, mut jobs: mpsc::Receiver<Outgoing>) {
    let mut conn: Option<MultiplexedConnection> = None;
    let mut connected_before = false;
    let mut backoff = Backoff::new();
    let mut seq = 0u64;
    // Entries whose pipeline failed, with their sequence numbers: next to go.
    let mut batch: Vec<(u64, Item)> = Vec::new();
    let mut last_trim: Option<Instant> = None;
    // The first probe goes at once: it connects, and shows `broker_up` from the start.
    let mut idle_for = Duration::ZERO;
    loop {
        if batch.is_empty() {
            let next = tokio::time::timeout(idle_for, jobs.recv()).await;
            idle_for = PROBE_INTERVAL;
            match next {
                Ok(Some(outgoing)) => {
                    let mut bytes = outgoing.message.len();
                    seq += 1;
                    batch.push((seq, Item::Message(outgoing)));
                    while batch.len() < BATCH_ENTRIES && bytes < BATCH_BYTES {
                        let Ok(outgoing) = jobs.try_recv() else { break };
                        bytes += outgoing.message.len();
                        seq += 1;
                        batch.push((seq, Item::Message(outgoing)));
                    }
                }
                Ok(None) => return,
                Err(_) => {
                    seq += 1;
                    batch.push((seq, Item::Probe));
                }
            }
        }
        batch.retain(|(_, item)| match item {
            // Published now it would reach browsers as new although a replay would no
            // longer return it; it is out of the window the contract covers.
            Item::Message(outgoing) if outgoing.queued_at.elapsed() > shared.history_age => {
                shared.metrics.broker_dropped.with(["expired"]).inc();
                shared.message_done();
                false
            }
            _ => true,
        });
        let Some(&(last_seq, _)) = batch.last() else {
            continue;
        };
        let connection = match conn.as_mut() {
            Some(connection) => connection,
            None => match shared
                .connect(&shared.client, AsyncConnectionConfig::new())
                .await
            {
                Ok(connection) => {
                    if connected_before {
                        shared.metrics.broker_reconnects.inc();
                    }
                    connected_before = true;
                    conn.insert(connection)
                }
                Err(error) => {
                    shared.mark_down(&shared.publisher_up, "publisher", &error);
                    batch.retain(|(_, item)| matches!(item, Item::Message(_)));
                    backoff.wait().await;
                    continue;
                }
            },
        };
        shared.own_sent.fetch_max(last_seq, Ordering::AcqRel);
        match xadd(&shared, connection, &batch).await {
            Ok(()) => {
                backoff.reset();
                shared.mark_up(&shared.publisher_up, "publisher");
                for (_, item) in batch.drain(..) {
                    if matches!(item, Item::Message(_)) {
                        shared.metrics.broker_published.inc();
                        shared.message_done();
                    }
                }
                expect_back(&shared, last_seq);
                if last_trim.is_none_or(|at| at.elapsed() >= TRIM_EVERY) {
                    last_trim = Some(Instant::now());
                    // A failure shows on the next XADD; trimming is only about space.
                    let _ = trim_by_age(&shared, connection).await;
                }
            }
            Err(error) => {
                shared.metrics.broker_failed.inc_by(batch.len() as u64);
                shared.mark_down(&shared.publisher_up, "publisher", &error);
                conn = None;
                // Messages go again; a probe would only be a stale one.
                batch.retain(|(_, item)| matches!(item, Item::Message(_)));
                backoff.wait().await;
            }
        }
    }
}

/// One pipeline, an entry after the other: `XADD <stream> MAXLEN ~ <entries> * fingerprint
/// F seq N instance I message M` for a message; for a probe `XADD <probe key> MAXLEN 1 *
/// fingerprint F seq N probe 1` and `PEXPIRE <probe key>`.
async fn xadd(
    shared: &Shared,
    conn: &mut MultiplexedConnection,
    batch: &[(u64, Item)],
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for (seq, item) in batch {
        let cmd = pipe.cmd("XADD");
        match item {
            Item::Message(_) => cmd
                .arg(&shared.stream_key)
                .arg("MAXLEN")
                .arg("~")
                .arg(shared.max_entries),
            Item::Probe => cmd.arg(&shared.probe_key).arg("MAXLEN").arg(1),
        };
        cmd.arg("*")
            .arg(FIELD_FINGERPRINT)
            .arg(&shared.fingerprint)
            .arg(FIELD_SEQ)
            .arg(*seq);
        match item {
            Item::Message(outgoing) => {
                cmd.arg(FIELD_INSTANCE)
                    .arg(&outgoing.instance)
                    .arg(FIELD_MESSAGE)
                    .arg(&outgoing.message[..])
                    .ignore();
            }
            Item::Probe => {
                cmd.arg(FIELD_PROBE).arg(1).ignore();
                pipe.cmd("PEXPIRE")
                    .arg(&shared.probe_key)
                    .arg(PROBE_KEY_TTL.as_millis() as u64)
                    .ignore();
            }
        }
    }
    within(CALL_TIMEOUT, pipe.query_async::<()>(conn)).await
}

/// Tells the reader to expect our entry `seq` back, unless it has seen it already.
fn expect_back(shared: &Shared, seq: u64) {
    let mut unseen = lock(&shared.unseen_own);
    if unseen.is_none() && shared.own_seen.load(Ordering::Acquire) < seq {
        *unseen = Some((seq, Instant::now()));
    }
}

/// Drops entries older than the history age, by Redis's clock (`TIME`), so the stream holds
/// what a starting server loads and little more.
async fn trim_by_age(shared: &Shared, conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    let (seconds, micros): (u64, u64) =
        within(CALL_TIMEOUT, redis::cmd("TIME").query_async(conn)).await?;
    let now_ms = seconds * 1000 + micros / 1000;
    let oldest = now_ms.saturating_sub(shared.history_age.as_millis() as u64);
    within(
        CALL_TIMEOUT,
        redis::cmd("XTRIM")
            .arg(&shared.stream_key)
            .arg("MINID")
            .arg("~")
            .arg(oldest)
            .query_async::<redis::Value>(conn),
    )
    .await
    .map(drop)
}
