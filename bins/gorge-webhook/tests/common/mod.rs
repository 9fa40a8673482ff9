//! Shared test support: a real HTTP receiver on an ephemeral loopback port that records raw
//! request bytes and headers, helpers to start the real `gorge-webhook` binary against a test
//! database, an in-process dispatcher with an injected clock, and a slog drain that captures
//! event names.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gorge_claim::testdb::{server_opts, TestDb};
use gorge_claim::ClaimTiming;
use gorge_webhook::clock::ManualUnixClock;
use gorge_webhook::delivery::Deliverer;
use gorge_webhook::dispatcher::{Dispatcher, DispatcherConfig};
use gorge_webhook::metrics::Metrics;
use gorge_webhook::policy::OutboundPolicy;

/// A request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// `HTTP/1.1`.
    pub version: String,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// Header names exactly as sent (case included), in arrival order.
    pub raw_names: Vec<String>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == &name.to_ascii_lowercase())
            .map(|(_, v)| v.as_str())
    }

    /// The `object.phid` of a webhook body.
    pub fn object_phid(&self) -> String {
        let value: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_default();
        value["object"]["phid"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// How the receiver answers.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16),
    /// Status with a `Location` header.
    Redirect(u16, String),
    /// Wait, then answer with the status.
    Delay(Duration, u16),
    /// Wait until [`Receiver::release`], then answer with the status.
    Hold(u16),
    /// The status with a body of this many bytes.
    Sized(u16, usize),
    /// Close the connection without answering.
    Hangup,
}

type Behaviour = Arc<dyn Fn(&Recorded, usize) -> Reply + Send + Sync>;

#[derive(Default)]
struct Log {
    requests: Vec<Recorded>,
    in_flight: HashMap<String, usize>,
    max_in_flight: HashMap<String, usize>,
    released: bool,
}

struct Shared {
    log: Mutex<Log>,
    changed: Condvar,
    behaviour: Mutex<Behaviour>,
}

/// A threaded HTTP/1.1 receiver on 127.0.0.1.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Receiver {
    /// Starts a receiver answering every request with `status`.
    pub fn start(status: u16) -> Receiver {
        Receiver::with(move |_, _| Reply::Status(status))
    }

    /// Starts a receiver whose answer is chosen per request (the second argument is the
    /// request's 0-based arrival index).
    pub fn with(behaviour: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            log: Mutex::new(Log::default()),
            changed: Condvar::new(),
            behaviour: Mutex::new(Arc::new(behaviour)),
        });
        let accept_shared = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let shared = accept_shared.clone();
                std::thread::spawn(move || serve(stream, shared));
            }
        });
        Receiver { addr, shared }
    }

    pub fn set_behaviour(
        &self,
        behaviour: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static,
    ) {
        *self.shared.behaviour.lock().unwrap() = Arc::new(behaviour);
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.log.lock().unwrap().requests.clone()
    }

    pub fn count(&self) -> usize {
        self.shared.log.lock().unwrap().requests.len()
    }

    /// Highest number of simultaneous requests seen on one path.
    pub fn max_in_flight_per_path(&self) -> usize {
        let log = self.shared.log.lock().unwrap();
        log.max_in_flight.values().copied().max().unwrap_or(0)
    }

    /// Lets held requests answer (and any later `Hold` answer at once).
    pub fn release(&self) {
        self.shared.log.lock().unwrap().released = true;
        self.shared.changed.notify_all();
    }

    /// Blocks until at least `n` requests arrived; panics after `timeout`.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Recorded> {
        let deadline = Instant::now() + timeout;
        let mut log = self.shared.log.lock().unwrap();
        while log.requests.len() < n {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("receiver got {} of {n} requests", log.requests.len()));
            log = self.shared.changed.wait_timeout(log, left).unwrap().0;
        }
        log.requests.clone()
    }
}

fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let Some(request) = read_request(&mut reader) else {
        return;
    };
    {
        let (index, behaviour) = {
            let mut log = shared.log.lock().unwrap();
            log.requests.push(request.clone());
            let now = {
                let n = log.in_flight.entry(request.path.clone()).or_insert(0);
                *n += 1;
                *n
            };
            let max = log.max_in_flight.entry(request.path.clone()).or_insert(0);
            *max = (*max).max(now);
            (
                log.requests.len() - 1,
                shared.behaviour.lock().unwrap().clone(),
            )
        };
        shared.changed.notify_all();
        let reply = behaviour(&request, index);
        if matches!(reply, Reply::Hangup) {
            let mut log = shared.log.lock().unwrap();
            if let Some(n) = log.in_flight.get_mut(&request.path) {
                *n -= 1;
            }
            return;
        }
        let mut body = b"ok".to_vec();
        let (status, location) = match reply {
            Reply::Status(s) => (s, None),
            Reply::Sized(s, size) => {
                body = vec![b'x'; size];
                (s, None)
            }
            Reply::Redirect(s, to) => (s, Some(to)),
            Reply::Delay(d, s) => {
                std::thread::sleep(d);
                (s, None)
            }
            Reply::Hold(s) => {
                let mut log = shared.log.lock().unwrap();
                while !log.released {
                    log = shared.changed.wait(log).unwrap();
                }
                (s, None)
            }
            Reply::Hangup => unreachable!("answered above"),
        };
        {
            let mut log = shared.log.lock().unwrap();
            if let Some(n) = log.in_flight.get_mut(&request.path) {
                *n -= 1;
            }
        }
        let mut head = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        if let Some(location) = location {
            head.push_str(&format!("Location: {location}\r\n"));
        }
        head.push_str("\r\n");
        let _ = writer.write_all(head.as_bytes());
        let _ = writer.write_all(&body);
        let _ = writer.flush();
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Recorded> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let version = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    let mut raw_names = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        raw_names.push(name.trim().to_string());
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Recorded {
        method,
        path,
        version,
        headers,
        raw_names,
        body,
    })
}

