//! The alerting rules and Grafana dashboard of gorge-notification against its real
//! `/metrics` (scripts/check-monitoring.py: promtool check metrics, check rules, test rules
//! on these series, every metric a rule or panel names exists). The scrape is of a server
//! with one peer that is up and a subscribed socket that received a message, so the peer's
//! series exist.

mod common;

use common::{Server, PATIENCE};
use gorge_testkit::http;

async fn scrape(port: u16) -> String {
    let response = http::request(port, "GET", "/metrics", &[], b"").await;
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    response.text()
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_and_dashboard_hold_against_the_real_metrics() {
    let peer = Server::start(&[]);
    let server = Server::start(&[(
        "GORGE_NOTIFICATION_PEERS",
        &format!("http://127.0.0.1:{}", peer.admin_port),
    )]);
    let mut ws = server.ws("/").await;
    ws.subscribe(&["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]).await;
    server
        .post_ok(
            "",
            r#"{"key":"1","subscribers":["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]}"#,
        )
        .await;
    let up = format!(
        "gorge_notification_peer_up{{peer=\"127.0.0.1:{}\"}}",
        peer.admin_port
    );
    gorge_testkit::eventually(PATIENCE, "the relay to the peer succeeded", || async {
        server.metric(&up).await == Some(1.0)
    })
    .await;
    let before = scrape(server.admin_port).await;
    // Something that counts between the scrapes: a second message.
    server
        .post_ok(
            "",
            r#"{"key":"2","subscribers":["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]}"#,
        )
        .await;
    ws.sync().await;
    let after = scrape(server.admin_port).await;
    tokio::task::spawn_blocking(move || {
        gorge_testkit::monitoring::check("gorge-notification", &before, &after)
    })
    .await
    .unwrap();
}
