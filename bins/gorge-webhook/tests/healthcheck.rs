//! `gorge-webhook healthcheck` reads the configuration the service reads (defaults, then
//! `--config`, then the environment), refuses an invalid one with a message instead of
//! probing a default port, and says why a probe failed.

use std::io::Write;

use gorge_testkit::healthcheck::{
    assert_bad_arguments_are_refused, assert_failed_probes_say_why, assert_invalid_configuration,
};
use gorge_testkit::process::run_to_end;
use gorge_testkit::{Receiver, RefusedPort};

const BIN: &str = env!("CARGO_BIN_EXE_gorge-webhook");

fn toml_file(body: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    file.write_all(body.as_bytes()).unwrap();
    file
}

#[test]
fn the_listen_addr_of_the_config_file_is_probed() {
    let port = Receiver::start(200).port();
    let file = toml_file(&format!("listen_addr = \"127.0.0.1:{port}\"\n"));
    let path = file.path().to_str().unwrap();
    let output = run_to_end(BIN, &["healthcheck", "--config", path], &[]);
    assert_eq!(output.0, Some(0), "{}", output.2.clone());
    // Before the subcommand, too.
    let port = Receiver::start(200).port();
    // A wildcard address (probed on loopback) needs a token.
    let file = toml_file(&format!(
        "listen_addr = \"0.0.0.0:{port}\"\nservice_token = \"t\"\n"
    ));
    let path = file.path().to_str().unwrap();
    let output = run_to_end(BIN, &["--config", path, "healthcheck"], &[]);
    assert_eq!(output.0, Some(0), "{}", output.2.clone());
}

#[test]
fn the_environment_wins_over_the_file() {
    let port = Receiver::start(200).port();
    let refused = RefusedPort::new();
    let file = toml_file(&format!("listen_addr = \"127.0.0.1:{}\"\n", refused.port()));
    let addr = format!("127.0.0.1:{port}");
    let output = run_to_end(
        BIN,
        &["healthcheck", "--config", file.path().to_str().unwrap()],
        &[("GORGE_LISTEN_ADDR", &addr)],
    );
    assert_eq!(output.0, Some(0), "{}", output.2.clone());
}

#[test]
fn an_invalid_configuration_is_reported_not_replaced_by_the_default_port() {
    let file = toml_file("listen_addr = \"nowhere\"\n");
    let config = file.path().to_str().unwrap();
    let ran = run_to_end(BIN, &["healthcheck", "--config", config], &[]);
    assert_invalid_configuration(ran, "\"nowhere\"");
    let ran = run_to_end(
        BIN,
        &["healthcheck"],
        &[("GORGE_WEBHOOK_POLL_INTERVAL_MS", "soon")],
    );
    assert_invalid_configuration(ran, "GORGE_WEBHOOK_POLL_INTERVAL_MS");
}

#[test]
fn a_failed_probe_says_why() {
    assert_failed_probes_say_why(|port| {
        let addr = format!("127.0.0.1:{port}");
        let (code, _, stderr) = run_to_end(BIN, &["healthcheck"], &[("GORGE_LISTEN_ADDR", &addr)]);
        (code, stderr)
    });
}

#[test]
fn bad_arguments_are_refused_with_exit_1_not_probed() {
    assert_bad_arguments_are_refused(|args| run_to_end(BIN, args, &[]));
}
