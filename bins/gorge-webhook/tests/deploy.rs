//! The shipped systemd files against the binary: the unit's `TimeoutStopSec` is the
//! binary's own `stop_within_sec` for the shipped env file plus a margin (a unit that killed
//! a stop sooner would send rows twice: tests/stop_limit.rs), and the env file's
//! commented-out settings show the binary's defaults. `GORGE_BLESS_DOCS=1` rewrites the
//! unit's line.

mod common;

use common::run_binary;
use gorge_testkit::check_config::checked;
use gorge_testkit::deploy::{commented_settings, root, with_timeout_stop_sec, STOP_MARGIN_SEC};

const UNIT: &str = "deploy/systemd/gorge-webhook.service";
const ENV_FILE: &str = "deploy/systemd/gorge-webhook.env";

#[test]
fn the_unit_leaves_the_stop_its_bound_for_the_shipped_env_file() {
    let root = root(env!("CARGO_MANIFEST_DIR"));
    let env_file = root.join(ENV_FILE);
    let (code, stdout, stderr) = run_binary(
        &["--env-file", env_file.to_str().unwrap(), "--check-config"],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let stop: u64 = checked(&stdout, "stop_within_sec").0.parse().unwrap();
    let unit = std::fs::read_to_string(root.join(UNIT)).unwrap();
    gorge_service::docs::check_file(
        &root.join(UNIT),
        &with_timeout_stop_sec(&unit, stop + STOP_MARGIN_SEC),
    );
}

#[test]
fn the_env_files_commented_settings_are_the_defaults() {
    let env_file =
        std::fs::read_to_string(root(env!("CARGO_MANIFEST_DIR")).join(ENV_FILE)).unwrap();
    let (code, defaults, stderr) = run_binary(&["--check-config"], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let commented = commented_settings(&env_file);
    assert!(!commented.is_empty(), "{ENV_FILE} comments out no setting");
    for (var, value) in commented {
        // An empty secret is shown as such, never as its value.
        let default = checked(&defaults, &var).0.replace("(empty)", "");
        assert_eq!(
            default, value,
            "{ENV_FILE}: #{var}={value} is not the default"
        );
    }
}
