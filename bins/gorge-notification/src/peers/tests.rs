//! Tests of the peer relay against tiny scripted HTTP servers on ephemeral loopback ports.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gorge_testkit::{CapturedLog, Receiver, Recorded, Reply as HttpReply};
use prometheus_client::registry::Registry;

use super::{PeerMetrics, PeerRelay};
use crate::config::{PeerConfig, PeerUrl};

const OWN: &str = "ownFingerprint23";
const PEER: &str = "peerFingerprint4";
/// Long enough that no test depends on it expiring unless it means to.
const FLUSH: Duration = Duration::from_secs(30);

/// How the scripted server answers one request.
enum Reply {
    Receipt(String),
    Status(u16),
    Redirect(String),
    /// Waits for [`ScriptedServer::release`], then sends the default receipt.
    Held,
    /// Never answers; the connection stays open.
    Silent,
    /// Closes the connection without answering.
    Hangup,
}

/// A peer on the testkit receiver that answers requests in arrival order from a script,
/// then with receipts of its own fingerprint.
struct ScriptedServer {
    port: u16,
    receiver: Receiver,
    /// Requests the test has looked at with [`ScriptedServer::next`].
    seen: AtomicUsize,
}

impl ScriptedServer {
    fn start(script: Vec<Reply>) -> ScriptedServer {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        // Distinct per server, as real peers' fingerprints are.
        let default_fingerprint = format!("peer{}", STARTED.fetch_add(1, Ordering::Relaxed));
        let receipt = move |fingerprint: &str| {
            HttpReply::Json(200, format!("{{\"fingerprint\":\"{fingerprint}\"}}"))
        };
        let default_receipt = receipt(&default_fingerprint);
        let script: Vec<HttpReply> = script
            .into_iter()
            .map(|reply| match reply {
                Reply::Receipt(fingerprint) => receipt(&fingerprint),
                Reply::Status(status) => HttpReply::Json(status, "{}".to_owned()),
                Reply::Redirect(location) => HttpReply::Redirect(302, location),
                Reply::Held => HttpReply::HoldThen(Box::new(default_receipt.clone())),
                // Never released: this server's only hold.
                Reply::Silent => HttpReply::HoldThen(Box::new(HttpReply::Hangup)),
                Reply::Hangup => HttpReply::Hangup,
            })
            .collect();
        let receiver =
            Receiver::with(move |_, index| script.get(index).unwrap_or(&default_receipt).clone());
        ScriptedServer {
            port: receiver.port(),
            receiver,
            seen: AtomicUsize::new(0),
        }
    }

    fn url(&self) -> PeerUrl {
        peer_url(self.port)
    }

    /// Lets the held request answer.
    fn release(&self) {
        self.receiver.release();
    }

    /// The next request in arrival order.
    fn next(&self) -> Recorded {
        let index = self.seen.fetch_add(1, Ordering::SeqCst);
        self.receiver.wait_for(index + 1, FLUSH).swap_remove(index)
    }

    fn next_body(&self) -> String {
        String::from_utf8(self.next().body).unwrap()
    }

    fn assert_no_more_requests(&self) {
        let requests = self.receiver.requests();
        let seen = self.seen.load(Ordering::SeqCst);
        assert!(
            requests.len() <= seen,
            "unexpected request: {:?}",
            requests[seen]
        );
    }
}

fn request_line(request: &Recorded) -> String {
    format!("{} {} {}", request.method, request.path, request.version)
}

fn peer_url(port: u16) -> PeerUrl {
    PeerUrl {
        protocol: crate::config::PeerProtocol::Http,
        host: "127.0.0.1".to_owned(),
        port,
    }
}

fn config(static_peers: Vec<PeerUrl>) -> PeerConfig {
    PeerConfig {
        static_peers,
        dns: None,
        dns_refresh: Duration::from_secs(10),
        queue_capacity: 16,
        timeout: Duration::from_secs(5),
        keep_for: Duration::from_secs(60),
        ca_pem: None,
    }
}

