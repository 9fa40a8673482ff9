//! Listening: every listener is bound before any serves, so a process never runs half-alive
//! with one port open and another missing; then each accepted connection is served by hyper
//! (HTTP/1.1 with upgrades, so WebSocket handlers can take the connection over).
//!
//! Listeners bind with `SO_REUSEPORT`, so a new process can bind the same ports while an old
//! one drains (an in-place restart); [`crate::shutdown::run`] closes them when the drain
//! starts if they ask for it ([`BoundListener::close_at_drain_start`]). Reading a request is time-limited twice: its head by hyper's header timeout, and
//! the whole request (head, body and handler) by a request deadline, so a body that never
//! ends does not hold a connection forever.
//!
//! A listener may also be served on a runtime of its own ([`BoundListener::on_runtime`]),
//! hold its connections under a cap shared with others ([`BoundListener::with_connection_cap`]),
//! close connections that send no request in time
//! ([`BoundListener::with_first_request_deadline`]) and read HTTP/1.0 upgrades as HTTP/1.1
//! ([`BoundListener::serve_http10_upgrades`]). Each request carries its connection's
//! [`Accepted`] instant.
//!
//! A listener may serve TLS ([`BoundListener::with_tls`]): the handshake runs before hyper
//! sees the connection, within the same first-request deadline (or the header timeout), and
//! a connection whose first byte is not a TLS record (plaintext HTTP on a TLS port) is closed
//! without an answer and counted. A plaintext listener's connections are served exactly as
//! before: their stream type does not change and nothing is buffered for them.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
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
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::http::{error_response, Response};
use crate::http10::{Http10AsHttp11, WasHttp10};
use crate::log_every::LogEvery;
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

/// When the connection a request came on was accepted, as a request extension: time a
/// request from here (not from when its handler ran) and a server too busy to accept or
/// read shows in its own latency figures. On a kept-alive connection, a later request's
/// instant is when hyper handed it over (its predecessor was answered by then).
#[derive(Debug, Clone, Copy)]
pub struct Accepted(pub std::time::Instant);

/// A connection's place under its listener's cap ([`BoundListener::with_connection_cap`]),
/// as a request extension: a handler that takes the connection over (a WebSocket upgrade)
/// keeps a clone for as long as it holds the socket, so the place is freed only when the
/// descriptor is.
#[derive(Debug, Clone)]
pub struct ConnectionSlot {
    /// Held, never read: the place is given back when the last clone is dropped.
    _permit: Arc<OwnedSemaphorePermit>,
}

/// A bound on open connections, which listeners given clones of it share, and the counter
/// of connections refused over it.
#[derive(Clone)]
pub struct ConnectionCap {
    slots: Arc<Semaphore>,
    /// Connections closed at once because every slot was taken.
    refused: Counter,
}

impl ConnectionCap {
    /// At most `max` connections at once; one more is closed and counted in `refused`.
    pub fn new(max: usize, refused: Counter) -> Self {
        ConnectionCap {
            slots: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            refused,
        }
    }
}

/// A deadline for a connection's first request and what it counts.
#[derive(Clone)]
struct FirstRequestDeadline {
    within: Duration,
    /// Connections closed because no request arrived in time.
    expired: Counter,
}

/// TLS on a listener: the acceptor (its certificate resolver may swap pairs while serving)
/// and what it counts.
#[derive(Clone)]
pub struct TlsServing {
    /// Handshakes with the listener's `rustls::ServerConfig`.
    pub acceptor: TlsAcceptor,
    /// Connections whose first byte was not a TLS handshake record (plaintext HTTP).
    pub plaintext_refused: Counter,
    /// Handshakes that failed or did not finish in time.
    pub handshakes_failed: Counter,
}

