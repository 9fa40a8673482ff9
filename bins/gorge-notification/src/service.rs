//! Wiring: the hub, metrics, peers or the broker, and both kinds of listener, bound first and then served
//! until SIGTERM and drained. [`Server::bind`] takes the clock, so tests run the whole
//! service in-process with a manual clock instead of sleeping.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gorge_hub::{Hub, MillisClock};
use gorge_service::server::HEADER_READ_TIMEOUT;
use gorge_service::settings::Declared;
use gorge_service::{
    bind_all, run, BindError, BoundListener, ConnectionCap, Handler, ListenerSpec, Probes,
    ReadinessWarnings, RunError, RunOptions, Shutdown, TlsServing,
};
use rand::RngCore;
use slog::Logger;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::Notify;

use crate::broker::{self, Broker, BrokerMetrics};
use crate::cluster::Cluster;
use crate::config::{ClusterConfig, Config, ServerKind, Settings};
use crate::events;
use crate::fanout::Fanout;
use crate::history_gate::HistoryGate;
use crate::metrics::Metrics;
use crate::peers::{PeerMetrics, PeerRelay};
use crate::recent_ids::RecentIds;
use crate::runtimes::OwnRuntime;
use crate::state::{ConnectionLimits, ServerState};
use crate::tls::{self, PortTls};
use crate::{admin, client_port, drain, fdlimit, warmup};
use gorge_service::emit;

/// Time left for in-flight admin requests once listeners stop; with the drain hook's bound
/// (window + 3 s) the whole drain stays within window + 5 s.
const REQUEST_GRACE: Duration = Duration::from_secs(2);

/// A client-port connection that has not sent its upgrade request within this of its accept
/// is closed: a browser sends it at once, and an idle connection holds a descriptor.
const UPGRADE_DEADLINE: Duration = Duration::from_secs(10);

/// A bound, not yet serving, notification service.
pub struct Server {
    state: Arc<ServerState>,
    listeners: Vec<BoundListener>,
    drain_window: Duration,
    drain_deadline: Duration,
    static_peers: usize,
    /// What follows from the settings, for `NOTIFY_STARTED`.
    derived: gorge_service::derived::Started,
    /// Serves the admin listeners; lives as long as the server runs.
    admin_runtime: OwnRuntime,
    /// Serves the client listeners and their sockets, at a lower priority.
    client_runtime: OwnRuntime,
    /// Bounds the warm-up from peers in a mesh (the gate opens by then whatever happened).
    warmup_deadline: Duration,
    /// The TLS listeners' files and pairs, re-checked while serving.
    tls_ports: Vec<Arc<PortTls>>,
    tls_recheck: Duration,
    /// Connections of every listener that have ended, for the memory housekeeping.
    ended_connections: Arc<std::sync::atomic::AtomicU64>,
}

