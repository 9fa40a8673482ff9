//! Listening: every listener is bound before any serves, so a process never runs half-alive
//! with one port open and another missing; then each accepted connection is served by hyper
//! (HTTP/1.1 with upgrades, so WebSocket handlers can take the connection over).
//!
//! Listeners bind with `SO_REUSEPORT`, so a new process can bind the same ports while an old
//! one drains (an in-place restart); [`crate::shutdown::run`] closes them when the drain
//! starts if they ask for it ([`BoundListener::close_at_drain_start`]). Reading a request is time-limited twice: its head by hyper's header timeout, and
//! the whole request (head, body and handler) by a request deadline, so a body that never
//! ends does not hold a connection forever.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use slog::Logger;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::http::{error_response, Response};
use crate::{emit, events};

/// Handles one request; the second argument is the peer's address.
pub type Handler = Arc<
    dyn Fn(hyper::Request<Incoming>, SocketAddr) -> Pin<Box<dyn Future<Output = Response> + Send>>
        + Send
        + Sync,
>;

/// How long a client may take to send a request's headers before the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one request may take from its head to the handler's response (body included);
/// past it the client gets `408` and the connection is closed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Pending connections the kernel queues per listener.
const BACKLOG: u32 = 1024;

/// At most one log line per this interval about failing accepts (they come in floods).
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Back-off after an accept error that is about resources (out of file descriptors), which
/// would otherwise spin the accept loop.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// A listener to open: a name for logs and errors, an address, and its request handler.
pub struct ListenerSpec {
    /// Name used in logs and in a [`BindError`] (`admin`, `client`, `status`…).
    pub name: String,
    /// Address to bind; port 0 picks a free port.
    pub addr: SocketAddr,
    /// Serves every request accepted on this listener.
    pub handler: Handler,
}

/// A bound listener, not yet serving.
pub struct BoundListener {
    name: String,
    listener: TcpListener,
    local_addr: SocketAddr,
    handler: Handler,
    header_timeout: Duration,
    request_timeout: Duration,
    accept_errors: Counter,
    close_at_drain_start: bool,
}

impl BoundListener {
    /// The name given in its [`ListenerSpec`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Replaces the head and whole-request time limits (defaults [`HEADER_READ_TIMEOUT`],
    /// [`REQUEST_TIMEOUT`]).
    pub fn with_timeouts(mut self, header: Duration, request: Duration) -> Self {
        self.header_timeout = header;
        self.request_timeout = request;
        self
    }

    /// Closes this listener as soon as the drain starts rather than after the service's
    /// drain hook, so a new process on the same port takes every new connection meanwhile
    /// (readiness is then answered by the new process, not with 503 by this one). Its
    /// kept-alive connections are shut down gracefully then too (a request in flight is
    /// answered, an idle connection closes), so clients that pool connections (peers' relays,
    /// PHP) reach the new process with their next request; upgraded connections are the
    /// service's own.
    pub fn close_at_drain_start(mut self) -> Self {
        self.close_at_drain_start = true;
        self
    }

    pub(crate) fn closes_at_drain_start(&self) -> bool {
        self.close_at_drain_start
    }

    /// Counts failed accepts (out of file descriptors and the like) in `counter`.
    pub fn with_accept_error_counter(mut self, counter: Counter) -> Self {
        self.accept_errors = counter;
        self
    }

    /// The address actually bound (differs from the requested one for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

/// A listener that could not be bound; [`bind_all`] stops at the first one.
#[derive(Debug)]
pub struct BindError {
    /// The listener's name from its [`ListenerSpec`].
    pub name: String,
    /// The address that could not be bound.
    pub addr: SocketAddr,
    /// Why (address in use, permission denied…).
    pub source: io::Error,
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot listen on {} ({} listener): {}",
            self.addr, self.name, self.source
        )
    }
}

impl std::error::Error for BindError {}