struct Harness {
    relay: Arc<PeerRelay>,
    registry: Registry,
    events: CapturedLog,
}

impl Harness {
    fn start(cfg: PeerConfig) -> Harness {
        let mut registry = Registry::with_prefix("gorge_notification");
        let events = CapturedLog::default();
        let metrics = PeerMetrics::register(&mut registry);
        let relay = PeerRelay::start(cfg, OWN.to_owned(), metrics, events.logger());
        Harness {
            relay,
            registry,
            events,
        }
    }

    fn relay_origin(&self, instance: &str, body: &str) {
        self.relay.relay(
            instance,
            Bytes::copy_from_slice(body.as_bytes()),
            &[OWN.to_owned()],
        );
    }

    /// The value of one sample, `None` when the series is not exported.
    fn metric(&self, series: &str) -> Option<i64> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text.lines().find_map(|line| {
            let value = line.strip_prefix(series)?.strip_prefix(' ')?;
            value.parse().ok()
        })
    }

    fn relays(&self, port: u16, result: &str) -> Option<i64> {
        self.metric(&format!(
            "gorge_notification_peer_relays_total{{peer=\"127.0.0.1:{port}\",result=\"{result}\"}}"
        ))
    }

    /// Waits for a condition that a worker thread makes true; the bound only turns a hang
    /// into a failure.
    async fn wait_for(&self, what: &str, condition: impl Fn(&Harness) -> bool) {
        let give_up = Instant::now() + FLUSH;
        while !condition(self) {
            assert!(Instant::now() < give_up, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test]
async fn relays_the_stamped_body_to_every_peer_with_the_instance_in_the_query() {
    let a = ScriptedServer::start(vec![]);
    let b = ScriptedServer::start(vec![]);
    let harness = Harness::start(config(vec![a.url(), b.url()]));
    assert_eq!(harness.metric("gorge_notification_peers_known"), Some(2));
    let body = r#"{"title":"100% done","n":12345678901234567890,"touched":["ownFingerprint23"]}"#;
    harness.relay_origin("acme corp/x&y~", body);
    for server in [&a, &b] {
        let request = server.next();
        assert_eq!(
            request_line(&request),
            "POST /?instance=acme%20corp%2Fx%26y~ HTTP/1.1"
        );
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(request.body, body.as_bytes());
    }
    harness.relay.shutdown(FLUSH).await;
    for server in [&a, &b] {
        server.assert_no_more_requests();
        assert_eq!(harness.relays(server.port, "ok"), Some(1));
        assert_eq!(harness.relays(server.port, "failed"), Some(0));
        assert_eq!(
            harness.metric(&format!(
                "gorge_notification_peer_up{{peer=\"127.0.0.1:{}\"}}",
                server.port
            )),
            Some(1)
        );
    }
    assert_eq!(harness.events.starting_with("NOTIFY_PEER_UP").len(), 2);
    assert_eq!(
        harness
            .events
            .starting_with("NOTIFY_PEER_QUEUES_FLUSHED")
            .len(),
        1
    );
    assert_eq!(
        harness
            .events
            .starting_with("NOTIFY_PEER_LISTED_TWICE")
            .len(),
        0
    );
}

#[tokio::test]
async fn one_server_listed_under_two_addresses_is_reported() {
    let twin = || ScriptedServer::start(vec![Reply::Receipt("twinFingerprint".to_owned())]);
    let (a, b) = (twin(), twin());
    let harness = Harness::start(config(vec![a.url(), b.url()]));
    harness.relay_origin("default", "{}");
    harness.relay.shutdown(FLUSH).await;
    assert_eq!(
        harness
            .events
            .starting_with("NOTIFY_PEER_LISTED_TWICE")
            .len(),
        1
    );
}

#[tokio::test]
async fn a_message_that_arrived_from_a_peer_is_not_relayed_again() {
    let a = ScriptedServer::start(vec![]);
    let harness = Harness::start(config(vec![a.url()]));
    harness.relay.relay(
        "default",
        Bytes::from_static(b"{\"via\":\"peer\"}"),
        &[PEER.to_owned(), OWN.to_owned()],
    );
    harness.relay_origin("default", "{\"via\":\"origin\"}");
    // The queue is ordered: had the first been queued, it would arrive first.
    assert_eq!(a.next_body(), "{\"via\":\"origin\"}");
    harness.relay.shutdown(FLUSH).await;
    a.assert_no_more_requests();
}

#[tokio::test]
async fn a_peer_answering_with_our_fingerprint_is_us_and_never_sent_to_again() {
    let us = ScriptedServer::start(vec![Reply::Receipt(OWN.to_owned())]);
    let other = ScriptedServer::start(vec![]);
    let harness = Harness::start(config(vec![us.url(), other.url()]));
    harness.relay_origin("default", "{\"n\":1}");
    assert_eq!(us.next_body(), "{\"n\":1}");
    harness
        .wait_for("self-detection", |h| {
            h.metric("gorge_notification_peers_known") == Some(1)
        })
        .await;
    harness.relay_origin("default", "{\"n\":2}");
    assert_eq!(other.next_body(), "{\"n\":1}");
    assert_eq!(other.next_body(), "{\"n\":2}");
    harness.relay.shutdown(FLUSH).await;
    us.assert_no_more_requests();
    assert_eq!(
        harness.relays(us.port, "ok"),
        None,
        "labels of self are gone"
    );
    assert_eq!(harness.events.starting_with("NOTIFY_PEER_IS_SELF").len(), 1);
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_without_blocking() {
    let a = ScriptedServer::start(vec![Reply::Held]);
    let mut cfg = config(vec![a.url()]);
    cfg.queue_capacity = 2;
    let harness = Harness::start(cfg);
    harness.relay_origin("default", "{\"n\":1}");
    // The worker now waits on the held request, so the queue is empty with room for two.
    assert_eq!(a.next_body(), "{\"n\":1}");
    for n in 2..=5 {
        harness.relay_origin("default", &format!("{{\"n\":{n}}}"));
    }
    assert_eq!(harness.relays(a.port, "dropped"), Some(2));
    a.release();
    assert_eq!(a.next_body(), "{\"n\":2}");
    assert_eq!(a.next_body(), "{\"n\":3}");
    harness.relay.shutdown(FLUSH).await;
    a.assert_no_more_requests();
    assert_eq!(harness.relays(a.port, "ok"), Some(3));
    assert_eq!(harness.relays(a.port, "dropped"), Some(2));
}

#[tokio::test]
async fn failures_and_recovery_are_logged_once_per_state_change() {
    let a = ScriptedServer::start(vec![
        Reply::Status(503),
        Reply::Status(500),
        Reply::Status(503),
        Reply::Receipt(PEER.to_owned()),
        Reply::Receipt(PEER.to_owned()),
        Reply::Status(503),
        Reply::Receipt(PEER.to_owned()),
        Reply::Status(400),
    ]);
    let harness = Harness::start(config(vec![a.url()]));
    // 1 fails three times and goes on the fourth, 2 goes, 3 fails once and goes, 4 is
    // refused for good (a 4xx is not retried).
    for n in 1..=4 {
        harness.relay_origin("default", &format!("{{\"n\":{n}}}"));
    }
    harness.relay.shutdown(FLUSH).await;
    let bodies: Vec<String> = (0..8).map(|_| a.next_body()).collect();
    assert_eq!(
        bodies,
        [
            "{\"n\":1}",
            "{\"n\":1}",
            "{\"n\":1}",
            "{\"n\":1}",
            "{\"n\":2}",
            "{\"n\":3}",
            "{\"n\":3}",
            "{\"n\":4}"
        ]
    );
    a.assert_no_more_requests();
    assert_eq!(harness.relays(a.port, "failed"), Some(5));
    assert_eq!(harness.relays(a.port, "ok"), Some(3));
    let transitions: Vec<String> = harness
        .events
        .starting_with("NOTIFY_PEER_")
        .into_iter()
        .filter(|event| event.ends_with("_UP") || event.ends_with("_DOWN"))
        .collect();
    assert_eq!(
        transitions,
        [
            "NOTIFY_PEER_DOWN",
            "NOTIFY_PEER_UP",
            "NOTIFY_PEER_DOWN",
            "NOTIFY_PEER_UP",
            "NOTIFY_PEER_DOWN"
        ]
    );
    assert_eq!(
        harness.metric(&format!(
            "gorge_notification_peer_up{{peer=\"127.0.0.1:{}\"}}",
            a.port
        )),
        Some(0)
    );
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let target = ScriptedServer::start(vec![]);
    let redirecting = ScriptedServer::start(vec![Reply::Redirect(format!(
        "http://127.0.0.1:{}/",
        target.port
    ))]);
    let harness = Harness::start(config(vec![redirecting.url()]));
    harness.relay_origin("default", "{}");
    harness.relay.shutdown(FLUSH).await;
    redirecting.next();
    target.assert_no_more_requests();
    assert_eq!(harness.relays(redirecting.port, "failed"), Some(1));
}

#[tokio::test]
async fn an_unresponsive_peer_times_out_and_never_holds_up_the_others() {
    let stuck = ScriptedServer::start(vec![Reply::Silent]);
    let healthy = ScriptedServer::start(vec![]);
    let mut cfg = config(vec![stuck.url(), healthy.url()]);
    cfg.timeout = Duration::from_millis(300);
    let harness = Harness::start(cfg);
    harness.relay_origin("default", "{\"n\":1}");
    stuck.next();
    // The stuck peer still holds message 1 while the healthy one receives both.
    harness.relay_origin("default", "{\"n\":2}");
    assert_eq!(healthy.next_body(), "{\"n\":1}");
    assert_eq!(healthy.next_body(), "{\"n\":2}");
    harness.relay.shutdown(FLUSH).await;
    assert_eq!(harness.relays(stuck.port, "failed"), Some(1));
    assert_eq!(harness.relays(healthy.port, "ok"), Some(2));
}

/// A loopback port where nothing listens, held (bound, not listening) so nobody else
/// takes it: connecting is refused.
fn held_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = socket.local_addr().unwrap().port();
    (socket, port)
}

#[tokio::test]
async fn a_dead_peer_is_retried_until_the_history_age_then_given_up_and_counted() {
    let (_held, port) = held_port();
    let mut cfg = config(vec![peer_url(port)]);
    cfg.keep_for = Duration::from_millis(300);
    let harness = Harness::start(cfg);
    harness.relay_origin("default", "{}");
    harness.relay.shutdown(FLUSH).await;
    assert_eq!(harness.relays(port, "expired"), Some(1));
    assert!(harness.relays(port, "failed").unwrap() >= 2);
    assert_eq!(harness.events.starting_with("NOTIFY_PEER_DOWN").len(), 1);
}

#[tokio::test]
async fn past_the_drain_deadline_queued_messages_are_dropped() {
    let a = ScriptedServer::start(vec![Reply::Held]);
    let harness = Harness::start(config(vec![a.url()]));
    harness.relay_origin("default", "{\"n\":1}");
    a.next();
    for n in 2..=4 {
        harness.relay_origin("default", &format!("{{\"n\":{n}}}"));
    }
    harness.relay.shutdown(Duration::from_millis(1)).await;
    assert_eq!(
        harness
            .events
            .starting_with("NOTIFY_PEER_QUEUES_DROPPED")
            .len(),
        1
    );
    // Past the deadline, messages relayed later are dropped as well.
    harness.relay_origin("default", "{\"n\":5}");
    a.release();
    harness
        .wait_for("the queued messages to be dropped", |h| {
            h.relays(a.port, "dropped") == Some(4)
        })
        .await;
    assert_eq!(harness.relays(a.port, "ok"), Some(1));
    a.assert_no_more_requests();
}

#[tokio::test]
async fn messages_accepted_during_the_drain_are_still_relayed() {
    let a = ScriptedServer::start(vec![]);
    let harness = Harness::start(config(vec![a.url()]));
    harness.relay_origin("default", "{\"n\":1}");
    harness.relay.shutdown(FLUSH).await;
    assert_eq!(harness.relays(a.port, "ok"), Some(1));
    // The admin port still accepts posts until the load balancer has noticed /readyz.
    harness.relay_origin("default", "{\"n\":2}");
    assert_eq!(a.next_body(), "{\"n\":1}");
    assert_eq!(a.next_body(), "{\"n\":2}");
}

#[tokio::test]
async fn dns_discovery_adds_the_resolved_address() {
    let a = ScriptedServer::start(vec![]);
    let mut cfg = config(vec![]);
    cfg.dns = Some(("127.0.0.1".to_owned(), a.port));
    let harness = Harness::start(cfg);
    harness
        .wait_for("discovery", |h| {
            h.metric("gorge_notification_peers_known") == Some(1)
        })
        .await;
    harness.relay_origin("tenant", "{\"n\":1}");
    // Discovery also announces this server to the address it resolved, at any moment.
    let request = loop {
        let request = a.next();
        if request.path != super::ANNOUNCE_PATH {
            break request;
        }
    };
    assert_eq!(request_line(&request), "POST /?instance=tenant HTTP/1.1");
    harness.relay.shutdown(FLUSH).await;
    assert_eq!(
        harness.events.starting_with("NOTIFY_PEERS_CHANGED").len(),
        2
    );
}

mod plan {
    use std::collections::{BTreeSet, HashSet};
    use std::net::SocketAddr;

    use super::super::discovery::{plan, DnsPlan, KnownPeer};

    fn addrs(list: &[&str]) -> BTreeSet<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn vanished_dns_peers_are_removed_and_static_ones_kept() {
        let known = [
            KnownPeer {
                address: "10.0.0.1:22281",
                from_dns: true,
            },
            KnownPeer {
                address: "10.0.0.2:22281",
                from_dns: true,
            },
            KnownPeer {
                address: "peer-x:22281",
                from_dns: false,
            },
        ];
        let got = plan(
            &known,
            &addrs(&["10.0.0.2:22281", "10.0.0.3:22281"]),
            &HashSet::new(),
            64,
        );
        assert_eq!(
            got,
            DnsPlan {
                remove: vec!["10.0.0.1:22281".to_owned()],
                add: vec!["10.0.0.3:22281".parse().unwrap()],
                refused: 0,
            }
        );
    }

    #[test]
    fn the_cap_counts_refused_addresses_and_picks_in_address_order() {
        let known = [KnownPeer {
            address: "10.0.0.9:22281",
            from_dns: true,
        }];
        let resolved = addrs(&[
            "10.0.0.4:22281",
            "10.0.0.9:22281",
            "10.0.0.2:22281",
            "10.0.0.3:22281",
        ]);
        let got = plan(&known, &resolved, &HashSet::new(), 3);
        assert_eq!(got.remove, Vec::<String>::new());
        assert_eq!(
            got.add,
            vec![
                "10.0.0.2:22281".parse::<SocketAddr>().unwrap(),
                "10.0.0.3:22281".parse().unwrap()
            ]
        );
        assert_eq!(got.refused, 1);
    }

    #[test]
    fn an_address_known_to_be_us_is_never_added() {
        let us: HashSet<String> = ["[fd00::1]:22281".to_owned()].into();
        let got = plan(
            &[],
            &addrs(&["[fd00::1]:22281", "[fd00::2]:22281"]),
            &us,
            64,
        );
        assert_eq!(
            got.add,
            vec!["[fd00::2]:22281".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(got.refused, 0);
    }
}

#[tokio::test]
async fn a_relay_whose_connection_closed_unanswered_goes_again_on_a_new_connection() {
    // The peer's old process closed the kept-alive connection as it began draining.
    let a = ScriptedServer::start(vec![Reply::Hangup]);
    let harness = Harness::start(config(vec![a.url()]));
    harness.relay_origin("default", "{\"n\":1}");
    harness.relay.shutdown(FLUSH).await;
    assert_eq!(a.next_body(), "{\"n\":1}");
    assert_eq!(a.next_body(), "{\"n\":1}");
    a.assert_no_more_requests();
    assert_eq!(harness.relays(a.port, "reconnected"), Some(1));
    assert_eq!(harness.relays(a.port, "ok"), Some(1));
    assert_eq!(harness.relays(a.port, "failed"), Some(0));
}

#[tokio::test]
async fn relays_to_a_peer_that_is_down_are_kept_until_it_is_back() {
    // Down: connecting is refused; then the peer comes back on the same port.
    let (socket, port) = held_port();
    let harness = Harness::start(config(vec![peer_url(port)]));
    for n in 1..=3 {
        harness.relay_origin("default", &format!("{{\"n\":{n}}}"));
    }
    harness
        .wait_for("several attempts failed", |h| {
            h.relays(port, "failed").unwrap_or(0) >= 2
        })
        .await;
    // Back on the same port.
    let listener = socket.listen(16).unwrap().into_std().unwrap();
    listener.set_nonblocking(false).unwrap();
    let back = Receiver::on(listener, |_, _| {
        HttpReply::Json(200, format!("{{\"fingerprint\":\"{PEER}\"}}"))
    });
    let bodies: Vec<String> = back
        .wait_for(3, FLUSH)
        .into_iter()
        .map(|r| String::from_utf8(r.body).unwrap())
        .collect();
    assert_eq!(bodies, ["{\"n\":1}", "{\"n\":2}", "{\"n\":3}"]);
    harness.relay.shutdown(FLUSH).await;
    assert_eq!(harness.relays(port, "ok"), Some(3));
    assert_eq!(harness.relays(port, "dropped"), Some(0));
    assert_eq!(harness.relays(port, "expired"), Some(0));
}

#[tokio::test]
async fn an_announced_peer_stays_until_dns_lists_it() {
    let (_held, port) = held_port();
    let mut cfg = config(Vec::new());
    cfg.dns = Some(("sibling.invalid".to_owned(), port));
    let harness = Harness::start(cfg);
    assert!(harness.relay.announced("127.0.0.1".parse().unwrap()));
    assert!(harness.relay.announced("127.0.0.1".parse().unwrap()));
    assert_eq!(harness.metric("gorge_notification_peers_known"), Some(1));
    // A DNS answer that does not list it yet (the pod is not ready) keeps it; a DNS peer
    // that vanished from the answer goes as before.
    let other: SocketAddr = "127.0.0.2:1".parse().unwrap();
    harness.relay.shared.apply_dns(&BTreeSet::from([other]));
    assert_eq!(harness.metric("gorge_notification_peers_known"), Some(2));
    let third: SocketAddr = "127.0.0.3:1".parse().unwrap();
    harness.relay.shared.apply_dns(&BTreeSet::from([third]));
    assert_eq!(
        harness.relay.base_urls(),
        [
            format!("http://127.0.0.1:{port}/"),
            "http://127.0.0.3:1/".to_owned()
        ]
    );
    // Without DNS discovery an announce means nothing.
    let plain = Harness::start(config(Vec::new()));
    assert!(!plain.relay.announced("127.0.0.1".parse().unwrap()));
    assert_eq!(plain.metric("gorge_notification_peers_known"), Some(0));
    harness.relay.shutdown(Duration::ZERO).await;
}
