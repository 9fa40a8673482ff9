//! A closed stdout (a pipe to `head`, a journald restart) neither panics nor stops the
//! service: lines that cannot be written are dropped and counted, and it keeps delivering.

mod common;

use std::net::SocketAddr;

use common::{enabled_hook, unix_now, Service};
use gorge_claim::testdb::{NewRequest, RequestStatus, TestDb};
use gorge_testkit::{eventually, free_port, Process, Receiver, PATIENCE};

const DROPPED: &str = "gorge_webhook_log_lines_dropped_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_drops_and_counts_lines_and_the_service_keeps_delivering() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/hook")).await;
    let status_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut service = Process::spawn_closing_stdout_after(
        Service::command(db.namespace(), status_addr, &[]),
        "LISTENING",
    );
    service
        .wait_for_event("LISTENING", PATIENCE)
        .expect("the service started");
    let dropped = || {
        let metrics = gorge_testkit::http::get_blocking(status_addr, "/metrics", &[]).text();
        gorge_testkit::sample(&metrics, DROPPED).unwrap_or(0.0)
    };

    // Each delivery logs WEBHOOK_DELIVERED, which stdout can no longer take.
    for round in 1..=2u64 {
        let object = format!("PHID-TASK-{round}");
        db.insert_request(&NewRequest::new(&hook, &object), unix_now())
            .await
            .unwrap();
        eventually(PATIENCE, "the row is sent", || async {
            db.count_requests(RequestStatus::Sent).await.unwrap() == round
        })
        .await;
        eventually(PATIENCE, "its log line is counted as dropped", || async {
            dropped() >= round as f64
        })
        .await;
    }
    let health = gorge_testkit::http::get_blocking(status_addr, "/healthz", &[]);
    assert_eq!(health.status, 200);

    service.sigterm();
    assert_eq!(service.exited().await.code(), Some(0));
    let stderr = service.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
    db.drop_database().await;
}
