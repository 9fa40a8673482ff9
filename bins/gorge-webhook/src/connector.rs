//! The HTTP/1.1 client webhook POSTs go through: hyper with title-cased header names
//! (`X-Phabricator-Webhook-Signature`, as Phorge's cURL sends it) over hyper-util's pooled
//! legacy client, and a connector that dials only addresses the outbound policy checked.
//!
//! The legacy client pools connections by the request URI's (scheme, authority). Requests
//! are therefore addressed to `scheme://<hex(host)>@<checked address>:<port>/…` (the real
//! `Host` header is set explicitly), which makes the pool key (scheme, host, port, pinned
//! address): a connection made for one host or address is never reused for another, and
//! the connector re-checks every address against the policy before it dials, so neither a
//! pooled connection nor a second lookup can get past it (docs/webhook.md, "TLS and
//! connections").
//!
//! A receiver may close a keep-alive connection just as the next request is sent on it (it
//! answered without `Connection: close`, then hit its keep-alive timeout or request limit).
//! cURL — Phorge's worker — then sends the request again on a fresh connection; so does
//! [`Connections::send`], once, when a reused connection failed before any byte of its
//! answer arrived. Each connection records how it was used ([`Usage`]) so that hyper-util
//! can hand that back with the error.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::http::Extensions;
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::{Client, Error as ClientError};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::policy::OutboundPolicy;
use crate::tls::{self, ExtraRoots, TlsFailure};

/// Idle keep-alive connections kept per (scheme, host, port, address). One delivery per
/// hook runs at a time, but many hooks may point at one receiver.
pub const POOL_MAX_IDLE_PER_KEY: usize = 16;

/// How long an idle connection is kept. Below common server keep-alive timeouts (Apache's
/// default is 5 s), so a reused connection is rarely one the server is just closing.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// How the client is built.
#[derive(Debug, Clone)]
pub struct ConnectionOptions {
    /// CAs trusted on top of the bundled Mozilla roots and the system store.
    pub extra_roots: ExtraRoots,
    /// Keep connections alive between deliveries (off: one connection per request, as
    /// Phorge's worker does).
    pub keep_alive: bool,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            extra_roots: ExtraRoots::default(),
            keep_alive: true,
        }
    }
}

/// Connections made, for tests and benchmarks.
#[derive(Debug, Default)]
struct ConnectCounts {
    tcp: AtomicU64,
    tls: AtomicU64,
}

type HttpClient = Client<Connector, Full<Bytes>>;

/// The clients requests go through: the pooled one, and one that always opens a new
/// connection, for the single retry after a reused connection died.
#[derive(Clone)]
pub struct Connections {
    pooled: HttpClient,
    fresh: HttpClient,
    counts: Arc<ConnectCounts>,
    /// Requests sent again on a new connection.
    retries: Counter,
}

/// Builds the clients. `retries` counts requests sent again on a new connection.
pub fn build(
    policy: Arc<OutboundPolicy>,
    options: &ConnectionOptions,
    retries: Counter,
) -> Connections {
    let counts = Arc::new(ConnectCounts::default());
    let connector = Connector {
        policy,
        tls: TlsConnector::from(tls::client_config(&options.extra_roots)),
        counts: counts.clone(),
    };
    let client = |max_idle: usize| {
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .http1_title_case_headers(true)
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(max_idle)
            // `Host` is always set by the caller; the URI's authority is the pool key.
            .set_host(false);
        builder.build(connector.clone())
    };
    let max_idle = if options.keep_alive {
        POOL_MAX_IDLE_PER_KEY
    } else {
        0
    };
    Connections {
        pooled: client(max_idle),
        fresh: client(0),
        counts,
        retries,
    }
}

/// cURL's `CONN_MAX_RETRIES`: fresh-connect retries one transfer may make — one delivery,
/// all its redirect hops included. Past it cURL gives up with 55 ("Connection died, tried 5
/// times before giving up"), and so does a delivery here.
pub const MAX_FRESH_RETRIES: u32 = 5;

