//! Retry backoff and the per-hook circuit breaker with an injected clock, and hooks that must be skipped never hiding the rows of other hooks.

mod common;

use common::{enabled_hook, queue, Harness};
use gorge_claim::testdb::{HookStatus, NewRequest, RequestStatus, TestDb};
use gorge_claim::ClaimTiming;
use gorge_testkit::{CapturedLog, Receiver};
use gorge_webhook::clock::ManualUnixClock;

const T0: u64 = 1_700_000_000;
const FOREVER: &str = r#"{"retry":"forever","transactionPHIDs":[],"triggerPHIDs":[]}"#;
const NEVER: &str = r#"{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[]}"#;

#[tokio::test]
async fn a_backoff_below_the_lease_retries_after_the_backoff() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(500);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    let id = queue(&db, &hook, "PHID-TASK-x", FOREVER, T0).await;
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, _) = Harness {
        timing: ClaimTiming {
            lease_sec: 30,
            retry_backoff_sec: 10,
        },
        ..Harness::default()
    }
    .build(&db, &clock, &log);

    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 1);
    let row = db.read_request(id).await.unwrap();
    assert_eq!(
        (
            row.status.as_str(),
            row.last_request_result.as_str(),
            row.last_request_epoch
        ),
        ("queued", "fail", T0 + 1)
    );

    // Inside the backoff: not a candidate.
    clock.set_sec(T0 + 1 + 9);
    assert_eq!(dispatcher.run_round().await.unwrap().fetched, 0);
    assert_eq!(receiver.count(), 1);

    // The backoff (10 s) has passed; the lease (30 s) has not, and must not matter.
    clock.set_sec(T0 + 1 + 10);
    assert_eq!(dispatcher.run_round().await.unwrap().started, 1);
    assert_eq!(receiver.count(), 2);
    let row = db.read_request(id).await.unwrap();
    assert_eq!(row.last_request_epoch, T0 + 11);

    // A success ends the retries.
    receiver.set_behaviour(|_, _| gorge_testkit::Reply::Status(200));
    clock.set_sec(T0 + 21);
    dispatcher.run_round().await.unwrap();
    let row = db.read_request(id).await.unwrap();
    assert_eq!(
        (row.status.as_str(), row.last_request_epoch),
        ("sent", T0 + 21)
    );
    db.drop_database().await;
}

