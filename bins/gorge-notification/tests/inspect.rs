//! `gorge-notification selftest` and `status` against real server processes: the selftest
//! passes on a working server (default and named instance) and fails with one line naming
//! the step when the frame cannot arrive or nothing answers; `status` shows listeners,
//! readiness, sockets and peers up or down, and says "not running" (exit 1) when the admin
//! port does not answer.

mod common;

use std::net::SocketAddr;

use common::{Server, BIN, PATIENCE};
use gorge_testkit::process::run_to_end;

/// A loopback port this test holds bound but not listening: connections to it are refused
/// for as long as it lives (no other process can take it meanwhile).
fn refusing_port() -> (socket2::Socket, u16) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    let port = socket.local_addr().unwrap().as_socket().unwrap().port();
    (socket, port)
}

/// Runs a subcommand with the server's ports in the environment, as an operator on the
/// server's host would (the same configuration the service reads).
fn run(server: &Server, args: &[&str]) -> (Option<i32>, String, String) {
    let (client, admin) = (
        server.client_port.to_string(),
        server.admin_port.to_string(),
    );
    run_to_end(
        BIN,
        args,
        &[
            ("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1"),
            ("GORGE_NOTIFICATION_CLIENT_PORT", &client),
            ("GORGE_NOTIFICATION_ADMIN_PORT", &admin),
        ],
    )
}

#[test]
fn selftest_sees_its_frame_and_reports_status() {
    let server = Server::start(&[]);
    for (args, instance) in [
        (vec!["selftest"], "default"),
        (vec!["selftest", "--instance", "acme"], "acme"),
    ] {
        let (code, stdout, stderr) = run(&server, &args);
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 2, "{stdout}");
        assert!(
            lines[0].starts_with("selftest: ok: the frame arrived ")
                && lines[0].ends_with(&format!("(server {})", server.fingerprint)),
            "{stdout}"
        );
        let status: serde_json::Value =
            serde_json::from_str(lines[1].strip_prefix("/status/: ").unwrap()).unwrap();
        assert_eq!(status["instance"], instance, "{stdout}");
        assert_eq!(status["clients.active"], 1, "{stdout}");
        assert_eq!(status["version"], 7, "{stdout}");
    }
    // The server saw exactly what PHP and a browser would have done: two messages in, two
    // sockets accepted and closed again.
    let status = run(&server, &["status"]);
    assert!(status.1.contains("  messages 2 in, 2 out"), "{}", status.1);
}

#[test]
fn selftest_fails_with_one_line_naming_the_step() {
    // The WebSocket on one server and the POST to another: the frame cannot arrive.
    let (a, b) = (Server::start(&[]), Server::start(&[]));
    let client = format!("ws://127.0.0.1:{}/", b.client_port);
    let (code, stdout, stderr) = run(&a, &["selftest", "--client", &client]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "selftest: FAIL: the message posted to http://127.0.0.1:{}/ (receipt from {}) did \
             not reach {client}: nothing arrived within 5 s",
            a.admin_port, a.fingerprint
        )),
        "{stderr}"
    );

    // Nothing listens on the client port.
    let (_held, refused) = refusing_port();
    let client = format!("ws://127.0.0.1:{refused}/");
    let (code, _, stderr) = run(&a, &["selftest", "--client", &client]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("selftest: FAIL: WebSocket {client}: ")),
        "{stderr}"
    );
    assert!(stderr.to_lowercase().contains("refused"), "{stderr}");

    // The client port of a server, the admin URL of nothing.
    let admin = format!("http://127.0.0.1:{refused}");
    let (code, _, stderr) = run(&a, &["selftest", "--admin", &admin]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!("selftest: FAIL: POST {admin}/: ")),
        "{stderr}"
    );
}

#[test]
fn status_shows_listeners_sockets_and_peers_up_or_down() {
    let peer = Server::start(&[]);
    let (_held, refused) = refusing_port();
    let peers = format!(
        "http://127.0.0.1:{},http://127.0.0.1:{refused}",
        peer.admin_port
    );
    let server = Server::start(&[("GORGE_NOTIFICATION_PEERS", &peers)]);
    // One relay to each peer: the live one answers, the other refuses.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ws = server.relayed_to(peer.admin_port).await;
        let failed = format!(
            "gorge_notification_peer_relays_total{{peer=\"127.0.0.1:{refused}\",result=\"failed\"}}"
        );
        gorge_testkit::eventually(PATIENCE, "the relay to the refusing peer tried", || async {
            server.metric(&failed).await >= Some(1.0)
        })
        .await;
        let (code, stdout, stderr) = run(&server, &["status"]);
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines[0],
            format!(
                "gorge-notification {} is running at http://127.0.0.1:{}: up {}, ready",
                env!("CARGO_PKG_VERSION"),
                server.admin_port,
                lines[0]
                    .split(": up ")
                    .nth(1)
                    .unwrap()
                    .split(',')
                    .next()
                    .unwrap()
            ),
            "{stdout}"
        );
        assert_eq!(
            lines[1],
            format!("  admin    http://127.0.0.1:{}  up", server.admin_port)
        );
        assert_eq!(
            lines[2],
            format!(
                "  client   ws://127.0.0.1:{}/  up (501 to plain HTTP, as Phorge checks)",
                server.client_port
            )
        );
        assert_eq!(
            lines[3],
            "  sockets  1 open (instance default 1, named instances 0)"
        );
        assert!(
            lines[4].starts_with("  instance default: 1 open, 1 since start; history 1 messages"),
            "{stdout}"
        );
        assert_eq!(lines[5], "  messages 1 in, 1 out (all instances)");
        // In the order of their names.
        let mut listed = [
            format!("127.0.0.1:{} up", peer.admin_port),
            format!("127.0.0.1:{refused} down"),
        ];
        listed.sort();
        assert_eq!(
            lines[6],
            format!("  peers    2: {}", listed.join(", ")),
            "{stdout}"
        );
        drop(ws);
    });

    // A server without peers says so.
    let (code, stdout, _) = run(&peer, &["status"]);
    assert_eq!(code, Some(0));
    assert!(
        stdout.ends_with("  peers    none (no cluster peers configured or discovered)\n"),
        "{stdout}"
    );
}

#[test]
fn status_when_nothing_answers_says_it_is_not_running() {
    let (_admin_held, admin) = refusing_port();
    let (_client_held, client) = refusing_port();
    let (admin_port, client_port) = (admin.to_string(), client.to_string());
    let (code, stdout, stderr) = run_to_end(
        BIN,
        &["status"],
        &[
            ("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1"),
            ("GORGE_NOTIFICATION_CLIENT_PORT", &client_port),
            ("GORGE_NOTIFICATION_ADMIN_PORT", &admin_port),
        ],
    );
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        format!("gorge-notification is not running at http://127.0.0.1:{admin}\n")
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("status: http://127.0.0.1:{admin}/status/: ")),
        "{stderr}"
    );
}
