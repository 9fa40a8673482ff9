//! The client port as browsers (and Phorge's cluster page) use it: the exact 501, delivery
//! filtering, instances, replay, and robustness against bad frames.

mod common;

use common::{InProcess, Server};
use gorge_testkit::http;

const NOT_WEBSOCKET: &[u8] = b"HTTP/501 Use Websockets\n";

#[tokio::test]
async fn non_upgrade_requests_get_the_exact_501() {
    let server = InProcess::start(|_| {}).await;
    for path in ["/", "/~acme/", "/x/y", "/healthz", "/status/"] {
        for method in ["GET", "POST"] {
            let r = http::request(server.client_port, method, path, &[], b"").await;
            assert_eq!(r.status, 501, "{method} {path}");
            assert_eq!(r.body, NOT_WEBSOCKET, "{method} {path}");
        }
    }
}

#[tokio::test]
async fn an_h2c_upgrade_is_not_a_websocket_upgrade() {
    let server = InProcess::start(|_| {}).await;
    let request = "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings, close\r\n\
                   Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";
    let r = http::raw(server.client_port, request.as_bytes()).await;
    assert_eq!(r.status, 501);
    assert_eq!(r.body, NOT_WEBSOCKET);
}

#[tokio::test]
async fn delivery_follows_subscriptions() {
    let server = InProcess::start(|_| {}).await;
    let mut a = server.ws("/").await;
    let mut b = server.ws("/any/path").await;
    a.subscribe(&["PHID-A", "PHID-C"]).await;
    b.subscribe(&["PHID-B"]).await;

    server
        .post_ok("", r#"{"n":1,"subscribers":["PHID-X","PHID-A","PHID-C"]}"#)
        .await;
    server
        .post_ok("", r#"{"n":2,"subscribers":["PHID-X"]}"#)
        .await;
    // Empty, missing or non-list subscribers reach nobody.
    for body in [
        r#"{"n":3,"subscribers":[]}"#,
        r#"{"n":4}"#,
        r#"{"n":5,"subscribers":"PHID-A"}"#,
    ] {
        server.post_ok("", body).await;
    }
    let got_a = a.sync().await;
    assert_eq!(got_a.len(), 1, "{got_a:?}");
    assert!(got_a[0].starts_with(r#"{"n":1,"#));
    assert_eq!(b.sync().await, Vec::<String>::new());

    a.send(r#"{"command":"unsubscribe","data":["PHID-A"]}"#)
        .await;
    assert_eq!(a.sync().await, Vec::<String>::new());
    server.post("", r#"{"n":6,"subscribers":["PHID-A"]}"#).await;
    server.post("", r#"{"n":7,"subscribers":["PHID-C"]}"#).await;
    let got_a = a.sync().await;
    assert_eq!(got_a.len(), 1, "{got_a:?}");
    assert!(got_a[0].starts_with(r#"{"n":7,"#));
}

#[tokio::test]
async fn instances_are_isolated() {
    let server = InProcess::start(|_| {}).await;
    let mut a = server.ws("/~a/").await;
    let mut b = server.ws("/ws/~b/").await;
    let mut default = server.ws("/?instance=b").await;
    for ws in [&mut a, &mut b, &mut default] {
        ws.subscribe(&["P"]).await;
    }
    server
        .post("?instance=b", r#"{"to":"b","subscribers":["P"]}"#)
        .await;
    server
        .post("?instance=a", r#"{"to":"a","subscribers":["P"]}"#)
        .await;
    server
        .post("", r#"{"to":"default","subscribers":["P"]}"#)
        .await;
    let only = |frames: Vec<String>| {
        assert_eq!(frames.len(), 1, "{frames:?}");
        serde_json::from_str::<serde_json::Value>(&frames[0]).unwrap()["to"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(only(a.sync().await), "a");
    assert_eq!(only(b.sync().await), "b");
    // The client port ignores the query string: this socket is on "default".
    assert_eq!(only(default.sync().await), "default");
    assert_eq!(server.status("?instance=b").await["clients.active"], 1);
}

/// In-process with the hub's manual clock: the old messages age past a short replay window
/// because the test moves time, not because it sleeps.
#[tokio::test]
async fn replay_by_subscription_and_age_within_the_instance() {
    let server = InProcess::start(|_| {}).await;
    server
        .post("", r#"{"m":"old-1","subscribers":["P1"]}"#)
        .await;
    server
        .post("", r#"{"m":"old-2","subscribers":["P2"]}"#)
        .await;
    server
        .post("?instance=other", r#"{"m":"other","subscribers":["P1"]}"#)
        .await;
    server.clock.advance_ms(300);
    server
        .post("", r#"{"m":"new-1","subscribers":["P1","P2"]}"#)
        .await;

    let mut ws = server.ws("/").await;
    ws.subscribe(&["P1"]).await;
    ws.send(r#"{"command":"replay","data":{"age":200}}"#).await;
    assert_eq!(messages(ws.sync().await), ["new-1"]);
    ws.send(r#"{"command":"replay","data":{"age":60000}}"#)
        .await;
    assert_eq!(messages(ws.sync().await), ["old-1", "new-1"]);
    // Missing, zero, negative or too large ages mean 60 s. A fresh socket for each: replays
    // are rate-limited per socket (a browser replays once per connection).
    for data in [
        r#"null"#,
        r#"{"age":0}"#,
        r#"{"age":-1}"#,
        r#"{"age":999999}"#,
        r#"{"age":"x"}"#,
    ] {
        let mut ws = server.ws("/").await;
        ws.subscribe(&["P1"]).await;
        ws.send(&format!(r#"{{"command":"replay","data":{data}}}"#))
            .await;
        assert_eq!(messages(ws.sync().await), ["old-1", "new-1"], "{data}");
    }
    // The same socket asking again and again is refused beyond its burst, and counted.
    for _ in 0..3 {
        ws.send(r#"{"command":"replay"}"#).await;
    }
    assert_eq!(
        messages(ws.sync().await),
        ["old-1", "new-1", "old-1", "new-1"]
    );
    server
        .assert_metric("gorge_notification_replays_refused_total", 1.0)
        .await;

    let mut other = server.ws("/~elsewhere/").await;
    other.subscribe(&["P1", "P2"]).await;
    other.send(r#"{"command":"replay"}"#).await;
    assert_eq!(messages(other.sync().await), Vec::<String>::new());

    // Replay does not count in messages.out.
    assert_eq!(server.status("").await["messages.out"], 0);
}

fn messages(frames: Vec<String>) -> Vec<String> {
    frames
        .iter()
        .map(|f| {
            serde_json::from_str::<serde_json::Value>(f).unwrap()["m"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn bad_frames_are_ignored_and_the_socket_keeps_working() {
    let server = InProcess::start(|_| {}).await;
    let mut ws = server.ws("/").await;
    for frame in [
        "not json",
        "{",
        "[]",
        r#"{"command":"subscribe","data":null}"#,
        r#"{"command":"subscribe","data":"PHID-A"}"#,
        r#"{"command":"dance","data":[]}"#,
        r#"{"data":["PHID-A"]}"#,
    ] {
        ws.send(frame).await;
        assert_eq!(ws.sync().await, Vec::<String>::new(), "{frame}");
    }
    ws.subscribe(&["PHID-A"]).await;
    server.post("", r#"{"subscribers":["PHID-A"]}"#).await;
    assert_eq!(ws.sync().await.len(), 1);
    server
        .assert_metric("gorge_notification_commands_ignored_total", 7.0)
        .await;
}

#[tokio::test]
async fn subscriptions_over_the_limit_are_ignored_and_counted() {
    let server = InProcess::start(|_| {}).await;
    let mut ws = server.ws("/").await;
    let phids: Vec<String> = (0..5000).map(|i| format!("P{i}")).collect();
    let command = serde_json::json!({"command": "subscribe", "data": phids});
    ws.send(&command.to_string()).await;
    assert_eq!(ws.sync().await, Vec::<String>::new());
    server
        .assert_metric("gorge_notification_subscriptions_ignored_total", 904.0)
        .await;
    server.post("", r#"{"subscribers":["P4095"]}"#).await;
    server.post("", r#"{"subscribers":["P4096"]}"#).await;
    assert_eq!(ws.sync().await.len(), 1);
}

#[tokio::test]
async fn an_oversized_frame_closes_the_socket_with_1009() {
    let server = InProcess::start(|_| {}).await;
    let mut ws = server.ws("/").await;
    let mut healthy = server.ws("/").await;
    ws.send(&format!(
        r#"{{"command":"ping","pad":"{}"}}"#,
        "x".repeat(70 * 1024)
    ))
    .await;
    let closed = ws.until_closed().await;
    assert_eq!(closed.code, Some(1009));
    assert!(closed.frames.is_empty());
    assert_eq!(healthy.sync().await, Vec::<String>::new());
    server
        .assert_metric("gorge_notification_oversized_frames_total", 1.0)
        .await;
}

#[tokio::test]
async fn socket_limit_refuses_upgrades_with_503() {
    let server = InProcess::start(|config| config.hub.sockets = 1).await;
    let mut first = server.ws("/").await;
    assert_eq!(server.refused_upgrade("/").await, 503);
    assert_eq!(first.sync().await, Vec::<String>::new());
    server
        .assert_metric(
            r#"gorge_notification_sockets_rejected_total{reason="max_sockets"}"#,
            1.0,
        )
        .await;
    drop(first);
}

/// A connection that never answers protocol pings is reaped after the idle timeout; one that
/// answers (every WebSocket client library does, as browsers do) stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_are_reaped_and_answering_ones_stay() {
    use tokio::io::AsyncReadExt;

    let server = InProcess::start(|config| {
        config.ping_interval = std::time::Duration::from_secs(1);
        config.idle_timeout = std::time::Duration::from_secs(2);
    })
    .await;
    // The answering socket is polled all along, so its library answers the server's pings.
    let mut live = server.ws("/").await;
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let keeper = tokio::spawn(async move {
        use futures_util::StreamExt;
        loop {
            tokio::select! {
                _ = &mut stopped => return live,
                frame = live.ws.next() => assert!(matches!(frame, Some(Ok(_))), "{frame:?}"),
            }
        }
    });

    // A raw connection that completes the handshake and then never reads or writes.
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", server.client_port))
        .await
        .unwrap();
    let head = common::raw_upgrade(&mut silent, "GET / HTTP/1.1").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head:?}");
    // Reading until EOF only consumes what the server sent; TCP itself acks, not the app.
    let mut received = Vec::new();
    tokio::time::timeout(common::PATIENCE, silent.read_to_end(&mut received))
        .await
        .expect("reaped in time")
        .unwrap();
    // Server frames are unmasked: a ping is 0x89, the close frame 0x88 with code 1001.
    let close = received.windows(4).any(|w| w == [0x88, 0x0e, 0x03, 0xe9]);
    assert!(close, "no 1001 close frame in {received:?}");

    stop.send(()).unwrap();
    let mut live = keeper.await.unwrap();
    assert_eq!(live.sync().await, Vec::<String>::new());
    server
        .assert_metric(
            r#"gorge_notification_sockets_closed_total{reason="idle"}"#,
            1.0,
        )
        .await;
}

#[tokio::test]
async fn instance_limits_are_enforced_and_counted() {
    let server = InProcess::start(|config| {
        config.hub.instances = 1;
        config.hub.instance_name_bytes = 8;
    })
    .await;
    let mut busy = server.ws("/~first/").await;
    assert_eq!(server.refused_upgrade("/~second/").await, 503);
    assert_eq!(server.refused_upgrade("/~muchtoolong/").await, 400);
    assert_eq!(busy.sync().await, Vec::<String>::new());
    assert_eq!(
        server
            .post("?instance=muchtoolong", r#"{"subscribers":["P"]}"#)
            .await
            .status,
        400
    );
    server
        .assert_metric(
            r#"gorge_notification_sockets_rejected_total{reason="max_instances"}"#,
            1.0,
        )
        .await;
    server
        .assert_metric(r#"gorge_notification_instances{kind="anonymous"}"#, 1.0)
        .await;
    server
        .assert_metric(
            r#"gorge_notification_sockets_rejected_total{reason="instance_name"}"#,
            1.0,
        )
        .await;
    // Once PHP has posted to an instance, its browsers are never kept out by anonymous ones.
    assert_eq!(server.refused_upgrade("/~acme/").await, 503);
    server
        .post("?instance=acme", r#"{"m":"first","subscribers":["P"]}"#)
        .await;
    let mut acme = server.ws("/~acme/").await;
    acme.subscribe(&["P"]).await;
    acme.send(r#"{"command":"replay"}"#).await;
    assert_eq!(messages(acme.sync().await), ["first"]);
    // `default` always gets in.
    let mut default = server.ws("/").await;
    assert_eq!(default.sync().await, Vec::<String>::new());
    // Once "first" is idle it can be forgotten to make room.
    drop(busy);
    gorge_testkit::eventually(common::PATIENCE, "\"first\" has no socket", || async {
        server.status("?instance=first").await["clients.active"] == 0
    })
    .await;
    let mut second = server.ws("/~second/").await;
    assert_eq!(second.sync().await, Vec::<String>::new());
}

/// Anonymous sockets flooding `replay` get one burst each; the rest is refused and counted,
/// and PHP's POST is answered and delivered meanwhile.
#[tokio::test]
async fn replay_floods_are_refused_and_counted_while_posts_go_through() {
    let server = InProcess::start(|_| {}).await;
    for n in 0..300 {
        let body = format!(r#"{{"m":"m{n}","subscribers":["P"]}}"#);
        server.post_ok("", &body).await;
    }
    let mut attackers = Vec::new();
    for _ in 0..4 {
        let mut ws = server.ws("/").await;
        ws.subscribe(&["P"]).await;
        for _ in 0..25 {
            ws.send(r#"{"command":"replay"}"#).await;
        }
        attackers.push(ws);
    }
    let mut reader = server.ws("/").await;
    reader.subscribe(&["Q"]).await;
    let receipt = server.post("", r#"{"m":"live","subscribers":["Q"]}"#).await;
    assert_eq!(receipt.status, 200);
    assert_eq!(messages(reader.sync().await), ["live"]);
    // Every attacker's commands have been handled once its pong arrives.
    for ws in &mut attackers {
        ws.sync().await;
    }
    assert_eq!(
        server
            .metric("gorge_notification_replays_refused_total")
            .await,
        Some(4.0 * 21.0)
    );
}

/// Numbers keep every digit; only the exponent marker is normalised (docs/notification.md).
#[tokio::test]
async fn numbers_keep_their_digits_and_exponents_are_normalised() {
    let server = InProcess::start(|_| {}).await;
    let mut ws = server.ws("/").await;
    ws.subscribe(&["P"]).await;
    let body = r#"{"a":1e5,"b":1E-7,"c":2.50,"d":123456789012345678901234567890,"e":-0,"subscribers":["P"]}"#;
    server.post("", body).await;
    let frames = ws.sync().await;
    let expected = format!(
        r#"{{"a":1e+5,"b":1e-7,"c":2.50,"d":123456789012345678901234567890,"e":-0,"subscribers":["P"],"touched":["{}"]}}"#,
        server.fingerprint
    );
    assert_eq!(frames, [expected]);
}

/// Issue 9 N2: 1 024 anonymous sockets on distinct `~names` fill the anonymous instance table,
/// yet an instance PHP has posted to, and `default`, still get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squatting_sockets_cannot_keep_a_real_instance_out() {
    // Both ends of every socket live in this process.
    let _ = gorge_service::fdlimit::raise_to_hard();
    let server = InProcess::start(|_| {}).await;
    let mut squatters = Vec::new();
    for i in 0..1024 {
        squatters.push(server.ws(&format!("/~squat{i}/")).await);
    }
    let port = server.client_port;
    let refused = Server::refused_upgrade_on(port, "/~one-more/").await;
    assert_eq!(refused, 503);
    assert_eq!(Server::refused_upgrade_on(port, "/~acme/").await, 503);

    server
        .post("?instance=acme", r#"{"m":"hello","subscribers":["P"]}"#)
        .await;
    let mut acme = server.ws("/~acme/").await;
    acme.subscribe(&["P"]).await;
    acme.send(r#"{"command":"replay"}"#).await;
    assert_eq!(messages(acme.sync().await), ["hello"]);
    server
        .post("?instance=acme", r#"{"m":"live","subscribers":["P"]}"#)
        .await;
    assert_eq!(messages(acme.sync().await), ["live"]);
    let mut default = server.ws("/").await;
    assert_eq!(default.sync().await, Vec::<String>::new());
    server
        .assert_metric(r#"gorge_notification_instances{kind="anonymous"}"#, 1024.0)
        .await;
    assert_eq!(squatters.len(), 1024);
}

/// Node's `http` reports an HTTP/1.0 `Upgrade` request and `ws` completes it (it checks the
/// method, `Upgrade`, the key and the version, never the HTTP version), so Aphlict serves
/// HTTP/1.0 clients; hyper alone would answer 101 and close.
#[tokio::test]
async fn an_http_1_0_upgrade_is_served_as_aphlict_serves_it() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::protocol::Role;

    let server = InProcess::start(|_| {}).await;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", server.client_port))
        .await
        .unwrap();
    let head = common::raw_upgrade(&mut stream, "GET /~acme/ HTTP/1.0")
        .await
        .to_ascii_lowercase();
    assert!(
        head.starts_with("http/1.1 101 switching protocols\r\n"),
        "{head}"
    );
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=\r\n"),
        "{head}"
    );
    let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(stream, Role::Client, None).await;
    let mut ws = common::Ws { ws };
    ws.subscribe(&["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]).await;
    server
        .post_ok(
            "?instance=acme",
            r#"{"key":"1","subscribers":["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]}"#,
        )
        .await;
    let frame: serde_json::Value = serde_json::from_str(&ws.next_text().await).unwrap();
    assert_eq!(frame["key"], "1");

    // A plain HTTP/1.0 request still gets the exact 501, and its connection ends after it.
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", server.client_port))
        .await
        .unwrap();
    plain
        .write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(common::PATIENCE, plain.read_to_end(&mut answer))
        .await
        .expect("the connection ends after the 501")
        .unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 501 "), "{answer:?}");
    assert!(answer.ends_with(NOT_WEBSOCKET), "{answer:?}");
}
