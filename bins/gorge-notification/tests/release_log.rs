//! A release-configured binary logs debug events at `GORGE_LOG_LEVEL=debug`.
//!
//! slog decides its compile-time level cap on `debug_assertions`, so a debug-build test
//! cannot see a release-only cap. This test builds the binary with the
//! `release-unoptimized` profile (the release profile without optimisation: the same
//! `cfg`, the same features) and runs it. Cost: the first run compiles the dependency tree
//! once more, unoptimised (about as long as a fresh `cargo build`, ~1–2 min on two cores);
//! later runs reuse it and take a few seconds.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use common::{Server, PATIENCE};
use gorge_testkit::http;

const PROFILE: &str = "release-unoptimized";

/// `target/` of this test binary (`target/debug/deps/release_log-…`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
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

    let server = Server::start_program(&bin, &[("GORGE_LOG_LEVEL", "debug")]);

    let admin = SocketAddr::from(([127, 0, 0, 1], server.admin_port));
    let body = br#"{"data":{"key":1},"subscribers":[]}"#;
    let request = http::request_bytes(admin, "POST", "/", &[], body);
    let response = http::raw_blocking(admin, &request);
    assert_eq!(response.status, 200, "{response:?}");

    let record = server
        .process
        .wait_for_event("NOTIFY_MESSAGE_ACCEPTED", PATIENCE)
        .expect("NOTIFY_MESSAGE_ACCEPTED logged");
    assert_eq!(record["level"], "debug");
}
