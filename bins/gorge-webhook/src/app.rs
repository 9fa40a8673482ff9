//! Wiring: builds the store, dispatcher, API and probes from [`Settings`] and runs them
//! under `gorge_service::run` until SIGTERM, then drains in the order the spec requires:
//! stop polling → in-flight deliveries finish and write their results → close the pool.

use std::sync::Arc;
use std::time::Duration;

use gorge_claim::{ClaimError, ClaimStore, ClaimTiming};
use gorge_service::{bind_all, ListenerSpec, Probes, ReadinessCheck, RunOptions, Shutdown};
use prometheus_client::registry::Registry;
use slog::{error, info, warn, Logger};

use crate::api::Api;
use crate::client::ClientOptions;
use crate::clock::SystemClock;
use crate::config::Settings;
use crate::delivery::Deliverer;
use crate::dispatcher::{Dispatcher, DispatcherConfig};
use crate::metrics::Metrics;

/// How often queue depth, pool state and open breakers are sampled into the metrics (a
/// scrape never runs SQL).
const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// Bound on the `/readyz` database round trip.
const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

/// Time for in-flight HTTP requests on the status port once it stops accepting.
const REQUEST_GRACE: Duration = Duration::from_secs(5);

impl From<&Settings> for DispatcherConfig {
    fn from(settings: &Settings) -> Self {
        DispatcherConfig {
            poll_interval: settings.poll_interval,
            max_concurrent: settings.max_concurrent,
            timing: ClaimTiming {
                lease_sec: settings.lease_sec,
                retry_backoff_sec: settings.retry_backoff_sec,
            },
            breaker_window_sec: settings.breaker_window_sec,
            breaker_threshold: settings.breaker_threshold,
        }
    }
}

/// Runs the service; `Err` carries the process exit code.
pub async fn run(settings: Settings, log: Logger) -> Result<(), i32> {
    info!(log, "WEBHOOK_STARTED";
        "database" => settings.database(),
        "mysql_host" => &settings.mysql_host,
        "mysql_port" => settings.mysql_port,
        "mysql_user" => &settings.mysql_user,
        "mysql_pass" => settings.mysql_pass.clone(),
        "poll_interval_ms" => settings.poll_interval.as_millis() as u64,
        "max_concurrent" => settings.max_concurrent,
        "delivery_timeout_sec" => settings.delivery_timeout.as_secs(),
        "lease_sec" => settings.lease_sec,
        "retry_backoff_sec" => settings.retry_backoff_sec,
        "breaker_window_sec" => settings.breaker_window_sec,
        "breaker_threshold" => settings.breaker_threshold,
        "blacklist_networks" => settings.outbound_policy.len(),
        "listen_addr" => %settings.listen_addr);
    for (key, configured, effective, why) in settings.adjustments() {
        info!(log, "WEBHOOK_CONFIG_ADJUSTED";
            "key" => key, "configured" => configured, "effective" => effective, "why" => why);
    }
    for warning in settings.warnings() {
        warn!(log, "WEBHOOK_CONFIG_WARNING"; "warning" => warning);
    }

    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let store = ClaimStore::new(settings.mysql_opts(), &settings.database());
    let probes = Probes::new(registry, readiness(store.clone()));
    let api = Api::new(
        store.clone(),
        probes.clone(),
        settings.service_token.clone(),
        log.clone(),
    );
    let listeners = match bind_all(vec![ListenerSpec {
        name: "status".into(),
        addr: settings.listen_addr,
        handler: api.handler(),
    }])
    .await
    {
        Ok(listeners) => listeners,
        Err(err) => {
            error!(log, "WEBHOOK_BIND_FAILED"; "addr" => %settings.listen_addr, "error" => %err);
            eprintln!("gorge-webhook: {err}");
            return Err(1);
        }
    };

    let deliverer = Deliverer::with_options(
        Arc::new(settings.outbound_policy.clone()),
        settings.delivery_timeout,
        metrics.response_bodies_truncated.clone(),
        &ClientOptions {
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
    let shutdown = Shutdown::new();
    let polling = tokio::spawn(Arc::clone(&dispatcher).run(shutdown.clone()));
    tokio::spawn(sample_loop(Arc::clone(&dispatcher), shutdown.clone()));

    let drain_log = log.clone();
    let drain = Box::new(move || {
        Box::pin(async move {
            // `run` has triggered `shutdown`: the loop stops polling and returns once every
            // in-flight delivery has written its result; only then is the pool closed.
            let _ = polling.await;
            info!(drain_log, "WEBHOOK_DRAINED");
            store.close().await;
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
    });
    let options = RunOptions {
        // A POST may take the whole delivery timeout, then its result write (with retries).
        drain_deadline: settings.delivery_timeout + Duration::from_secs(10),
        request_grace: REQUEST_GRACE,
        shutdown,
    };
    gorge_service::run(listeners, probes, drain, options, &log)
        .await
        .map_err(|err| {
            error!(log, "WEBHOOK_FAILED"; "error" => %err);
            1
        })
}

/// `/readyz`: a bounded round trip on `{namespace}_herald`. A missing database is "not
/// ready" (Phorge has not run `bin/storage upgrade` yet), never a crash.
fn readiness(store: ClaimStore) -> ReadinessCheck {
    Arc::new(move || {
        let store = store.clone();
        Box::pin(async move {
            match tokio::time::timeout(READINESS_TIMEOUT, store.ping()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(err)) => Err(readiness_reason(&err)),
                Err(_) => Err("database did not answer within 2 s".to_string()),
            }
        })
    })
}

fn readiness_reason(err: &ClaimError) -> String {
    // One line, whatever the driver said.
    err.to_string().replace(['\n', '\r'], " ")
}

async fn sample_loop(dispatcher: Arc<Dispatcher>, shutdown: Shutdown) {
    loop {
        // Failures here are the same database errors the poll loop already reports.
        let _ = tokio::time::timeout(SAMPLE_INTERVAL, dispatcher.sample()).await;
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE_INTERVAL) => {}
            _ = shutdown.triggered() => return,
        }
    }
}