impl Server {
    /// Builds the service from `config` and binds every listener (all or none).
    pub async fn bind(
        config: Config,
        clock: Arc<dyn MillisClock>,
        log: &Logger,
    ) -> Result<Server, BindError> {
        for ignored in &config.ignored {
            emit!(log, events::NOTIFY_CONFIG_IGNORED_KEY;
                "key" => &ignored.key, "reason" => &ignored.reason);
        }
        for warning in &config.warnings {
            emit!(log, events::NOTIFY_CONFIG_WARNING; "warning" => warning);
        }
        let fingerprint =
            phorge_wire::aphlict::generate_fingerprint(|buf| rand::rng().fill_bytes(buf));
        let mut registry = gorge_service::metrics::service_registry(
            crate::metrics::PREFIX,
            env!("CARGO_PKG_VERSION"),
        );
        let metrics = Metrics::register(&mut registry);
        // Both kinds of families exist whatever the mode, so dashboards and alert rules find
        // the same series everywhere (`broker_enabled` tells the modes apart).
        let peer_metrics = PeerMetrics::register(&mut registry);
        let broker_metrics = BrokerMetrics::register(&mut registry);
        let warm = metrics.history_warm.clone();
        // History is filled at start from a peer (mesh) or from the stream (broker); alone,
        // it is warm at once.
        let mut reader = None;
        let mut warmup_deadline = Duration::ZERO;
        let (cluster, history_gate) = match &config.cluster {
            ClusterConfig::Alone => (Cluster::Alone, HistoryGate::new(true, "", warm)),
            ClusterConfig::Mesh(peers) => {
                // One peer's full timeout, and another's: a hung peer costs at most one.
                warmup_deadline = peers.timeout * 2;
                let relay = PeerRelay::start(
                    peers.clone(),
                    fingerprint.clone(),
                    peer_metrics,
                    log.clone(),
                );
                let gate = HistoryGate::new(false, "history is warming up", warm);
                (Cluster::Mesh(relay), gate)
            }
            ClusterConfig::Broker(broker) => {
                broker_metrics.broker_enabled.set(1);
                let (broker, link) = Broker::start(
                    broker,
                    fingerprint.clone(),
                    &config.hub,
                    broker_metrics,
                    log.clone(),
                );
                reader = Some(link);
                let gate = HistoryGate::new(false, "loading history from the broker", warm);
                (Cluster::Broker(broker), gate)
            }
        };
        // Each TLS server's pair, read again (the configuration checked it) and served from an
        // `Arc` that a renewal swaps.
        let mut tls_ports = Vec::new();
        let mut tls = Vec::new();
        for server in &config.servers {
            let port = match server.tls.files() {
                Some(files) => {
                    let pair = files.load().map_err(|e| BindError {
                        name: server.kind.to_string(),
                        addr: server.addr,
                        source: std::io::Error::other(e.to_string()),
                    })?;
                    let port = Arc::new(PortTls::new(server.kind, files, pair));
                    tls::set_expiry(&port, &metrics);
                    tls_ports.push(port.clone());
                    Some(port)
                }
                None => None,
            };
            tls.push(port);
        }
        let history_gate = Arc::new(history_gate);
        // A renewal that could not be taken does not make the server unready (the old pair
        // serves on, and every replica reading the same broken files would leave the
        // Service empty); /readyz says so.
        let failing = tls_ports.clone();
        let warnings: ReadinessWarnings = Arc::new(move || {
            failing
                .iter()
                .filter_map(|port| {
                    port.failure().map(|e| {
                        format!(
                            "the {} port's renewed TLS files were not taken, the old pair \
                             serves on: {e}",
                            port.kind
                        )
                    })
                })
                .collect()
        });
        let probes = Probes::with_warnings(registry, history_gate.readiness(), Some(warnings));
        // The publisher holds the hub too; the fan-out thread takes both.
        let (_, publisher) = Hub::new(config.hub.clone(), clock);
        let fanout = Fanout::start(publisher, metrics.clone(), log.clone());
        let state = Arc::new(ServerState {
            hub: fanout.hub_now(),
            fanout,
            fingerprint,
            metrics,
            probes,
            cluster,
            limits: ConnectionLimits {
                max_frame_bytes: config.max_frame_bytes,
                inbound: config.inbound,
                max_admin_body_bytes: config.max_admin_body_bytes,
                ping_interval: config.ping_interval,
                idle_timeout: config.idle_timeout,
            },
            started: Instant::now(),
            log: log.clone(),
            session_ended: Notify::new(),
            drain_ends: std::sync::OnceLock::new(),
            history_gate,
            recent_ids: RecentIds::new(config.hub.history_entries, config.hub.history_age_ms),
            history_exports: std::sync::atomic::AtomicUsize::new(0),
        });
        if let Some(link) = reader {
            tokio::spawn(broker::reader::run(link, state.clone()));
        }
        for addr in config.exposed_admin_addrs() {
            let variable = Settings::env_var(Settings::KEYS.admin_listen_addr);
            emit!(log, events::NOTIFY_ADMIN_NOT_LOOPBACK; "addr" => %addr,
                "hint" => format!("the admin port has no authentication: keep it off public \
                    networks, and set {variable} (or the admin server's listen) to say this \
                    address is meant"));
        }
        let specs = config
            .servers
            .iter()
            .map(|server| ListenerSpec {
                name: server.kind.to_string(),
                addr: server.addr,
                handler: handler(state.clone(), server.kind),
            })
            .collect();
        let admin_runtime = OwnRuntime::admin().map_err(|source| BindError {
            name: ServerKind::Admin.to_string(),
            addr: config.admin_addr().unwrap_or(([0, 0, 0, 0], 0).into()),
            source,
        })?;
        // As many workers as the runtime binding the server has (one per usable CPU).
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        let client_runtime =
            OwnRuntime::client(workers, config.client_worker_nice).map_err(|source| BindError {
                name: ServerKind::Client.to_string(),
                addr: ([0, 0, 0, 0], 0).into(),
                source,
            })?;
        let admin_name = ServerKind::Admin.to_string();
        // Read after main raised the soft limit to the hard one.
        let client_cap = fdlimit::client_connection_cap(gorge_service::fdlimit::soft_limit());
        // Client listeners share one cap: descriptors are per process, not per port.
        let client_cap_gauge = client_cap.map_or(-1, |cap| i64::try_from(cap).unwrap_or(i64::MAX));
        state.metrics.client_connections_max.set(client_cap_gauge);
        let closed = &state.metrics.client_connections_closed;
        let refused = closed.with(["fd_reserve"]).clone();
        let expired = closed.with(["upgrade_timeout"]).clone();
        let client_cap = client_cap.map(|cap| ConnectionCap::new(cap, refused));
        let ended_connections = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let listeners = bind_all(specs)
            .await?
            .into_iter()
            .zip(tls)
            .map(|(l, tls)| {
                let l = l
                    .close_at_drain_start()
                    .with_accept_error_counter(state.metrics.accept_errors.clone())
                    .counting_ended_connections(ended_connections.clone());
                let l = match tls {
                    Some(port) => {
                        let label = tls::port_label(port.kind);
                        l.with_tls(TlsServing {
                            acceptor: port.server_config().into(),
                            plaintext_refused: state
                                .metrics
                                .tls_plaintext_refused
                                .with([label])
                                .clone(),
                            handshakes_failed: state
                                .metrics
                                .tls_handshakes_failed
                                .with([label])
                                .clone(),
                        })
                    }
                    None => l,
                };
                if l.name() == admin_name {
                    l.on_runtime(admin_runtime.handle())
                } else {
                    let l = l
                        .on_runtime(client_runtime.handle())
                        .with_first_request_deadline(UPGRADE_DEADLINE, expired.clone())
                        .serve_http10_upgrades();
                    match &client_cap {
                        Some(cap) => l.with_connection_cap(cap.clone()),
                        None => l,
                    }
                }
            })
            .collect();
        Ok(Server {
            state,
            listeners,
            drain_window: config.drain_window,
            drain_deadline: config.drain_deadline(),
            static_peers: config.cluster.static_peers().len(),
            derived: crate::config::derived::started(&config),
            admin_runtime,
            client_runtime,
            warmup_deadline,
            tls_ports,
            tls_recheck: tls::RECHECK,
            ended_connections,
        })
    }

