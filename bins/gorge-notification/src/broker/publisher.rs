//! The publisher: one task, one connection, `XADD`s the queued messages in order.
//!
//! A message whose `XADD` failed or timed out is retried on a new connection (after a jittered
//! backoff) until it is older than the history age; meanwhile the queue fills and the admin
//! port drops and counts what does not fit. A retried `XADD` may have been applied already
//! (Redis paused, answer lost): every entry carries this server's fingerprint and a sequence
//! number, and readers keep the first of each. With nothing to publish for
//! [`PROBE_INTERVAL`](super::PROBE_INTERVAL) a probe entry is added, for the reader to expect.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tokio::sync::mpsc;

use super::{
    lock, within, Backoff, Outgoing, Shared, CALL_TIMEOUT, FIELD_FINGERPRINT, FIELD_INSTANCE,
    FIELD_MESSAGE, FIELD_PROBE, FIELD_SEQ, PROBE_INTERVAL,
};

/// How often the stream is trimmed by age (it is trimmed by entries on every `XADD`).
const TRIM_EVERY: Duration = Duration::from_secs(10);

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
    // A message whose XADD failed, with its sequence number: next to go.
    let mut retry: Option<(u64, Outgoing)> = None;
    let mut last_trim: Option<Instant> = None;
    // The first probe goes at once: it connects, and shows `broker_up` from the start.
    let mut idle_for = Duration::ZERO;
    loop {
        let (this_seq, item) = match retry.take() {
            Some((this_seq, outgoing)) => (this_seq, Item::Message(outgoing)),
            None => {
                let next = tokio::time::timeout(idle_for, jobs.recv()).await;
                idle_for = PROBE_INTERVAL;
                let item = match next {
                    Ok(Some(outgoing)) => Item::Message(outgoing),
                    Ok(None) => return,
                    Err(_) => Item::Probe,
                };
                seq += 1;
                (seq, item)
            }
        };
        if let Item::Message(outgoing) = &item {
            if outgoing.queued_at.elapsed() > shared.history_age {
                // Published now it would reach browsers as new although a replay would no
                // longer return it; it is out of the window the contract covers.
                shared.metrics.broker_dropped.with(["expired"]).inc();
                shared.message_done();
                continue;
            }
        }
        let connection = match conn.as_mut() {
            Some(connection) => connection,
            None => match shared.connect(CALL_TIMEOUT).await {
                Ok(connection) => {
                    if connected_before {
                        shared.metrics.broker_reconnects.inc();
                    }
                    connected_before = true;
                    conn.insert(connection)
                }
                Err(error) => {
                    shared.mark_down(&shared.publisher_up, "publisher", &error);
                    if let Item::Message(outgoing) = item {
                        retry = Some((this_seq, outgoing));
                    }
                    backoff.wait().await;
                    continue;
                }
            },
        };
        match xadd(&shared, connection, this_seq, &item).await {
            Ok(()) => {
                backoff.reset();
                shared.mark_up(&shared.publisher_up, "publisher");
                if matches!(item, Item::Message(_)) {
                    shared.metrics.broker_published.inc();
                    shared.message_done();
                }
                expect_back(&shared, this_seq);
                if last_trim.is_none_or(|at| at.elapsed() >= TRIM_EVERY) {
                    last_trim = Some(Instant::now());
                    // A failure shows on the next XADD; trimming is only about space.
                    let _ = trim_by_age(&shared, connection).await;
                }
            }
            Err(error) => {
                shared.metrics.broker_failed.inc();
                shared.mark_down(&shared.publisher_up, "publisher", &error);
                conn = None;
                if let Item::Message(outgoing) = item {
                    retry = Some((this_seq, outgoing));
                }
                backoff.wait().await;
            }
        }
    }
}

/// `XADD <stream> MAXLEN ~ <entries> * fingerprint F seq N [instance I message M | probe 1]`.
async fn xadd(
    shared: &Shared,
    conn: &mut MultiplexedConnection,
    seq: u64,
    item: &Item,
) -> redis::RedisResult<()> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(&shared.stream_key)
        .arg("MAXLEN")
        .arg("~")
        .arg(shared.max_entries)
        .arg("*")
        .arg(FIELD_FINGERPRINT)
        .arg(&shared.fingerprint)
        .arg(FIELD_SEQ)
        .arg(seq);
    match item {
        Item::Message(outgoing) => {
            cmd.arg(FIELD_INSTANCE)
                .arg(&outgoing.instance)
                .arg(FIELD_MESSAGE)
                .arg(&outgoing.message[..]);
        }
        Item::Probe => {
            cmd.arg(FIELD_PROBE).arg(1);
        }
    }
    within(CALL_TIMEOUT, cmd.query_async::<redis::Value>(conn))
        .await
        .map(drop)
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
