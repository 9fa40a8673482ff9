//! `gorge-bench flood`: anonymous sockets that send one kind of frame as fast as they can
//! (reconnecting whenever they are closed, as an attacker would), while PHP's admin POSTs
//! are made at a steady pace on fresh connections. Reports the POSTs' latency, how the
//! flooding sockets were closed, and the server's RSS before, during and after.
//!
//! Blocking threads, not the runtime: each flooder writes without pause, and a POST's clock
//! must not wait for the bench's own scheduler.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use crate::histogram::percentiles_of;
use crate::http1::{ServerArgs, ServerUrls};
use crate::notify::PHP_CONTENT_TYPE;
use crate::raw_browser::{frame_header, masked};
use crate::sys;

/// What each flooding socket sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FrameKind {
    /// `{"command":"replay"}`, the most expensive command.
    Replay,
    /// `subscribe` then `unsubscribe` of one PHID.
    Subscribe,
    /// `{"command":"ping"}` (each answered with a pong).
    Ping,
    /// A one-byte text message (ignored as malformed).
    TinyText,
    /// A one-byte binary message.
    Binary,
    /// WebSocket ping control frames.
    WsPing,
}

#[derive(Debug, Clone, Args)]
pub struct FloodArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Flooding sockets at once.
    #[arg(long, default_value_t = 1)]
    pub sockets: usize,
    #[arg(long, value_enum, default_value_t = FrameKind::Replay)]
    pub frame: FrameKind,
    /// How long the flood lasts.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// One admin POST every this many milliseconds (each on a new connection, as PHP).
    #[arg(long, default_value_t = 100)]
    pub post_interval_ms: u64,
    /// A POST not answered within this is counted as timed out.
    #[arg(long, default_value_t = 5000)]
    pub post_timeout_ms: u64,
    /// Server process to sample RSS from (/proc).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Whole-run limit in seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Nice value of the flooding threads (0: as the bench). The flooders stand for remote
    /// machines; on a shared 2-core box their CPU (including the kernel's loopback TCP work,
    /// done in the sender's thread) is taken from the server and the POSTing thread. At 19
    /// they get only what nothing else wants, which is closer to an attack from elsewhere.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub flooder_nice: i32,
}

fn frames_of(kind: FrameKind) -> Vec<u8> {
    let text = |s: &str| masked(0x1, s.as_bytes());
    match kind {
        FrameKind::Replay => text(r#"{"command":"replay","data":{"age":60000}}"#),
        FrameKind::Subscribe => {
            let mut both = text(r#"{"command":"subscribe","data":["PHID-USER-flood"]}"#);
            both.extend(text(
                r#"{"command":"unsubscribe","data":["PHID-USER-flood"]}"#,
            ));
            both
        }
        FrameKind::Ping => text(r#"{"command":"ping"}"#),
        FrameKind::TinyText => text("x"),
        FrameKind::Binary => masked(0x2, b"\x00"),
        FrameKind::WsPing => masked(0x9, b""),
    }
}

/// The code of the first whole close frame among unmasked server frames.
fn close_code_in(mut bytes: &[u8]) -> Option<u16> {
    while let Ok(Some((opcode, header, len))) = frame_header(bytes) {
        let len = usize::try_from(len).ok()?;
        if bytes.len() - header < len {
            return None;
        }
        if opcode == 0x8 && len >= 2 {
            return Some(u16::from_be_bytes([bytes[header], bytes[header + 1]]));
        }
        bytes = &bytes[header + len..];
    }
    None
}

/// What the flooders saw.
#[derive(Default)]
struct FloodCounts {
    bytes_sent: AtomicU64,
    connections: AtomicU64,
    refused: AtomicU64,
    /// Close code (0: closed without a close frame) → sockets.
    closes: Mutex<std::collections::BTreeMap<u16, u64>>,
}

fn upgrade(addr: SocketAddr, path: &str) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Err(std::io::Error::other("closed during the upgrade"));
        }
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 101") {
        return Err(std::io::Error::other("upgrade refused"));
    }
    Ok(stream)
}

