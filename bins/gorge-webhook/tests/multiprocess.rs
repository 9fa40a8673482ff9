//! Several real processes on one table: exactly-once delivery with per-hook serialization,
//! and the at-least-once boundary when a process dies mid-POST.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{enabled_hook, unix_now, Service};
use gorge_claim::testdb::{HookStatus, NewRequest, RequestStatus, TestDb};
use gorge_testkit::{eventually, Receiver, Reply};

const ROWS: usize = 2_000;
const HOOKS: usize = 20;

fn claims_won(service: &Service) -> u64 {
    service.metric("gorge_webhook_claims_total{result=\"won\"}") as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_deliver_every_row_exactly_once_one_request_per_hook_at_a_time() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hooks: Vec<String> = (0..HOOKS)
        .map(|n| db.tagged_hook_phid(format!("{n:02}")))
        .collect();
    for (n, hook) in hooks.iter().enumerate() {
        db.insert_hook(
            hook,
            &receiver.url(&format!("/hook/{n}")),
            HookStatus::Enabled,
            "k",
        )
        .await
        .unwrap();
    }
    let rows: Vec<NewRequest> = (0..ROWS)
        .map(|i| {
            NewRequest::new(&hooks[i % HOOKS], &format!("PHID-TASK-{i:08}"))
                .with_phid(&format!("PHID-HWBR-{i:08}"))
                .with_properties(r#"{"retry":"forever"}"#)
        })
        .collect();
    db.insert_requests(&rows, unix_now()).await.unwrap();

    let started = Instant::now();
    let services: Vec<Service> = (0..4)
        .map(|_| Service::start(db.namespace(), &[("GORGE_WEBHOOK_POLL_INTERVAL_MS", "100")]))
        .collect();
    eventually(Duration::from_secs(240), "every row sent", || async {
        db.count_requests(RequestStatus::Sent).await.unwrap() == ROWS as u64
    })
    .await;
    let elapsed = started.elapsed();
    // Nothing more may arrive once every row is sent: every process polls the sent rows
    // twice more first.
    for service in &services {
        service.wait_polls(2).await;
    }

    let requests = receiver.requests();
    let mut per_object: HashMap<String, usize> = HashMap::new();
    for request in &requests {
        *per_object.entry(request.object_phid()).or_default() += 1;
    }
    let duplicates: Vec<_> = per_object.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicates.is_empty(),
        "delivered more than once: {duplicates:?}"
    );
    assert_eq!(per_object.len(), ROWS);
    assert_eq!(requests.len(), ROWS);
    assert_eq!(
        receiver.max_in_flight_per_path(),
        1,
        "a hook saw concurrent requests"
    );
    let won: u64 = services.iter().map(claims_won).sum();
    assert_eq!(won, ROWS as u64, "claims won across processes");
    eprintln!(
        "4 processes delivered {ROWS} rows over {HOOKS} hooks in {:.2}s ({:.0}/s)",
        elapsed.as_secs_f64(),
        ROWS as f64 / elapsed.as_secs_f64()
    );
    drop(services);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_mid_post_is_redelivered_once_after_the_lease() {
    let db = TestDb::create().await.unwrap();
    // The first POST is held until the end of the test (its sender dies); later ones succeed.
    let receiver = Receiver::with(|_, index| {
        if index == 0 {
            Reply::Hold(200)
        } else {
            Reply::Status(200)
        }
    });
    let hook = enabled_hook(&db, &receiver.url("/crash")).await;
    let id = db
        .insert_request(&NewRequest::new(&hook, "PHID-TASK-crash"), unix_now())
        .await
        .unwrap();
    // A short lease: raised to the delivery timeout + 5 s = 8 s.
    let env = [
        ("GORGE_WEBHOOK_DELIVERY_TIMEOUT", "3"),
        ("GORGE_WEBHOOK_CLAIM_LEASE_SEC", "1"),
        ("GORGE_WEBHOOK_POLL_INTERVAL_MS", "100"),
    ];
    let mut first = Service::start(db.namespace(), &env);
    let waiting = receiver.clone();
    tokio::task::spawn_blocking(move || waiting.wait_for(1, Duration::from_secs(30)))
        .await
        .unwrap();
    first.process.kill(); // SIGKILL while the POST is in flight
    let claimed = db.read_request(id).await.unwrap();
    assert_eq!(
        (
            claimed.status.as_str(),
            claimed.last_request_result.as_str()
        ),
        ("queued", "none"),
        "the dead process wrote nothing"
    );

    let _second = Service::start(db.namespace(), &env);
    eventually(
        Duration::from_secs(40),
        "row re-delivered and sent",
        || async { db.read_request(id).await.unwrap().status == RequestStatus::Sent },
    )
    .await;
    let requests = receiver.requests();
    assert_eq!(requests.len(), 2, "at-least-once: exactly one re-delivery");
    assert_eq!(
        requests[0].body, requests[1].body,
        "a re-delivery is byte-identical"
    );
    let row = db.read_request(id).await.unwrap();
    assert!(
        row.last_request_epoch >= claimed.date_modified + 8,
        "re-claimed only after the lease: claim at {}, result at {}",
        claimed.date_modified,
        row.last_request_epoch
    );
    receiver.release();
    db.drop_database().await;
}
