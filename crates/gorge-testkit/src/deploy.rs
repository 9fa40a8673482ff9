//! The shipped deploy files as each service's `tests/deploy.rs` checks them against its
//! binary: the systemd unit's `TimeoutStopSec` (the binary's `stop_within_sec` plus a
//! margin) and the env file's commented-out settings (the binary's defaults).

use std::path::{Path, PathBuf};

/// Seconds the systemd unit leaves a stopping service beyond its own `stop_within_sec`: the
/// same slack as the chart's default grace period (SIGKILL delivery, a slow host).
pub const STOP_MARGIN_SEC: u64 = 10;

/// The repository's root, from a crate's `CARGO_MANIFEST_DIR` (`bins/<name>`).
pub fn root(manifest_dir: &str) -> PathBuf {
    Path::new(manifest_dir).join("../..")
}

/// `unit` with its `TimeoutStopSec=` line set to `seconds` (what the unit must say; a test
/// compares or blesses it with `gorge_service::docs::check_file`). Panics when the unit has
/// no such line.
pub fn with_timeout_stop_sec(unit: &str, seconds: u64) -> String {
    let mut found = false;
    let lines: Vec<String> = unit
        .split_inclusive('\n')
        .map(|line| match line.starts_with("TimeoutStopSec=") {
            true => {
                found = true;
                format!("TimeoutStopSec={seconds}s\n")
            }
            false => line.to_string(),
        })
        .collect();
    assert!(found, "the unit has no TimeoutStopSec= line");
    lines.concat()
}

/// The env file's commented-out settings, `#NAME=value` (an operator uncomments one to
/// change it, so each shows the default).
pub fn commented_settings(env_file: &str) -> Vec<(String, String)> {
    env_file
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .filter_map(|rest| rest.split_once('='))
        .filter(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_line_is_replaced_and_commented_settings_are_found() {
        let unit = "[Service]\n# TimeoutStopSec= below\nTimeoutStopSec=40s\nKillMode=mixed\n";
        assert_eq!(
            with_timeout_stop_sec(unit, 65),
            "[Service]\n# TimeoutStopSec= below\nTimeoutStopSec=65s\nKillMode=mixed\n"
        );
        let env = "# a comment: X=1\n#GORGE_X_DRAIN_SECONDS=10\nGORGE_LOG_LEVEL=info\n#  x=y\n";
        assert_eq!(
            commented_settings(env),
            [("GORGE_X_DRAIN_SECONDS".to_string(), "10".to_string())]
        );
    }
}
