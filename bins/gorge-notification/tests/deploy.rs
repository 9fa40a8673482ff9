//! The shipped systemd files against the binary: the unit's `TimeoutStopSec` is the
//! binary's own `stop_within_sec` for the shipped Aphlict file and env file plus a margin,
//! and the env file's commented-out settings show the binary's defaults.
//! `GORGE_BLESS_DOCS=1` rewrites the unit's line.

use gorge_testkit::check_config::checked;
use gorge_testkit::deploy::{commented_settings, root, with_timeout_stop_sec, STOP_MARGIN_SEC};
use gorge_testkit::process::run_to_end;

const BIN: &str = env!("CARGO_BIN_EXE_gorge-notification");
const UNIT: &str = "deploy/systemd/gorge-notification.service";
const ENV_FILE: &str = "deploy/systemd/gorge-notification.env";
const APHLICT_FILE: &str = "deploy/systemd/aphlict.json";

#[test]
fn the_unit_leaves_the_stop_its_bound_for_the_shipped_files() {
    let root = root(env!("CARGO_MANIFEST_DIR"));
    let (env_file, aphlict) = (root.join(ENV_FILE), root.join(APHLICT_FILE));
    let (code, stdout, stderr) = run_to_end(
        BIN,
        &[
            "--config",
            aphlict.to_str().unwrap(),
            "--env-file",
            env_file.to_str().unwrap(),
            "--check-config",
        ],
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
    let (code, defaults, stderr) = run_to_end(BIN, &["--check-config"], &[]);
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

/// `systemctl reload` sends SIGHUP, which re-reads the TLS files at once (tests/tls.rs), as a
/// certbot deploy hook needs.
#[test]
fn the_unit_reloads_with_sighup() {
    let unit = std::fs::read_to_string(root(env!("CARGO_MANIFEST_DIR")).join(UNIT)).unwrap();
    assert!(
        unit.lines()
            .any(|l| l == "ExecReload=/bin/kill -HUP $MAINPID"),
        "{UNIT} has no ExecReload sending SIGHUP"
    );
}