/// Binds every listener. If any bind fails, the ones already bound are closed (dropped) and
/// the error names the address that failed.
pub async fn bind_all(specs: Vec<ListenerSpec>) -> Result<Vec<BoundListener>, BindError> {
    let mut bound = Vec::with_capacity(specs.len());
    for spec in specs {
        let bind = bind_reuseport(spec.addr)
            .and_then(|listener| listener.local_addr().map(|addr| (listener, addr)));
        match bind {
            Ok((listener, local_addr)) => bound.push(BoundListener {
                name: spec.name,
                listener,
                local_addr,
                handler: spec.handler,
                header_timeout: HEADER_READ_TIMEOUT,
                request_timeout: REQUEST_TIMEOUT,
                accept_errors: Counter::default(),
                close_at_drain_start: false,
            }),
            Err(source) => {
                return Err(BindError {
                    name: spec.name,
                    addr: spec.addr,
                    source,
                })
            }
        }
    }
    Ok(bound)
}

/// A listening socket with `SO_REUSEADDR` and `SO_REUSEPORT` set before binding.
fn bind_reuseport(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// When to stop: `accept` closes the listener (the drain has started), `connections` asks
/// open connections to finish (in-flight requests complete, keep-alive ends).
pub(crate) struct Stops {
    pub accept: watch::Receiver<bool>,
    pub connections: watch::Receiver<bool>,
}

/// Accepts and serves connections until `stops.accept` turns true, then returns, closing the
/// listener; the connections it started live on until `stops.connections`. Each connection
/// task holds a clone of `open_connections` so the caller can wait for all of them to close.
///
/// Returns an error only when accepting fails for a reason other than resource exhaustion:
/// the listener is then considered dead. Resource exhaustion (EMFILE, ENFILE…) is counted
/// and logged at most once per [`ACCEPT_ERROR_LOG_INTERVAL`].
pub(crate) async fn serve(
    bound: BoundListener,
    mut stops: Stops,
    open_connections: watch::Receiver<()>,
    log: Logger,
) -> io::Result<()> {
    let mut last_logged: Option<Instant> = None;
    let mut unlogged = 0u64;
    let timeouts = (bound.header_timeout, bound.request_timeout);
    loop {
        let accepted = tokio::select! {
            _ = stopped(&mut stops.accept) => return Ok(()),
            accepted = bound.listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let handler = bound.handler.clone();
                let stop = stops.connections.clone();
                let guard = open_connections.clone();
                tokio::spawn(serve_connection(
                    stream, peer, handler, timeouts, stop, guard,
                ));
            }
            Err(err) if is_transient_accept_error(&err) => {
                bound.accept_errors.inc();
                unlogged += 1;
                if last_logged.is_none_or(|at| at.elapsed() >= ACCEPT_ERROR_LOG_INTERVAL) {
                    emit!(log, events::ACCEPT_FAILED;
                        "listener" => &bound.name, "error" => %err, "failures" => unlogged);
                    last_logged = Some(Instant::now());
                    unlogged = 0;
                }
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
            Err(err) => return Err(err),
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    handler: Handler,
    (header_timeout, request_timeout): (Duration, Duration),
    mut stop: watch::Receiver<bool>,
    _open_connection: watch::Receiver<()>,
) {
    // Small responses and WebSocket frames should not wait for Nagle's algorithm.
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |request| {
        let handler = handler.clone();
        async move {
            let response = tokio::time::timeout(request_timeout, handler(request, peer))
                .await
                .unwrap_or_else(|_| request_timed_out());
            Ok::<_, Infallible>(response)
        }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = stopped(&mut stop) => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// `408` for a request that was not read and handled in time; the connection closes after it
/// (the rest of its body is never read).
fn request_timed_out() -> Response {
    let mut response = error_response(StatusCode::REQUEST_TIMEOUT, "request took too long");
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Completes once `stop` is true; the borrow guard is dropped before returning, so the
/// future stays `Send`.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

fn is_transient_accept_error(err: &io::Error) -> bool {
    use io::ErrorKind::*;
    if matches!(
        err.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | OutOfMemory
    ) {
        return true;
    }
    // EMFILE, ENFILE, ENOBUFS, ENOMEM: out of resources, not a dead listener.
    matches!(err.raw_os_error(), Some(23 | 24 | 105 | 12))
}
