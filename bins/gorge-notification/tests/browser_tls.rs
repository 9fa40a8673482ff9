//! A real browser over `wss://`: headless Chromium opens a page (written here, not Phorge's)
//! whose script speaks exactly what `JX.Aphlict` writes on its socket — on open
//! `{"command":"subscribe","data":[…]}`, as keep-alive `{"command":"ping","data":null}` —
//! to a client port serving the test chain's leaf (the intermediate sent after it). Only
//! that leaf is trusted, for this browser only (`--ignore-certificate-errors-spki-list` with a
//! fresh profile). The page reports what it sees to a recording receiver; a message posted to
//! the admin port must reach it.

mod common;

use std::process::{Command, Stdio};

use common::tls::Chain;
use common::{InProcess, PATIENCE};
use gorge_notification::config::{ServerKind, TlsSettings};
use gorge_testkit::Receiver;

const PHID: &str = "PHID-USER-browserbrowserbrowse";

/// base64(sha256(SubjectPublicKeyInfo)) of a PEM certificate, as Chromium's
/// `--ignore-certificate-errors-spki-list` takes it.
fn spki_hash(cert: &std::path::Path) -> String {
    let script = format!(
        "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der \
         | openssl dgst -sha256 -binary | base64",
        cert.display()
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The page: JX.Aphlict's frames on a `wss://` socket, and reports to the receiver.
fn page(client_port: u16, report_port: u16) -> String {
    format!(
        r#"<!doctype html><meta charset="utf-8"><title>gorge wss test</title><script>
function report(what, body) {{
  fetch("http://127.0.0.1:{report_port}/" + what, {{method: "POST", mode: "no-cors", body: body}});
}}
// JX.Aphlict._writeCommand: JSON.stringify({{command: command, data: message}}).
function command(socket, name, data) {{
  socket.send(JSON.stringify({{command: name, data: data}}));
}}
var socket = new WebSocket("wss://localhost:{client_port}/~acme/");
socket.onopen = function () {{
  command(socket, "subscribe", ["{PHID}"]);
  command(socket, "ping", null);
}};
socket.onmessage = function (event) {{
  var message = JSON.parse(event.data);
  // JX.Aphlict drops the pong; here it says the subscription took effect.
  report(message.type == "pong" ? "subscribed" : "message", event.data);
}};
socket.onerror = function () {{ report("error", ""); }};
socket.onclose = function (event) {{ report("closed", String(event.code)); }};
</script>"#
    )
}

/// Chromium, killed on drop.
struct Browser(std::process::Child);

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn headless_chromium_receives_its_message_over_wss() {
    gorge_testkit::prerequisites::require("chromium");
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let (leaf, key, inter) = (
        chain.path("leaf.pem"),
        chain.path("key.pem"),
        chain.path("chain.pem"),
    );
    let server = InProcess::start(|config| {
        for (i, server) in config.servers.iter_mut().enumerate() {
            if server.kind == ServerKind::Client {
                let named = |p: &std::path::Path, what: &str| {
                    (p.to_path_buf(), format!("servers[{i}].{what}"))
                };
                server.tls = TlsSettings {
                    cert: Some(named(&leaf, "ssl.cert")),
                    key: Some(named(&key, "ssl.key")),
                    chain: Some(named(&inter, "ssl.chain")),
                };
            }
        }
    })
    .await;
    let reports = Receiver::start(200);
    let html = dir.path().join("page.html");
    std::fs::write(&html, page(server.client_port, reports.port())).unwrap();
    let profile = dir.path().join("profile");
    let _browser = Browser(
        Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                &format!("--user-data-dir={}", profile.display()),
                &format!("--ignore-certificate-errors-spki-list={}", spki_hash(&leaf)),
                &format!("file://{}", html.display()),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // A browser's start takes seconds on a loaded machine.
    let wait = |n: usize| {
        let reports = reports.clone();
        tokio::task::spawn_blocking(move || reports.wait_for(n, PATIENCE * 4))
    };
    let first = wait(1).await.unwrap();
    assert_eq!(
        first[0].path,
        "/subscribed",
        "{:?}",
        String::from_utf8_lossy(&first[0].body)
    );
    assert_eq!(first[0].body, br#"{"type":"pong"}"#);
    let body = format!(r#"{{"key":"42","type":"notification","subscribers":["{PHID}"]}}"#);
    server.post_ok("?instance=acme", &body).await;
    let all = wait(2).await.unwrap();
    assert_eq!(
        all[1].path,
        "/message",
        "{:?}",
        String::from_utf8_lossy(&all[1].body)
    );
    let frame: serde_json::Value = serde_json::from_slice(&all[1].body).unwrap();
    assert_eq!(frame["key"], "42", "{frame}");
    assert_eq!(frame["subscribers"][0], PHID, "{frame}");
}
