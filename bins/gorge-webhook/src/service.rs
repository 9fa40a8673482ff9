//! Wiring: [`Server::bind`] builds the store, dispatcher, API and probes from the loaded
//! configuration and binds the status port; [`Server::run`] serves until SIGTERM (or until
//! the shutdown it is given is triggered), then drains in this order: stop polling →
//! in-flight deliveries finish and write their results → close the pool (closing it first
//! would turn every result write into a duplicate POST once the lease runs out). The same
//! shape as gorge-notification's `Server`; `main` turns the outcome into an exit code.
//!
//! The poll loop is supervised: if it ever ends outside a shutdown (a panic, a return),
//! readiness fails at once and the process drains and ends with [`Error::PollLoopDied`] —
//! a service that answers 200 while delivering nothing is the failure this guards against.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gorge_claim::ClaimStore;
use gorge_service::derived::Started;
use gorge_service::{
    bind_all, BindError, BoundListener, ConnectionCap, ListenerSpec, Probes, ReadinessCheck,
    RunError, RunOptions, Shutdown,
};
use prometheus_client::metrics::gauge::Gauge;
use slog::Logger;
use tokio::task::JoinHandle;

use crate::api::Api;
use crate::clock::SystemClock;
use crate::config::{Config, Loaded, REQUEST_GRACE_SEC};
use crate::connector::ConnectionOptions;
use crate::dberror::{self, DbEndpoint};
use crate::delivery::Deliverer;
use crate::dispatcher::{Dispatcher, DispatcherConfig};
use crate::events;
use crate::handover::HandoverWatch;
use crate::metrics::Metrics;
use gorge_service::{emit, emit_with};

/// How often queue depth, pool state and open breakers are sampled into the metrics (a
/// scrape never runs SQL).
const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// How long a status-port connection may stay open without sending a request head: idle
/// connections must not keep their place under the cap (`fdlimit.rs`) from probes.
const FIRST_REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// Bound on the `/readyz` database round trip.
const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the poll loop is still running; shared by the supervisor and readiness.
#[derive(Debug, Default)]
pub struct PollHealth {
    dead: AtomicBool,
}

impl PollHealth {
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

/// Awaits the poll loop. If it ends while `shutdown` was not triggered (it panicked or
/// returned), marks `health` dead, logs `WEBHOOK_POLL_LOOP_DIED` and triggers shutdown so
/// the process drains and [`Server::run`] ends with [`Error::PollLoopDied`].
pub async fn supervise_poll_loop(
    polling: JoinHandle<()>,
    shutdown: Shutdown,
    health: Arc<PollHealth>,
    up: prometheus_client::metrics::gauge::Gauge,
    log: Logger,
) {
    up.set(1);
    let ended = polling.await;
    up.set(0);
    if shutdown.is_triggered() {
        return;
    }
    health.dead.store(true, Ordering::SeqCst);
    let why = match ended {
        Ok(()) => "returned".to_string(),
        Err(err) if err.is_panic() => "panicked".to_string(),
        Err(err) => err.to_string(),
    };
    emit!(log, events::WEBHOOK_POLL_LOOP_DIED; "why" => why);
    shutdown.trigger();
}

impl From<&Config> for DispatcherConfig {
    fn from(config: &Config) -> Self {
        DispatcherConfig {
            poll_interval: config.poll_interval,
            max_concurrent: config.max_concurrent,
            timing: config.claim_timing(),
            error_backoff_sec: config.breaker_window.as_secs(),
            error_threshold: config.breaker_threshold,
            db: DbEndpoint::of(&config.database),
        }
    }
}

/// Why [`Server::run`] ended other than with a clean drain.
#[derive(Debug)]
pub enum Error {
    /// A listener failed, or the signal handlers could not be installed.
    Run(RunError),
    /// The poll loop ended outside a shutdown (`WEBHOOK_POLL_LOOP_DIED`); the process drained.
    PollLoopDied,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Run(err) => err.fmt(f),
            Error::PollLoopDied => f.write_str("the poll loop stopped outside a shutdown"),
        }
    }
}

