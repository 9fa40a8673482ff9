//! A delivery whose process stood still (SIGSTOP, a frozen VM, a starved CPU) while the
//! receiver answered: the answer is read once the process runs again, not written as the
//! receiver's timeout (cURL's 28). Chaos seeds 212 and 213 (issue 32) found it: a
//! `retry=never` row the receiver took with a 200 ended `failed`/`timeout`, and a
//! `retry=forever` one was sent a second time.
//!
//! The process's stall is the test's runtime blocked: a current-thread runtime whose one
//! thread sleeps, while the receiver, on a thread of its own, answers.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use gorge_webhook::connector::ConnectionOptions;
use gorge_webhook::delivery::{Deliverer, DeliveryCounters, DeliveryError};
use gorge_webhook::policy::OutboundPolicy;
use phorge_wire::webhook::sign;

const KEY: &[u8] = b"abcdefghijklmnopqrstuvwxyz012345";
const BODY: &[u8] = b"{\n  \"object\": {}\n}\n";
const TIMEOUT: Duration = Duration::from_secs(1);

/// A receiver on its own thread: tells `arrived` when a request came, answers 200 when told
/// on `answer` (after the pause it is given), and `answered` once it has.
fn receiver(
    arrived: tokio::sync::oneshot::Sender<()>,
    answer: mpsc::Receiver<Duration>,
    answered: mpsc::Sender<()>,
) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.ends_with(BODY) {
            let n = socket.read(&mut buf).unwrap();
            assert!(n > 0, "the request ended early");
            request.extend_from_slice(&buf[..n]);
        }
        let _ = arrived.send(());
        let pause = answer.recv().unwrap();
        std::thread::sleep(pause);
        socket
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .unwrap();
        answered.send(()).unwrap();
        // Keep the connection open: the answer is what the sender must read.
        let _ = socket.read(&mut buf);
    });
    addr
}

/// A delivery of [`BODY`] to the receiver at `addr` with [`TIMEOUT`], started as a task of
/// the test's runtime.
async fn start_delivery(
    addr: std::net::SocketAddr,
    counters: DeliveryCounters,
) -> tokio::task::JoinHandle<Result<u16, DeliveryError>> {
    let policy = Arc::new(OutboundPolicy::parse("").unwrap());
    let deliverer = Deliverer::new(
        policy.clone(),
        TIMEOUT,
        counters,
        &ConnectionOptions::default(),
    );
    let target = policy
        .check(&format!("http://{addr}/hook"), Duration::from_secs(2))
        .await
        .unwrap();
    tokio::spawn(async move { deliverer.deliver(target, BODY, &sign(KEY, BODY)).await })
}

/// The process stands still for twice the timeout right after sending; the receiver answers
/// 300 ms after the process runs again — within the timeout of the process's running time.
/// Before, the deadline had passed on the wall clock when the process came back, and the
/// delivery ended as the receiver's timeout at once (`left: Err(Timeout)`). In the chaos
/// runs the answer had come during the stop; which the runtime then sees first, the answer
/// or the deadline, is up to its scheduling, so the test has the answer come just after.
#[tokio::test(flavor = "current_thread")]
async fn an_answer_within_the_timeout_of_running_time_after_a_stall_is_read_not_a_timeout() {
    let (arrived_tx, arrived) = tokio::sync::oneshot::channel();
    let (answer_tx, answer_rx) = mpsc::channel();
    let (answered_tx, answered) = mpsc::channel();
    let addr = receiver(arrived_tx, answer_rx, answered_tx);
    let counters = DeliveryCounters::default();
    let delivery = start_delivery(addr, counters.clone()).await;
    arrived.await.unwrap();
    // The process stands still from here for twice the timeout.
    std::thread::sleep(TIMEOUT * 2);
    answer_tx.send(Duration::from_millis(300)).unwrap();
    let result = delivery.await.unwrap();
    assert_eq!(result, Ok(200));
    answered.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(counters.deadlines_extended.get(), 1);
}

/// A receiver that does not answer still times out: the deadline moves on only by what the
/// process stood still, so the receiver gets its timeout of running time and no more.
#[tokio::test(flavor = "current_thread")]
async fn a_receiver_that_does_not_answer_times_out_after_a_stall_too() {
    let (arrived_tx, arrived) = tokio::sync::oneshot::channel();
    let (_answer_tx, answer_rx) = mpsc::channel();
    let (answered_tx, _answered) = mpsc::channel();
    let addr = receiver(arrived_tx, answer_rx, answered_tx);
    let started = std::time::Instant::now();
    let delivery = start_delivery(addr, DeliveryCounters::default()).await;
    arrived.await.unwrap();
    std::thread::sleep(TIMEOUT * 2);
    let result = delivery.await.unwrap();
    assert_eq!(result, Err(DeliveryError::Timeout));
    // The stall (2 s) plus the timeout (1 s), not the timeout alone; bounded.
    let took = started.elapsed();
    assert!(
        took >= TIMEOUT * 2 + TIMEOUT / 2 && took < TIMEOUT * 10,
        "{took:?}"
    );
}
