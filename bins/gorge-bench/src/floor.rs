//! `gorge-bench floor`: the least a notification server can do, to measure gorge against.
//!
//! It speaks just the subset `gorge-bench notify` needs: the WebSocket upgrade, `pong` for a
//! `ping` command, and an admin `POST /` whose body becomes one text frame, encoded once and
//! written to every open socket in one tight non-blocking loop (no queues, no per-socket
//! tasks woken, no subscriptions: every socket gets every message). What is left is the
//! kernel's loopback path, so gorge's CPU per frame and POST→frame latency are reported as
//! ratios to this, measured in the same run. The fan-out runs inline in the admin connection's
//! task; sockets get the same fixed kernel send buffer as gorge's, so only user space differs.
//! A socket that cannot take a whole frame at once is counted (`short_writes`) and dropped,
//! since the floor keeps no queue.

use std::io::{self, Cursor};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;

use crate::http1;

#[derive(Debug, Clone, Args)]
pub struct FloorArgs {
    /// Address of the WebSocket port.
    #[arg(long, default_value = "127.0.0.1:22290")]
    pub client: SocketAddr,
    /// Address of the admin port.
    #[arg(long, default_value = "127.0.0.1:22291")]
    pub admin: SocketAddr,
    /// Serve this many seconds, then print the summary and exit.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

#[derive(Default)]
struct Counters {
    sockets: AtomicU64,
    posts: AtomicU64,
    frames: AtomicU64,
    short_writes: AtomicU64,
}

struct Floor {
    sockets: Mutex<Vec<Arc<TcpStream>>>,
    counters: Counters,
}

/// Encodes one final, unmasked frame.
fn frame(opcode: OpCode, payload: &[u8]) -> Vec<u8> {
    let header = FrameHeader {
        opcode,
        ..FrameHeader::default()
    };
    let mut out = Vec::with_capacity(payload.len() + 10);
    let _ = header.format(payload.len() as u64, &mut out);
    out.extend_from_slice(payload);
    out
}

/// Gorge-notification's fixed kernel send buffer per client socket.
const SEND_BUFFER_BYTES: usize = 128 * 1024;

/// Serves until `--timeout`; run it as its own process.
pub async fn run(args: FloorArgs) -> Value {
    let client = match TcpListener::bind(args.client).await {
        Ok(l) => l,
        Err(e) => return json!({"ok": false, "error": format!("bind {}: {e}", args.client)}),
    };
    let admin = match TcpListener::bind(args.admin).await {
        Ok(l) => l,
        Err(e) => return json!({"ok": false, "error": format!("bind {}: {e}", args.admin)}),
    };
    eprintln!(
        "floor: client {} admin {} for {}s",
        args.client, args.admin, args.timeout
    );
    let floor = Arc::new(Floor {
        sockets: Mutex::new(Vec::new()),
        counters: Counters::default(),
    });
    let started = Instant::now();
    let serving = {
        let floor = floor.clone();
        async move {
            loop {
                tokio::select! {
                    Ok((stream, _)) = client.accept() => {
                        tokio::spawn(websocket(floor.clone(), stream));
                    }
                    Ok((stream, _)) = admin.accept() => {
                        tokio::spawn(admin_conn(floor.clone(), stream));
                    }
                }
            }
        }
    };
    let limit = Duration::from_secs(args.timeout).saturating_sub(Duration::from_secs(1));
    let _ = tokio::time::timeout(limit, serving).await;
    let c = &floor.counters;
    json!({
        "ok": true,
        "sockets": c.sockets.load(Ordering::Relaxed),
        "posts": c.posts.load(Ordering::Relaxed),
        "frames": c.frames.load(Ordering::Relaxed),
        "short_writes": c.short_writes.load(Ordering::Relaxed),
        "elapsed_s": started.elapsed().as_secs_f64(),
    })
}

/// One client socket: the handshake, then `pong` for every text frame that asks for one.
async fn websocket(floor: Arc<Floor>, mut stream: TcpStream) {
    let Ok(key) = handshake(&mut stream).await else {
        return;
    };
    let accept = derive_accept_key(key.as_bytes());
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    if stream.write_all(response.as_bytes()).await.is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let _ = socket2::SockRef::from(&stream).set_send_buffer_size(SEND_BUFFER_BYTES);
    let stream = Arc::new(stream);
    floor.sockets.lock().unwrap().push(stream.clone());
    floor.counters.sockets.fetch_add(1, Ordering::Relaxed);
    let pong = frame(OpCode::Data(Data::Text), br#"{"type":"pong"}"#);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if stream.readable().await.is_err() {
            break;
        }
        match stream.try_read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => break,
        }
        loop {
            let mut cursor = Cursor::new(&buf[..]);
            let Ok(Some((header, length))) = FrameHeader::parse(&mut cursor) else {
                break;
            };
            let start = cursor.position() as usize;
            let end = start + length as usize;
            if buf.len() < end {
                break;
            }
            let mask = header.mask.unwrap_or_default();
            let payload: Vec<u8> = buf[start..end]
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ mask[i & 3])
                .collect();
            buf.drain(..end);
            let wants_pong = matches!(header.opcode, OpCode::Data(Data::Text))
                && payload.windows(6).any(|w| w == b"\"ping\"");
            let closing = matches!(header.opcode, OpCode::Control(Control::Close));
            if closing || (wants_pong && stream.try_write(&pong).is_err()) {
                return remove(&floor, &stream);
            }
        }
    }
    remove(&floor, &stream);
}

fn remove(floor: &Floor, stream: &Arc<TcpStream>) {
    floor
        .sockets
        .lock()
        .unwrap()
        .retain(|s| !Arc::ptr_eq(s, stream));
}

/// Reads the upgrade request and returns its `Sec-WebSocket-Key`.
async fn handshake(stream: &mut TcpStream) -> io::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            return Err(io::ErrorKind::InvalidData.into());
        }
        stream.read_exact(&mut byte).await?;
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    text.lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("sec-websocket-key")
                .then(|| value.trim().to_string())
        })
        .ok_or_else(|| io::ErrorKind::InvalidData.into())
}

/// One admin connection (keep-alive): every `POST` answers 200 with a receipt, then its body
/// is written as one frame to every socket.
async fn admin_conn(floor: Arc<Floor>, stream: TcpStream) {
    let mut reader = BufReader::new(stream);
    loop {
        let Ok(Some(head)) = http1::read_head(&mut reader).await else {
            return;
        };
        let length = head.content_length().ok().flatten().unwrap_or(0);
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let receipt = br#"{"fingerprint":"floorfloorfloorf"}"#;
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            receipt.len()
        );
        let stream = reader.get_mut();
        if stream.write_all(response.as_bytes()).await.is_err()
            || stream.write_all(receipt).await.is_err()
        {
            return;
        }
        if !head.start_line.starts_with("POST") {
            continue;
        }
        floor.counters.posts.fetch_add(1, Ordering::Relaxed);
        fan_out(&floor, &frame(OpCode::Data(Data::Text), &body));
    }
}

/// The floor itself: one pre-encoded frame, one non-blocking write per socket.
fn fan_out(floor: &Floor, frame: &[u8]) {
    let mut sockets = floor.sockets.lock().unwrap();
    let mut written = 0;
    let mut short = 0;
    sockets.retain(|socket| match socket.try_write(frame) {
        Ok(n) if n == frame.len() => {
            written += 1;
            true
        }
        _ => {
            short += 1;
            false
        }
    });
    floor.counters.frames.fetch_add(written, Ordering::Relaxed);
    floor
        .counters
        .short_writes
        .fetch_add(short, Ordering::Relaxed);
}
