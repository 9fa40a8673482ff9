//! One peer's relay worker: a dedicated OS thread that drains the peer's ordered queue and
//! POSTs each message to the peer's admin port with ureq.
//!
//! ureq blocks, so it runs here and never on the Tokio runtime; a slow or dead peer stalls only
//! its own thread and queue. Each message is tried once (a retry would hold up every later
//! message of the peer's queue, and a notification that arrives much later is worth little)
//! and redirects are not followed (an admin port that redirects is misconfigured, and
//! following it would send messages somewhere nobody listed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

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
}

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
        let is_self = send(&shared, &link, &mut health, &job);
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

/// Sends one job and records the outcome; true if the receipt carried our own fingerprint.
fn send(shared: &Shared, link: &PeerLink, health: &mut Health, job: &RelayJob) -> bool {
    if link.discard.load(Ordering::Relaxed) {
        link.counters.dropped.inc();
        return false;
    }
    let url = format!("{}?instance={}", link.base_url, job.instance_query);
    let started = std::time::Instant::now();
    let observed = match post(&shared.agent, &url, &job.body) {
        Ok(fingerprint) if fingerprint == shared.own_fingerprint => return true,
        Ok(fingerprint) => {
            link.counters.ok.inc();
            emit!(shared.log, events::NOTIFY_PEER_RELAYED; "peer" => &link.address,
                "instance" => &*job.instance_query, "bytes" => job.body.len(),
                "elapsed_ms" => started.elapsed().as_millis() as u64);
            Health::Up { fingerprint }
        }
        Err(reason) => {
            link.counters.failed.inc();
            emit!(shared.log, events::NOTIFY_PEER_RELAY_FAILED; "peer" => &link.address,
                "reason" => &reason);
            if *health != Health::Down {
                emit!(shared.log, events::NOTIFY_PEER_DOWN; "peer" => &link.address, "reason" => reason);
            }
            Health::Down
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
    false
}

/// POSTs one message and returns the fingerprint from the peer's receipt, or a short reason.
fn post(agent: &ureq::Agent, url: &str, body: &[u8]) -> Result<String, String> {
    let mut response = agent
        .post(url)
        .header("Content-Type", "application/json")
        .send(body)
        .map_err(|err| short_reason(err.to_string()))?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(if (300..400).contains(&status) {
            format!("HTTP status {status} (redirects are not followed)")
        } else {
            format!("HTTP status {status}")
        });
    }
    let text = response
        .body_mut()
        .with_config()
        .limit(RECEIPT_LIMIT)
        .read_to_string()
        .map_err(|err| short_reason(format!("reading receipt: {err}")))?;
    serde_json::from_str::<Receipt>(&text)
        .map(|receipt| receipt.fingerprint)
        .map_err(|_| "HTTP 200 without a {\"fingerprint\":…} receipt".to_owned())
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
