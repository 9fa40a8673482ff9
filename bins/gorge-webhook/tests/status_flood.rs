//! Issue 30 item 1's drill: idle TCP connections to the status port of a process with a low
//! open-file limit must not take the descriptors deliveries need. Before the cap, ~250 idle
//! connections filled the table of a process limited to 256 descriptors and every row was
//! written `failed` with cURL's 7, as if the receiver had refused, opening the hook's
//! breaker. Now the status port holds at most the limit less the delivery reserve, closing
//! the rest at accept (counted), and the rows are delivered while the connections stay.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::{enabled_hook, queue, unix_now, Service};
use gorge_claim::testdb::{RequestStatus, TestDb};
use gorge_testkit::{free_port, within, Process, Receiver, PATIENCE};

/// The service's open-file limit, soft and hard: its reserve (100 with the defaults) leaves
/// the status port 156 connections.
const NOFILE: u64 = 256;
/// Idle connections opened: more than the whole table.
const IDLE: usize = 400;
const ROWS: usize = 20;
const PROPERTIES: &str = r#"{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[],"silent":false,"secure":false,"test":false}"#;

#[tokio::test]
async fn idle_status_connections_leave_deliveries_their_descriptors() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/hook")).await;
    let status_addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    // The service's command run under prlimit (util-linux), which sets the limit and execs.
    let service_command = Service::command(db.namespace(), status_addr, &[]);
    let mut command = Command::new("prlimit");
    command
        .arg(format!("--nofile={NOFILE}:{NOFILE}"))
        .arg("--")
        .arg(common::BIN)
        .env_clear();
    for (key, value) in service_command.get_envs() {
        if let Some(value) = value {
            command.env(key, value);
        }
    }
    let process = Process::spawn(command);
    assert!(process.wait_for_event("LISTENING", PATIENCE).is_some());
    let service = Service {
        process,
        status_addr,
    };

    // One delivery first: the pools hold connections, as in a service that has been running.
    queue(
        &db,
        &hook,
        "PHID-GRGX-statusflood000000",
        PROPERTIES,
        unix_now(),
    )
    .await;
    receiver.wait_for(1, PATIENCE);

    let mut idle: Vec<TcpStream> = (0..IDLE)
        .map(|_| TcpStream::connect(status_addr).expect("connect to the status port"))
        .collect();
    // The last connection is beyond the cap: the service closes it at once. Without the
    // cap it waits in the backlog while the table is full; either way, once this read
    // returns, the service has accepted all it will.
    let over = idle.last_mut().unwrap();
    over.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let closed_at_accept = matches!(over.read(&mut [0u8; 1]), Ok(0));

    let created = unix_now();
    for _ in 0..ROWS {
        queue(
            &db,
            &hook,
            "PHID-GRGX-statusflood000000",
            PROPERTIES,
            created,
        )
        .await;
    }
    // Rows sent: the warm-up's and these.
    let all_sent = within(PATIENCE, || async {
        db.count_requests(RequestStatus::Sent).await.unwrap() == ROWS as u64 + 1
    })
    .await;
    assert_eq!(
        (
            db.count_requests(RequestStatus::Sent).await.unwrap(),
            db.count_requests(RequestStatus::Failed).await.unwrap()
        ),
        (ROWS as u64 + 1, 0),
        "every row sent while the idle connections stay (in time: {all_sent}); failures: {:?}",
        service.process.log_events("WEBHOOK_DELIVERY_FAILED")
    );
    assert_eq!(receiver.count(), ROWS + 1);
    assert!(
        closed_at_accept,
        "a connection over the cap is closed at accept"
    );
    drop(idle);
    // Probes answer again once the connections are gone.
    let refused =
        service.metric("gorge_webhook_status_connections_closed_total{reason=\"fd_reserve\"}");
    assert!(refused >= 1.0, "refused connections are counted: {refused}");
    assert_eq!(
        service.metric("gorge_webhook_status_connections_max"),
        156.0
    );
    assert_eq!(service.metric("gorge_webhook_breaker_open_hooks"), 0.0);
    service.terminate();
    db.drop_database().await;
}
