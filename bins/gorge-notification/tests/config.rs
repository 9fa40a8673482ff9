//! Startup configuration as an operator meets it: exit code 2 with one line naming the key
//! and value for every invalid setting, empty variables meaning "default", the Aphlict file,
//! `--check-config`, `--version` and the `healthcheck` subcommand.

mod common;

use std::io::Write;
use std::process::{Command, Output};

use common::{Server, BIN};

/// One environment variable.
type Var<'a> = (&'a str, &'a str);

fn run(args: &[&str], env: &[Var]) -> Output {
    let mut command = Command::new(BIN);
    command.env_clear().args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

fn config_file(json: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(json.as_bytes()).unwrap();
    file
}

/// Exit code 2 and exactly one stderr line mentioning `key` and `value`.
fn assert_config_error(output: &Output, key: &str, value: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(key), "{key} not in {stderr}");
    assert!(stderr.contains(value), "{value} not in {stderr}");
}

#[test]
fn ssl_in_the_aphlict_file_is_refused() {
    let file = config_file(
        r#"{"servers":[{"type":"client","port":22280,"listen":"0.0.0.0","ssl.key":"/etc/ssl/k.pem","ssl.cert":"/etc/ssl/c.pem"},{"type":"admin","port":22281}]}"#,
    );
    let output = run(&["--config", file.path().to_str().unwrap()], &[]);
    assert_config_error(&output, "servers[0].ssl.key", "/etc/ssl/k.pem");
    assert!(String::from_utf8_lossy(&output.stderr).contains("terminate TLS"));
}

#[test]
fn ports_out_of_range_are_refused() {
    let output = run(&[], &[("GORGE_NOTIFICATION_CLIENT_PORT", "70000")]);
    assert_config_error(&output, "GORGE_NOTIFICATION_CLIENT_PORT", "70000");
    let output = run(&[], &[("GORGE_NOTIFICATION_ADMIN_PORT", "0")]);
    assert_config_error(&output, "GORGE_NOTIFICATION_ADMIN_PORT", "0");
    let file = config_file(
        r#"{"servers":[{"type":"client","port":70000},{"type":"admin","port":22281}]}"#,
    );
    let output = run(&["--config", file.path().to_str().unwrap()], &[]);
    assert_config_error(&output, "servers[0].port", "70000");
}

