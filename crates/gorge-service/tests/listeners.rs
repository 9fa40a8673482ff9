//! Listener mechanics over real loopback sockets: a request that never finishes arriving is
//! cut off, and a second process can bind the same port (`SO_REUSEPORT`) and takes every new
//! connection once the first one starts draining, and the first closes its kept-alive
//! connections then too (so clients' next requests reach the second); a listener served on a
//! runtime of its own accepts however busy the runtime that bound it is.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gorge_service::http::{bytes_response, read_body_limited};
use gorge_service::shutdown::{no_drain, run, RunOptions, Shutdown};
use gorge_service::{bind_all, Handler, ListenerSpec, Probes};
use gorge_testkit::http;
use hyper::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Mutex};

/// Only reached when a test is failing.
const PATIENCE: Duration = Duration::from_secs(20);

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

/// Reads the whole body, then answers `served by <name>`.
fn handler(name: &'static str) -> Handler {
    Arc::new(move |request, _peer| {
        Box::pin(async move {
            let _ = read_body_limited(request, 1 << 20).await;
            bytes_response(StatusCode::OK, "text/plain", format!("served by {name}"))
        })
    })
}

fn spec(name: &'static str, addr: SocketAddr) -> ListenerSpec {
    ListenerSpec {
        name: name.into(),
        addr,
        handler: handler(name),
    }
}

fn options(shutdown: &Shutdown) -> RunOptions {
    RunOptions {
        drain_deadline: Duration::from_secs(10),
        request_grace: Duration::from_secs(1),
        shutdown: shutdown.clone(),
    }
}

/// Serves one `admin` listener on a free loopback port, each listener set up by `adjust`;
/// returns its address, the shutdown that stops it and the server's task.
async fn serve_admin(
    adjust: impl Fn(gorge_service::BoundListener) -> gorge_service::BoundListener,
) -> (
    SocketAddr,
    Shutdown,
    tokio::task::JoinHandle<Result<(), gorge_service::RunError>>,
) {
    let bound = bind_all(vec![spec("admin", "127.0.0.1:0".parse().unwrap())])
        .await
        .unwrap();
    let bound: Vec<_> = bound.into_iter().map(adjust).collect();
    let addr = bound[0].local_addr();
    let shutdown = Shutdown::new();
    let probes = Probes::new(Default::default(), Probes::always_ready());
    let opts = options(&shutdown);
    let server = tokio::spawn(async move { run(bound, probes, no_drain(), opts, &logger()).await });
    (addr, shutdown, server)
}

async fn get(addr: SocketAddr) -> String {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    };
    tokio::time::timeout(PATIENCE, exchange).await.unwrap()
}

/// A kept-alive connection whose first request `name` answered (tries new connections until
/// one lands there: the kernel spreads them over both listeners).
async fn kept_alive_on(addr: SocketAddr, name: &str) -> TcpStream {
    for _ in 0..200 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut response = Vec::new();
        let mut buf = [0u8; 1024];
        while !response.ends_with(b"served by one") && !response.ends_with(b"served by two") {
            let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "closed before answering");
            response.extend_from_slice(&buf[..n]);
        }
        if response.ends_with(format!("served by {name}").as_bytes()) {
            return stream;
        }
    }
    panic!("no connection landed on {name}");
}

#[tokio::test]
async fn a_chunked_body_that_never_ends_gets_408_and_the_connection_closes() {
    let (addr, shutdown, server) =
        serve_admin(|l| l.with_timeouts(Duration::from_secs(5), Duration::from_millis(300))).await;

    // One more chunk now and then would not help either: the deadline is for the request.
    let chunked = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n";
    let response = http::raw(addr.port(), chunked).await;
    assert_eq!(response.status, 408, "{response:?}");
    assert!(
        response.text().contains(r#""code":"ERR_TIMEOUT""#),
        "{response:?}"
    );

    shutdown.trigger();
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_binds_the_same_port_and_takes_over_when_the_first_drains() {
    let first = bind_all(vec![spec("one", "127.0.0.1:0".parse().unwrap())])
        .await
        .unwrap();
    let first: Vec<_> = first
        .into_iter()
        .map(|l| l.close_at_drain_start())
        .collect();
    let addr = first[0].local_addr();
    // While the first still listens, the second binds the very same address.
    let second = bind_all(vec![spec("two", addr)])
        .await
        .expect("SO_REUSEPORT");

    let (draining_tx, draining_rx) = oneshot::channel();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let gate = Arc::new(Mutex::new(Some((draining_tx, release_rx))));
    let drain: gorge_service::DrainHook = Box::new(move || {
        Box::pin(async move {
            if let Some((draining, release)) = gate.lock().await.take() {
                let _ = draining.send(());
                let _ = release.await;
            }
        })
    });
    let one = Shutdown::new();
    let probes = Probes::new(Default::default(), Probes::always_ready());
    let opts = options(&one);
    let first = tokio::spawn(async move { run(first, probes, drain, opts, &logger()).await });
    let two = Shutdown::new();
    let probes = Probes::new(Default::default(), Probes::always_ready());
    let opts = options(&two);
    let second =
        tokio::spawn(async move { run(second, probes, no_drain(), opts, &logger()).await });

    let mut kept_alive = kept_alive_on(addr, "one").await;

    one.trigger();
    draining_rx.await.unwrap();
    // Its kept-alive connection is closed too, while the drain still runs: a client's next
    // request on a new connection reaches the second.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(PATIENCE, kept_alive.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "kept-alive connection still open: {closed:?}"
    );
    assert!(
        !release_tx.is_closed(),
        "the kept-alive connection was closed only once the drain was over"
    );
    // The first is draining (its hook is running), its listener is closed: every new
    // connection lands on the second.
    for _ in 0..20 {
        let response = get(addr).await;
        assert!(response.ends_with("served by two"), "{response}");
    }
    release_tx.send(()).unwrap();
    first.await.unwrap().unwrap();
    two.trigger();
    second.await.unwrap().unwrap();
}

/// A runtime shut down without waiting when dropped (a test that fails may drop it inside
/// the test's runtime, where a blocking shutdown is not allowed).
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The admin port's case: its listener is served on a one-thread runtime of its own, and the
/// runtime that bound it has its only worker stuck (as a flood of client sockets keeps it
/// busy). A connection is still accepted and answered. Before, the listener stayed
/// registered with the binding runtime's reactor, so its connections were seen only when
/// that runtime's worker polled it: here never (the request timed out), under a flood
/// 100–500 ms later, all of it before the accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_listener_on_its_own_runtime_accepts_while_the_binding_runtime_is_stuck() {
    let own = OwnRuntime(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap(),
    ));
    let handle = own.0.as_ref().unwrap().handle().clone();
    let (addr, shutdown, server) = serve_admin(|l| l.on_runtime(handle.clone())).await;
    assert!(get(addr).await.ends_with("served by admin"));

    // The test's runtime has one worker: a task that blocks it leaves nothing to poll that
    // runtime's reactor. It is released when `release` is dropped (also if the test fails).
    let (release, stuck) = std::sync::mpsc::channel::<()>();
    let (blocked_tx, blocked) = std::sync::mpsc::channel();
    tokio::spawn(async move {
        blocked_tx.send(()).unwrap();
        let _ = stuck.recv_timeout(PATIENCE * 2);
    });
    blocked.recv_timeout(PATIENCE).unwrap();
    // Blocking code on the test's own thread, which is not a worker.
    let request = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let response = http::raw_blocking(addr, request);
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(response.text(), "served by admin");
    drop(release);

    shutdown.trigger();
    server.await.unwrap().unwrap();
}
