//! Broker mode (spec §8b) with real processes: every test starts its own `redis-server` on a
//! free loopback port with persistence off, so it can pause (`SIGSTOP`), kill and restart it,
//! and real `gorge-notification` processes that share it.
//!
//! "Exactly once" is shown by order, not by waiting for nothing: a socket reads exactly the
//! frames expected, then a marker posted last must be its very next frame.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::broker::*;
use common::redis::Redis;
use common::{Server, Ws, BIN, PATIENCE};
use gorge_testkit::process::Signal;
use gorge_testkit::{eventually, free_ports, within_blocking};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn a_post_on_one_node_reaches_a_socket_on_every_node_exactly_once() {
    let redis = Redis::start();
    let a = node(&redis.url()).await;
    let b = node(&redis.url()).await;
    let mut on_a = subscribed(&a).await;
    let mut on_b = subscribed(&b).await;

    let posted: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
    for (i, key) in posted.iter().enumerate() {
        post(if i % 2 == 0 { &a } else { &b }, key).await;
    }
    // The frames of one server arrive in its order; the two origins may interleave.
    for ws in [&mut on_a, &mut on_b] {
        let mut got = keys(ws, posted.len()).await;
        got.sort();
        assert_eq!(got, posted);
    }
    // Nothing else came in between: the marker is the next frame everywhere.
    post(&a, "marker").await;
    assert_eq!(keys(&mut on_a, 1).await, ["marker"]);
    assert_eq!(keys(&mut on_b, 1).await, ["marker"]);

    // A's message on B went A → stream → B, stamped like a relayed one (touched: A then B).
    post(&a, "route").await;
    let on_a_frame: Value = serde_json::from_str(&on_a.next_text().await).unwrap();
    let on_b_frame: Value = serde_json::from_str(&on_b.next_text().await).unwrap();
    assert_eq!(on_a_frame["touched"], serde_json::json!([a.fingerprint]));
    assert_eq!(
        on_b_frame["touched"],
        serde_json::json!([a.fingerprint, b.fingerprint])
    );
    // Counted just after the hand-over to the fan-out, so possibly after the frame.
    eventually(PATIENCE, "B counted A's 5 messages", || async {
        metric(&b, "gorge_notification_broker_received_total").await == 5.0
    })
    .await;
    assert_eq!(metric(&a, "gorge_notification_broker_up").await, 1.0);
    eventually(PATIENCE, "A skipped its own 5 entries", || async {
        metric(&a, "gorge_notification_broker_own_skipped_total").await == 5.0
    })
    .await;
}

/// Posts `count` messages to `server`, and waits until `reader`'s socket got them all (so
/// they are in the stream).
async fn post_through(server: &Server, reader: &mut Ws, count: usize) -> Vec<String> {
    let posted: Vec<String> = (0..count).map(|i| format!("h{i}")).collect();
    for key in &posted {
        post(server, key).await;
    }
    assert_eq!(keys(reader, count).await, posted);
    posted
}

#[tokio::test]
async fn a_node_killed_and_restarted_replays_every_message_in_order() {
    let redis = Redis::start();
    let a = node(&redis.url()).await;
    let mut b = node(&redis.url()).await;
    let mut on_b = subscribed(&b).await;
    let posted = post_through(&a, &mut on_b, 12).await;
    drop(on_b);

    let (client_port, admin_port) = (b.client_port, b.admin_port);
    b.process.kill();
    let b = node_on(client_port, admin_port, &redis.url()).await;
    assert_eq!(replayed(&b).await, posted);
    assert_eq!(
        metric(&b, "gorge_notification_broker_hydrated_entries_total").await,
        12.0
    );
    let hydrated = b.wait_for_log("NOTIFY_BROKER_HYDRATED").await;
    assert_eq!(hydrated["entries"], 12);
}

#[tokio::test]
async fn after_a_whole_cluster_restart_a_new_browser_replays_everything() {
    let redis = Redis::start();
    let a = node(&redis.url()).await;
    let b = node(&redis.url()).await;
    let mut on_b = subscribed(&b).await;
    let posted = post_through(&a, &mut on_b, 20).await;
    drop((on_b, a, b));

    let a = node(&redis.url()).await;
    let b = node(&redis.url()).await;
    assert_eq!(replayed(&a).await, posted);
    assert_eq!(replayed(&b).await, posted);
}

