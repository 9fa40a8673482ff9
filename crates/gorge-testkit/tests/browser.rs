//! The simulated browser against a scripted WebSocket server: what it sends on each
//! connection and when it reconnects, compared with `JX.Aphlict`/`JX.WebSocket`.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use gorge_testkit::browser::Browser;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

/// Accepts one WebSocket connection and returns it with when it was accepted.
async fn accept(
    listener: &TcpListener,
) -> (
    tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    Instant,
) {
    let (stream, _) = listener.accept().await.unwrap();
    let at = Instant::now();
    (tokio_tungstenite::accept_async(stream).await.unwrap(), at)
}

async fn next_command(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
) -> (Value, Instant) {
    loop {
        let message = tokio::time::timeout(gorge_testkit::PATIENCE, ws.next())
            .await
            .expect("a command in time")
            .unwrap()
            .unwrap();
        if let Message::Text(text) = message {
            return (serde_json::from_str(&text).unwrap(), Instant::now());
        }
    }
}

/// Waits until the browser has recorded `count` message frames.
async fn arrived(browser: &Browser, count: usize) {
    gorge_testkit::eventually(gorge_testkit::PATIENCE, "frames recorded", || async {
        browser.record().arrivals.len() >= count
    })
    .await;
}

#[tokio::test]
async fn reconnects_at_once_then_backs_off_and_replays_since_the_page_loaded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let loaded = Instant::now();
    let browser = Browser::start(port, "/~acme/", &["PHID-USER-a"]);

    // First connection: subscribe, no replay (the page has never been connected).
    let (mut first, _) = accept(&listener).await;
    let (subscribe, _) = next_command(&mut first).await;
    assert_eq!(
        subscribe.to_string(),
        r#"{"command":"subscribe","data":["PHID-USER-a"]}"#
    );
    first
        .send(Message::text(r#"{"key":"1","uniqueID":"u1"}"#))
        .await
        .unwrap();
    first
        .send(Message::text(r#"{"key":"1","uniqueID":"u1"}"#))
        .await
        .unwrap();
    arrived(&browser, 2).await;
    let closed_at = Instant::now();
    drop(first);

    // The reconnect is immediate; it subscribes at once and replays 100 ms later.
    let (mut second, reconnected_at) = accept(&listener).await;
    let (subscribe, _) = next_command(&mut second).await;
    assert_eq!(subscribe["command"], "subscribe");
    let (replay, replayed_at) = next_command(&mut second).await;
    assert_eq!(replay["command"], "replay");
    let age = replay["data"]["age"].as_u64().unwrap();
    let since_load = loaded.elapsed().as_millis() as u64;
    assert!(age >= 500 && age <= 500 + since_load, "{age} {since_load}");
    assert!(replayed_at - reconnected_at >= Duration::from_millis(100));
    // A replayed repeat is dropped by the page's id memory.
    second
        .send(Message::text(r#"{"key":"1","uniqueID":"u1"}"#))
        .await
        .unwrap();
    arrived(&browser, 3).await;
    drop(second);

    // Now every attempt fails (the connection is closed before the handshake): the next
    // attempt is immediate, then after 2 s, then after 4 s.
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let (stream, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
            .await
            .expect("an attempt in time")
            .unwrap();
        attempts.push(Instant::now());
        drop(stream);
    }
    let first_gap = attempts[1] - attempts[0];
    let second_gap = attempts[2] - attempts[1];
    assert!(attempts[0] - closed_at < first_gap, "{attempts:?}");
    // Ratios in one run, not absolute times: 4 s / 2 s.
    let ratio = second_gap.as_secs_f64() / first_gap.as_secs_f64();
    assert!((1.7..2.3).contains(&ratio), "{first_gap:?} {second_gap:?}");

    let record = browser.record();
    assert_eq!(record.connections, 2);
    assert_eq!(record.replays, 1);
    assert_eq!(record.arrivals.len(), 3);
    assert_eq!(record.duplicates_on_one_connection(), 1);
    assert_eq!(record.page_ids(), ["u1"]);
    assert_eq!(record.page_duplicates(), 0);
}