/// Why [`Connections::send`] got no answer.
#[derive(Debug)]
pub enum SendError {
    /// The request failed (on a new connection, or after any byte of its answer).
    Failed(ClientError),
    /// It failed on a reused connection before any byte of its answer, and the delivery
    /// has no retry left.
    RetriesExhausted,
}

impl Connections {
    /// Sends `request`. When it fails on a reused connection before any byte of the answer
    /// arrived, it is sent once more, on a new connection, as cURL does on a "fresh
    /// connect" (the receiver closed an idle connection as it was reused, so it did not
    /// answer the first copy), if `retries_left` allows; the retry's own failure stands.
    pub async fn send(
        &self,
        request: Request<Full<Bytes>>,
        retries_left: &mut u32,
    ) -> Result<Response<Incoming>, SendError> {
        match self.pooled.request(request.clone()).await {
            Ok(response) => Ok(response),
            Err(err) if died_unanswered_on_reuse(&err) => {
                if *retries_left == 0 {
                    return Err(SendError::RetriesExhausted);
                }
                *retries_left -= 1;
                self.retries.inc();
                self.fresh.request(request).await.map_err(SendError::Failed)
            }
            Err(err) => Err(SendError::Failed(err)),
        }
    }

    /// TCP connections opened so far (each TLS one is also a handshake).
    pub fn tcp_opened(&self) -> u64 {
        self.counts.tcp.load(Ordering::Relaxed)
    }

    /// TLS handshakes started so far.
    pub fn tls_started(&self) -> u64 {
        self.counts.tls.load(Ordering::Relaxed)
    }
}

/// Whether a request failed on a connection that had carried an earlier request, with no
/// byte of its own answer read: the receiver closed the idle connection as we reused it.
fn died_unanswered_on_reuse(err: &ClientError) -> bool {
    let Some(connected) = err.connect_info() else {
        return false; // no connection was made: nothing was reused
    };
    let mut extras = Extensions::new();
    connected.get_extras(&mut extras);
    extras.get::<Usage>().is_some_and(|usage| {
        usage.0.requests.load(Ordering::Relaxed) > 1
            && usage.0.answer_bytes.load(Ordering::Relaxed) == 0
    })
}

/// How one connection has been used: requests begun on it, and bytes read since the latest
/// began. Shared by the connection and hyper-util's record of it ([`Connected::extra`]),
/// which a failed request's error carries.
#[derive(Clone, Debug, Default)]
struct Usage(Arc<UsageCounts>);

#[derive(Debug, Default)]
struct UsageCounts {
    requests: AtomicU32,
    answer_bytes: AtomicU64,
}

/// The URI a request is sent to: see the module comment. `path_and_query` starts with `/`.
pub fn pool_uri(https: bool, host: &str, addr: SocketAddr, path_and_query: &str) -> Option<Uri> {
    let scheme = if https { "https" } else { "http" };
    let mut key = String::with_capacity(host.len() * 2);
    for byte in host.bytes() {
        key.push_str(&format!("{byte:02x}"));
    }
    format!("{scheme}://{key}@{addr}{path_and_query}")
        .parse()
        .ok()
}

/// (https, host, address) from a [`pool_uri`].
fn parse_pool_uri(uri: &Uri) -> Option<(bool, String, SocketAddr)> {
    let https = match uri.scheme_str()? {
        "https" => true,
        "http" => false,
        _ => return None,
    };
    let (key, addr) = uri.authority()?.as_str().rsplit_once('@')?;
    if key.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..key.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(key.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((https, String::from_utf8(bytes).ok()?, addr.parse().ok()?))
}

/// Why no connection was made.
#[derive(Debug)]
pub enum ConnectError {
    /// The address is in the outbound blacklist (never dialled).
    Blocked(IpAddr),
    /// The URI was not one of ours.
    BadTarget,
    Tcp(io::Error),
    Tls(TlsFailure, String),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Blocked(ip) => write!(f, "address {ip} is in the outbound blacklist"),
            ConnectError::BadTarget => f.write_str("not a checked target"),
            ConnectError::Tcp(err) => write!(f, "connect: {err}"),
            ConnectError::Tls(failure, detail) => write!(f, "{}: {detail}", failure.reason()),
        }
    }
}

