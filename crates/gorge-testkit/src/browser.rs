//! A simulated Phorge browser tab: a WebSocket client that behaves exactly as `JX.Aphlict`
//! over `JX.WebSocket` (Phorge's `webroot/rsrc/js/application/aphlict/Aphlict.js` and
//! `webroot/rsrc/externals/javelin/lib/WebSocket.js`), so the drills measure what a real
//! user would miss.
//!
//! What it copies, and why each matters to the drills:
//! - **Reconnect timing** (`JX.WebSocket`): the delay starts at 2 s; a successful open sets it
//!   to 0, so the first reconnect after a close is immediate; each further attempt doubles it
//!   (2 s, 4 s, 8 s …, at most 5 min). A connection that fails before opening counts as a
//!   close. No jitter.
//! - **On open** (`JX.Aphlict._open`): `subscribe` with the page's PHIDs at once (the
//!   `aphlict.getsubscribers` broadcast); if a connection was ever open before, 100 ms later
//!   `replay` with `age = min(500 + ms since the page loaded, 60000)`.
//! - **Repeats** (`JX.Leader.broadcast`): a message is handed to the page unless its
//!   `uniqueID` (PHP's `PhabricatorNotificationClient` adds 32 random characters to every
//!   message) is among the last 128 ids seen. The message `key` is the identity when there is
//!   no `uniqueID` (tools and tests that post without it).
//! - Keep-alive `ping` every 15 s; the `pong` is not a message.
//!
//! It records every message frame with the connection it arrived on, so a test can count
//! what the page missed, what reached the page twice, and what one connection carried twice
//! (the server's "never the same message twice on one connection").

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

/// `JX.WebSocket._resetDelay`.
const BASE_DELAY: Duration = Duration::from_millis(2000);
/// `JX.WebSocket._reconnect`: "Max out at 5 minutes between attempts."
const MAX_DELAY: Duration = Duration::from_secs(300);
/// `JX.Aphlict._open`: replay 100 ms after a reconnect, once other tabs have subscribed.
const REPLAY_AFTER: Duration = Duration::from_millis(100);
/// `JX.Aphlict.replay`: the margin added to the time since the page loaded, and the cap.
const REPLAY_MARGIN_MS: u64 = 500;
const REPLAY_MAX_MS: u64 = 60_000;
/// `JX.Aphlict._open`: the keep-alive interval.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// `JX.Leader._markSeen`: how many message ids it remembers.
const SEEN_IDS: usize = 128;
/// A connection attempt that takes longer than this counts as failed (a browser's own
/// handshake timeout is longer; tests only reach loopback).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One message frame as it arrived.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The message identity (`uniqueID`, else `key`), `None` for a frame with neither.
    pub id: Option<String>,
    /// The `key` field, as text (Phorge's keys are numbers or strings).
    pub key: Option<String>,
    /// Which connection (0 for the first) carried it.
    pub connection: usize,
    /// Whether `JX.Leader` handed it to the page (not a repeat of a recent id).
    pub to_page: bool,
    /// The whole frame.
    pub frame: Value,
}

/// Everything one browser saw.
#[derive(Debug, Default, Clone)]
pub struct Record {
    pub arrivals: Vec<Arrival>,
    /// Connections that opened.
    pub connections: usize,
    /// Connection attempts that failed before opening.
    pub failed_attempts: usize,
    /// `replay` commands sent.
    pub replays: usize,
}

impl Record {
    /// Ids handed to the page, in order, each once.
    pub fn page_ids(&self) -> Vec<String> {
        let mut seen = HashSet::new();
        self.arrivals
            .iter()
            .filter(|a| a.to_page)
            .filter_map(|a| a.id.clone())
            .filter(|id| seen.insert(id.clone()))
            .collect()
    }

    /// Every distinct id that arrived at all.
    pub fn ids(&self) -> HashSet<String> {
        self.arrivals.iter().filter_map(|a| a.id.clone()).collect()
    }

