//! TLS on the client and admin ports (Aphlict's `ssl.key`, `ssl.cert`, `ssl.chain`, and the
//! `*_TLS_*_FILE` settings): `wss://` and `https://` verified against a test root alone,
//! plaintext refused on a TLS port, renewal while a socket stays subscribed, a broken renewal
//! that changes nothing, and startup refusing a key that does not match.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::tls::{self, Chain, Wss};
use common::{InProcess, Server, PATIENCE};
use gorge_notification::config::{Config, ServerKind, TlsSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PHID: &str = "PHID-USER-aaaaaaaaaaaaaaaaaaaa";

/// The binary under `timeout 30`: a run expected to end (refused at startup, a subcommand)
/// that serves instead is killed (exit 124) rather than hanging the test.
fn bounded() -> std::process::Command {
    let mut command = std::process::Command::new("timeout");
    command.args(["30", common::BIN]);
    command
}

/// TLS from `cert`, `key` and `chain` on every server of `kind`, named as a file would.
fn serve_tls(config: &mut Config, kind: ServerKind, cert: &Path, key: &Path, chain: Option<&Path>) {
    for (i, server) in config.servers.iter_mut().enumerate() {
        if server.kind == kind {
            let named =
                |path: &Path, what: &str| (path.to_path_buf(), format!("servers[{i}].{what}"));
            server.tls = TlsSettings {
                cert: Some(named(cert, "ssl.cert")),
                key: Some(named(key, "ssl.key")),
                chain: chain.map(|c| named(c, "ssl.chain")),
            };
        }
    }
}

/// A server with the chain's leaf on both ports (the intermediate sent after it), re-reading
/// its files every `recheck`.
async fn tls_server(chain: &Chain, recheck: Duration) -> InProcess {
    let (leaf, key, inter) = (
        chain.path("leaf.pem"),
        chain.path("key.pem"),
        chain.path("chain.pem"),
    );
    InProcess::start_tuned(
        |config| {
            for kind in [ServerKind::Client, ServerKind::Admin] {
                serve_tls(config, kind, &leaf, &key, Some(&inter));
            }
        },
        |server| server.with_tls_recheck(recheck),
    )
    .await
}

/// `GET /metrics` over https, one sample's value.
async fn metric(server: &InProcess, root: &str, sample: &str) -> Option<f64> {
    let (status, body) = tls::https(server.admin_port, root, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    gorge_testkit::sample(&body, sample)
}

async fn wait_metric(server: &InProcess, root: &str, sample: &str, value: f64) {
    gorge_testkit::eventually(PATIENCE, sample, || async {
        metric(server, root, sample).await == Some(value)
    })
    .await;
}

const BODY: &str =
    r#"{"key":"7","type":"notification","subscribers":["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]}"#;

/// A `wss://` handshake that trusts only the root verifies (the intermediate is sent after the
/// leaf, as Aphlict appends `ssl.chain`), and a POST made over https reaches that socket with
/// exactly the frame a plaintext server sends for the same POST.
#[tokio::test]
async fn wss_verifies_against_the_root_alone_and_an_https_post_arrives_as_over_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let root = chain.root_pem();
    let server = tls_server(&chain, tls_recheck_never()).await;
    let mut wss = Wss::connect_tls(server.client_port, "/~acme/", &root).await;
    wss.subscribe(&[PHID]).await;
    let (status, answer) =
        tls::https(server.admin_port, &root, "POST", "/?instance=acme", BODY).await;
    assert_eq!(status, 200, "{answer}");
    let over_tls = wss.next_text().await;

    let plain = InProcess::start(|_| {}).await;
    let mut ws = plain.ws("/~acme/").await;
    ws.subscribe(&[PHID]).await;
    plain.post_ok("?instance=acme", BODY).await;
    // Each server stamps its own fingerprint into `touched`; the rest must be the same bytes.
    assert_eq!(
        over_tls.replace(&server.fingerprint, "FINGERPRINT"),
        ws.next_text()
            .await
            .replace(&plain.fingerprint, "FINGERPRINT")
    );
    assert!(over_tls.contains(r#""key":"7""#), "{over_tls}");

    // Without the chain the root alone does not verify the leaf: the chain is what is sent.
    let bare = InProcess::start(|config| {
        serve_tls(
            config,
            ServerKind::Client,
            &chain.path("leaf.pem"),
            &chain.path("key.pem"),
            None,
        )
    })
    .await;
    let refused = tls::connect(bare.client_port, &root).await;
    assert!(refused.is_err(), "a leaf without its intermediate verified");
}

/// A `/status/` over https answers as over plaintext (the same keys).
#[tokio::test]
async fn status_answers_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let server = tls_server(&chain, tls_recheck_never()).await;
    let (status, body) =
        tls::https(server.admin_port, &chain.root_pem(), "GET", "/status/", "").await;
    assert_eq!(status, 200);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["clients.active"], 0, "{status}");
}

/// Plaintext on a TLS port, an HTTP request or a WebSocket upgrade, is closed without a
/// byte of answer (never 101 or 200), and counted per port.
#[tokio::test]
async fn plaintext_on_a_tls_port_is_closed_unanswered_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let root = chain.root_pem();
    let server = tls_server(&chain, tls_recheck_never()).await;
    let upgrade = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                   Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    let status = "GET /status/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    for (port, request) in [(server.client_port, upgrade), (server.admin_port, status)] {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer))
            .await
            .expect("closed in time");
        assert!(
            answer.is_empty(),
            "answered on {port}: {:?} ({read:?})",
            String::from_utf8_lossy(&answer)
        );
    }
    for port in ["client", "admin"] {
        let sample = format!("gorge_notification_tls_plaintext_refused_total{{port=\"{port}\"}}");
        wait_metric(&server, &root, &sample, 1.0).await;
    }
}

