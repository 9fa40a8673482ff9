//! The admin port as Phorge's PHP uses it: form-labelled raw JSON posts, the receipt, the flat
//! status object, and the error envelopes.

mod common;

use common::InProcess;
use gorge_testkit::http;
use phorge_wire::aphlict::is_fingerprint;
use serde_json::Value;

/// The exact case from the issue: cURL's default form Content-Type on a raw JSON body whose
/// text would be mangled by form decoding.
#[tokio::test]
async fn form_labelled_json_reaches_the_browser_intact() {
    let server = InProcess::start(|_| {}).await;
    let mut ws = server.ws("/").await;
    ws.subscribe(&["PHID-USER-a"]).await;
    let body = r#"{"type":"notification","title":"build 100% done: a=1 & b=2","subscribers":["PHID-USER-a"]}"#;
    let response = server.post("", body).await;
    assert_eq!(response.status, 200);
    assert_eq!(
        String::from_utf8(response.body).unwrap(),
        format!("{{\"fingerprint\":\"{}\"}}", server.fingerprint)
    );
    let frame = ws.next_text().await;
    assert_eq!(
        frame,
        format!(
            r#"{{"type":"notification","title":"build 100% done: a=1 & b=2","subscribers":["PHID-USER-a"],"touched":["{}"]}}"#,
            server.fingerprint
        )
    );
    let v: Value = serde_json::from_str(&frame).unwrap();
    assert_eq!(v["title"], "build 100% done: a=1 & b=2");
    assert_eq!(v["type"], "notification");
}

#[tokio::test]
async fn big_integers_unicode_and_key_order_pass_through() {
    let server = InProcess::start(|_| {}).await;
    let mut ws = server.ws("/").await;
    ws.subscribe(&["PHID-USER-b"]).await;
    let body = r#"{"zeta":"héllo ✓ \u00e9 \"q\"","big":12345678901234567890,"neg":-98765432109876543210,"f":1.50,"e":1.0e+25,"nested":{"y":1,"x":[true,null]},"subscribers":["PHID-USER-b"],"alpha":""}"#;
    server.post_ok("", body).await;
    assert_eq!(
        ws.next_text().await,
        format!(
            r#"{{"zeta":"héllo ✓ é \"q\"","big":12345678901234567890,"neg":-98765432109876543210,"f":1.50,"e":1.0e+25,"nested":{{"y":1,"x":[true,null]}},"subscribers":["PHID-USER-b"],"alpha":"","touched":["{}"]}}"#,
            server.fingerprint
        )
    );
}

#[tokio::test]
async fn status_on_an_idle_server_has_exactly_the_aphlict_keys() {
    let server = InProcess::start(|_| {}).await;
    // PHP's status GET carries Content-Length: 0 and a form Content-Type.
    let response = http::request(
        server.admin_port,
        "GET",
        "/status/",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"",
    )
    .await;
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("application/json"));
    let text = String::from_utf8(response.body.clone()).unwrap();
    let status: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
    // Compact: re-serializing (order preserved) gives the same bytes.
    assert_eq!(serde_json::to_string(&status).unwrap(), text);
    let keys: Vec<&str> = status.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "instance",
            "uptime",
            "clients.active",
            "clients.total",
            "messages.in",
            "messages.out",
            "version",
            "history.size",
            "history.age",
            "server"
        ]
    );
    assert_eq!(status["instance"], "default");
    assert!(status["uptime"].is_u64());
    for key in [
        "clients.active",
        "clients.total",
        "messages.in",
        "messages.out",
        "history.size",
    ] {
        assert_eq!(status[key], 0, "{key}");
        assert!(status[key].is_u64(), "{key}");
    }
    assert_eq!(status["version"].as_u64(), Some(7));
    assert!(status["history.age"].is_null());
    assert_eq!(
        status["server"],
        concat!("gorge-notification ", env!("CARGO_PKG_VERSION"))
    );
    // An unknown instance answers zeros too.
    let other = server.status("?instance=ghost").await;
    assert_eq!(other["instance"], "ghost");
    assert_eq!(other["clients.total"], 0);
}

