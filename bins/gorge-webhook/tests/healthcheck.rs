//! `gorge-webhook healthcheck` reads the configuration the service reads (defaults, then
//! `--config`, then the environment), refuses an invalid one with a message instead of
//! probing a default port, and says why a probe failed.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_gorge-webhook");

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

/// A loopback port nothing listens on.
fn dead_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn toml_file(body: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    file.write_all(body.as_bytes()).unwrap();
    file
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_listen_addr_of_the_config_file_is_probed() {
    let port = stub("HTTP/1.1 200 OK");
    let file = toml_file(&format!("listen_addr = \"127.0.0.1:{port}\"\n"));
    let path = file.path().to_str().unwrap();
    let output = run(&["healthcheck", "--config", path], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // Before the subcommand, too.
    let port = stub("HTTP/1.1 200 OK");
    let file = toml_file(&format!("listen_addr = \"0.0.0.0:{port}\"\n"));
    let path = file.path().to_str().unwrap();
    let output = run(&["--config", path, "healthcheck"], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn the_environment_wins_over_the_file() {
    let port = stub("HTTP/1.1 200 OK");
    let file = toml_file(&format!("listen_addr = \"127.0.0.1:{}\"\n", dead_port()));
    let addr = format!("127.0.0.1:{port}");
    let output = run(
        &["healthcheck", "--config", file.path().to_str().unwrap()],
        &[("GORGE_LISTEN_ADDR", &addr)],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn an_invalid_configuration_is_reported_not_replaced_by_the_default_port() {
    let file = toml_file("listen_addr = \"nowhere\"\n");
    let output = run(
        &["healthcheck", "--config", file.path().to_str().unwrap()],
        &[],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with("healthcheck: invalid configuration: ") && text.contains("\"nowhere\""),
        "{text}"
    );
    let output = run(
        &["healthcheck"],
        &[("GORGE_WEBHOOK_POLL_INTERVAL_MS", "soon")],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("GORGE_WEBHOOK_POLL_INTERVAL_MS"), "{text}");
}

#[test]
fn a_failed_probe_says_why() {
    let port = dead_port();
    let addr = format!("127.0.0.1:{port}");
    let output = run(&["healthcheck"], &[("GORGE_LISTEN_ADDR", &addr)]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with(&format!(
            "healthcheck: http://{addr}/healthz: cannot connect"
        )),
        "{text}"
    );

    let port = stub("HTTP/1.1 503 Service Unavailable");
    let addr = format!("127.0.0.1:{port}");
    let output = run(&["healthcheck"], &[("GORGE_LISTEN_ADDR", &addr)]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert_eq!(
        text.trim_end(),
        format!("healthcheck: http://{addr}/healthz: GET /healthz answered \"HTTP/1.1 503 Service Unavailable\"")
    );
}
