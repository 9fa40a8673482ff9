//! `gorge-bench cluster`: the cross-node cost of a gorge-notification cluster, as a mesh (each
//! server relays to every peer) or on a Redis stream (broker mode).
//!
//! N servers on loopback (plus a `redis-server` with persistence off for `--engine redis`),
//! `--sockets` per server. What it models: a Phorge install where every node holds that many
//! browsers, and each message (a task update) is for the few browsers watching that object:
//! `--measured` sockets per server subscribe to the one PHID every message is for and time
//! each frame; the others subscribe to their own user's PHID, which no message is for, and
//! only keep their connection (they answer the server's pings). Every socket is a raw
//! minimal client ([`raw_browser`]), so thousands of them cost the bench next to nothing and the
//! two cores go to the servers. `--measured` equal to `--sockets` makes every socket a
//! recipient (the all-subscribers fan-out of earlier runs).
//!
//! Every message is posted to server 0, so the frames on the other servers measure the
//! cross-node path (POST → relay or stream → frame) and server 0's the local one. Reports
//! POST→frame percentiles for both, the admin POST's, lost and duplicated frames, the CPU
//! time per message of every gorge process and of redis-server, each server's own fan-out
//! time and what it counted as dropped (peer relays, broker queue, socket queues), and the
//! load average.
//!
//! With `--pause-redis-ms`, redis-server is SIGSTOPped that long during the posting (from
//! `--pause-after-ms` on) and then resumed: the report adds how late the messages posted
//! during the pause reached every other server (the latest measured socket of each), and
//! whether any was lost or came twice.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::browser;
use crate::histogram::Histogram;
use crate::http1::{request_kept, HttpConn};
use crate::notify::{message_body, private_phid, round3, shared_phid, PHP_CONTENT_TYPE};
use crate::procs::{self, Service};
use crate::raw_browser::{self, End};
use crate::redis_server::Redis;
use crate::server_metrics;
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
    /// Subscribed sockets per server (measured ones included).
    #[arg(long, default_value_t = 1000)]
    pub sockets: usize,
    /// Sockets per server that every message is for, and whose frames are timed.
    #[arg(long, default_value_t = 10)]
    pub measured: usize,
    /// Messages per second, all posted to server 0.
    #[arg(long, default_value_t = 500.0)]
    pub rate: f64,
    /// Messages to post.
    #[arg(long, default_value_t = 5000)]
    pub messages: usize,
    /// Whole-run limit in seconds.
    #[arg(long, default_value_t = 180)]
    pub timeout: u64,
    /// How long to wait for missing frames after the last POST, in ms.
    #[arg(long, default_value_t = 5000)]
    pub settle_ms: u64,
    /// SIGSTOP redis-server this long during the posting (`--engine redis`), in ms.
    #[arg(long, default_value_t = 0)]
    pub pause_redis_ms: u64,
    /// When the pause starts, in ms after the first POST.
    #[arg(long, default_value_t = 2000)]
    pub pause_after_ms: u64,
    /// `GORGE_NOTIFICATION_BROKER_QUEUE_CAPACITY` of every server (its default if unset).
    #[arg(long)]
    pub broker_queue: Option<usize>,
    /// The gorge-notification binary to run (default: the one beside this bench), e.g. an
    /// older build to compare in the same session.
    #[arg(long)]
    pub binary: Option<PathBuf>,
}

/// Admin connections posting in parallel (each keep-alive), as `notify` does.
const POSTERS: usize = 4;

/// WebSocket handshakes in flight at once while ramping up.
const CONNECT_CONCURRENCY: usize = 128;

/// Every frame of one side (the entry server's sockets, or all the others') of a run.
struct Arrivals {
    epoch: Instant,
    /// When the POST of each sequence number started, µs since `epoch` (0 = not posted).
    posted_at_us: Box<[AtomicU64]>,
    /// Frames received per sequence number, over all measured sockets of this side.
    received: Box<[AtomicU32]>,
    /// When the last of a sequence number's frames arrived, µs since `epoch`.
    latest_us: Box<[AtomicU64]>,
    latency: Histogram,
    frames: AtomicU64,
    /// Text frames that are not a bench message (pongs excluded): a sign of a bench bug.
    foreign: AtomicU64,
}

