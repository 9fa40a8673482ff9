//! The alerting rules and Grafana dashboard of gorge-webhook against its real `/metrics`
//! (scripts/check-monitoring.py: promtool check metrics, check rules, test rules on these
//! series, every metric a rule or panel names exists). The scrapes are of a ready replica
//! polling an empty queue on a real MariaDB, a few poll rounds apart.

mod common;

use common::Service;
use gorge_claim::testdb::TestDb;
use gorge_testkit::eventually;
use gorge_testkit::monitoring::scrape;

#[tokio::test(flavor = "multi_thread")]
async fn rules_and_dashboard_hold_against_the_real_metrics() {
    let db = TestDb::create().await.unwrap();
    let service = Service::start(db.namespace(), &[]);
    // Ready: the first queue sample (every 5 s) succeeded.
    eventually(gorge_testkit::PATIENCE, "db_up", || async {
        service.metric("gorge_webhook_db_up") == 1.0
    })
    .await;
    assert_eq!(service.get("/readyz", &[]).0, 200);
    let before = scrape(service.status_addr);
    service.wait_polls(3).await;
    let after = scrape(service.status_addr);
    tokio::task::spawn_blocking(move || {
        gorge_testkit::monitoring::check("gorge-webhook", &before, &after)
    })
    .await
    .unwrap();
}
