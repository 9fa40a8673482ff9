//! Shared test support: helpers to start the real `gorge-webhook` binary against a test
//! database and wait for its poll rounds, an in-process dispatcher with an injected clock,
//! and a database proxy that fails the way networks do. The receiver, HTTP client, process
//! wrapper and log capture come from `gorge-testkit`.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use gorge_claim::testdb::{server_opts, HookStatus, NewRequest, TestDb};
use gorge_claim::ClaimTiming;
use gorge_testkit::{eventually, free_port, CapturedLog, Process};
use gorge_webhook::clock::ManualUnixClock;
use gorge_webhook::connector::ConnectionOptions;
use gorge_webhook::delivery::Deliverer;
use gorge_webhook::dispatcher::{Dispatcher, DispatcherConfig};
use gorge_webhook::metrics::Metrics;
use gorge_webhook::policy::OutboundPolicy;

pub const BIN: &str = env!("CARGO_BIN_EXE_gorge-webhook");

/// Inserts the database's hook ([`TestDb::hook_phid`]), enabled, posting to `uri` and
/// signing with the key `k`; returns its PHID.
pub async fn enabled_hook(db: &TestDb, uri: &str) -> String {
    let hook = db.hook_phid();
    db.insert_hook(&hook, uri, HookStatus::Enabled, "k")
        .await
        .unwrap();
    hook
}

/// Queues a request of `hook` about `object` with `properties`, created at `created`;
/// returns its id.
pub async fn queue(db: &TestDb, hook: &str, object: &str, properties: &str, created: u64) -> u64 {
    let request = NewRequest::new(hook, object).with_properties(properties);
    db.insert_request(&request, created).await.unwrap()
}

/// A session that took `hook`'s per-hook lock as Phorge's worker does (`GET_LOCK(name, 0)`),
/// or `None` when another session holds it. The lock is held until the session releases it
/// or disconnects.
pub async fn take_hook_lock(db: &TestDb, hook: &str) -> Option<mysql_async::Conn> {
    use mysql_async::prelude::Queryable;
    let name = gorge_claim::hook_lock_name(db.namespace(), hook);
    let mut conn = mysql_async::Conn::new(server_opts()).await.unwrap();
    let got: Option<i64> = conn
        .exec_first("SELECT GET_LOCK(?, 0)", (&name,))
        .await
        .unwrap();
    if got == Some(1) {
        Some(conn)
    } else {
        let _ = conn.disconnect().await;
        None
    }
}

/// The `[[name, value], …]` header list of a recorded Phorge request (compat fixtures).
pub fn fixture_headers(headers: &serde_json::Value) -> Vec<(String, String)> {
    let pair = |h: &serde_json::Value| {
        let text = |i: usize| h[i].as_str().expect("a header name or value").to_owned();
        (text(0), text(1))
    };
    headers
        .as_array()
        .expect("a header list")
        .iter()
        .map(pair)
        .collect()
}

/// Seconds since the Unix epoch, for rows a real service (on the real clock) must see as due.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
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
    pub process: Process,
    pub status_addr: SocketAddr,
}

impl Service {
    /// Starts the binary on `namespace` with no blacklist (tests deliver to loopback), a
    /// poll every 100 ms, a fresh status port and the given extra environment; returns once
    /// it listens.
    pub fn start(namespace: &str, extra: &[(&str, &str)]) -> Service {
        // A port picked free can be taken before the service binds it; try a few times.
        for _ in 0..5 {
            let status_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let process = Process::spawn(Service::command(namespace, status_addr, extra));
            if process
                .wait_for_event("LISTENING", gorge_testkit::PATIENCE)
                .is_some()
            {
                return Service {
                    process,
                    status_addr,
                };
            }
        }
        panic!("gorge-webhook did not start");
    }

