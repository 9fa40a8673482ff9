//! Shared helpers of the integration tests: start the real binary on free loopback ports (a
//! `gorge_testkit::Process`), the admin-port calls PHP makes, and drive WebSocket clients that use `ping`/`pong` ordering as
//! the synchronisation signal (a `pong` proves every earlier command took effect and every
//! frame queued before it was written).

#![allow(dead_code)]

pub mod broker;
pub mod redis;
pub mod tls;

use std::ops::Deref;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use gorge_testkit::http::{self, HttpResponse};
use gorge_testkit::{free_ports, Process};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

pub use gorge_testkit::PATIENCE;

pub const BIN: &str = env!("CARGO_BIN_EXE_gorge-notification");

/// A running server's two ports and its fingerprint, with the calls tests make on them;
/// [`Server`] and [`InProcess`] dereference to it.
pub struct Endpoints {
    pub client_port: u16,
    pub admin_port: u16,
    pub fingerprint: String,
}

impl Endpoints {
    pub async fn post(&self, query: &str, body: &str) -> HttpResponse {
        post(self.admin_port, query, body).await
    }

    /// [`Endpoints::post`], which must be accepted (200).
    pub async fn post_ok(&self, query: &str, body: &str) -> HttpResponse {
        let response = self.post(query, body).await;
        assert_eq!(response.status, 200, "{response:?}");
        response
    }

    pub async fn status(&self, query: &str) -> Value {
        status(self.admin_port, query).await
    }

    /// The value of one sample line of `/metrics`, e.g. `gorge_notification_sockets_open{instance_class="default"}`.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        metric(self.admin_port, sample).await
    }

    /// Asserts that the `/metrics` sample `sample` reads `value`.
    pub async fn assert_metric(&self, sample: &str, value: f64) {
        assert_eq!(self.metric(sample).await, Some(value), "{sample}");
    }

    pub async fn ws(&self, path: &str) -> Ws {
        Ws::connect(self.client_port, path).await
    }

    /// The HTTP status of a WebSocket upgrade on `path` that the server must refuse.
    pub async fn refused_upgrade(&self, path: &str) -> u16 {
        Server::refused_upgrade_on(self.client_port, path).await
    }

    /// A socket subscribed to one PHID, and a message posted to it that this server relayed
    /// to the peer on `peer_admin_port` (waits until `peer_up` of that peer is 1).
    pub async fn relayed_to(&self, peer_admin_port: u16) -> Ws {
        let mut ws = self.ws("/").await;
        ws.subscribe(&["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]).await;
        self.post_ok(
            "",
            r#"{"key":"1","subscribers":["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]}"#,
        )
        .await;
        let up = format!("gorge_notification_peer_up{{peer=\"127.0.0.1:{peer_admin_port}\"}}");
        gorge_testkit::eventually(PATIENCE, "the relay to the peer succeeded", || async {
            self.metric(&up).await == Some(1.0)
        })
        .await;
        ws
    }
}

/// A running server process; killed on drop.
pub struct Server {
    pub process: Process,
    endpoints: Endpoints,
}

impl Deref for Server {
    type Target = Endpoints;

    fn deref(&self) -> &Endpoints {
        &self.endpoints
    }
}

impl Server {
    /// Starts the binary with `env` on two free loopback ports and waits for NOTIFY_STARTED.
    pub fn start(env: &[(&str, &str)]) -> Server {
        Server::start_program(Path::new(BIN), env)
    }

    /// [`Server::start`] for another build of the binary.
    pub fn start_program(program: &Path, env: &[(&str, &str)]) -> Server {
        Server::start_with(|| Command::new(program), env)
    }

    /// Starts the binary through `sh -c "<shell>; exec BIN"` (e.g. `ulimit -n 64`).
    pub fn start_in_shell(shell: &str, env: &[(&str, &str)]) -> Server {
        Server::start_with(
            || {
                let mut command = Command::new("/bin/sh");
                command.args(["-c", &format!("{shell}; exec \"$0\""), BIN]);
                command
            },
            env,
        )
    }

    fn start_with(command: impl Fn() -> Command, env: &[(&str, &str)]) -> Server {
        // A port picked free can be taken before the server binds it; try a few times.
        for _ in 0..5 {
            // Two ports held at once, so they differ (two free_port() calls can return one).
            let ports = free_ports(2);
            if let Some(server) = Server::spawn(command(), ports[0], ports[1], env) {
                return server;
            }
        }
        panic!("server did not start");
    }

    /// Starts the binary on the given ports (once; `None` if it did not start).
    pub fn start_on(client_port: u16, admin_port: u16, env: &[(&str, &str)]) -> Option<Server> {
        Server::spawn(Command::new(BIN), client_port, admin_port, env)
    }

    fn spawn(
        mut command: Command,
        client_port: u16,
        admin_port: u16,
        env: &[(&str, &str)],
    ) -> Option<Server> {
        command
            .env_clear()
            .env("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1")
            .env("GORGE_NOTIFICATION_CLIENT_PORT", client_port.to_string())
            .env("GORGE_NOTIFICATION_ADMIN_PORT", admin_port.to_string())
            .env("GORGE_LOG_FORMAT", "json")
            .env("GORGE_LOG_LEVEL", "info")
            .envs(env.iter().copied());
        let process = Process::spawn(command);
        let started = process.wait_for_event("NOTIFY_STARTED", PATIENCE)?;
        Some(Server {
            process,
            endpoints: Endpoints {
                client_port,
                admin_port,
                fingerprint: started["fingerprint"].as_str().unwrap().to_string(),
            },
        })
    }

    pub fn sigterm(&self) {
        self.process.sigterm();
    }

    /// Waits until `event` has been logged; returns its first occurrence.
    pub async fn wait_for_log(&self, event: &str) -> Value {
        self.process.logged(event).await
    }

    /// Waits for the exit after a SIGTERM: status 0 and one `NOTIFY_DRAIN_DONE` with no
    /// socket left open, which it returns.
    pub async fn drained(&mut self) -> Value {
        assert_eq!(self.process.exited().await.code(), Some(0));
        let done = self.log_events("NOTIFY_DRAIN_DONE");
        assert_eq!(done.len(), 1, "{done:?}");
        assert_eq!(done[0]["open_sockets"], 0, "{}", done[0]);
        done.into_iter().next().unwrap()
    }

    /// Every logged `event` so far.
    pub fn log_events(&self, event: &str) -> Vec<Value> {
        self.process.log_events(event)
    }

    /// [`Endpoints::refused_upgrade`] on any client port.
    pub async fn refused_upgrade_on(port: u16, path: &str) -> u16 {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let url = format!("ws://127.0.0.1:{port}{path}");
        let handshake =
            tokio::time::timeout(PATIENCE, tokio_tungstenite::client_async(url, stream))
                .await
                .expect("handshake answered in time");
        match handshake {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                response.status().as_u16()
            }
            other => panic!("expected a refused upgrade, got {other:?}"),
        }
    }
}

