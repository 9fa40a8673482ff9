//! `gorge-bench handshakes`: how many new browser connections a notification server takes
//! per second, and what each costs it — TCP connect, the TLS handshake for a `wss://` URL
//! (always a full one: every connection stands for a new browser), the WebSocket upgrade,
//! and the close that follows.
//!
//! A fixed number of connections are kept being opened at once for `--seconds`; the
//! server's CPU time over that window (`/proc/PID/stat`, user + system) divided by the
//! connections completed is its cost per connection, and its inverse the handshakes one
//! core of the server sustains per second — the figure that compares servers fairly when
//! the bench shares the same cores.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::browser;
use crate::histogram::Histogram;
use crate::http1::{ServerArgs, ServerUrls};
use crate::notify::round3;
use crate::sys;
use crate::tls::ClientTls;

#[derive(Debug, Clone, Args)]
pub struct HandshakesArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Seconds of load measured.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Connections being opened at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Server process to take CPU time and RSS from (/proc).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Whole-run limit in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

/// Longest one connection may take (connect, handshake, upgrade) before it counts as failed.
const ATTEMPT_LIMIT: Duration = Duration::from_secs(10);

/// What the connecting tasks share.
struct Shared {
    url: String,
    server: SocketAddr,
    tls: Option<Arc<ClientTls>>,
    stop: AtomicBool,
    /// Connections started, also the index that spreads them over source addresses.
    next: AtomicUsize,
    completed: AtomicU64,
    /// Failures by message, so a run that fails says why.
    errors: Mutex<BTreeMap<String, u64>>,
    latency: Histogram,
    /// Protocol version and cipher suite of the first TLS connection.
    tls_parameters: Mutex<Option<(String, String)>>,
}

pub async fn run(args: HandshakesArgs) -> Value {
    let deadline = crate::work_deadline(args.timeout);
    let nofile = sys::raise_nofile((args.concurrency + 1024) as u64);
    let ServerUrls {
        client, client_tls, ..
    } = match args.server.resolve() {
        Ok(parsed) => parsed,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    let seconds = Duration::from_secs(args.seconds.max(1));
    if Instant::now() + seconds + ATTEMPT_LIMIT > deadline {
        return json!({"ok": false, "error": "--seconds does not fit in --timeout"});
    }
    let shared = Arc::new(Shared {
        url: args.server.client.clone(),
        server: client,
        tls: client_tls,
        stop: AtomicBool::new(false),
        next: AtomicUsize::new(0),
        completed: AtomicU64::new(0),
        errors: Mutex::new(BTreeMap::new()),
        latency: Histogram::new(),
        tls_parameters: Mutex::new(None),
    });
    let rss_before = args.pid.and_then(|pid| sys::rss_bytes(pid).ok());
    let cpu_before = args.pid.and_then(|pid| sys::cpu_seconds(pid).ok());
    let own_cpu_before = sys::cpu_seconds(std::process::id()).ok();
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..args.concurrency.max(1) {
        tasks.spawn(connect_loop(shared.clone()));
    }
    tokio::time::sleep(seconds).await;
    shared.stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    let wall_s = started.elapsed().as_secs_f64();
    let cpu_after = args.pid.and_then(|pid| sys::cpu_seconds(pid).ok());
    let own_cpu_after = sys::cpu_seconds(std::process::id()).ok();
    let rss_after = args.pid.and_then(|pid| sys::rss_bytes(pid).ok());

    let completed = shared.completed.load(Ordering::Relaxed);
    let errors = shared.errors.lock().expect("errors").clone();
    let failed: u64 = errors.values().sum();
    let server_cpu_s = cpu_before.zip(cpu_after).map(|(b, a)| a - b);
    let per_cpu_s = server_cpu_s
        .filter(|&cpu| cpu > 0.0)
        .map(|cpu| completed as f64 / cpu);
    let tls = shared.tls_parameters.lock().expect("tls").clone();
    json!({
        "ok": failed == 0 && completed > 0,
        "client": args.server.client,
        "client_tls": tls.map(|(version, suite)| json!({"version": version, "suite": suite})),
        "concurrency": args.concurrency,
        "nofile_limit": nofile.ok(),
        "wall_s": round3(wall_s),
        "completed": completed,
        "failed": failed,
        "errors": errors,
        "per_s": round3(completed as f64 / wall_s),
        "connect_ms": shared.latency.percentiles(),
        "server_pid": args.pid,
        "server_cpu_s": server_cpu_s.map(round3),
        "server_cores_busy": server_cpu_s.map(|cpu| round3(cpu / wall_s)),
        "server_handshakes_per_cpu_s": per_cpu_s.map(round3),
        "server_cpu_us_per_handshake": per_cpu_s.map(|rate| round3(1e6 / rate)),
        "bench_cpu_s": own_cpu_before.zip(own_cpu_after).map(|(b, a)| round3(a - b)),
        "server_rss_before_bytes": rss_before,
        "server_rss_after_bytes": rss_after,
        "load_average": sys::load_average(),
    })
}

/// Opens connections one after the other until told to stop: each is upgraded, then
/// closed with a close frame (as a tab that goes away), and the next one starts.
async fn connect_loop(shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Relaxed) {
        let index = shared.next.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let source = browser::source_ip(shared.server, index);
        let attempt = tokio::time::timeout(
            ATTEMPT_LIMIT,
            browser::open(
                &shared.url,
                shared.server,
                source,
                None,
                shared.tls.as_deref(),
            ),
        )
        .await
        .unwrap_or_else(|_| Err("timed out".to_string()));
        match attempt {
            Ok(mut ws) => {
                shared.latency.record(started.elapsed().as_micros() as u64);
                shared.completed.fetch_add(1, Ordering::Relaxed);
                if shared.tls.is_some() {
                    let mut first = shared.tls_parameters.lock().expect("tls");
                    if first.is_none() {
                        *first = ws.get_ref().tls_parameters();
                    }
                }
                // The close is sent, not waited for: the server's side of it is part of
                // the cost measured, the bench's wait for it is not.
                let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
            }
            Err(why) => {
                *shared
                    .errors
                    .lock()
                    .expect("errors")
                    .entry(why)
                    .or_default() += 1;
            }
        }
    }
}
