//! SIGTERM: readiness turns 503 and the listeners close, every socket gets close 1001 spread
//! over the drain window, and the process exits 0 within the deadline; meanwhile a new
//! process on the same ports takes every new socket and admin POST (same-host restart).

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Server, PATIENCE};
use futures_util::future::join_all;
use gorge_testkit::http;
use serde_json::Value;

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

    // Readiness turns 503 and then the listeners close (a new process may take the ports).
    // A 200 is only possible while the signal is on its way: never after a 503, and never
    // once the server has logged SHUTDOWN_STARTED, which it does right before readiness
    // turns off (same task, no await in between).
    let deadline = Instant::now() + PATIENCE;
    let readyz = b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let mut seen_503 = false;
    loop {
        let shutdown_logged = !server.log_events("SHUTDOWN_STARTED").is_empty();
        let Some(r) = http::try_raw(server.admin_port, readyz).await else {
            break;
        };
        if r.status == 503 {
            assert_eq!(r.body, br#"{"status":"draining"}"#);
            seen_503 = true;
        } else {
            assert_eq!(r.status, 200);
            assert!(!seen_503, "readiness answered 200 after a 503");
            assert!(
                !shutdown_logged,
                "readiness answered 200 after SHUTDOWN_STARTED"
            );
        }
        assert!(Instant::now() < deadline, "listeners never closed");
        tokio::task::yield_now().await;
    }
    server.wait_for_log("LISTENERS_CLOSED").await;
    // No new socket gets in while draining.
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", server.client_port))
            .await
            .is_err()
    );

    let mut closed_after = Vec::new();
    for result in join_all(closing).await {
        let (closed, at) = result.unwrap();
        assert_eq!(closed.code, Some(1001));
        closed_after.push(at - signalled);
    }
    closed_after.sort();
    // Spread over the window, not one burst: the server holds the last close until late in
    // the window, the middle 80 % of the closes span at least 40 % of it (ideally 80 %), and
    // they fall into many distinct 50 ms steps (ideally 40). Lower bounds, which a slow
    // machine cannot break; a burst at any moment fails all three.
    let last = closed_after[SOCKETS - 1];
    assert!(last >= window / 2, "last close after {last:?}");
    let middle = closed_after[SOCKETS * 9 / 10] - closed_after[SOCKETS / 10];
    assert!(
        middle >= window * 2 / 5,
        "the middle 80 % of closes spanned only {middle:?}"
    );
    let steps: BTreeSet<u128> = closed_after.iter().map(|at| at.as_millis() / 50).collect();
    assert!(
        steps.len() >= 10,
        "closes fell into only {} distinct 50 ms steps: {closed_after:?}",
        steps.len()
    );

    let done = server.drained().await;
    // The server measured its own drain within the hard deadline (window + 5 s).
    assert!(done["elapsed_ms"].as_u64().unwrap() <= 7000, "{done}");
    assert_eq!(
        server.log_events("NOTIFY_DRAIN_STARTED")[0]["sockets"],
        SOCKETS as u64
    );
}

/// `kill; start` with no pause (`bin/aphlict restart`, systemd): the new process binds the
/// same ports at once, takes every admin POST and new socket while the old one drains, and the
/// browser that reconnects replays what it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_on_the_same_ports_takes_over_while_the_old_one_drains() {
    let mut old = Server::start(&[("GORGE_NOTIFICATION_DRAIN_SECONDS", "3")]);
    let mut browser = old.ws("/").await;
    browser.subscribe(&["PHID-P"]).await;

    old.sigterm();
    let new = Server::start_on(old.client_port, old.admin_port, &[])
        .expect("a new process binds the ports of a draining one");
    old.wait_for_log("LISTENERS_CLOSED").await;

    let receipt = new
        .post("", r#"{"m":"while draining","subscribers":["PHID-P"]}"#)
        .await;
    assert_eq!(receipt.status, 200);
    assert_eq!(receipt.json()["fingerprint"], new.fingerprint.as_str());

    // The old process closes its socket within its window; the browser reconnects (to the new
    // process, the only one listening) and replays.
    assert_eq!(browser.until_closed().await.code, Some(1001));
    let mut browser = new.ws("/").await;
    browser.subscribe(&["PHID-P"]).await;
    browser.send(r#"{"command":"replay"}"#).await;
    let frames = browser.sync().await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    let message: Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(message["m"], "while draining");

    old.drained().await;
}
