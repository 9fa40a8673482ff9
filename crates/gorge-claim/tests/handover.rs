//! Only rows Phorge handed over are the service's (see `gorge_claim::handover`), and finding
//! them stays bounded however many queued rows are still Phorge's. Real MariaDB, one
//! throwaway database per test.

use gorge_claim::handover::{HandoverSample, MIN_WINDOW};
use gorge_claim::testdb::{NewRequest, RequestStatus, TestDb};
use gorge_claim::{Claim, ClaimStore, ClaimTiming, RequestResult, ResultWrite};

const T0: u64 = 1_700_000_000;
const OBJECT: &str = "PHID-TASK-handoverobject000000";
const TIMING: ClaimTiming = ClaimTiming {
    lease_sec: 30,
    retry_backoff_sec: 60,
};
/// A batch limit below [`MIN_WINDOW`], so each window holds exactly `MIN_WINDOW` ids.
const LIMIT: usize = 100;

async fn fresh_db() -> TestDb {
    TestDb::create()
        .await
        .expect("create test database (is MariaDB at GORGE_TEST_MYSQL_URL up?)")
}

async fn candidate_ids(store: &ClaimStore, now: u64) -> Vec<u64> {
    let ids: Vec<u64> = store
        .candidates(now, &TIMING, LIMIT, &[])
        .await
        .expect("candidates")
        .iter()
        .map(|c| c.id)
        .collect();
    ids
}

#[tokio::test]
async fn rows_phorge_did_not_hand_over_are_never_candidates_claimed_or_written() {
    let db = fresh_db().await;
    let store = db.store();
    let hook = db.hook_phid();
    let phorges = db
        .insert_request(&NewRequest::new(&hook, OBJECT).not_handed_over(), T0)
        .await
        .unwrap();
    let ours = db
        .insert_request(&NewRequest::new(&hook, OBJECT), T0)
        .await
        .unwrap();

    // Today's code returns both: it would deliver beside Phorge's own worker.
    assert_eq!(candidate_ids(&store, T0).await, [ours]);

    // Not even a statement aimed at the right version touches Phorge's row.
    let before = db.read_request(phorges).await.unwrap();
    let mut forged = store
        .candidates(T0, &TIMING, LIMIT, &[])
        .await
        .unwrap()
        .remove(0);
    forged.id = phorges;
    forged.date_modified = before.date_modified;
    assert_eq!(store.claim(&forged, T0).await.unwrap(), None);
    assert!(!store
        .fail_unclaimable(phorges, before.date_modified, "{}")
        .await
        .unwrap());
    let as_if_claimed = Claim {
        id: phorges,
        version: before.date_modified,
    };
    let sent = ResultWrite::Attempted {
        status: RequestStatus::Sent,
        result: RequestResult::Okay,
        epoch: T0,
        properties: "{}".to_owned(),
    };
    assert!(!store.write_result(&as_if_claimed, &sent, T0).await.unwrap());
    assert_eq!(db.read_request(phorges).await.unwrap(), before);

    // The handed-over row is claimed as before.
    let candidate = store
        .candidates(T0, &TIMING, LIMIT, &[])
        .await
        .unwrap()
        .remove(0);
    assert_eq!(candidate.id, ours);
    assert!(store.claim(&candidate, T0).await.unwrap().is_some());
    store.close().await;
    db.drop_database().await;
}

/// A stock Phorge's backlog (or tasks queued before the switch) ahead of a handed-over row:
/// each poll looks at the oldest window and one more, so the row is found by the sweep, and
/// not by the first poll, which would have to read past the whole backlog.
#[tokio::test]
async fn a_backlog_that_is_still_phorges_is_swept_one_window_per_poll() {
    let db = fresh_db().await;
    let store = db.store();
    let hook = db.hook_phid();
    let backlog = 2 * MIN_WINDOW + MIN_WINDOW / 2;
    let phorges: Vec<NewRequest> = (0..backlog)
        .map(|_| NewRequest::new(&hook, OBJECT).not_handed_over())
        .collect();
    db.insert_requests(&phorges, T0).await.unwrap();
    let ours = db
        .insert_request(&NewRequest::new(&hook, OBJECT), T0)
        .await
        .unwrap();

    // Poll 1: the head window and a sweep starting inside it; poll 2: ids 1001–2000;
    // poll 3 reaches the end of the queue.
    assert!(candidate_ids(&store, T0).await.is_empty());
    assert!(candidate_ids(&store, T0).await.is_empty());
    assert_eq!(candidate_ids(&store, T0).await, [ours]);
    // The sweep starts over after the head window and finds it again on its next pass.
    let mut polls = 0;
    while candidate_ids(&store, T0).await != [ours] {
        polls += 1;
        assert!(polls < 4, "the sweep did not come back to row {ours}");
    }
    store.close().await;
    db.drop_database().await;
}

/// Rows of ours that are not due yet (a dead receiver's retries in backoff) cannot hide a
/// new row behind them for longer than one sweep.
#[tokio::test]
async fn a_long_head_of_rows_in_backoff_does_not_hide_a_new_row() {
    let db = fresh_db().await;
    let store = db.store();
    let hook = db.hook_phid();
    let waiting: Vec<NewRequest> = (0..2 * MIN_WINDOW)
        .map(|_| {
            NewRequest::new(&hook, OBJECT).attempted(RequestStatus::Queued, RequestResult::Fail, T0)
        })
        .collect();
    db.insert_requests(&waiting, T0).await.unwrap();
    let new = db
        .insert_request(&NewRequest::new(&hook, OBJECT), T0 + 1)
        .await
        .unwrap();
    // As above: the head, then ids 1001–2000, then the rest of the queue.
    let mut found_after = None;
    for poll in 1..=4 {
        if candidate_ids(&store, T0 + 2).await == [new] {
            found_after = Some(poll);
            break;
        }
    }
    assert_eq!(found_after, Some(3));
    store.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn the_sample_tells_nothing_handed_over_from_nothing_to_do() {
    let db = fresh_db().await;
    let store = db.store();
    let hook = db.hook_phid();
    assert_eq!(
        store.handover_sample().await.unwrap(),
        HandoverSample::default()
    );
    // A stock Phorge: rows, sent by Phorge or queued, none handed over.
    let phorges = || NewRequest::new(&hook, OBJECT).not_handed_over();
    db.insert_request(
        &phorges().attempted(RequestStatus::Sent, RequestResult::Okay, T0),
        T0,
    )
    .await
    .unwrap();
    db.insert_request(&phorges(), T0 + 5).await.unwrap();
    assert_eq!(
        store.handover_sample().await.unwrap(),
        HandoverSample {
            newest_created: Some(T0 + 5),
            any_marked: false,
        }
    );
    // A handed-over row among the newest is enough, sent or not.
    db.insert_request(
        &NewRequest::new(&hook, OBJECT).attempted(RequestStatus::Sent, RequestResult::Okay, T0),
        T0 + 6,
    )
    .await
    .unwrap();
    assert!(store.handover_sample().await.unwrap().any_marked);
    // ...until it is no longer among the newest: Phorge stopped handing over.
    let later: Vec<NewRequest> = (0..gorge_claim::handover::SAMPLE_ROWS)
        .map(|_| phorges())
        .collect();
    db.insert_requests(&later, T0 + 7).await.unwrap();
    assert_eq!(
        store.handover_sample().await.unwrap(),
        HandoverSample {
            newest_created: Some(T0 + 7),
            any_marked: false,
        }
    );
    store.close().await;
    db.drop_database().await;
}
