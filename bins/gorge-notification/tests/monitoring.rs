//! The alerting rules and Grafana dashboard of gorge-notification against its real
//! `/metrics` (scripts/check-monitoring.py: promtool check metrics, check rules, test rules
//! on these series, every metric a rule or panel names exists). The scrape is of a server
//! with one peer that is up and a subscribed `wss://` socket that received a message, so the
//! peer's series and the TLS client port's exist.

mod common;

use common::tls::{Chain, Wss};
use common::Server;
use gorge_testkit::monitoring::scrape;

#[tokio::test(flavor = "multi_thread")]
async fn rules_and_dashboard_hold_against_the_real_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let chain = Chain::new(dir.path());
    let file = |name: &str| chain.path(name).display().to_string();
    let peer = Server::start(&[]);
    let server = Server::start(&[
        (
            "GORGE_NOTIFICATION_PEERS",
            &format!("http://127.0.0.1:{}", peer.admin_port),
        ),
        ("GORGE_NOTIFICATION_CLIENT_TLS_CERT_FILE", &file("leaf.pem")),
        ("GORGE_NOTIFICATION_CLIENT_TLS_KEY_FILE", &file("key.pem")),
        (
            "GORGE_NOTIFICATION_CLIENT_TLS_CHAIN_FILE",
            &file("chain.pem"),
        ),
    ]);
    let mut ws = Wss::connect_tls(server.client_port, "/", &chain.root_pem()).await;
    ws.subscribe(&["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]).await;
    server
        .post_ok(
            "",
            r#"{"key":"1","subscribers":["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]}"#,
        )
        .await;
    ws.next_text().await;
    let up = format!(
        "gorge_notification_peer_up{{peer=\"127.0.0.1:{}\"}}",
        peer.admin_port
    );
    gorge_testkit::eventually(
        common::PATIENCE,
        "the relay to the peer succeeded",
        || async { server.metric(&up).await == Some(1.0) },
    )
    .await;
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], server.admin_port));
    let before = scrape(admin);
    // Something that counts between the scrapes: a second message.
    server
        .post_ok(
            "",
            r#"{"key":"2","subscribers":["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]}"#,
        )
        .await;
    ws.next_text().await;
    let after = scrape(admin);
    tokio::task::spawn_blocking(move || {
        gorge_testkit::monitoring::check("gorge-notification", &before, &after)
    })
    .await
    .unwrap();
}
