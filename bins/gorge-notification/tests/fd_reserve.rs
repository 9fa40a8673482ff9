//! Client connections can never take the descriptors the admin port needs: the client port
//! holds at most the open-file limit less a reserve (sockets and connections not yet
//! upgraded together), refuses the rest at once, and closes a connection that sends no
//! request within the upgrade deadline; both counted.

mod common;

use std::time::Duration;

use common::{Server, PATIENCE};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The server's soft limit; its client cap is then 300 (a quarter is kept back).
const NOFILE: u32 = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_client_connections_leave_the_admin_port_its_descriptors() {
    let server = Server::start_in_shell(&format!("ulimit -n {NOFILE}"), &[]);
    server
        .assert_metric("gorge_notification_client_connections_max", 300.0)
        .await;
    // More idle connections than the server has descriptors; none sends a byte.
    let mut idle = Vec::new();
    for _ in 0..NOFILE {
        idle.push(
            TcpStream::connect(("127.0.0.1", server.client_port))
                .await
                .unwrap(),
        );
    }
    let refused = r#"gorge_notification_client_connections_closed_total{reason="fd_reserve"}"#;
    gorge_testkit::eventually(PATIENCE, "connections over the cap refused", || async {
        server.metric(refused).await == Some(100.0)
    })
    .await;
    // PHP is answered: the admin port still has descriptors to accept with.
    let post = tokio::time::timeout(
        Duration::from_secs(5),
        server.post("", r#"{"key":"1","subscribers":["PHID-USER-nobody"]}"#),
    )
    .await
    .expect("the POST is answered while the client port is full");
    assert_eq!(post.status, 200);

    // None of them upgrades: each is closed at the deadline, and its place freed.
    for stream in &mut idle[..] {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "closed by the server: {read:?}"
        );
    }
    server
        .assert_metric(
            r#"gorge_notification_client_connections_closed_total{reason="upgrade_timeout"}"#,
            300.0,
        )
        .await;
    drop(idle);
    let mut browser = server.ws("/").await;
    browser.subscribe(&["PHID-USER-aaaaaaaaaaaaaaaaaaaa"]).await;
}
