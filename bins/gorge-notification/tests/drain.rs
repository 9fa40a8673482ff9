//! SIGTERM: readiness turns 503, new upgrades get 503, every socket gets close 1001 spread
//! over the drain window, and the process exits 0 within the deadline.

mod common;

use std::time::{Duration, Instant};

use common::{http, Server, PATIENCE};
use futures_util::future::join_all;

const SOCKETS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_sockets_over_the_window_and_exits_0() {
    let window = Duration::from_secs(2);
    let mut server = Server::start(&[("GORGE_NOTIFICATION_DRAIN_SECONDS", "2")]);
    let mut sockets = Vec::new();
    for _ in 0..SOCKETS {
        sockets.push(server.ws("/").await);
    }
    assert_eq!(server.status("").await["clients.active"], SOCKETS as u64);

    let closing = sockets
        .into_iter()
        .map(|mut ws| tokio::spawn(async move { (ws.until_closed().await, Instant::now()) }))
        .collect::<Vec<_>>();
    let signalled = Instant::now();
    server.sigterm();

    // Readiness turns 503 before anything else happens.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let r = http(server.admin_port, "GET", "/readyz", &[], b"").await;
        if r.status == 503 {
            assert_eq!(r.body, br#"{"status":"draining"}"#);
            break;
        }
        assert_eq!(r.status, 200);
        assert!(Instant::now() < deadline, "readyz never turned 503");
        tokio::task::yield_now().await;
    }
    // New upgrades are refused while draining.
    assert_eq!(server.refused_upgrade("/").await, 503);

    let mut closed_after = Vec::new();
    for result in join_all(closing).await {
        let (closed, at) = result.unwrap();
        assert_eq!(closed.code, Some(1001));
        closed_after.push(at - signalled);
    }
    closed_after.sort();
    // Spread, not all at once: the server holds the last close until late in the window
    // (this is a lower bound, which a slow machine cannot break).
    assert!(
        closed_after[SOCKETS - 1] >= window / 2,
        "last close after {:?}",
        closed_after[SOCKETS - 1]
    );

    let status = tokio::task::spawn_blocking(move || {
        let status = server.child.wait().unwrap();
        (status, server)
    })
    .await
    .unwrap();
    assert_eq!(status.0.code(), Some(0));
    let server = status.1;
    let done = server.log_events("NOTIFY_DRAIN_DONE");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["open_sockets"], 0);
    // The server measured its own drain within the hard deadline (window + 5 s).
    assert!(
        done[0]["elapsed_ms"].as_u64().unwrap() <= 7000,
        "{}",
        done[0]
    );
    assert_eq!(
        server.log_events("NOTIFY_DRAIN_STARTED")[0]["sockets"],
        SOCKETS as u64
    );
}
