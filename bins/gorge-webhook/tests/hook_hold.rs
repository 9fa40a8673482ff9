//! A hook's lock held across its consecutive rows (docs/webhook.md, "Per-hook lock"): one
//! GET_LOCK for a run of the hook's rows, ended by a failure, by its bound (32 rows or 1 s,
//! after which the hook rests as long as it was held), and never keeping the lock from
//! Phorge's worker once the run is over.

mod common;

use std::sync::Arc;

use common::{enabled_hook, queue, take_hook_lock, Harness};
use gorge_claim::testdb::{server_opts, RequestStatus, TestDb};
use gorge_testkit::{CapturedLog, Receiver, Reply};
use gorge_webhook::clock::ManualUnixClock;
use gorge_webhook::dispatcher::Dispatcher;
use gorge_webhook::metrics::Metrics;
use mysql_async::prelude::Queryable;

const T0: u64 = 1_700_000_000;
const NEVER: &str = r#"{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[]}"#;
const FOREVER: &str = r#"{"retry":"forever","transactionPHIDs":[],"triggerPHIDs":[]}"#;

/// Queues `n` rows of `hook`; returns their ids.
async fn queue_rows(db: &TestDb, hook: &str, n: usize, properties: &str) -> Vec<u64> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(queue(db, hook, &format!("PHID-TASK-{i}"), properties, T0).await);
    }
    ids
}

/// A dispatcher (on a clock at `T0 + 1`) over a fresh database whose hook posts to a
/// receiver answering `status`, with `n` rows of the hook queued with `properties`.
struct Setup {
    db: TestDb,
    receiver: Receiver,
    hook: String,
    ids: Vec<u64>,
    clock: ManualUnixClock,
    dispatcher: Arc<Dispatcher>,
    metrics: Metrics,
    _log: CapturedLog,
}

async fn setup(status: u16, n: usize, properties: &str) -> Setup {
    setup_with(Harness::default(), status, n, properties).await
}

/// [`setup`] with a dispatcher of other settings.
async fn setup_with(harness: Harness, status: u16, n: usize, properties: &str) -> Setup {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(status);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    let ids = queue_rows(&db, &hook, n, properties).await;
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = harness.build(&db, &clock, &log);
    Setup {
        db,
        receiver,
        hook,
        ids,
        clock,
        dispatcher,
        metrics,
        _log: log,
    }
}

/// Whether another session can take `hook`'s lock now (and gives it back at once).
async fn lock_is_free(db: &TestDb, hook: &str) -> bool {
    match take_hook_lock(db, hook).await {
        Some(conn) => {
            let _ = conn.disconnect().await;
            true
        }
        None => false,
    }
}

/// The old code took and released the lock per row and started one row per hook per round:
/// this round delivered 1 of the 5 rows.
#[tokio::test]
async fn one_round_delivers_a_hooks_consecutive_rows_under_one_lock() {
    let Setup {
        db,
        receiver,
        hook,
        ids,
        dispatcher,
        metrics,
        ..
    } = setup(200, 5, NEVER).await;

    let round = dispatcher.run_round().await.unwrap();
    assert_eq!(
        round.started, 1,
        "one row of the hook starts from the round"
    );
    assert_eq!(receiver.count(), 5);
    assert_eq!(metrics.held_rows.get(), 4);
    // In id order, one at a time.
    let posted: Vec<String> = receiver
        .requests()
        .iter()
        .map(|r| r.object_phid())
        .collect();
    let expected: Vec<String> = (0..5).map(|i| format!("PHID-TASK-{i}")).collect();
    assert_eq!(posted, expected);
    for id in ids {
        assert_eq!(db.read_request(id).await.unwrap().status.as_str(), "sent");
    }
    assert!(lock_is_free(&db, &hook).await, "released after the run");
    assert_eq!(metrics.hold_bounds.get(), 0);
}