/// The whole service in this process, on free loopback ports, with the hub on a manual
/// clock: tests move time instead of sleeping.
pub struct InProcess {
    endpoints: Endpoints,
    pub clock: Arc<gorge_hub::ManualMillisClock>,
    shutdown: gorge_service::Shutdown,
}

impl InProcess {
    /// Defaults (drain window 0), then `tweak`.
    pub async fn start(tweak: impl FnOnce(&mut gorge_notification::config::Config)) -> Self {
        InProcess::start_with(None, tweak).await
    }

    /// [`InProcess::start`] with a whole-request time limit other than the default.
    pub async fn start_with(
        request_timeout: Option<Duration>,
        tweak: impl FnOnce(&mut gorge_notification::config::Config),
    ) -> Self {
        InProcess::start_tuned(tweak, |server| match request_timeout {
            Some(timeout) => server.with_request_timeout(timeout),
            None => server,
        })
        .await
    }

    /// [`InProcess::start`], with `tune` applied to the bound server before it runs.
    pub async fn start_tuned(
        tweak: impl FnOnce(&mut gorge_notification::config::Config),
        tune: impl FnOnce(gorge_notification::service::Server) -> gorge_notification::service::Server,
    ) -> Self {
        use gorge_notification::config::ServerKind;
        let mut config = gorge_notification::config::load(None).expect("default configuration");
        for server in &mut config.servers {
            server.addr = "127.0.0.1:0".parse().unwrap();
        }
        config.drain_window = Duration::ZERO;
        tweak(&mut config);
        let clock = gorge_hub::ManualMillisClock::new();
        let log = slog::Logger::root(slog::Discard, slog::o!());
        let server = gorge_notification::service::Server::bind(config, clock.clone(), &log)
            .await
            .expect("bind loopback ports");
        let server = tune(server);
        let port = |kind| server.local_addr(kind).unwrap().port();
        let (client_port, admin_port) = (port(ServerKind::Client), port(ServerKind::Admin));
        let fingerprint = server.state().fingerprint.clone();
        let shutdown = gorge_service::Shutdown::new();
        tokio::spawn(server.run(shutdown.clone()));
        InProcess {
            endpoints: Endpoints {
                client_port,
                admin_port,
                fingerprint,
            },
            clock,
            shutdown,
        }
    }
}