#[tokio::test]
async fn status_counts_follow_the_spec() {
    let server = InProcess::start(|_| {}).await;
    let mut a = server.ws("/~a/").await;
    a.subscribe(&["P"]).await;
    let _b = server.ws("/~b/").await;
    server
        .post_ok("?instance=a", r#"{"subscribers":["P"]}"#)
        .await;
    server
        .post_ok("?instance=b", r#"{"subscribers":["P"]}"#)
        .await;
    a.next_text().await;
    let status = server.status("?instance=a").await;
    assert_eq!(status["clients.active"], 1);
    assert_eq!(status["clients.total"], 1);
    assert_eq!(status["messages.in"], 2);
    assert_eq!(status["messages.out"], 1);
    assert_eq!(status["history.size"], 1);
    assert!(status["history.age"].is_u64());
    drop(a);
}

#[tokio::test]
async fn receipt_is_bare_and_the_fingerprint_fixed() {
    let server = InProcess::start(|_| {}).await;
    let first = server.post("", "{}").await;
    let second = server.post("?instance=other", r#"{"a":1}"#).await;
    for response in [&first, &second] {
        assert_eq!(response.status, 200);
        assert_eq!(response.header("content-type"), Some("application/json"));
    }
    assert_eq!(first.body, second.body);
    let receipt: serde_json::Map<String, Value> = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(receipt.len(), 1);
    let fingerprint = receipt["fingerprint"].as_str().unwrap();
    assert_eq!(fingerprint.len(), 16);
    assert!(is_fingerprint(fingerprint), "{fingerprint}");
    assert_eq!(fingerprint, server.fingerprint);
}

#[tokio::test]
async fn a_message_that_already_went_round_is_acknowledged_and_dropped() {
    let server = InProcess::start(|_| {}).await;
    let mut ws = server.ws("/").await;
    ws.subscribe(&["P"]).await;
    let body = format!(
        r#"{{"subscribers":["P"],"touched":["other","{}"]}}"#,
        server.fingerprint
    );
    let response = server.post("", &body).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["fingerprint"], server.fingerprint.as_str());
    assert_eq!(ws.sync().await, Vec::<String>::new());
    // Not delivered, but counted: Aphlict's AphlictAdminServer counts every POST it parsed.
    assert_eq!(server.status("").await["messages.in"], 1);
    assert_eq!(server.status("").await["messages.out"], 0);
}

#[tokio::test]
async fn bodies_that_are_not_json_objects_get_400() {
    let server = InProcess::start(|_| {}).await;
    for body in ["", "[]", "null", "1", "\"x\"", "not json", "{"] {
        let response = server.post("", body).await;
        assert_eq!(response.status, 400, "{body:?}");
        assert_eq!(
            response.json()["error"]["code"],
            "ERR_BAD_REQUEST",
            "{body:?}"
        );
    }
    assert_eq!(server.status("").await["messages.in"], 0);
}

#[tokio::test]
async fn every_post_is_timed_accepted_or_refused() {
    let server = InProcess::start(|_| {}).await;
    server
        .assert_metric("gorge_notification_admin_post_seconds_count", 0.0)
        .await;
    server.post_ok("", r#"{"key":1,"subscribers":[]}"#).await;
    assert_eq!(server.post("", "not json").await.status, 400);
    // What PHP waited for, refusals included; status reads are not POSTs.
    server.status("").await;
    server
        .assert_metric("gorge_notification_admin_post_seconds_count", 2.0)
        .await;
}

#[tokio::test]
async fn unknown_paths_and_methods_get_envelopes() {
    let server = InProcess::start(|_| {}).await;
    for path in ["/status", "/x", "/status/x"] {
        let r = http::request(server.admin_port, "GET", path, &[], b"").await;
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(r.json()["error"]["code"], "ERR_NOT_FOUND");
    }
    let r = http::request(server.admin_port, "GET", "/", &[], b"").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    assert_eq!(r.json()["error"]["code"], "ERR_METHOD_NOT_ALLOWED");
    let r = http::request(server.admin_port, "POST", "/status/", &[], b"{}").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
}

#[tokio::test]
async fn bodies_over_the_limit_get_413() {
    let server = InProcess::start(|config| config.max_admin_body_bytes = 1000).await;
    // The declared length is refused before the body is sent (Expect: 100-continue), so the
    // server never closes on unread data.
    let request = "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 1001\r\n\
                   Expect: 100-continue\r\n\r\n";
    let r = http::raw(server.admin_port, request.as_bytes()).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["code"], "ERR_TOO_LARGE");
    let padded = format!(r#"{{"pad":"{}"}}"#, "x".repeat(1000 - 10));
    assert_eq!(padded.len(), 1000);
    server.post_ok("", &padded).await;
    server
        .assert_metric(
            r#"gorge_notification_admin_rejected_total{reason="too_large"}"#,
            1.0,
        )
        .await;
}

#[tokio::test]
async fn probes_live_on_the_admin_port() {
    let server = InProcess::start(|_| {}).await;
    let r = http::request(server.admin_port, "GET", "/healthz", &[], b"").await;
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, br#"{"status":"ok"}"#.as_slice())
    );
    let r = http::request(server.admin_port, "GET", "/readyz", &[], b"").await;
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, br#"{"status":"ok"}"#.as_slice())
    );
    let r = http::request(server.admin_port, "GET", "/metrics", &[], b"").await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body).unwrap();
    for name in [
        "gorge_notification_messages_in_total",
        "gorge_notification_messages_out_total",
        "gorge_notification_fanout_seconds_bucket",
        "gorge_notification_slow_consumer_disconnects_total",
        "gorge_notification_queue_dropped_frames_total",
        "gorge_notification_replayed_frames_total",
        "gorge_notification_subscriptions_ignored_total",
        "gorge_notification_history_entries",
        "gorge_notification_history_bytes",
        "gorge_notification_draining",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
}