impl std::error::Error for ConnectError {}

/// Dials checked addresses, plain or TLS.
#[derive(Clone)]
pub struct Connector {
    policy: Arc<OutboundPolicy>,
    tls: TlsConnector,
    counts: Arc<ConnectCounts>,
}

impl Connector {
    async fn connect(self, dst: Uri) -> Result<TokioIo<Stream>, ConnectError> {
        let (https, host, addr) = parse_pool_uri(&dst).ok_or(ConnectError::BadTarget)?;
        if self.policy.is_blocked(addr.ip()) {
            return Err(ConnectError::Blocked(addr.ip()));
        }
        let tcp = TcpStream::connect(addr).await.map_err(ConnectError::Tcp)?;
        self.counts.tcp.fetch_add(1, Ordering::Relaxed);
        // Small request, small response: do not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        if !https {
            return Ok(TokioIo::new(Stream::new(Io::Plain(tcp))));
        }
        let name = ServerName::try_from(host.clone())
            .map_err(|_| ConnectError::Tls(TlsFailure::WrongHost, format!("host {host}")))?;
        self.counts.tls.fetch_add(1, Ordering::Relaxed);
        match self.tls.connect(name, tcp).await {
            Ok(tls) => Ok(TokioIo::new(Stream::new(Io::Tls(Box::new(tls))))),
            Err(err) => {
                let failure = TlsFailure::from_io(&err).unwrap_or(TlsFailure::Handshake);
                Err(ConnectError::Tls(failure, format!("host {host}: {err}")))
            }
        }
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        Box::pin(self.clone().connect(dst))
    }
}

/// A receiver connection, plain or TLS, that records its [`Usage`]: a write after a read
/// (or the first write) begins a request, and bytes read count towards its answer. HTTP/1
/// without pipelining writes a request whole before reading its answer; a receiver that
/// answers early, before the body is written, can at worst make one request look like two,
/// which only allows a retry of a request that got part of an answer and then none.
pub struct Stream {
    io: Io,
    usage: Usage,
    writing: bool,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    fn new(io: Io) -> Stream {
        Stream {
            io,
            usage: Usage::default(),
            writing: false,
        }
    }

    fn begin_write(&mut self) {
        if !self.writing {
            self.writing = true;
            self.usage.0.requests.fetch_add(1, Ordering::Relaxed);
            self.usage.0.answer_bytes.store(0, Ordering::Relaxed);
        }
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new().extra(self.usage.clone())
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        let read = buf.filled().len() - before;
        if read > 0 {
            this.writing = false;
            this.usage
                .0
                .answer_bytes
                .fetch_add(read as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.begin_write();
        match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_uris_carry_host_and_address() {
        let addr: SocketAddr = "[2001:db8::1]:8443".parse().unwrap();
        let uri = pool_uri(true, "hooks.example.com", addr, "/a/b?c=d").unwrap();
        assert_eq!(uri.path_and_query().unwrap().as_str(), "/a/b?c=d");
        assert_eq!(
            parse_pool_uri(&uri).unwrap(),
            (true, "hooks.example.com".to_string(), addr)
        );
        // Different hosts on one address are different pool keys.
        let other = pool_uri(true, "other.example.com", addr, "/").unwrap();
        assert_ne!(uri.authority(), other.authority());
        assert!(parse_pool_uri(&"http://127.0.0.1:80/".parse().unwrap()).is_none());
    }
}
