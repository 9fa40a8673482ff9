//! Spec test 6: real `gorge-notification` processes that list each other as peers deliver a
//! message posted to any one of them exactly once to a subscribed WebSocket on each; when one
//! peer hangs and is then killed, the others keep delivering to each other and their admin
//! POSTs keep answering.
//!
//! "Exactly once" is proven by ordering, never by waiting: after each message every
//! subscriber's next frame must be that message, and a final sweep of markers (one posted to
//! each server) must be the next frames everywhere; a duplicate relayed the long way round
//! would show up in between. The `touched` list of each frame pins the route (one hop).

mod common;

use std::collections::BTreeSet;
use std::ops::Deref;

use common::{Server, Ws, PATIENCE};
use gorge_testkit::process::Signal;
use gorge_testkit::{eventually, http, RefusedPort};
use serde_json::Value;

const INSTANCE: &str = "cluster";
const PHID: &str = "PHID-USER-cluster";
/// Far beyond `PATIENCE`: a server that waited on a hung peer would answer its admin POST
/// only after this, and fail the test.
const PEER_TIMEOUT_MS: &str = "60000";

/// One server of the cluster, on ports chosen before it starts because every peer's
/// configuration names them.
struct Node(Server);

impl Deref for Node {
    type Target = Server;

    fn deref(&self) -> &Server {
        &self.0
    }
}

impl Node {
    /// `None` if the process exited (or hung) before serving, e.g. because a port picked
    /// free was taken meanwhile.
    fn start(admin_port: u16, client_port: u16, peer_admin_ports: &[u16]) -> Option<Node> {
        let peers: Vec<String> = peer_admin_ports
            .iter()
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect();
        let peers = peers.join(",");
        let env = [
            ("GORGE_NOTIFICATION_PEERS", peers.as_str()),
            ("GORGE_NOTIFICATION_PEER_TIMEOUT_MS", PEER_TIMEOUT_MS),
        ];
        Server::start_on(client_port, admin_port, &env).map(Node)
    }

    /// Posts a message and returns the fingerprint of the receipt. The bounded wait inside
    /// `http` is the "an admin POST never waits on a peer" check.
    async fn post(&self, body: &str) -> String {
        let query = format!("?instance={INSTANCE}");
        let response = self.0.post(&query, body).await;
        assert_eq!(response.status, 200, "admin POST: {response:?}");
        response.json()["fingerprint"].as_str().unwrap().to_owned()
    }

    async fn messages_in(&self) -> u64 {
        let query = format!("?instance={INSTANCE}");
        self.status(&query).await["messages.in"].as_u64().unwrap()
    }

    async fn metrics_text(&self) -> String {
        http::request(self.admin_port, "GET", "/metrics", &[], b"")
            .await
            .text()
    }

    /// Polls `/metrics` until `condition` holds for it: relay workers update their metrics on
    /// their own schedule, which nothing else orders against the test. The bound only turns
    /// a hang into a failure.
    async fn wait_for_metrics(&self, what: &str, condition: impl Fn(&str) -> bool) {
        eventually(PATIENCE, what, || async {
            condition(&self.metrics_text().await)
        })
        .await;
    }

    /// Waits until at least one `event` line about `peer` was logged (logging is
    /// asynchronous), then returns all of them.
    async fn wait_for_log(&self, event: &str, peer: &str) -> Vec<Value> {
        let about_peer = || -> Vec<Value> {
            self.log_events(event)
                .into_iter()
                .filter(|line| line["peer"] == peer)
                .collect()
        };
        eventually(PATIENCE, event, || async { !about_peer().is_empty() }).await;
        about_peer()
    }
}

/// The value of one sample in a `/metrics` text, 0 when absent.
fn sample(metrics: &str, name: &str) -> f64 {
    gorge_testkit::sample(metrics, name).unwrap_or(0.0)
}

/// Starts `count` servers, each listing the others (and itself when `list_self`, as Phorge's
/// cluster documentation allows), and one subscribed socket per server.
async fn start_cluster(count: usize, list_self: bool) -> (Vec<Node>, Vec<Ws>) {
    let nodes = (0..5)
        .find_map(|_| try_start_cluster(count, list_self))
        .expect("the cluster did not start");
    let mut subscribers = Vec::new();
    for node in &nodes {
        let mut ws = Ws::connect(node.client_port, &format!("/~{INSTANCE}/")).await;
        ws.subscribe(&[PHID]).await;
        subscribers.push(ws);
    }
    (nodes, subscribers)
}