#[tokio::test]
async fn breaker_opens_at_threshold_and_closes_as_the_window_slides_logging_once_each() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(500);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    for _ in 0..10 {
        queue(&db, &hook, "PHID-TASK-x", NEVER, T0).await;
    }
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build(&db, &clock, &log);

    // Ten failures at T0 + 1 (one delivery per hook per round).
    for _ in 0..10 {
        assert_eq!(dispatcher.run_round().await.unwrap().started, 1);
    }
    assert_eq!(receiver.count(), 10);
    assert_eq!(
        log.count("WEBHOOK_BREAKER_OPEN"),
        0,
        "9 failures do not open it"
    );

    let next = queue(&db, &hook, "PHID-TASK-y", NEVER, T0 + 2).await;
    clock.set_sec(T0 + 2);
    for _ in 0..3 {
        dispatcher.run_round().await.unwrap();
    }
    assert_eq!(
        receiver.count(),
        10,
        "the breaker holds the eleventh request back"
    );
    let row = db.read_request(next).await.unwrap();
    assert_eq!(
        (row.status.as_str(), row.date_modified),
        ("queued", T0 + 2),
        "a skipped row is untouched"
    );
    assert_eq!(
        log.count("WEBHOOK_BREAKER_OPEN"),
        1,
        "one line per state change"
    );
    assert_eq!(metrics.breaker_open_hooks.get(), 1);

    // Still open one second before the failures leave the 300 s window.
    clock.set_sec(T0 + 1 + 299);
    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 10);

    // The window slid past the failures and the hook's rest (5 s of clock time after the
    // last check) is over: closed, delivered, logged once.
    receiver.set_behaviour(|_, _| gorge_testkit::Reply::Status(200));
    clock.set_sec(T0 + 1 + 299 + 5);
    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 11);
    let row = db.read_request(next).await.unwrap();
    assert_eq!(row.status, RequestStatus::Sent);
    assert_eq!(log.count("WEBHOOK_BREAKER_OPEN"), 1);
    assert_eq!(log.count("WEBHOOK_BREAKER_CLOSED"), 1);
    assert_eq!(metrics.breaker_open_hooks.get(), 0);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_hooks_backlog_does_not_hide_other_hooks_rows() {
    let db = TestDb::create().await.unwrap();
    let broken = db.tagged_hook_phid("a");
    let healthy = db.tagged_hook_phid("b");
    let receiver = Receiver::with(|request, _| {
        gorge_testkit::Reply::Status(if request.path == "/a" { 500 } else { 200 })
    });
    db.insert_hook(&broken, &receiver.url("/a"), HookStatus::Enabled, "k")
        .await
        .unwrap();
    db.insert_hook(&healthy, &receiver.url("/b"), HookStatus::Enabled, "k")
        .await
        .unwrap();
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    // One slot: a batch is 4 candidates, a tenth of the broken backlog below.
    let (dispatcher, _) = Harness {
        max_concurrent: 1,
        breaker_threshold: 2,
        ..Harness::default()
    }
    .build(&db, &clock, &log);
    for _ in 0..2 {
        queue(&db, &broken, "PHID-TASK-x", NEVER, T0).await;
        dispatcher.run_round().await.unwrap();
    }
    assert_eq!(receiver.count(), 2);
    // A backlog of the broken hook at the head of the queue, then one healthy row.
    for _ in 0..40 {
        queue(&db, &broken, "PHID-TASK-x", FOREVER, T0).await;
    }
    let healthy_row = db
        .insert_request(&NewRequest::new(&healthy, "PHID-TASK-y"), T0)
        .await
        .unwrap();

    let shutdown = gorge_service::Shutdown::new();
    let running = tokio::spawn(dispatcher.clone().run(shutdown.clone()));
    gorge_testkit::eventually(
        std::time::Duration::from_secs(20),
        "healthy row sent",
        || async { db.read_request(healthy_row).await.unwrap().status == RequestStatus::Sent },
    )
    .await;
    shutdown.trigger();
    running.await.unwrap();
    assert_eq!(
        receiver.count(),
        3,
        "the broken hook got nothing while its breaker was open"
    );
    assert_eq!(log.count("WEBHOOK_BREAKER_OPEN"), 1);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_hooks_backlog_does_not_hide_other_hooks_rows() {
    let db = TestDb::create().await.unwrap();
    let slow = db.tagged_hook_phid("a");
    let healthy = db.tagged_hook_phid("b");
    let receiver = Receiver::with(|request, _| {
        if request.path == "/slow" {
            gorge_testkit::Reply::Hold(200)
        } else {
            gorge_testkit::Reply::Status(200)
        }
    });
    db.insert_hook(&slow, &receiver.url("/slow"), HookStatus::Enabled, "k")
        .await
        .unwrap();
    db.insert_hook(&healthy, &receiver.url("/b"), HookStatus::Enabled, "k")
        .await
        .unwrap();
    // Two slots, a batch of 8: the slow hook's backlog alone fills it.
    for _ in 0..20 {
        db.insert_request(&NewRequest::new(&slow, "PHID-TASK-x"), T0)
            .await
            .unwrap();
    }
    let healthy_row = db
        .insert_request(&NewRequest::new(&healthy, "PHID-TASK-y"), T0)
        .await
        .unwrap();
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, _) = Harness {
        max_concurrent: 2,
        ..Harness::default()
    }
    .build(&db, &clock, &log);

    let shutdown = gorge_service::Shutdown::new();
    let running = tokio::spawn(dispatcher.clone().run(shutdown.clone()));
    // The slow hook's first POST is held: the hook stays busy in this process until release.
    gorge_testkit::eventually(
        std::time::Duration::from_secs(20),
        "healthy row sent while the slow hook is busy",
        || async { db.read_request(healthy_row).await.unwrap().status == RequestStatus::Sent },
    )
    .await;
    // The slow hook's first POST may still be on its way (its row went through the same
    // steps in parallel): wait for it, then check that nothing else of it came.
    let waiting = receiver.clone();
    tokio::task::spawn_blocking(move || waiting.wait_for(2, std::time::Duration::from_secs(20)))
        .await
        .unwrap();
    let mut paths: Vec<String> = receiver.requests().into_iter().map(|r| r.path).collect();
    paths.sort();
    assert_eq!(
        paths,
        ["/b", "/slow"],
        "one slow POST held, and the healthy one"
    );
    receiver.release();
    shutdown.trigger();
    running.await.unwrap();
    db.drop_database().await;
}
