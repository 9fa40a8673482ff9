//! Loading a request's object and transactions as Phorge's worker does (see "Per-request
//! steps" in docs/webhook.md), and what happens when that cannot be checked: a SELECT the server refuses, a
//! PHID type Phorge's table does not list. The recorded deliveries
//! (`phorge_deliveries.rs`) pin the common cases byte for byte.

mod common;

use std::time::Duration;

use common::{admin_sql, enabled_hook, queue, Harness};
use gorge_claim::testdb::{server_opts, NewRequest, RequestStatus, TestDb};
use gorge_claim::ClaimStore;
use gorge_testkit::{CapturedLog, Receiver};
use gorge_webhook::clock::ManualUnixClock;
use serde_json::Value;

const T0: u64 = 1_700_000_000;
const TASK: &str = "PHID-TASK-objectsobjectsobjec";

fn properties(xactions: &[&str]) -> String {
    serde_json::json!({"retry": "never", "transactionPHIDs": xactions, "triggerPHIDs": []})
        .to_string()
}

fn transactions_of(body: &[u8]) -> Vec<String> {
    let value: Value = serde_json::from_slice(body).unwrap();
    value["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["phid"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn only_the_objects_transactions_newest_first_and_a_missing_object_is_not_sent() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    db.insert_object(TASK).await.unwrap();
    for (id, phid, object) in [
        (10, "PHID-XACT-TASK-old", TASK),
        (11, "PHID-XACT-TASK-mid", TASK),
        (12, "PHID-XACT-TASK-new", TASK),
        (13, "PHID-XACT-TASK-foreign", "PHID-TASK-someotherobject"),
    ] {
        db.insert_transaction(id, phid, object).await.unwrap();
    }
    // As the transaction editor stores them: oldest first, plus a foreign and a gone PHID.
    let stored = [
        "PHID-XACT-TASK-old",
        "PHID-XACT-TASK-foreign",
        "PHID-XACT-TASK-mid",
        "PHID-XACT-TASK-gone",
        "PHID-XACT-TASK-new",
    ];
    let sent = queue(&db, &hook, TASK, &properties(&stored), T0).await;
    let missing = queue(&db, &hook, "PHID-TASK-doesnotexist", &properties(&[]), T0).await;
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, _) = Harness::default().build(&db, &clock, &log);
    for _ in 0..3 {
        dispatcher.run_round().await.unwrap();
    }
    let requests = receiver.wait_for(1, Duration::from_secs(10));
    assert_eq!(requests.len(), 1, "the missing object is never POSTed");
    assert_eq!(
        transactions_of(&requests[0].body),
        [
            "PHID-XACT-TASK-new",
            "PHID-XACT-TASK-mid",
            "PHID-XACT-TASK-old"
        ]
    );
    let row = db.read_request(sent).await.unwrap();
    assert_eq!(row.status, RequestStatus::Sent);
    assert!(row
        .properties
        .contains(r#""transactionPHIDs":["PHID-XACT-TASK-old","PHID-XACT-TASK-foreign""#));
    let row = db.read_request(missing).await.unwrap();
    assert_eq!(
        (
            row.status.as_str(),
            row.last_request_result.as_str(),
            row.last_request_epoch
        ),
        ("failed", "none", 0)
    );
    assert!(row
        .properties
        .ends_with(r#""errorType":"hook","errorCode":"object"}"#));
    db.drop_database().await;
}

#[tokio::test]
async fn a_refused_select_falls_back_to_the_stored_order_and_is_logged_once_per_database() {
    let db = TestDb::create().await.unwrap();
    let user = format!("{}r", db.namespace());
    admin_sql(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")).await;
    admin_sql(&format!(
        "GRANT SELECT, UPDATE ON `{}`.* TO '{user}'@'%'",
        db.database()
    ))
    .await;
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    db.insert_object(TASK).await.unwrap();
    db.insert_transaction(1, "PHID-XACT-TASK-a", TASK)
        .await
        .unwrap();
    db.insert_transaction(2, "PHID-XACT-TASK-b", TASK)
        .await
        .unwrap();
    for _ in 0..2 {
        db.insert_request(
            &NewRequest::new(&hook, TASK)
                .with_properties(&properties(&["PHID-XACT-TASK-a", "PHID-XACT-TASK-b"])),
            T0,
        )
        .await
        .unwrap();
    }
    let opts = mysql_async::OptsBuilder::from_opts(server_opts())
        .user(Some(user.clone()))
        .pass(Some("pw"));
    let store = ClaimStore::new(opts.into(), db.database());
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build_with_store(store, &clock, &log);
    for _ in 0..3 {
        dispatcher.run_round().await.unwrap();
    }
    let requests = receiver.wait_for(2, Duration::from_secs(10));
    for request in &requests {
        assert_eq!(
            transactions_of(&request.body),
            ["PHID-XACT-TASK-a", "PHID-XACT-TASK-b"],
            "stored order when the table cannot be read"
        );
    }
    assert_eq!(log.count("WEBHOOK_OBJECT_SELECT_REFUSED"), 1);
    assert_eq!(metrics.objects_unchecked("refused"), 2);
    admin_sql(&format!("DROP USER '{user}'@'%'")).await;
    db.drop_database().await;
}

#[tokio::test]
async fn an_unknown_phid_type_is_delivered_and_warned_about_once() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    for _ in 0..2 {
        db.insert_request(
            &NewRequest::new(&hook, "PHID-ZZZZ-extensionobject")
                .with_properties(&properties(&["PHID-XACT-ZZZZ-x"])),
            T0,
        )
        .await
        .unwrap();
    }
    let clock = ManualUnixClock::new(T0 + 1);
    let log = CapturedLog::default();
    let (dispatcher, metrics) = Harness::default().build(&db, &clock, &log);
    for _ in 0..3 {
        dispatcher.run_round().await.unwrap();
    }
    let requests = receiver.wait_for(2, Duration::from_secs(10));
    assert_eq!(transactions_of(&requests[0].body), ["PHID-XACT-ZZZZ-x"]);
    assert_eq!(log.count("WEBHOOK_OBJECT_TYPE_UNKNOWN"), 1);
    assert_eq!(metrics.objects_unchecked("unknown-type"), 2);
    db.drop_database().await;
}
