//! Rows of a hook whose per-hook lock another session holds (another replica, Phorge's
//! worker): passed over before they take a slot, and tried again soon after the lock is let
//! go (docs/webhook.md, "Per-hook lock").
//!
//! Before: such a row took one of the free slots, was skipped at `GET_LOCK`, and its hook
//! rested a whole poll interval. With four replicas on one queue most of their slots went
//! to rows of each other's hooks, and 4 processes delivered fewer rows than one.

mod common;

use std::time::Duration;

use common::{queue, take_hook_lock, Harness};
use gorge_claim::testdb::{HookStatus, TestDb};
use gorge_testkit::{CapturedLog, Receiver};
use gorge_webhook::clock::ManualUnixClock;
use gorge_webhook::outcome::SkipReason;
use mysql_async::prelude::Queryable;

const T0: u64 = 1_700_000_000;
const NEVER: &str = r#"{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[]}"#;

#[tokio::test]
async fn a_hook_locked_elsewhere_neither_takes_a_slot_nor_waits_a_poll_interval() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let locked = db.tagged_hook_phid("a");
    let free = db.tagged_hook_phid("b");
    for (hook, path) in [(&locked, "/a"), (&free, "/b")] {
        db.insert_hook(hook, &receiver.url(path), HookStatus::Enabled, "k")
            .await
            .unwrap();
    }
    // The locked hook's row is the oldest: it comes first in the candidates.
    queue(&db, &locked, "PHID-TASK-a", NEVER, T0).await;
    queue(&db, &free, "PHID-TASK-b", NEVER, T0).await;
    let holder = take_hook_lock(&db, &locked).await.expect("lock taken");

    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness {
        // One slot: the locked hook's row must not take it.
        max_concurrent: 1,
        // Far above the rest a lock let go soon deserves.
        poll_interval: Duration::from_secs(30),
        ..Harness::default()
    }
    .build(&db, &clock, &log);

    dispatcher.run_round().await.unwrap();
    let paths: Vec<String> = receiver.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        paths,
        ["/b"],
        "the free hook's row went out in the same round"
    );
    // Seen as held elsewhere, for the lock gauges.
    dispatcher.sample().await.unwrap();
    assert_eq!(metrics.lock_unavailable_hooks.get(), 1);

    // Let go; a little later (well within the poll interval) the row goes out. Released
    // explicitly: a disconnect frees the lock only once the server has processed it.
    let mut holder = holder;
    holder
        .exec_drop(
            "DO RELEASE_LOCK(?)",
            (gorge_claim::hook_lock_name(db.namespace(), &locked),),
        )
        .await
        .unwrap();
    let _ = holder.disconnect().await;
    clock.advance_ms(200);
    dispatcher.run_round().await.unwrap();
    let paths: Vec<String> = receiver.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/b", "/a"], "retried 200 ms later, not after 30 s");
    db.drop_database().await;
}

#[tokio::test]
async fn a_lock_held_for_long_is_tried_less_and_less_often_up_to_the_poll_interval() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = db.tagged_hook_phid("a");
    db.insert_hook(&hook, &receiver.url("/a"), HookStatus::Enabled, "k")
        .await
        .unwrap();
    queue(&db, &hook, "PHID-TASK-a", NEVER, T0).await;
    let holder = take_hook_lock(&db, &hook).await.expect("lock taken");

    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness {
        poll_interval: Duration::from_secs(2),
        ..Harness::default()
    }
    .build(&db, &clock, &log);
    let tries = || metrics.skips(SkipReason::HookBusy);
    // Rounds every 10 ms of clock for 20 s: with a rest of one poll interval from the
    // start the lock is tried every ~2 s; backing off from 25-75 ms it is tried more often
    // at first, then as rarely.
    let mut at_ms = Vec::new();
    for step in 0..2_000u64 {
        let before = tries();
        dispatcher.run_round().await.unwrap();
        if tries() > before {
            at_ms.push(step * 10);
        }
        clock.advance_ms(10);
    }
    assert_eq!(receiver.count(), 0);
    let gaps: Vec<u64> = at_ms.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[0] <= 100, "first retry soon: {gaps:?}");
    assert!(
        gaps.iter().all(|gap| *gap <= 3_000),
        "never longer than the poll interval and its jitter: {gaps:?}"
    );
    let late = &gaps[gaps.len() - 3..];
    assert!(
        late.iter().all(|gap| *gap >= 900),
        "a lock held for 20 s is tried about once per poll interval: {gaps:?}"
    );
    assert!(
        at_ms.len() < 40,
        "{} tries in 20 s: the rest grows with the wait",
        at_ms.len()
    );
    let _ = holder.disconnect().await;
    db.drop_database().await;
}
