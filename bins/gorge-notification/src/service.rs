//! Wiring: the hub, metrics, peers or the broker, and both kinds of listener, bound first and then served
//! until SIGTERM and drained. [`Server::bind`] takes the clock, so tests run the whole
//! service in-process with a manual clock instead of sleeping.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gorge_hub::{Hub, MillisClock};
use gorge_service::server::HEADER_READ_TIMEOUT;
use gorge_service::{
    bind_all, run, BindError, BoundListener, Handler, ListenerSpec, Probes, RunError, RunOptions,
    Shutdown,
};
use rand::RngCore;
use slog::Logger;
use tokio::sync::Notify;

use crate::broker::{Broker, BrokerMetrics};
use crate::config::{Config, ServerKind};
use crate::events;
use crate::fanout::Fanout;
use crate::history_gate::HistoryGate;
use crate::metrics::Metrics;
use crate::peers::PeerRelay;
use crate::state::{ConnectionLimits, ServerState};
use crate::{admin, client, drain};
use gorge_service::emit;

/// Time left for in-flight admin requests once listeners stop; with the drain hook's bound
/// (window + 3 s) the whole drain stays within window + 5 s.
const REQUEST_GRACE: Duration = Duration::from_secs(2);

/// A bound, not yet serving, notification service.
pub struct Server {
    app: Arc<ServerState>,
    listeners: Vec<BoundListener>,
    drain_window: Duration,
    drain_deadline: Duration,
    static_peers: usize,
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
        let relay = PeerRelay::start(
            config.peers.clone(),
            fingerprint.clone(),
            &mut registry,
            log.clone(),
        );
        let broker_metrics = BrokerMetrics::register(&mut registry);
        let broker = config.broker.as_ref().map(|broker| {
            broker_metrics.broker_enabled.set(1);
            Broker::new(
                broker,
                fingerprint.clone(),
                &config.hub,
                broker_metrics,
                log.clone(),
            )
        });
        let history_gate = Arc::new(match broker {
            Some(_) => HistoryGate::closed(),
            None => HistoryGate::open_now(),
        });
        let probes = Probes::new(registry, warm_history(history_gate.clone()));
        let hub = Arc::new(Hub::new(config.hub.clone(), clock));
        let fanout = Fanout::start(hub.clone(), metrics.clone(), log.clone());
        let app = Arc::new(ServerState {
            hub,
            fanout,
            fingerprint,
            metrics,
            probes,
            relay,
            broker: broker.clone(),
            history_gate,
            limits: ConnectionLimits {
                max_frame_bytes: config.max_frame_bytes,
                max_admin_body_bytes: config.max_admin_body_bytes,
                ping_interval: config.ping_interval,
                idle_timeout: config.idle_timeout,
            },
            started: Instant::now(),
            log: log.clone(),
            session_ended: Notify::new(),
        });
        if let Some(broker) = &broker {
            broker.start_publisher();
            broker.start_reader(app.clone());
        }
        for addr in exposed_admin_addrs(&config) {
            emit!(log, events::NOTIFY_ADMIN_NOT_LOOPBACK; "addr" => %addr,
                "hint" => "the admin port has no authentication: keep it off public networks");
        }
        let specs = config
            .servers
            .iter()
            .map(|server| ListenerSpec {
                name: server.kind.to_string(),
                addr: server.addr,
                handler: handler(app.clone(), server.kind),
            })
            .collect();
        let listeners = bind_all(specs)
            .await?
            .into_iter()
            .map(|l| {
                l.close_at_drain_start()
                    .with_accept_error_counter(app.metrics.accept_errors.clone())
            })
            .collect();
        Ok(Server {
            app,
            listeners,
            drain_window: config.drain_window,
            drain_deadline: config.drain_deadline(),
            static_peers: config.peers.static_peers.len(),
        })
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

    pub fn app(&self) -> &Arc<ServerState> {
        &self.app
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
        let app = self.app;
        let log = app.log.clone();
        let addresses: Vec<String> = self
            .listeners
            .iter()
            .map(|l| format!("{}={}", l.name(), l.local_addr()))
            .collect();
        emit!(log, events::NOTIFY_STARTED;
            "fingerprint" => &app.fingerprint, "listeners" => addresses.join(","),
            "peers" => self.static_peers);
        let options = RunOptions {
            drain_deadline: self.drain_deadline.saturating_sub(REQUEST_GRACE),
            request_grace: REQUEST_GRACE,
            shutdown,
        };
        let window = self.drain_window;
        let drain_app = app.clone();
        let hook: gorge_service::DrainHook =
            Box::new(move || Box::pin(drain::drain(drain_app, window)));
        run(self.listeners, app.probes.clone(), hook, options, &log).await
    }
}

/// Ready once the history is warm (see [`HistoryGate`]).
fn warm_history(gate: Arc<HistoryGate>) -> gorge_service::ReadinessCheck {
    Arc::new(move || {
        let warm = gate.is_warm();
        Box::pin(async move {
            if warm {
                Ok(())
            } else {
                Err("loading history from the broker".to_string())
            }
        })
    })
}

/// Admin listeners on a non-loopback address. PHP cannot authenticate, so anyone who reaches
/// the admin port can post to every browser; operators should know when it is exposed.
pub fn exposed_admin_addrs(config: &Config) -> Vec<SocketAddr> {
    config
        .servers
        .iter()
        .filter(|s| s.kind == ServerKind::Admin && !s.addr.ip().is_loopback())
        .map(|s| s.addr)
        .collect()
}

fn handler(app: Arc<ServerState>, kind: ServerKind) -> Handler {
    Arc::new(move |request, _peer| {
        let app = app.clone();
        match kind {
            ServerKind::Admin => Box::pin(admin::handle(app, request)),
            ServerKind::Client => Box::pin(client::handle(app, request)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;

    #[test]
    fn only_non_loopback_admin_listeners_are_exposed() {
        let mut config = crate::config::load(None).unwrap();
        let server = |kind, addr: &str| ServerConfig {
            kind,
            addr: addr.parse().unwrap(),
        };
        config.servers = vec![
            server(ServerKind::Admin, "127.0.0.1:1"),
            server(ServerKind::Admin, "[::1]:2"),
            server(ServerKind::Admin, "0.0.0.0:3"),
            server(ServerKind::Admin, "10.1.2.3:4"),
            server(ServerKind::Client, "0.0.0.0:5"),
        ];
        let exposed: Vec<String> = exposed_admin_addrs(&config)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(exposed, ["0.0.0.0:3", "10.1.2.3:4"]);
    }
}