#[test]
fn other_invalid_values_are_refused() {
    // One variable each; the error must name the variable and its value.
    let cases: &[Var] = &[
        ("GORGE_NOTIFICATION_PEERS", "ftp://peer:22281"),
        ("GORGE_NOTIFICATION_PEER_DNS", "headless"),
        ("GORGE_NOTIFICATION_LISTEN_ADDR", "somewhere"),
        ("GORGE_NOTIFICATION_DRAIN_SECONDS", "soon"),
        ("GORGE_NOTIFICATION_QUEUE_FRAMES", "0"),
        ("GORGE_LOG_LEVEL", "loud"),
    ];
    for &(key, value) in cases {
        assert_config_error(&run(&[], &[(key, value)]), key, value);
    }
    let file = config_file(r#"{"servers":[{"type":"client","port":1}]}"#);
    assert_config_error(
        &run(&["--config", file.path().to_str().unwrap()], &[]),
        "servers",
        "admin",
    );
    let output = run(&["--config", "/nonexistent/aphlict.json"], &[]);
    assert_config_error(&output, "--config", "/nonexistent/aphlict.json");
}

#[test]
fn empty_variables_mean_default_and_check_config_prints_the_result() {
    let output = run(
        &["--check-config"],
        &[
            ("GORGE_NOTIFICATION_CLIENT_PORT", ""),
            ("GORGE_NOTIFICATION_ADMIN_PORT", ""),
            ("GORGE_NOTIFICATION_PEERS", ""),
            ("GORGE_NOTIFICATION_DRAIN_SECONDS", ""),
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(printed["servers"][0]["port"], 22280);
    assert_eq!(printed["servers"][1]["port"], 22281);
    assert_eq!(printed["drain_seconds"], 10);
    assert_eq!(printed["max_frame_bytes"], 65536);
    assert_eq!(printed["peers"], serde_json::json!([]));
}

#[test]
fn the_aphlict_file_is_layered_under_the_environment() {
    let file = config_file(
        r#"{"servers":[{"type":"client","port":3000,"listen":"127.0.0.1","ssl.key":null,"ssl.cert":null,"ssl.chain":null},{"type":"admin","port":3001,"listen":"127.0.0.1"}],
            "logs":[{"path":"/var/log/aphlict.log"}],"pidfile":"/run/aphlict.pid","memory.hint":256,
            "cluster":[{"host":"peer-a","port":22281,"protocol":"http"}]}"#,
    );
    let path = file.path().to_str().unwrap();
    let output = run(
        &["--check-config"],
        &[
            ("GORGE_NOTIFICATION_CONFIG_FILE", path),
            ("GORGE_NOTIFICATION_ADMIN_PORT", "4001"),
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(printed["servers"][0]["port"], 3000);
    assert_eq!(printed["servers"][1]["port"], 4001);
    assert_eq!(printed["peers"], serde_json::json!(["http://peer-a:22281"]));
    assert_eq!(
        printed["ignored_file_keys"],
        serde_json::json!(["logs", "pidfile", "memory.hint"])
    );

    // Started with that file, each ignored key is one warning.
    let server = Server::start(&[
        ("GORGE_NOTIFICATION_CONFIG_FILE", path),
        ("GORGE_NOTIFICATION_PEERS", ""),
    ]);
    let warnings = server.log_events("NOTIFY_CONFIG_IGNORED_KEY");
    let keys: Vec<&str> = warnings
        .iter()
        .map(|w| w["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["logs", "pidfile", "memory.hint"]);
}

#[test]
fn help_and_version() {
    let output = run(&["--version"], &[]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        concat!("gorge-notification ", env!("CARGO_PKG_VERSION"))
    );
    let output = run(&["--help"], &[]);
    assert_eq!(output.status.code(), Some(0));
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        help.contains("--check-config") && help.contains("healthcheck"),
        "{help}"
    );
}

#[test]
fn a_port_already_in_use_fails_startup_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let output = run(
        &[],
        &[
            ("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1"),
            ("GORGE_NOTIFICATION_ADMIN_PORT", &port),
            ("GORGE_NOTIFICATION_CLIENT_PORT", &port),
        ],
    );
    // Same port for both kinds is a duplicate address: refused as configuration.
    assert_config_error(&output, "servers[1]", &format!("127.0.0.1:{port}"));
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let output = run(
        &[],
        &[
            ("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1"),
            ("GORGE_NOTIFICATION_CLIENT_PORT", &free),
            ("GORGE_NOTIFICATION_ADMIN_PORT", &port),
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains(&format!("127.0.0.1:{port}")));
}

#[test]
fn healthcheck_subcommand() {
    let server = Server::start(&[]);
    let port = server.admin_port.to_string();
    assert_eq!(
        run(&["healthcheck", "--port", &port], &[]).status.code(),
        Some(0)
    );
    drop(server);
    assert_eq!(
        run(&["healthcheck", "--port", &port], &[]).status.code(),
        Some(1)
    );
}

#[test]
fn peer_settings_from_the_environment() {
    let output = run(
        &["--check-config"],
        &[
            (
                "GORGE_NOTIFICATION_PEERS",
                "http://peer-a:22281, https://10.0.0.2:22281/",
            ),
            (
                "GORGE_NOTIFICATION_PEER_DNS",
                "gorge-notification-peers:22281",
            ),
            ("GORGE_NOTIFICATION_LISTEN_ADDR", "::"),
            // Kubernetes service links inject variables like these; they must not matter.
            ("GORGE_NOTIFICATION_ADMIN_SERVICE_HOST", "10.96.0.10"),
            ("GORGE_NOTIFICATION_PEERS_PORT", "tcp://10.96.0.11:22281"),
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        printed["peers"],
        serde_json::json!(["http://peer-a:22281", "https://10.0.0.2:22281"])
    );
    assert_eq!(printed["peer_dns"], "gorge-notification-peers:22281");
    assert_eq!(printed["servers"][0]["listen"], "::");
}
