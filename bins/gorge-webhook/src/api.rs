//! The diagnostic HTTP API on the status port: `/api/webhook/stats`, `/api/webhook/hooks`,
//! `/api/webhook/queue` (token-protected counts and PHIDs, never URIs or keys: without a
//! token the port is unauthenticated) and the shared probes (`/healthz`, `/readyz`,
//! `/metrics`).
//!
//! `/api/webhook/queue` reads the whole queue, which costs a database hundreds of ms at a
//! large backlog: its queries run in one task at a time, whose answer every call waiting
//! for it shares and later calls reuse for [`QUEUE_ANSWER_REUSE`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::{SystemClock, UnixClock};
use crate::events;
use gorge_claim::{ClaimError, ClaimStore};
use gorge_service::emit;
use gorge_service::http::{error_response, internal_error, json_response, method_not_allowed};
use gorge_service::{Handler, Probes, Response, Secret};
use hyper::{Method, Request, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::json;
use slog::Logger;
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use crate::metrics::Metrics;

/// Header carrying the service token (preferred over `?token=`).
pub const TOKEN_HEADER: &str = "X-Service-Token";

/// Hooks listed by `/api/webhook/queue` at most (each costs one breaker query).
pub const QUEUE_HOOKS_LIMIT: u64 = 50;

/// How long one `/api/webhook/queue` answer is reused. Issue 30 measured one answer at
/// 290–600 ms of database time with 100 000 queued rows: a dashboard refreshing, several
/// operators and a script in a loop must not multiply that on the database deliveries use.
/// The answer is for a person watching a backlog, for whom 5 s old is current.
pub const QUEUE_ANSWER_REUSE: Duration = Duration::from_secs(5);

/// A shared `/api/webhook/queue` answer: `None` while its queries run; `Some(None)` when they
/// failed (the task that ran them logged why).
type SharedAnswer = Option<Option<Arc<serde_json::Value>>>;

/// Where `/api/webhook/queue`'s answer stands.
enum QueueAnswer {
    /// No answer to reuse.
    None,
    /// Queries running in a task of their own; every call waits on this.
    Running(watch::Receiver<SharedAnswer>),
    /// The last answer and when it was made.
    Made(Instant, Arc<serde_json::Value>),
}

/// Phorge's breaker, as `/api/webhook/queue` judges it: `threshold` failures within
/// `window_sec` (`GORGE_WEBHOOK_ERROR_THRESHOLD`, `GORGE_WEBHOOK_ERROR_BACKOFF_SEC`).
#[derive(Debug, Clone, Copy)]
pub struct Breaker {
    pub window_sec: u64,
    pub threshold: u64,
}

/// Everything the API handler needs.
pub struct Api {
    store: ClaimStore,
    probes: Arc<Probes>,
    token: Secret,
    breaker: Breaker,
    metrics: Metrics,
    queue_answer: Mutex<QueueAnswer>,
    log: Logger,
}

impl Api {
    pub fn new(
        store: ClaimStore,
        probes: Arc<Probes>,
        token: Secret,
        breaker: Breaker,
        metrics: Metrics,
        log: Logger,
    ) -> Arc<Api> {
        Arc::new(Api {
            store,
            probes,
            token,
            breaker,
            metrics,
            queue_answer: Mutex::new(QueueAnswer::None),
            log,
        })
    }

    /// The handler for `gorge_service::server`.
    pub fn handler(self: &Arc<Self>) -> Handler {
        let api = Arc::clone(self);
        Arc::new(move |request, _peer| {
            let api = Arc::clone(&api);
            Box::pin(async move { api.handle(&request).await })
        })
    }

    pub async fn handle<B>(self: &Arc<Self>, request: &Request<B>) -> Response {
        let path = request.uri().path();
        if let Some(response) = self.probes.handle(request).await {
            return response;
        }
        let route = match path {
            "/api/webhook/stats" => Route::Stats,
            "/api/webhook/hooks" => Route::Hooks,
            "/api/webhook/queue" => Route::Queue,
            _ => return error_response(StatusCode::NOT_FOUND, "no such endpoint"),
        };
        if request.method() != Method::GET {
            return method_not_allowed("GET");
        }
        if !self.authorized(request) {
            return error_response(StatusCode::UNAUTHORIZED, "missing or invalid service token");
        }
        let answer = match route {
            Route::Stats => self.store.stats().await.map(|stats| {
                json!({"data": {
                    "queuedCount": stats.queued,
                    "sentCount": stats.sent,
                    "failedCount": stats.failed,
                    "activeWebhooks": stats.active_hooks,
                }})
            }),
            Route::Hooks => self
                .store
                .hook_count()
                .await
                .map(|total| json!({"data": {"total": total}})),
            Route::Queue => {
                return match self.shared_queue().await {
                    Some(body) => json_response(StatusCode::OK, body.as_ref()),
                    None => internal_error(),
                }
            }
        };
        match answer {
            Ok(body) => json_response(StatusCode::OK, &body),
            Err(err) => {
                // Details go to the log only; the body is the fixed 500 envelope.
                emit!(self.log, events::WEBHOOK_API_DB_ERROR; "path" => path, "error" => %err);
                internal_error()
            }
        }
    }

    /// [`Api::queue`]'s answer, run in one task at a time and shared: the one made within
    /// [`QUEUE_ANSWER_REUSE`], else the one being made, else a new one. `None`: its queries
    /// failed (logged once, by the task).
    async fn shared_queue(self: &Arc<Self>) -> Option<Arc<serde_json::Value>> {
        let mut waiting = {
            let mut answer = self
                .queue_answer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match &*answer {
                QueueAnswer::Made(at, body) if at.elapsed() < QUEUE_ANSWER_REUSE => {
                    self.metrics.queue_answers.with(["reused"]).inc();
                    return Some(Arc::clone(body));
                }
                QueueAnswer::Running(waiting) => {
                    self.metrics.queue_answers.with(["reused"]).inc();
                    waiting.clone()
                }
                _ => {
                    self.metrics.queue_answers.with(["queried"]).inc();
                    let (done, waiting) = watch::channel(None);
                    *answer = QueueAnswer::Running(waiting.clone());
                    // In a task of its own: a caller that goes away does not cancel the
                    // queries the others wait for.
                    let api = Arc::clone(self);
                    tokio::spawn(async move {
                        let made = match api.queue().await {
                            Ok(body) => Some(Arc::new(body)),
                            Err(err) => {
                                emit!(api.log, events::WEBHOOK_API_DB_ERROR;
                                    "path" => "/api/webhook/queue", "error" => %err);
                                None
                            }
                        };
                        *api.queue_answer
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = match &made {
                            Some(body) => QueueAnswer::Made(Instant::now(), Arc::clone(body)),
                            None => QueueAnswer::None,
                        };
                        let _ = done.send(Some(made));
                    });
                    waiting
                }
            }
        };
        let answer = waiting.wait_for(Option::is_some).await.ok()?;
        answer.clone().flatten()
    }

    /// The backlog per hook, longest waiting first: counts and PHIDs, and the breaker as
    /// Phorge judges it from the table (so it holds whichever process delivers). Two
    /// queries: the queue by hook, then the listed hooks' recent failures.
    async fn queue(&self) -> Result<serde_json::Value, ClaimError> {
        let now = SystemClock.now_sec();
        let hooks = self.store.queue_by_hook(now, QUEUE_HOOKS_LIMIT).await?;
        let since = now.saturating_sub(self.breaker.window_sec);
        let phids: Vec<&str> = hooks.iter().map(|hook| hook.hook_phid.as_str()).collect();
        let failures_by_hook = self.store.recent_failures_by_hook(&phids, since).await?;
        let mut listed = Vec::with_capacity(hooks.len());
        for hook in &hooks {
            let failures = failures_by_hook.get(&hook.hook_phid).copied().unwrap_or(0);
            listed.push(json!({
                "hookPHID": hook.hook_phid,
                "queued": hook.queued,
                "oldestAgeSec": hook.oldest_age_sec,
                "oldestRequestPHID": hook.oldest_request_phid,
                "recentFailures": failures,
                "breakerOpen": failures >= self.breaker.threshold,
            }));
        }
        Ok(json!({"data": {
            "hooks": listed,
            "truncated": hooks.len() as u64 == QUEUE_HOOKS_LIMIT,
            "errorBackoffSec": self.breaker.window_sec,
            "errorThreshold": self.breaker.threshold,
        }}))
    }

    /// The header when present (even if wrong), else `?token=`; compared in constant time.
    /// An empty configured token disables authentication.
    fn authorized<B>(&self, request: &Request<B>) -> bool {
        if self.token.is_empty() {
            return true;
        }
        let presented = match request.headers().get(TOKEN_HEADER) {
            Some(value) => value.as_bytes().to_vec(),
            None => match query_token(request.uri().query()) {
                Some(token) => token,
                None => return false,
            },
        };
        presented.ct_eq(self.token.expose().as_bytes()).into()
    }
}

enum Route {
    Stats,
    Hooks,
    Queue,
}

/// The percent-decoded value of the first `token=` query parameter.
///
/// Only `%XX` is decoded; `+` stays `+`. Unlike the notification admin port's `instance`
/// (which PHP sends through `http_build_query`), the token comes from a person or a script
/// typing a generated secret into a URL, and base64 secrets contain `+`: decoding it as a
/// space would refuse the right token. A space in a token must be sent as `%20`.
fn query_token(query: Option<&str>) -> Option<Vec<u8>> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
        .map(|raw| percent_decode_str(raw).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_token_is_decoded_and_only_the_token_key_counts() {
        assert_eq!(
            query_token(Some("a=1&token=s%20cret")),
            Some(b"s cret".to_vec())
        );
        assert_eq!(query_token(Some("xtoken=1")), None);
        assert_eq!(query_token(None), None);
        assert_eq!(query_token(Some("token=")), Some(Vec::new()));
        assert_eq!(query_token(Some("token=a+b%2Bc")), Some(b"a+b+c".to_vec()));
    }
}
