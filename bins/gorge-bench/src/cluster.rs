//! `gorge-bench cluster`: the cross-node cost of a gorge-notification cluster, as a mesh (each
//! server relays to every peer) or on a Redis stream (broker mode).
//!
//! N servers on loopback (plus a `redis-server` with persistence off for `--engine redis`),
//! `--sockets` per server, every socket subscribed to one PHID. Every message is posted to
//! server 0, so the frames on the other servers measure the cross-node path (POST → relay or
//! stream → frame) and server 0's the local one. Reports POST→frame percentiles for both,
//! the admin POST's, lost and duplicated frames, and the CPU time per message of every
//! gorge process and of redis-server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::browser::{self, Deliveries};
use crate::histogram::Histogram;
use crate::http1::{request_kept, HttpConn};
use crate::notify::{message_body, open_many, round3, shared_phid};
use crate::procs::{self, Service};
use crate::sys;

/// How the servers reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    /// Static peers: the server PHP posted to relays to every other.
    Mesh,
    /// Broker mode: one Redis stream.
    Redis,
}

#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    #[arg(long, value_enum, default_value_t = Engine::Redis)]
    pub engine: Engine,
    /// Servers in the cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Reading sockets per server.
    #[arg(long, default_value_t = 1000)]
    pub sockets: usize,
    /// Messages per second, all posted to server 0.
    #[arg(long, default_value_t = 500.0)]
    pub rate: f64,
    /// Messages to post.
    #[arg(long, default_value_t = 2000)]
    pub messages: usize,
    /// Whole-run limit in seconds.
    #[arg(long, default_value_t = 180)]
    pub timeout: u64,
    /// How long to wait for missing frames after the last POST, in ms.
    #[arg(long, default_value_t = 5000)]
    pub settle_ms: u64,
}

/// The Content-Type PHP's cURL sends.
const PHP_CONTENT_TYPE: &str = "application/x-www-form-urlencoded";

/// Admin connections posting in parallel (each keep-alive), as `notify` does.
const POSTERS: usize = 4;