impl Deref for InProcess {
    type Target = Endpoints;

    fn deref(&self) -> &Endpoints {
        &self.endpoints
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

/// Posts `body` to the admin port as Phorge's PHP client does (labelled as a form).
/// A size `/proc/<process>/status` gives in KiB (`key` with its colon: `VmRSS:`, `RssAnon:`,
/// `VmHWM:`); `process` is a pid, or `"self"` for the test's own process.
pub fn status_kib(process: impl std::fmt::Display, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{process}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in\n{status}"));
    line[key.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A WebSocket upgrade made by hand on `stream`, for tests that need the raw bytes after it:
/// writes `request_line` (e.g. `GET / HTTP/1.1`) with the upgrade headers and RFC 6455's
/// sample key, and returns the response head, byte by byte up to its blank line.
pub async fn raw_upgrade(stream: &mut TcpStream, request_line: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "{request_line}\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

pub async fn post(admin_port: u16, query: &str, body: &str) -> HttpResponse {
    http::request(
        admin_port,
        "POST",
        &format!("/{query}"),
        &[("Content-Type", "application/x-www-form-urlencoded")],
        body.as_bytes(),
    )
    .await
}

/// `GET /status/{query}` on the admin port, which must answer 200 with JSON.
pub async fn status(admin_port: u16, query: &str) -> Value {
    let r = http::request(admin_port, "GET", &format!("/status/{query}"), &[], b"").await;
    assert_eq!(r.status, 200);
    r.json()
}

/// The value of one sample line of `/metrics` on `admin_port`.
pub async fn metric(admin_port: u16, sample: &str) -> Option<f64> {
    let r = http::request(admin_port, "GET", "/metrics", &[], b"").await;
    gorge_testkit::sample(&r.text(), sample)
}

/// A test WebSocket client, over plain TCP or (`tls::Wss`) over TLS.
pub struct Ws<S = TcpStream> {
    pub ws: WebSocketStream<S>,
}

/// What a socket saw before the server closed it.
#[derive(Debug)]
pub struct Closed {
    pub code: Option<u16>,
    pub frames: Vec<String>,
}

impl Ws {
    pub async fn connect(port: u16, path: &str) -> Ws {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let url = format!("ws://127.0.0.1:{port}{path}");
        let (ws, response) =
            tokio::time::timeout(PATIENCE, tokio_tungstenite::client_async(url, stream))
                .await
                .expect("handshake in time")
                .expect("handshake");
        assert_eq!(response.status(), 101);
        Ws { ws }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Ws<S> {
    pub async fn send(&mut self, text: &str) {
        self.ws.send(Message::text(text)).await.unwrap();
    }

    /// The next text frame.
    pub async fn next_text(&mut self) -> String {
        loop {
            let message = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("a frame in time")
                .expect("socket open")
                .expect("no error");
            match message {
                Message::Text(text) => return text.to_string(),
                Message::Close(frame) => panic!("closed: {frame:?}"),
                _ => {}
            }
        }
    }

    /// Sends `ping` and returns every text frame that arrived before the `pong`.
    pub async fn sync(&mut self) -> Vec<String> {
        self.send(r#"{"command":"ping"}"#).await;
        let mut before = Vec::new();
        loop {
            let text = self.next_text().await;
            if text == r#"{"type":"pong"}"# {
                return before;
            }
            before.push(text);
        }
    }

    /// Subscribes and waits until the subscription has taken effect.
    pub async fn subscribe(&mut self, phids: &[&str]) {
        let command = serde_json::json!({"command": "subscribe", "data": phids});
        self.send(&command.to_string()).await;
        assert_eq!(self.sync().await, Vec::<String>::new());
    }

    /// Reads until the server closes; returns the close code and text frames seen first.
    pub async fn until_closed(&mut self) -> Closed {
        let mut frames = Vec::new();
        loop {
            let next = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("close in time");
            match next {
                Some(Ok(Message::Text(text))) => frames.push(text.to_string()),
                Some(Ok(Message::Close(frame))) => {
                    return Closed {
                        code: frame.map(|f: CloseFrame| u16::from(f.code)),
                        frames,
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return Closed { code: None, frames },
            }
        }
    }
}