    /// Messages the page was handed more than once (a repeat older than the last 128 ids).
    pub fn page_duplicates(&self) -> usize {
        let mut seen = HashSet::new();
        self.arrivals
            .iter()
            .filter(|a| a.to_page)
            .filter_map(|a| a.id.as_ref())
            .filter(|id| !seen.insert(*id))
            .count()
    }

    /// Frames that repeated an id already carried by the same connection: the server sent
    /// one message twice on one socket.
    pub fn duplicates_on_one_connection(&self) -> usize {
        let mut seen: HashSet<(usize, &str)> = HashSet::new();
        self.arrivals
            .iter()
            .filter_map(|a| a.id.as_deref().map(|id| (a.connection, id)))
            .filter(|pair| !seen.insert(*pair))
            .count()
    }

    /// Reconnects: connections after the first.
    pub fn reconnects(&self) -> usize {
        self.connections.saturating_sub(1)
    }
}

/// What the test asks of a running browser.
enum Command {
    /// Send `ping` on the open connection and answer once its `pong` came back, so every
    /// earlier command (the subscribe) has taken effect. `JX.Aphlict` sends the same `ping`
    /// as its keep-alive, so the server sees nothing a browser would not send.
    Sync(oneshot::Sender<()>),
}

/// A running simulated browser; stops (closing its socket) when dropped.
pub struct Browser {
    record: Arc<Mutex<Record>>,
    commands: mpsc::UnboundedSender<Command>,
    /// How many connections have opened and subscribed.
    opened: watch::Receiver<usize>,
    task: JoinHandle<()>,
}

impl Browser {
    /// Loads the "page" now and connects to `ws://127.0.0.1:{port}{path}`, subscribing to
    /// `phids` on every connection.
    pub fn start(port: u16, path: &str, phids: &[&str]) -> Browser {
        let record = Arc::new(Mutex::new(Record::default()));
        let (commands, rx) = mpsc::unbounded_channel();
        let (opened_tx, opened) = watch::channel(0);
        let page = Page {
            url: format!("ws://127.0.0.1:{port}{path}"),
            port,
            subscribe: serde_json::json!({"command": "subscribe", "data": phids}).to_string(),
            loaded: Instant::now(),
            record: record.clone(),
            opened: opened_tx,
            seen: Seen::default(),
        };
        let task = tokio::spawn(page.run(rx));
        Browser {
            record,
            commands,
            opened,
            task,
        }
    }

