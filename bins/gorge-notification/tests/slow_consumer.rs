//! A socket that never reads must not slow anyone down: publishing never waits on it, the
//! readers get every message, and the stuck socket is disconnected and counted.

mod common;

use common::InProcess;
use futures_util::future::join_all;

const MESSAGES: usize = 2000;
const READERS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_socket_is_disconnected_and_nobody_waits_for_it() {
    let server = InProcess::start(|_| {}).await;
    // The stuck socket also wants large "ballast" messages, so its kernel buffers fill up
    // whatever their size, and its queue overflows while the readers' traffic stays small.
    let mut stuck = server.ws("/").await;
    stuck.subscribe(&["PHID-ALL", "PHID-BALLAST"]).await;
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let mut ws = server.ws("/").await;
        ws.subscribe(&["PHID-ALL"]).await;
        readers.push(ws);
    }
    let reading = readers
        .into_iter()
        .map(|mut ws| {
            tokio::spawn(async move {
                let mut seen = Vec::with_capacity(MESSAGES);
                while seen.len() < MESSAGES {
                    let frame = ws.next_text().await;
                    let v: serde_json::Value = serde_json::from_str(&frame).unwrap();
                    seen.push(v["n"].as_u64().unwrap() as usize);
                }
                // Nothing else was queued for a reader.
                assert_eq!(ws.sync().await, Vec::<String>::new());
                seen
            })
        })
        .collect::<Vec<_>>();

    let ballast = format!(
        r#"{{"subscribers":["PHID-BALLAST"],"pad":"{}"}}"#,
        "b".repeat(256 * 1024)
    );
    // If a publish waited on the stuck socket, this loop would never finish (the socket is
    // never read until after it).
    for n in 0..MESSAGES {
        let body = format!(r#"{{"n":{n},"subscribers":["PHID-ALL"]}}"#);
        server.post_ok("", &body).await;
        if n % 100 == 0 {
            server.post_ok("", &ballast).await;
        }
    }

    for seen in join_all(reading).await {
        let seen = seen.unwrap();
        assert_eq!(seen, (0..MESSAGES).collect::<Vec<_>>());
    }

    // Now read the stuck socket: what it had in kernel buffers, then the end.
    let closed = stuck.until_closed().await;
    // A close frame cannot always get past a full buffer; when it does, it says 1008.
    assert!(
        matches!(closed.code, None | Some(1008)),
        "{:?}",
        closed.code
    );
    assert!(closed.frames.len() < MESSAGES + MESSAGES / 100);
    server
        .assert_metric("gorge_notification_slow_consumer_disconnects_total", 1.0)
        .await;
    server
        .assert_metric(
            r#"gorge_notification_sockets_closed_total{reason="slow_consumer"}"#,
            1.0,
        )
        .await;
    assert!(
        server
            .metric("gorge_notification_queue_dropped_frames_total")
            .await
            .unwrap()
            >= 1.0
    );
}
