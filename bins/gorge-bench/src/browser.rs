//! A cheap browser tab (an Aphlict WebSocket client): connect, subscribe, confirm with
//! ping/pong, then count the frames that carry a bench sequence number.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::histogram::Histogram;
use crate::tls::{BrowserStream, ClientTls};

pub type Ws = WebSocketStream<BrowserStream>;

/// What the server must answer to a ping command, exactly.
const PONG: &str = r#"{"type":"pong"}"#;
/// Marker the bench puts into every posted message; the number after it is the sequence.
pub const SEQ_MARKER: &str = "\"bench_seq\":";

/// Loopback connections from one source address run out of ephemeral ports near 28 000
/// (32768–60999), and closed ones stay in TIME_WAIT for a minute, so sockets are spread over
/// 127.0.0.x addresses in blocks of this many, starting at a random block per run (runs
/// back to back would otherwise find the previous run's ports still taken).
const SOCKETS_PER_SOURCE_IP: usize = 10_000;
/// Source addresses used: 127.0.0.2 … 127.0.0.241.
const SOURCE_IPS: usize = 240;

fn run_offset() -> usize {
    static OFFSET: OnceLock<usize> = OnceLock::new();
    *OFFSET.get_or_init(|| rand::random_range(0..SOURCE_IPS))
}

/// Small buffers: thousands of sockets share two cores and the load generator must not be
/// the thing that runs out of memory.
fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .max_write_buffer_size(64 * 1024)
        .max_message_size(Some(1 << 20))
}

/// Source address for the `index`-th socket to `server`, when the server is on loopback.
pub fn source_ip(server: SocketAddr, index: usize) -> Option<IpAddr> {
    source_ip_from(server, index, run_offset())
}

fn source_ip_from(server: SocketAddr, index: usize, offset: usize) -> Option<IpAddr> {
    if !server.ip().is_loopback() || !server.is_ipv4() {
        return None;
    }
    let block = (offset + index / SOCKETS_PER_SOURCE_IP) % SOURCE_IPS;
    Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + block as u8)))
}

/// Opens one WebSocket to `url` (whose address is `server`), over TLS when `tls` is given
/// (a `wss://` URL).
pub async fn open(
    url: &str,
    server: SocketAddr,
    source: Option<IpAddr>,
    recv_buffer: Option<u32>,
    tls: Option<&ClientTls>,
) -> Result<Ws, String> {
    let tcp = connect(server, source, recv_buffer).await?;
    let stream = match tls {
        Some(tls) => tls.connect(tcp).await?,
        None => BrowserStream::Plain(tcp),
    };
    let (ws, _response) =
        tokio_tungstenite::client_async_with_config(url, stream, Some(ws_config()))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
    Ok(ws)
}

/// The TCP connection a browser opens: from `source` when given (spreading sockets over
/// loopback addresses), with `recv_buffer` as SO_RCVBUF when given, Nagle off.
pub async fn connect(
    server: SocketAddr,
    source: Option<IpAddr>,
    recv_buffer: Option<u32>,
) -> Result<TcpStream, String> {
    let socket = TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
    if let Some(ip) = source {
        socket
            .bind(SocketAddr::new(ip, 0))
            .map_err(|e| format!("bind {ip}: {e}"))?;
    }
    if let Some(size) = recv_buffer {
        socket
            .set_recv_buffer_size(size)
            .map_err(|e| format!("SO_RCVBUF: {e}"))?;
    }
    let stream = socket
        .connect(server)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("nodelay: {e}"))?;
    Ok(stream)
}

/// Subscribes to `phids` and waits for the pong that proves the subscription took effect
/// (the server handles one socket's commands in order). A long list goes in several
/// `subscribe` frames under 60 KiB each (the server's default frame limit is 64 KiB); a
/// close frame instead of the pong is an error naming its code.
pub async fn subscribe_confirmed(
    ws: &mut Ws,
    phids: &[String],
    limit: Duration,
) -> Result<(), String> {
    let mut frames = subscribe_frames(phids);
    frames.push(serde_json::json!({"command": "ping", "data": null}).to_string());
    tokio::time::timeout(limit, async {
        for text in frames {
            ws.send(Message::text(text))
                .await
                .map_err(|e| format!("send: {e}"))?;
        }
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(text))) if text.as_str() == PONG => return Ok(()),
                Some(Ok(Message::Close(frame))) => {
                    return Err(format!("close {}", frame.map_or(0, |f| u16::from(f.code))))
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(format!("read: {e}")),
                None => return Err("closed before pong".to_string()),
            }
        }
    })
    .await
    .map_err(|_| "no pong in time".to_string())?
}

/// `subscribe` commands for `phids`, each frame under 60 KiB.
fn subscribe_frames(phids: &[String]) -> Vec<String> {
    let frame =
        |part: &[String]| serde_json::json!({"command": "subscribe", "data": part}).to_string();
    let mut frames = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, phid) in phids.iter().enumerate() {
        if bytes + phid.len() + 3 > 60_000 && i > start {
            frames.push(frame(&phids[start..i]));
            (start, bytes) = (i, 0);
        }
        bytes += phid.len() + 3;
    }
    frames.push(frame(&phids[start..]));
    frames
}

