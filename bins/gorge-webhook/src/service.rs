//! Wiring: builds the store, dispatcher, API and probes from [`Settings`] and runs them
//! under `gorge_service::run` until SIGTERM, then drains in this order: stop polling →
//! in-flight deliveries finish and write their results → close the pool (closing it first
//! would turn every result write into a duplicate POST once the lease runs out).
//!
//! The poll loop is supervised: if it ever ends outside a shutdown (a panic, a return),
//! readiness fails at once and the process exits non-zero — a service that answers 200
//! while delivering nothing is the failure this guards against.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gorge_claim::{ClaimStore, ClaimTiming};
use gorge_service::{bind_all, ListenerSpec, Probes, ReadinessCheck, RunOptions, Shutdown};
use prometheus_client::metrics::gauge::Gauge;
use slog::Logger;
use tokio::task::JoinHandle;

use crate::api::Api;
use crate::clock::SystemClock;
use crate::config::Settings;
use crate::connector::ConnectionOptions;
use crate::dberror::{self, DbEndpoint};
use crate::delivery::Deliverer;
use crate::dispatcher::{Dispatcher, DispatcherConfig};
use crate::events;
use crate::handover::HandoverWatch;
use crate::metrics::Metrics;
use gorge_service::emit;

/// How often queue depth, pool state and open breakers are sampled into the metrics (a
/// scrape never runs SQL).
const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// Bound on the `/readyz` database round trip.
const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

/// Time for in-flight HTTP requests on the status port once it stops accepting.
const REQUEST_GRACE: Duration = Duration::from_secs(5);

/// Exit code when the poll loop died (distinct from a listener failure's 1).
pub const POLL_LOOP_DIED_EXIT: i32 = 3;

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
/// the process drains and exits with [`POLL_LOOP_DIED_EXIT`].
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
    emit!(log, events::WEBHOOK_POLL_LOOP_DIED; "why" => why, "exit_code" => POLL_LOOP_DIED_EXIT);
    shutdown.trigger();
}

impl From<&Settings> for DispatcherConfig {
    fn from(settings: &Settings) -> Self {
        DispatcherConfig {
            poll_interval: settings.poll_interval,
            max_concurrent: settings.max_concurrent,
            timing: ClaimTiming {
                lease_sec: settings.claim_lease_sec,
                retry_backoff_sec: settings.retry_backoff_sec,
            },
            error_backoff_sec: settings.error_backoff_sec,
            error_threshold: settings.error_threshold,
            db: DbEndpoint::of(settings),
        }
    }
}