/// A failed attempt ends the run: the next row waits for a poll round (and its breaker
/// check). Old code: the same, one row per round; this pins that holding changes nothing
/// for failing hooks.
#[tokio::test]
async fn a_failure_ends_the_run() {
    let Setup {
        db,
        receiver,
        hook,
        dispatcher,
        metrics,
        ..
    } = setup(500, 3, FOREVER).await;

    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 1);
    assert_eq!(metrics.held_rows.get(), 0);
    assert!(lock_is_free(&db, &hook).await);
}

/// The row bound: 32 rows under one taking of the lock, then it is released; the rest
/// comes with the next round. Old code: 1 row in the first round.
#[tokio::test]
async fn a_run_stops_at_its_row_bound() {
    let Setup {
        db,
        receiver,
        hook,
        dispatcher,
        metrics,
        ..
    } = setup(200, 40, NEVER).await;

    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 32);
    assert_eq!(metrics.hold_bounds.get(), 1);
    assert!(lock_is_free(&db, &hook).await);
    // The clock did not move while the lock was held: the rest is 0 and the hook is due.
    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 40);
    assert_eq!(db.count_requests(RequestStatus::Queued).await.unwrap(), 0);
}

/// The time bound: each POST takes 300 ms of clock time, so the run stops once the lock
/// has been held 1 s, and the hook then rests as long (its rows are not even fetched)
/// before it is taken again. Old code: 1 row in the first round, and the second round
/// delivered the next row at once.
#[tokio::test]
async fn a_run_stops_at_its_time_bound_and_the_hook_rests_as_long() {
    let Setup {
        db,
        receiver,
        hook,
        clock,
        dispatcher,
        metrics,
        ..
    } = setup(200, 10, NEVER).await;
    let posting = clock.clone();
    receiver.set_behaviour(move |_, _| {
        posting.advance_ms(300);
        Reply::Status(200)
    });

    dispatcher.run_round().await.unwrap();
    // Rows start at 0, 300, 600 and 900 ms of holding; at 1 200 ms the bound is passed.
    assert_eq!(receiver.count(), 4);
    assert_eq!(metrics.hold_bounds.get(), 1);
    assert!(lock_is_free(&db, &hook).await);

    let round = dispatcher.run_round().await.unwrap();
    assert_eq!((round.fetched, receiver.count()), (0, 4), "resting");
    clock.advance_ms(1_200);
    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 8);
}

/// A backlog of one hook goes on as soon as the rest after its bound ends, not a poll
/// interval later. Before, the poll loop, finding only a resting hook, slept the whole poll
/// interval after every bound: one hook drained 32 rows per second (`gorge-bench webhook
/// --hooks 1`: 1 000 rows in 31.5 s), and this test waited the 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hooks_backlog_goes_on_when_its_rest_ends_not_a_poll_interval_later() {
    let Setup {
        db,
        receiver,
        clock,
        dispatcher,
        metrics,
        ..
    } = setup_with(
        Harness {
            poll_interval: std::time::Duration::from_secs(30),
            ..Harness::default()
        },
        200,
        40,
        NEVER,
    )
    .await;
    // Each POST takes 10 ms of clock: the hold stops at its bound of 32 rows, and the hook
    // then rests for the 320 ms of clock it held the lock; the last 8 rows are one hold.
    let posting = clock.clone();
    receiver.set_behaviour(move |_, _| {
        posting.advance_ms(10);
        Reply::Status(200)
    });
    let shutdown = gorge_service::Shutdown::new();
    let running = tokio::spawn(dispatcher.clone().run(shutdown.clone()));

    gorge_testkit::eventually(std::time::Duration::from_secs(10), "a bound", || async {
        metrics.hold_bounds.get() >= 1
    })
    .await;
    assert_eq!(receiver.count(), 32, "the bound stopped the hold");
    // Polls so far: the first (it started the hold) and one that found only the busy hook.
    // The third comes when the hold's slot frees: it finds the hook resting (the clock has
    // not moved), and the loop goes to sleep. Only then does the rest end; otherwise that
    // poll could already find the rest over and the test would pass whatever the loop does.
    gorge_testkit::eventually(
        std::time::Duration::from_secs(10),
        "the poll that finds the hook resting",
        || async { metrics.polls.get() >= 3 },
    )
    .await;
    assert_eq!(receiver.count(), 32, "still resting");
    // The rest is over (on the injected clock; the loop reads it when it wakes).
    clock.advance_ms(5_000);
    gorge_testkit::eventually(
        std::time::Duration::from_secs(10),
        "the rest of the backlog, well within the 30 s poll interval",
        || async { receiver.count() >= 40 },
    )
    .await;
    shutdown.trigger();
    running.await.unwrap();
    assert_eq!(db.count_requests(RequestStatus::Queued).await.unwrap(), 0);
}

