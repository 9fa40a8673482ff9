//! Issue 18 item 1, mesh mode loses nothing (spec §8a), with real processes on loopback and
//! static peers: a restarted node warms its history from a ready peer before it is ready and
//! before it answers a replay; and the issue's drills — a same-host rolling upgrade of every
//! node, one node SIGKILLed and restarted after ~3 s — with 60 simulated `JX.Aphlict`
//! browsers and PHP-like posting (20 msg/s, round-robin, next server on failure) miss no
//! browser×message pair and never carry a message twice on one connection.

mod common;

use std::net::SocketAddr;
use std::ops::Deref;
use std::time::Duration;

use common::{Server, Ws, PATIENCE};
use gorge_notification::config::{ClusterConfig, PeerConfig, PeerProtocol, PeerUrl};
use gorge_testkit::browser::{self, Browser};
use gorge_testkit::http;
use serde_json::Value;
use tokio::sync::watch;

const PHID: &str = "PHID-USER-mesh";

/// One node of a three-node cluster, on ports fixed before it starts (every peer names them).
struct Node {
    server: Option<Server>,
    admin_port: u16,
    client_port: u16,
    peers: String,
}

impl Deref for Node {
    type Target = Server;

    fn deref(&self) -> &Server {
        self.server.as_ref().expect("the node is running")
    }
}

impl Node {
    fn start(&mut self) -> bool {
        let env = [
            ("GORGE_NOTIFICATION_PEERS", self.peers.as_str()),
            // Short drains keep the drills short; the browsers reconnect at once anyway.
            ("GORGE_NOTIFICATION_DRAIN_SECONDS", "2"),
        ];
        self.server = Server::start_on(self.client_port, self.admin_port, &env);
        self.server.is_some()
    }

    async fn ready(&self) -> bool {
        http::request(self.admin_port, "GET", "/readyz", &[], b"")
            .await
            .status
            == 200
    }
}

/// Three nodes that list each other.
fn cluster() -> Vec<Node> {
    for _ in 0..5 {
        let ports = gorge_testkit::free_ports(6);
        let mut nodes: Vec<Node> = (0..3)
            .map(|i| Node {
                server: None,
                admin_port: ports[i],
                client_port: ports[3 + i],
                peers: (0..3)
                    .filter(|&j| j != i)
                    .map(|j| format!("http://127.0.0.1:{}", ports[j]))
                    .collect::<Vec<_>>()
                    .join(","),
            })
            .collect();
        if nodes.iter_mut().all(Node::start) {
            return nodes;
        }
    }
    panic!("the cluster did not start");
}

fn message(key: &str) -> String {
    format!(
        r#"{{"type":"notification","key":"{key}","uniqueID":"u-{key}","subscribers":["{PHID}"]}}"#
    )
}

fn key_of(frame: &str) -> String {
    let frame: Value = serde_json::from_str(frame).unwrap();
    frame["key"].as_str().unwrap().to_owned()
}

/// Posts `key` to `origin` and waits until it reached the subscriber of every running node,
/// so that every history holds the messages in posting order.
async fn post_everywhere(origin: &Node, subscribers: &mut [Ws], key: &str) {
    origin.post_ok("", &message(key)).await;
    for subscriber in subscribers.iter_mut() {
        assert_eq!(key_of(&subscriber.next_text().await), key);
    }
}

