//! `gorge-bench notify`: fan-out load against any Aphlict-compatible server.
//!
//! Opens N reading sockets (plus optional stuck ones that never read), posts M messages at a
//! fixed rate through the admin port, and measures what a browser would see: how long a
//! POST takes, how long until the frame arrives, and whether every frame arrives.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::browser::{self, Deliveries, Ws};
use crate::histogram::Histogram;
use crate::http1::{request_kept, HttpConn, ServerArgs, ServerUrls};
use crate::server_metrics;
use crate::sys;
use crate::tls::ClientTls;

/// Where browsers connect: the client URL, its address, and TLS for a `wss://` URL.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    pub server: SocketAddr,
    pub tls: Option<Arc<ClientTls>>,
}

/// The label PHP's cURL puts on the raw JSON body; the server must ignore it.
pub const PHP_CONTENT_TYPE: &str = "application/x-www-form-urlencoded";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Fanout {
    /// Every message goes to the shared PHID every reading socket subscribed to.
    All,
    /// Every message goes to one socket's private PHID (round robin).
    One,
}

#[derive(Debug, Clone, Args)]
pub struct NotifyArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Reading sockets to open.
    #[arg(long, default_value_t = 1000)]
    pub sockets: usize,
    /// Messages to post.
    #[arg(long, default_value_t = 100)]
    pub messages: usize,
    /// Messages per second.
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Shared PHIDs each socket subscribes to besides its private one.
    #[arg(long, default_value_t = 1)]
    pub shared: usize,
    /// Extra sockets that subscribe to the shared PHID and never read.
    #[arg(long, default_value_t = 0)]
    pub stuck: usize,
    /// Server process to sample RSS and CPU time from (/proc).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Whole-run limit in seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    #[arg(long, value_enum, default_value_t = Fanout::All)]
    pub fanout: Fanout,
    /// WebSocket handshakes in flight at once while ramping up.
    #[arg(long, default_value_t = 256)]
    pub connect_concurrency: usize,
    /// Admin connections posting in parallel (each keep-alive).
    #[arg(long, default_value_t = 4)]
    pub post_concurrency: usize,
    /// Filler bytes added to each message (stuck sockets fill their buffers sooner).
    #[arg(long, default_value_t = 0)]
    pub payload_bytes: usize,
    /// How long to wait for missing frames after the last POST, in ms.
    #[arg(long, default_value_t = 5000)]
    pub settle_ms: u64,
}

pub fn private_phid(socket: usize) -> String {
    format!("PHID-USER-bench{socket:07}")
}

pub fn shared_phid(k: usize) -> String {
    format!("PHID-PROJ-bench{k:04}")
}

/// The message body for sequence `seq`, as PHP would post it.
pub fn message_body(seq: usize, subscribers: &[String], sent_us: u64, payload: &str) -> Vec<u8> {
    json!({
        "key": format!("bench-{seq}"),
        "type": "notification",
        "subscribers": subscribers,
        "bench_seq": seq,
        "bench_sent_us": sent_us,
        "pad": payload,
    })
    .to_string()
    .into_bytes()
}

/// Opened sockets of one role.
pub struct Opened {
    pub sockets: Vec<(usize, Ws)>,
    /// Indices that did not end subscribed.
    pub failed: Vec<usize>,
    pub first_error: Option<String>,
}

/// Opens `count` sockets with bounded handshake concurrency; each is subscribed to
/// `phids(index)` and confirmed by pong before it counts as opened.
pub async fn open_many(
    target: &Target,
    indices: std::ops::Range<usize>,
    concurrency: usize,
    recv_buffer: Option<u32>,
    phids: impl Fn(usize) -> Vec<String>,
    deadline: Instant,
) -> Opened {
    let permits = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = JoinSet::new();
    let mut opened = Opened {
        sockets: Vec::new(),
        failed: Vec::new(),
        first_error: None,
    };
    for index in indices {
        let permit = permits.clone().acquire_owned().await;
        let Target { url, server, tls } = target.clone();
        let subscriptions = phids(index);
        tasks.spawn(async move {
            let _permit = permit;
            let left = deadline.saturating_duration_since(Instant::now());
            let result = tokio::time::timeout(left, async {
                let source = browser::source_ip(server, index);
                let mut ws =
                    browser::open(&url, server, source, recv_buffer, tls.as_deref()).await?;
                browser::subscribe_confirmed(&mut ws, &subscriptions, Duration::from_secs(30))
                    .await?;
                Ok::<Ws, String>(ws)
            })
            .await
            .unwrap_or_else(|_| Err("deadline".to_string()));
            (index, result)
        });
        // Reap finished handshakes as we go so the set does not hold every result.
        while let Some(joined) = tasks.try_join_next() {
            collect(&mut opened, joined);
        }
    }
    while let Some(joined) = tasks.join_next().await {
        collect(&mut opened, joined);
    }
    opened.sockets.sort_by_key(|(index, _)| *index);
    opened.failed.sort_unstable();
    opened
}

