//! Rows that cannot be used as stored (bytes that are not UTF-8, values MySQL refuses to
//! convert), and a poll loop that dies: one bad row must never stop, starve or spin the
//! dispatcher, and a dead poll loop must never hide behind a green `/readyz`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{enabled_hook, queue, Harness};
use gorge_claim::testdb::{with_marker, RequestStatus, TestDb};
use gorge_service::Shutdown;
use gorge_testkit::{CapturedLog, Receiver};
use gorge_webhook::clock::ManualUnixClock;
use gorge_webhook::metrics::Metrics;
use gorge_webhook::outcome::InvalidRowReason;
use gorge_webhook::service::{readiness, supervise_poll_loop, PollHealth};
use mysql_async::prelude::Queryable;

const T0: u64 = 1_700_000_000;
const NEVER: &str = r#"{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[]}"#;

/// `status`, `lastRequestResult`, `lastRequestEpoch`, `properties` of row `id`.
async fn state_of(db: &TestDb, id: u64) -> (String, String, u64, String) {
    let mut conn = db.conn().await.unwrap();
    conn.exec_first(
        "SELECT status, lastRequestResult, lastRequestEpoch, properties \
         FROM herald_webhookrequest WHERE id = ?",
        (id,),
    )
    .await
    .unwrap()
    .expect("row exists")
}

#[tokio::test]
async fn a_phid_that_is_not_utf8_fails_its_row_and_the_next_row_is_delivered() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    let mut conn = db.conn().await.unwrap();
    conn.exec_drop(
        "INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status, properties, \
         lastRequestResult, lastRequestEpoch, dateCreated, dateModified) \
         VALUES (X'504849442DFF', ?, 'PHID-TASK-x', 'queued', ?, 'none', 0, ?, ?)",
        (&hook, with_marker(NEVER), T0, T0),
    )
    .await
    .unwrap();
    let bad = conn.last_insert_id().unwrap();
    drop(conn);
    let good = queue(&db, &hook, "PHID-TASK-y", NEVER, T0).await;
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build(&db, &clock, &log);

    // Today's code panics converting the row inside the poll.
    let round = dispatcher.run_round().await.unwrap();
    assert_eq!((round.fetched, round.broken, round.started), (2, 1, 1));
    receiver.wait_for(1, Duration::from_secs(10));
    assert_eq!(
        db.read_request(good).await.unwrap().status,
        RequestStatus::Sent
    );
    assert_eq!(
        state_of(&db, bad).await,
        (
            "failed".to_string(),
            "none".to_string(),
            0,
            with_marker(
                r#"{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[],"errorType":"hook","errorCode":"invalid-row"}"#
            )
        )
    );
    assert_eq!(metrics.invalid_rows(InvalidRowReason::Unreadable), 1);
    assert_eq!(log.count("WEBHOOK_INVALID_ROW"), 1);
    // Nothing more to do, nothing more logged.
    let round = dispatcher.run_round().await.unwrap();
    assert_eq!(round.fetched, 0);
    assert_eq!(receiver.count(), 1);
    assert_eq!(log.count("WEBHOOK_POLL_ERROR"), 0);
    db.drop_database().await;
}

#[tokio::test]
async fn a_poison_row_is_failed_after_a_few_attempts_and_its_hook_keeps_delivering() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    // `GREATEST(dateModified + 1, …)` is out of range for INT UNSIGNED: the claim UPDATE
    // is rejected every time.
    let poison = queue(&db, &hook, "PHID-TASK-x", NEVER, u64::from(u32::MAX)).await;
    let mut later = Vec::new();
    for _ in 0..2 {
        later.push(queue(&db, &hook, "PHID-TASK-y", NEVER, T0).await);
    }
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build(&db, &clock, &log);

    for _ in 0..8 {
        dispatcher.run_round().await.unwrap();
    }
    let (status, result, epoch, properties) = state_of(&db, poison).await;
    assert_eq!(
        (status.as_str(), result.as_str(), epoch),
        ("failed", "none", 0)
    );
    assert!(
        properties.ends_with(r#""errorType":"hook","errorCode":"invalid-row"}"#),
        "{properties}"
    );
    for id in later {
        assert_eq!(
            db.read_request(id).await.unwrap().status,
            RequestStatus::Sent
        );
    }
    assert_eq!(receiver.count(), 2, "the poison row itself is never POSTed");
    assert_eq!(metrics.invalid_rows(InvalidRowReason::Rejected), 1);
    assert_eq!(
        log.count("WEBHOOK_ROW_REJECTED"),
        1,
        "logged once, not per poll"
    );
    assert_eq!(log.count("WEBHOOK_INVALID_ROW"), 1);
    assert_eq!(log.count("WEBHOOK_POLL_ERROR"), 0);
    db.drop_database().await;
}