    /// Replaces how often the TLS files are re-read (default [`tls::RECHECK`]); for tests.
    pub fn with_tls_recheck(mut self, every: Duration) -> Self {
        self.tls_recheck = every;
        self
    }

    /// Replaces the whole-request time limit (default 30 s) of every listener.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.listeners = self
            .listeners
            .into_iter()
            .map(|l| l.with_timeouts(HEADER_READ_TIMEOUT, timeout))
            .collect();
        self
    }

    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// The bound address of the first listener of `kind`.
    pub fn local_addr(&self, kind: ServerKind) -> Option<SocketAddr> {
        let name = kind.to_string();
        self.listeners
            .iter()
            .find(|l| l.name() == name)
            .map(BoundListener::local_addr)
    }

    /// Serves until `shutdown` (or SIGTERM/SIGINT), then drains.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), RunError> {
        let state = self.state;
        let log = state.log.clone();
        let addresses: Vec<String> = self
            .listeners
            .iter()
            .map(|l| format!("{}={}", l.name(), l.local_addr()))
            .collect();
        // Handled from before NOTIFY_STARTED: a SIGHUP sent once the server says it serves
        // must not meet the default action (which ends the process).
        let hangups = signal(SignalKind::hangup());
        gorge_service::emit_with!(log, events::NOTIFY_STARTED, self.derived;
            "fingerprint" => &state.fingerprint, "listeners" => addresses.join(","),
            "peers" => self.static_peers);
        // Ends with the client runtime it empties the caches of (below).
        let housekeeping = tokio::spawn(crate::memory::housekeeping(
            state.clone(),
            self.client_runtime.handle(),
            self.ended_connections.clone(),
        ));
        // Broker mode's reader fills history from the stream instead (started by `bind`).
        if let Cluster::Mesh(relay) = &state.cluster {
            tokio::spawn(warmup::run(
                state.clone(),
                relay.clone(),
                self.warmup_deadline,
            ));
        }
        // SIGHUP re-reads the TLS files at once (a certbot deploy hook's `systemctl reload`);
        // without TLS it does nothing. Before, SIGHUP's default action ended the process.
        let reread = Arc::new(Notify::new());
        let hangup = tokio::spawn(on_hangup(hangups, reread.clone(), log.clone()));
        let tls_watch = (!self.tls_ports.is_empty()).then(|| {
            tokio::spawn(tls::watch(
                self.tls_ports.clone(),
                state.metrics.clone(),
                log.clone(),
                self.tls_recheck,
                reread,
            ))
        });
        let options = RunOptions {
            drain_deadline: self.drain_deadline.saturating_sub(REQUEST_GRACE),
            request_grace: REQUEST_GRACE,
            shutdown,
        };
        let window = self.drain_window;
        let drain_state = state.clone();
        let hook: gorge_service::DrainHook =
            Box::new(move || Box::pin(drain::drain(drain_state, window)));
        let result = run(self.listeners, state.probes.clone(), hook, options, &log).await;
        housekeeping.abort();
        hangup.abort();
        if let Some(watch) = tls_watch {
            watch.abort();
        }
        drop(self.admin_runtime);
        drop(self.client_runtime);
        result
    }
}

/// Notifies `reread` at every SIGHUP `hangups` receives.
async fn on_hangup(hangups: std::io::Result<Signal>, reread: Arc<Notify>, log: Logger) {
    let mut hangups = match hangups {
        Ok(hangups) => hangups,
        Err(e) => {
            emit!(log, events::NOTIFY_CONFIG_WARNING;
                "warning" => format!("SIGHUP cannot be handled ({e}): TLS files are re-read every 60 s only"));
            return;
        }
    };
    while hangups.recv().await.is_some() {
        reread.notify_one();
    }
}

fn handler(state: Arc<ServerState>, kind: ServerKind) -> Handler {
    Arc::new(move |request, peer| {
        let state = state.clone();
        match kind {
            ServerKind::Admin => Box::pin(admin::handle(state, request, peer)),
            ServerKind::Client => Box::pin(client_port::handle(state, request)),
        }
    })
}
