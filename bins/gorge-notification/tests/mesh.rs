//! Issue 18 item 1, mesh mode loses nothing (spec §8a), with real processes on loopback and
//! static peers: a restarted node warms its history from a ready peer before it is ready and
//! before it answers a replay.

mod common;

use std::ops::Deref;

use common::{Server, Ws, PATIENCE};
use gorge_testkit::http;
use serde_json::Value;

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
        let env = [("GORGE_NOTIFICATION_PEERS", self.peers.as_str())];
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
    assert_eq!(warmed["entries"], 13, "{warmed}");
    gorge_testkit::eventually(PATIENCE, "node 2 is ready", || nodes[2].ready()).await;
    let mut ws = nodes[2].ws("/").await;
    ws.subscribe(&[PHID]).await;
    ws.send(r#"{"command":"replay","data":{"age":60000}}"#)
        .await;
    let replayed: Vec<String> = ws.sync().await.iter().map(|f| key_of(f)).collect();
    assert_eq!(replayed, posted);
    assert_eq!(nodes[2].status("").await["history.size"], 13);
}