    /// Waits (at most `timeout`) until a connection is open and its subscription has taken
    /// effect; false if that did not happen in time.
    pub async fn synced(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut opened = self.opened.clone();
            if tokio::time::timeout_at(deadline, opened.wait_for(|n| *n > 0))
                .await
                .is_err()
            {
                return false;
            }
            let (tx, rx) = oneshot::channel();
            if self.commands.send(Command::Sync(tx)).is_err() {
                return false;
            }
            match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(())) => return true,
                // The connection closed before the pong: try on the next one.
                Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(_) => return false,
            }
        }
    }

    /// A copy of what the browser has seen so far.
    pub fn record(&self) -> Record {
        self.record.lock().unwrap().clone()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `JX.Leader`'s memory of recent message ids.
#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl Seen {
    /// True if `id` is new (and remembers it), as `JX.Leader.broadcast` decides.
    fn first_time(&mut self, id: &str) -> bool {
        if self.ids.contains(id) {
            return false;
        }
        self.ids.insert(id.to_owned());
        self.order.push_back(id.to_owned());
        while self.order.len() > SEEN_IDS {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
        true
    }
}

struct Page {
    url: String,
    port: u16,
    subscribe: String,
    loaded: Instant,
    record: Arc<Mutex<Record>>,
    opened: watch::Sender<usize>,
    seen: Seen,
}

impl Page {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut delay = BASE_DELAY;
        let mut was_open = false;
        loop {
            if self.connection(was_open, &mut commands).await {
                was_open = true;
                // `_onopen`: the first reconnect after a successful connection is immediate.
                delay = Duration::ZERO;
            } else {
                self.record.lock().unwrap().failed_attempts += 1;
            }
            // `_onclose`: wait the current delay; `_reconnect`: then double it.
            tokio::time::sleep(delay).await;
            delay = if delay.is_zero() {
                BASE_DELAY
            } else {
                (delay * 2).min(MAX_DELAY)
            };
        }
    }

    /// One connection from attempt to close; false if it never opened.
    async fn connection(
        &mut self,
        is_reconnect: bool,
        commands: &mut mpsc::UnboundedReceiver<Command>,
    ) -> bool {
        let connect = async {
            let stream = TcpStream::connect(("127.0.0.1", self.port)).await.ok()?;
            tokio_tungstenite::client_async(self.url.as_str(), stream)
                .await
                .ok()
        };
        let Ok(Some((mut ws, _))) = tokio::time::timeout(CONNECT_TIMEOUT, connect).await else {
            return false;
        };
        let connection = {
            let mut record = self.record.lock().unwrap();
            record.connections += 1;
            record.connections - 1
        };
        if ws
            .send(Message::text(self.subscribe.clone()))
            .await
            .is_err()
        {
            return true;
        }
        self.opened.send_modify(|n| *n += 1);
        let replay_at = tokio::time::sleep(if is_reconnect {
            REPLAY_AFTER
        } else {
            Duration::MAX / 4
        });
        tokio::pin!(replay_at);
        let mut replayed = !is_reconnect;
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        keepalive.tick().await;
        let mut syncs: Vec<oneshot::Sender<()>> = Vec::new();
        loop {
            tokio::select! {
                () = &mut replay_at, if !replayed => {
                    replayed = true;
                    let since_load = self.loaded.elapsed().as_millis() as u64;
                    let age = (REPLAY_MARGIN_MS + since_load).min(REPLAY_MAX_MS);
                    let replay = serde_json::json!({"command": "replay", "data": {"age": age}});
                    self.record.lock().unwrap().replays += 1;
                    if ws.send(Message::text(replay.to_string())).await.is_err() {
                        return true;
                    }
                }
                _ = keepalive.tick() => {
                    if ws.send(Message::text(r#"{"command":"ping","data":null}"#)).await.is_err() {
                        return true;
                    }
                }
                command = commands.recv() => match command {
                    Some(Command::Sync(done)) => {
                        syncs.push(done);
                        if ws.send(Message::text(r#"{"command":"ping","data":null}"#)).await.is_err() {
                            return true;
                        }
                    }
                    None => return true,
                },
                frame = ws.next() => match frame {
                    Some(Ok(Message::Text(text))) => {
                        let Ok(frame) = serde_json::from_str::<Value>(&text) else { continue };
                        if frame["type"] == "pong" {
                            // Pongs come back in order; the oldest waiting sync is answered.
                            if !syncs.is_empty() {
                                let _ = syncs.remove(0).send(());
                            }
                            continue;
                        }
                        self.arrived(frame, connection);
                    }
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return true,
                    Some(Ok(_)) => {}
                },
            }
        }
    }

    fn arrived(&mut self, frame: Value, connection: usize) {
        let text = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        let key = text(&frame["key"]);
        let id = text(&frame["uniqueID"]).or_else(|| key.clone());
        let to_page = id.as_deref().is_none_or(|id| self.seen.first_time(id));
        self.record.lock().unwrap().arrivals.push(Arrival {
            id,
            key,
            connection,
            to_page,
            frame,
        });
    }
}

/// What a set of browsers missed of the posted ids, and their duplicates.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    /// Browser×message pairs posted but never received.
    pub missed_pairs: usize,
    /// Browsers that missed at least one message.
    pub browsers_missing: usize,
    /// The most messages one browser missed.
    pub worst: usize,
    /// Frames a connection carried twice, over all browsers.
    pub duplicates_on_one_connection: usize,
    /// Messages handed to a page twice, over all browsers.
    pub page_duplicates: usize,
    /// Reconnects over all browsers.
    pub reconnects: usize,
    /// The most page duplicates of one browser minus its reconnects (≤ 0 means at most one
    /// duplicate per reconnect).
    pub worst_duplicates_beyond_reconnects: i64,
}

/// Waits (up to `timeout`) until every browser has every posted message, then tallies what
/// they hold; the caller asserts on the tally, which says what is missing.
pub async fn settle(
    browsers: &[Browser],
    posted: &[String],
    timeout: Duration,
) -> (Tally, Vec<Record>) {
    let records = || browsers.iter().map(Browser::record).collect::<Vec<_>>();
    crate::within(timeout, || {
        std::future::ready(tally(&records(), posted).missed_pairs == 0)
    })
    .await;
    let records = records();
    (tally(&records, posted), records)
}

/// Tallies `records` against the ids every browser should have received.
pub fn tally(records: &[Record], posted: &[String]) -> Tally {
    let mut tally = Tally {
        worst_duplicates_beyond_reconnects: i64::MIN,
        ..Tally::default()
    };
    for record in records {
        let got = record.ids();
        let missed = posted.iter().filter(|id| !got.contains(*id)).count();
        tally.missed_pairs += missed;
        tally.browsers_missing += usize::from(missed > 0);
        tally.worst = tally.worst.max(missed);
        tally.duplicates_on_one_connection += record.duplicates_on_one_connection();
        let page_duplicates = record.page_duplicates();
        tally.page_duplicates += page_duplicates;
        tally.reconnects += record.reconnects();
        tally.worst_duplicates_beyond_reconnects = tally
            .worst_duplicates_beyond_reconnects
            .max(page_duplicates as i64 - record.reconnects() as i64);
    }
    tally
}

/// Missed ids per browser, for failure messages: browser index → missed ids (first few).
pub fn missed_by_browser(records: &[Record], posted: &[String]) -> HashMap<usize, Vec<String>> {
    records
        .iter()
        .enumerate()
        .filter_map(|(index, record)| {
            let got = record.ids();
            let missed: Vec<String> = posted
                .iter()
                .filter(|id| !got.contains(*id))
                .take(5)
                .cloned()
                .collect();
            (!missed.is_empty()).then_some((index, missed))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_forgets_ids_beyond_128() {
        let mut seen = Seen::default();
        assert!(seen.first_time("a"));
        assert!(!seen.first_time("a"));
        for i in 0..SEEN_IDS {
            assert!(seen.first_time(&i.to_string()));
        }
        // "a" fell out of the window of the last 128: a repeat now reaches the page.
        assert!(seen.first_time("a"));
    }

    #[test]
    fn records_count_duplicates_per_connection_and_per_page() {
        let arrival = |id: &str, connection, to_page| Arrival {
            id: Some(id.to_owned()),
            key: None,
            connection,
            to_page,
            frame: Value::Null,
        };
        let record = Record {
            arrivals: vec![
                arrival("1", 0, true),
                arrival("2", 0, true),
                // Replayed on the next connection: a repeat the page drops.
                arrival("1", 1, false),
                // The same connection carried "2" twice.
                arrival("2", 1, false),
                arrival("2", 1, false),
            ],
            connections: 2,
            ..Record::default()
        };
        assert_eq!(record.duplicates_on_one_connection(), 1);
        assert_eq!(record.page_duplicates(), 0);
        assert_eq!(record.page_ids(), ["1", "2"]);
        let posted = ["1".to_owned(), "2".to_owned(), "3".to_owned()];
        let t = tally(std::slice::from_ref(&record), &posted);
        assert_eq!(t.missed_pairs, 1);
        assert_eq!(t.browsers_missing, 1);
        assert_eq!(t.reconnects, 1);
        assert_eq!(t.duplicates_on_one_connection, 1);
    }
}