impl Arrivals {
    fn new(epoch: Instant, messages: usize) -> Arrivals {
        let zeros = || (0..messages).map(|_| AtomicU64::new(0)).collect();
        Arrivals {
            epoch,
            posted_at_us: zeros(),
            received: (0..messages).map(|_| AtomicU32::new(0)).collect(),
            latest_us: zeros(),
            latency: Histogram::new(),
            frames: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn record(&self, text: &[u8]) {
        let now = self.now_us();
        let seq = std::str::from_utf8(text)
            .ok()
            .and_then(browser::frame_seq)
            .filter(|&seq| seq < self.received.len());
        let Some(seq) = seq else {
            self.unexpected(text);
            return;
        };
        self.received[seq].fetch_add(1, Ordering::Relaxed);
        self.frames.fetch_add(1, Ordering::Relaxed);
        self.latest_us[seq].fetch_max(now, Ordering::Relaxed);
        let posted = self.posted_at_us[seq].load(Ordering::Relaxed);
        if posted > 0 {
            self.latency.record(now.saturating_sub(posted));
        }
    }

    /// A text frame where no bench message was due: counted unless it is a pong.
    fn unexpected(&self, text: &[u8]) {
        if text != raw_browser::PONG {
            self.foreign.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `(lost, duplicated)` frames of sequence number `seq`, for `sockets` measured sockets
    /// on this side.
    fn lost_and_duplicated(&self, seq: usize, sockets: usize) -> (u64, u64) {
        let got = u64::from(self.received[seq].load(Ordering::Relaxed));
        let sockets = sockets as u64;
        (sockets.saturating_sub(got), got.saturating_sub(sockets))
    }

    /// `(lost, duplicated)` frames of every sequence number.
    fn tally(&self, sockets: usize) -> (u64, u64) {
        (0..self.received.len())
            .map(|seq| self.lost_and_duplicated(seq, sockets))
            .fold((0, 0), |(l, d), (lost, dup)| (l + lost, d + dup))
    }
}

pub async fn run(args: ClusterArgs) -> Value {
    let started = Instant::now();
    let deadline = crate::work_deadline(args.timeout);
    let nodes = args.nodes.max(2);
    let measured = args.measured.clamp(1, args.sockets.max(1));
    let load_before = sys::load_average();
    let nofile = sys::raise_nofile((nodes * args.sockets + 1024) as u64);
    if args.pause_redis_ms > 0 && args.engine != Engine::Redis {
        return json!({"ok": false, "error": "--pause-redis-ms needs --engine redis"});
    }
    let redis = match args.engine {
        Engine::Redis => match start_redis().await {
            Ok(redis) => Some(redis),
            Err(e) => return json!({"ok": false, "error": e}),
        },
        Engine::Mesh => None,
    };
    let Ok(ports) = procs::free_port_pairs(nodes) else {
        return json!({"ok": false, "error": "no free port"});
    };
    let binary = args
        .binary
        .clone()
        .unwrap_or_else(|| procs::sibling_binary("gorge-notification"));
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
        if let Some(capacity) = args.broker_queue {
            env.push((
                "GORGE_NOTIFICATION_BROKER_QUEUE_CAPACITY".into(),
                capacity.to_string(),
            ));
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

    let phid = shared_phid(0);
    let epoch = Instant::now();
    let local = Arc::new(Arrivals::new(epoch, args.messages));
    let remote = Arc::new(Arrivals::new(epoch, args.messages));
    let (stop_tx, stop_rx) = watch::channel(false);
    let closed_early = Arc::new(AtomicUsize::new(0));
    let mut readers = JoinSet::new();
    let mut opened = [0usize, 0usize];
    let mut failed = 0usize;
    let mut first_error = None;
    let permits = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let mut opening = JoinSet::new();
    for (node, (client, _)) in ports.iter().enumerate() {
        let server = SocketAddr::from(([127, 0, 0, 1], *client));
        for k in 0..args.sockets {
            let index = node * args.sockets + k;
            let is_measured = k < measured;
            let phids = vec![if is_measured {
                phid.clone()
            } else {
                private_phid(index)
            }];
            let permit = permits.clone().acquire_owned().await;
            opening.spawn(async move {
                let _permit = permit;
                let left = deadline.saturating_duration_since(Instant::now());
                let ws =
                    raw_browser::open(server, index, &phids, left.min(Duration::from_secs(30)));
                (node, is_measured, ws.await)
            });
        }
    }
    while let Some(joined) = opening.join_next().await {
        let (node, is_measured, ws) = match joined {
            Ok(done) => done,
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e.to_string());
                continue;
            }
        };
        let ws = match ws {
            Ok(ws) => ws,
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
                continue;
            }
        };
        if is_measured {
            opened[usize::from(node != 0)] += 1;
        }
        let (stop, closed_early) = (stop_rx.clone(), closed_early.clone());
        let arrivals = if node == 0 { &local } else { &remote }.clone();
        readers.spawn(async move {
            let on_text = |text: &[u8]| {
                if is_measured {
                    arrivals.record(text)
                } else {
                    arrivals.unexpected(text)
                }
            };
            if ws.read(stop, on_text).await == End::Closed {
                closed_early.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    eprintln!(
        "cluster: {nodes} servers ({:?}), {} sockets open, {} measured ({failed} failed{})",
        args.engine,
        nodes * args.sockets - failed,
        opened[0] + opened[1],
        first_error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    );

    let mut pids: Vec<(String, u32)> = servers.iter().map(|s| (s.name.clone(), s.pid)).collect();
    if let Some(redis) = &redis {
        pids.extend(redis.pid().map(|pid| ("redis-server".into(), pid)));
    }
    let cpu_before: Vec<Option<f64>> = pids
        .iter()
        .map(|(_, pid)| sys::cpu_seconds(*pid).ok())
        .collect();
    let mut metrics_before = Vec::new();
    for (_, admin) in &ports {
        metrics_before
            .push(server_metrics::snapshot(SocketAddr::from(([127, 0, 0, 1], *admin))).await);
    }
    let load_during_start = sys::load_average();
    let post_latency = Arc::new(Histogram::new());
    let post_errors = Arc::new(AtomicUsize::new(0));
    let admin = SocketAddr::from(([127, 0, 0, 1], ports[0].1));
    let posting_from = local.now_us();
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
    // A started server has a pid until it is killed, which this run never does.
    let pause = match (redis.as_ref().and_then(Redis::pid), args.pause_redis_ms) {
        (Some(pid), ms) if ms > 0 => Some(tokio::spawn(pause_redis(
            pid,
            local.clone(),
            Duration::from_millis(args.pause_after_ms),
            Duration::from_millis(ms),
        ))),
        _ => None,
    };
    let joined = tokio::task::spawn_blocking(move || posting.join()).await;
    if !matches!(joined, Ok(Ok(()))) {
        return json!({"ok": false, "error": "the poster thread panicked"});
    }
    let paused = match pause {
        Some(pause) => match pause.await {
            Ok(Ok(window)) => Some(window),
            Ok(Err(e)) => return json!({"ok": false, "error": e}),
            Err(e) => return json!({"ok": false, "error": e.to_string()}),
        },
        None => None,
    };
    let posting_s = (local.now_us() - posting_from) as f64 / 1e6;
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
    let load_after = sys::load_average();
    // What each server measured itself: its fan-out time (a message taken in → its last
    // frame queued; on the other servers from the moment the relay or the stream reader
    // handed it over), which splits a POST→frame figure into the server's share and the
    // rest (hops, scheduling, the bench); and what it counted as given up, so a missing
    // frame has a cause.
    let mut servers_seen = Vec::new();
    for (index, (_, admin)) in ports.iter().enumerate() {
        let admin = SocketAddr::from(([127, 0, 0, 1], *admin));
        let Some(metrics) = server_metrics::snapshot(admin).await else {
            servers_seen.push(json!({"server": index, "metrics": null}));
            continue;
        };
        let own = metrics_before[index]
            .as_ref()
            .map(|before| server_metrics::delta(before, &metrics));
        let relays = "gorge_notification_peer_relays_total";
        servers_seen.push(json!({
            "server": index,
            "fanout_p50_le_ms": own.as_ref().and_then(|d| d.fanout_p50_le_ms),
            "fanout_p99_le_ms": own.as_ref().and_then(|d| d.fanout_p99_le_ms),
            "admin_post_p99_le_ms": own.as_ref().and_then(|d| d.admin_post_p99_le_ms),
            "peer_relays_dropped": metrics.sum_where(relays, "result=\"dropped\""),
            "peer_relays_expired": metrics.sum_where(relays, "result=\"expired\""),
            "peer_relays_failed": metrics.sum_where(relays, "result=\"failed\""),
            "broker_dropped": metrics.sum_where("gorge_notification_broker_dropped_total", ""),
            "queue_dropped_frames":
                metrics.sum_where("gorge_notification_queue_dropped_frames_total", ""),
            "slow_consumer_disconnects":
                metrics.sum_where("gorge_notification_slow_consumer_disconnects_total", ""),
        }));
    }
    let _ = stop_tx.send(true);
    while readers.join_next().await.is_some() {}

    let (local_lost, local_dup) = local.tally(opened[0]);
    let (remote_lost, remote_dup) = remote.tally(opened[1]);
    let errors = post_errors.load(Ordering::Relaxed);
    let foreign = local.foreign.load(Ordering::Relaxed) + remote.foreign.load(Ordering::Relaxed);
    let ok = failed == 0 && errors == 0 && local_lost + remote_lost + local_dup + remote_dup == 0;
    let pause_report = paused.map(|window| pause_report(&remote, opened[1], window));
    drop(servers);
    json!({
        "ok": ok,
        "engine": format!("{:?}", args.engine).to_lowercase(),
        "nodes": nodes,
        "sockets_per_node": args.sockets,
        "measured_per_node": measured,
        "sockets_failed": failed,
        "sockets_closed_early": closed_early.load(Ordering::Relaxed),
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
        "foreign_frames": foreign,
        "redis_paused": pause_report,
        "servers": servers_seen,
        "cpu": cpu,
        "load_average": {"before": load_before, "posting_start": load_during_start, "after": load_after},
        "elapsed_s": round3(started.elapsed().as_secs_f64()),
    })
}

/// SIGSTOPs redis-server `after` the first POST for `pause`, then SIGCONTs it; returns the
/// window in µs since the run's epoch.
async fn pause_redis(
    pid: u32,
    clock: Arc<Arrivals>,
    after: Duration,
    pause: Duration,
) -> Result<(u64, u64), String> {
    tokio::time::sleep(after).await;
    let from = clock.now_us();
    sys::send_signal(pid, sys::Signal::STOP).map_err(|e| format!("SIGSTOP redis: {e}"))?;
    tokio::time::sleep(pause).await;
    let until = clock.now_us();
    sys::send_signal(pid, sys::Signal::CONT).map_err(|e| format!("SIGCONT redis: {e}"))?;
    eprintln!(
        "cluster: redis-server paused {:.1} s",
        (until - from) as f64 / 1e6
    );
    Ok((from, until))
}

/// How late the messages posted while Redis was paused reached the other servers: for each,
/// the latest of its cross-node frames, from its POST.
fn pause_report(remote: &Arrivals, sockets: usize, (from, until): (u64, u64)) -> Value {
    let lateness = Histogram::new();
    let (mut posted, mut lost, mut duplicates) = (0u64, 0u64, 0u64);
    // The last of them all, after Redis was resumed: how long the catching up took.
    let mut last_arrival = 0u64;
    for seq in 0..remote.posted_at_us.len() {
        let at = remote.posted_at_us[seq].load(Ordering::Relaxed);
        if at < from || at > until {
            continue;
        }
        posted += 1;
        let (seq_lost, seq_duplicates) = remote.lost_and_duplicated(seq, sockets);
        lost += seq_lost;
        duplicates += seq_duplicates;
        let latest = remote.latest_us[seq].load(Ordering::Relaxed);
        if latest > 0 {
            lateness.record(latest.saturating_sub(at));
            last_arrival = last_arrival.max(latest);
        }
    }
    json!({
        "paused_s": round3((until - from) as f64 / 1e6),
        "messages_posted_while_paused": posted,
        "lost_frames": lost,
        "duplicate_frames": duplicates,
        "lateness_ms": lateness.percentiles(),
        "all_delivered_after_resume_ms": round3(last_arrival.saturating_sub(until) as f64 / 1e3),
    })
}

/// Posts `messages` to `admin` at `rate` from their own thread and runtime (on the readers'
/// runtime a response would wait behind woken reader tasks and be measured as the server's
/// latency), recording each POST's start in both `arrivals`.
#[allow(clippy::too_many_arguments)]
fn post_all(
    admin: SocketAddr,
    messages: usize,
    rate: f64,
    epoch: Instant,
    deadline: Instant,
    arrivals: [Arc<Arrivals>; 2],
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
    let start = Instant::now();
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let mut posters = JoinSet::new();
            for _ in 0..POSTERS {
                let (arrivals, phid, latency, errors, next) = (
                    arrivals.clone(),
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
                        let due = start + Duration::from_micros((seq as f64 * interval_us) as u64);
                        tokio::time::sleep_until(due.into()).await;
                        let sent_us = epoch.elapsed().as_micros().max(1) as u64;
                        let body = message_body(seq, std::slice::from_ref(&phid), sent_us, "");
                        for a in &arrivals {
                            a.posted_at_us[seq].store(sent_us, Ordering::Relaxed);
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
                            _ => {
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

/// This run's `redis-server`, on a free port.
async fn start_redis() -> Result<Redis, String> {
    let port = procs::free_port().map_err(|e| e.to_string())?;
    Redis::start(port).await
}