/// The first byte of a TLS handshake record (RFC 8446 §5.1, `ContentType.handshake`); a
/// plaintext HTTP request starts with a method's letter.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

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
    runtime: Option<tokio::runtime::Handle>,
    cap: Option<ConnectionCap>,
    first_request: Option<FirstRequestDeadline>,
    http10_upgrades: bool,
    tls: Option<TlsServing>,
    closed: Option<Arc<AtomicU64>>,
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

    /// Accepts and serves this listener's connections on `runtime` instead of the one
    /// [`crate::shutdown::run`] runs on: a port that must answer whatever the other ports'
    /// clients do (a flood of them keeping every worker busy) gets threads of its own. The
    /// listening socket moves to that runtime's reactor when it starts serving, so nothing of
    /// the binding runtime stands between a connection and its accept.
    pub fn on_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Holds this listener's connections under `cap` (a connection a handler took over
    /// included, while it keeps its [`ConnectionSlot`]); one more is accepted and closed at
    /// once, and counted. Descriptors another port needs stay free however many clients
    /// connect here.
    pub fn with_connection_cap(mut self, cap: ConnectionCap) -> Self {
        self.cap = Some(cap);
        self
    }

    /// Closes a connection that has not sent a whole request head within `within` of its
    /// accept (hyper's header timeout starts only with the first byte, so a connection that
    /// sends nothing would otherwise be held forever), counted in `expired`.
    pub fn with_first_request_deadline(mut self, within: Duration, expired: Counter) -> Self {
        self.first_request = Some(FirstRequestDeadline { within, expired });
        self
    }

    /// Reads each connection's first request line `HTTP/1.0` as `HTTP/1.1`, so an HTTP/1.0
    /// WebSocket upgrade is served as Node serves it (see [`crate::http10`]). The request
    /// carries [`crate::http10::WasHttp10`]. Connections of every listener are
    /// [`crate::http10::Http10AsHttp11`] streams, which pass reads through without this.
    pub fn serve_http10_upgrades(mut self) -> Self {
        self.http10_upgrades = true;
        self
    }

    /// Serves TLS on this listener (see the module's doc).
    pub fn with_tls(mut self, tls: TlsServing) -> Self {
        self.tls = Some(tls);
        self
    }

    pub(crate) fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.runtime.clone()
    }

    /// Adds one to `closed` each time a connection of this listener ends (its task is done:
    /// closed, timed out, or handed over to an upgrade's own task), so a service can tell
    /// that many connections came and went (and freed what they held) since it last looked.
    pub fn counting_ended_connections(mut self, closed: Arc<AtomicU64>) -> Self {
        self.closed = Some(closed);
        self
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
                runtime: None,
                cap: None,
                first_request: None,
                http10_upgrades: false,
                tls: None,
                closed: None,
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
    let failures = LogEvery::new(ACCEPT_ERROR_LOG_INTERVAL);
    let timeouts = (bound.header_timeout, bound.request_timeout);
    // A socket's readiness comes from the reactor of the runtime it was registered with:
    // the one that bound it. Served on a runtime of its own, the listener moves to that
    // runtime's reactor, or its connections would wait (before the accept, where no timer
    // of ours sees them) until a worker of the binding runtime polls its reactor — which a
    // flood of client sockets on those workers delayed by hundreds of ms.
    let mut bound = bound;
    if bound.runtime.is_some() {
        bound.listener = TcpListener::from_std(bound.listener.into_std()?)?;
    }
    loop {
        let accepted = tokio::select! {
            _ = stopped(&mut stops.accept) => return Ok(()),
            accepted = bound.listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let accepted = Accepted(std::time::Instant::now());
                let slot = match &bound.cap {
                    None => None,
                    Some(cap) => match cap.slots.clone().try_acquire_owned() {
                        Ok(permit) => Some(ConnectionSlot {
                            _permit: Arc::new(permit),
                        }),
                        Err(_) => {
                            // Closed before anything is read: the descriptor comes back now.
                            cap.refused.inc();
                            drop(stream);
                            continue;
                        }
                    },
                };
                let connection = Connection {
                    peer,
                    accepted,
                    slot,
                    first_request: bound.first_request.clone(),
                    http10_upgrades: bound.http10_upgrades,
                    _ended: EndCount(bound.closed.clone()),
                };
                let handler = bound.handler.clone();
                let stop = stops.connections.clone();
                let guard = open_connections.clone();
                match &bound.tls {
                    None => {
                        tokio::spawn(serve_connection(
                            stream, connection, handler, timeouts, stop, guard,
                        ));
                    }
                    Some(tls) => {
                        tokio::spawn(serve_tls_connection(
                            tls.clone(),
                            stream,
                            connection,
                            handler,
                            timeouts,
                            stop,
                            guard,
                        ));
                    }
                }
            }
            Err(err) if is_transient_accept_error(&err) => {
                bound.accept_errors.inc();
                if let Some(failures) = failures.occurred() {
                    emit!(log, events::ACCEPT_FAILED;
                        "listener" => &bound.name, "error" => %err, "failures" => failures);
                }
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
            Err(err) => return Err(err),
        }
    }
}

/// What the accept loop hands each connection's task.
struct Connection {
    peer: SocketAddr,
    accepted: Accepted,
    slot: Option<ConnectionSlot>,
    first_request: Option<FirstRequestDeadline>,
    http10_upgrades: bool,
    /// Counts the connection's end when its task drops it, whichever way it ends.
    _ended: EndCount,
}

