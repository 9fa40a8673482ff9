//! The check of a service's alerting rules and dashboard against its real `/metrics`: a test
//! starts the binary, scrapes it twice and hands both scrapes here; `scripts/check-monitoring.py`
//! (promtool check metrics / check rules / test rules, every metric a rule or panel names)
//! does the rest. Nothing is skipped: a missing python3, PyYAML or promtool fails the test.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `GET /metrics` on `addr` as curl or promtool asks for it (no `Accept`): the Prometheus
/// text format, which it asserts.
pub fn scrape(addr: SocketAddr) -> String {
    let response = crate::http::get_blocking(addr, "/metrics", &[]);
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    response.text()
}

/// The repository root (this crate is `crates/gorge-testkit`).
fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the monitoring check of `service` (`gorge-notification`, `gorge-webhook`) on two
/// scrapes of its `/metrics` in the Prometheus text format, `before` and `after` (counters
/// in the alert scenarios go on at the rate seen between them); panics with the check's
/// output unless it passed.
pub fn check(service: &str, before: &str, after: &str) {
    crate::prerequisites::require("promtool");
    crate::prerequisites::require("PyYAML");
    let dir =
        std::env::temp_dir().join(format!("gorge-monitoring-{service}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (before_path, after_path) = (dir.join("before.prom"), dir.join("after.prom"));
    std::fs::write(&before_path, before).unwrap();
    std::fs::write(&after_path, after).unwrap();
    let script = repository().join("scripts/check-monitoring.py");
    let output = Command::new("python3")
        .arg(&script)
        .args([
            service.as_ref(),
            before_path.as_os_str(),
            after_path.as_os_str(),
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 {}: {e}", script.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.status.success(), "{text}");
    println!("{text}");
}
