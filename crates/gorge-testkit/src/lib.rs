//! Test support shared by the gorge crates (a dev-dependency only): free loopback ports,
//! a simulated `JX.Aphlict` browser,
//! one wrapper for the child processes integration tests start, one raw HTTP/1.1 client and
//! one scripted HTTP receiver, one slog drain that captures events, the reading of the
//! `--check-config` report, the shipped deploy files' checks against a binary, the check of
//! the alerting rules and dashboards against a real `/metrics`, and what the test suite needs
//! from the machine ([`prerequisites`]).
//!
//! Tests speak raw HTTP/1.1 on purpose: the services' byte-level answers (status lines,
//! header case, bodies) are part of their contract, and a full client would normalise them.

pub mod browser;
pub mod capture;
pub mod check_config;
pub mod deploy;
pub mod healthcheck;
pub mod http;
pub mod monitoring;
pub mod prerequisites;
pub mod process;
pub mod receiver;

use std::future::Future;
use std::net::TcpListener;
use std::time::{Duration, Instant};

pub use capture::CapturedLog;
pub use process::Process;
pub use receiver::{Receiver, Recorded, Reply};

/// Upper bound for any single wait; only reached when a test is failing.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A loopback port that was free a moment ago (bound, then released). Another process may
/// take it before the caller binds it; callers that start servers on it retry on failure.
/// Never use it as "nothing listens here": that is [`RefusedPort`].
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// A loopback port on which nothing listens and nothing else can: a bound TCP socket that
/// never listens. A connection to it is refused (RST), as to a closed port, but unlike a port
/// that was free a moment ago no parallel test can bind it meanwhile (the socket holds it, and
/// sets no `SO_REUSEADDR`). Keep it alive for as long as the port must stay refused.
#[derive(Debug)]
pub struct RefusedPort {
    _socket: tokio::net::TcpSocket,
    port: u16,
}

impl RefusedPort {
    /// Binds a fresh loopback port without listening on it.
    pub fn new() -> RefusedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind a loopback port");
        let port = socket.local_addr().expect("a bound address").port();
        RefusedPort {
            _socket: socket,
            port,
        }
    }

    /// Holds `port`, on which a server of this test listens now (with `SO_REUSEPORT`, as
    /// gorge's listeners do), so that once that server is gone the port refuses connections
    /// instead of going back to the kernel, which could hand it to a parallel test's server:
    /// a peer that still sends to the dead server's address would then reach a live one. It
    /// binds beside the listener with `SO_REUSEPORT` and never listens, and the kernel sends
    /// connections only to listening sockets, so the server keeps getting them until it goes.
    pub fn hold(port: u16) -> RefusedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket.set_reuseport(true).expect("SO_REUSEPORT");
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .expect("bind beside the server's listener");
        RefusedPort {
            _socket: socket,
            port,
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts listening on the port after all (a server that "comes up" where nothing
    /// answered before): a blocking std listener. Must run inside a Tokio runtime.
    pub fn listen(self) -> std::net::TcpListener {
        let listener = self
            ._socket
            .listen(128)
            .expect("listen on the held port")
            .into_std()
            .expect("a std listener");
        listener
            .set_nonblocking(false)
            .expect("a blocking listener");
        listener
    }
}

impl Default for RefusedPort {
    fn default() -> Self {
        RefusedPort::new()
    }
}

/// `count` distinct free loopback ports, taken from the kernel together.
pub fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    listeners
        .iter()
        .map(|listener| listener.local_addr().unwrap().port())
        .collect()
}

/// How often the waits below look again.
const POLL: Duration = Duration::from_millis(20);

/// Polls `check` every 20 ms until it is true; panics with `what` after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(
        within(timeout, check).await,
        "timed out waiting for: {what}"
    );
}

/// Polls `check` every 20 ms until it is true or `timeout` passed; whether it became true.
/// For a wait whose caller reports a failure itself, with what it saw.
pub async fn within<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`within`] for code outside a runtime (a child process, a server starting).
pub fn within_blocking(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// The value of the sample `series` (name and labels exactly as printed, e.g.
/// `gorge_webhook_claims_total{result="won"}`) in a Prometheus text exposition.
pub fn sample(metrics_text: &str, series: &str) -> Option<f64> {
    metrics_text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().expect("a numeric sample"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_waits_say_whether_the_condition_came_true_in_time() {
        let mut looks = 0;
        let came = within(PATIENCE, || {
            looks += 1;
            std::future::ready(looks == 3)
        })
        .await;
        assert!(came && looks == 3);
        assert!(!within(POLL, || std::future::ready(false)).await);
        assert!(within_blocking(PATIENCE, || true));
        assert!(!within_blocking(POLL, || false));
    }

    #[tokio::test]
    #[should_panic(expected = "timed out waiting for: nothing")]
    async fn eventually_names_what_never_came() {
        eventually(POLL, "nothing", || std::future::ready(false)).await;
    }
}