impl std::error::Error for Error {}

/// A bound, not yet serving, gorge-webhook.
pub struct Server {
    listeners: Vec<BoundListener>,
    probes: Arc<Probes>,
    store: ClaimStore,
    dispatcher: Arc<Dispatcher>,
    poll_loop_up: Gauge,
    db_up: Gauge,
    health: Arc<PollHealth>,
    handover: Arc<HandoverWatch>,
    /// The fields of `WEBHOOK_STARTED`: every setting and derived fact.
    started: Started,
    drain_deadline: Duration,
    log: Logger,
}

impl Server {
    /// Builds the service from `loaded` and binds the status port. Logs the configuration's
    /// adjustments and warnings first.
    pub async fn bind(loaded: Loaded, log: &Logger) -> Result<Server, BindError> {
        for adjusted in loaded.adjustments() {
            emit!(log, events::WEBHOOK_CONFIG_ADJUSTED;
                "key" => &adjusted.var, "configured" => adjusted.configured,
                "effective" => adjusted.effective, "why" => adjusted.why);
        }
        for warning in loaded.warnings() {
            emit!(log, events::WEBHOOK_CONFIG_WARNING; "warning" => warning);
        }
        let started = loaded.started();
        let config = loaded.config;
        let mut registry = gorge_service::metrics::service_registry(
            crate::metrics::PREFIX,
            env!("CARGO_PKG_VERSION"),
        );
        let metrics = Metrics::register(&mut registry);
        let status_cap = status_cap(&config, &metrics);
        let no_request = metrics
            .status_connections_closed
            .with(["no_request"])
            .clone();
        let db = &config.database;
        let store = ClaimStore::with_options(db.mysql_opts(), &db.name, db.store_options());
        // Built in the order of dependence: readiness reads the dispatcher's progress.
        let (db_up, poll_loop_up) = (metrics.db_up.clone(), metrics.poll_loop_up.clone());
        let deliverer = Deliverer::new(
            Arc::new(config.outbound_policy.clone()),
            config.delivery_timeout,
            metrics.delivery_counters(),
            &ConnectionOptions {
                extra_roots: config.extra_roots.clone(),
                keep_alive: true,
            },
        );
        let dispatcher = Dispatcher::new(
            store.clone(),
            Arc::new(SystemClock),
            deliverer,
            metrics.clone(),
            DispatcherConfig::from(&config),
            log.clone(),
        );
        let health = Arc::new(PollHealth::default());
        let handover = HandoverWatch::new(log.clone());
        let probes = Probes::new(
            registry,
            crate::handover::gate(
                readiness(
                    store.clone(),
                    Arc::clone(&health),
                    Arc::clone(&dispatcher),
                    config.stall_limit(),
                    DbEndpoint::of(&config.database),
                ),
                Arc::clone(&handover),
            ),
        );
        let api = Api::new(
            store.clone(),
            probes.clone(),
            config.service_token.clone(),
            crate::api::Breaker {
                window_sec: config.breaker_window.as_secs(),
                threshold: config.breaker_threshold,
            },
            metrics.clone(),
            log.clone(),
        );
        let listeners = bind_all(vec![ListenerSpec {
            name: "status".into(),
            addr: config.listen_addr,
            handler: api.handler(),
        }])
        .await?
        .into_iter()
        .map(|l| {
            let l = l.with_first_request_deadline(FIRST_REQUEST_DEADLINE, no_request.clone());
            match &status_cap {
                Some(cap) => l.with_connection_cap(cap.clone()),
                None => l,
            }
        })
        .collect();
        Ok(Server {
            listeners,
            probes,
            store,
            dispatcher,
            poll_loop_up,
            db_up,
            health,
            handover,
            started,
            drain_deadline: config.drain_deadline,
            log: log.clone(),
        })
    }