#[tokio::test]
async fn redis_paused_five_seconds_delays_messages_and_loses_none() {
    let redis = Redis::start();
    let a = node(&redis.url()).await;
    let b = node(&redis.url()).await;
    let mut on_a = subscribed(&a).await;
    let mut on_b = subscribed(&b).await;
    post(&a, "before").await;
    assert_eq!(keys(&mut on_b, 1).await, ["before"]);
    assert_eq!(keys(&mut on_a, 1).await, ["before"]);

    redis.process.signal(Signal::STOP);
    let paused = Instant::now();
    let posted: Vec<String> = (0..5).map(|i| format!("p{i}")).collect();
    for key in &posted {
        post(&a, key).await;
        assert_eq!(
            keys(&mut on_a, 1).await,
            [key.as_str()],
            "delivered locally at once"
        );
    }
    // The POSTs never waited for Redis: had each waited for one Redis call's timeout (2 s),
    // the five would have taken 10 s.
    assert!(
        paused.elapsed() < Duration::from_secs(2),
        "{:?}",
        paused.elapsed()
    );
    eventually(PATIENCE, "broker_up turned 0", || async {
        metric(&a, "gorge_notification_broker_up").await == 0.0
    })
    .await;
    // Readiness stays: a cluster whose every node went unready would be reached by no PHP.
    assert_eq!(readyz(&a).await, 200);
    assert_eq!(readyz(&b).await, 200);
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(paused.elapsed())).await;
    redis.process.signal(Signal::CONT);

    assert_eq!(
        keys(&mut on_b, posted.len()).await,
        posted,
        "late, in order"
    );
    post(&a, "marker").await;
    assert_eq!(keys(&mut on_b, 1).await, ["marker"], "none twice");
    assert_eq!(keys(&mut on_a, 1).await, ["marker"]);
    eventually(PATIENCE, "broker_up back to 1", || async {
        metric(&a, "gorge_notification_broker_up").await == 1.0
    })
    .await;
    // Counted when Redis's answer comes, which can be after B read the entry.
    eventually(PATIENCE, "A counted 7 published", || async {
        metric(&a, "gorge_notification_broker_published_total").await == 7.0
    })
    .await;
    // Logged once per outage and connection, not per failed call.
    assert!(a.log_events("NOTIFY_BROKER_DOWN").len() <= 2);
}

#[tokio::test]
async fn redis_restarted_empty_is_counted_and_later_messages_flow() {
    let mut redis = Redis::start();
    let a = node(&redis.url()).await;
    let b = node(&redis.url()).await;
    let mut on_a = subscribed(&a).await;
    let mut on_b = subscribed(&b).await;
    post(&a, "before").await;
    assert_eq!(keys(&mut on_b, 1).await, ["before"]);
    assert_eq!(keys(&mut on_a, 1).await, ["before"]);

    redis.restart_empty();
    for server in [&a, &b] {
        eventually(PATIENCE, "the epoch change was counted", || async {
            metric(server, "gorge_notification_broker_epoch_changes_total").await == 1.0
        })
        .await;
    }
    post(&a, "after").await;
    assert_eq!(keys(&mut on_b, 1).await, ["after"]);
    post(&b, "back").await;
    assert_eq!(keys(&mut on_a, 2).await, ["after", "back"]);
    assert_eq!(keys(&mut on_b, 1).await, ["back"]);
}

