//! `gorge-notification healthcheck` probes the admin (health) server of the configuration the
//! service reads (defaults, then the Aphlict `--config` file, then the environment), refuses
//! an invalid configuration with a message instead of probing the default port, and says why
//! a probe failed.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_gorge-notification");

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command.env_clear().args(args).envs(env.iter().copied());
    command.output().unwrap()
}

/// A one-shot HTTP server on an ephemeral loopback port answering `status_line` to the first
/// request; returns its port.
fn stub(status_line: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(stream, "{status_line}\r\nContent-Length: 0\r\n\r\n");
        }
    });
    port
}

fn dead_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An Aphlict-format file with the admin server on `admin_port`.
fn aphlict_file(admin_port: u16) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    write!(
        file,
        r#"{{"servers":[{{"type":"client","port":{},"listen":"127.0.0.1"}},{{"type":"admin","port":{admin_port},"listen":"127.0.0.1"}}]}}"#,
        dead_port()
    )
    .unwrap();
    file
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_admin_port_of_the_config_file_is_probed() {
    let port = stub("HTTP/1.1 200 OK");
    let file = aphlict_file(port);
    let output = run(
        &["healthcheck", "--config", file.path().to_str().unwrap()],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let port = stub("HTTP/1.1 200 OK");
    let file = aphlict_file(port);
    let output = run(
        &["--config", file.path().to_str().unwrap(), "healthcheck"],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn the_environment_wins_over_the_file() {
    let port = stub("HTTP/1.1 200 OK");
    let file = aphlict_file(dead_port());
    let output = run(
        &["healthcheck", "--config", file.path().to_str().unwrap()],
        &[("GORGE_NOTIFICATION_ADMIN_PORT", &port.to_string())],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn an_invalid_configuration_is_reported_not_replaced_by_the_default_port() {
    let output = run(
        &["healthcheck"],
        &[("GORGE_NOTIFICATION_ADMIN_PORT", "70000")],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with("healthcheck: invalid configuration: GORGE_NOTIFICATION_ADMIN_PORT"),
        "{text}"
    );
    let mut file = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    file.write_all(br#"{"servers":[{"type":"client","port":1}]}"#)
        .unwrap();
    let output = run(
        &["healthcheck", "--config", file.path().to_str().unwrap()],
        &[],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.starts_with("healthcheck: invalid configuration"),
        "{text}"
    );
}

#[test]
fn a_failed_probe_says_why() {
    let port = dead_port();
    let output = run(
        &[
            "healthcheck",
            "--config",
            aphlict_file(port).path().to_str().unwrap(),
        ],
        &[],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with(&format!(
            "healthcheck: http://127.0.0.1:{port}/healthz: cannot connect"
        )),
        "{text}"
    );

    let port = stub("HTTP/1.1 503 Service Unavailable");
    let output = run(
        &[
            "healthcheck",
            "--config",
            aphlict_file(port).path().to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr(&output).trim_end(),
        format!("healthcheck: http://127.0.0.1:{port}/healthz: GET /healthz answered \"HTTP/1.1 503 Service Unavailable\"")
    );
}