    /// The command [`Service::start`] runs: the binary on `namespace`, no blacklist, a poll
    /// every 100 ms, the status port on `status_addr`, then `extra`.
    pub fn command(namespace: &str, status_addr: SocketAddr, extra: &[(&str, &str)]) -> Command {
        let mut command = Command::new(BIN);
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(mysql_env())
            .env("GORGE_WEBHOOK_NAMESPACE", namespace)
            .env("GORGE_WEBHOOK_OUTBOUND_BLACKLIST", "none")
            .env("GORGE_WEBHOOK_POLL_INTERVAL_MS", "100")
            .env("GORGE_LISTEN_ADDR", status_addr.to_string())
            .env("GORGE_LOG_FORMAT", "json")
            .env("GORGE_LOG_LEVEL", "info")
            .envs(extra.iter().copied());
        command
    }

    /// `GET` on the status port; status and body.
    pub fn get(&self, path_and_query: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let response = gorge_testkit::http::get_blocking(self.status_addr, path_and_query, headers);
        (response.status, response.text())
    }

    /// The value of one `/metrics` sample (0 when absent).
    pub fn metric(&self, series: &str) -> f64 {
        gorge_testkit::sample(&self.get("/metrics", &[]).1, series).unwrap_or(0.0)
    }

    /// Poll rounds completed so far (`gorge_webhook_polls_total`).
    pub fn polls(&self) -> u64 {
        self.metric("gorge_webhook_polls_total") as u64
    }

    /// Waits until `rounds` more poll rounds have completed: everything the service would
    /// do with the rows as they are now, it has had the chance to do.
    pub async fn wait_polls(&self, rounds: u64) {
        let target = self.polls() + rounds;
        eventually(gorge_testkit::PATIENCE, "more poll rounds", || async {
            self.polls() >= target
        })
        .await;
    }

    pub fn terminate(&self) {
        self.process.sigterm();
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
    pub poll_interval: Duration,
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
            poll_interval: Duration::from_millis(50),
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
                metrics.delivery_counters(),
                &ConnectionOptions::default(),
            ),
            metrics.clone(),
            DispatcherConfig {
                poll_interval: self.poll_interval,
                max_concurrent: self.max_concurrent,
                timing: self.timing,
                error_backoff_sec: self.breaker_window_sec,
                error_threshold: self.breaker_threshold,
                db: Default::default(),
            },
            log.logger(),
        );
        (dispatcher, metrics)
    }
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
    /// Connections opened before this generation still carry statements to the server,
    /// but its answers are dropped: a statement commits and its client never hears so.
    deaf_before: std::sync::atomic::AtomicU64,
    generation: std::sync::atomic::AtomicU64,
    /// Sides of frozen flows whose other end closed, kept open as a dead network path
    /// keeps them: the far end never learns of the close (until the proxy is dropped).
    held: std::sync::Mutex<Vec<tokio::net::tcp::OwnedWriteHalf>>,
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
                tokio::spawn(pump(client_r, server_w, generation, false, shared.clone()));
                tokio::spawn(pump(server_r, client_w, generation, true, shared.clone()));
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

    /// Every existing connection loses the server's answers from now on (what it sends
    /// still arrives and runs); new ones work.
    pub fn deafen_existing(&self) {
        let generation = self.next_generation();
        self.state
            .deaf_before
            .store(generation, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every existing connection goes silent (no reset, no data); new ones work.
    pub fn blackhole_existing(&self) {
        let generation = self.next_generation();
        self.state
            .frozen_before
            .store(generation, std::sync::atomic::Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    generation: u64,
    towards_client: bool,
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
        if towards_client && generation < state.deaf_before.load(SeqCst) {
            continue;
        }
        if generation < state.frozen_before.load(SeqCst) {
            // Swallow everything from now on, keep the socket open; when this side closes,
            // the other side is still not told (no FIN passes a dead path).
            loop {
                if from.read(&mut buf).await.unwrap_or(0) == 0 {
                    state.held.lock().unwrap().push(to);
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
    gorge_testkit::process::run_to_end(BIN, args, env)
}