/// One flooding socket after another until `stop`.
fn flooder(
    addr: SocketAddr,
    path: String,
    frame: Vec<u8>,
    nice: i32,
    stop: Arc<AtomicBool>,
    counts: Arc<FloodCounts>,
) {
    if nice != 0 {
        let _ = sys::nice_this_thread(nice);
    }
    let mut burst = Vec::new();
    while burst.len() < 32 * 1024 {
        burst.extend_from_slice(&frame);
    }
    while !stop.load(Ordering::Relaxed) {
        let Ok(stream) = upgrade(addr, &path) else {
            counts.refused.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        counts.connections.fetch_add(1, Ordering::Relaxed);
        let closed = Arc::new(AtomicBool::new(false));
        let Ok(mut read_half) = stream.try_clone() else {
            continue;
        };
        let reader = {
            let (closed, stop) = (closed.clone(), stop.clone());
            std::thread::spawn(move || {
                if nice != 0 {
                    let _ = sys::nice_this_thread(nice);
                }
                let _ = read_half.set_read_timeout(Some(Duration::from_millis(200)));
                let mut seen = Vec::new();
                let mut chunk = [0u8; 16 * 1024];
                let code = loop {
                    match read_half.read(&mut chunk) {
                        Ok(0) => break 0,
                        Ok(n) => {
                            // Keep only a tail: pongs pile up, the close frame is last.
                            seen.extend_from_slice(&chunk[..n]);
                            if let Some(code) = close_code_in(&seen) {
                                break code;
                            }
                            if seen.len() > 1 << 20 {
                                seen.clear();
                            }
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            if stop.load(Ordering::Relaxed) {
                                break u16::MAX;
                            }
                        }
                        Err(_) => break 0,
                    }
                };
                closed.store(true, Ordering::Relaxed);
                code
            })
        };
        let mut write_half = stream;
        let _ = write_half.set_write_timeout(Some(Duration::from_millis(200)));
        while !closed.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
            match write_half.write(&burst) {
                Ok(n) => {
                    counts.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        let _ = write_half.shutdown(std::net::Shutdown::Both);
        let code = reader.join().unwrap_or(0);
        if code != u16::MAX {
            *counts.closes.lock().unwrap().entry(code).or_default() += 1;
        }
    }
}

/// One POST's timings, in µs.
#[derive(Debug, Clone, Copy)]
struct PostTimes {
    /// Whole POST: connect, request, the whole answer.
    total: u64,
    /// `connect()` alone (the kernel completes the handshake; a dropped SYN shows here).
    connect: u64,
    /// Until the first byte of the answer.
    first_byte: u64,
}

/// One POST on a fresh connection; its timings, or `None` past `limit` or not 200.
fn timed_post(admin: SocketAddr, limit: Duration) -> Option<PostTimes> {
    let body = r#"{"key":"1","subscribers":["PHID-USER-nobody"]}"#;
    let started = Instant::now();
    let mut stream = TcpStream::connect_timeout(&admin, limit).ok()?;
    let connect = started.elapsed().as_micros() as u64;
    stream.set_read_timeout(Some(limit)).ok()?;
    // As PHP's cURL sends it: no Nagle delay, and the request in one write (several small
    // writes would wait for the server's delayed ACK between them).
    stream.set_nodelay(true).ok()?;
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {admin}\r\nContent-Type: {PHP_CONTENT_TYPE}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut first_byte = 0;
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                if answer.is_empty() {
                    first_byte = started.elapsed().as_micros() as u64;
                }
                answer.extend_from_slice(&chunk[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let took = started.elapsed();
    (answer.starts_with(b"HTTP/1.1 200") && took < limit).then_some(PostTimes {
        total: took.as_micros() as u64,
        connect,
        first_byte,
    })
}

/// What the scheduler did with each thread between two [`sys::threads_sched`] readings,
/// summed by thread name: CPU time, time waiting for a CPU, and the mean wait per time the
/// thread was given a CPU (a thread woken by a POST waits about that long before it runs).
fn sched_delta(
    before: &std::collections::BTreeMap<u32, sys::ThreadSched>,
    after: &std::collections::BTreeMap<u32, sys::ThreadSched>,
) -> Value {
    let mut by_name: std::collections::BTreeMap<String, (u64, u64, u64, u64)> =
        std::collections::BTreeMap::new();
    for (tid, now) in after {
        let then = before.get(tid).cloned().unwrap_or_default();
        let entry = by_name.entry(now.name.clone()).or_default();
        entry.0 += 1;
        entry.1 += now.run_ns.saturating_sub(then.run_ns);
        entry.2 += now.wait_ns.saturating_sub(then.wait_ns);
        entry.3 += now.slices.saturating_sub(then.slices);
    }
    let ms = |ns: u64| (ns as f64 / 1e5).round() / 10.0;
    by_name
        .into_iter()
        .map(|(name, (threads, run, wait, slices))| {
            let per_slice = if slices == 0 {
                0.0
            } else {
                (wait as f64 / slices as f64 / 1e3).round() / 1e3
            };
            (
                name,
                json!({"threads": threads, "cpu_ms": ms(run), "wait_ms": ms(wait),
                       "slices": slices, "wait_per_slice_ms": per_slice}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The kernel's TCP counters that show a connection delayed by drops (listen queue
/// overflows, SYN and segment retransmissions), machine-wide.
fn tcp_counters() -> std::collections::BTreeMap<String, i64> {
    const WANTED: [&str; 7] = [
        "ListenOverflows",
        "ListenDrops",
        "TCPBacklogDrop",
        "TCPSynRetrans",
        "RetransSegs",
        "TCPTimeouts",
        "TCPReqQFullDrop",
    ];
    let mut out = std::collections::BTreeMap::new();
    for file in ["/proc/net/netstat", "/proc/net/snmp"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.chunks(2) {
            let [names, values] = pair else { continue };
            for (name, value) in names
                .split_whitespace()
                .zip(values.split_whitespace())
                .skip(1)
            {
                if WANTED.contains(&name) {
                    if let Ok(value) = value.parse() {
                        out.insert(name.to_string(), value);
                    }
                }
            }
        }
    }
    out
}

/// `/metrics` of the admin port (gorge-notification only; Aphlict has none).
fn get_metrics(admin: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&admin, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    answer
        .starts_with(b"HTTP/1.1 200")
        .then(|| String::from_utf8_lossy(&answer).into_owned())
}

/// Sockets the server closed, by reason (its `sockets_closed_total`).
fn server_closes(admin: SocketAddr) -> Value {
    let Some(text) = get_metrics(admin) else {
        return Value::Null;
    };
    let mut out = serde_json::Map::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("gorge_notification_sockets_closed_total{reason=\"") {
            if let Some((reason, value)) = rest.split_once("\"} ") {
                if let Ok(value) = value.parse::<f64>() {
                    if value > 0.0 {
                        out.insert(reason.to_string(), json!(value));
                    }
                }
            }
        }
    }
    Value::Object(out)
}

pub async fn run(args: FloodArgs) -> Value {
    tokio::task::spawn_blocking(move || run_blocking(args))
        .await
        .unwrap_or_else(|e| json!({"ok": false, "error": e.to_string()}))
}

fn run_blocking(args: FloodArgs) -> Value {
    let deadline = crate::work_deadline(args.timeout);
    let ServerUrls {
        client,
        client_path: path,
        admin,
        ..
    } = match args.server.resolve_plain("flood") {
        Ok(parsed) => parsed,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    let limit = Duration::from_millis(args.post_timeout_ms);
    let interval = Duration::from_millis(args.post_interval_ms);
    // The floor: the same POSTs with nothing else going on.
    let mut idle: Vec<u64> = (0..20)
        .filter_map(|_| timed_post(admin, limit))
        .map(|t| t.total)
        .collect();
    let rss_idle = sys::rss_mib(args.pid);
    let closes_before = server_closes(admin);
    // The server's own view (admin_post_seconds, timed from the accept): what it took,
    // without the bench's scheduling on the same shared cores.
    let runtime = tokio::runtime::Handle::current();
    let metrics_before = runtime.block_on(crate::server_metrics::snapshot(admin));

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(FloodCounts::default());
    let frame = frames_of(args.frame);
    let nice = args.flooder_nice;
    let server_sched_before = args.pid.map(sys::threads_sched).unwrap_or_default();
    let poster_tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
    let own_sched = || {
        sys::threads_sched(std::process::id())
            .into_iter()
            .filter(|(tid, _)| *tid == poster_tid)
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let poster_sched_before = own_sched();
    let tcp_before = tcp_counters();
    let flooders: Vec<_> = (0..args.sockets)
        .map(|_| {
            let (path, frame, stop, counts) =
                (path.clone(), frame.clone(), stop.clone(), counts.clone());
            std::thread::spawn(move || flooder(client, path, frame, nice, stop, counts))
        })
        .collect();
    let started = Instant::now();
    let end = (started + Duration::from_secs(args.seconds)).min(deadline);
    let mut latencies = Vec::new();
    let mut connects = Vec::new();
    let mut first_bytes = Vec::new();
    let mut timeouts = 0u64;
    let mut rss_max = rss_idle.unwrap_or(0.0);
    let mut next = started;
    while Instant::now() < end {
        match timed_post(admin, limit) {
            Some(times) => {
                latencies.push(times.total);
                connects.push(times.connect);
                first_bytes.push(times.first_byte);
            }
            None => timeouts += 1,
        }
        rss_max = rss_max.max(sys::rss_mib(args.pid).unwrap_or(0.0));
        next += interval;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let server_sched = args
        .pid
        .map(|pid| sched_delta(&server_sched_before, &sys::threads_sched(pid)));
    let poster_sched = sched_delta(&poster_sched_before, &own_sched());
    let tcp_after = tcp_counters();
    let tcp: serde_json::Map<String, Value> = tcp_after
        .iter()
        .map(|(name, after)| {
            (
                name.clone(),
                json!(after - tcp_before.get(name).copied().unwrap_or(0)),
            )
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    for flooder in flooders {
        let _ = flooder.join();
    }
    // Let the server finish closing the last sockets before the "after" figures.
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = sys::rss_mib(args.pid);
    let metrics_after = runtime.block_on(crate::server_metrics::snapshot(admin));
    let server_post_p99_le_ms = match (&metrics_before, &metrics_after) {
        (Some(before), Some(after)) => {
            crate::server_metrics::delta(before, after).admin_post_p99_le_ms
        }
        _ => None,
    };
    let posts = percentiles_of(&mut latencies);
    let ok = timeouts == 0 && posts.count > 0 && posts.p99_ms < 50.0 && posts.max_ms < 100.0;
    let closes: serde_json::Map<String, Value> = counts
        .closes
        .lock()
        .unwrap()
        .iter()
        .map(|(code, n)| {
            let key = if *code == 0 {
                "none".to_string()
            } else {
                code.to_string()
            };
            (key, json!(n))
        })
        .collect();
    json!({
        "ok": ok,
        "frame": format!("{:?}", args.frame),
        "sockets": args.sockets,
        "seconds": started.elapsed().as_secs_f64(),
        "idle_posts": percentiles_of(&mut idle),
        "posts": posts,
        "post_connects": percentiles_of(&mut connects),
        "post_first_bytes": percentiles_of(&mut first_bytes),
        "post_timeouts": timeouts,
        "flooder_nice": args.flooder_nice,
        "server_threads": server_sched,
        "poster_thread": poster_sched,
        "tcp_counters": tcp,
        "server_admin_post_p99_le_ms": server_post_p99_le_ms,
        "flood_mib_sent": counts.bytes_sent.load(Ordering::Relaxed) as f64 / 1048576.0,
        "flood_connections": counts.connections.load(Ordering::Relaxed),
        "flood_refused": counts.refused.load(Ordering::Relaxed),
        "flood_closes_seen": closes,
        "server_closes_before": closes_before,
        "server_closes_after": server_closes(admin),
        "rss_idle_mib": rss_idle,
        "rss_max_mib": rss_max,
        "rss_after_mib": rss_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_close_code_after_other_frames() {
        let mut bytes = vec![0x81, 2, b'h', b'i', 0x88, 2];
        assert_eq!(close_code_in(&bytes), None);
        bytes.extend_from_slice(&1008u16.to_be_bytes());
        assert_eq!(close_code_in(&bytes), Some(1008));
        assert_eq!(close_code_in(&[0x81, 126, 0xff, 0xff, 0]), None);
    }
}