/// Sequence number of a bench frame, if the frame carries one.
pub fn frame_seq(text: &str) -> Option<usize> {
    let start = text.find(SEQ_MARKER)? + SEQ_MARKER.len();
    let digits = text[start..].trim_start();
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// Shared bookkeeping for every reading socket of one run.
pub struct Deliveries {
    pub epoch: Instant,
    /// When the POST of each sequence number started, µs since `epoch` (0 = not posted).
    pub posted_at_us: Box<[AtomicU64]>,
    /// Frames received per sequence number, over all sockets.
    pub received: Box<[AtomicU32]>,
    pub latency: Histogram,
    pub last_frame_us: AtomicU64,
    pub frames: AtomicU64,
    /// Frames whose sequence number was out of range or missing.
    pub foreign_frames: AtomicU64,
    /// Sockets whose stream ended (server close or error) before the run stopped them.
    pub closed_early: AtomicU64,
}

impl Deliveries {
    pub fn new(epoch: Instant, messages: usize) -> Deliveries {
        Deliveries {
            epoch,
            posted_at_us: (0..messages).map(|_| AtomicU64::new(0)).collect(),
            received: (0..messages).map(|_| AtomicU32::new(0)).collect(),
            latency: Histogram::new(),
            last_frame_us: AtomicU64::new(0),
            frames: AtomicU64::new(0),
            foreign_frames: AtomicU64::new(0),
            closed_early: AtomicU64::new(0),
        }
    }

    pub fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn record(&self, seq: Option<usize>) -> Option<usize> {
        let now = self.now_us();
        let Some(seq) = seq.filter(|&s| s < self.received.len()) else {
            self.foreign_frames.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        self.received[seq].fetch_add(1, Ordering::Relaxed);
        self.frames.fetch_add(1, Ordering::Relaxed);
        self.last_frame_us.fetch_max(now, Ordering::Relaxed);
        let posted = self.posted_at_us[seq].load(Ordering::Relaxed);
        if posted > 0 {
            self.latency.record(now.saturating_sub(posted));
        }
        Some(seq)
    }
}

/// How one reading socket ended.
pub struct ReaderEnd {
    /// This socket's frames per sequence number (empty unless asked for).
    pub counts: Vec<u16>,
    /// The stream ended before the run stopped it (server close, reset).
    pub closed_early: bool,
}

/// Reads frames until `stop` flips or the stream ends. With `per_socket_counts`, also
/// returns this socket's own count per sequence number (drills check every socket).
pub async fn read_frames(
    mut ws: Ws,
    deliveries: Arc<Deliveries>,
    mut stop: watch::Receiver<bool>,
    per_socket_counts: bool,
) -> ReaderEnd {
    let mut closed_early = false;
    let mut counts = if per_socket_counts {
        vec![0u16; deliveries.received.len()]
    } else {
        Vec::new()
    };
    loop {
        tokio::select! {
            frame = ws.next() => match frame {
                Some(Ok(Message::Text(text))) => {
                    if text.as_str() == PONG {
                        continue;
                    }
                    if let Some(seq) = deliveries.record(frame_seq(text.as_str())) {
                        if let Some(c) = counts.get_mut(seq) {
                            *c = c.saturating_add(1);
                        }
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    if !*stop.borrow() {
                        deliveries.closed_early.fetch_add(1, Ordering::Relaxed);
                        closed_early = true;
                    }
                    break;
                }
            },
            _ = stop.changed() => break,
        }
    }
    ReaderEnd {
        counts,
        closed_early,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_sequence_numbers() {
        assert_eq!(frame_seq(r#"{"key":"k","bench_seq":42,"x":1}"#), Some(42));
        assert_eq!(frame_seq(r#"{"bench_seq": 7}"#), Some(7));
        assert_eq!(frame_seq(r#"{"type":"pong"}"#), None);
    }

    #[test]
    fn long_subscriptions_go_in_frames_under_60_kib() {
        let phids: Vec<String> = (0..4096).map(|i| format!("PHID-USER-{i:022}")).collect();
        let frames = subscribe_frames(&phids);
        assert!(frames.len() > 1);
        assert!(frames.iter().all(|f| f.len() < 60_000 + 64));
        let back: Vec<String> = frames
            .iter()
            .flat_map(|f| {
                let v: serde_json::Value = serde_json::from_str(f).unwrap();
                serde_json::from_value::<Vec<String>>(v["data"].clone()).unwrap()
            })
            .collect();
        assert_eq!(back, phids);
        assert_eq!(subscribe_frames(&phids[..1]).len(), 1);
    }

    #[test]
    fn spreads_loopback_sources() {
        let server: SocketAddr = "127.0.0.1:22280".parse().unwrap();
        let ip = |index, offset| source_ip_from(server, index, offset).map(|ip| ip.to_string());
        assert_eq!(ip(0, 0).as_deref(), Some("127.0.0.2"));
        assert_eq!(ip(45_000, 0).as_deref(), Some("127.0.0.6"));
        assert_eq!(ip(10_000, 239).as_deref(), Some("127.0.0.2"));
        assert_eq!(source_ip("10.0.0.1:1".parse().unwrap(), 0), None);
    }
}