/// A publisher whose `XADD` was applied but whose answer was lost when Redis went down
/// retries it on the next connection, so after a restart without persistence the same entry
/// (fingerprint and sequence number) can come again in the new stream. Readers keep the
/// first copy of each across the restart too. Before, a reader forgot the copies it had
/// seen when the epoch changed, and this test's socket on B got "before" twice; the CI run
/// of `redis_restarted_empty_is_counted_and_later_messages_flow` caught it once, when A's
/// answer for "before" was still on its way at the restart.
#[tokio::test]
async fn an_entry_added_again_after_redis_restarted_empty_is_not_delivered_twice() {
    use redis::streams::StreamRangeReply;
    use redis::TypedCommands;

    let mut redis = Redis::start();
    let a = node(&redis.url()).await;
    let b = node(&redis.url()).await;
    let mut on_b = subscribed(&b).await;
    post(&a, "before").await;
    assert_eq!(keys(&mut on_b, 1).await, ["before"]);
    let stream = "gorge:notification:stream";
    let client = redis::Client::open(redis.url()).unwrap();
    let entries: StreamRangeReply = client.get_connection().unwrap().xrange_all(stream).unwrap();
    let before = entries
        .ids
        .into_iter()
        .find(|entry| entry.map.contains_key("message"))
        .expect("the message's entry");

    redis.restart_empty();
    eventually(PATIENCE, "B counted the epoch change", || async {
        metric(&b, "gorge_notification_broker_epoch_changes_total").await == 1.0
    })
    .await;
    // A's retry of "before", as it lands in the new stream.
    let fields: Vec<(String, Vec<u8>)> = before
        .map
        .iter()
        .map(|(field, value)| (field.clone(), redis::from_redis_value_ref(value).unwrap()))
        .collect();
    let mut conn = client.get_connection().unwrap();
    redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg(&fields)
        .exec(&mut conn)
        .unwrap();
    post(&a, "after").await;
    assert_eq!(keys(&mut on_b, 1).await, ["after"], "\"before\" only once");
}

#[tokio::test]
async fn a_reader_connection_that_delivers_nothing_is_found_by_the_probe() {
    let redis = Redis::start();
    let ProxiedPair {
        proxy,
        a,
        b,
        mut on_a,
    } = ProxiedPair::start(redis.port, &redis.url()).await;

    // A's reader connection, open now, hears no more pushes: it answers every call, and its
    // wait for the next entry never ends. Connections opened later work.
    proxy.deafen_open_readers();
    post(&b, "during").await;
    let probe = a.wait_for_log("NOTIFY_BROKER_PROBE_TIMEOUT").await;
    // Found by the probe (our own entry not back 2 s after Redis acknowledged it), not by
    // the reader's read without a push (every 5 s), which logs no such event.
    assert_eq!(probe["timeout_ms"], 2000);
    assert_eq!(keys(&mut on_a, 1).await, ["during"], "late, not lost");
    assert!(metric(&a, "gorge_notification_broker_probe_timeouts_total").await >= 1.0);
    // The deaf connection is given up for a new one (after a backoff).
    eventually(PATIENCE, "the reader reconnected", || async {
        metric(&a, "gorge_notification_broker_reconnects_total").await >= 1.0
    })
    .await;
}