type OpenResult = Result<(usize, Result<Ws, String>), tokio::task::JoinError>;

fn collect(opened: &mut Opened, joined: OpenResult) {
    match joined {
        Ok((index, Ok(ws))) => opened.sockets.push((index, ws)),
        Ok((index, Err(e))) => {
            opened.failed.push(index);
            opened.first_error.get_or_insert(e);
        }
        // A handshake task cannot panic short of a bug; its index is unknown here.
        Err(e) => {
            opened.first_error.get_or_insert(e.to_string());
        }
    }
}

/// POSTs that went wrong, by kind.
#[derive(Default)]
struct PostErrors {
    non_200: AtomicU64,
    io: AtomicU64,
}

pub async fn run(args: NotifyArgs) -> Value {
    let started = Instant::now();
    let deadline = crate::work_deadline(args.timeout);
    let nofile = sys::raise_nofile((args.sockets + args.stuck + 1024) as u64);
    let ServerUrls {
        client: server,
        admin,
        admin_path,
        client_tls,
        ..
    } = match args.server.resolve() {
        Ok(parsed) => parsed,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    let browsers = Target {
        url: args.server.client.clone(),
        server,
        tls: client_tls,
    };
    let rss_before = args.pid.and_then(|pid| sys::rss_bytes(pid).ok());

    // Ramp up: readers first, then the stuck sockets (tiny receive buffers so that they
    // really stop draining the server's writes).
    let shared: Vec<String> = (0..args.shared.max(1)).map(shared_phid).collect();
    let ramp_started = Instant::now();
    let readers = open_many(
        &browsers,
        0..args.sockets,
        args.connect_concurrency,
        None,
        |i| {
            std::iter::once(private_phid(i))
                .chain(shared.iter().cloned())
                .collect()
        },
        deadline,
    )
    .await;
    let stuck = open_many(
        &browsers,
        args.sockets..args.sockets + args.stuck,
        args.connect_concurrency,
        Some(4096),
        |_| shared.clone(),
        deadline,
    )
    .await;
    let ramp_s = ramp_started.elapsed().as_secs_f64();
    let rss_after = args.pid.and_then(|pid| sys::rss_bytes(pid).ok());
    eprintln!(
        "notify: {} readers open ({} failed), {} stuck open ({} failed) in {ramp_s:.1}s",
        readers.sockets.len(),
        readers.failed.len(),
        stuck.sockets.len(),
        stuck.failed.len()
    );

    let client_tls_parameters = readers
        .sockets
        .first()
        .and_then(|(_, ws)| ws.get_ref().tls_parameters());

    let epoch = Instant::now();
    let deliveries = Arc::new(Deliveries::new(epoch, args.messages));
    let (stop_tx, stop_rx) = watch::channel(false);
    let reader_indices: Vec<usize> = readers.sockets.iter().map(|(i, _)| *i).collect();
    let reader_count = reader_indices.len();
    let mut reader_tasks = JoinSet::new();
    for (_, ws) in readers.sockets {
        reader_tasks.spawn(browser::read_frames(
            ws,
            deliveries.clone(),
            stop_rx.clone(),
            false,
        ));
    }
    let stuck_opened = stuck.sockets.len();
    let stuck_sockets = stuck.sockets; // held open, never read

    let expected_per_message = match args.fanout {
        Fanout::All => reader_count as u64,
        Fanout::One => u64::from(reader_count > 0),
    };
    let expected_total = expected_per_message * args.messages as u64;

    // Posting phase.
    let metrics_before = server_metrics::snapshot(admin).await;
    let cpu_before = args.pid.and_then(|pid| sys::cpu_seconds(pid).ok());
    let post_latency = Arc::new(Histogram::new());
    let post_errors = Arc::new(PostErrors::default());
    let next_seq = Arc::new(AtomicUsize::new(0));
    let payload = Arc::new("x".repeat(args.payload_bytes));
    let reader_indices = Arc::new(reader_indices);
    let target = admin_path;
    let interval_us = if args.rate > 0.0 {
        1e6 / args.rate
    } else {
        0.0
    };
    // The posters get their own thread and runtime: on the readers' runtime a POST's
    // response waits behind thousands of woken reader tasks, and that wait would be
    // measured as the server's admin latency.
    let posters_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the posters");
    let (concurrency, messages, fanout, shared0) = (
        args.post_concurrency.max(1),
        args.messages,
        args.fanout,
        shared[0].clone(),
    );
    let (deliveries_for_posters, latency_for_posters, errors_for_posters) = (
        deliveries.clone(),
        post_latency.clone(),
        post_errors.clone(),
    );
    let posting = std::thread::spawn(move || {
        posters_runtime.block_on(async move {
            let mut posters = JoinSet::new();
            for _ in 0..concurrency {
                let (deliveries, post_latency, post_errors) = (
                    deliveries_for_posters.clone(),
                    latency_for_posters.clone(),
                    errors_for_posters.clone(),
                );
                let (next_seq, payload, reader_indices, target) = (
                    next_seq.clone(),
                    payload.clone(),
                    reader_indices.clone(),
                    target.clone(),
                );
                let shared0 = shared0.clone();
                posters.spawn(async move {
                    let mut conn: Option<HttpConn> = None;
                    loop {
                        let seq = next_seq.fetch_add(1, Ordering::Relaxed);
                        if seq >= messages || Instant::now() >= deadline {
                            return;
                        }
                        let due = epoch + Duration::from_micros((seq as f64 * interval_us) as u64);
                        tokio::time::sleep_until(due.into()).await;
                        let subscribers = match fanout {
                            Fanout::All => vec![shared0.clone()],
                            Fanout::One if reader_indices.is_empty() => Vec::new(),
                            Fanout::One => {
                                vec![private_phid(reader_indices[seq % reader_indices.len()])]
                            }
                        };
                        let sent_us = deliveries.now_us().max(1);
                        let body = message_body(seq, &subscribers, sent_us, &payload);
                        deliveries.posted_at_us[seq].store(sent_us, Ordering::Relaxed);
                        let started = Instant::now();
                        let result = request_kept(
                            &mut conn,
                            admin,
                            "POST",
                            &target,
                            &[("Content-Type", PHP_CONTENT_TYPE)],
                            &body,
                        )
                        .await;
                        match result {
                            Ok(response) if response.status == 200 => {
                                post_latency.record(started.elapsed().as_micros() as u64)
                            }
                            Ok(_) => {
                                post_errors.non_200.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                post_errors.io.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
            while posters.join_next().await.is_some() {}
        })
    });
    let joined = tokio::task::spawn_blocking(move || posting.join()).await;
    assert!(matches!(joined, Ok(Ok(()))), "the poster thread panicked");
    let posting_s = epoch.elapsed().as_secs_f64();

    // Wait for the stragglers: until everything expected arrived, the settle time passed
    // without it, or the run deadline.
    let settle_until = (Instant::now() + Duration::from_millis(args.settle_ms)).min(deadline);
    while Instant::now() < settle_until
        && deliveries.frames.load(Ordering::Relaxed) < expected_total
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cpu_after = args.pid.and_then(|pid| sys::cpu_seconds(pid).ok());
    // Every socket still open and idle again after the burst: what the server kept.
    let rss_end = args.pid.and_then(|pid| sys::rss_bytes(pid).ok());
    let _ = stop_tx.send(true);
    while reader_tasks.join_next().await.is_some() {}
    let stuck_fate = stuck_fate(stuck_sockets).await;
    let server_delta = match (metrics_before, server_metrics::snapshot(admin).await) {
        (Some(before), Some(after)) => Some(server_metrics::delta(&before, &after)),
        _ => None,
    };

    let mut delivered_unique = 0u64;
    let mut lost = 0u64;
    let mut duplicates = 0u64;
    for count in deliveries.received.iter() {
        let got = u64::from(count.load(Ordering::Relaxed));
        delivered_unique += got.min(expected_per_message);
        lost += expected_per_message.saturating_sub(got);
        duplicates += got.saturating_sub(expected_per_message);
    }
    let frames = deliveries.frames.load(Ordering::Relaxed);
    let last_frame_s = deliveries.last_frame_us.load(Ordering::Relaxed) as f64 / 1e6;
    let deliveries_per_s = if last_frame_s > 0.0 {
        frames as f64 / last_frame_s
    } else {
        0.0
    };
    let per_socket = |after: Option<u64>| match (rss_before, after) {
        (Some(b), Some(a)) if reader_count + stuck_opened > 0 => {
            Some((a as f64 - b as f64) / (reader_count + stuck_opened) as f64)
        }
        _ => None,
    };
    let (rss_per_socket, rss_per_socket_end) = (per_socket(rss_after), per_socket(rss_end));
    let cpu_us_per_frame = match (cpu_before, cpu_after) {
        (Some(b), Some(a)) if frames > 0 => Some((a - b) * 1e6 / frames as f64),
        _ => None,
    };
    let ok = lost == 0 && duplicates == 0 && readers.failed.is_empty() && stuck.failed.is_empty();
    json!({
        "ok": ok,
        "fanout": format!("{:?}", args.fanout).to_lowercase(),
        "client_tls": client_tls_parameters.map(|(version, suite)| json!({"version": version, "suite": suite})),
        "sockets_requested": args.sockets,
        "sockets_opened": reader_count,
        "sockets_failed": args.sockets - reader_count,
        "stuck_opened": stuck_opened,
        "stuck_failed": args.stuck - stuck_opened,
        "stuck_closed_by_server": stuck_fate.closed,
        "stuck_close_codes": stuck_fate.codes,
        "first_open_error": readers.first_error.or(stuck.first_error),
        "ramp_s": round3(ramp_s),
        "nofile_limit": nofile.ok(),
        "messages": args.messages,
        "rate": args.rate,
        "posting_s": round3(posting_s),
        "expected": expected_total,
        "delivered": delivered_unique,
        "lost": lost,
        "duplicates": duplicates,
        "foreign_frames": deliveries.foreign_frames.load(Ordering::Relaxed),
        "sockets_closed_early": deliveries.closed_early.load(Ordering::Relaxed),
        "deliveries_per_s": round3(deliveries_per_s),
        "post_errors_non_200": post_errors.non_200.load(Ordering::Relaxed),
        "post_errors_io": post_errors.io.load(Ordering::Relaxed),
        "admin_post_ms": post_latency.percentiles(),
        "post_to_frame_ms": deliveries.latency.percentiles(),
        "server_metrics": server_delta,
        "server_pid": args.pid,
        "server_rss_before_bytes": rss_before,
        "server_rss_after_bytes": rss_after,
        "server_rss_per_socket_bytes": rss_per_socket.map(round3),
        "server_rss_end_bytes": rss_end,
        "server_rss_per_socket_end_bytes": rss_per_socket_end.map(round3),
        "server_cpu_s": cpu_before.zip(cpu_after).map(|(b, a)| round3(a - b)),
        "server_cpu_us_per_frame": cpu_us_per_frame.map(round3),
        "elapsed_s": round3(started.elapsed().as_secs_f64()),
    })
}

/// What became of the stuck sockets: the server should have closed them (1008) once their
/// send queue overflowed.
struct StuckFate {
    closed: usize,
    /// Close codes seen, by code.
    codes: std::collections::BTreeMap<u16, usize>,
}

/// Reads what the stuck sockets have buffered, all at once, to see whether each ends in a
/// close; a socket with nothing more to read for a moment counts as still open.
async fn stuck_fate(sockets: Vec<(usize, Ws)>) -> StuckFate {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let mut tasks = JoinSet::new();
    for (_, mut ws) in sockets {
        tasks.spawn(async move {
            loop {
                match tokio::time::timeout(Duration::from_millis(200), ws.next()).await {
                    Ok(Some(Ok(Message::Close(frame)))) => {
                        return Some(frame.map(|f| u16::from(f.code)).unwrap_or(1005))
                    }
                    Ok(Some(Ok(_))) => continue,
                    // Reset or ended without a close frame: 1006 as browsers report it.
                    Ok(Some(Err(_))) | Ok(None) => return Some(1006),
                    Err(_) => return None,
                }
            }
        });
    }
    let mut fate = StuckFate {
        closed: 0,
        codes: Default::default(),
    };
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Some(code)) = joined {
            fate.closed += 1;
            *fate.codes.entry(code).or_default() += 1;
        }
    }
    fate
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_carries_sequence_and_subscribers() {
        let body = message_body(17, &[shared_phid(0)], 99, "");
        let text = String::from_utf8(body).unwrap();
        assert_eq!(browser::frame_seq(&text), Some(17));
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["subscribers"], json!(["PHID-PROJ-bench0000"]));
        assert_eq!(value["bench_sent_us"], json!(99));
    }
}