/// The supervisor `service::run` puts around the poll loop: a loop that panics or returns
/// outside a shutdown marks the service dead (readiness fails) and triggers the shutdown
/// whose end `service::run` turns into exit code 3.
#[tokio::test]
async fn a_poll_loop_that_ends_fails_readiness_and_shuts_the_process_down() {
    let db = TestDb::create().await.unwrap();
    // Readiness reads a dispatcher's progress; this one has just made some.
    let clock = ManualUnixClock::new(T0);
    let (dispatcher, _) = Harness::default().build(&db, &clock, &CapturedLog::default());
    for ending in ["panic", "return"] {
        let log = CapturedLog::default();
        let metrics = Metrics::unregistered();
        let health = Arc::new(PollHealth::default());
        let shutdown = Shutdown::new();
        let polling = tokio::spawn(async move {
            if ending == "panic" {
                panic!("poll loop bug");
            }
        });
        supervise_poll_loop(
            polling,
            shutdown.clone(),
            Arc::clone(&health),
            metrics.poll_loop_up.clone(),
            log.logger(),
        )
        .await;
        assert!(health.is_dead(), "{ending}");
        assert!(shutdown.is_triggered(), "{ending}: the process must exit");
        assert_eq!(log.count("WEBHOOK_POLL_LOOP_DIED"), 1);
        assert_eq!(metrics.poll_loop_up.get(), 0);
        let ready = readiness(
            db.store(),
            Arc::clone(&health),
            Arc::clone(&dispatcher),
            Duration::from_secs(60),
            Default::default(),
        );
        let reason = ready().await.unwrap_err();
        assert!(reason.contains("poll loop"), "{reason}");
    }

    // Ending because of a shutdown is the normal drain, not a death.
    let log = CapturedLog::default();
    let health = Arc::new(PollHealth::default());
    let shutdown = Shutdown::new();
    shutdown.trigger();
    let polling = tokio::spawn(async {});
    supervise_poll_loop(
        polling,
        shutdown,
        Arc::clone(&health),
        Metrics::unregistered().poll_loop_up.clone(),
        log.logger(),
    )
    .await;
    assert!(!health.is_dead());
    assert_eq!(log.count("WEBHOOK_POLL_LOOP_DIED"), 0);
    let ready = readiness(
        db.store(),
        health,
        dispatcher,
        Duration::from_secs(60),
        Default::default(),
    );
    assert_eq!(ready().await, Ok(()));
    db.drop_database().await;
}

