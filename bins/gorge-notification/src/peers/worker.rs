//! One peer's relay worker: a dedicated OS thread that drains the peer's ordered queue and
//! POSTs each message to the peer's admin port with ureq.
//!
//! ureq blocks, so it runs here and never on the Tokio runtime; a slow or dead peer stalls only
//! its own thread and queue. Redirects are not followed (an admin port that redirects is
//! misconfigured, and following it would send messages somewhere nobody listed).
//!
//! Nothing is lost to a restart of the peer (docs/notification.md, "Restarts"):
//! - a POST whose connection was closed before any answer came (the peer's old process shut
//!   a kept-alive connection as it began draining) is sent again at once on a new connection,
//!   which reaches whatever listens on the port now;
//! - while the peer cannot be reached (refused, reset, timed out, 5xx) the message at the head
//!   of the queue is kept and retried with a capped backoff, later ones wait behind it in the
//!   bounded queue (full → dropped and counted), and it is given up only once it is older
//!   than the history age (it could no longer be replayed anyway), during the drain's
//!   discard, or when the peer is removed. A 4xx or a receipt that is not one is final.
//!
//! The receiving side keeps a message once by its `uniqueID`, so a retry of a POST the peer
//! did take in (it answered too late) is not delivered twice.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;

use super::metrics::PeerCounters;
use super::Shared;
use crate::events;
use gorge_service::emit;

/// A receipt larger than this is not a receipt; the bound keeps a confused peer from making
/// us buffer an arbitrary body.
const RECEIPT_LIMIT: u64 = 4096;

/// Log reasons are cut to this many bytes so one line stays one short line.
const REASON_LIMIT: usize = 200;

/// One message for one peer. Cloning shares the body and the encoded instance.
#[derive(Clone, Debug)]
pub(super) struct RelayJob {
    /// The instance name, already percent-encoded for the query string.
    pub(super) instance_query: Arc<str>,
    pub(super) body: Bytes,
    /// When it was queued: past the history age it is not worth sending.
    pub(super) queued_at: Instant,
}

/// The first pause before retrying an unreachable peer; doubled per failure up to
/// [`MAX_BACKOFF`], so a peer that is back is reached within that long.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What the relay and the worker of one peer share.
pub(super) struct PeerLink {
    /// `host:port`, the metric label and log field.
    pub(super) address: String,
    /// `{proto}://{host}:{port}/`, the admin endpoint messages are posted to.
    pub(super) base_url: String,
    pub(super) counters: PeerCounters,
    /// Set when the peer is removed or the drain deadline passed: jobs from then on are
    /// counted as dropped instead of sent.
    discard: AtomicBool,
    /// From the peer's last receipt; compared across peers to spot one server listed twice.
    pub(super) fingerprint: Mutex<Option<String>>,
}

impl PeerLink {
    pub(super) fn new(address: String, base_url: String, counters: PeerCounters) -> Self {
        PeerLink {
            address,
            base_url,
            counters,
            discard: AtomicBool::new(false),
            fingerprint: Mutex::new(None),
        }
    }

    pub(super) fn discard_remaining(&self) {
        self.discard.store(true, Ordering::Relaxed);
    }
}

#[derive(Deserialize)]
struct Receipt {
    fingerprint: String,
}

/// The peer's state as last observed; logs are written only when it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Health {
    Unknown,
    Up { fingerprint: String },
    Down,
}

/// Runs until the peer is removed (its queue closed and empty) or turns out to be this very
/// server. Every job ends in `Shared::job_done`, however it ends.
pub(super) fn run(shared: Arc<Shared>, link: Arc<PeerLink>, jobs: Receiver<RelayJob>) {
    let mut health = Health::Unknown;
    while let Ok(job) = jobs.recv() {
        let is_self = deliver(&shared, &link, &mut health, &job);
        shared.job_done();
        if is_self {
            // The address is us. Once removed from the peer set nothing more is queued
            // here; what already was would only reach ourselves again.
            shared.found_self(&link);
            for _ in jobs.iter() {
                shared.job_done();
            }
            return;
        }
    }
}

