//! The admin port (docs/notification.md, "Admin port"): Phorge's PHP posts messages to `POST /` and reads `GET /status/`;
//! the probes (`/healthz`, `/readyz`, `/metrics`) live here too.
//!
//! `PhabricatorNotificationClient` posts raw JSON labelled `application/x-www-form-urlencoded`
//! (cURL's default) and only looks at the status code, so `Content-Type` is ignored entirely
//! and success bodies are bare (no envelope); errors use the shared envelope.

use std::sync::Arc;
use std::time::Instant;

use gorge_hub::Hub;
use gorge_service::http::{
    bytes_response, error_response, method_not_allowed, read_body_limited, BodyError, JSON,
};
use gorge_service::{Accepted, Response};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use phorge_wire::aphlict::{self, AdminMessageError, Status};

use crate::ingest::{self, IngestError, Ingested};
use crate::state::ServerState;
use crate::warmup;

/// Instance of an admin request: the `instance` query parameter, `default` when absent or
/// empty.
///
/// Decoded as `application/x-www-form-urlencoded`, `+` being a space: PHP's
/// `http_build_query` encodes a space as `+`, and Aphlict (Node's `querystring`) decodes it
/// so, which is the behaviour PHP relies on.
pub fn instance_from_query(query: Option<&str>) -> String {
    let found = query.and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(key, _)| key == "instance")
            .map(|(_, value)| value.into_owned())
    });
    match found {
        Some(name) if !name.is_empty() => name,
        _ => "default".to_string(),
    }
}

/// Routes one admin request.
pub async fn handle(
    state: Arc<ServerState>,
    request: Request<Incoming>,
    peer: std::net::SocketAddr,
) -> Response {
    let path = request.uri().path().to_string();
    if path == "/metrics" {
        // Gauges of hub state are read when scraped, not kept up to date on every change.
        state.metrics.set_usage(state.hub.usage());
    }
    if let Some(response) = state.probes.handle(&request).await {
        return response;
    }
    match path.as_str() {
        "/" if request.method() == Method::POST => {
            // From the accept: time spent waiting to be accepted or read counts too.
            let started = request
                .extensions()
                .get::<Accepted>()
                .map_or_else(Instant::now, |accepted| accepted.0);
            let response = post_message(&state, request).await;
            state
                .metrics
                .admin_post_seconds
                .observe(started.elapsed().as_secs_f64());
            response
        }
        "/" => method_not_allowed("POST"),
        "/status/" if matches!(*request.method(), Method::GET | Method::HEAD) => {
            // Counters include every message whose POST was answered before this request.
            status(&state, state.fanout.settled().await, request.uri().query())
        }
        "/status/" => method_not_allowed("GET, HEAD"),
        warmup::PATH if request.method() == Method::GET => {
            // Holds every message whose POST was answered before this request.
            history(&state, state.fanout.settled().await, request.uri().query())
        }
        warmup::PATH => method_not_allowed("GET"),
        ANNOUNCE_PATH if request.method() == Method::POST => {
            // A sibling found through DNS says it is here: its address is where the
            // connection comes from, on the port every sibling's admin listener uses.
            if state.cluster.announced(peer.ip()) {
                receipt(&state)
            } else {
                error_response(StatusCode::NOT_FOUND, "no peer discovery here")
            }
        }
        ANNOUNCE_PATH => method_not_allowed("POST"),
        _ => error_response(StatusCode::NOT_FOUND, "no such path"),
    }
}

/// Where a server that joined through `GORGE_NOTIFICATION_PEER_DNS` announces itself to the
/// siblings it resolved (see [`crate::peers`]).
pub const ANNOUNCE_PATH: &str = crate::peers::ANNOUNCE_PATH;