    /// Serves until `shutdown` (or SIGTERM/SIGINT), then drains within the configuration's
    /// `stop_within_sec`.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), Error> {
        let log = self.log;
        emit_with!(log, events::WEBHOOK_STARTED, self.started);
        let polling = tokio::spawn(Arc::clone(&self.dispatcher).run(shutdown.clone()));
        let supervisor = tokio::spawn(supervise_poll_loop(
            polling,
            shutdown.clone(),
            Arc::clone(&self.health),
            self.poll_loop_up,
            log.clone(),
        ));
        tokio::spawn(sample_loop(
            Arc::clone(&self.dispatcher),
            self.db_up,
            shutdown.clone(),
        ));
        tokio::spawn(crate::handover::watch(
            self.store.clone(),
            self.handover,
            Arc::new(SystemClock),
            shutdown.clone(),
        ));
        let (drain_log, store) = (log.clone(), self.store);
        let drain = Box::new(move || {
            Box::pin(async move {
                // `run` has triggered `shutdown`: the loop stops polling and returns once
                // every in-flight delivery has written its result; only then is the pool
                // closed.
                let _ = supervisor.await;
                emit!(drain_log, events::WEBHOOK_DRAINED);
                store.close().await;
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        });
        let options = RunOptions {
            drain_deadline: self.drain_deadline,
            request_grace: Duration::from_secs(REQUEST_GRACE_SEC),
            shutdown,
        };
        let ran = gorge_service::run(self.listeners, self.probes, drain, options, &log).await;
        if self.health.is_dead() {
            return Err(Error::PollLoopDied);
        }
        ran.map_err(Error::Run)
    }
}

/// The status port's connection cap under the soft open-file limit (read now), its gauge
/// set; `None` without a limit.
fn status_cap(config: &Config, metrics: &Metrics) -> Option<ConnectionCap> {
    let cap = crate::fdlimit::status_connection_cap(
        gorge_service::fdlimit::soft_limit(),
        config.fd_reserve(),
    );
    let gauge = cap.map_or(-1, |cap| i64::try_from(cap).unwrap_or(i64::MAX));
    metrics.status_connections_max.set(gauge);
    let refused = metrics
        .status_connections_closed
        .with(["fd_reserve"])
        .clone();
    cap.map(|cap| ConnectionCap::new(cap, refused))
}

/// `/readyz`: the poll loop is alive and has made progress within `stall_limit`, and a
/// bounded round trip on `{namespace}_herald` shows the user has the privileges the service
/// needs there (else the reason is the `GRANT` to run). A missing database is "not ready"
/// (Phorge has not run `bin/storage upgrade` yet), never a crash.
pub fn readiness(
    store: ClaimStore,
    health: Arc<PollHealth>,
    dispatcher: Arc<Dispatcher>,
    stall_limit: Duration,
    at: DbEndpoint,
) -> ReadinessCheck {
    let at = Arc::new(at);
    Arc::new(move || {
        let store = store.clone();
        let at = Arc::clone(&at);
        let health = Arc::clone(&health);
        let dispatcher = Arc::clone(&dispatcher);
        Box::pin(async move {
            if health.is_dead() {
                return Err("the poll loop stopped; the process is exiting".to_string());
            }
            let idle = dispatcher.since_progress();
            if idle > stall_limit {
                return Err(format!(
                    "no poll round or result write for {} s",
                    idle.as_secs()
                ));
            }
            match tokio::time::timeout(READINESS_TIMEOUT, store.missing_grant()).await {
                Ok(Ok(None)) => Ok(()),
                Ok(Ok(Some(grant))) => Err(format!(
                    "missing privilege, nothing can be claimed: {grant} \
                     (docs/operations.md, \"Database grants\")"
                )),
                Ok(Err(err)) => Err(dberror::explain(&err, &at)),
                Err(_) => Err("database did not answer within 2 s".to_string()),
            }
        })
    })
}

async fn sample_loop(dispatcher: Arc<Dispatcher>, db_up: Gauge, shutdown: Shutdown) {
    loop {
        // Failures here are the same database errors the poll loop already reports.
        let sampled = tokio::time::timeout(SAMPLE_INTERVAL, dispatcher.sample()).await;
        db_up.set(i64::from(matches!(sampled, Ok(Ok(())))));
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE_INTERVAL) => {}
            _ = shutdown.triggered() => return,
        }
    }
}