/// How long a test that is not about renewal waits between checks of the files: never.
fn tls_recheck_never() -> Duration {
    Duration::from_secs(3600)
}

/// Writes `content` to `path` as certbot replaces a file: a new file renamed over it.
fn replace_by_rename(path: &Path, content: &str) {
    let new = path.with_extension("new");
    std::fs::write(&new, content).unwrap();
    std::fs::rename(&new, path).unwrap();
}

/// Renewal by rename (certbot): new handshakes get the new leaf, while a socket opened before
/// stays subscribed and keeps receiving.
#[tokio::test]
async fn a_renewal_by_rename_is_served_while_an_open_socket_keeps_receiving() {
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let root = chain.root_pem();
    let server = tls_server(&chain, Duration::from_millis(50)).await;
    let mut wss = Wss::connect_tls(server.client_port, "/", &root).await;
    wss.subscribe(&[PHID]).await;
    let before = tls::served_leaf(&tls::connect(server.client_port, &root).await.unwrap());

    let (leaf, key) = chain.intermediate.leaf();
    replace_by_rename(&chain.path("key.pem"), &key);
    replace_by_rename(&chain.path("leaf.pem"), &leaf);
    let taken = r#"gorge_notification_tls_reloads_total{port="client",result="taken"}"#;
    wait_metric(&server, &root, taken, 1.0).await;

    let after = tls::served_leaf(&tls::connect(server.client_port, &root).await.unwrap());
    assert_ne!(after, before);
    assert_eq!(after, tls::der_of(&leaf));
    let (status, _) = tls::https(server.admin_port, &root, "POST", "/", BODY).await;
    assert_eq!(status, 200);
    assert!(wss.next_text().await.contains(r#""key":"7""#));
    let fresh = Wss::connect_tls(server.client_port, "/", &root).await;
    drop(fresh);
}

/// Renewal by a Kubernetes Secret volume: the files are symlinks through `..data`, which is
/// swapped to a new directory; the paths, their mtimes and inodes stay the same.
#[tokio::test]
async fn a_renewal_by_secret_volume_symlink_swap_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let root = chain.root_pem();
    let volume = dir.path().join("volume");
    let first = volume.join("..2026_12_07_first");
    std::fs::create_dir_all(&first).unwrap();
    let leaf_and_chain = |leaf: &str| format!("{leaf}{}", chain.intermediate.pem());
    std::fs::write(
        first.join("tls.crt"),
        leaf_and_chain(&std::fs::read_to_string(chain.path("leaf.pem")).unwrap()),
    )
    .unwrap();
    std::fs::copy(chain.path("key.pem"), first.join("tls.key")).unwrap();
    std::os::unix::fs::symlink("..2026_12_07_first", volume.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{name}"), volume.join(name)).unwrap();
    }
    let (crt, key) = (volume.join("tls.crt"), volume.join("tls.key"));
    let server = InProcess::start_tuned(
        |config| serve_tls(config, ServerKind::Client, &crt, &key, None),
        |server| server.with_tls_recheck(Duration::from_millis(50)),
    )
    .await;
    let mut wss = Wss::connect_tls(server.client_port, "/", &root).await;
    wss.subscribe(&[PHID]).await;

    // As the kubelet does: a new timestamped directory, a new `..data` link renamed over.
    let (leaf, new_key) = chain.intermediate.leaf();
    let second = volume.join("..2026_12_07_second");
    std::fs::create_dir_all(&second).unwrap();
    std::fs::write(second.join("tls.crt"), leaf_and_chain(&leaf)).unwrap();
    std::fs::write(second.join("tls.key"), new_key).unwrap();
    std::os::unix::fs::symlink("..2026_12_07_second", volume.join("..data_tmp")).unwrap();
    std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).unwrap();
    std::fs::remove_dir_all(&first).unwrap();

    let taken = r#"gorge_notification_tls_reloads_total{port="client",result="taken"}"#;
    gorge_testkit::eventually(PATIENCE, taken, || async {
        server.metric(taken).await == Some(1.0)
    })
    .await;
    let served = tls::served_leaf(&tls::connect(server.client_port, &root).await.unwrap());
    assert_eq!(served, tls::der_of(&leaf));
    server.post_ok("", BODY).await;
    assert!(wss.next_text().await.contains(r#""key":"7""#));
}

/// A renewal that is broken (a key not matching the certificate, then a half-written
/// certificate) is not taken: the old pair serves on, the failure is counted once per
/// distinct failure, and the expiry gauge stays the old one's.
#[tokio::test]
async fn a_broken_renewal_keeps_the_old_pair() {
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let root = chain.root_pem();
    let server = tls_server(&chain, Duration::from_millis(50)).await;
    let before = tls::served_leaf(&tls::connect(server.client_port, &root).await.unwrap());
    let failed = r#"gorge_notification_tls_reloads_total{port="client",result="failed"}"#;

    // A new certificate without its new key: mismatch.
    let (leaf, key) = chain.intermediate.leaf();
    replace_by_rename(&chain.path("leaf.pem"), &leaf);
    wait_metric(&server, &root, failed, 1.0).await;
    assert_eq!(
        tls::served_leaf(&tls::connect(server.client_port, &root).await.unwrap()),
        before
    );
    // Still ready (the old pair serves), and /readyz says why the renewal was not taken.
    let (status, body) = tls::https(server.admin_port, &root, "GET", "/readyz", "").await;
    assert_eq!(status, 200, "{body}");
    let readyz: serde_json::Value = serde_json::from_str(&body).unwrap();
    let warning = readyz["warnings"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        warning.starts_with("the client port's renewed TLS files were not taken")
            && warning.contains("servers[0].ssl.key=")
            && warning.contains("does not match the certificate"),
        "{readyz}"
    );
    // Half of the certificate written: not PEM.
    replace_by_rename(&chain.path("leaf.pem"), &leaf[..leaf.len() / 2]);
    wait_metric(&server, &root, failed, 2.0).await;
    assert_eq!(
        tls::served_leaf(&tls::connect(server.client_port, &root).await.unwrap()),
        before
    );
    // Whole again, with its key: taken, and the failure count did not move meanwhile.
    replace_by_rename(&chain.path("key.pem"), &key);
    replace_by_rename(&chain.path("leaf.pem"), &leaf);
    let taken = r#"gorge_notification_tls_reloads_total{port="client",result="taken"}"#;
    wait_metric(&server, &root, taken, 1.0).await;
    assert_eq!(metric(&server, &root, failed).await, Some(2.0));
    assert_eq!(
        tls::served_leaf(&tls::connect(server.client_port, &root).await.unwrap()),
        tls::der_of(&leaf)
    );
    let (_, body) = tls::https(server.admin_port, &root, "GET", "/readyz", "").await;
    assert_eq!(body, r#"{"status":"ok"}"#);
}

/// Keys as openssl writes them: PKCS#1 RSA (`genrsa -traditional`), SEC1 EC (`ecparam
/// -genkey`) and PKCS#8 (`genpkey`), each with a self-signed `openssl req -x509` certificate,
/// serve a `wss://` handshake that trusts that certificate.
#[tokio::test]
async fn pkcs1_sec1_and_pkcs8_keys_each_serve() {
    let dir = tempfile::tempdir().unwrap();
    for (format, header) in [
        ("pkcs1", "-----BEGIN RSA PRIVATE KEY-----"),
        ("sec1", "-----BEGIN EC PRIVATE KEY-----"),
        ("pkcs8", "-----BEGIN PRIVATE KEY-----"),
    ] {
        let (cert, key) = tls::openssl_self_signed(dir.path(), format);
        assert!(
            std::fs::read_to_string(&key).unwrap().starts_with(header),
            "{format}"
        );
        let server =
            InProcess::start(|config| serve_tls(config, ServerKind::Client, &cert, &key, None))
                .await;
        // `openssl req -x509` marks it CA:TRUE, which webpki refuses as a leaf (browsers take
        // it once trusted): the client checks it is exactly this certificate instead.
        let pem = std::fs::read_to_string(&cert).unwrap();
        let stream = tls::connect_unverified(server.client_port).await.unwrap();
        assert_eq!(tls::served_leaf(&stream), tls::der_of(&pem), "{format}");
        let (status, _) = tls::request_on(stream, "GET", "/", "").await;
        assert_eq!(status, 501, "{format}");
    }
}

/// The process: files from the environment, a renewal taken at once on SIGHUP (the re-check
/// interval is 60 s, far beyond this test's patience), and a key that does not match
/// stopping startup with exit 2 and one line naming the variable and the file.
#[tokio::test]
async fn sighup_takes_a_renewal_at_once_and_a_mismatched_key_stops_startup() {
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let root = chain.root_pem();
    let path = |name: &str| chain.path(name).display().to_string();
    let (leaf, key, inter) = (path("leaf.pem"), path("key.pem"), path("chain.pem"));
    let env = [
        ("GORGE_NOTIFICATION_CLIENT_TLS_CERT_FILE", leaf.as_str()),
        ("GORGE_NOTIFICATION_CLIENT_TLS_KEY_FILE", key.as_str()),
        ("GORGE_NOTIFICATION_CLIENT_TLS_CHAIN_FILE", inter.as_str()),
    ];
    let server = Server::start(&env);
    let mut wss = Wss::connect_tls(server.client_port, "/", &root).await;
    wss.subscribe(&[PHID]).await;
    let (new_leaf, new_key) = chain.intermediate.leaf();
    replace_by_rename(Path::new(&key), &new_key);
    replace_by_rename(Path::new(&leaf), &new_leaf);
    server.process.signal(gorge_testkit::process::Signal::HUP);
    let reloaded = server.wait_for_log("NOTIFY_TLS_RELOADED").await;
    assert_eq!(reloaded["port"], "client", "{reloaded}");
    let served = tls::served_leaf(&tls::connect(server.client_port, &root).await.unwrap());
    assert_eq!(served, tls::der_of(&new_leaf));
    server.post_ok("", BODY).await;
    assert!(wss.next_text().await.contains(r#""key":"7""#));

    // The old key beside the new certificate: refused at startup, naming the variable.
    let other = dir.path().join("other.key");
    std::fs::write(&other, chain.intermediate.leaf().1).unwrap();
    let other = other.display().to_string();
    let output = bounded()
        .env_clear()
        .env("GORGE_NOTIFICATION_CLIENT_TLS_CERT_FILE", &leaf)
        .env("GORGE_NOTIFICATION_CLIENT_TLS_KEY_FILE", &other)
        .env("GORGE_NOTIFICATION_CLIENT_PORT", "1")
        .env("GORGE_NOTIFICATION_ADMIN_PORT", "2")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "GORGE_NOTIFICATION_CLIENT_TLS_KEY_FILE=\"{other}\""
        )) && stderr.contains("does not match the certificate"),
        "{stderr}"
    );
}

/// The Aphlict file's `ssl.*` keys: a mismatched key names `servers[0].ssl.key` and the file;
/// an unreadable certificate names `servers[1].ssl.cert`; a file that holds no PEM names it too.
#[test]
fn the_aphlict_file_s_ssl_keys_are_checked_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let other = dir.path().join("other.key");
    std::fs::write(&other, chain.intermediate.leaf().1).unwrap();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let refused = |servers: serde_json::Value| -> String {
        let file = dir.path().join("aphlict.json");
        std::fs::write(&file, serde_json::json!({ "servers": servers }).to_string()).unwrap();
        let output = bounded()
            .env_clear()
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        String::from_utf8(output.stderr).unwrap()
    };
    let p = |path: PathBuf| path.display().to_string();
    let good = serde_json::json!({"type": "admin", "port": 2, "listen": "127.0.0.1"});
    let stderr = refused(serde_json::json!([
        {"type": "client", "port": 1, "listen": "127.0.0.1", "ssl.cert": p(chain.path("leaf.pem")), "ssl.key": p(other.clone())},
        good,
    ]));
    assert!(
        stderr.starts_with(&format!(
            "invalid configuration: servers[0].ssl.key=\"{}\": does not match",
            p(other)
        )),
        "{stderr}"
    );
    let stderr = refused(serde_json::json!([
        {"type": "client", "port": 1, "listen": "127.0.0.1"},
        {"type": "admin", "port": 2, "listen": "127.0.0.1", "ssl.cert": p(missing.clone()), "ssl.key": p(chain.path("key.pem"))},
    ]));
    assert!(
        stderr.starts_with(&format!(
            "invalid configuration: servers[1].ssl.cert=\"{}\": cannot be read",
            p(missing)
        )),
        "{stderr}"
    );
    let stderr = refused(serde_json::json!([
        {"type": "client", "port": 1, "listen": "127.0.0.1", "ssl.cert": p(chain.path("leaf.pem")), "ssl.key": p(chain.path("key.pem")), "ssl.chain": p(not_pem.clone())},
        good,
    ]));
    assert!(
        stderr.starts_with(&format!(
            "invalid configuration: servers[0].ssl.chain=\"{}\": holds no PEM certificate",
            p(not_pem)
        )),
        "{stderr}"
    );
}

/// A mesh peer whose admin port serves TLS is relayed to over `https://`, verified against
/// `PEER_CA_FILE`; without that CA (the system's roots) the relay fails and is counted.
#[tokio::test]
async fn an_https_peer_is_relayed_to_when_its_certificate_chains_to_the_peer_ca() {
    use gorge_notification::config::{ClusterConfig, PeerConfig, PeerProtocol, PeerUrl};
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let root = chain.root_pem();
    let peer = tls_server(&chain, tls_recheck_never()).await;
    let mut wss = Wss::connect_tls(peer.client_port, "/", &root).await;
    wss.subscribe(&[PHID]).await;
    let url = PeerUrl {
        protocol: PeerProtocol::Https,
        host: "127.0.0.1".into(),
        port: peer.admin_port,
    };
    for trusted in [true, false] {
        let ca_pem = trusted.then(|| root.clone().into_bytes());
        let static_peers = vec![url.clone()];
        let relay = InProcess::start(|config| {
            config.cluster = ClusterConfig::Mesh(PeerConfig {
                static_peers,
                ca_pem,
                ..PeerConfig::default()
            })
        })
        .await;
        relay.post_ok("", BODY).await;
        let peer = format!("127.0.0.1:{}", peer.admin_port);
        if trusted {
            assert!(wss.next_text().await.contains(r#""key":"7""#));
        } else {
            let failed = format!(
                "gorge_notification_peer_relays_total{{peer=\"{peer}\",result=\"failed\"}}"
            );
            gorge_testkit::eventually(PATIENCE, &failed, || async {
                relay.metric(&failed).await.is_some_and(|n| n >= 1.0)
            })
            .await;
        }
    }
}

/// With TLS on both ports, `healthcheck`, `selftest` and `status` reach the server from its
/// configuration (over https and wss, on loopback), as the image's HEALTHCHECK and an
/// operator run them; a plaintext probe of the TLS admin port would fail.
#[tokio::test]
async fn healthcheck_selftest_and_status_work_when_the_ports_serve_tls() {
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let path = |name: &str| chain.path(name).display().to_string();
    let (leaf, key, inter) = (path("leaf.pem"), path("key.pem"), path("chain.pem"));
    let mut env = vec![
        ("GORGE_NOTIFICATION_CLIENT_TLS_CERT_FILE", leaf.clone()),
        ("GORGE_NOTIFICATION_CLIENT_TLS_KEY_FILE", key.clone()),
        ("GORGE_NOTIFICATION_CLIENT_TLS_CHAIN_FILE", inter.clone()),
        ("GORGE_NOTIFICATION_ADMIN_TLS_CERT_FILE", leaf),
        ("GORGE_NOTIFICATION_ADMIN_TLS_KEY_FILE", key),
        ("GORGE_NOTIFICATION_ADMIN_TLS_CHAIN_FILE", inter),
    ];
    let borrowed: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = Server::start(&borrowed);
    env.push(("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1".into()));
    env.push((
        "GORGE_NOTIFICATION_CLIENT_PORT",
        server.client_port.to_string(),
    ));
    env.push((
        "GORGE_NOTIFICATION_ADMIN_PORT",
        server.admin_port.to_string(),
    ));
    let run = move |args: &[&str]| {
        let output = bounded()
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.code(), text)
    };
    let runs = tokio::task::spawn_blocking(move || {
        ["healthcheck", "selftest", "status"].map(|command| (command, run(&[command])))
    })
    .await
    .unwrap();
    for (command, (code, text)) in runs {
        assert_eq!(code, Some(0), "{command}: {text}");
    }
    // The plaintext probe the TLS port refuses: what `healthcheck` would do without TLS.
    let plain = gorge_service::healthcheck::probe(([127, 0, 0, 1], server.admin_port).into());
    assert!(
        plain.is_err(),
        "a plaintext /healthz was answered on the TLS admin port"
    );
}

/// SIGHUP (`systemctl reload`) without TLS changes nothing: the process serves on, with its
/// sockets. Its default action would end the process.
#[tokio::test]
async fn sighup_without_tls_keeps_serving() {
    let mut server = Server::start(&[]);
    let mut ws = server.ws("/").await;
    ws.subscribe(&[PHID]).await;
    server.process.signal(gorge_testkit::process::Signal::HUP);
    // Ordered after the signal's delivery: the process handled it before answering this.
    server.post_ok("", BODY).await;
    assert!(ws.next_text().await.contains(r#""key":"7""#));
    assert!(
        server.process.try_wait().is_none(),
        "SIGHUP ended the process"
    );
}
