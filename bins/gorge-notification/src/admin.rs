//! The admin port (docs/notification.md, "Admin port"): Phorge's PHP posts messages to `POST /` and reads `GET /status/`;
//! the probes (`/healthz`, `/readyz`, `/metrics`) live here too.
//!
//! `PhabricatorNotificationClient` posts raw JSON labelled `application/x-www-form-urlencoded`
//! (cURL's default) and only looks at the status code, so `Content-Type` is ignored entirely
//! and success bodies are bare (no envelope); errors use the shared envelope.

use std::sync::Arc;
use std::time::Instant;

use gorge_service::http::{
    bytes_response, error_response, method_not_allowed, read_body_limited, BodyError, JSON,
};
use gorge_service::Response;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use phorge_wire::aphlict::{self, AdminMessage, AdminMessageError, Status};

use crate::events;
use crate::fanout::Job;
use crate::state::ServerState;
use crate::wire;
use gorge_service::emit;

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
pub async fn handle(app: Arc<ServerState>, request: Request<Incoming>) -> Response {
    let path = request.uri().path().to_string();
    if path == "/metrics" {
        // Gauges of hub state are read when scraped, not kept up to date on every change.
        app.metrics.set_usage(app.hub.usage());
    }
    if let Some(response) = app.probes.handle(&request).await {
        return response;
    }
    match path.as_str() {
        "/" if request.method() == Method::POST => {
            let started = Instant::now();
            let response = post_message(&app, request).await;
            app.metrics
                .admin_post_seconds
                .observe(started.elapsed().as_secs_f64());
            response
        }
        "/" => method_not_allowed("POST"),
        "/status/" if matches!(*request.method(), Method::GET | Method::HEAD) => {
            // Counters include every message whose POST was answered before this request.
            app.fanout.settled().await;
            status(&app, request.uri().query())
        }
        "/status/" => method_not_allowed("GET, HEAD"),
        _ => error_response(StatusCode::NOT_FOUND, "no such path"),
    }
}

fn status(app: &ServerState, query: Option<&str>) -> Response {
    let instance = instance_from_query(query);
    let hub = app.hub.status(&instance);
    let status = Status {
        instance,
        uptime: u64::try_from(app.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        clients_active: hub.clients_active,
        clients_total: hub.clients_total,
        messages_in: hub.messages_in,
        messages_out: hub.messages_out,
        version: aphlict::PROTOCOL_VERSION,
        history_size: hub.history_size,
        history_age: hub.history_age_ms,
        server: Some(ServerState::server_name()),
    };
    let (entries, bytes) = app.hub.history_totals();
    app.metrics.set_history(entries, bytes);
    bytes_response(StatusCode::OK, JSON, status.to_json())
}

async fn post_message(app: &ServerState, request: Request<Incoming>) -> Response {
    let instance = instance_from_query(request.uri().query());
    let body = match read_body_limited(request, app.limits.max_admin_body_bytes).await {
        Ok(body) => body,
        Err(BodyError::TooLarge) => {
            app.metrics.admin_rejected.with(["too_large"]).inc();
            return error_response(StatusCode::PAYLOAD_TOO_LARGE, "message body too large");
        }
        Err(BodyError::Read) => {
            return error_response(StatusCode::BAD_REQUEST, "could not read the request body")
        }
    };
    let accepted_at = Instant::now();
    let message = match aphlict::parse_admin_message(&body, &app.fingerprint) {
        Ok(AdminMessage::Accepted(message)) => message,
        Ok(AdminMessage::AlreadySeen) => {
            // Not delivered again, but Aphlict counts every POST it parsed.
            app.hub.count_message_in();
            app.metrics.messages_duplicate.inc();
            return receipt(app);
        }
        Err(err) => {
            let reason = match err {
                AdminMessageError::InvalidJson(_) => "bad_json",
                AdminMessageError::NotAnObject => "not_object",
            };
            app.metrics.admin_rejected.with([reason]).inc();
            return error_response(StatusCode::BAD_REQUEST, &err.to_string());
        }
    };
    if !app.hub.instance_name_ok(&instance) {
        app.metrics.admin_rejected.with(["instance_name"]).inc();
        return error_response(StatusCode::BAD_REQUEST, "instance name too long");
    }
    // Encoded once: every recipient, the history and the peers share these bytes.
    let frame = wire::text(&message.body);
    drop(message.body);
    let subscribers = message.subscribers.len();
    let job = Job {
        instance,
        subscribers: message.subscribers,
        frame: frame.clone(),
        accepted_at,
        at_ms: 0,
    };
    let instance = job.instance.clone();
    if app.fanout.submit(job).is_err() {
        app.metrics.admin_rejected.with(["fanout_full"]).inc();
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "server is overloaded");
    }
    app.hub.count_message_in();
    app.metrics.messages_in.inc();
    emit!(app.log, events::NOTIFY_MESSAGE_ACCEPTED;
        "instance" => &instance, "subscribers" => subscribers, "bytes" => frame.len());
    app.relay
        .relay(&instance, wire::payload(&frame), &message.touched);
    if let Some(broker) = &app.broker {
        broker.publish(&instance, wire::payload(&frame), &message.touched);
    }
    receipt(app)
}

fn receipt(app: &ServerState) -> Response {
    bytes_response(StatusCode::OK, JSON, aphlict::receipt(&app.fingerprint))
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
