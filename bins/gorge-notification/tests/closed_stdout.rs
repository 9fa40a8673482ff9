//! A closed stdout (a pipe to `head`, a journald restart) neither panics nor stops the
//! server: lines that cannot be written are dropped and counted, and it keeps serving.

mod common;

use std::process::Command;

use common::{metric, post, BIN, PATIENCE};
use gorge_testkit::{eventually, free_ports, http, Process};

const DROPPED: &str = "gorge_notification_log_lines_dropped_total";

#[tokio::test]
async fn a_closed_stdout_drops_and_counts_lines_and_the_server_keeps_serving() {
    // Two ports held at once, so they differ (two free_port() calls can return one port).
    let [client_port, admin_port] = free_ports(2)[..] else {
        unreachable!()
    };
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1")
        .env("GORGE_NOTIFICATION_CLIENT_PORT", client_port.to_string())
        .env("GORGE_NOTIFICATION_ADMIN_PORT", admin_port.to_string())
        .env("GORGE_LOG_FORMAT", "json")
        // Every accepted message is a debug line: each POST below makes one to drop.
        .env("GORGE_LOG_LEVEL", "debug");
    let mut server = Process::spawn_closing_stdout_after(command, "NOTIFY_STARTED");
    server
        .wait_for_event("NOTIFY_STARTED", PATIENCE)
        .expect("the server started");

    let message = r#"{"key":"1","subscribers":["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]}"#;
    for _ in 0..5 {
        assert_eq!(post(admin_port, "", message).await.status, 200);
    }
    eventually(PATIENCE, "the unwritable lines are counted", || async {
        metric(admin_port, DROPPED).await.unwrap_or(0.0) >= 5.0
    })
    .await;
    let before = metric(admin_port, DROPPED).await.unwrap();
    // Still serving, still counting: the log thread did not die on the first failure.
    for _ in 0..5 {
        assert_eq!(post(admin_port, "", message).await.status, 200);
    }
    eventually(PATIENCE, "later lines are counted too", || async {
        metric(admin_port, DROPPED).await.unwrap_or(0.0) >= before + 5.0
    })
    .await;
    let ready = http::request(admin_port, "GET", "/readyz", &[], b"").await;
    assert_eq!(ready.status, 200);

    server.sigterm();
    assert_eq!(server.exited().await.code(), Some(0));
    let stderr = server.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
}