/// Sends one job until it is delivered, refused for good, too old or discarded; true if the
/// receipt carried our own fingerprint.
fn deliver(shared: &Shared, link: &PeerLink, health: &mut Health, job: &RelayJob) -> bool {
    let mut backoff = FIRST_BACKOFF;
    loop {
        if link.discard.load(Ordering::Relaxed) {
            link.counters.dropped.inc();
            return false;
        }
        match send(shared, link, health, job) {
            Sent::Delivered => return false,
            Sent::IsSelf => return true,
            Sent::Refused => return false,
            Sent::Unreachable => {}
        }
        if job.queued_at.elapsed() + backoff > shared.keep_for {
            link.counters.expired.inc();
            return false;
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// What one attempt came to.
enum Sent {
    Delivered,
    IsSelf,
    /// A final answer (4xx, a redirect, a body that is not a receipt): not retried.
    Refused,
    /// Refused, reset, timed out or 5xx: kept and retried.
    Unreachable,
}

/// Sends one job once (plus one immediate retry when the connection closed before any
/// answer) and records the outcome.
fn send(shared: &Shared, link: &PeerLink, health: &mut Health, job: &RelayJob) -> Sent {
    let url = format!("{}?instance={}", link.base_url, job.instance_query);
    let started = std::time::Instant::now();
    let mut result = post(&shared.agent, &url, &job.body);
    if matches!(result, Err(Failure::ClosedUnanswered(_))) {
        // Most likely a kept-alive connection the peer's old process closed as it began
        // draining: a new connection reaches the process that listens there now.
        link.counters.reconnected.inc();
        result = post(&shared.agent, &url, &job.body);
    }
    let (observed, sent) = match result {
        Ok(fingerprint) if fingerprint == shared.own_fingerprint => return Sent::IsSelf,
        Ok(fingerprint) => {
            link.counters.ok.inc();
            emit!(shared.log, events::NOTIFY_PEER_RELAYED; "peer" => &link.address,
                "instance" => &*job.instance_query, "bytes" => job.body.len(),
                "elapsed_ms" => started.elapsed().as_millis() as u64);
            (Health::Up { fingerprint }, Sent::Delivered)
        }
        Err(failure) => {
            link.counters.failed.inc();
            let (reason, sent) = match failure {
                Failure::Final(reason) => (reason, Sent::Refused),
                Failure::Transient(reason) | Failure::ClosedUnanswered(reason) => {
                    (reason, Sent::Unreachable)
                }
            };
            emit!(shared.log, events::NOTIFY_PEER_RELAY_FAILED; "peer" => &link.address,
                "reason" => &reason);
            if *health != Health::Down {
                emit!(shared.log, events::NOTIFY_PEER_DOWN; "peer" => &link.address, "reason" => reason);
            }
            (Health::Down, sent)
        }
    };
    if let Health::Up { fingerprint } = &observed {
        if *health != observed {
            // Also logged when the fingerprint changes: the peer restarted.
            emit!(shared.log, events::NOTIFY_PEER_UP; "peer" => &link.address, "fingerprint" => fingerprint);
            shared.learned_fingerprint(link, fingerprint);
        }
    }
    link.counters
        .up
        .set(i64::from(matches!(observed, Health::Up { .. })));
    *health = observed;
    sent
}

/// Why a POST failed, with a short reason for the log.
#[derive(Debug)]
enum Failure {
    /// The connection closed (EOF, reset, broken pipe) before any answer.
    ClosedUnanswered(String),
    /// Worth retrying later: refused, timed out, 5xx.
    Transient(String),
    /// Retrying would get the same answer.
    Final(String),
}

/// POSTs one message and returns the fingerprint from the peer's receipt.
fn post(agent: &ureq::Agent, url: &str, body: &[u8]) -> Result<String, Failure> {
    let mut response = agent
        .post(url)
        .header("Content-Type", "application/json")
        .send(body)
        .map_err(classify)?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(if (300..400).contains(&status) {
            Failure::Final(format!("HTTP status {status} (redirects are not followed)"))
        } else if status >= 500 {
            Failure::Transient(format!("HTTP status {status}"))
        } else {
            Failure::Final(format!("HTTP status {status}"))
        });
    }
    let text = response
        .body_mut()
        .with_config()
        .limit(RECEIPT_LIMIT)
        .read_to_string()
        .map_err(|err| Failure::Transient(short_reason(format!("reading receipt: {err}"))))?;
    serde_json::from_str::<Receipt>(&text)
        .map(|receipt| receipt.fingerprint)
        .map_err(|_| Failure::Final("HTTP 200 without a {\"fingerprint\":…} receipt".to_owned()))
}

/// Sorts a ureq error: a connection closed before any answer is retried at once.
fn classify(err: ureq::Error) -> Failure {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    let reason = short_reason(err.to_string());
    match &err {
        ureq::Error::Io(io)
            if matches!(
                io.kind(),
                UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
            ) =>
        {
            Failure::ClosedUnanswered(reason)
        }
        ureq::Error::Protocol(_) => Failure::ClosedUnanswered(reason),
        ureq::Error::BadUri(_) | ureq::Error::Http(_) | ureq::Error::InvalidProxyUrl => {
            Failure::Final(reason)
        }
        _ => Failure::Transient(reason),
    }
}

fn short_reason(mut reason: String) -> String {
    if reason.len() > REASON_LIMIT {
        let mut cut = REASON_LIMIT;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
        reason.push('…');
    }
    reason
}