pub async fn run(args: ClusterArgs) -> Value {
    let started = Instant::now();
    let deadline = crate::work_deadline(args.timeout);
    let nodes = args.nodes.max(2);
    let nofile = sys::raise_nofile((nodes * args.sockets + 1024) as u64);
    let redis = match args.engine {
        Engine::Redis => match Redis::start().await {
            Ok(redis) => Some(redis),
            Err(e) => return json!({"ok": false, "error": e}),
        },
        Engine::Mesh => None,
    };
    let mut ports = Vec::new();
    for _ in 0..nodes {
        match (procs::free_port(), procs::free_port()) {
            (Ok(client), Ok(admin)) => ports.push((client, admin)),
            _ => return json!({"ok": false, "error": "no free port"}),
        }
    }
    let binary = procs::sibling_binary("gorge-notification");
    let mut servers = Vec::new();
    for (index, (client, admin)) in ports.iter().enumerate() {
        let peers: Vec<u16> = match args.engine {
            Engine::Mesh => ports
                .iter()
                .filter(|(_, other)| other != admin)
                .map(|(_, other)| *other)
                .collect(),
            Engine::Redis => Vec::new(),
        };
        let mut env = procs::notification_env(*client, *admin, &peers);
        if let Some(redis) = &redis {
            env.push(("GORGE_NOTIFICATION_BROKER_URL".into(), redis.url()));
        }
        let addr = SocketAddr::from(([127, 0, 0, 1], *admin));
        let mut service = match Service::start(&format!("cluster-{index}"), &binary, &env, addr) {
            Ok(service) => service,
            Err(e) => return json!({"ok": false, "error": e}),
        };
        if let Err(e) = service.wait_ready("/readyz", Duration::from_secs(15)).await {
            return json!({"ok": false, "error": e});
        }
        servers.push(service);
    }

    // Every socket subscribes to the one PHID every message is for.
    let phid = shared_phid(0);
    let epoch = Instant::now();
    let local = Arc::new(Deliveries::new(epoch, args.messages));
    let remote = Arc::new(Deliveries::new(epoch, args.messages));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut readers = JoinSet::new();
    let mut opened = [0usize, 0usize];
    let mut failed = 0usize;
    for (index, (client, _)) in ports.iter().enumerate() {
        let url = format!("ws://127.0.0.1:{client}/");
        let addr = SocketAddr::from(([127, 0, 0, 1], *client));
        let first = index * args.sockets;
        let sockets = open_many(
            &url,
            addr,
            first..first + args.sockets,
            256,
            None,
            |_| vec![phid.clone()],
            deadline,
        )
        .await;
        failed += sockets.failed.len();
        let deliveries = if index == 0 { &local } else { &remote };
        opened[usize::from(index != 0)] += sockets.sockets.len();
        for (_, ws) in sockets.sockets {
            readers.spawn(browser::read_frames(
                ws,
                deliveries.clone(),
                stop_rx.clone(),
                false,
            ));
        }
    }
    eprintln!(
        "cluster: {nodes} servers ({:?}), {} sockets open ({failed} failed)",
        args.engine,
        opened[0] + opened[1]
    );

    let mut pids: Vec<(String, u32)> = servers.iter().map(|s| (s.name.clone(), s.pid)).collect();
    if let Some(redis) = &redis {
        pids.push(("redis-server".into(), redis.pid));
    }
    let cpu_before: Vec<Option<f64>> = pids
        .iter()
        .map(|(_, pid)| sys::cpu_seconds(*pid).ok())
        .collect();
    let post_latency = Arc::new(Histogram::new());
    let post_errors = Arc::new(AtomicUsize::new(0));
    let admin = SocketAddr::from(([127, 0, 0, 1], ports[0].1));
    let posting = post_all(
        admin,
        args.messages,
        args.rate,
        epoch,
        deadline,
        [local.clone(), remote.clone()],
        phid.clone(),
        post_latency.clone(),
        post_errors.clone(),
    );
    let joined = tokio::task::spawn_blocking(move || posting.join()).await;
    if !matches!(joined, Ok(Ok(()))) {
        return json!({"ok": false, "error": "the poster thread panicked"});
    }
    let posting_s = epoch.elapsed().as_secs_f64();
    let expected_local = (opened[0] * args.messages) as u64;
    let expected_remote = (opened[1] * args.messages) as u64;
    let settle_until = (Instant::now() + Duration::from_millis(args.settle_ms)).min(deadline);
    while Instant::now() < settle_until
        && (local.frames.load(Ordering::Relaxed) < expected_local
            || remote.frames.load(Ordering::Relaxed) < expected_remote)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cpu: Vec<Value> = pids
        .iter()
        .zip(&cpu_before)
        .map(|((name, pid), before)| {
            let used = before.zip(sys::cpu_seconds(*pid).ok()).map(|(b, a)| a - b);
            json!({
                "process": name,
                "cpu_s": used.map(round3),
                "cpu_us_per_message": used.map(|s| round3(s * 1e6 / args.messages.max(1) as f64)),
            })
        })
        .collect();
    let _ = stop_tx.send(true);
    while readers.join_next().await.is_some() {}

    let tally = |d: &Deliveries, sockets: usize| {
        let (mut lost, mut duplicates) = (0u64, 0u64);
        for count in d.received.iter() {
            let got = u64::from(count.load(Ordering::Relaxed));
            lost += (sockets as u64).saturating_sub(got);
            duplicates += got.saturating_sub(sockets as u64);
        }
        (lost, duplicates)
    };
    let (local_lost, local_dup) = tally(&local, opened[0]);
    let (remote_lost, remote_dup) = tally(&remote, opened[1]);
    let errors = post_errors.load(Ordering::Relaxed);
    let ok = failed == 0 && errors == 0 && local_lost + remote_lost + local_dup + remote_dup == 0;
    drop(servers);
    json!({
        "ok": ok,
        "engine": format!("{:?}", args.engine).to_lowercase(),
        "nodes": nodes,
        "sockets_per_node": args.sockets,
        "sockets_failed": failed,
        "nofile_limit": nofile.ok(),
        "messages": args.messages,
        "rate": args.rate,
        "posting_s": round3(posting_s),
        "post_errors": errors,
        "admin_post_ms": post_latency.percentiles(),
        "cross_node_post_to_frame_ms": remote.latency.percentiles(),
        "local_post_to_frame_ms": local.latency.percentiles(),
        "lost": {"local": local_lost, "cross_node": remote_lost},
        "duplicates": {"local": local_dup, "cross_node": remote_dup},
        "cpu": cpu,
        "elapsed_s": round3(started.elapsed().as_secs_f64()),
    })
}

