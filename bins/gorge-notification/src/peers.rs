//! Relays accepted messages to the other servers of a cluster, so that a message PHP posted
//! to one admin port reaches the browsers connected to every server.
//!
//! Peers come from the configuration (static URLs) and from DNS (re-resolved periodically).
//! Each peer has one ordered, bounded queue drained by its own worker thread; `relay` only
//! enqueues, so a slow or dead peer never delays local delivery or the admin response.
//! Relaying goes on during the drain (PHP may still post here until the load balancer has
//! noticed `/readyz`); the drain only waits for the queues to empty, up to its deadline.
//! A peer that cannot be reached keeps its messages (bounded by its queue and the history
//! age) until it is back (`worker`), and a server that discovers through DNS announces
//! itself to the siblings of its first answer, which add it at once ([`PeerRelay::announced`]).
//!
//! Loop prevention is one hop: only a message that entered the cluster here (nobody but us
//! in `touched`) is relayed, to every peer; a message that arrived from a peer is delivered
//! locally and not passed on. With every server listing every other (what Phorge's cluster
//! documentation prescribes, and what DNS discovery yields), this delivers each message exactly
//! once per server. Aphlict re-relays to every peer whose fingerprint is not yet in `touched`,
//! which in a mesh of three or more delivers duplicates (B and C both forward A's message to
//! each other). Under one hop, Aphlict's fingerprint rule reduces to "never send to ourselves":
//! a peer whose receipt carries our own fingerprint is this server, and is dropped for good.

mod discovery;
mod metrics;
mod worker;

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use slog::Logger;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::config::{PeerConfig, PeerUrl};
use crate::events;
use discovery::KnownPeer;
use gorge_service::emit;
pub use metrics::PeerMetrics;
use worker::{PeerLink, RelayJob};

/// The admin path a server that joined through DNS posts to on each sibling it resolved,
/// so they relay to it at once instead of at their next DNS refresh.
pub const ANNOUNCE_PATH: &str = "/peers/announce";

/// How long an announced peer is kept although DNS does not list it yet: a new pod enters a
/// headless Service's answer only once it is ready (warm), which can take a few refreshes.
const ANNOUNCE_GRACE: Duration = Duration::from_secs(60);

/// Peers beyond this many (static and discovered together) are refused and counted: every
/// peer costs a thread and a queue, and a DNS name answering hundreds of addresses is more
/// likely a mistake than a cluster.
const MAX_PEERS: usize = 64;

/// Characters left as they are in the `instance` query value (RFC 3986 unreserved).
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The cluster relay of one server. Created once at startup, shared by the admin handlers.
pub struct PeerRelay {
    shared: Arc<Shared>,
    discovery: Mutex<Option<JoinHandle<()>>>,
}

/// State shared by the relay, its workers and DNS discovery.
struct Shared {
    own_fingerprint: String,
    agent: ureq::Agent,
    queue_capacity: usize,
    /// How long a relay to an unreachable peer is kept and retried.
    keep_for: Duration,
    /// The admin port of DNS-discovered siblings, when discovering through DNS.
    dns_port: Option<u16>,
    metrics: PeerMetrics,
    log: Logger,
    /// Held only to read or change the peer list and to enqueue, never across I/O.
    peers: Mutex<PeerSet>,
    /// Jobs queued or in flight, over all peers; the drain waits for zero.
    pending: AtomicUsize,
    /// Woken when `pending` drops to zero.
    idle: Notify,
}

struct PeerSet {
    peers: Vec<PeerHandle>,
    /// Addresses found to be this server; never added again. At most `MAX_PEERS`.
    self_addresses: HashSet<String>,
}

struct PeerHandle {
    link: Arc<PeerLink>,
    from_dns: bool,
    /// When it announced itself, if it did: DNS may not list it yet.
    announced_at: Option<std::time::Instant>,
    /// Dropping it closes the queue: the worker finishes what is queued and returns.
    queue: SyncSender<RelayJob>,
}

