//! The listeners: where they bind by default, and under hostile or starved conditions: a
//! request body that never ends, a process out of file descriptors (accept failures logged
//! once and counted, the soft limit raised to the hard one at startup), and a burst of
//! subscriptions and large messages.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{InProcess, Server, BIN, PATIENCE};
use gorge_testkit::{free_ports, http, Process};
use tokio::net::TcpStream;

#[test]
fn by_default_the_admin_port_listens_on_loopback_only() {
    // Two ports held at once, so they differ (two free_port() calls can return one).
    let ports = free_ports(2);
    let (client, admin) = (ports[0], ports[1]);
    let mut command = Command::new(BIN);
    command
        .env_clear()
        // Only the client's address is set (a test listens on loopback); the admin's is
        // left to the default.
        .env("GORGE_NOTIFICATION_CLIENT_LISTEN_ADDR", "127.0.0.1")
        .env("GORGE_NOTIFICATION_CLIENT_PORT", client.to_string())
        .env("GORGE_NOTIFICATION_ADMIN_PORT", admin.to_string())
        .env("GORGE_LOG_FORMAT", "json");
    let server = Process::spawn(command);
    let started = server
        .wait_for_event("NOTIFY_STARTED", PATIENCE)
        .expect("the server started");
    assert_eq!(
        started["listeners"],
        format!("client=127.0.0.1:{client},admin=127.0.0.1:{admin}")
    );
    assert!(server.log_events("NOTIFY_ADMIN_NOT_LOOPBACK").is_empty());
    assert!(server.log_events("NOTIFY_CONFIG_WARNING").is_empty());
}

#[tokio::test]
async fn an_admin_post_whose_chunked_body_never_ends_is_closed() {
    let server = InProcess::start_with(Some(Duration::from_millis(300)), |_| {}).await;
    let chunked =
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n";
    let response = http::raw(server.admin_port, chunked).await;
    assert_eq!(response.status, 408, "{response:?}");
    // The server is fine otherwise.
    server.post_ok("", r#"{"subscribers":[]}"#).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_accepts_are_logged_once_and_counted() {
    // `ulimit -n` sets soft and hard: nothing to raise, and few descriptors to spare.
    let server = Server::start_in_shell("ulimit -n 48", &[]);
    let limit = server.wait_for_log("NOTIFY_FILE_LIMIT").await;
    assert_eq!(
        (&limit["soft"], &limit["hard"]),
        (&"48".into(), &"48".into())
    );

    let mut held = Vec::new();
    for _ in 0..80 {
        // The kernel completes the handshake whether or not the server can accept.
        held.push(
            TcpStream::connect(("127.0.0.1", server.client_port))
                .await
                .unwrap(),
        );
    }
    let failed = server.wait_for_log("ACCEPT_FAILED").await;
    assert_eq!(failed["listener"], "client", "{failed}");
    // The accept loop keeps failing while the descriptors are held; once they are released
    // the admin port answers and shows the count.
    drop(held);
    let errors = std::cell::Cell::new(0.0);
    gorge_testkit::eventually(PATIENCE, "accept errors counted", || {
        let (server, errors) = (&server, &errors);
        async move {
            let scrape = http::try_raw(
                server.admin_port,
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
            .await;
            let counted = scrape
                .filter(|r| r.status == 200)
                .and_then(|r| {
                    let text = String::from_utf8(r.body).unwrap();
                    gorge_testkit::sample(&text, "gorge_notification_accept_errors_total")
                })
                .unwrap_or(0.0);
            errors.set(counted);
            counted > 0.0
        }
    })
    .await;
    let errors = errors.get();
    // Failures repeat every 50 ms; the log line does not (at most one per listener per 10 s;
    // the admin listener may have failed too while our scrape was refused).
    assert!(errors >= 1.0);
    let client_lines = server
        .log_events("ACCEPT_FAILED")
        .into_iter()
        .filter(|l| l["listener"] == "client")
        .count();
    assert_eq!(client_lines, 1);
}

#[tokio::test]
async fn the_soft_file_limit_is_raised_to_the_hard_one() {
    let server = Server::start_in_shell("ulimit -Sn 100 && ulimit -Hn 4000", &[]);
    let limit = server.wait_for_log("NOTIFY_FILE_LIMIT").await;
    assert_eq!(limit["soft_before"], "100", "{limit}");
    assert_eq!(limit["soft"], "4000", "{limit}");
    assert_eq!(limit["hard"], "4000", "{limit}");
}

/// `VmRSS` and `VmHWM` of a process, in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    (
        common::status_kib(pid, "VmRSS:"),
        common::status_kib(pid, "VmHWM:"),
    )
}

