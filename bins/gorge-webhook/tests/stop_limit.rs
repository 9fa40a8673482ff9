//! A stopping process and the time the deploy files give it. The unit's `TimeoutStopSec` and
//! the chart's grace period come from the binary's own `stop_within_sec` (`--check-config`;
//! tests/deploy.rs, scripts/check-deploy.sh), so a process killed at that limit has had the
//! whole of its stop — here, a result write held up by a database outage that ends shortly
//! before the claim's lease does. Killed earlier, the row stays claimed, goes out again
//! after the lease, and the receiver gets a second POST.

mod common;

use std::time::{Duration, Instant};

use common::{enabled_hook, queue, unix_now, DbProxy, Service};
use gorge_claim::testdb::{RequestStatus, TestDb};
use gorge_testkit::check_config::checked;
use gorge_testkit::{eventually, Receiver, Reply};

const NEVER: &str = r#"{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[]}"#;

/// Longer than the delivery timeout needs, so that the outage can outlast the time the
/// deploy files used to give a stop (delivery timeout + 15 s) and still end inside the lease.
const LEASE_SEC: u64 = 21;

/// The limit the deploy files give a stopping process with this configuration: what the
/// binary prints as `stop_within_sec` for it.
fn deploy_stop_limit(namespace: &str, env: &[(&str, &str)]) -> Duration {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
    let output = Service::command(namespace, addr, env)
        .arg("--check-config")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let (seconds, _) = checked(&stdout, "stop_within_sec");
    Duration::from_secs(seconds.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_database_outage_killed_at_the_deploy_limit_posts_each_row_once() {
    let db = TestDb::create().await.unwrap();
    let proxy = DbProxy::start().await;
    let receiver = Receiver::with(|_, _| Reply::Hold(200));
    let hook = enabled_hook(&db, &receiver.url("/h")).await;
    let id = queue(&db, &hook, "PHID-TASK-a", NEVER, unix_now()).await;
    let port = proxy.addr.port().to_string();
    let lease = LEASE_SEC.to_string();
    let env = [
        ("GORGE_WEBHOOK_MYSQL_HOST", "127.0.0.1"),
        ("GORGE_WEBHOOK_MYSQL_PORT", port.as_str()),
        ("GORGE_WEBHOOK_DELIVERY_TIMEOUT", "1"),
        ("GORGE_WEBHOOK_CLAIM_LEASE_SEC", lease.as_str()),
        ("GORGE_WEBHOOK_MYSQL_QUERY_TIMEOUT_SEC", "1"),
    ];
    let limit = deploy_stop_limit(db.namespace(), &env);
    let mut first = Service::start(db.namespace(), &env);

    // The row is claimed and its POST in flight when the database goes away and SIGTERM
    // comes; the receiver answers at once after that.
    let waiting = receiver.clone();
    tokio::task::spawn_blocking(move || waiting.wait_for(1, Duration::from_secs(30)))
        .await
        .unwrap();
    let posted = Instant::now();
    // The claim's version is the clock's second at the claim, or one more.
    let lease_end = unix_now() + 1 + LEASE_SEC;
    proxy.outage();
    first.terminate();
    let terminated = Instant::now();
    receiver.release();
    // The outage ends 3 s before the claim's lease: the result write still lands.
    let restoring = {
        let proxy = proxy.clone();
        let back = posted + Duration::from_secs(LEASE_SEC - 3);
        tokio::spawn(async move {
            tokio::time::sleep_until(back.into()).await;
            proxy.restore();
        })
    };
    // At the deploy files' limit the process is killed, as systemd and the kubelet do.
    let left = limit.saturating_sub(terminated.elapsed());
    let exited = gorge_testkit::within(left, || {
        std::future::ready(first.process.try_wait().is_some())
    })
    .await;
    if !exited {
        first.process.kill();
    }
    restoring.await.unwrap();

    // Another process polls the table until the claim's lease is over.
    let second = Service::start(db.namespace(), &env);
    eventually(
        Duration::from_secs(LEASE_SEC + 10),
        "the claim's lease is over",
        || async { unix_now() > lease_end },
    )
    .await;
    second.wait_polls(3).await;
    assert_eq!(
        receiver.count(),
        1,
        "one POST for the row (the first process was {} at the {} s limit)",
        if exited { "not killed" } else { "killed" },
        limit.as_secs()
    );
    assert_eq!(
        db.read_request(id).await.unwrap().status,
        RequestStatus::Sent
    );
    drop(second);
    db.drop_database().await;
}
