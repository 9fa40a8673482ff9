//! The serving lifecycle over real loopback sockets: bind-all-or-nothing, the shutdown order
//! (readiness off before the service drain), in-flight requests finishing, nothing served after.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gorge_service::http::bytes_response;
use gorge_service::shutdown::{no_drain, run, RunOptions, Shutdown};
use gorge_service::{bind_all, Handler, ListenerSpec, Probes};
use hyper::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Mutex};

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Signals that `/slow` was entered, then waits to be released.
type Gate = Arc<Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>>;

/// Answers `/slow` only once `release` fires, after telling `entered`; everything else at once.
fn handler(probes: Arc<Probes>, gate: Gate) -> Handler {
    Arc::new(move |request, _peer| {
        let probes = probes.clone();
        let gate = gate.clone();
        Box::pin(async move {
            let path = request.uri().path().to_string();
            if let Some(response) = probes.handle(&request).await {
                return response;
            }
            if path == "/slow" {
                let taken = gate.lock().await.take();
                if let Some((entered, release)) = taken {
                    let _ = entered.send(());
                    let _ = release.await;
                }
            }
            bytes_response(StatusCode::OK, "text/plain", format!("served {path}"))
        })
    })
}

async fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

#[tokio::test]
async fn a_failed_second_bind_leaves_nothing_listening() {
    let occupied = std::net::TcpListener::bind(loopback()).unwrap();
    let taken = occupied.local_addr().unwrap();
    let free = std::net::TcpListener::bind(loopback())
        .unwrap()
        .local_addr()
        .unwrap();
    let probes = Probes::new(Default::default(), Probes::always_ready());
    let gate = Arc::new(Mutex::new(None));
    let specs = vec![
        ListenerSpec {
            name: "first".into(),
            addr: free,
            handler: handler(probes.clone(), gate.clone()),
        },
        ListenerSpec {
            name: "second".into(),
            addr: taken,
            handler: handler(probes, gate),
        },
    ];
    let err = match bind_all(specs).await {
        Ok(_) => panic!("binding an occupied port must fail"),
        Err(err) => err,
    };
    assert_eq!(err.addr, taken);
    assert!(err.to_string().contains(&taken.to_string()), "{err}");
    assert!(err.to_string().contains("second"), "{err}");
    // The first listener was bound and then released: nothing answers there.
    assert!(
        TcpStream::connect(free).await.is_err(),
        "first listener still accepting"
    );
}

#[tokio::test]
async fn shutdown_turns_readiness_off_drains_and_finishes_in_flight_requests() {
    let probes = Probes::new(Default::default(), Probes::always_ready());
    let (entered_tx, entered_rx) = oneshot::channel();
    let (release_tx, release_rx) = oneshot::channel();
    let gate = Arc::new(Mutex::new(Some((entered_tx, release_rx))));
    let specs = vec![
        ListenerSpec {
            name: "a".into(),
            addr: loopback(),
            handler: handler(probes.clone(), gate.clone()),
        },
        ListenerSpec {
            name: "b".into(),
            addr: loopback(),
            handler: handler(probes.clone(), gate),
        },
    ];
    let bound = bind_all(specs).await.unwrap();
    let (a, b) = (bound[0].local_addr(), bound[1].local_addr());

    let drained_while_not_ready = Arc::new(AtomicBool::new(false));
    let seen = drained_while_not_ready.clone();
    let probes_in_hook = probes.clone();
    let drain = Box::new(
        move || -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
            Box::pin(async move {
                seen.store(probes_in_hook.is_draining(), Ordering::SeqCst);
            })
        },
    );
    let shutdown = Shutdown::new();
    let opts = RunOptions {
        drain_deadline: Duration::from_secs(5),
        request_grace: Duration::from_secs(5),
        shutdown: shutdown.clone(),
    };
    let log = logger();
    let server = tokio::spawn(async move { run(bound, probes, drain, opts, &log).await });

    assert!(get(a, "/healthz")
        .await
        .unwrap()
        .ends_with(r#"{"status":"ok"}"#));
    assert!(get(b, "/readyz").await.unwrap().starts_with("HTTP/1.1 200"));

    let in_flight = tokio::spawn(get(b, "/slow"));
    entered_rx.await.unwrap();
    shutdown.trigger();
    // The request started before shutdown still gets its answer.
    release_tx.send(()).unwrap();
    let response = in_flight.await.unwrap().unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("served /slow"), "{response}");

    server.await.unwrap().unwrap();
    assert!(
        drained_while_not_ready.load(Ordering::SeqCst),
        "drain hook ran before readiness went off"
    );
    assert!(
        TcpStream::connect(a).await.is_err(),
        "listener a still accepting after shutdown"
    );
    assert!(
        TcpStream::connect(b).await.is_err(),
        "listener b still accepting after shutdown"
    );
}

#[tokio::test]
async fn healthcheck_exit_codes() {
    let probes = Probes::new(Default::default(), Probes::always_ready());
    let bound = bind_all(vec![ListenerSpec {
        name: "health".into(),
        addr: loopback(),
        handler: handler(probes.clone(), Arc::new(Mutex::new(None))),
    }])
    .await
    .unwrap();
    let addr = bound[0].local_addr();
    let shutdown = Shutdown::new();
    let opts = RunOptions {
        drain_deadline: Duration::from_secs(1),
        request_grace: Duration::from_secs(1),
        shutdown: shutdown.clone(),
    };
    let log = logger();
    let server = tokio::spawn(async move { run(bound, probes, no_drain(), opts, &log).await });
    let code = tokio::task::spawn_blocking(move || {
        gorge_service::healthcheck::healthcheck(gorge_service::healthcheck::HealthTarget::plain(
            addr,
        ))
    })
    .await
    .unwrap();
    assert_eq!(code, 0);
    shutdown.trigger();
    server.await.unwrap().unwrap();
    let code = tokio::task::spawn_blocking(move || {
        gorge_service::healthcheck::healthcheck(gorge_service::healthcheck::HealthTarget::plain(
            addr,
        ))
    })
    .await
    .unwrap();
    assert_eq!(code, 1);
}
