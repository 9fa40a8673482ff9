//! Listening: every listener is bound before any serves, so a process never runs half-alive
//! with one port open and another missing; then each accepted connection is served by hyper
//! (HTTP/1.1 with upgrades, so WebSocket handlers can take the connection over).

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::http::Response;

/// Handles one request; the second argument is the peer's address.
pub type Handler = Arc<
    dyn Fn(hyper::Request<Incoming>, SocketAddr) -> Pin<Box<dyn Future<Output = Response> + Send>>
        + Send
        + Sync,
>;

/// How long a client may take to send a request's headers before the connection is closed.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Back-off after an accept error that is about resources (out of file descriptors), which
/// would otherwise spin the accept loop.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// A listener to open: a name for logs and errors, an address, and its request handler.
pub struct ListenerSpec {
    pub name: String,
    pub addr: SocketAddr,
    pub handler: Handler,
}

/// A bound listener, not yet serving.
pub struct BoundListener {
    name: String,
    listener: TcpListener,
    local_addr: SocketAddr,
    handler: Handler,
}

impl BoundListener {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address actually bound (differs from the requested one for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

#[derive(Debug)]
pub struct BindError {
    pub name: String,
    pub addr: SocketAddr,
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
        let bind = TcpListener::bind(spec.addr)
            .await
            .and_then(|listener| listener.local_addr().map(|addr| (listener, addr)));
        match bind {
            Ok((listener, local_addr)) => bound.push(BoundListener {
                name: spec.name,
                listener,
                local_addr,
                handler: spec.handler,
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

/// Accepts and serves connections until `stop` turns true; then open connections are asked
/// to finish (in-flight requests complete, keep-alive ends). Each connection task holds a
/// clone of `open_connections` so the caller can wait for all of them to close.
///
/// Returns an error only when accepting fails for a reason other than resource exhaustion:
/// the listener is then considered dead.
pub(crate) async fn serve(
    bound: BoundListener,
    mut stop: watch::Receiver<bool>,
    open_connections: watch::Receiver<()>,
) -> io::Result<()> {
    loop {
        let accepted = tokio::select! {
            _ = stopped(&mut stop) => return Ok(()),
            accepted = bound.listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let handler = bound.handler.clone();
                let stop = stop.clone();
                let guard = open_connections.clone();
                tokio::spawn(serve_connection(stream, peer, handler, stop, guard));
            }
            Err(err) if is_transient_accept_error(&err) => {
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
    mut stop: watch::Receiver<bool>,
    _open_connection: watch::Receiver<()>,
) {
    // Small responses and WebSocket frames should not wait for Nagle's algorithm.
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |request| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handler(request, peer).await) }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
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
