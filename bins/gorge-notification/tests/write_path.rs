//! The per-socket write path against clients that make writes block: a tiny receive window
//! that never sends (no frame may wait for a wake-up that never comes), SIGTERM while
//! writes are blocked, a client that pings and never reads (everything it makes the server
//! hold is bounded), a slow but live reader (not reaped as idle), and protocol violations
//! (closed with the RFC's code, counted apart).
//!
//! None of these clients sends a command after the burst, so nothing but the server's own
//! writer can move the frames (`Ws::sync()` would send one and hide a lost wake-up).

mod common;

use std::time::{Duration, Instant};

use common::{Endpoints, InProcess, Server, Ws, PATIENCE};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;

/// The server's own pings would wake a stuck writer; keep them out of these tests.
const NO_PINGS: [(&str, &str); 2] = [
    ("GORGE_NOTIFICATION_PING_INTERVAL_SECONDS", "60"),
    ("GORGE_NOTIFICATION_IDLE_TIMEOUT_SECONDS", "120"),
];

/// [`NO_PINGS`] for an in-process server.
fn no_pings(config: &mut gorge_notification::config::Config) {
    config.ping_interval = Duration::from_secs(60);
    config.idle_timeout = Duration::from_secs(120);
}

/// A TCP connection whose receive buffer is as small as the kernel allows from 4096.
async fn tiny_window(port: u16) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(([127, 0, 0, 1], port).into()).await.unwrap()
}

/// A WebSocket client on a tiny receive window.
async fn tiny_ws(server: &Endpoints) -> Ws {
    let port = server.client_port;
    let stream = tiny_window(port).await;
    let url = format!("ws://127.0.0.1:{port}/");
    let (ws, response) = tokio_tungstenite::client_async(url, stream).await.unwrap();
    assert_eq!(response.status(), 101);
    Ws { ws }
}

/// A raw upgraded connection (the handshake by hand, then bytes).
async fn raw_ws(port: u16, tiny: bool) -> TcpStream {
    let mut stream = if tiny {
        tiny_window(port).await
    } else {
        TcpStream::connect(("127.0.0.1", port)).await.unwrap()
    };
    let head = common::raw_upgrade(&mut stream, "GET / HTTP/1.1").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head:?}");
    stream
}

/// A masked client frame.
fn client_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [7, 1, 2, 3];
    assert!(payload.len() < 126);
    let mut frame = vec![first, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
    frame
}

fn big_message(n: usize, size: usize) -> String {
    format!(
        r#"{{"n":{n},"subscribers":["PHID-BIG"],"pad":"{}"}}"#,
        "x".repeat(size)
    )
}

