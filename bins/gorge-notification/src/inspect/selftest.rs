//! `gorge-notification selftest`: the whole path a notification takes, end to end, against a
//! running server. A WebSocket subscribes to a PHID of its own on the client port (as
//! `JX.Aphlict` does), a `ping` answered with `pong` proves the subscription took effect, the
//! message is posted to the admin port as Phorge's `PhabricatorNotificationClient` posts it
//! (raw JSON labelled as a form, with `key`, `type`, `subscribers` and `uniqueID`), and the
//! frame must arrive on the socket; then `/status/` must count the socket. Every step is
//! bounded by [`TIMEOUT`](super::TIMEOUT).
//!
//! The message reaches nobody else: its only subscriber is the random PHID of this socket.

use std::io::ErrorKind;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Instant;

use rand::distr::{Alphanumeric, SampleString};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message, WebSocket};

use super::{agent, get, post_as_php, Targets, TIMEOUT};

/// What a passed selftest saw.
#[derive(Debug)]
pub struct Passed {
    /// From the end of the POST to the frame's arrival.
    pub frame_after: std::time::Duration,
    /// The server's fingerprint, from the POST's receipt.
    pub fingerprint: String,
    /// `/status/` of the instance, as the server answered it.
    pub status: String,
}

/// Runs the selftest; `Err` is one line saying which step failed and why.
pub fn run(targets: &Targets) -> Result<Passed, String> {
    let mut rng = rand::rng();
    // PHID-<4 letters>-<20 characters>, the shape of Phorge's PHIDs.
    let phid = format!(
        "PHID-GTST-{}",
        Alphanumeric
            .sample_string(&mut rng, 20)
            .to_ascii_lowercase()
    );
    let unique_id = Alphanumeric.sample_string(&mut rng, 32);
    let ws_url = targets.websocket_url();
    let mut socket = connect(&ws_url).map_err(|why| format!("WebSocket {ws_url}: {why}"))?;
    send(&mut socket, json!({"command": "subscribe", "data": [phid]}))
        .and_then(|()| send(&mut socket, json!({"command": "ping", "data": null})))
        .and_then(|()| wait_for(&mut socket, |frame| frame == r#"{"type":"pong"}"#))
        .map_err(|why| format!("WebSocket {ws_url}: subscribing: {why}"))?;

    let agent = agent();
    let post_url = targets.admin_url("/");
    let message = json!({
        "key": format!("{}", std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())),
        "type": "notification",
        "subscribers": [phid],
        "uniqueID": unique_id,
    });
    let receipt = post_as_php(&agent, &post_url, message.to_string().as_bytes())
        .map_err(|why| format!("POST {why}"))?;
    let posted = Instant::now();
    if receipt.status != 200 {
        return Err(format!(
            "POST {post_url} answered {}: {}",
            receipt.status,
            one_line(&receipt.body)
        ));
    }
    let fingerprint = serde_json::from_str::<Value>(&receipt.body)
        .ok()
        .and_then(|v| v["fingerprint"].as_str().map(str::to_string))
        .ok_or_else(|| {
            format!(
                "POST {post_url} answered 200 without a {{\"fingerprint\":…}} receipt: {}",
                one_line(&receipt.body)
            )
        })?;
    wait_for(&mut socket, |frame| {
        serde_json::from_str::<Value>(frame)
            .is_ok_and(|v| v["uniqueID"] == unique_id && v["subscribers"] == json!([phid]))
    })
    .map_err(|why| {
        format!(
            "the message posted to {post_url} (receipt from {fingerprint}) did not reach \
             {ws_url}: {why}"
        )
    })?;
    let frame_after = posted.elapsed();

    let status_url = targets.admin_url("/status/");
    let status =
        get(&agent, &status_url, "application/json").map_err(|why| format!("GET {why}"))?;
    let _ = socket.close(None);
    let counters = serde_json::from_str::<Value>(&status.body).unwrap_or(Value::Null);
    if status.status != 200 || !counters.is_object() {
        return Err(format!(
            "GET {status_url} answered {}: {}",
            status.status,
            one_line(&status.body)
        ));
    }
    if counters["clients.active"].as_u64().unwrap_or(0) == 0 {
        return Err(format!(
            "GET {status_url} does not count the open WebSocket (clients.active is {}): the \
             client and admin URLs reach different servers or instances",
            counters["clients.active"]
        ));
    }
    Ok(Passed {
        frame_after,
        fingerprint,
        status: status.body,
    })
}

/// Opens the WebSocket (plain `ws://` only: TLS is the proxy's, so test the port behind it).
fn connect(url: &str) -> Result<WebSocket<TcpStream>, String> {
    let request = url.into_client_request().map_err(|err| err.to_string())?;
    let uri = request.uri();
    if uri.scheme_str() != Some("ws") {
        return Err(
            "only ws:// URLs are tested (for wss://, test the port behind the TLS \
                    proxy, e.g. ws://127.0.0.1:22280/)"
                .to_string(),
        );
    }
    let host = uri.host().unwrap_or("").trim_matches(['[', ']']);
    let port = uri.port_u16().unwrap_or(80);
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|err| format!("cannot resolve {host}: {err}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))?;
    let stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|err| err.to_string())?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(TIMEOUT)))
        .map_err(|err| err.to_string())?;
    let (socket, _) = tungstenite::client(request, stream).map_err(|err| match err {
        tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response)) => format!(
            "the upgrade was answered {} instead of 101",
            response.status()
        ),
        other => other.to_string(),
    })?;
    Ok(socket)
}

fn send(socket: &mut WebSocket<TcpStream>, command: Value) -> Result<(), String> {
    socket
        .send(Message::text(command.to_string()))
        .map_err(|err| err.to_string())
}

/// Reads frames until a text frame `wanted` accepts, for at most [`TIMEOUT`] in all.
fn wait_for(
    socket: &mut WebSocket<TcpStream>,
    wanted: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("nothing arrived within {} s", TIMEOUT.as_secs()));
        }
        socket
            .get_ref()
            .set_read_timeout(Some(left))
            .map_err(|err| err.to_string())?;
        match socket.read() {
            Ok(Message::Text(text)) if wanted(text.as_str()) => return Ok(()),
            Ok(Message::Close(frame)) => {
                return Err(match frame {
                    Some(frame) => {
                        format!("the server closed it ({} {})", frame.code, frame.reason)
                    }
                    None => "the server closed it".to_string(),
                })
            }
            Ok(_) => {}
            Err(tungstenite::Error::Io(err))
                if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                return Err(format!("nothing arrived within {} s", TIMEOUT.as_secs()))
            }
            Err(err) => return Err(err.to_string()),
        }
    }
}

/// The first line of an answer body, shortened, for an error message.
fn one_line(body: &str) -> String {
    let line = body.lines().next().unwrap_or("").trim();
    line.chars().take(200).collect()
}