fn try_start_cluster(count: usize, list_self: bool) -> Option<Vec<Node>> {
    let ports = gorge_testkit::free_ports(2 * count);
    let (admin, client) = ports.split_at(count);
    (0..count)
        .map(|i| {
            let peers: Vec<u16> = (0..count)
                .filter(|&j| list_self || j != i)
                .map(|j| admin[j])
                .collect();
            Node::start(admin[i], client[i], &peers)
        })
        .collect()
}

/// A message as PHP would post it, with text and numbers that must pass through unchanged.
fn message(key: &str) -> String {
    format!(
        r#"{{"type":"notification","key":"{key}","title":"build 100% done: a=1 & b=2 — ünïcødé","big":12345678901234567890,"subscribers":["{PHID}"]}}"#
    )
}

/// Checks a delivered frame: every posted field intact, and `touched` naming the origin and,
/// on any other server, exactly that server after it (one hop).
fn assert_delivered(frame: &str, key: &str, origin: &Node, receiver: &Node) {
    let posted: Value = serde_json::from_str(&message(key)).unwrap();
    let frame: Value = serde_json::from_str(frame).unwrap();
    let frame = frame.as_object().unwrap();
    for (name, value) in posted.as_object().unwrap() {
        assert_eq!(
            frame.get(name),
            Some(value),
            "field {name} of message {key}"
        );
    }
    let touched: Vec<&str> = frame["touched"]
        .as_array()
        .unwrap()
        .iter()
        .map(|fp| fp.as_str().unwrap())
        .collect();
    let mut route = vec![origin.fingerprint.as_str()];
    if receiver.fingerprint != origin.fingerprint {
        route.push(&receiver.fingerprint);
    }
    assert_eq!(touched, route, "touched of {key}");
}

/// Posts one message to each server in turn; after each, every subscriber's next frame must
/// be that message. `subscribers[i]` listens on `nodes[i]`.
async fn post_to_each(nodes: &[Node], subscribers: &mut [Ws], round: &str) {
    for (index, origin) in nodes.iter().enumerate() {
        let key = format!("{round}{index}");
        assert_eq!(origin.post(&message(&key)).await, origin.fingerprint);
        for (receiver, subscriber) in nodes.iter().zip(subscribers.iter_mut()) {
            let frame = subscriber.next_text().await;
            assert_delivered(&frame, &key, origin, receiver);
        }
    }
}

/// Posts one marker to each server; every subscriber's next frames must be exactly those
/// markers, so any duplicate still travelling would be caught here.
async fn sweep(nodes: &[Node], subscribers: &mut [Ws], round: &str) {
    let mut expected = BTreeSet::new();
    for (index, node) in nodes.iter().enumerate() {
        let key = format!("{round}-marker{index}");
        node.post(&message(&key)).await;
        expected.insert(key);
    }
    for subscriber in subscribers.iter_mut() {
        let mut seen = BTreeSet::new();
        for _ in 0..expected.len() {
            let frame: Value = serde_json::from_str(&subscriber.next_text().await).unwrap();
            seen.insert(frame["key"].as_str().unwrap().to_owned());
        }
        assert_eq!(seen, expected, "frames after the {round} messages");
    }
}