/// How `https://` peers are verified: against `PEER_CA_FILE`'s certificates (checked at
/// startup), or the system's roots (the bundled Mozilla roots when the system has none).
fn peer_tls(ca_pem: Option<&[u8]>) -> ureq::tls::TlsConfig {
    let der: Vec<Vec<u8>> = match ca_pem {
        Some(pem) => crate::config::tls_files::pem_certificates(pem)
            .unwrap_or_default()
            .into_iter()
            .map(|cert| cert.as_ref().to_vec())
            .collect(),
        None => rustls_native_certs::load_native_certs()
            .certs
            .into_iter()
            .map(|cert| cert.as_ref().to_vec())
            .collect(),
    };
    let roots = if der.is_empty() {
        ureq::tls::RootCerts::WebPki
    } else {
        let certs = der
            .iter()
            .map(|der| ureq::tls::Certificate::from_der(der).to_owned())
            .collect();
        ureq::tls::RootCerts::Specific(Arc::new(certs))
    };
    ureq::tls::TlsConfig::builder().root_certs(roots).build()
}

impl PeerRelay {
    /// Starts a worker per configured peer and, if configured, DNS discovery. Must be called
    /// inside a Tokio runtime (discovery is a task).
    pub fn start(
        cfg: PeerConfig,
        own_fingerprint: String,
        metrics: PeerMetrics,
        log: Logger,
    ) -> Arc<PeerRelay> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(cfg.timeout))
            .max_redirects(0)
            .http_status_as_error(false)
            // Peers are internal addresses; an HTTP(S)_PROXY meant for the outside world
            // must not capture them.
            .proxy(None)
            .user_agent(concat!("gorge-notification/", env!("CARGO_PKG_VERSION")))
            .tls_config(peer_tls(cfg.ca_pem.as_deref()))
            .build()
            .into();
        let shared = Arc::new(Shared {
            own_fingerprint,
            agent,
            queue_capacity: cfg.queue_capacity.max(1),
            keep_for: cfg.keep_for,
            dns_port: cfg.dns.as_ref().map(|(_, port)| *port),
            metrics,
            log,
            peers: Mutex::new(PeerSet {
                peers: Vec::new(),
                self_addresses: HashSet::new(),
            }),
            pending: AtomicUsize::new(0),
            idle: Notify::new(),
        });
        {
            let mut set = shared.lock_peers();
            for url in &cfg.static_peers {
                let (address, base_url) = static_endpoint(url);
                shared.add_peer(&mut set, address, base_url, false);
            }
            emit!(shared.log, events::NOTIFY_PEERS_CHANGED;
                "peers" => set.peers.len(), "added" => set.peers.len(), "removed" => 0,
                "dns" => cfg.dns.as_ref().map(|(host, port)| format!("{host}:{port}")));
        }
        let discovery = cfg.dns.map(|(host, port)| {
            tokio::spawn(discovery::run(
                Arc::clone(&shared),
                host,
                port,
                cfg.dns_refresh,
                cfg.timeout,
            ))
        });
        Arc::new(PeerRelay {
            shared,
            discovery: Mutex::new(discovery),
        })
    }

    /// Queues a stamped message for every peer if it entered the cluster here. Never blocks:
    /// a full queue drops the message for that peer and counts it.
    pub fn relay(&self, instance: &str, stamped_body: Bytes, touched: &[String]) {
        let own = self.shared.own_fingerprint.as_str();
        if !touched.iter().all(|fingerprint| fingerprint == own) {
            // Arrived from a peer: its origin relays it to everyone else (one hop).
            return;
        }
        let set = self.shared.lock_peers();
        if set.peers.is_empty() {
            return;
        }
        let job = RelayJob {
            instance_query: utf8_percent_encode(instance, QUERY_VALUE)
                .to_string()
                .into(),
            body: stamped_body,
            queued_at: std::time::Instant::now(),
        };
        // Counted before sending, so a worker finishing the job first never underflows.
        self.shared
            .pending
            .fetch_add(set.peers.len(), Ordering::AcqRel);
        for peer in &set.peers {
            if peer.queue.try_send(job.clone()).is_err() {
                peer.link.counters.dropped.inc();
                self.shared.job_done();
            }
        }
    }

    /// A sibling at `ip` announced itself (it joined through DNS): relayed to at once, on the
    /// DNS port, and kept until DNS lists it or [`ANNOUNCE_GRACE`] passes. False when this
    /// server does not discover peers through DNS (an announce means nothing here).
    pub fn announced(&self, ip: std::net::IpAddr) -> bool {
        let Some(port) = self.shared.dns_port else {
            return false;
        };
        let addr = SocketAddr::new(ip, port);
        let address = addr.to_string();
        let mut set = self.shared.lock_peers();
        let added =
            self.shared
                .add_peer(&mut set, address.clone(), format!("http://{addr}/"), true);
        if let Some(peer) = set.peers.iter_mut().find(|p| p.link.address == address) {
            peer.announced_at = Some(std::time::Instant::now());
        }
        if added {
            emit!(self.shared.log, events::NOTIFY_PEERS_CHANGED;
                "peers" => set.peers.len(), "added" => 1, "removed" => 0, "announced" => &address);
        }
        true
    }

    /// The admin base URLs (`{proto}://{host}:{port}/`) of the peers known now.
    pub fn base_urls(&self) -> Vec<String> {
        self.shared
            .lock_peers()
            .peers
            .iter()
            .map(|peer| peer.link.base_url.clone())
            .collect()
    }

    /// Whether peers are (also) discovered through DNS.
    pub fn uses_dns(&self) -> bool {
        lock(&self.discovery).is_some()
    }

    /// The HTTP agent peers are reached with (timeout, no redirects, no proxy).
    pub fn agent(&self) -> ureq::Agent {
        self.shared.agent.clone()
    }

    /// Stops discovery and waits up to `deadline` for every queue to empty. Relaying goes
    /// on meanwhile; once the deadline has passed, whatever is queued or relayed later is
    /// dropped and counted instead of sent.
    pub async fn shutdown(&self, deadline: Duration) {
        if let Some(task) = lock(&self.discovery).take() {
            task.abort();
        }
        if tokio::time::timeout(deadline, self.shared.until_idle())
            .await
            .is_ok()
        {
            emit!(self.shared.log, events::NOTIFY_PEER_QUEUES_FLUSHED);
            return;
        }
        let set = self.shared.lock_peers();
        for peer in &set.peers {
            peer.link.discard_remaining();
        }
        emit!(self.shared.log, events::NOTIFY_PEER_QUEUES_DROPPED;
            "pending" => self.shared.pending.load(Ordering::Acquire),
            "deadline_ms" => deadline.as_millis() as u64);
    }
}

