//! The probe endpoints every service exposes on its health port: `/healthz` (the process is
//! alive), `/readyz` (a readiness function the service supplies; 503 once draining) and
//! `/metrics` (the service's prometheus-client registry, then the `process_*` metrics, in
//! text exposition format).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hyper::{Method, StatusCode};
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::http::{bytes_response, json_response, Response};

/// Answers `Ok(())` when ready, or `Err(reason)`; the reason is shown to whoever probes.
pub type ReadinessCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The shared probe endpoints, `/healthz`, `/readyz` and `/metrics`, and the draining flag
/// that turns `/readyz` off at shutdown.
pub struct Probes {
    registry: Registry,
    process: Registry,
    readiness: ReadinessCheck,
    draining: AtomicBool,
}

impl Probes {
    /// Probes exposing `registry` (the service's metrics) plus the `process_*` metrics, ready
    /// when `readiness` says so.
    pub fn new(registry: Registry, readiness: ReadinessCheck) -> Arc<Probes> {
        Arc::new(Probes {
            registry,
            process: crate::metrics::process_registry(),
            readiness,
            draining: AtomicBool::new(false),
        })
    }

    /// A readiness check that is always ready (until draining).
    pub fn always_ready() -> ReadinessCheck {
        Arc::new(|| Box::pin(async { Ok(()) }))
    }

    /// From now on `/readyz` answers 503 `{"status":"draining"}`, whatever the check says.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether [`Probes::set_draining`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The registry's text exposition.
    pub fn encode_metrics(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut text, &self.registry);
        let _ = prometheus_client::encoding::text::encode_registry(&mut text, &self.process);
        let _ = prometheus_client::encoding::text::encode_eof(&mut text);
        text
    }

    /// Answers a probe path, or `None` when `path` is not one (the caller routes it).
    /// Probes answer GET and HEAD; other methods get 405 from the caller's router.
    pub async fn handle(&self, method: &Method, path: &str) -> Option<Response> {
        if !matches!(path, "/healthz" | "/readyz" | "/metrics") {
            return None;
        }
        if method != Method::GET && method != Method::HEAD {
            return Some(crate::http::method_not_allowed("GET, HEAD"));
        }
        Some(match path {
            "/healthz" => json_response(StatusCode::OK, &json!({"status": "ok"})),
            "/readyz" => self.readyz().await,
            _ => bytes_response(StatusCode::OK, METRICS_CONTENT_TYPE, self.encode_metrics()),
        })
    }

    async fn readyz(&self) -> Response {
        if self.is_draining() {
            return json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"status": "draining"}),
            );
        }
        match (self.readiness)().await {
            Ok(()) => json_response(StatusCode::OK, &json!({"status": "ok"})),
            Err(reason) => json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"status": "unavailable", "reason": reason}),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use prometheus_client::metrics::counter::Counter;
    use std::sync::atomic::AtomicBool;

    async fn get(probes: &Probes, path: &str) -> Option<(u16, String)> {
        let response = probes.handle(&Method::GET, path).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Some((status, String::from_utf8(body.to_vec()).unwrap()))
    }

    #[tokio::test]
    async fn readyz_follows_the_supplied_function_then_draining() {
        let ready = Arc::new(AtomicBool::new(false));
        let flag = ready.clone();
        let check: ReadinessCheck = Arc::new(move || {
            let ok = flag.load(Ordering::SeqCst);
            Box::pin(async move {
                if ok {
                    Ok(())
                } else {
                    Err("database phabricator_herald does not exist".into())
                }
            })
        });
        let probes = Probes::new(Registry::default(), check);
        assert_eq!(
            get(&probes, "/readyz").await.unwrap(),
            (
                503,
                r#"{"status":"unavailable","reason":"database phabricator_herald does not exist"}"#
                    .to_string()
            )
        );
        ready.store(true, Ordering::SeqCst);
        assert_eq!(
            get(&probes, "/readyz").await.unwrap(),
            (200, r#"{"status":"ok"}"#.to_string())
        );
        probes.set_draining();
        assert_eq!(
            get(&probes, "/readyz").await.unwrap(),
            (503, r#"{"status":"draining"}"#.to_string())
        );
        // Liveness is unaffected by readiness and draining.
        assert_eq!(
            get(&probes, "/healthz").await.unwrap(),
            (200, r#"{"status":"ok"}"#.to_string())
        );
    }

    #[tokio::test]
    async fn metrics_expose_the_registry_and_other_paths_are_not_probes() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        registry.register("things_done", "Things done", counter.clone());
        counter.inc_by(3);
        let probes = Probes::new(registry, Probes::always_ready());
        let (status, body) = get(&probes, "/metrics").await.unwrap();
        assert_eq!(status, 200);
        assert!(body.contains("things_done_total 3"), "{body}");
        assert!(body.contains("\nprocess_open_fds "), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        assert!(get(&probes, "/status/").await.is_none());
        let post = probes.handle(&Method::POST, "/healthz").await.unwrap();
        assert_eq!(post.status(), 405);
    }
}
