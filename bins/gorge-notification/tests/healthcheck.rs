//! `gorge-notification healthcheck` probes the admin (health) server of the configuration the
//! service reads (defaults, then the Aphlict `--config` file, then the environment), refuses
//! an invalid configuration with a message instead of probing the default port, and says why
//! a probe failed.

use std::io::Write;

use gorge_testkit::healthcheck::{
    assert_bad_arguments_are_refused, assert_failed_probes_say_why, assert_invalid_configuration,
};
use gorge_testkit::process::run_to_end;
use gorge_testkit::{free_port, Receiver, RefusedPort};

const BIN: &str = env!("CARGO_BIN_EXE_gorge-notification");

/// An Aphlict-format file with the admin server on `admin_port`.
fn aphlict_file(admin_port: u16) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    write!(
        file,
        r#"{{"servers":[{{"type":"client","port":{},"listen":"127.0.0.1"}},{{"type":"admin","port":{admin_port},"listen":"127.0.0.1"}}]}}"#,
        free_port()
    )
    .unwrap();
    file
}

#[test]
fn the_admin_port_of_the_config_file_is_probed() {
    let port = Receiver::start(200).port();
    let file = aphlict_file(port);
    let output = run_to_end(
        BIN,
        &["healthcheck", "--config", file.path().to_str().unwrap()],
        &[],
    );
    assert_eq!(output.0, Some(0), "{}", output.2.clone());
    let port = Receiver::start(200).port();
    let file = aphlict_file(port);
    let output = run_to_end(
        BIN,
        &["--config", file.path().to_str().unwrap(), "healthcheck"],
        &[],
    );
    assert_eq!(output.0, Some(0), "{}", output.2.clone());
}

#[test]
fn the_environment_wins_over_the_file() {
    let port = Receiver::start(200).port();
    let refused = RefusedPort::new();
    let file = aphlict_file(refused.port());
    let output = run_to_end(
        BIN,
        &["healthcheck", "--config", file.path().to_str().unwrap()],
        &[("GORGE_NOTIFICATION_ADMIN_PORT", &port.to_string())],
    );
    assert_eq!(output.0, Some(0), "{}", output.2.clone());
}

#[test]
fn an_invalid_configuration_is_reported_not_replaced_by_the_default_port() {
    let ran = run_to_end(
        BIN,
        &["healthcheck"],
        &[("GORGE_NOTIFICATION_ADMIN_PORT", "70000")],
    );
    assert_invalid_configuration(ran, ": GORGE_NOTIFICATION_ADMIN_PORT");
    let mut file = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    file.write_all(br#"{"servers":[{"type":"client","port":1}]}"#)
        .unwrap();
    let config = file.path().to_str().unwrap();
    let ran = run_to_end(BIN, &["healthcheck", "--config", config], &[]);
    assert_invalid_configuration(ran, "admin");
}

#[test]
fn a_failed_probe_says_why() {
    assert_failed_probes_say_why(|port| {
        let file = aphlict_file(port);
        let (code, _, stderr) = run_to_end(
            BIN,
            &["healthcheck", "--config", file.path().to_str().unwrap()],
            &[],
        );
        (code, stderr)
    });
}

#[test]
fn bad_arguments_are_refused_with_exit_1_not_probed() {
    assert_bad_arguments_are_refused(|args| run_to_end(BIN, args, &[]));
}