/// Memory of a burst of subscriptions and of large messages is bounded and given back: 50
/// sockets subscribe as much as they can with 512-byte PHIDs (the per-socket bound refuses
/// the rest), close, and their charge returns to zero; 16 messages of ~1 MiB of subscribers
/// stay within the history bound, and a replay fills the socket's queue bound. Prints the server's RSS at each step
/// (`--nocapture`) for comparing allocator settings (e.g. `GORGE_DRILL_ENV=MALLOC_ARENA_MAX=2`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_and_history_memory_is_bounded_and_given_back() {
    let extra = std::env::var("GORGE_DRILL_ENV").unwrap_or_default();
    let env: Vec<(&str, &str)> = extra
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let server = Server::start(&env);
    let pid = server.process.id();
    println!("idle: rss/hwm KiB {:?}", rss_kib(pid));
    let phid = |s: usize, i: usize| format!("PHID-{s:04}-{i:06}-{}", "x".repeat(490));
    let mut sockets = Vec::new();
    for s in 0..50 {
        let mut ws = server.ws("/").await;
        for batch in 0..8 {
            let phids: Vec<String> = (0..120).map(|i| phid(s, batch * 120 + i)).collect();
            let command = serde_json::json!({"command": "subscribe", "data": phids});
            ws.send(&command.to_string()).await;
        }
        ws.sync().await;
        sockets.push(ws);
    }
    let charged = server.metric("gorge_notification_subscription_bytes").await;
    let ignored = server
        .metric("gorge_notification_subscriptions_ignored_total")
        .await;
    println!(
        "50 sockets subscribed: rss/hwm KiB {:?}, charged bytes {charged:?}, ignored {ignored:?}",
        rss_kib(pid)
    );
    // 960 PHIDs of ~530 bytes each would be ~500 KiB a socket; the per-socket bound
    // (512 KiB, subscription overhead included) is what keeps it, never more.
    let charged = charged.unwrap();
    assert!(
        charged > 0.0 && charged <= 50.0 * 512.0 * 1024.0,
        "{charged}"
    );
    drop(sockets);
    gorge_testkit::eventually(PATIENCE, "every socket closed", || {
        let server = &server;
        async move { server.status("").await["clients.active"] == 0 }
    })
    .await;
    let after_close = server.metric("gorge_notification_subscription_bytes").await;
    println!(
        "after close: rss/hwm KiB {:?}, charged bytes {after_close:?}",
        rss_kib(pid)
    );
    assert_eq!(after_close, Some(0.0), "the sockets' charge is given back");

    let subscribers: Vec<String> = (0..45_000).map(|i| format!("PHID-USER-{i:010}")).collect();
    let body = serde_json::json!({"subscribers": subscribers}).to_string();
    for _ in 0..16 {
        server.post_ok("", &body).await;
    }
    let history = server.metric("gorge_notification_history_bytes").await;
    println!(
        "16 x {} KiB messages: rss/hwm KiB {:?}, history bytes {history:?}",
        body.len() / 1024,
        rss_kib(pid),
    );
    // The default history bound is 16 MiB, all instances together.
    let history = history.unwrap();
    assert!(
        history > 0.0 && history <= 16.0 * 1024.0 * 1024.0,
        "{history}"
    );
    let mut ws = server.ws("/").await;
    ws.subscribe(&["PHID-USER-0000044999"]).await;
    let started = std::time::Instant::now();
    ws.send(r#"{"command":"replay"}"#).await;
    let replayed = ws.sync().await.len();
    println!(
        "replay of {replayed} frames took {:?}; rss/hwm KiB {:?}",
        started.elapsed(),
        rss_kib(pid)
    );
    // A replay fills at most seven eighths of the socket's queue bound (4 MiB by default):
    // the 3 newest of the 16 (~1 MiB each).
    assert_eq!(replayed, 3);
}