#[tokio::test]
async fn a_node_restarted_after_sigkill_warms_its_history_before_it_is_ready() {
    let mut nodes = cluster();
    let mut subscribers = Vec::new();
    for node in &nodes {
        let mut ws = node.ws("/").await;
        ws.subscribe(&[PHID]).await;
        subscribers.push(ws);
    }
    let mut posted = Vec::new();
    for i in 0..9 {
        let key = format!("m{i}");
        post_everywhere(&nodes[i % 3], &mut subscribers, &key).await;
        posted.push(key);
    }

    // Node 2 crashes; the others go on.
    subscribers.pop();
    nodes[2].server.take().unwrap().process.kill();
    for i in 9..13 {
        let key = format!("m{i}");
        post_everywhere(&nodes[i % 2], &mut subscribers, &key).await;
        posted.push(key);
    }

    // Restarted on the same ports: ready only once warm, and then a replaying socket gets
    // every message, in order, once.
    assert!(nodes[2].start(), "node 2 restarted");
    let warmed = nodes[2].wait_for_log("NOTIFY_HISTORY_WARMED").await;
    // The peers' relays of m9..m12, queued while node 2 was down, may reach it before its
    // warm-up does (seen in a .ci/run on a loaded machine: 11 entries, 2 duplicates); such
    // messages count as duplicates of the warm-up, and the replay below still has all 13.
    let warmed_in = warmed["entries"].as_u64().unwrap() + warmed["duplicates"].as_u64().unwrap();
    assert_eq!(warmed_in, 13, "{warmed}");
    gorge_testkit::eventually(PATIENCE, "node 2 is ready", || nodes[2].ready()).await;
    let mut ws = nodes[2].ws("/").await;
    ws.subscribe(&[PHID]).await;
    ws.send(r#"{"command":"replay","data":{"age":60000}}"#)
        .await;
    let replayed: Vec<String> = ws.sync().await.iter().map(|f| key_of(f)).collect();
    assert_eq!(replayed, posted);
    assert_eq!(nodes[2].status("").await["history.size"], 13);
}

/// Posts like PHP's `PhabricatorNotificationClient`: each message (with a fresh `uniqueID`)
/// to one admin server, the next one when that fails; one message every 50 ms (20 msg/s),
/// starting at a different server each time. Returns the ids that some server accepted.
async fn post_like_php(admin_ports: Vec<u16>, mut stop: watch::Receiver<bool>) -> Vec<String> {
    let mut accepted = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    for n in 0usize.. {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
        let key = format!("d{n}");
        let body = message(&key);
        for i in 0..admin_ports.len() {
            let port = admin_ports[(n + i) % admin_ports.len()];
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let request = http::request_bytes(
                addr,
                "POST",
                "/",
                &[("Content-Type", "application/x-www-form-urlencoded")],
                body.as_bytes(),
            );
            if http::try_raw(port, &request)
                .await
                .is_some_and(|r| r.status == 200)
            {
                accepted.push(format!("u-{key}"));
                break;
            }
        }
    }
    accepted
}

/// 20 browsers per node, each subscribed (and synced) before the drill starts.
async fn browsers(nodes: &[Node]) -> Vec<Browser> {
    let mut all = Vec::new();
    for node in nodes {
        for _ in 0..20 {
            all.push(Browser::start(node.client_port, "/", &[PHID]));
        }
    }
    for b in &all {
        assert!(b.synced(PATIENCE).await, "a browser did not connect");
    }
    all
}

/// Browsers connected and posting running; [`Drill::finish`] tallies.
struct Drill {
    browsers: Vec<Browser>,
    stop: watch::Sender<bool>,
    poster: tokio::task::JoinHandle<Vec<String>>,
}

impl Drill {
    /// Connects the browsers and starts posting (half a second before the event).
    async fn start(nodes: &[Node]) -> Drill {
        let browsers = browsers(nodes).await;
        let (stop, stopped) = watch::channel(false);
        let ports: Vec<u16> = nodes.iter().map(|n| n.admin_port).collect();
        let poster = tokio::spawn(post_like_php(ports, stopped));
        tokio::time::sleep(Duration::from_millis(500)).await;
        Drill {
            browsers,
            stop,
            poster,
        }
    }

    /// Posts a second longer, stops, waits until every browser has every accepted message
    /// (bounded) and returns the tally.
    async fn finish(self) -> browser::Tally {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        self.stop.send_replace(true);
        let posted = self.poster.await.unwrap();
        // Bounded: a browser backing off after failed attempts (2 s, 4 s) is back by then.
        let (tally, records) =
            browser::settle(&self.browsers, &posted, Duration::from_secs(15)).await;
        eprintln!(
            "posted {} messages to {} browsers: {tally:?}; missed: {:?}",
            posted.len(),
            records.len(),
            browser::missed_by_browser(&records, &posted)
        );
        assert!(posted.len() >= 40, "posting stalled: {}", posted.len());
        tally
    }
}

/// What every drill must show: nothing missed, nothing twice on one connection.
fn assert_lossless(tally: &browser::Tally) {
    assert_eq!(tally.missed_pairs, 0, "{tally:?}");
    assert_eq!(tally.duplicates_on_one_connection, 0, "{tally:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_same_host_upgrade_of_every_node_loses_nothing() {
    let mut nodes = cluster();
    let drill = Drill::start(&nodes).await;
    let mut draining = Vec::new();
    for node in nodes.iter_mut() {
        // SIGTERM, and the new process on the same ports at once; the next node only once
        // this one is ready (warm), as a rolling upgrade waits for readiness.
        let previous = node.server.take().unwrap();
        previous.sigterm();
        assert!(node.start(), "the new process started");
        gorge_testkit::eventually(PATIENCE, "the new process is ready", || node.ready()).await;
        draining.push(previous);
        // Operators' rolling upgrades take a moment per node; the drills post meanwhile.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let tally = drill.finish().await;
    for mut previous in draining {
        assert_eq!(previous.process.exited().await.code(), Some(0));
    }
    assert!(tally.reconnects >= 60, "{tally:?}");
    assert_lossless(&tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_sigkilled_and_restarted_after_three_seconds_loses_nothing() {
    let mut nodes = cluster();
    let drill = Drill::start(&nodes).await;
    nodes[2].server.take().unwrap().process.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(nodes[2].start(), "node 2 restarted");
    gorge_testkit::eventually(PATIENCE, "node 2 is ready", || nodes[2].ready()).await;
    let tally = drill.finish().await;
    assert!(tally.reconnects >= 20, "{tally:?}");
    assert_lossless(&tally);
}

/// A sibling's admin port: answers every POST with a receipt of its own and records them.
fn sibling() -> gorge_testkit::Receiver {
    gorge_testkit::Receiver::with(|_, _| {
        gorge_testkit::Reply::Json(200, r#"{"fingerprint":"siblingFingerpr1"}"#.to_owned())
    })
}

// Multi-threaded: the receiver's wait blocks its thread while the server runs on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_joins_through_dns_announces_itself_to_the_siblings_it_resolved() {
    let sibling = sibling();
    let port = sibling.port();
    let _joining = common::InProcess::start(|config| {
        config.cluster = ClusterConfig::Mesh(PeerConfig {
            dns: Some(("127.0.0.1".to_owned(), port)),
            ..PeerConfig::default()
        });
    })
    .await;
    // It also asks the sibling for its history (warm-up); the order is not fixed.
    let requests = sibling.wait_for(2, PATIENCE);
    let announce = requests
        .iter()
        .find(|r| r.path == "/peers/announce")
        .expect("an announce");
    assert_eq!(announce.method, "POST");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_sibling_is_relayed_to_at_once() {
    let sibling = sibling();
    let port = sibling.port();
    // DNS does not answer (yet): only the announce can make the sibling known.
    let server = common::InProcess::start(|config| {
        config.cluster = ClusterConfig::Mesh(PeerConfig {
            dns: Some(("sibling.invalid".to_owned(), port)),
            ..PeerConfig::default()
        });
    })
    .await;
    let announced = http::request(server.admin_port, "POST", "/peers/announce", &[], b"").await;
    assert_eq!(announced.status, 200, "{announced:?}");
    server.post_ok("", &message("after-announce")).await;
    // The server may ask the announced sibling for its history (warm-up) first.
    let mut relayed = None;
    gorge_testkit::eventually(PATIENCE, "the message was relayed", || {
        relayed = sibling
            .requests()
            .into_iter()
            .find(|r| r.method == "POST" && r.path == "/?instance=default");
        std::future::ready(relayed.is_some())
    })
    .await;
    let body: Value = serde_json::from_slice(&relayed.unwrap().body).unwrap();
    assert_eq!(body["key"], "after-announce");
}

#[tokio::test]
async fn history_is_exported_for_a_starting_peer_byte_for_byte() {
    let server = common::InProcess::start(|_| {}).await;
    server
        .post_ok(
            "?instance=a+b",
            r#"{"key":1,"big":12345678901234567890,"subscribers":["P"]}"#,
        )
        .await;
    server.clock.advance_ms(250);
    server.post_ok("", r#"{"key":2}"#).await;
    let fp = &server.fingerprint;
    let export = http::request(server.admin_port, "GET", "/history/?age=60000", &[], b"").await;
    assert_eq!(export.status, 200);
    assert_eq!(export.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(
        export.text(),
        format!(
            "{{\"instance\":\"a b\",\"age_ms\":250,\"message\":{{\"key\":1,\"big\":12345678901234567890,\"subscribers\":[\"P\"],\"touched\":[\"{fp}\"]}}}}\n\
             {{\"instance\":\"default\",\"age_ms\":0,\"message\":{{\"key\":2,\"touched\":[\"{fp}\"]}}}}\n"
        )
    );
    // Only the last `age` ms.
    let recent = http::request(server.admin_port, "GET", "/history/?age=100", &[], b"").await;
    assert_eq!(recent.text().lines().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_waits_until_history_is_warm() {
    // A peer whose history export is held until the test releases it.
    let line = format!(
        "{{\"instance\":\"default\",\"age_ms\":10,\"message\":{}}}\n",
        message("warmed")
    );
    let peer = gorge_testkit::Receiver::with(move |request, _| {
        if request.path.starts_with("/history/") {
            gorge_testkit::Reply::HoldThen(Box::new(gorge_testkit::Reply::Json(200, line.clone())))
        } else {
            gorge_testkit::Reply::Json(200, r#"{"fingerprint":"peerFingerprint1"}"#.to_owned())
        }
    });
    let peer_port = peer.port();
    let server = common::InProcess::start(|config| {
        config.cluster = ClusterConfig::Mesh(PeerConfig {
            static_peers: vec![PeerUrl {
                protocol: PeerProtocol::Http,
                host: "127.0.0.1".to_owned(),
                port: peer_port,
            }],
            ..PeerConfig::default()
        });
    })
    .await;
    let readyz = || async {
        http::request(server.admin_port, "GET", "/readyz", &[], b"")
            .await
            .status
    };
    peer.wait_for(1, PATIENCE);
    assert_eq!(readyz().await, 503);
    let mut ws = server.ws("/").await;
    ws.subscribe(&[PHID]).await;
    ws.send(r#"{"command":"replay","data":{"age":60000}}"#)
        .await;
    // Delivered live meanwhile, and not replayed again on this connection.
    server.post_ok("", &message("live")).await;
    assert_eq!(key_of(&ws.next_text().await), "live");
    assert_eq!(readyz().await, 503);
    peer.release();
    // The replay answered only now, with the peer's history.
    let frames: Vec<String> = ws.sync().await.iter().map(|f| key_of(f)).collect();
    assert_eq!(frames, ["warmed"]);
    assert_eq!(readyz().await, 200);
}