/// A loopback port nothing listens on (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GORGE_WEBHOOK_MYSQL_*` for the test server.
pub fn mysql_env() -> Vec<(String, String)> {
    let opts = server_opts();
    vec![
        (
            "GORGE_WEBHOOK_MYSQL_HOST".into(),
            opts.ip_or_hostname().to_string(),
        ),
        (
            "GORGE_WEBHOOK_MYSQL_PORT".into(),
            opts.tcp_port().to_string(),
        ),
        (
            "GORGE_WEBHOOK_MYSQL_USER".into(),
            opts.user().unwrap_or("root").to_string(),
        ),
        (
            "GORGE_WEBHOOK_MYSQL_PASS".into(),
            opts.pass().unwrap_or("").to_string(),
        ),
    ]
}

/// A running `gorge-webhook` process, killed when dropped.
pub struct Service {
    pub child: Child,
    pub status_addr: SocketAddr,
}

impl Service {
    /// Starts the binary on `namespace` with no blacklist (tests deliver to loopback),
    /// a fresh status port and the given extra environment.
    pub fn start(namespace: &str, extra: &[(&str, &str)]) -> Service {
        let port = free_port();
        let status_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_gorge-webhook"));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(mysql_env())
            .env("GORGE_WEBHOOK_NAMESPACE", namespace)
            .env("GORGE_WEBHOOK_OUTBOUND_BLACKLIST", "none")
            .env("GORGE_WEBHOOK_POLL_INTERVAL_MS", "100")
            .env("GORGE_LISTEN_ADDR", status_addr.to_string())
            .env("GORGE_LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (key, value) in extra {
            command.env(key, value);
        }
        let child = command.spawn().expect("start gorge-webhook");
        let service = Service { child, status_addr };
        service.wait_listening();
        service
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(self.status_addr).is_err() {
            assert!(Instant::now() < deadline, "gorge-webhook never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn get(&self, path_and_query: &str, headers: &[(&str, &str)]) -> (u16, String) {
        http_get(self.status_addr, path_and_query, headers)
    }

    /// Sends SIGTERM (through `kill`, the crate forbids `unsafe`).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "gorge-webhook did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal blocking HTTP/1.1 GET; returns status and body.
pub fn http_get(addr: SocketAddr, path_and_query: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request =
        format!("GET {path_and_query} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Polls `check` every 50 ms until it is true; panics with `what` after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Log event names captured from a slog logger.
#[derive(Clone, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<String>>>);

impl CapturedLog {
    pub fn logger(&self) -> slog::Logger {
        slog::Logger::root(CaptureDrain(self.0.clone()), slog::o!())
    }

    pub fn events(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    pub fn count(&self, event: &str) -> usize {
        self.events().iter().filter(|e| *e == event).count()
    }
}

struct CaptureDrain(Arc<Mutex<Vec<String>>>);

impl slog::Drain for CaptureDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        self.0.lock().unwrap().push(record.msg().to_string());
        Ok(())
    }
}

/// Settings for an in-process dispatcher.
pub struct Harness {
    pub policy: OutboundPolicy,
    pub timeout: Duration,
    pub timing: ClaimTiming,
    pub breaker_window_sec: u64,
    pub breaker_threshold: u64,
    pub max_concurrent: usize,
}

impl Default for Harness {
    fn default() -> Self {
        Harness {
            policy: OutboundPolicy::parse("").unwrap(),
            timeout: Duration::from_secs(5),
            timing: ClaimTiming {
                lease_sec: 30,
                retry_backoff_sec: 60,
            },
            breaker_window_sec: 300,
            breaker_threshold: 10,
            max_concurrent: 4,
        }
    }
}

impl Harness {
    /// A dispatcher on `db` with `clock`, logging into `log`. Returns its metrics too.
    pub fn build(
        self,
        db: &TestDb,
        clock: &ManualUnixClock,
        log: &CapturedLog,
    ) -> (Arc<Dispatcher>, Metrics) {
        self.build_with_store(db.store(), clock, log)
    }

    /// [`Harness::build`] on a store of the caller's (another user, a proxy, other limits).
    pub fn build_with_store(
        self,
        store: gorge_claim::ClaimStore,
        clock: &ManualUnixClock,
        log: &CapturedLog,
    ) -> (Arc<Dispatcher>, Metrics) {
        let metrics = Metrics::unregistered();
        let dispatcher = Dispatcher::new(
            store,
            Arc::new(clock.clone()),
            Deliverer::new(
                Arc::new(self.policy),
                self.timeout,
                metrics.response_bodies_truncated.clone(),
            ),
            metrics.clone(),
            DispatcherConfig {
                poll_interval: Duration::from_millis(50),
                max_concurrent: self.max_concurrent,
                timing: self.timing,
                error_backoff_sec: self.breaker_window_sec,
                error_threshold: self.breaker_threshold,
            },
            log.logger(),
        );
        (dispatcher, metrics)
    }
}

/// Creates `{namespace}_herald` from the schema file (for a namespace chosen up front).
pub async fn create_schema(namespace: &str) {
    use mysql_async::prelude::Queryable;
    let schema =
        include_str!("../../../../compat/herald-schema.sql").replace("{$NAMESPACE}", namespace);
    let mut conn = mysql_async::Conn::new(server_opts()).await.unwrap();
    let text: String = schema
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for statement in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        conn.query_drop(statement).await.unwrap();
    }
    let _ = conn.disconnect().await;
}

/// Runs one SQL statement on the server (no database selected).
pub async fn admin_sql(sql: &str) {
    use mysql_async::prelude::Queryable;
    let mut conn = mysql_async::Conn::new(server_opts()).await.unwrap();
    conn.query_drop(sql).await.unwrap();
    let _ = conn.disconnect().await;
}

/// A TCP proxy in front of the test database server that can fail the way networks do:
/// refuse and cut every connection (an outage), or silently stop forwarding on the
/// connections that exist while new ones work (a fail-over behind NAT).
#[derive(Clone)]
pub struct DbProxy {
    pub addr: SocketAddr,
    state: Arc<ProxyState>,
}

#[derive(Default)]
struct ProxyState {
    /// New connections are closed at once.
    refuse: std::sync::atomic::AtomicBool,
    /// Connections opened before this generation are cut (closed).
    cut_before: std::sync::atomic::AtomicU64,
    /// Connections opened before this generation stop forwarding, silently.
    frozen_before: std::sync::atomic::AtomicU64,
    generation: std::sync::atomic::AtomicU64,
    /// Connections accepted so far.
    accepted: std::sync::atomic::AtomicU64,
}

impl DbProxy {
    pub async fn start() -> DbProxy {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let upstream = format!(
            "{}:{}",
            server_opts().ip_or_hostname(),
            server_opts().tcp_port()
        );
        let state = Arc::new(ProxyState {
            generation: std::sync::atomic::AtomicU64::new(1),
            ..ProxyState::default()
        });
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                shared.accepted.fetch_add(1, SeqCst);
                if shared.refuse.load(SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let generation = shared.generation.load(SeqCst);
                let (client_r, client_w) = client.into_split();
                let (server_r, server_w) = server.into_split();
                tokio::spawn(pump(client_r, server_w, generation, shared.clone()));
                tokio::spawn(pump(server_r, client_w, generation, shared.clone()));
            }
        });
        DbProxy { addr, state }
    }

    /// Server options that go through the proxy.
    pub fn opts(&self) -> mysql_async::Opts {
        mysql_async::OptsBuilder::from_opts(server_opts())
            .ip_or_hostname(self.addr.ip().to_string())
            .tcp_port(self.addr.port())
            .prefer_socket(false)
            .into()
    }

    fn next_generation(&self) -> u64 {
        self.state
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1
    }

    /// The database is gone: existing connections are cut, new ones refused.
    pub fn outage(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.state.refuse.store(true, SeqCst);
        let generation = self.next_generation();
        self.state.cut_before.store(generation, SeqCst);
    }

    /// The database is back.
    pub fn restore(&self) {
        self.state
            .refuse
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every existing connection goes silent (no reset, no data); new ones work.
    pub fn blackhole_existing(&self) {
        let generation = self.next_generation();
        self.state
            .frozen_before
            .store(generation, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn accepted(&self) -> u64 {
        self.state
            .accepted
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    generation: u64,
    state: Arc<ProxyState>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::time::timeout(Duration::from_millis(50), from.read(&mut buf)).await;
        if generation < state.cut_before.load(SeqCst) {
            return;
        }
        let n = match read {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => n,
        };
        if generation < state.frozen_before.load(SeqCst) {
            // Swallow everything from now on, keep the socket open.
            loop {
                if from.read(&mut buf).await.unwrap_or(0) == 0 {
                    return;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Runs the real binary with exactly `env` (nothing inherited); exit code, stdout, stderr.
pub fn run_binary(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gorge-webhook"));
    command
        .args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command.output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}
