//! The probe endpoints every service exposes on its health port: `/healthz` (the process is
//! alive), `/readyz` (a readiness function the service supplies; 503 once draining) and
//! `/metrics` (the service's prometheus-client registry, then the `process_*` metrics, in
//! the format the scraper's `Accept` asks for: see [`Exposition`]). `/healthz` and `/readyz`
//! answers carry the process's pid (`X-Gorge-Pid`), so a copy about to start beside this one
//! can name it ([`crate::takeover`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use hyper::header::{HeaderValue, ACCEPT};
use hyper::{Method, Request, StatusCode};
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::http::{bytes_response, json_response, Response};
use crate::metrics::{Exposition, ProbeMetrics};

/// Answers `Ok(())` when ready, or `Err(reason)`; the reason is shown to whoever probes.
pub type ReadinessCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Conditions worth saying that do not make the service unready (a renewed certificate that
/// could not be taken while the old one serves on): listed under `warnings` in `/readyz`.
pub type ReadinessWarnings = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// The shared probe endpoints, `/healthz`, `/readyz` and `/metrics`, and the draining flag
/// that turns `/readyz` off at shutdown.
pub struct Probes {
    registry: Registry,
    process: Registry,
    readiness: ReadinessCheck,
    warnings: Option<ReadinessWarnings>,
    draining: AtomicBool,
    /// What the last `/readyz` answered: [`UNPROBED`], [`READY`] or [`NOT_READY`].
    last_readiness: AtomicU8,
    metrics: ProbeMetrics,
}

const UNPROBED: u8 = 0;
const READY: u8 = 1;
const NOT_READY: u8 = 2;

impl Probes {
    /// Probes exposing `registry` (the service's metrics) plus the `process_*` metrics, ready
    /// when `readiness` says so.
    /// The probes' own families ([`ProbeMetrics`]) are registered in `registry`.
    pub fn new(registry: Registry, readiness: ReadinessCheck) -> Arc<Probes> {
        Probes::with_warnings(registry, readiness, None)
    }

    /// [`Probes::new`], with `warnings` listed in every `/readyz` answer that has any.
    pub fn with_warnings(
        mut registry: Registry,
        readiness: ReadinessCheck,
        warnings: Option<ReadinessWarnings>,
    ) -> Arc<Probes> {
        let metrics = ProbeMetrics::register(&mut registry);
        Arc::new(Probes {
            registry,
            process: crate::metrics::process_registry(),
            readiness,
            warnings,
            draining: AtomicBool::new(false),
            last_readiness: AtomicU8::new(UNPROBED),
            metrics,
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

    /// The service's metrics, then the `process_*` ones, in `format`.
    pub fn encode_metrics(&self, format: Exposition) -> String {
        format.encode(&[&self.registry, &self.process])
    }

    /// Answers a request for a probe path, or `None` when its path is not one (the caller
    /// routes it). Probes answer GET and HEAD; other methods get 405 from the caller's router.
    pub async fn handle<B>(&self, request: &Request<B>) -> Option<Response> {
        let (method, path) = (request.method(), request.uri().path());
        if !matches!(path, "/healthz" | "/readyz" | "/metrics") {
            return None;
        }
        if method != Method::GET && method != Method::HEAD {
            return Some(crate::http::method_not_allowed("GET, HEAD"));
        }
        Some(match path {
            "/healthz" => with_pid(json_response(StatusCode::OK, &json!({"status": "ok"}))),
            "/readyz" => with_pid(self.readyz().await),
            _ => {
                let accept = request.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
                let format = Exposition::negotiate(accept);
                bytes_response(
                    StatusCode::OK,
                    format.content_type(),
                    self.encode_metrics(format),
                )
            }
        })
    }

    async fn readyz(&self) -> Response {
        let answer = if self.is_draining() {
            Err(json!({"status": "draining"}))
        } else {
            (self.readiness)()
                .await
                .map_err(|reason| json!({"status": "unavailable", "reason": reason}))
        };
        // Counted for the readiness-flapping alert; the first answer only sets the baseline.
        let now = if answer.is_ok() { READY } else { NOT_READY };
        let before = self.last_readiness.swap(now, Ordering::SeqCst);
        if before != UNPROBED && before != now {
            self.metrics.readiness_changes.inc();
        }
        let (status, mut body) = match answer {
            Ok(()) => (StatusCode::OK, json!({"status": "ok"})),
            Err(body) => (StatusCode::SERVICE_UNAVAILABLE, body),
        };
        let warnings = self.warnings.as_ref().map(|w| w()).unwrap_or_default();
        if !warnings.is_empty() {
            body["warnings"] = json!(warnings);
        }
        json_response(status, &body)
    }
}

/// Names the answering process, so that a copy about to start beside it can say which
/// process serves (see [`crate::takeover`]).
fn with_pid(mut response: Response) -> Response {
    response.headers_mut().insert(
        crate::takeover::PID_HEADER,
        HeaderValue::from(std::process::id()),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use prometheus_client::metrics::counter::Counter;
    use std::sync::atomic::AtomicBool;

    fn request(method: Method, path: &str, accept: Option<&str>) -> Request<()> {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        request.body(()).unwrap()
    }

    /// Status, content type and body of a GET.
    async fn get_as(
        probes: &Probes,
        path: &str,
        accept: Option<&str>,
    ) -> Option<(u16, String, String)> {
        let response = probes.handle(&request(Method::GET, path, accept)).await?;
        let status = response.status().as_u16();
        let content_type = response.headers()[hyper::header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_string();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Some((
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        ))
    }

    async fn get(probes: &Probes, path: &str) -> Option<(u16, String)> {
        let (status, _, body) = get_as(probes, path, None).await?;
        Some((status, body))
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
        // not ready -> ready -> not ready (draining): two changes; repeats count nothing.
        let _ = get(&probes, "/readyz").await;
        let (_, metrics) = get(&probes, "/metrics").await.unwrap();
        assert!(
            metrics.lines().any(|l| l == "readiness_changes_total 2"),
            "{metrics}"
        );
        // Liveness is unaffected by readiness and draining.
        assert_eq!(
            get(&probes, "/healthz").await.unwrap(),
            (200, r#"{"status":"ok"}"#.to_string())
        );
    }

    #[tokio::test]
    async fn health_and_readiness_answers_name_the_process() {
        let probes = Probes::new(Registry::default(), Probes::always_ready());
        for path in ["/healthz", "/readyz"] {
            let response = probes
                .handle(&request(Method::GET, path, None))
                .await
                .unwrap();
            assert_eq!(
                response.headers()[crate::takeover::PID_HEADER],
                std::process::id().to_string().as_str(),
                "{path}"
            );
        }
    }

    #[tokio::test]
    async fn metrics_expose_the_registry_and_other_paths_are_not_probes() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        registry.register("things_done", "Things done", counter.clone());
        counter.inc_by(3);
        let probes = Probes::new(registry, Probes::always_ready());
        // What Prometheus 2.x sends: OpenMetrics preferred.
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,\
            application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        let (status, content_type, body) =
            get_as(&probes, "/metrics", Some(prometheus)).await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            content_type,
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert!(
            body.starts_with("# HELP things_done Things done.\n# TYPE things_done counter\nthings_done_total 3\n"),
            "{body}"
        );
        assert!(body.contains("\nprocess_open_fds "), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        // curl, promtool and anything else: the text format, HELP and TYPE on the sample.
        for accept in [
            None,
            Some("*/*"),
            Some("text/plain"),
            Some("application/openmetrics-text;q=0.1,text/plain"),
        ] {
            let (status, content_type, body) = get_as(&probes, "/metrics", accept).await.unwrap();
            assert_eq!(status, 200);
            assert_eq!(
                content_type, "text/plain; version=0.0.4; charset=utf-8",
                "{accept:?}"
            );
            assert!(
                body.starts_with("# HELP things_done_total Things done.\n# TYPE things_done_total counter\nthings_done_total 3\n"),
                "{accept:?}: {body}"
            );
            assert!(!body.contains("# EOF"), "{body}");
        }
        assert!(get(&probes, "/status/").await.is_none());
        let post = probes
            .handle(&request(Method::POST, "/healthz", None))
            .await
            .unwrap();
        assert_eq!(post.status(), 405);
    }
}