/// `GET /history/?age=<ms>`: what a starting peer warms its history from (see
/// [`warmup`]); 503 while this server's own history is not warm. `hub` comes from
/// [`crate::fanout::Fanout::settled`].
fn history(state: &ServerState, hub: &Hub, query: Option<&str>) -> Response {
    if !state.history_gate.is_open() {
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "history is warming up");
    }
    use std::sync::atomic::Ordering;
    // Each export copies up to the whole history: only a few at once (peers start one by
    // one; a warm-up that gets 503 asks the next peer).
    if state.history_exports.fetch_add(1, Ordering::AcqRel) >= warmup::MAX_EXPORTS {
        state.history_exports.fetch_sub(1, Ordering::AcqRel);
        state.metrics.admin_rejected.with(["history_busy"]).inc();
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "history exports are busy");
    }
    let max_age = hub.limits().history_age_ms;
    let age_ms = query
        .and_then(|q| {
            form_urlencoded::parse(q.as_bytes())
                .find(|(key, _)| key == "age")
                .and_then(|(_, value)| value.parse::<u64>().ok())
        })
        .map_or(max_age, |age| age.min(max_age));
    let body = warmup::export(hub, age_ms);
    state.history_exports.fetch_sub(1, Ordering::AcqRel);
    bytes_response(StatusCode::OK, "application/x-ndjson", body)
}

/// `hub` comes from [`crate::fanout::Fanout::settled`].
fn status(state: &ServerState, hub: &Hub, query: Option<&str>) -> Response {
    let instance = instance_from_query(query);
    let counters = hub.status(&instance);
    let status = Status {
        instance,
        uptime: u64::try_from(state.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        clients_active: counters.clients_active,
        clients_total: counters.clients_total,
        messages_in: counters.messages_in,
        messages_out: counters.messages_out,
        version: aphlict::PROTOCOL_VERSION,
        history_size: counters.history_size,
        history_age: counters.history_age_ms,
        server: Some(ServerState::server_name()),
    };
    let (entries, bytes) = hub.history_totals();
    state.metrics.set_history(entries, bytes);
    bytes_response(StatusCode::OK, JSON, status.to_json())
}

async fn post_message(state: &ServerState, request: Request<Incoming>) -> Response {
    let instance = instance_from_query(request.uri().query());
    let body = match read_body_limited(request, state.limits.max_admin_body_bytes).await {
        Ok(body) => body,
        Err(BodyError::TooLarge) => {
            state.metrics.admin_rejected.with(["too_large"]).inc();
            return error_response(StatusCode::PAYLOAD_TOO_LARGE, "message body too large");
        }
        Err(BodyError::Read) => {
            return error_response(StatusCode::BAD_REQUEST, "could not read the request body")
        }
    };
    let accepted_at = Instant::now();
    match ingest::accept(state, instance.clone(), &body, accepted_at) {
        Ok(Ingested::Accepted { payload, touched }) => {
            state.cluster.pass_on(&instance, payload, &touched);
            receipt(state)
        }
        Ok(Ingested::AlreadySeen) => receipt(state),
        Err(IngestError::Message(err)) => {
            let reason = match err {
                AdminMessageError::InvalidJson(_) => "bad_json",
                AdminMessageError::NotAnObject => "not_object",
            };
            state.metrics.admin_rejected.with([reason]).inc();
            error_response(StatusCode::BAD_REQUEST, &err.to_string())
        }
        Err(IngestError::InstanceName) => {
            state.metrics.admin_rejected.with(["instance_name"]).inc();
            error_response(StatusCode::BAD_REQUEST, "instance name too long")
        }
        Err(IngestError::FanoutFull) => {
            state.metrics.admin_rejected.with(["fanout_full"]).inc();
            error_response(StatusCode::SERVICE_UNAVAILABLE, "server is overloaded")
        }
    }
}

fn receipt(state: &ServerState) -> Response {
    bytes_response(StatusCode::OK, JSON, aphlict::receipt(&state.fingerprint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_comes_from_the_query() {
        assert_eq!(instance_from_query(None), "default");
        assert_eq!(instance_from_query(Some("")), "default");
        assert_eq!(instance_from_query(Some("instance=")), "default");
        assert_eq!(instance_from_query(Some("instance=acme")), "acme");
        assert_eq!(instance_from_query(Some("x=1&instance=a%2Fb+c")), "a/b c");
        assert_eq!(instance_from_query(Some("instancex=1")), "default");
        // What PHP's http_build_query(['instance' => 'my team+1']) sends.
        assert_eq!(
            instance_from_query(Some("instance=my+team%2B1")),
            "my team+1"
        );
        // The first `instance` wins, as before.
        assert_eq!(instance_from_query(Some("instance=a&instance=b")), "a");
    }
}
