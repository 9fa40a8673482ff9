//! A release-configured binary logs debug events at `GORGE_LOG_LEVEL=debug`.
//!
//! slog decides its compile-time level cap on `debug_assertions`, so a debug-build test
//! cannot see a release-only cap. This test builds the binary with the
//! `release-unoptimized` profile (the release profile without optimisation: the same
//! `cfg`, the same features) and runs it. Cost: the first run compiles the dependency tree
//! once more, unoptimised (about as long as a fresh `cargo build`, ~1–2 min on two cores);
//! later runs reuse it and take a few seconds.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const PROFILE: &str = "release-unoptimized";

/// `target/` of this test binary (`target/debug/deps/release_log-…`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_release_build_logs_debug_events_at_debug_level() {
    let target = target_dir();
    let status = Command::new(env!("CARGO"))
        .args(["build", "--locked", "--quiet", "--profile", PROFILE])
        .args(["-p", "gorge-notification", "--bin", "gorge-notification"])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build --profile {PROFILE} failed");
    let bin = target.join(PROFILE).join("gorge-notification");

    let (client, admin) = (free_port(), free_port());
    let mut child = Command::new(&bin)
        .env_clear()
        .env("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1")
        .env("GORGE_NOTIFICATION_CLIENT_PORT", client.to_string())
        .env("GORGE_NOTIFICATION_ADMIN_PORT", admin.to_string())
        .env("GORGE_LOG_LEVEL", "debug")
        .env("GORGE_LOG_FORMAT", "json")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let wait_for = |event: &str| -> serde_json::Value {
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("no {event} logged"));
            let record: serde_json::Value = serde_json::from_str(&line).unwrap();
            if record["event"] == event {
                return record;
            }
        }
    };
    wait_for("NOTIFY_STARTED");

    let body = r#"{"data":{"key":1},"subscribers":[]}"#;
    let mut stream = TcpStream::connect(("127.0.0.1", admin)).unwrap();
    write!(
        stream,
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    let record = wait_for("NOTIFY_MESSAGE_ACCEPTED");
    assert_eq!(record["level"], "debug");
    let _ = child.kill();
    let _ = child.wait();
}