#[tokio::test]
async fn three_peers_deliver_exactly_once_and_survive_losing_one() {
    let (mut nodes, mut subscribers) = start_cluster(3, false).await;
    let distinct: BTreeSet<&str> = nodes.iter().map(|n| n.fingerprint.as_str()).collect();
    assert_eq!(distinct.len(), 3);

    post_to_each(&nodes, &mut subscribers, "first").await;
    sweep(&nodes, &mut subscribers, "first").await;
    for node in &nodes {
        // 3 messages and 3 markers, each accepted once; a second copy would count again.
        assert_eq!(node.messages_in().await, 6);
    }

    // A hung peer: the kernel still accepts its connections but nobody answers, so a relay
    // to it lasts until PEER_TIMEOUT_MS. The other two must not wait for it.
    nodes[2].process.signal(Signal::STOP);
    let hung_subscriber = subscribers.pop().unwrap();
    post_to_each(&nodes[..2], &mut subscribers, "hung").await;

    // Now dead for good.
    let dead = nodes.pop().unwrap();
    let dead_peer = format!("127.0.0.1:{}", dead.admin_port);
    // Keep its address dead: a port gone back to the kernel can be handed to a parallel
    // test's server, which then answers the relays kept for this peer (seen: 3 relays "ok").
    let _dead_address = RefusedPort::hold(dead.admin_port);
    drop(dead);
    drop(hung_subscriber);
    post_to_each(&nodes, &mut subscribers, "dead").await;
    sweep(&nodes, &mut subscribers, "last").await;

    // Server 0 relayed five messages to the dead peer (first0, first-marker0, hung0, dead0,
    // last-marker0). What it could not deliver is kept and retried (until the history age),
    // never dropped; the failures were logged as one state change.
    let relays = |result: &str| {
        format!("gorge_notification_peer_relays_total{{peer=\"{dead_peer}\",result=\"{result}\"}}")
    };
    let (ok, failed) = (relays("ok"), relays("failed"));
    nodes[0]
        .wait_for_metrics("relays to the dead peer were retried", |metrics| {
            sample(metrics, &failed) >= 3.0
        })
        .await;
    let metrics = nodes[0].metrics_text().await;
    assert!(sample(&metrics, &ok) <= 2.0, "{metrics}");
    assert_eq!(sample(&metrics, &relays("dropped")), 0.0);
    assert_eq!(sample(&metrics, &relays("expired")), 0.0);
    let downs = nodes[0].wait_for_log("NOTIFY_PEER_DOWN", &dead_peer).await;
    assert_eq!(downs.len(), 1, "{downs:?}");
}

#[tokio::test]
async fn servers_that_list_themselves_too_deliver_exactly_once() {
    let (nodes, mut subscribers) = start_cluster(2, true).await;
    // The first relay to itself teaches each server that the address is its own.
    post_to_each(&nodes, &mut subscribers, "first").await;
    post_to_each(&nodes, &mut subscribers, "second").await;
    sweep(&nodes, &mut subscribers, "last").await;
    for node in &nodes {
        // Its own address is no longer a peer.
        node.wait_for_metrics("the server found itself", |metrics| {
            sample(metrics, "gorge_notification_peers_known") == 1.0
        })
        .await;
        // 4 messages and 2 markers; the copies a server sent itself were not delivered again
        // but count in messages.in, as Aphlict counts every POST it parsed.
        let own_copies = sample(
            &node.metrics_text().await,
            "gorge_notification_messages_duplicate_total",
        );
        assert!(own_copies >= 1.0);
        assert_eq!(node.messages_in().await, 6 + own_copies as u64);
        let own_address = format!("127.0.0.1:{}", node.admin_port);
        let found = node.wait_for_log("NOTIFY_PEER_IS_SELF", &own_address).await;
        assert_eq!(found.len(), 1, "{found:?}");
    }
}

/// `GORGE_LOG_LEVEL=info,peers=debug` (operations.md's example) logs every relay, and only
/// the `peers` component's debug events: the admin port's stay at info.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_at_debug_logs_every_relay_and_nothing_else_at_debug() {
    let (receiver, sender) = (0..5)
        .find_map(|_| {
            let ports = gorge_testkit::free_ports(4);
            let receiver = Server::start_on(ports[0], ports[1], &[])?;
            let peer = format!("http://127.0.0.1:{}", ports[1]);
            let env = [
                ("GORGE_NOTIFICATION_PEERS", peer.as_str()),
                ("GORGE_LOG_LEVEL", "info,peers=debug"),
            ];
            Some((receiver, Server::start_on(ports[2], ports[3], &env)?))
        })
        .expect("servers did not start");
    let response = sender
        .post(&format!("?instance={INSTANCE}"), &message("debug"))
        .await;
    assert_eq!(response.status, 200, "{response:?}");
    let relayed = sender.wait_for_log("NOTIFY_PEER_RELAYED").await;
    assert_eq!(
        relayed["peer"],
        format!("127.0.0.1:{}", receiver.admin_port),
        "{relayed}"
    );
    assert_eq!(relayed["component"], "peers", "{relayed}");
    assert_eq!(relayed["instance"], INSTANCE, "{relayed}");
    assert!(sender.log_events("NOTIFY_MESSAGE_ACCEPTED").is_empty());
}
