//! The claim protocol against a real MariaDB/MySQL: each test builds its own
//! `{random}_herald` database (see `gorge_claim::testdb`) and drops it at the end.

use std::time::Duration;

use gorge_claim::testdb::{server_opts, with_marker, HookStatus, NewRequest, RequestRow, TestDb};
use gorge_claim::{
    hook_lock_name, Candidate, Claim, ClaimStore, ClaimTiming, RequestResult, RequestStatus,
    ResultWrite, MAX_EXCLUDED_HOOKS,
};
use mysql_async::prelude::Queryable;

const T0: u64 = 1_700_000_000;
const OBJECT: &str = "PHID-TASK-abcdefghij0123456789";

async fn fresh_db() -> TestDb {
    TestDb::create()
        .await
        .expect("create test database (is MariaDB at GORGE_TEST_MYSQL_URL up?)")
}

/// Lease and backoff for tests where neither expires.
const TIMING: ClaimTiming = ClaimTiming {
    lease_sec: 30,
    retry_backoff_sec: 60,
};

/// Inserts a fresh request (default properties) of this database's hook at `T0`.
async fn insert_fresh_request(db: &TestDb) -> u64 {
    db.insert_request(&NewRequest::new(&db.hook_phid(), OBJECT), T0)
        .await
        .unwrap()
}

fn as_candidate(row: &RequestRow) -> Candidate {
    Candidate {
        id: row.id,
        phid: row.phid.clone(),
        webhook_phid: row.webhook_phid.clone(),
        object_phid: row.object_phid.clone(),
        properties: row.properties.clone(),
        date_created: row.date_created,
        date_modified: row.date_modified,
        last_request_epoch: row.last_request_epoch,
    }
}

async fn candidate_ids(store: &ClaimStore, now: u64, timing: &ClaimTiming) -> Vec<u64> {
    store
        .candidates(now, timing, 100, &[])
        .await
        .expect("candidates")
        .iter()
        .map(|c| c.id)
        .collect()
}

