//! The alerting rules and Grafana dashboard of gorge-notification against its real
//! `/metrics` (scripts/check-monitoring.py: promtool check metrics, check rules, test rules
//! on these series, every metric a rule or panel names exists). The scrape is of a server
//! with one peer that is up and a subscribed socket that received a message, so the peer's
//! series exist.

mod common;

use common::Server;
use gorge_testkit::monitoring::scrape;

#[tokio::test(flavor = "multi_thread")]
async fn rules_and_dashboard_hold_against_the_real_metrics() {
    let peer = Server::start(&[]);
    let server = Server::start(&[(
        "GORGE_NOTIFICATION_PEERS",
        &format!("http://127.0.0.1:{}", peer.admin_port),
    )]);
    let mut ws = server.relayed_to(peer.admin_port).await;
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], server.admin_port));
    let before = scrape(admin);
    // Something that counts between the scrapes: a second message.
    server
        .post_ok(
            "",
            r#"{"key":"2","subscribers":["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]}"#,
        )
        .await;
    ws.sync().await;
    let after = scrape(admin);
    tokio::task::spawn_blocking(move || {
        gorge_testkit::monitoring::check("gorge-notification", &before, &after)
    })
    .await
    .unwrap();
}