/// Runs the service; `Err` carries the process exit code.
pub async fn run(settings: Settings, log: Logger) -> Result<(), i32> {
    emit!(log, events::WEBHOOK_STARTED;
        "database" => settings.database(),
        "mysql_host" => &settings.mysql_host,
        "mysql_port" => settings.mysql_port,
        "mysql_user" => &settings.mysql_user,
        "mysql_pass" => settings.mysql_pass.clone(),
        "poll_interval_ms" => settings.poll_interval.as_millis() as u64,
        "max_concurrent" => settings.max_concurrent,
        "mysql_max_connections" => settings.mysql_max_connections,
        "mysql_max_lock_connections" => settings.mysql_max_lock_connections,
        "mysql_connection_budget" => settings.connection_budget(),
        "mysql_query_timeout_sec" => settings.mysql_query_timeout.as_secs(),
        "delivery_timeout_sec" => settings.delivery_timeout.as_secs(),
        "claim_lease_sec" => settings.claim_lease_sec,
        "retry_backoff_sec" => settings.retry_backoff_sec,
        "error_backoff_sec" => settings.error_backoff_sec,
        "error_threshold" => settings.error_threshold,
        "blacklist_networks" => settings.outbound_policy.len(),
        "listen_addr" => %settings.listen_addr);
    for (key, configured, effective, why) in settings.adjustments() {
        emit!(log, events::WEBHOOK_CONFIG_ADJUSTED;
            "key" => key, "configured" => configured, "effective" => effective, "why" => why);
    }
    for warning in settings.warnings() {
        emit!(log, events::WEBHOOK_CONFIG_WARNING; "warning" => warning);
    }

    let mut registry =
        gorge_service::metrics::service_registry(crate::metrics::PREFIX, env!("CARGO_PKG_VERSION"));
    let metrics = Metrics::register(&mut registry);
    let store = ClaimStore::with_options(
        settings.mysql_opts(),
        &settings.database(),
        settings.store_options(),
    );
    // Built in the order of dependence: readiness reads the dispatcher's progress.
    let db_up = metrics.db_up.clone();
    let poll_loop_up = metrics.poll_loop_up.clone();
    let deliverer = Deliverer::new(
        Arc::new(settings.outbound_policy.clone()),
        settings.delivery_timeout,
        metrics.delivery_counters(),
        &ConnectionOptions {
            extra_roots: settings.extra_roots.clone(),
            keep_alive: true,
        },
    );
    let dispatcher = Dispatcher::new(
        store.clone(),
        Arc::new(SystemClock),
        deliverer,
        metrics,
        DispatcherConfig::from(&settings),
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
                stall_limit(&settings),
                DbEndpoint::of(&settings),
            ),
            Arc::clone(&handover),
        ),
    );
    let api = Api::new(
        store.clone(),
        probes.clone(),
        settings.service_token.clone(),
        crate::api::Breaker {
            window_sec: settings.error_backoff_sec,
            threshold: settings.error_threshold,
        },
        log.clone(),
    );
    // SO_REUSEPORT would let this copy bind beside one that serves, splitting the status
    // port's traffic; take over only from a copy that drains.
    if let Err(copy) =
        gorge_service::takeover::refuse_if_serving([settings.listen_addr], &log).await
    {
        eprintln!("gorge-webhook: {copy}");
        return Err(1);
    }
    let listeners = match bind_all(vec![ListenerSpec {
        name: "status".into(),
        addr: settings.listen_addr,
        handler: api.handler(),
    }])
    .await
    {
        Ok(listeners) => listeners,
        Err(err) => {
            emit!(log, events::WEBHOOK_BIND_FAILED; "addr" => %settings.listen_addr, "error" => %err);
            eprintln!("gorge-webhook: {err}");
            return Err(1);
        }
    };

    let shutdown = Shutdown::new();
    let polling = tokio::spawn(Arc::clone(&dispatcher).run(shutdown.clone()));
    let supervisor = tokio::spawn(supervise_poll_loop(
        polling,
        shutdown.clone(),
        Arc::clone(&health),
        poll_loop_up,
        log.clone(),
    ));
    tokio::spawn(sample_loop(
        Arc::clone(&dispatcher),
        db_up,
        shutdown.clone(),
    ));
    tokio::spawn(crate::handover::watch(
        store.clone(),
        handover,
        Arc::new(SystemClock),
        shutdown.clone(),
    ));

    let drain_log = log.clone();
    let drain = Box::new(move || {
        Box::pin(async move {
            // `run` has triggered `shutdown`: the loop stops polling and returns once every
            // in-flight delivery has written its result; only then is the pool closed.
            let _ = supervisor.await;
            emit!(drain_log, events::WEBHOOK_DRAINED);
            store.close().await;
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
    });
    let options = RunOptions {
        // A POST may take the whole delivery timeout, then its result write retries for as
        // long as the lease protects the row.
        drain_deadline: Duration::from_secs(settings.claim_lease_sec) + Duration::from_secs(10),
        request_grace: REQUEST_GRACE,
        shutdown,
    };
    let ran = gorge_service::run(listeners, probes, drain, options, &log)
        .await
        .map_err(|err| {
            emit!(log, events::WEBHOOK_FAILED; "error" => %err);
            1
        });
    if health.is_dead() {
        return Err(POLL_LOOP_DIED_EXIT);
    }
    ran
}

/// How long without progress (a completed poll round or a written result) before the
/// service reports not ready: a POST may take the whole delivery timeout, and a poll or a
/// write the query timeout, twice over.
pub fn stall_limit(settings: &Settings) -> Duration {
    settings.delivery_timeout
        + settings.mysql_query_timeout * 2
        + settings.poll_interval
        + Duration::from_secs(5)
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