fn failed_attempt(epoch: u64, status: RequestStatus) -> ResultWrite {
    ResultWrite::Attempted {
        status,
        result: RequestResult::Fail,
        epoch,
        // The service rewrites properties whole, so the hand-over marker stays.
        properties: with_marker(r#"{"retry":"forever","errorType":"http","errorCode":"500"}"#),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_of_two_racing_claims_wins_every_round() {
    let db = fresh_db().await;
    let hook = db.tagged_hook_phid("race");
    let id = db
        .insert_request(&NewRequest::new(&hook, OBJECT), T0)
        .await
        .unwrap();
    // Two pools = two sessions, like two replicas.
    let (store_a, store_b) = (db.store(), db.store());
    let mut reset = db.conn().await.unwrap();
    let (mut wins_a, mut wins_b) = (0u32, 0u32);
    for round in 0..1000u64 {
        reset
            .exec_drop(
                "UPDATE herald_webhookrequest SET status = 'queued', dateModified = dateCreated, \
                 lastRequestEpoch = 0 WHERE id = ?",
                (id,),
            )
            .await
            .unwrap();
        let candidate = as_candidate(&db.read_request(id).await.unwrap());
        // Half the rounds claim in the insert's own second, half later.
        let now = T0 + (round % 2) * 7;
        let task_a = {
            let (store, candidate) = (store_a.clone(), candidate.clone());
            tokio::spawn(async move { store.claim(&candidate, now).await })
        };
        let task_b = {
            let (store, candidate) = (store_b.clone(), candidate.clone());
            tokio::spawn(async move { store.claim(&candidate, now).await })
        };
        let (a, b) = tokio::join!(task_a, task_b);
        let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
        match (a, b) {
            (Some(claim), None) => {
                wins_a += 1;
                assert_eq!(claim.version, (T0 + 1).max(now));
            }
            (None, Some(claim)) => {
                wins_b += 1;
                assert_eq!(claim.version, (T0 + 1).max(now));
            }
            other => panic!("round {round}: expected exactly one winner, got {other:?}"),
        }
    }
    assert_eq!(wins_a + wins_b, 1000);
    drop(reset);
    store_a.close().await;
    store_b.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn claim_in_the_insert_second_still_bumps_the_version() {
    let db = fresh_db().await;
    let store = db.store();
    let id = insert_fresh_request(&db).await;
    let seen = store.candidates(T0, &TIMING, 10, &[]).await.unwrap();
    assert_eq!(seen.len(), 1);
    let claim = store
        .claim(&seen[0], T0)
        .await
        .unwrap()
        .expect("first claim wins");
    assert_eq!(
        claim,
        Claim {
            id,
            version: T0 + 1
        }
    );
    // A second claimant that read the same candidate in the same second loses.
    assert_eq!(store.claim(&seen[0], T0).await.unwrap(), None);
    assert_eq!(store.claim(&seen[0], T0 + 1).await.unwrap(), None);
    let row = db.read_request(id).await.unwrap();
    assert_eq!(
        (
            row.status.as_str(),
            row.date_modified,
            row.last_request_epoch
        ),
        ("queued", T0 + 1, 0)
    );
    store.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn lease_and_backoff_are_independent() {
    let db = fresh_db().await;
    let store = db.store();
    let id = insert_fresh_request(&db).await;
    let timing = ClaimTiming {
        lease_sec: 30,
        retry_backoff_sec: 10,
    };
    // Fresh: a candidate at once.
    assert_eq!(candidate_ids(&store, T0, &timing).await, [id]);

    let candidate = store
        .candidates(T0, &timing, 1, &[])
        .await
        .unwrap()
        .remove(0);
    let claim = store.claim(&candidate, T0).await.unwrap().unwrap();
    // In flight: invisible until the lease (counted from the claim version) expires.
    assert!(candidate_ids(&store, T0 + 1, &timing).await.is_empty());
    assert!(candidate_ids(&store, claim.version + 29, &timing)
        .await
        .is_empty());
    assert_eq!(
        candidate_ids(&store, claim.version + 30, &timing).await,
        [id]
    );

    // The attempt failed at T0 + 2 and retries forever.
    let written = store
        .write_result(
            &claim,
            &failed_attempt(T0 + 2, RequestStatus::Queued),
            T0 + 2,
        )
        .await
        .unwrap();
    assert!(written);
    let row = db.read_request(id).await.unwrap();
    assert_eq!(row.status, RequestStatus::Queued);
    assert_eq!(row.last_request_result, RequestResult::Fail);
    assert_eq!(
        (row.last_request_epoch, row.date_modified),
        (T0 + 2, T0 + 2)
    );
    assert_eq!(
        row.properties,
        r#"{"handedOverTo":"gorge-webhook","retry":"forever","errorType":"http","errorCode":"500"}"#
    );

    // Backoff (10) < lease (30): visible after 10 s, not before.
    assert!(candidate_ids(&store, T0 + 11, &timing).await.is_empty());
    assert_eq!(candidate_ids(&store, T0 + 12, &timing).await, [id]);

    // A stale claim cannot write: the row is not at its version any more.
    let before = db.read_request(id).await.unwrap();
    let stale = store
        .write_result(
            &claim,
            &failed_attempt(T0 + 13, RequestStatus::Failed),
            T0 + 13,
        )
        .await
        .unwrap();
    assert!(!stale);
    assert_eq!(db.read_request(id).await.unwrap(), before);

    // The retry is claimed and is protected by the lease again, not the backoff.
    let retry = store
        .candidates(T0 + 12, &timing, 1, &[])
        .await
        .unwrap()
        .remove(0);
    let claim = store.claim(&retry, T0 + 12).await.unwrap().unwrap();
    assert_eq!(claim.version, T0 + 12);
    assert!(candidate_ids(&store, T0 + 12 + 29, &timing)
        .await
        .is_empty());
    assert_eq!(candidate_ids(&store, T0 + 12 + 30, &timing).await, [id]);

    // Delivered: never a candidate again.
    let sent = ResultWrite::Attempted {
        status: RequestStatus::Sent,
        result: RequestResult::Okay,
        epoch: T0 + 14,
        properties: "{}".to_owned(),
    };
    assert!(store.write_result(&claim, &sent, T0 + 14).await.unwrap());
    assert!(candidate_ids(&store, T0 + 100_000, &timing)
        .await
        .is_empty());
    store.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn backoff_longer_than_lease_is_not_cut_short() {
    let db = fresh_db().await;
    let store = db.store();
    let id = insert_fresh_request(&db).await;
    let timing = ClaimTiming {
        lease_sec: 30,
        retry_backoff_sec: 60,
    };
    let candidate = store
        .candidates(T0, &timing, 1, &[])
        .await
        .unwrap()
        .remove(0);
    let claim = store.claim(&candidate, T0 + 5).await.unwrap().unwrap();
    assert_eq!(claim.version, T0 + 5);
    // The clock went backwards between claim and result: the marker stays >= the version.
    assert!(store
        .write_result(
            &claim,
            &failed_attempt(T0 + 3, RequestStatus::Queued),
            T0 + 3
        )
        .await
        .unwrap());
    let row = db.read_request(id).await.unwrap();
    assert_eq!(
        (row.last_request_epoch, row.date_modified),
        (T0 + 5, T0 + 5)
    );
    assert!(candidate_ids(&store, T0 + 5 + 59, &timing).await.is_empty());
    assert_eq!(candidate_ids(&store, T0 + 5 + 60, &timing).await, [id]);
    store.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn terminal_outcome_without_request_keeps_epoch_zero() {
    let db = fresh_db().await;
    let store = db.store();
    let id = insert_fresh_request(&db).await;
    let row = db.read_request(id).await.unwrap();
    let claim = store
        .claim(&as_candidate(&row), T0 + 1)
        .await
        .unwrap()
        .unwrap();
    let not_found = ResultWrite::NotAttempted {
        properties: r#"{"errorType":"hook","errorCode":"not-found"}"#.to_owned(),
    };
    assert!(store
        .write_result(&claim, &not_found, T0 + 9)
        .await
        .unwrap());
    let row = db.read_request(id).await.unwrap();
    assert_eq!(
        (
            row.status.as_str(),
            row.last_request_result.as_str(),
            row.last_request_epoch,
            row.date_modified
        ),
        ("failed", "none", 0, claim.version)
    );
    store.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn candidates_are_bounded_and_oldest_first() {
    let db = fresh_db().await;
    let store = db.store();
    let hook = db.hook_phid();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            db.insert_request(&NewRequest::new(&hook, OBJECT), T0 + i)
                .await
                .unwrap(),
        );
    }
    let first = store.candidates(T0 + 5, &TIMING, 3, &[]).await.unwrap();
    assert_eq!(first.iter().map(|c| c.id).collect::<Vec<_>>(), ids[..3]);
    assert_eq!(first[1].date_created, T0 + 1);
    assert_eq!(first[1].webhook_phid, hook);
    store.claim(&first[0], T0 + 5).await.unwrap().unwrap();
    let next = store.candidates(T0 + 5, &TIMING, 3, &[]).await.unwrap();
    assert_eq!(next.iter().map(|c| c.id).collect::<Vec<_>>(), ids[1..4]);
    store.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn excluded_hooks_rows_neither_appear_nor_fill_the_batch() {
    let db = fresh_db().await;
    let store = db.store();
    let (a, b, c) = (
        db.tagged_hook_phid("a"),
        db.tagged_hook_phid("b"),
        db.tagged_hook_phid("c"),
    );
    let mut ids = Vec::new();
    for hook in [&a, &a, &b, &a, &c, &b] {
        ids.push(
            db.insert_request(&NewRequest::new(hook, OBJECT), T0)
                .await
                .unwrap(),
        );
    }
    let ids_of = |candidates: Vec<Candidate>| candidates.iter().map(|c| c.id).collect::<Vec<_>>();
    let owned = |hooks: &[&String]| hooks.iter().map(|h| h.to_string()).collect::<Vec<_>>();

    assert_eq!(
        ids_of(store.candidates(T0, &TIMING, 100, &[]).await.unwrap()),
        ids
    );
    // The LIMIT counts only rows that are returned: A's rows at the head take no room.
    assert_eq!(
        ids_of(
            store
                .candidates(T0, &TIMING, 2, &owned(&[&a]))
                .await
                .unwrap()
        ),
        [ids[2], ids[4]]
    );
    // Three entries (padded to four placeholders), one of them no hook at all.
    let unknown = "PHID-HWBH-none".to_string();
    assert_eq!(
        ids_of(
            store
                .candidates(T0, &TIMING, 100, &owned(&[&a, &unknown, &b]))
                .await
                .unwrap()
        ),
        [ids[4]]
    );
    // The cap: an entry at position MAX_EXCLUDED_HOOKS is used, one past it is not.
    let filler: Vec<String> = (1..MAX_EXCLUDED_HOOKS)
        .map(|i| format!("PHID-HWBH-filler{i}"))
        .collect();
    let at_cap = [filler.clone(), owned(&[&c])].concat();
    assert_eq!(at_cap.len(), MAX_EXCLUDED_HOOKS);
    assert_eq!(
        ids_of(store.candidates(T0, &TIMING, 100, &at_cap).await.unwrap()),
        [ids[0], ids[1], ids[2], ids[3], ids[5]]
    );
    let past_cap = [filler, owned(&[&a, &c])].concat();
    assert_eq!(
        ids_of(store.candidates(T0, &TIMING, 100, &past_cap).await.unwrap()),
        [ids[2], ids[4], ids[5]],
        "A (the last entry inside the cap) is excluded, C (past it) is not"
    );
    store.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn hook_lock_is_exclusive_and_never_leaks() {
    let db = fresh_db().await;
    let store = db.store();
    let other_replica = db.store();
    let hook = db.tagged_hook_phid("lock");

    let held = store
        .try_hook_lock(&hook)
        .await
        .unwrap()
        .expect("free lock");
    assert_eq!(held.name(), hook_lock_name(db.namespace(), &hook));
    assert!(store.try_hook_lock(&hook).await.unwrap().is_none());
    assert!(other_replica.try_hook_lock(&hook).await.unwrap().is_none());
    // Another hook is independent.
    let other_hook = store
        .try_hook_lock(&db.tagged_hook_phid("other"))
        .await
        .unwrap()
        .expect("other hook free");
    other_hook.release().await.unwrap();

    held.release().await.unwrap();
    let again = other_replica
        .try_hook_lock(&hook)
        .await
        .unwrap()
        .expect("free after release");

    // Dropped without release: the lock must come free without anyone calling release.
    drop(again);
    gorge_testkit::eventually(
        Duration::from_secs(10),
        "the lock comes free after its HookLock was dropped",
        || async {
            match store.try_hook_lock(&hook).await.unwrap() {
                Some(relocked) => {
                    relocked.release().await.unwrap();
                    true
                }
                None => false,
            }
        },
    )
    .await;
    store.close().await;
    other_replica.close().await;
    db.drop_database().await;
}

/// Issue 10 item 6: while Phorge's PHP worker holds `PhabricatorGlobalLock::newLock(
/// 'webhook(<PHID>)')` (a plain `GET_LOCK` of Phorge's name on its own session), this
/// service must not take the hook, and the other way round.
#[tokio::test]
async fn phorges_own_lock_and_ours_exclude_each_other() {
    let db = fresh_db().await;
    let store = db.store();
    let hook = db.tagged_hook_phid("php");
    let phorge_name = hook_lock_name(db.namespace(), &hook);
    assert!(phorge_name.starts_with("ph:"), "{phorge_name}");
    let mut php_worker = mysql_async::Conn::new(server_opts()).await.unwrap();
    let got: Option<i64> = php_worker
        .exec_first("SELECT GET_LOCK(?, 0)", (&phorge_name,))
        .await
        .unwrap();
    assert_eq!(got, Some(1));
    assert!(
        store.try_hook_lock(&hook).await.unwrap().is_none(),
        "the PHP worker holds the hook"
    );
    let _: Option<i64> = php_worker
        .exec_first("SELECT RELEASE_LOCK(?)", (&phorge_name,))
        .await
        .unwrap();
    let ours = store.try_hook_lock(&hook).await.unwrap().expect("free");
    let got: Option<i64> = php_worker
        .exec_first("SELECT GET_LOCK(?, 0)", (&phorge_name,))
        .await
        .unwrap();
    assert_eq!(got, Some(0), "the PHP worker must wait for us too");
    ours.release().await.unwrap();
    let _ = php_worker.disconnect().await;
    store.close().await;
    db.drop_database().await;
}

/// Every name in `compat/phorge-lock-names.json` (computed by Phorge's PHP).
#[test]
fn lock_names_match_phorges_php() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../../../compat/phorge-lock-names.json")).unwrap();
    let cases = fixture.as_array().unwrap();
    assert!(cases.len() >= 15);
    for case in cases {
        let (namespace, hook, expected) = (
            case["namespace"].as_str().unwrap(),
            case["hook_phid"].as_str().unwrap(),
            case["mysql_lock_name"].as_str().unwrap(),
        );
        assert_eq!(
            case["lock_key"].as_str().unwrap(),
            format!("webhook({hook})")
        );
        assert_eq!(hook_lock_name(namespace, hook), expected, "{case}");
    }
}

#[tokio::test]
async fn breaker_counts_recent_failures_of_one_hook() {
    let db = fresh_db().await;
    let store = db.store();
    let (hook_a, hook_b) = (db.tagged_hook_phid("a"), db.tagged_hook_phid("b"));
    let mut conn = db.conn().await.unwrap();
    // (hook, lastRequestResult, lastRequestEpoch)
    let rows = [
        (&hook_a, "fail", T0 - 400),
        (&hook_a, "fail", T0 - 300),
        (&hook_a, "fail", T0 - 10),
        (&hook_a, "fail", T0),
        (&hook_a, "okay", T0),
        (&hook_a, "none", 0),
        (&hook_b, "fail", T0),
    ];
    for (hook, result, epoch) in rows {
        let id = db
            .insert_request(&NewRequest::new(hook, OBJECT), T0 - 500)
            .await
            .unwrap();
        conn.exec_drop(
            "UPDATE herald_webhookrequest SET lastRequestResult = ?, lastRequestEpoch = ? WHERE id = ?",
            (result, epoch, id),
        )
        .await
        .unwrap();
    }
    // Window of 300 s ending at T0: the boundary row counts (>=).
    assert_eq!(store.recent_failures(&hook_a, T0 - 300).await.unwrap(), 3);
    assert_eq!(store.recent_failures(&hook_a, T0 - 299).await.unwrap(), 2);
    assert_eq!(store.recent_failures(&hook_a, 0).await.unwrap(), 4);
    assert_eq!(store.recent_failures(&hook_b, T0 - 300).await.unwrap(), 1);
    assert_eq!(store.recent_failures("PHID-HWBH-none", 0).await.unwrap(), 0);
    drop(conn);
    store.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn stats_hooks_and_queue_depth() {
    let db = fresh_db().await;
    let store = db.store();
    assert_eq!(store.queue_depth(T0).await.unwrap().oldest_age_sec, None);
    let hook = db.hook_phid();
    db.insert_hook(&hook, "https://example.com/hook", HookStatus::Enabled, "k1")
        .await
        .unwrap();
    db.insert_hook(
        &db.tagged_hook_phid("f"),
        "https://example.com/f",
        HookStatus::Firehose,
        "k2",
    )
    .await
    .unwrap();
    db.insert_hook(
        &db.tagged_hook_phid("d"),
        "https://example.com/d",
        HookStatus::Disabled,
        "k3",
    )
    .await
    .unwrap();
    let first = db
        .insert_request(&NewRequest::new(&hook, OBJECT), T0 - 50)
        .await
        .unwrap();
    db.insert_request(&NewRequest::new(&hook, OBJECT), T0 - 20)
        .await
        .unwrap();
    db.insert_request(&NewRequest::new(&hook, OBJECT), T0 - 10)
        .await
        .unwrap();
    let claim = store
        .claim(&as_candidate(&db.read_request(first).await.unwrap()), T0)
        .await
        .unwrap()
        .unwrap();
    let sent = ResultWrite::Attempted {
        status: RequestStatus::Sent,
        result: RequestResult::Okay,
        epoch: T0,
        properties: "{}".to_owned(),
    };
    assert!(store.write_result(&claim, &sent, T0).await.unwrap());

    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.queued, stats.sent, stats.failed, stats.active_hooks),
        (2, 1, 0, 2)
    );
    assert_eq!(store.hook_count().await.unwrap(), 3);
    let depth = store.queue_depth(T0).await.unwrap();
    assert_eq!((depth.queued, depth.oldest_age_sec), (2, Some(20)));

    let loaded = store.load_hook(&hook).await.unwrap().expect("hook exists");
    assert_eq!(
        (
            loaded.uri.as_str(),
            loaded.status.as_str(),
            loaded.hmac_key.as_str()
        ),
        ("https://example.com/hook", "enabled", "k1")
    );
    assert!(
        !format!("{loaded:?}").contains("k1"),
        "Debug must mask the key"
    );
    assert_eq!(store.load_hook("PHID-HWBH-missing").await.unwrap(), None);
    store.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn ping_reports_a_missing_database_clearly() {
    let db = fresh_db().await;
    let store = db.store();
    store.ping().await.expect("ping on a fresh database");
    store.close().await;

    let missing = format!("{}x_herald", db.namespace());
    let store = ClaimStore::new(server_opts(), &missing);
    let err = store.ping().await.expect_err("database does not exist");
    assert!(err.is_unknown_database(), "{err:?}");
    assert!(err.to_string().contains(&missing), "{err}");
    store.close().await;
    db.drop_database().await;
}

/// Issue 19: a round's objects and transactions in one query per table. Each request gets
/// what its own two queries return as Phorge's worker runs them: a missing object is
/// `Missing`; the stored transactions that exist *for its object*, newest (highest id)
/// first — a stored PHID of another object, or one not in the table, is left out.
#[tokio::test]
async fn objects_of_a_round_are_loaded_together_as_each_alone() {
    use gorge_claim::{ObjectLoad, Unchecked};
    let db = fresh_db().await;
    let (a, b, gone) = (
        "PHID-TASK-aaaaaaaaaaaaaaaaaaaa",
        "PHID-TASK-bbbbbbbbbbbbbbbbbbbb",
        "PHID-TASK-gggggggggggggggggggg",
    );
    db.insert_object(a).await.unwrap();
    db.insert_object(b).await.unwrap();
    // Interleaved ids: order comes from the id, not the stored list or the object.
    for (id, phid, object) in [
        (1, "PHID-XACT-TASK-a1", a),
        (2, "PHID-XACT-TASK-b1", b),
        (3, "PHID-XACT-TASK-a2", a),
        (4, "PHID-XACT-TASK-b2", b),
        (5, "PHID-XACT-TASK-a3", a),
    ] {
        db.insert_transaction(id, phid, object).await.unwrap();
    }
    let list = |phids: &[&str]| phids.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let stored_a = list(&[
        "PHID-XACT-TASK-a1",
        "PHID-XACT-TASK-a3",
        "PHID-XACT-TASK-b1",
        "PHID-XACT-TASK-nope",
    ]);
    let stored_b = list(&[
        "PHID-XACT-TASK-b2",
        "PHID-XACT-TASK-b1",
        "PHID-XACT-TASK-a2",
    ]);
    let stored_gone = list(&["PHID-XACT-TASK-a1"]);
    let stored_apps = list(&["PHID-XACT-XXXX-1"]);
    let none: Vec<String> = Vec::new();
    let store = db.store();
    let loads = store
        .load_objects(&[
            (a, &stored_a),
            (gone, &stored_gone),
            (b, &stored_b),
            ("PHID-APPS-PhabricatorHeraldApplication", &stored_apps),
            (b, &none),
            ("not-a-phid", &none),
        ])
        .await
        .unwrap();
    let found = |phids: &[&str]| ObjectLoad::Found {
        transactions: list(phids),
        unchecked: None,
    };
    assert_eq!(
        loads,
        vec![
            found(&["PHID-XACT-TASK-a3", "PHID-XACT-TASK-a1"]),
            ObjectLoad::Missing,
            found(&["PHID-XACT-TASK-b2", "PHID-XACT-TASK-b1"]),
            ObjectLoad::Found {
                transactions: stored_apps.clone(),
                unchecked: Some(Unchecked::NoTable("APPS".into())),
            },
            found(&[]),
            ObjectLoad::Missing,
        ]
    );
    // One at a time, the same answers.
    assert_eq!(store.load_object(a, &stored_a).await.unwrap(), loads[0]);
    assert_eq!(store.load_object(b, &stored_b).await.unwrap(), loads[2]);
    db.drop_database().await;
}