impl Shared {
    fn lock_peers(&self) -> MutexGuard<'_, PeerSet> {
        lock(&self.peers)
    }

    /// Called once for every job counted in `pending`, whatever became of it.
    fn job_done(&self) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    async fn until_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            // Registered before the check, so a wake-up in between is not lost.
            notified.as_mut().enable();
            if self.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Adds a peer and starts its worker, unless it is known, is us, or the limit is reached.
    fn add_peer(
        self: &Arc<Self>,
        set: &mut PeerSet,
        address: String,
        base_url: String,
        from_dns: bool,
    ) -> bool {
        if set.self_addresses.contains(&address)
            || set.peers.iter().any(|peer| peer.link.address == address)
        {
            return false;
        }
        if set.peers.len() >= MAX_PEERS {
            self.metrics.peer_discovery_refused.inc();
            emit!(self.log, events::NOTIFY_PEER_REFUSED; "peer" => &address, "max_peers" => MAX_PEERS);
            return false;
        }
        let counters = self.metrics.for_peer(&address);
        let link = Arc::new(PeerLink::new(address, base_url, counters));
        let (queue, jobs) = sync_channel(self.queue_capacity);
        let worker = {
            let shared = Arc::clone(self);
            let link = Arc::clone(&link);
            std::thread::Builder::new()
                .name("gorge-peer".to_owned())
                .spawn(move || worker::run(shared, link, jobs))
        };
        if let Err(err) = worker {
            emit!(self.log, events::NOTIFY_PEER_WORKER_FAILED;
                "peer" => &link.address, "reason" => err.to_string());
            self.metrics.forget_peer(&link.address);
            return false;
        }
        set.peers.push(PeerHandle {
            link,
            from_dns,
            announced_at: None,
            queue,
        });
        self.metrics.peers_known.set(set.peers.len() as i64);
        true
    }

    /// Applies one DNS answer: removes vanished DNS peers, adds new ones up to the limit.
    fn apply_dns(self: &Arc<Self>, resolved: &BTreeSet<SocketAddr>) {
        let mut set = self.lock_peers();
        let known: Vec<KnownPeer<'_>> = set
            .peers
            .iter()
            .map(|peer| KnownPeer {
                address: &peer.link.address,
                from_dns: peer.from_dns,
            })
            .collect();
        let mut plan = discovery::plan(&known, resolved, &set.self_addresses, MAX_PEERS);
        // A peer that announced itself lately stays although DNS does not list it yet.
        plan.remove.retain(|address| {
            !set.peers.iter().any(|peer| {
                &peer.link.address == address
                    && peer
                        .announced_at
                        .is_some_and(|at| at.elapsed() < ANNOUNCE_GRACE)
            })
        });
        for address in &plan.remove {
            self.remove_peer(&mut set, address);
        }
        let mut added = 0usize;
        for addr in &plan.add {
            if self.add_peer(&mut set, addr.to_string(), format!("http://{addr}/"), true) {
                added += 1;
            }
        }
        if plan.refused > 0 {
            self.metrics
                .peer_discovery_refused
                .inc_by(plan.refused as u64);
        }
        if added > 0 || !plan.remove.is_empty() {
            emit!(self.log, events::NOTIFY_PEERS_CHANGED;
                "peers" => set.peers.len(), "added" => added, "removed" => plan.remove.len(),
                "refused" => plan.refused);
        }
    }

    fn remove_peer(&self, set: &mut PeerSet, address: &str) {
        if let Some(index) = set.peers.iter().position(|p| p.link.address == address) {
            self.take_peer(set, index).link.discard_remaining();
        }
    }

    /// Takes the peer at `index` out of the set and out of the metrics.
    fn take_peer(&self, set: &mut PeerSet, index: usize) -> PeerHandle {
        let peer = set.peers.swap_remove(index);
        self.metrics.forget_peer(&peer.link.address);
        self.metrics.peers_known.set(set.peers.len() as i64);
        peer
    }

    /// Records a peer's new fingerprint. Two addresses with the same fingerprint are one
    /// server listed twice (two names, or a static list and DNS naming the same pods): it
    /// gets every message twice. That is the operator's to fix, so it is logged, not guessed.
    fn learned_fingerprint(&self, link: &PeerLink, fingerprint: &str) {
        let set = self.lock_peers();
        *lock(&link.fingerprint) = Some(fingerprint.to_owned());
        let twin = set.peers.iter().find(|peer| {
            !std::ptr::eq(Arc::as_ptr(&peer.link), link)
                && lock(&peer.link.fingerprint).as_deref() == Some(fingerprint)
        });
        if let Some(twin) = twin {
            emit!(self.log, events::NOTIFY_PEER_LISTED_TWICE;
                "peer" => &link.address, "same_as" => &twin.link.address,
                "fingerprint" => fingerprint);
        }
    }

    /// Called by a worker whose peer answered with our own fingerprint.
    fn found_self(&self, link: &PeerLink) {
        let mut set = self.lock_peers();
        if set.self_addresses.len() < MAX_PEERS {
            set.self_addresses.insert(link.address.clone());
        }
        // By identity, not address: discovery may have replaced the entry meanwhile.
        if let Some(index) = set
            .peers
            .iter()
            .position(|peer| std::ptr::eq(Arc::as_ptr(&peer.link), link))
        {
            self.take_peer(&mut set, index);
        }
        emit!(self.log, events::NOTIFY_PEER_IS_SELF; "peer" => &link.address);
    }
}

/// The metric/log address and the POST base URL of a configured peer.
fn static_endpoint(url: &PeerUrl) -> (String, String) {
    let host = if url.host.contains(':') && !url.host.starts_with('[') {
        format!("[{}]", url.host)
    } else {
        url.host.clone()
    };
    let address = format!("{host}:{}", url.port);
    let base_url = format!("{}://{address}/", url.protocol);
    (address, base_url)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take the relay down with it; the data stays consistent
    // because every critical section only pushes, removes or reads whole entries.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
