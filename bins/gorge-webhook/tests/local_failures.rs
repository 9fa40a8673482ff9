//! A failure of this process is not the receiver's (issue 30 item 1): when a delivery cannot
//! open its connection for want of a file descriptor, the row is not written `failed` with
//! cURL's 7 as if the receiver refused, nothing counts toward Phorge's breaker, and the row
//! is given back queued so that the next try (once descriptors are free) delivers it once.
//!
//! This file holds one test only: it lowers the soft `RLIMIT_NOFILE` of its own process and
//! fills the descriptor table, which would disturb any other test running beside it.

mod common;

use std::os::fd::OwnedFd;

use common::Harness;
use gorge_claim::testdb::{HookStatus, NewRequest, TestDb};
use gorge_testkit::{CapturedLog, Receiver};
use gorge_webhook::clock::ManualUnixClock;
use gorge_webhook::delivery::Shortage;
use gorge_webhook::policy::OutboundPolicy;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

const T0: u64 = 1_700_000_000;
const NOW: u64 = T0 + 10;
const PROPERTIES: &str = r#"{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[],"silent":false,"secure":false,"test":false}"#;

/// The descriptor table filled: the soft limit lowered to a little above the descriptors
/// open now, and every free number below it taken by a copy of stdin's `/dev/null`. Dropped:
/// the copies closed and the limit restored.
struct TableFull {
    copies: Vec<OwnedFd>,
    limit: Rlimit,
}

impl TableFull {
    fn now() -> TableFull {
        let limit = getrlimit(Resource::Nofile);
        let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
        let lowered = Rlimit {
            current: Some(open + 64),
            maximum: limit.maximum,
        };
        setrlimit(Resource::Nofile, lowered).unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let mut copies = Vec::new();
        loop {
            match null.try_clone() {
                Ok(copy) => copies.push(OwnedFd::from(copy)),
                Err(err) => {
                    assert_eq!(err.raw_os_error(), Some(24), "EMFILE expected: {err}");
                    break;
                }
            }
        }
        // The original too: closing it would free a number.
        copies.push(OwnedFd::from(null));
        TableFull { copies, limit }
    }
}

impl Drop for TableFull {
    fn drop(&mut self) {
        self.copies.clear();
        setrlimit(Resource::Nofile, self.limit).unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_delivery_without_a_descriptor_is_given_back_queued_and_sent_once_later() {
    let db = TestDb::create().await.unwrap();
    let (clock, log) = (ManualUnixClock::new(NOW), CapturedLog::default());
    // The first hook's URI is refused by the blacklist: its row takes the same database
    // steps (poll, hook lock, claim, result write), warming both pools, and opens no
    // connection that could close later and free a descriptor. The second hook's delivery
    // needs a new connection to its receiver.
    let receiver = Receiver::start(200);
    let (warm_hook, hook) = (db.tagged_hook_phid(1), db.tagged_hook_phid(2));
    db.insert_hook(
        &warm_hook,
        "http://192.0.2.1/hook",
        HookStatus::Enabled,
        "k",
    )
    .await
    .unwrap();
    db.insert_hook(&hook, &receiver.url("/hook"), HookStatus::Enabled, "k")
        .await
        .unwrap();
    // An object of a PHID type Phorge's table does not list: delivered without a query
    // (a refused one could close its connection and free a descriptor mid-round).
    let request = |hook: &str| {
        NewRequest::new(hook, "PHID-GRGX-localfailure000000").with_properties(PROPERTIES)
    };
    let warm = db.insert_request(&request(&warm_hook), T0).await.unwrap();
    let harness = Harness {
        policy: OutboundPolicy::parse("192.0.2.0/24").unwrap(),
        max_concurrent: 1,
        ..Harness::default()
    };
    let (dispatcher, metrics) = harness.build(&db, &clock, &log);
    dispatcher.run_round().await.unwrap();
    assert_eq!(
        db.read_request(warm).await.unwrap().status.as_str(),
        "failed"
    );

    let id = db.insert_request(&request(&hook), T0).await.unwrap();
    let before = db.read_request(id).await.unwrap();
    let failed_lines = log.count("WEBHOOK_DELIVERY_FAILED");
    {
        let _full = TableFull::now();
        dispatcher.run_round().await.unwrap();
    }
    let row = db.read_request(id).await.unwrap();
    assert_eq!(
        (
            row.status.as_str(),
            row.last_request_result.as_str(),
            row.last_request_epoch,
            row.date_modified,
            &row.properties,
        ),
        (
            "queued",
            "none",
            0,
            before.date_modified,
            &before.properties
        ),
        "nothing written, the claim given back; log: {:?}",
        log.events()
    );
    assert_eq!(receiver.count(), 0);
    assert_eq!(metrics.local_failures(Shortage::Descriptors), 1);
    assert_eq!(log.count("WEBHOOK_LOCAL_FAILURE"), 1, "{:?}", log.events());
    assert_eq!(
        log.count("WEBHOOK_DELIVERY_FAILED"),
        failed_lines,
        "{:?}",
        log.events()
    );

    // Descriptors free again: the next round sends it, once.
    dispatcher.run_round().await.unwrap();
    let row = db.read_request(id).await.unwrap();
    assert_eq!(
        (row.status.as_str(), row.last_request_result.as_str()),
        ("sent", "okay")
    );
    assert_eq!(receiver.count(), 1);
    db.drop_database().await;
}
