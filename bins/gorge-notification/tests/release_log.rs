//! A release build logs debug events at `GORGE_LOG_LEVEL=debug`.
//!
//! slog decides its compile-time level cap on `debug_assertions`: without them (release) it
//! drops every record above its `release_max_level_*` feature, whatever the runtime level.
//! Two halves, neither building anything (a nested `cargo build` of another profile took
//! minutes and could deadlock on cargo's build lock):
//!
//! - slog is resolved with `release_max_level_trace` (read from `cargo tree`), so a
//!   release build keeps the same records a debug build does;
//! - the binary cargo built for these tests logs a debug event at debug level (under
//!   `cargo test --release` that binary is the release build itself).

mod common;

use std::net::SocketAddr;
use std::process::Command;

use common::{Server, PATIENCE};
use gorge_testkit::http;

/// The features Cargo resolved for `package` in this binary's build (`cargo tree`, which
/// looks at this host's platform only, so it needs nothing that is not already downloaded).
fn resolved_features(package: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            env!("CARGO_PKG_NAME"),
        ])
        .args(["-e", "features", "-i", package, "--prefix", "none"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let prefix = format!("{package} feature \"");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix)?.split('"').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn release_builds_keep_debug_records() {
    let features = resolved_features("slog");
    for needed in ["max_level_trace", "release_max_level_trace"] {
        assert!(
            features.iter().any(|f| f == needed),
            "slog is built without {needed}: {features:?}"
        );
    }
}

#[test]
fn the_binary_logs_debug_events_at_debug_level() {
    let server = Server::start(&[("GORGE_LOG_LEVEL", "debug")]);

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
