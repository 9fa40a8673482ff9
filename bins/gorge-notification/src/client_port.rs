//! The client port (docs/notification.md, "Client port"): WebSocket upgrades on any path, and the exact Aphlict answer to
//! everything else.
//!
//! Phorge's cluster status page probes this port with a plain HTTP request and treats `501`
//! as healthy and anything else (even `200`) as broken, so a non-upgrade request must get
//! exactly Aphlict's status and 24-byte body.

use std::sync::Arc;

use bytes::Bytes;
use gorge_hub::ConnectError;
use gorge_service::http::{bytes_response, error_response};
use gorge_service::http10::WasHttp10;
use gorge_service::{ConnectionSlot, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{
    HeaderMap, HeaderName, CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY,
    SEC_WEBSOCKET_VERSION, UPGRADE,
};
use hyper::{Method, Request, StatusCode};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::events;
use crate::metrics::instance_class;
use crate::session::{self, Registration};
use crate::state::ServerState;
use gorge_service::emit;

/// Aphlict's answer to any request that is not a WebSocket upgrade.
pub const NOT_WEBSOCKET_BODY: &[u8] = b"HTTP/501 Use Websockets\n";

/// Instance of a client socket: the text after the first `~` in the path, up to the next `/`;
/// `default` when there is no `~` or the name is empty.
pub fn instance_from_path(path: &str) -> &str {
    let name = path
        .split_once('~')
        .map(|(_, rest)| rest.split('/').next().unwrap_or(""))
        .unwrap_or("");
    if name.is_empty() {
        "default"
    } else {
        name
    }
}

fn has_token(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|part| part.trim().eq_ignore_ascii_case(token))
        })
    })
}

/// A WebSocket opening handshake (RFC 6455 §4.2.1). `Upgrade: h2c` and friends are not.
fn is_websocket_upgrade(request: &Request<Incoming>) -> bool {
    let headers = request.headers();
    request.method() == Method::GET
        && has_token(headers, CONNECTION, "upgrade")
        && has_token(headers, UPGRADE, "websocket")
        && headers.contains_key(SEC_WEBSOCKET_KEY)
        && headers
            .get(SEC_WEBSOCKET_VERSION)
            .is_some_and(|v| v.as_bytes() == b"13")
}

/// Handles one request on the client port.
pub async fn handle(state: Arc<ServerState>, request: Request<Incoming>) -> Response {
    if !is_websocket_upgrade(&request) {
        let mut response = bytes_response(
            StatusCode::NOT_IMPLEMENTED,
            "text/plain",
            Bytes::from_static(NOT_WEBSOCKET_BODY),
        );
        // An HTTP/1.0 request read as 1.1 (for its upgrade) still ends its connection, as
        // Node ends it.
        if request.extensions().get::<WasHttp10>().is_some() {
            response
                .headers_mut()
                .insert(CONNECTION, hyper::header::HeaderValue::from_static("close"));
        }
        return response;
    }
    if state.probes.is_draining() {
        state.metrics.sockets_rejected.with(["draining"]).inc();
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "server is draining");
    }
    let instance = instance_from_path(request.uri().path()).to_string();
    // An instance PHP has posted to is confirmed by the fan-out thread; a browser that
    // connects right after that POST was answered must find it so, not be refused as one
    // more unknown instance.
    let handle = match state.fanout.settled().await.connect(&instance) {
        Ok(handle) => handle,
        Err(err) => {
            let (status, reason) = match err {
                ConnectError::TooManySockets => (StatusCode::SERVICE_UNAVAILABLE, "max_sockets"),
                ConnectError::TooManyInstances => {
                    (StatusCode::SERVICE_UNAVAILABLE, "max_instances")
                }
                ConnectError::InstanceNameTooLong => (StatusCode::BAD_REQUEST, "instance_name"),
            };
            state.metrics.sockets_rejected.with([reason]).inc();
            return error_response(status, &err.to_string());
        }
    };
    let class = instance_class(&instance);
    state.metrics.sockets.with([class]).inc();
    state.metrics.sockets_open.with([class]).inc();
    // The connection's place under the client port's cap goes with the socket.
    let slot = request.extensions().get::<ConnectionSlot>().cloned();
    let registration = Registration::new(state.clone(), handle, class, slot);
    emit!(state.log, events::NOTIFY_CLIENT_CONNECTED; "instance" => &instance);

    let key = request
        .headers()
        .get(SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()))
        .unwrap_or_default();
    // Taking the upgrade by value lets the request (headers and all) go now instead of
    // living as long as the socket.
    let upgrade = hyper::upgrade::on(request);
    tokio::spawn(async move {
        // The registration is dropped (socket unregistered) on every path out of here.
        match upgrade.await {
            Ok(upgraded) => session::run(registration, upgraded).await,
            // The connection ended between our 101 and the hand-over.
            Err(_) => {
                state.metrics.sockets_closed.with(["upgrade_failed"]).inc();
            }
        }
    });
    let mut response = hyper::Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(
        CONNECTION,
        hyper::header::HeaderValue::from_static("Upgrade"),
    );
    headers.insert(
        UPGRADE,
        hyper::header::HeaderValue::from_static("websocket"),
    );
    if let Ok(value) = key.parse() {
        headers.insert(SEC_WEBSOCKET_ACCEPT, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_from_the_path() {
        assert_eq!(instance_from_path("/"), "default");
        assert_eq!(instance_from_path("/~acme/"), "acme");
        assert_eq!(instance_from_path("/~acme"), "acme");
        assert_eq!(instance_from_path("/ws/~acme/x"), "acme");
        assert_eq!(instance_from_path("/~/"), "default");
        assert_eq!(instance_from_path("/x/y"), "default");
        assert_eq!(instance_from_path("/~a~b/"), "a~b");
    }

    #[test]
    fn not_websocket_body_is_24_bytes() {
        assert_eq!(NOT_WEBSOCKET_BODY.len(), 24);
    }
}
