//! gorge-webhook next to a Phorge that hands nothing over (stock, or the kit applied but not
//! switched) sends nothing and says why; rows handed over are delivered.

mod common;

use std::time::Duration;

use common::{enabled_hook, unix_now, Service};
use gorge_claim::handover::HandoverSample;
use gorge_claim::testdb::{NewRequest, RequestResult, RequestStatus, TestDb};
use gorge_testkit::{eventually, CapturedLog, Receiver};
use gorge_webhook::handover::{Handover, HandoverWatch, GRACE_SEC, NOTHING_HANDED_OVER};

fn readiness(service: &Service) -> (u16, serde_json::Value) {
    let (status, body) = service.get("/readyz", &[]);
    let body = serde_json::from_str(&body).unwrap_or_else(|_| panic!("/readyz: {body}"));
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_phorges_rows_are_never_sent_and_readiness_says_why() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/stock")).await;
    let now = unix_now();
    // A stock Phorge: one request its worker sent a while ago, one its worker has queued.
    let phorges = |object: &str| NewRequest::new(&hook, object).not_handed_over();
    let sent = db
        .insert_request(
            &phorges("PHID-TASK-sentbyphorge").attempted(
                RequestStatus::Sent,
                RequestResult::Okay,
                now - 120,
            ),
            now - 120,
        )
        .await
        .unwrap();
    let queued = db
        .insert_request(&phorges("PHID-TASK-queuedforphorge"), now - 60)
        .await
        .unwrap();
    let before = (
        db.read_request(sent).await.unwrap(),
        db.read_request(queued).await.unwrap(),
    );
    let service = Service::start(db.namespace(), &[]);

    eventually(
        Duration::from_secs(30),
        "readiness says nothing is handed over",
        || async { readiness(&service).0 == 503 },
    )
    .await;
    assert_eq!(
        readiness(&service).1,
        serde_json::json!({"status": "unavailable", "reason": NOTHING_HANDED_OVER})
    );
    // Today's code sends the queued row here, beside Phorge's worker.
    service.wait_polls(5).await;
    assert_eq!(receiver.count(), 0);
    assert_eq!(
        (
            db.read_request(sent).await.unwrap(),
            db.read_request(queued).await.unwrap()
        ),
        before
    );
    let said = service.process.log_events("WEBHOOK_NOTHING_HANDED_OVER");
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0]["why"], NOTHING_HANDED_OVER);

    // Phorge is switched: the next request is handed over, delivered once, and the service
    // is ready again; Phorge's own queued row is still left alone.
    let ours = db
        .insert_request(&NewRequest::new(&hook, "PHID-TASK-handedover"), unix_now())
        .await
        .unwrap();
    let requests = receiver.wait_for(1, Duration::from_secs(30));
    assert_eq!(requests[0].object_phid(), "PHID-TASK-handedover");
    eventually(Duration::from_secs(30), "ready again", || async {
        readiness(&service).0 == 200
    })
    .await;
    service.wait_polls(5).await;
    assert_eq!(receiver.count(), 1);
    assert_eq!(
        db.read_request(ours).await.unwrap().status,
        RequestStatus::Sent
    );
    assert_eq!(db.read_request(queued).await.unwrap(), before.1);
    assert_eq!(service.process.log_events("WEBHOOK_HANDED_OVER").len(), 1);
    assert_eq!(
        service
            .process
            .log_events("WEBHOOK_NOTHING_HANDED_OVER")
            .len(),
        1
    );
    db.drop_database().await;
}

#[test]
fn each_change_is_said_once_and_only_evidence_changes_it() {
    const T0: u64 = 1_700_000_000;
    let log = CapturedLog::default();
    let watch = HandoverWatch::new(log.logger());
    let unmarked = |created| HandoverSample {
        newest_created: Some(created),
        any_marked: false,
    };
    let marked = HandoverSample {
        newest_created: Some(T0),
        any_marked: true,
    };

    // A new install (no rows) and a row Phorge may not have marked yet tell nothing.
    watch.observe(HandoverSample::default(), T0);
    watch.observe(unmarked(T0 - GRACE_SEC + 1), T0);
    assert_eq!(watch.state(), Handover::Unknown);
    assert_eq!(watch.not_ready_reason(), None);

    // The newest row is Phorge's own and old enough: said once, however often sampled.
    for tick in 0..10 {
        watch.observe(unmarked(T0 - GRACE_SEC), T0 + tick);
    }
    assert_eq!(watch.state(), Handover::NothingHandedOver);
    assert_eq!(watch.not_ready_reason(), Some(NOTHING_HANDED_OVER));
    // A younger unmarked row, an empty sample: no flapping back.
    watch.observe(unmarked(T0 + 10), T0 + 11);
    watch.observe(HandoverSample::default(), T0 + 12);
    assert_eq!(watch.state(), Handover::NothingHandedOver);

    // Phorge starts handing over: ready, said once.
    for tick in 0..10 {
        watch.observe(marked, T0 + 20 + tick);
    }
    assert_eq!(watch.state(), Handover::HandedOver);
    assert_eq!(watch.not_ready_reason(), None);
    // ... and stops (rolled back, or a host lost the patch): said again, once.
    watch.observe(unmarked(T0 + 100), T0 + 100 + GRACE_SEC);
    watch.observe(unmarked(T0 + 100), T0 + 101 + GRACE_SEC);
    assert_eq!(
        log.events(),
        [
            "WEBHOOK_NOTHING_HANDED_OVER",
            "WEBHOOK_HANDED_OVER",
            "WEBHOOK_NOTHING_HANDED_OVER"
        ]
    );
}
