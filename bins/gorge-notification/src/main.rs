//! gorge-notification: a drop-in replacement for Phorge's Aphlict notification server.
//!
//! Startup order: configuration (exit 2 on any invalid value), logging, the fingerprint, the
//! hub and metrics, every listener bound (exit 1 if any bind fails), then serve until SIGTERM
//! and drain. See docs/notification.md for the operator's view.

mod admin;
mod app;
mod client;
mod config;
mod drain;
mod fanout;
mod metrics;
mod peers;
mod session;
mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use gorge_hub::{Hub, MonotonicClock};
use gorge_service::cli::{exit_healthcheck, run_to_exit, Command, CommonArgs};
use gorge_service::config::exit_config_error;
use gorge_service::logging::init_logging;
use gorge_service::{bind_all, run, Handler, ListenerSpec, Probes, RunOptions, Shutdown};
use prometheus_client::registry::Registry;
use rand::RngCore;
use slog::{error, info, o, warn};
use tokio::sync::Notify;

use crate::app::{App, ConnectionLimits};
use crate::config::{Config, ServerKind, DEFAULT_HEALTH_PORT};
use crate::fanout::Fanout;
use crate::metrics::Metrics;
use crate::peers::PeerRelay;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Time left for in-flight admin requests once listeners stop; with the drain hook's bound
/// (window + 3 s) the whole drain stays within window + 5 s.
const REQUEST_GRACE: Duration = Duration::from_secs(2);

#[derive(Parser)]
#[command(
    name = "gorge-notification",
    version,
    about = "Aphlict-compatible realtime notification server for Phorge",
    after_help = "--config takes an Aphlict-format JSON file (or set GORGE_NOTIFICATION_CONFIG_FILE). \
                  Settings and defaults: docs/notification.md"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

fn main() {
    let cli = Cli::parse();
    let config_path = cli.common.config.as_deref();
    if let Some(Command::Healthcheck { port }) = cli.command {
        exit_healthcheck(port.unwrap_or_else(|| {
            config::load(config_path)
                .ok()
                .and_then(|c| c.admin_addr())
                .map_or(DEFAULT_HEALTH_PORT, |a| a.port())
        }));
    }
    let config = config::load(config_path).unwrap_or_else(|e| exit_config_error(&e));
    if cli.common.check_config {
        let text = serde_json::to_string_pretty(&config::describe(&config))
            .expect("configuration description serializes");
        println!("{text}");
        return;
    }
    let logging =
        init_logging("gorge-notification", VERSION).unwrap_or_else(|e| exit_config_error(&e));
    run_to_exit(logging, |log| async move { serve(config, &log).await });
}

async fn serve(config: Config, log: &slog::Logger) -> i32 {
    for ignored in &config.ignored {
        warn!(log, "NOTIFY_CONFIG_IGNORED_KEY"; "key" => &ignored.key, "reason" => ignored.reason);
    }
    let fingerprint = phorge_wire::aphlict::generate_fingerprint(|buf| rand::rng().fill_bytes(buf));
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let relay = PeerRelay::start(
        config.peers.clone(),
        fingerprint.clone(),
        &mut registry,
        log.new(o!("component" => "peers")),
    );
    let probes = Probes::new(registry, Probes::always_ready());
    let hub = Arc::new(Hub::new(config.hub.clone(), MonotonicClock::new()));
    let fanout = Fanout::start(
        hub.clone(),
        metrics.clone(),
        log.new(o!("component" => "fanout")),
    );
    let app = Arc::new(App {
        hub,
        fanout,
        fingerprint: fingerprint.clone(),
        metrics,
        probes: probes.clone(),
        relay,
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

    let specs = config
        .servers
        .iter()
        .map(|server| ListenerSpec {
            name: server.kind.to_string(),
            addr: server.addr,
            handler: handler(app.clone(), server.kind),
        })
        .collect();
    let listeners = match bind_all(specs).await {
        Ok(listeners) => listeners,
        Err(e) => {
            error!(log, "NOTIFY_BIND_FAILED"; "addr" => %e.addr, "error" => %e);
            eprintln!("{e}");
            return 1;
        }
    };
    let addresses: Vec<String> = listeners
        .iter()
        .map(|l| format!("{}={}", l.name(), l.local_addr()))
        .collect();
    info!(log, "NOTIFY_STARTED";
        "fingerprint" => &fingerprint, "listeners" => addresses.join(","),
        "peers" => config.peers.static_peers.len());

    let window = config.drain_window;
    let drain_app = app.clone();
    let options = RunOptions {
        drain_deadline: config.drain_deadline().saturating_sub(REQUEST_GRACE),
        request_grace: REQUEST_GRACE,
        shutdown: Shutdown::new(),
    };
    let hook: gorge_service::DrainHook =
        Box::new(move || Box::pin(drain::drain(drain_app, window)));
    match run(listeners, probes, hook, options, log).await {
        Ok(()) => 0,
        Err(e) => {
            error!(log, "NOTIFY_STOPPED"; "error" => %e);
            1
        }
    }
}

fn handler(app: Arc<App>, kind: ServerKind) -> Handler {
    Arc::new(move |request, _peer| {
        let app = app.clone();
        match kind {
            ServerKind::Admin => Box::pin(admin::handle(app, request)),
            ServerKind::Client => Box::pin(client::handle(app, request)),
        }
    })
}