/// Adds one to its counter when dropped (see [`BoundListener::counting_ended_connections`]).
struct EndCount(Option<Arc<AtomicU64>>);

impl Drop for EndCount {
    fn drop(&mut self) {
        if let Some(closed) = &self.0 {
            closed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Completes the TLS handshake of `stream`, then serves it as [`serve_connection`] does. The
/// handshake must finish within the connection's first-request deadline (or the header
/// timeout): a client that opens connections and never completes one holds nothing for
/// longer than a slow plaintext client could. The time it took is taken off that deadline.
async fn serve_tls_connection(
    tls: TlsServing,
    stream: TcpStream,
    mut connection: Connection,
    handler: Handler,
    timeouts: (Duration, Duration),
    stop: watch::Receiver<bool>,
    open_connection: watch::Receiver<()>,
) {
    let within = connection
        .first_request
        .as_ref()
        .map_or(timeouts.0, |deadline| deadline.within);
    let started = tokio::time::Instant::now();
    let _ = stream.set_nodelay(true);
    let handshake = async {
        // Peeked, not read: a TLS client's bytes stay in the kernel for rustls.
        let mut first = [0u8; 1];
        match stream.peek(&mut first).await {
            Ok(1) if first[0] == TLS_HANDSHAKE_RECORD => {}
            Ok(1) => return Err(Some(&tls.plaintext_refused)),
            // Closed before a byte (a TCP probe): nothing failed.
            Ok(_) => return Err(None),
            Err(_) => return Err(Some(&tls.handshakes_failed)),
        }
        tls.acceptor
            .accept(stream)
            .await
            .map_err(|_| Some(&tls.handshakes_failed))
    };
    let stream = match tokio::time::timeout(within, handshake).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(counter)) => {
            if let Some(counter) = counter {
                counter.inc();
            }
            return;
        }
        Err(_) => {
            tls.handshakes_failed.inc();
            return;
        }
    };
    if let Some(deadline) = &mut connection.first_request {
        deadline.within = deadline.within.saturating_sub(started.elapsed());
    }
    serve_connection(stream, connection, handler, timeouts, stop, open_connection).await;
}

/// A connection's byte stream: a TCP stream, or TLS over one.
trait ConnectionStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Sets `TCP_NODELAY` on the socket beneath.
    fn set_nodelay(&self);
}

impl ConnectionStream for TcpStream {
    fn set_nodelay(&self) {
        let _ = TcpStream::set_nodelay(self, true);
    }
}

impl ConnectionStream for tokio_rustls::server::TlsStream<TcpStream> {
    fn set_nodelay(&self) {
        let _ = self.get_ref().0.set_nodelay(true);
    }
}

async fn serve_connection<S: ConnectionStream>(
    stream: S,
    Connection {
        peer,
        accepted,
        slot,
        first_request,
        http10_upgrades,
        _ended,
    }: Connection,
    handler: Handler,
    (header_timeout, request_timeout): (Duration, Duration),
    mut stop: watch::Receiver<bool>,
    _open_connection: watch::Receiver<()>,
) {
    // Small responses and WebSocket frames should not wait for Nagle's algorithm.
    stream.set_nodelay();
    let stream = Http10AsHttp11::new(stream, http10_upgrades);
    let was_http10 = stream.patched_flag();
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let no_request_yet = first.clone();
    let service = service_fn(move |mut request: hyper::Request<Incoming>| {
        let handler = handler.clone();
        let accepted = if first.swap(false, std::sync::atomic::Ordering::Relaxed) {
            // Only the first request line is ever read differently.
            if was_http10.load(std::sync::atomic::Ordering::Relaxed) {
                request.extensions_mut().insert(WasHttp10);
            }
            accepted
        } else {
            Accepted(std::time::Instant::now())
        };
        request.extensions_mut().insert(accepted);
        if let Some(slot) = &slot {
            request.extensions_mut().insert(slot.clone());
        }
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
    let deadline = first_request.as_ref().map(|d| tokio::time::sleep(d.within));
    let expired = async {
        match deadline {
            Some(deadline) => deadline.await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expired);
    let mut watching = first_request.is_some();
    loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            _ = stopped(&mut stop) => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
                return;
            }
            () = expired.as_mut(), if watching => {
                watching = false;
                if no_request_yet.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(deadline) = &first_request {
                        deadline.expired.inc();
                    }
                    return;
                }
            }
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