/// Reads `count` text frames (answering nothing but what tungstenite answers by itself)
/// and returns their `n`.
async fn read_numbers(ws: &mut Ws, count: usize, pause: Duration) -> Vec<u64> {
    let mut seen = Vec::new();
    while seen.len() < count {
        let next = tokio::time::timeout(PATIENCE, ws.ws.next())
            .await
            .unwrap_or_else(|_| panic!("frame {} of {count} never arrived", seen.len()));
        match next.expect("socket open").expect("no error") {
            Message::Text(text) => {
                let v: Value = serde_json::from_str(&text).unwrap();
                seen.push(v["n"].as_u64().unwrap());
                tokio::time::sleep(pause).await;
            }
            Message::Close(frame) => panic!("closed after {} frames: {frame:?}", seen.len()),
            _ => {}
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_window_that_never_sends_still_gets_every_queued_frame() {
    let server = InProcess::start(no_pings).await;
    let mut ws = tiny_ws(&server).await;
    ws.subscribe(&["PHID-BIG"]).await;
    // From here on the client only reads. Both bursts fit the default queue bound (4 MiB).
    let mut next = 0;
    for (count, size) in [(5, 800_000), (12, 300_000)] {
        let first = next;
        for _ in 0..count {
            server.post_ok("", &big_message(next, size)).await;
            next += 1;
        }
        let seen = read_numbers(&mut ws, count, Duration::ZERO).await;
        assert_eq!(seen, (first..next).map(|n| n as u64).collect::<Vec<_>>());
    }
    assert_eq!(server.status("").await["messages.out"], next as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_writes_are_blocked_still_closes_every_socket() {
    let mut env = NO_PINGS.to_vec();
    env.push(("GORGE_NOTIFICATION_DRAIN_SECONDS", "1"));
    // Room for the whole burst: this socket must be blocked, not closed as slow.
    env.push(("GORGE_NOTIFICATION_QUEUE_BYTES", "16777216"));
    let mut server = Server::start(&env);
    let mut blocked = tiny_ws(&server).await;
    blocked.subscribe(&["PHID-BIG"]).await;
    let mut idle = server.ws("/").await;
    idle.subscribe(&["PHID-OTHER"]).await;
    // Far more than the kernel buffers of a connection that reads nothing (the sender's
    // buffer alone can grow to 4 MB).
    for n in 0..10 {
        server.post_ok("", &big_message(n, 800_000)).await;
    }
    server.sigterm();
    let closed = idle.until_closed().await;
    assert_eq!(closed.code, Some(1001));
    server.drained().await;
    // The blocked client can read what reached it; the connection then ends (a close frame
    // if it got through, else the end of the stream), it is not left hanging.
    let closed = blocked.until_closed().await;
    assert!(matches!(closed.code, None | Some(1001)), "{closed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_pings_and_never_reads_is_closed_1008_and_counted() {
    // Its inbound budget out of the way: this is about what the server holds for it.
    let server = InProcess::start(|config| {
        no_pings(config);
        config.inbound.frames_per_second = 1 << 32;
        config.inbound.frames_burst = 1 << 32;
        config.inbound.bytes_per_second = 1 << 40;
        config.inbound.bytes_burst = 1 << 40;
    })
    .await;
    let mut stream = raw_ws(server.client_port, true).await;
    let pings: Vec<u8> = (0..256)
        .flat_map(|_| client_frame(0x89, &[b'p'; 125]))
        .collect();
    let slow = r#"gorge_notification_sockets_closed_total{reason="slow_consumer"}"#;
    // Bounded: 64 MiB of pings, each answered by a pong the client never reads.
    let mut sent = 0usize;
    let give_up = Instant::now() + PATIENCE;
    let mut closed = false;
    while sent < 64 << 20 && Instant::now() < give_up {
        match tokio::time::timeout(Duration::from_secs(2), stream.write_all(&pings)).await {
            Ok(Ok(())) => sent += pings.len(),
            // The server closed the connection, or stopped reading it.
            Ok(Err(_)) | Err(_) => {
                closed = true;
                break;
            }
        }
        if sent % (4 << 20) < pings.len() && server.metric(slow).await == Some(1.0) {
            closed = true;
            break;
        }
    }
    assert!(closed, "still open after {sent} bytes of pings");
    gorge_testkit::eventually(PATIENCE, "counted as a slow consumer", || {
        let server = &server;
        async move { server.metric(slow).await == Some(1.0) }
    })
    .await;
    server
        .assert_metric("gorge_notification_slow_consumer_disconnects_total", 1.0)
        .await;
    // What the server holds for it was bounded: it closed long before 64 MiB.
    assert!(sent < 32 << 20, "{sent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_live_client_is_not_reaped_as_idle() {
    let server = InProcess::start(|config| {
        config.ping_interval = Duration::from_secs(1);
        config.idle_timeout = Duration::from_secs(2);
        config.hub.queue_bytes = 16 << 20;
    })
    .await;
    let mut ws = tiny_ws(&server).await;
    ws.subscribe(&["PHID-BIG"]).await;
    const COUNT: usize = 30;
    for n in 0..COUNT {
        server.post_ok("", &big_message(n, 100_000)).await;
    }
    // ~3 MB at well under 1 MB/s: longer than the idle timeout, while answering every ping
    // (tungstenite answers them as it reads).
    let seen = read_numbers(&mut ws, COUNT, Duration::from_millis(120)).await;
    assert_eq!(seen, (0..COUNT as u64).collect::<Vec<_>>());
    assert_eq!(ws.sync().await, Vec::<String>::new());
    server
        .assert_metric(
            r#"gorge_notification_sockets_closed_total{reason="idle"}"#,
            0.0,
        )
        .await;
}

/// Sends `bytes` on a fresh connection and returns the close frame the server sends back.
async fn close_frame_after(server: &Endpoints, bytes: &[u8]) -> Vec<u8> {
    let mut stream = raw_ws(server.client_port, false).await;
    stream.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut got)).await;
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_violations_get_the_rfc_close_code_and_are_counted_apart() {
    let server = InProcess::start(|_| {}).await;
    // An unmasked client frame: 1002.
    let got = close_frame_after(&server, b"\x81\x02hi").await;
    assert_eq!(&got[..4], b"\x88\x10\x03\xea", "{got:?}");
    assert_eq!(&got[4..], b"protocol error");
    // A text frame that is not UTF-8: 1007.
    let got = close_frame_after(&server, &client_frame(0x81, b"\xff\xfe")).await;
    assert_eq!(&got[..4], b"\x88\x0f\x03\xef", "{got:?}");
    assert_eq!(&got[4..], b"invalid UTF-8");
    // A reserved opcode: 1002.
    let got = close_frame_after(&server, &client_frame(0x83, b"x")).await;
    assert_eq!(&got[2..4], b"\x03\xea", "{got:?}");
    server
        .assert_metric(
            r#"gorge_notification_sockets_closed_total{reason="protocol_error"}"#,
            2.0,
        )
        .await;
    server
        .assert_metric(
            r#"gorge_notification_sockets_closed_total{reason="invalid_utf8"}"#,
            1.0,
        )
        .await;
    server
        .assert_metric(
            r#"gorge_notification_sockets_closed_total{reason="client"}"#,
            0.0,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sigterm_a_slow_reader_gets_its_whole_backlog_then_1001() {
    let mut env = NO_PINGS.to_vec();
    env.push(("GORGE_NOTIFICATION_DRAIN_SECONDS", "1"));
    env.push(("GORGE_NOTIFICATION_QUEUE_BYTES", "16777216"));
    let mut server = Server::start(&env);
    let mut slow = server.ws("/").await;
    slow.subscribe(&["PHID-BIG"]).await;
    // About 1.5 MB queued: more than the kernel buffers hold for a client that reads
    // nothing (its window does not grow until it reads), so most waits in the queue.
    const COUNT: usize = 100;
    for n in 0..COUNT {
        server.post_ok("", &big_message(n, 15_000)).await;
    }
    server.sigterm();
    // The client is slow on purpose: it starts reading 2.2 s after SIGTERM, later than a
    // fixed 1 s linger after its close (at most 1 s into the drain), sooner than the end of
    // the drain (window 1 s + 2 s). The pause is the scenario, not a wait for an event.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let seen = read_numbers(&mut slow, COUNT, Duration::ZERO).await;
    assert_eq!(seen, (0..COUNT as u64).collect::<Vec<_>>());
    let closed = slow.until_closed().await;
    assert_eq!(closed.code, Some(1001), "{closed:?}");
    server.drained().await;
}
