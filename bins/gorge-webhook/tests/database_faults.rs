//! The database misbehaving under the dispatcher (dead connections, pool bounds, an outage
//! shorter than the claim's lease), through a TCP proxy that can cut, refuse or silently
//! black-hole connections.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{admin_sql, enabled_hook, queue, take_hook_lock, DbProxy, Harness};
use gorge_claim::testdb::{server_opts, HookStatus, RequestStatus, TestDb};
use gorge_claim::{ClaimStore, StoreOptions};
use gorge_testkit::{CapturedLog, Receiver, Reply};
use gorge_webhook::clock::ManualUnixClock;
use mysql_async::prelude::Queryable;

const T0: u64 = 1_700_000_000;
const NEVER: &str = r#"{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[]}"#;

fn options(query_timeout: Duration) -> StoreOptions {
    StoreOptions {
        query_timeout,
        max_connections: 2,
        max_lock_connections: 3,
        idle_timeout: Duration::from_secs(1),
        // Long: where a test needs locks freed, something else must free them.
        lock_session_timeout: Duration::from_secs(600),
    }
}

/// W3: connections that go silent without a reset (a fail-over behind NAT) while new ones
/// work. Every statement has a timeout and a timed-out connection is closed, so delivery
/// resumes on fresh connections; without timeouts the next poll hangs forever.
/// Connections `user` has open on the server now.
async fn connections_of(admin: &mut mysql_async::Conn, user: &str) -> u64 {
    let count: Option<u64> = admin
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = ?",
            (user,),
        )
        .await
        .unwrap();
    count.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silently_dead_connections_are_timed_out_and_replaced() {
    let db = TestDb::create().await.unwrap();
    let proxy = DbProxy::start().await;
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    let store =
        ClaimStore::with_options(proxy.opts(), db.database(), options(Duration::from_secs(1)));
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build_with_store(store, &clock, &log);
    let first = queue(&db, &hook, "PHID-TASK-a", NEVER, T0).await;
    dispatcher.run_round().await.unwrap();
    assert_eq!(
        db.read_request(first).await.unwrap().status,
        RequestStatus::Sent
    );

    proxy.blackhole_existing();
    let mut later = Vec::new();
    for object in ["PHID-TASK-b", "PHID-TASK-c"] {
        later.push(queue(&db, &hook, object, NEVER, T0).await);
    }
    let drained = tokio::time::timeout(Duration::from_secs(60), async {
        for _ in 0..20 {
            // Rounds that time out are errors; the next round has fresh connections.
            let _ = dispatcher.run_round().await;
            let mut all_sent = true;
            for id in &later {
                all_sent &= db.read_request(*id).await.unwrap().status == RequestStatus::Sent;
            }
            if all_sent {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        drained,
        Ok(true),
        "rows behind dead connections were never delivered"
    );
    assert!(metrics.db_timeouts.get() >= 1);
    assert_eq!(receiver.count(), 3);
    db.drop_database().await;
}

/// W5: an outage shorter than the lease, starting while a POST is in flight. The result
/// write keeps retrying while the lease protects the row, so the row is written once the
/// database is back and is never delivered again (the old code gave up after 4.2 s and the
/// row was POSTed a second time after the lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_shorter_than_the_lease_duplicates_nothing() {
    let db = TestDb::create().await.unwrap();
    let proxy = DbProxy::start().await;
    let receiver = Receiver::with(|_, _| Reply::Hold(200));
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    let id = queue(&db, &hook, "PHID-TASK-a", NEVER, T0).await;
    let store =
        ClaimStore::with_options(proxy.opts(), db.database(), options(Duration::from_secs(1)));
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build_with_store(store, &clock, &log);
    let round = {
        let dispatcher = Arc::clone(&dispatcher);
        tokio::spawn(async move { dispatcher.run_round().await })
    };
    let waiting = receiver.clone();
    tokio::task::spawn_blocking(move || waiting.wait_for(1, Duration::from_secs(30)))
        .await
        .unwrap();
    proxy.outage();
    receiver.release();
    // More retries than the old code made (it gave up after 0.2 + 1 + 3 s); the lease (30 s
    // of clock time) does not move meanwhile.
    gorge_testkit::eventually(
        Duration::from_secs(30),
        "five result-write retries",
        || async { metrics.result_write_retries.get() >= 5 },
    )
    .await;
    assert_eq!(
        db.read_request(id).await.unwrap().status,
        RequestStatus::Queued
    );
    proxy.restore();
    tokio::time::timeout(Duration::from_secs(30), round)
        .await
        .expect("the result write finishes once the database is back")
        .unwrap()
        .unwrap();
    assert_eq!(
        db.read_request(id).await.unwrap().status,
        RequestStatus::Sent
    );
    assert!(metrics.result_write_retries.get() >= 1);
    assert_eq!(
        log.count("WEBHOOK_RESULT_WRITE_RETRY"),
        1,
        "logged once per row"
    );

    // After the lease: nothing is delivered again.
    clock.advance_sec(31);
    dispatcher.run_round().await.unwrap();
    assert_eq!(receiver.count(), 1, "no duplicate POST");
    db.drop_database().await;
}

/// Found by `gorge-bench chaos` (seed 202): a result write commits but its answer is lost
/// (the database link drops the server's replies). The retry changes no row, as the row is
/// already written; it must recognise its own write rather than report the row taken over
/// by another process (`results_taken_over_total`, `WEBHOOK_RESULT_TAKEN_OVER`). Before,
/// the delivery was counted as taken over and never as delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_write_whose_answer_was_lost_is_recognised_as_landed() {
    let db = TestDb::create().await.unwrap();
    let proxy = DbProxy::start().await;
    let receiver = Receiver::with(|_, _| Reply::Hold(200));
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    let store =
        ClaimStore::with_options(proxy.opts(), db.database(), options(Duration::from_secs(1)));
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build_with_store(store, &clock, &log);
    // A first row, delivered as usual, leaves the pool's connection with the result write
    // prepared: a statement prepared anew would wait for the lost answer to its PREPARE and
    // never run.
    let mut ids = Vec::new();
    for (n, phid) in ["PHID-TASK-a", "PHID-TASK-b"].into_iter().enumerate() {
        let id = queue(&db, &hook, phid, NEVER, T0).await;
        ids.push(id);
        let round = {
            let dispatcher = Arc::clone(&dispatcher);
            tokio::spawn(async move { dispatcher.run_round().await })
        };
        let waiting = receiver.clone();
        tokio::task::spawn_blocking(move || waiting.wait_for(n + 1, Duration::from_secs(30)))
            .await
            .unwrap();
        if n == 1 {
            // Every connection open now runs what it is sent but never answers; connections
            // opened later work.
            proxy.deafen_existing();
        }
        receiver.release();
        tokio::time::timeout(Duration::from_secs(60), round)
            .await
            .expect("the round ends")
            .unwrap()
            .unwrap();
    }
    for id in ids {
        assert_eq!(
            db.read_request(id).await.unwrap().status,
            RequestStatus::Sent
        );
    }
    assert!(
        log.count("WEBHOOK_RESULT_WRITE_RETRY") >= 1,
        "the second row's result write was retried: {:?}",
        log.events()
    );
    assert_eq!(
        log.count("WEBHOOK_RESULT_TAKEN_OVER"),
        0,
        "its own write was reported as a take-over: {:?}",
        log.events()
    );
    assert_eq!(metrics.results_taken_over.get(), 0);
    assert_eq!(log.count("WEBHOOK_DELIVERED"), 2);
    assert_eq!(receiver.count(), 2);
    db.drop_database().await;
}

/// W4: a burst at full concurrency holds at most `max_connections + max_lock_connections`
/// connections (counted by the server, for a user of this test alone), the pool gauge says
/// the same, and idle connections are released afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_stay_within_the_pools_and_are_released_when_idle() {
    let db = TestDb::create().await.unwrap();
    let user = format!("{}u", db.namespace());
    admin_sql(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")).await;
    admin_sql(&format!(
        "GRANT SELECT, UPDATE ON `{}`.* TO '{user}'@'%'",
        db.database()
    ))
    .await;
    let receiver = Receiver::with(|_, _| Reply::Delay(Duration::from_millis(200), 200));
    let mut hooks = Vec::new();
    for i in 0..6 {
        let hook = db.tagged_hook_phid(i);
        db.insert_hook(
            &hook,
            &receiver.url(&format!("/{i}")),
            HookStatus::Enabled,
            "k",
        )
        .await
        .unwrap();
        for _ in 0..3 {
            queue(&db, &hook, "PHID-TASK-a", NEVER, T0).await;
        }
        hooks.push(hook);
    }
    let opts = mysql_async::OptsBuilder::from_opts(server_opts())
        .user(Some(user.clone()))
        .pass(Some("pw"))
        .prefer_socket(false);
    let store =
        ClaimStore::with_options(opts.into(), db.database(), options(Duration::from_secs(5)));
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness {
        max_concurrent: 3,
        ..Harness::default()
    }
    .build_with_store(store, &clock, &log);

    let peak = Arc::new(AtomicU64::new(0));
    let sampling = {
        let (peak, user) = (Arc::clone(&peak), user.clone());
        tokio::spawn(async move {
            let mut admin = mysql_async::Conn::new(server_opts()).await.unwrap();
            loop {
                peak.fetch_max(connections_of(&mut admin, &user).await, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    for _ in 0..10 {
        dispatcher.run_round().await.unwrap();
        dispatcher.sample().await.unwrap();
        assert!(metrics.pool_gauge("query", "open") <= 2);
        assert!(metrics.pool_gauge("lock", "open") <= 3);
    }
    assert_eq!(receiver.count(), 18);
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        (1..=5).contains(&peak),
        "{peak} connections held (pools of 2 + 3)"
    );

    // Idle: only the one query connection the pool keeps stays open.
    gorge_testkit::eventually(Duration::from_secs(15), "idle connections closed", || {
        let user = user.clone();
        async move {
            let mut admin = mysql_async::Conn::new(server_opts()).await.unwrap();
            let open = connections_of(&mut admin, &user).await;
            let _ = admin.disconnect().await;
            open <= 1
        }
    })
    .await;
    dispatcher.sample().await.unwrap();
    assert_eq!(metrics.pool_gauge("lock", "held"), 0);
    assert!(metrics.pool_gauge("lock", "open") == 0);
    sampling.abort();
    admin_sql(&format!("DROP USER '{user}'@'%'")).await;
    db.drop_database().await;
}

/// W3: readiness follows progress, not just a ping. A dispatcher that completed no poll
/// round and wrote no result for longer than the stall limit is not ready, even though a
/// fresh connection still answers.
#[tokio::test]
async fn readiness_fails_when_the_dispatcher_makes_no_progress() {
    let db = TestDb::create().await.unwrap();
    let clock = ManualUnixClock::new(T0);
    let log = CapturedLog::default();
    let (dispatcher, _) = Harness::default().build(&db, &clock, &log);
    let ready = gorge_webhook::service::readiness(
        db.store(),
        Arc::default(),
        Arc::clone(&dispatcher),
        Duration::from_secs(45),
        Default::default(),
    );
    assert_eq!(ready().await, Ok(()));
    clock.advance_sec(46);
    let reason = ready().await.unwrap_err();
    assert!(reason.contains("no poll round"), "{reason}");
    // One completed round is progress again.
    dispatcher.run_round().await.unwrap();
    assert_eq!(ready().await, Ok(()));
    db.drop_database().await;
}

/// Issue 21 item 10: lock connections that die silently mid-delivery (a fail-over behind
/// NAT) leave their server sessions holding Phorge's per-hook locks. The release times out,
/// the connection is discarded, and its session is killed from a fresh connection, so the
/// hooks' other rows go out within seconds; the old code left the locks to the server's
/// `wait_timeout` (8 h): one row per hook, then nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_of_silently_dead_connections_are_freed_within_seconds() {
    let db = TestDb::create().await.unwrap();
    let proxy = DbProxy::start().await;
    let receiver = Receiver::with(|_, _| Reply::Hold(200));
    let mut ids = Vec::new();
    for tag in 0..4 {
        let hook = db.tagged_hook_phid(tag);
        db.insert_hook(
            &hook,
            &receiver.url(&format!("/{tag}")),
            HookStatus::Enabled,
            "k",
        )
        .await
        .unwrap();
        for _ in 0..4 {
            ids.push(queue(&db, &hook, "PHID-TASK-a", NEVER, T0).await);
        }
    }
    let store = ClaimStore::with_options(
        proxy.opts(),
        db.database(),
        StoreOptions {
            max_lock_connections: 4,
            ..options(Duration::from_secs(1))
        },
    );
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, _metrics) = Harness::default().build_with_store(store, &clock, &log);
    let round = {
        let dispatcher = Arc::clone(&dispatcher);
        tokio::spawn(async move { dispatcher.run_round().await })
    };
    let waiting = receiver.clone();
    tokio::task::spawn_blocking(move || waiting.wait_for(4, Duration::from_secs(30)))
        .await
        .unwrap();
    // Every connection open now (4 locks held, the query pool's) goes silent.
    proxy.blackhole_existing();
    receiver.release();
    tokio::time::timeout(Duration::from_secs(30), round)
        .await
        .expect("the round ends: every statement is bounded")
        .unwrap()
        .unwrap();
    let started = std::time::Instant::now();
    gorge_testkit::eventually(Duration::from_secs(30), "all 16 rows sent", || async {
        // Hooks found locked rest until the clock moves on.
        clock.advance_sec(1);
        let _ = dispatcher.run_round().await;
        let mut sent = 0;
        for id in &ids {
            sent += usize::from(db.read_request(*id).await.unwrap().status == RequestStatus::Sent);
        }
        sent == ids.len()
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(receiver.count(), 16, "each row once");
    db.drop_database().await;
}

/// Issue 21 item 10, the backstop: when the process cannot end a dead lock session itself
/// (it is gone, or the server is unreachable from it), the server ends the session after
/// the lock connections' short `wait_timeout`, and the lock with it. The old code's lock
/// sessions had the server's default (8 h).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_holder_went_silent_is_freed_by_the_server() {
    let db = TestDb::create().await.unwrap();
    let proxy = DbProxy::start().await;
    let hook = db.hook_phid();
    let store = ClaimStore::with_options(
        proxy.opts(),
        db.database(),
        StoreOptions {
            lock_session_timeout: Duration::from_secs(2),
            ..options(Duration::from_secs(1))
        },
    );
    let lock = store.try_hook_lock(&hook).await.unwrap().expect("free");
    let name = lock.name().to_owned();
    proxy.blackhole_existing();
    // The holder vanishes without a word: no release, no kill.
    std::mem::forget(lock);
    let admin = mysql_async::Pool::new(server_opts());
    let is_free = |admin: mysql_async::Pool, name: String| async move {
        let mut conn = admin.get_conn().await.unwrap();
        let free: Option<Option<i64>> = conn
            .exec_first("SELECT IS_FREE_LOCK(?)", (name,))
            .await
            .unwrap();
        free.flatten()
    };
    assert_eq!(
        is_free(admin.clone(), name.clone()).await,
        Some(0),
        "held by the silent session"
    );
    let started = std::time::Instant::now();
    gorge_testkit::eventually(Duration::from_secs(30), "the lock freed", || {
        let check = is_free(admin.clone(), name.clone());
        async move { check.await == Some(1) }
    })
    .await;
    // The server checks idle sessions about once a second.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let _ = admin.disconnect().await;
    db.drop_database().await;
}

/// Issue 21 item 10: a hook whose lock another session keeps (here a session standing in
/// for a zombie or Phorge's worker) shows in the gauges, with how long it has been held;
/// both return to 0 once the lock is free and the row is delivered.
#[tokio::test]
async fn hooks_whose_lock_is_held_elsewhere_show_in_the_gauges() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    let id = queue(&db, &hook, "PHID-TASK-a", NEVER, T0).await;
    let name = gorge_claim::hook_lock_name(db.namespace(), &hook);
    let mut holder = take_hook_lock(&db, &hook).await.expect("the lock is free");
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build(&db, &clock, &log);
    let gauges = |metrics: &gorge_webhook::metrics::Metrics| {
        (
            metrics.lock_unavailable_hooks.get(),
            metrics.lock_unavailable_seconds.get(),
        )
    };

    dispatcher.run_round().await.unwrap();
    dispatcher.sample().await.unwrap();
    assert_eq!(gauges(&metrics), (1, 0));
    clock.advance_sec(40);
    dispatcher.run_round().await.unwrap();
    dispatcher.sample().await.unwrap();
    assert_eq!(gauges(&metrics), (1, 40));
    assert_eq!(receiver.count(), 0);

    holder
        .exec_drop("DO RELEASE_LOCK(?)", (&name,))
        .await
        .unwrap();
    let _ = holder.disconnect().await;
    clock.advance_sec(1);
    dispatcher.run_round().await.unwrap();
    dispatcher.sample().await.unwrap();
    assert_eq!(gauges(&metrics), (0, 0));
    assert_eq!(
        db.read_request(id).await.unwrap().status,
        RequestStatus::Sent
    );
    db.drop_database().await;
}