/// A database error in one row's steps (here the claim UPDATE, refused by a trigger; the
/// hook, breaker and object reads are the round's own since the round preloads them) is
/// that row's, not the poll's: `WEBHOOK_ROW_DB_ERROR`, logged once however many rounds meet
/// it, the row left queued and delivered once the statement works again. `WEBHOOK_POLL_ERROR`
/// is kept for polls that fail and back off.
#[tokio::test]
async fn a_database_error_of_one_row_is_the_rows_not_a_poll_error() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    let id = queue(&db, &hook, "PHID-TASK-x", NEVER, T0).await;
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build(&db, &clock, &log);
    let mut conn = db.conn().await.unwrap();
    // SIGNAL is error 1644: a database error, not one of the row's data (which would fail it).
    conn.query_drop(
        "CREATE TRIGGER refuse_claims BEFORE UPDATE ON herald_webhookrequest \
         FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'claims refused'",
    )
    .await
    .unwrap();

    for _ in 0..3 {
        let round = dispatcher.run_round().await.unwrap();
        assert_eq!(round.started, 1);
    }
    assert_eq!(log.count("WEBHOOK_ROW_DB_ERROR"), 1, "once, not per round");
    assert_eq!(log.count("WEBHOOK_POLL_ERROR"), 0);
    assert_eq!(metrics.poll_errors.get(), 3);
    assert_eq!(
        db.read_request(id).await.unwrap().status,
        RequestStatus::Queued
    );

    conn.query_drop("DROP TRIGGER refuse_claims").await.unwrap();
    dispatcher.run_round().await.unwrap();
    receiver.wait_for(1, Duration::from_secs(10));
    assert_eq!(
        db.read_request(id).await.unwrap().status,
        RequestStatus::Sent
    );
    drop(conn);
    db.drop_database().await;
}

/// Issue 21 item 9: a row whose `properties` is within a few bytes of the server's
/// `max_allowed_packet` cannot travel in a result row. It is failed (`invalid-row`, counted,
/// one log line) without its text ever being fetched, and every other row is delivered; the
/// old code failed every poll with "Packet is larger than max_allowed_packet".
#[tokio::test]
async fn a_row_near_max_allowed_packet_is_failed_unread_and_the_rest_flow() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    let before = queue(&db, &hook, "PHID-TASK-a", NEVER, T0).await;
    let mut conn = db.conn().await.unwrap();
    // Built by the server (a statement carrying it would not fit the packet either).
    conn.exec_drop(
        r#"INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status, properties,
         lastRequestResult, lastRequestEpoch, dateCreated, dateModified)
         SELECT 'PHID-HWBR-oversized', ?, 'PHID-TASK-x', 'queued',
           CONCAT(?, REPEAT('x', @@max_allowed_packet - 16 - ?), '"]}'),
           'none', 0, ?, ?"#,
        (
            &hook,
            with_marker(r#"{"retry":"never","triggerPHIDs":[],"transactionPHIDs":[""#),
            with_marker(r#"{"retry":"never","triggerPHIDs":[],"transactionPHIDs":[""#).len() + 3,
            T0,
            T0,
        ),
    )
    .await
    .unwrap();
    let oversized = conn.last_insert_id().unwrap();
    let (length, packet): (u64, u64) = conn
        .exec_first(
            "SELECT LENGTH(properties), @@max_allowed_packet FROM herald_webhookrequest WHERE id = ?",
            (oversized,),
        )
        .await
        .unwrap()
        .unwrap();
    // With the row's other columns, more than a packet: the row cannot be fetched at all.
    assert_eq!(length, packet - 16);
    drop(conn);
    let after = queue(&db, &hook, "PHID-TASK-b", NEVER, T0).await;
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build(&db, &clock, &log);

    for _ in 0..3 {
        dispatcher
            .run_round()
            .await
            .expect("one row never fails a poll");
    }
    receiver.wait_for(2, Duration::from_secs(10));
    for id in [before, after] {
        assert_eq!(
            db.read_request(id).await.unwrap().status,
            RequestStatus::Sent
        );
    }
    assert_eq!(
        state_of(&db, oversized).await,
        (
            "failed".to_string(),
            "none".to_string(),
            0,
            with_marker(r#"{"errorType":"hook","errorCode":"invalid-row"}"#)
        )
    );
    assert_eq!(
        receiver.count(),
        2,
        "the oversized row itself is never POSTed"
    );
    assert_eq!(metrics.invalid_rows(InvalidRowReason::Oversized), 1);
    assert_eq!(log.count("WEBHOOK_INVALID_ROW"), 1);
    assert_eq!(log.count("WEBHOOK_POLL_ERROR"), 0);
    db.drop_database().await;
}
