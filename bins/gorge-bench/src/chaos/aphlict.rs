//! A simulated Phorge browser tab for the chaos run: a WebSocket client that behaves as
//! `JX.Aphlict` over `JX.WebSocket` (the same rules as gorge-testkit's browser, which the
//! bench may not use; see docs/architecture.md) and records every connection, replay and
//! frame into the run's [`History`].
//!
//! - Reconnect: at once after a connection that opened closes, then 2 s, 4 s, 8 s … (at most
//!   5 min); an attempt that fails before opening counts as a close.
//! - On open: `subscribe` with the page's PHIDs; on a reconnect, 100 ms later, `replay` with
//!   `age = min(500 + ms since the page loaded, 60 000)`.
//! - Keep-alive `ping` every 15 s. One extra `ping` right after `subscribe` (a browser's
//!   keep-alive sends the same) marks when the subscription took effect: its `pong`.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use super::history::{Connection, Frame, History, Replay};
use super::stopped;

const BASE_DELAY: Duration = Duration::from_millis(2000);
const MAX_DELAY: Duration = Duration::from_secs(300);
const REPLAY_AFTER: Duration = Duration::from_millis(100);
const REPLAY_MARGIN_MS: u64 = 500;
const REPLAY_MAX_MS: u64 = 60_000;
const KEEPALIVE: Duration = Duration::from_secs(15);
/// A handshake longer than this counts as a failed attempt (a SIGSTOPped node accepts in
/// the kernel but never answers; a browser's own timeout is of this order).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const PING: &str = r#"{"command":"ping","data":null}"#;

/// Runs browser `browser` against `port` until `stop` turns true.
pub async fn run(
    browser: usize,
    port: u16,
    phids: Vec<String>,
    history: History,
    mut stop: watch::Receiver<bool>,
) {
    let loaded = Instant::now();
    let subscribe = serde_json::json!({"command": "subscribe", "data": phids}).to_string();
    let mut delay = BASE_DELAY;
    let mut connections = 0usize;
    loop {
        let opened = connection(
            browser,
            port,
            &subscribe,
            connections,
            loaded,
            &history,
            &mut stop,
        )
        .await;
        if opened {
            connections += 1;
            delay = Duration::ZERO;
        }
        if *stop.borrow() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stopped(&mut stop) => return,
        }
        delay = if delay.is_zero() {
            BASE_DELAY
        } else {
            (delay * 2).min(MAX_DELAY)
        };
    }
}

/// One connection from attempt to close; false if it never opened.
async fn connection(
    browser: usize,
    port: u16,
    subscribe: &str,
    index: usize,
    loaded: Instant,
    history: &History,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let url = format!("ws://127.0.0.1:{port}/");
    let connect = async {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        tokio_tungstenite::client_async(url.as_str(), stream)
            .await
            .ok()
    };
    let Ok(Some((mut ws, _))) = tokio::time::timeout(CONNECT_TIMEOUT, connect).await else {
        return false;
    };
    let opened_us = history.now_us();
    history.with(|log| {
        log.connections.push(Connection {
            browser,
            connection: index,
            opened_us,
            subscribed_us: None,
            closed_us: None,
        })
    });
    let closed = |history: &History| {
        let now = history.now_us();
        history.with(|log| {
            if let Some(c) = log
                .connections
                .iter_mut()
                .rev()
                .find(|c| c.browser == browser && c.connection == index)
            {
                c.closed_us = Some(now);
            }
        });
    };
    if ws.send(Message::text(subscribe.to_owned())).await.is_err()
        || ws.send(Message::text(PING)).await.is_err()
    {
        closed(history);
        return true;
    }
    let mut confirmed = false;
    let replay_at = tokio::time::sleep(if index > 0 {
        REPLAY_AFTER
    } else {
        Duration::MAX / 4
    });
    tokio::pin!(replay_at);
    let mut replayed = index == 0;
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    keepalive.tick().await;
    loop {
        tokio::select! {
            () = &mut replay_at, if !replayed => {
                replayed = true;
                let age_ms = (REPLAY_MARGIN_MS + loaded.elapsed().as_millis() as u64).min(REPLAY_MAX_MS);
                let at_us = history.now_us();
                history.with(|log| log.replays.push(Replay { browser, connection: index, at_us, age_ms }));
                let replay = serde_json::json!({"command": "replay", "data": {"age": age_ms}});
                if ws.send(Message::text(replay.to_string())).await.is_err() {
                    break;
                }
            }
            _ = keepalive.tick() => {
                if ws.send(Message::text(PING)).await.is_err() {
                    break;
                }
            }
            () = stopped(stop) => break,
            frame = ws.next() => match frame {
                Some(Ok(Message::Text(text))) => {
                    let Ok(frame) = serde_json::from_str::<Value>(&text) else { continue };
                    if frame["type"] == "pong" {
                        if !confirmed {
                            confirmed = true;
                            let now = history.now_us();
                            history.with(|log| {
                                if let Some(c) = log.connections.iter_mut().rev()
                                    .find(|c| c.browser == browser && c.connection == index) {
                                    c.subscribed_us = Some(now);
                                }
                            });
                        }
                        continue;
                    }
                    let id = match &frame["uniqueID"] {
                        Value::String(s) => s.clone(),
                        _ => continue,
                    };
                    let at_us = history.now_us();
                    history.with(|log| log.frames.push(Frame { browser, connection: index, at_us, unique_id: id }));
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
        }
    }
    closed(history);
    true
}
