//! A second copy on the same ports (they bind with SO_REUSEPORT, for in-place restarts) must
//! not split PHP's POSTs and the browsers between two hubs: it is refused while the first
//! copy serves, and takes over while the first one drains. Real processes: the exit code,
//! the pid and the ports are what is tested.

mod common;

use std::process::Command;

use common::{Server, BIN, PATIENCE};
use gorge_testkit::{free_port, http, Process};

/// The binary on `server`'s ports, as a second copy would start; stderr kept.
fn second_copy(server: &Server, env: &[(&str, &str)]) -> Process {
    copy_on(server.client_port, server.admin_port, env)
}

/// The binary on the given ports; stderr kept.
fn copy_on(client_port: u16, admin_port: u16, env: &[(&str, &str)]) -> Process {
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1")
        .env("GORGE_NOTIFICATION_CLIENT_PORT", client_port.to_string())
        .env("GORGE_NOTIFICATION_ADMIN_PORT", admin_port.to_string())
        .env("GORGE_LOG_FORMAT", "json")
        .envs(env.iter().copied());
    Process::spawn_keeping_stderr(command)
}

#[tokio::test]
async fn a_second_copy_is_refused_while_the_first_serves() {
    let first = Server::start(&[]);
    let mut second = second_copy(&first, &[]);
    assert_eq!(second.exited().await.code(), Some(1));
    let stderr = second.stderr();
    let pid = first.process.id();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "gorge-notification: another copy (pid {pid}) is already serving on 127.0.0.1:{} \
             (GET /readyz: 200)",
            first.admin_port
        )),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("kill -TERM {pid}")), "{stderr}");
    let logged = second.log_events("ANOTHER_COPY_SERVING");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0]["pid"], pid.to_string());
    assert!(second.log_events("NOTIFY_STARTED").is_empty());
    // Every POST still reaches the first copy, the only one.
    for _ in 0..6 {
        let receipt = first.post_ok("", r#"{"subscribers":[]}"#).await.json();
        assert_eq!(receipt["fingerprint"], first.fingerprint.as_str());
    }
}

/// A copy of the configuration with only the admin port changed: before, it bound the
/// client port beside the first copy and the kernel split the browsers between the two hubs
/// (13 of 40 got PHP's message in issue 30). Aphlict would fail to bind; it is refused.
#[tokio::test]
async fn a_second_copy_sharing_only_the_client_port_is_refused() {
    let first = Server::start(&[]);
    let mut second = copy_on(first.client_port, free_port(), &[]);
    let code = second.exited().await.code();
    let stderr = second.stderr();
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "gorge-notification: another copy is already serving on 127.0.0.1:{} (GET /readyz: \
             501 HTTP/501 Use Websockets)",
            first.client_port
        )),
        "{stderr}"
    );
    let logged = second.log_events("ANOTHER_COPY_SERVING");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(
        logged[0]["addr"],
        format!("127.0.0.1:{}", first.client_port)
    );
    assert!(second.log_events("NOTIFY_STARTED").is_empty());
}

#[tokio::test]
async fn a_second_copy_takes_over_while_the_first_drains() {
    // A socket and a long window keep the first copy draining while the second starts.
    let mut first = Server::start(&[("GORGE_NOTIFICATION_DRAIN_SECONDS", "10")]);
    let _browser = first.ws("/").await;
    first.sigterm();
    first.wait_for_log("LISTENERS_CLOSED").await;
    let second = second_copy(&first, &[]);
    let started = second
        .wait_for_event("NOTIFY_STARTED", PATIENCE)
        .expect("the second copy started");
    assert!(
        first.process.try_wait().is_none(),
        "the first copy was still draining"
    );
    // PHP's POSTs and readiness now reach the second copy.
    let ready = http::request(first.admin_port, "GET", "/readyz", &[], b"").await;
    assert_eq!(ready.status, 200);
    assert_eq!(
        ready.header("x-gorge-pid"),
        Some(second.id().to_string().as_str())
    );
    let receipt = first.post_ok("", r#"{"subscribers":[]}"#).await.json();
    assert_eq!(receipt["fingerprint"], started["fingerprint"]);
    first.drained().await;
}