/// Posts `messages` to `admin` at `rate` from their own thread and runtime (on the readers'
/// runtime a response would wait behind thousands of woken reader tasks and be measured as
/// the server's latency), recording each POST's start in both `deliveries`.
#[allow(clippy::too_many_arguments)]
fn post_all(
    admin: SocketAddr,
    messages: usize,
    rate: f64,
    epoch: Instant,
    deadline: Instant,
    deliveries: [Arc<Deliveries>; 2],
    phid: String,
    latency: Arc<Histogram>,
    errors: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    let interval_us = if rate > 0.0 { 1e6 / rate } else { 0.0 };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the posters");
    let next = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let mut posters = JoinSet::new();
            for _ in 0..POSTERS {
                let (deliveries, phid, latency, errors, next) = (
                    deliveries.clone(),
                    phid.clone(),
                    latency.clone(),
                    errors.clone(),
                    next.clone(),
                );
                posters.spawn(async move {
                    let mut conn: Option<HttpConn> = None;
                    loop {
                        let seq = next.fetch_add(1, Ordering::Relaxed);
                        if seq >= messages || Instant::now() >= deadline {
                            return;
                        }
                        let due = epoch + Duration::from_micros((seq as f64 * interval_us) as u64);
                        tokio::time::sleep_until(due.into()).await;
                        let sent_us = deliveries[0].now_us().max(1);
                        let body = message_body(seq, std::slice::from_ref(&phid), sent_us, "");
                        for d in &deliveries {
                            d.posted_at_us[seq].store(sent_us, Ordering::Relaxed);
                        }
                        let started = Instant::now();
                        let result = request_kept(
                            &mut conn,
                            admin,
                            "POST",
                            "/",
                            &[("Content-Type", PHP_CONTENT_TYPE)],
                            &body,
                        )
                        .await;
                        match result {
                            Ok(response) if response.status == 200 => {
                                latency.record(started.elapsed().as_micros() as u64)
                            }
                            Ok(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
            while posters.join_next().await.is_some() {}
        })
    })
}

/// A `redis-server` of this run: loopback, persistence off; killed when dropped.
struct Redis {
    _child: Child,
    pid: u32,
    port: u16,
}

impl Redis {
    async fn start() -> Result<Redis, String> {
        let port = procs::free_port().map_err(|e| e.to_string())?;
        let child = Command::new(redis_binary())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start redis-server: {e}"))?;
        let pid = child.id().ok_or("redis-server exited at once")?;
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if ping(port).await {
                return Ok(Redis {
                    _child: child,
                    pid,
                    port,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("redis-server did not answer on port {port}"))
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// `redis-server` from `PATH` (Debian's package).
fn redis_binary() -> PathBuf {
    PathBuf::from("redis-server")
}

async fn ping(port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut answer = [0u8; 7];
        stream.read_exact(&mut answer).await.ok()?;
        Some(&answer == b"+PONG\r\n")
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}