#[test]
fn broker_and_peers_together_stop_startup_with_exit_2() {
    for peers in [
        ("GORGE_NOTIFICATION_PEERS", "http://127.0.0.1:1"),
        ("GORGE_NOTIFICATION_PEER_DNS", "peers:22281"),
    ] {
        // Two ports held at once, so they differ (two free_port() calls can return one port).
        let ports = free_ports(2);
        // Bounded: a binary that accepted this would serve until killed.
        let mut child = Command::new(BIN)
            .env_clear()
            .env(BROKER_URL, "redis://127.0.0.1:1/")
            .env(peers.0, peers.1)
            .env("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1")
            .env("GORGE_NOTIFICATION_CLIENT_PORT", ports[0].to_string())
            .env("GORGE_NOTIFICATION_ADMIN_PORT", ports[1].to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut status = None;
        if !within_blocking(PATIENCE, || {
            status = child.try_wait().unwrap();
            status.is_some()
        }) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running with {peers:?} and a broker");
        }
        let status = status.expect("exited");
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("GORGE_NOTIFICATION_BROKER_URL")
                && stderr.contains("cannot be combined with peers"),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn readiness_and_replay_wait_until_the_history_is_loaded() {
    let redis = Redis::start();
    let a = node(&redis.url()).await;
    let mut on_a = subscribed(&a).await;
    for key in ["w1", "w2", "w3"] {
        post(&a, key).await;
    }
    assert_eq!(keys(&mut on_a, 3).await, ["w1", "w2", "w3"]);

    // B starts while Redis does not answer: it cannot load the history yet.
    redis.process.signal(Signal::STOP);
    let b = Server::start(&[(BROKER_URL, &redis.url())]);
    let mut ws = b.ws(&format!("/~{INSTANCE}/")).await;
    ws.send(&serde_json::json!({"command": "subscribe", "data": [PHID]}).to_string())
        .await;
    ws.send(r#"{"command":"replay","data":{"age":60000}}"#)
        .await;
    assert_eq!(
        readyz(&b).await,
        503,
        "not ready before its history is loaded"
    );

    redis.process.signal(Signal::CONT);
    // The replay was answered only once the history was there: it has everything.
    let replayed: Vec<String> = ws.sync().await.iter().map(|f| key_of(f)).collect();
    assert_eq!(replayed, ["w1", "w2", "w3"]);
    ready(&b).await;
}

#[tokio::test]
async fn a_message_posted_while_the_history_loads_is_replayed() {
    let redis = Redis::start();
    let a = node(&redis.url()).await;
    let mut on_a = subscribed(&a).await;
    for key in ["old1", "old2"] {
        post(&a, key).await;
    }
    assert_eq!(keys(&mut on_a, 2).await, ["old1", "old2"]);
    // The older messages become 2 s older than what follows (a message age, not a wait for
    // an event).
    tokio::time::sleep(Duration::from_secs(2)).await;

    redis.process.signal(Signal::STOP);
    let b = Server::start(&[(BROKER_URL, &redis.url())]);
    // Accepted and kept here before the older messages arrive from the stream.
    post(&b, "late").await;
    let late_posted = Instant::now();
    redis.process.signal(Signal::CONT);
    ready(&b).await;

    // A replay reaching back past "late" but not to the older messages' real age.
    let age = late_posted.elapsed().as_millis() as u64 + 500;
    let mut ws = subscribed(&b).await;
    ws.send(&format!(r#"{{"command":"replay","data":{{"age":{age}}}}}"#))
        .await;
    let replayed: Vec<String> = ws.sync().await.iter().map(|f| key_of(f)).collect();
    assert!(replayed.contains(&"late".to_string()), "{replayed:?}");
}

#[tokio::test]
async fn a_full_publish_queue_drops_and_counts_and_the_rest_arrives_late() {
    let redis = Redis::start();
    let a = Server::start(&[
        (BROKER_URL, &redis.url()),
        ("GORGE_NOTIFICATION_BROKER_QUEUE_CAPACITY", "2"),
    ]);
    ready(&a).await;
    let b = node(&redis.url()).await;
    let mut on_b = subscribed(&b).await;

    redis.process.signal(Signal::STOP);
    // The publisher's call failed: it retries with backoff and takes nothing meanwhile.
    // (`broker_up` may turn 0 before that: the reader's watchdog finds our probe overdue.)
    eventually(PATIENCE, "a stream addition failed", || async {
        metric(&a, "gorge_notification_broker_failed_total").await > 0.0
    })
    .await;
    let posted: Vec<String> = (0..6).map(|i| format!("q{i}")).collect();
    for key in &posted {
        post(&a, key).await;
    }
    // The queue holds 2; the publisher may hold one more it is retrying.
    let dropped = metric(
        &a,
        "gorge_notification_broker_dropped_total{reason=\"queue_full\"}",
    )
    .await as usize;
    assert!((3..=4).contains(&dropped), "{dropped}");
    redis.process.signal(Signal::CONT);

    // The first ones, in order, late; then nothing else before the marker.
    let kept = posted.len() - dropped;
    assert_eq!(keys(&mut on_b, kept).await, posted[..kept]);
    post(&a, "marker").await;
    assert_eq!(keys(&mut on_b, 1).await, ["marker"]);
}

#[tokio::test]
async fn a_starting_node_loads_a_history_longer_than_one_read() {
    let redis = Redis::start();
    let a = node(&redis.url()).await;
    // More than one page (256 entries) of the stream.
    let posted: Vec<String> = (0..300).map(|i| format!("l{i}")).collect();
    for key in &posted {
        post(&a, key).await;
    }
    eventually(PATIENCE, "every message is in the stream", || async {
        metric(&a, "gorge_notification_broker_own_skipped_total").await == 300.0
    })
    .await;
    // A socket queue that holds a replay of all of them (the default holds 256 frames).
    let c = Server::start(&[
        (BROKER_URL, &redis.url()),
        ("GORGE_NOTIFICATION_QUEUE_FRAMES", "1024"),
    ]);
    ready(&c).await;
    assert_eq!(
        metric(&c, "gorge_notification_broker_hydrated_entries_total").await,
        300.0
    );
    assert_eq!(replayed(&c).await, posted);
}

/// A `rediss://` broker whose certificate a private CA signed: with that CA in
/// `BROKER_CA_FILE` the nodes verify it, connect and carry a message across; with another
/// CA they refuse it, and say why.
#[tokio::test]
async fn a_tls_broker_is_verified_against_the_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let (redis, ca_pem) = Redis::start_tls(dir.path());
    let ca_file = dir.path().join("trusted-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let ca_file = ca_file.to_str().unwrap();
    let env = [(BROKER_URL, redis.tls_url()), (BROKER_CA, ca_file.into())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = Server::start(&env);
    let b = Server::start(&env);
    ready(&a).await;
    ready(&b).await;
    let mut on_b = subscribed(&b).await;
    post(&a, "over-tls").await;
    assert_eq!(keys(&mut on_b, 1).await, ["over-tls"]);
    assert_eq!(metric(&a, "gorge_notification_broker_up").await, 1.0);
    assert_eq!(metric(&b, "gorge_notification_broker_up").await, 1.0);

    // A CA that did not sign the server's certificate: no connection, and the log says so.
    let other = common::redis::throwaway_ca("some other CA");
    let wrong_file = dir.path().join("wrong-ca.pem");
    std::fs::write(&wrong_file, other.certificate.pem()).unwrap();
    let c = Server::start(&[
        (BROKER_URL, &redis.tls_url()),
        (BROKER_CA, wrong_file.to_str().unwrap()),
    ]);
    let down = c.wait_for_log("NOTIFY_BROKER_DOWN").await;
    let error = down["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("invalid peer certificate") && error.contains("UnknownIssuer"),
        "{down}"
    );
    assert_eq!(metric(&c, "gorge_notification_broker_up").await, 0.0);
}

#[test]
fn a_ca_file_without_a_certificate_or_without_tls_stops_startup_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let pem = dir.path().join("ca.pem");
    std::fs::write(&pem, common::redis::throwaway_ca("x").certificate.pem()).unwrap();
    for (url, file, why) in [
        (
            "rediss://127.0.0.1:1/",
            &not_pem,
            "holds no PEM certificate",
        ),
        ("redis://127.0.0.1:1/", &pem, "only for a rediss://"),
    ] {
        let output = Command::new(BIN)
            .env_clear()
            .env(BROKER_URL, url)
            .env(BROKER_CA, file)
            .arg("--check-config")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(BROKER_CA) && stderr.contains(why),
            "{stderr}"
        );
    }
}

/// A TCP proxy in front of Redis whose replies reach the client `delay` after Redis sent
/// them, as over a long link: each chunk is held for `delay` from its arrival, and chunks
/// behind it are not held longer.
struct SlowLink {
    port: u16,
}

impl SlowLink {
    async fn start(upstream: u16, delay: Duration) -> SlowLink {
        let port = tcp_proxy(upstream, move |client, server| async move {
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
            });
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = server_read.read(&mut buf).await {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            });
            while let Some((due, bytes)) = rx.recv().await {
                tokio::time::sleep_until(due.into()).await;
                if client_write.write_all(&bytes).await.is_err() {
                    break;
                }
            }
        })
        .await;
        SlowLink { port }
    }

    fn url(&self) -> String {
        proxy_url(self.port)
    }
}

/// The publisher adds what is queued in one round trip, not one round trip per message:
/// over a link with a long round trip, a burst of 30 messages reaches the other node in
/// about two round trips (the first message alone, the rest together), where one `XADD` at
/// a time took thirty.
#[tokio::test]
async fn a_burst_is_published_in_a_few_round_trips_not_one_per_message() {
    let redis = Redis::start();
    let link = SlowLink::start(redis.port, Duration::from_millis(100)).await;
    let a = node(&link.url()).await;
    let b = node(&redis.url()).await;
    let mut on_b = subscribed(&b).await;
    // Warm: both connections of A are up and the stream exists.
    post(&a, "warm").await;
    assert_eq!(keys(&mut on_b, 1).await, ["warm"]);

    let started = Instant::now();
    post(&a, "one").await;
    assert_eq!(keys(&mut on_b, 1).await, ["one"]);
    let one = started.elapsed();

    let burst: Vec<String> = (0..30).map(|i| format!("b{i}")).collect();
    let started = Instant::now();
    for key in &burst {
        post(&a, key).await;
    }
    assert_eq!(keys(&mut on_b, burst.len()).await, burst);
    let all = started.elapsed();
    assert!(
        all < one * 8,
        "30 messages took {all:?}, one took {one:?}: one round trip per message"
    );
}