/// A lock Phorge's worker (here: another session) holds is not taken at all, and rows of
/// the hook are left alone, whether or not a run would follow.
#[tokio::test]
async fn a_lock_held_elsewhere_starts_no_run() {
    let Setup {
        db,
        receiver,
        hook,
        clock,
        dispatcher,
        ..
    } = setup(200, 3, NEVER).await;
    let name = gorge_claim::hook_lock_name(db.namespace(), &hook);
    let mut phorge = take_hook_lock(&db, &hook).await.expect("the lock is free");

    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 0);
    phorge
        .exec_drop("DO RELEASE_LOCK(?)", (&name,))
        .await
        .unwrap();
    clock.advance_sec(1);
    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 3);
}

/// The next rows are claimed together; a hold that ends before delivering all of them (the
/// second POST fails) gives the rest back fresh, and the next round delivers them. Old code:
/// no batch claim (1 row per round; nothing to give back).
#[tokio::test]
async fn rows_claimed_together_and_not_delivered_are_given_back() {
    let Setup {
        db,
        receiver,
        hook,
        ids,
        dispatcher,
        metrics,
        ..
    } = setup(200, 5, NEVER).await;
    receiver.set_behaviour(|_, index| Reply::Status(if index == 1 { 500 } else { 200 }));

    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 2);
    assert_eq!(metrics.claims_given_back.get(), 3);
    for &id in &ids[2..] {
        let row = db.read_request(id).await.unwrap();
        assert_eq!(
            (row.status.as_str(), row.date_modified),
            ("queued", row.date_created),
            "fresh again"
        );
    }
    assert!(lock_is_free(&db, &hook).await);
    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 5);
    assert_eq!(db.count_requests(RequestStatus::Queued).await.unwrap(), 0);
}

/// Ends the session holding `name` from a thread of its own (the receiver's behaviour is
/// synchronous): as a network path dying under a held lock would, the server frees the lock.
fn kill_lock_holder(name: String) {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut conn = mysql_async::Conn::new(server_opts()).await.unwrap();
            let holder: Option<Option<u64>> = conn
                .exec_first("SELECT IS_USED_LOCK(?)", (&name,))
                .await
                .unwrap();
            let id = holder.flatten().expect("the hold's session holds the lock");
            conn.query_drop(format!("KILL CONNECTION {id}"))
                .await
                .unwrap();
            let _ = conn.disconnect().await;
        });
    })
    .join()
    .unwrap();
}

/// The lock's session dies during the hold's second POST: that row's result is still
/// written (through another connection), and the hold stops there, before the hook's next
/// POST, giving its other claimed rows back. The commit before this one went on POSTing
/// all 5 rows under the lost lock.
#[tokio::test]
async fn a_hold_stops_when_its_lock_session_dies() {
    let Setup {
        db,
        receiver,
        hook,
        ids,
        dispatcher,
        metrics,
        ..
    } = setup(200, 5, NEVER).await;
    let name = gorge_claim::hook_lock_name(db.namespace(), &hook);
    receiver.set_behaviour(move |_, index| {
        if index == 1 {
            kill_lock_holder(name.clone());
        }
        Reply::Status(200)
    });

    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 2);
    assert_eq!(
        db.read_request(ids[1]).await.unwrap().status.as_str(),
        "sent"
    );
    assert_eq!(metrics.claims_given_back.get(), 3);
    assert!(lock_is_free(&db, &hook).await);
    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 5);
    assert_eq!(db.count_requests(RequestStatus::Queued).await.unwrap(), 0);
}
