//! `gorge-notification selftest`: the whole path a notification takes, end to end, against a
//! running server. A WebSocket subscribes to a PHID of its own on the client port (as
//! `JX.Aphlict` does), a `ping` answered with `pong` proves the subscription took effect, the
//! message is posted to the admin port as Phorge's `PhabricatorNotificationClient` posts it
//! (raw JSON labelled as a form, with `key`, `type`, `subscribers` and `uniqueID`), and the
//! frame must arrive on the socket; then `/status/` must count the socket. Every step is
//! bounded by [`TIMEOUT`](super::TIMEOUT).
//!
//! The message reaches nobody else: its only subscriber is the random PHID of this socket.

use std::io::{ErrorKind, Read, Write};
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
    let mut socket =
        connect(&ws_url, targets.verify_tls).map_err(|why| format!("WebSocket {ws_url}: {why}"))?;
    send(&mut socket, json!({"command": "subscribe", "data": [phid]}))
        .and_then(|()| send(&mut socket, json!({"command": "ping", "data": null})))
        .and_then(|()| wait_for(&mut socket, |frame| frame == r#"{"type":"pong"}"#))
        .map_err(|why| format!("WebSocket {ws_url}: subscribing: {why}"))?;

    let agent = agent(targets);
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

/// The selftest's connection: plain TCP, or TLS over it for a `wss://` URL.
enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Conn {
    fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.set_read_timeout(timeout),
            Conn::Tls(s) => s.sock.set_read_timeout(timeout),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// The TLS client of a `wss://` URL: the system's roots when `verify`, else our own
/// process's check (see `gorge_service::healthcheck::probe_tls`).
fn tls_client(verify: bool) -> std::sync::Arc<rustls::ClientConfig> {
    if !verify {
        return gorge_service::healthcheck::own_process_tls();
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports the default versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// Opens the WebSocket, `ws://` or `wss://`.
fn connect(url: &str, verify: bool) -> Result<WebSocket<Conn>, String> {
    let request = url.into_client_request().map_err(|err| err.to_string())?;
    let uri = request.uri();
    let tls = match uri.scheme_str() {
        Some("ws") => false,
        Some("wss") => true,
        _ => return Err("expected a ws:// or wss:// URL".to_string()),
    };
    let host = uri
        .host()
        .unwrap_or("")
        .trim_matches(['[', ']'])
        .to_string();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|err| format!("cannot resolve {host}: {err}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))?;
    let stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|err| err.to_string())?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(TIMEOUT)))
        .map_err(|err| err.to_string())?;
    let conn = if tls {
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|err| format!("{host}: {err}"))?;
        let client = rustls::ClientConnection::new(tls_client(verify), name)
            .map_err(|err| err.to_string())?;
        Conn::Tls(Box::new(rustls::StreamOwned::new(client, stream)))
    } else {
        Conn::Plain(stream)
    };
    let (socket, _) = tungstenite::client(request, conn).map_err(|err| match err {
        tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response)) => format!(
            "the upgrade was answered {} instead of 101",
            response.status()
        ),
        other => other.to_string(),
    })?;
    Ok(socket)
}

fn send(socket: &mut WebSocket<Conn>, command: Value) -> Result<(), String> {
    socket
        .send(Message::text(command.to_string()))
        .map_err(|err| err.to_string())
}

/// Reads frames until a text frame `wanted` accepts, for at most [`TIMEOUT`] in all.
fn wait_for(socket: &mut WebSocket<Conn>, wanted: impl Fn(&str) -> bool) -> Result<(), String> {
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
