//! One webhook POST: the exact headers Phorge's worker sends, redirects followed the way its
//! cURL call follows them (docs/webhook.md, "Outbound policy and redirects"), a whole-request
//! deadline, and every failure reduced to the cURL error number Phorge writes into
//! `errorCode` (docs/webhook.md, "Error codes").
//!
//! Async on the tokio runtime; the connections come from the pooled client in `connector.rs`.

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{
    HeaderName, HeaderValue, ACCEPT, ACCEPT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HOST, LOCATION,
    USER_AGENT,
};
use hyper::{Method, Request};
use phorge_wire::webhook;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;
use url::Url;

use crate::connector::{
    self, ConnectError, ConnectionOptions, Connections, SendError, MAX_FRESH_RETRIES,
};
use crate::policy::{CheckedTarget, OutboundPolicy, PolicyError};
use crate::stall::StallClock;
use crate::tls::TlsFailure;

/// Redirects followed before giving up with cURL's 47 (`CURLE_TOO_MANY_REDIRECTS`).
pub const MAX_REDIRECTS: u32 = 20;

/// The most response body read (and discarded) per hop; the status decides the outcome.
pub const MAX_RESPONSE_BODY: u64 = 64 * 1024;

/// What this process ran out of when an attempt failed before anything was sent: a failure
/// of ours, not of the receiver, never written into the row (docs/webhook.md, "Local
/// failures").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortage {
    /// EMFILE, ENFILE: no file descriptor for the socket.
    Descriptors,
    /// ENOMEM.
    Memory,
    /// EADDRNOTAVAIL: no local address or ephemeral port to connect from.
    LocalPort,
    /// ENOBUFS: the kernel's socket buffers.
    Buffers,
}

impl Shortage {
    /// Every shortage, in the metric's order.
    pub const ALL: [Shortage; 4] = [
        Shortage::Descriptors,
        Shortage::Memory,
        Shortage::LocalPort,
        Shortage::Buffers,
    ];

    /// The shortage an OS error reports, if it is one.
    pub fn of(err: &std::io::Error) -> Option<Shortage> {
        use rustix::io::Errno;
        let errno = Errno::from_io_error(err)?;
        Some(match errno {
            Errno::MFILE | Errno::NFILE => Shortage::Descriptors,
            Errno::NOMEM => Shortage::Memory,
            Errno::ADDRNOTAVAIL => Shortage::LocalPort,
            Errno::NOBUFS => Shortage::Buffers,
            _ => return None,
        })
    }

    /// The metric label and log reason.
    pub const fn label(self) -> &'static str {
        match self {
            Shortage::Descriptors => "no-descriptor",
            Shortage::Memory => "no-memory",
            Shortage::LocalPort => "no-local-port",
            Shortage::Buffers => "no-buffer-space",
        }
    }
}

/// Why an attempt produced no final HTTP status. [`DeliveryError::curl_code`] is what lands
/// in `errorCode`; [`DeliveryError::reason`] goes into the log line and the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryError {
    /// The whole-request deadline passed (28, `errorType` `timeout`).
    Timeout,
    /// A host did not resolve (6).
    Dns,
    /// The receiver refused the connection (7).
    ConnectionRefused,
    /// Any other failure to connect (7).
    Connection,
    /// TLS handshake (35) or peer certificate (60).
    Tls(TlsFailure),
    /// The connection closed before any response (52).
    EmptyReply,
    /// Writing the request failed for a reason other than a reset, or reused connections
    /// kept dying after cURL's five fresh-connect retries (55).
    Send,
    /// The peer reset the connection (56), while we wrote or read.
    Reset,
    /// The receiver did not speak HTTP/1.x (8).
    Protocol,
    /// More than [`MAX_REDIRECTS`] redirects (47).
    TooManyRedirects,
    /// A `Location` that is not an http/https URI (1, cURL's "protocol not supported").
    BadRedirect,
    /// A redirect to an address the outbound policy rejects: not followed, recorded as
    /// Phorge's `hook`/`uri` (Phorge checks only the first URI; this service every hop).
    BlockedRedirect,
    /// This process could not open the first connection (no descriptor, memory, local
    /// port): nothing reached any receiver. Never written into the row; see [`Shortage`].
    Local(Shortage),
}

impl DeliveryError {
    /// The cURL error number Phorge's worker would record; `None` for a blocked hop.
    pub fn curl_code(self) -> Option<u16> {
        Some(match self {
            DeliveryError::Timeout => 28,
            DeliveryError::Dns => 6,
            DeliveryError::ConnectionRefused | DeliveryError::Connection => 7,
            DeliveryError::Tls(failure) => failure.curl_code(),
            DeliveryError::EmptyReply => 52,
            DeliveryError::Send => 55,
            DeliveryError::Reset => 56,
            DeliveryError::Protocol => 8,
            DeliveryError::TooManyRedirects => 47,
            DeliveryError::BadRedirect => 1,
            DeliveryError::BlockedRedirect | DeliveryError::Local(_) => return None,
        })
    }

    /// A short stable token for logs and the metric label.
    pub fn reason(self) -> &'static str {
        match self {
            DeliveryError::Timeout => "timeout",
            DeliveryError::Dns => "dns",
            DeliveryError::ConnectionRefused => "connection-refused",
            DeliveryError::Connection => "connect-failed",
            DeliveryError::Tls(TlsFailure::Handshake) => "tls-handshake",
            DeliveryError::Tls(TlsFailure::UntrustedCertificate) => "certificate-not-trusted",
            DeliveryError::Tls(TlsFailure::WrongHost) => "certificate-wrong-host",
            DeliveryError::Tls(TlsFailure::CertificateDates) => "certificate-expired",
            DeliveryError::Tls(TlsFailure::BadCertificate) => "certificate-invalid",
            DeliveryError::EmptyReply => "empty-reply",
            DeliveryError::Send => "send-failed",
            DeliveryError::Reset => "reset",
            DeliveryError::Protocol => "protocol",
            DeliveryError::TooManyRedirects => "too-many-redirects",
            DeliveryError::BadRedirect => "bad-redirect",
            DeliveryError::BlockedRedirect => "blocked-redirect",
            DeliveryError::Local(shortage) => shortage.label(),
        }
    }

    fn from_policy(err: PolicyError) -> Self {
        match err {
            PolicyError::Unresolvable => DeliveryError::Dns,
            PolicyError::InvalidUri => DeliveryError::BadRedirect,
            PolicyError::Blocked(_) => DeliveryError::BlockedRedirect,
        }
    }

    /// Maps a client error by walking its source chain to our connector's or hyper's error.
    fn from_client(err: &hyper_util::client::legacy::Error) -> Self {
        let mut source = err.source();
        while let Some(current) = source {
            if let Some(connect) = current.downcast_ref::<ConnectError>() {
                return match connect {
                    ConnectError::Blocked(_) => DeliveryError::BlockedRedirect,
                    ConnectError::BadTarget => DeliveryError::Connection,
                    ConnectError::Tcp(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                        DeliveryError::ConnectionRefused
                    }
                    ConnectError::Tcp(io) if Shortage::of(io).is_some() => {
                        DeliveryError::Local(Shortage::of(io).expect("matched"))
                    }
                    ConnectError::Tcp(_) => DeliveryError::Connection,
                    ConnectError::Tls(failure, _) => DeliveryError::Tls(*failure),
                };
            }
            if let Some(hyper) = current.downcast_ref::<hyper::Error>() {
                return Self::from_hyper(hyper);
            }
            source = current.source();
        }
        DeliveryError::Connection
    }

    fn from_hyper(err: &hyper::Error) -> Self {
        use std::io::ErrorKind;
        // A peer that resets the connection is one failure (56), whether the reset reached
        // us while writing (EPIPE/ECONNRESET on the write, under load) or while reading.
        let mut cause = err.source();
        while let Some(current) = cause {
            if let Some(io) = current.downcast_ref::<std::io::Error>() {
                if matches!(
                    io.kind(),
                    ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::BrokenPipe
                ) {
                    return DeliveryError::Reset;
                }
            }
            cause = current.source();
        }
        if err.is_incomplete_message() {
            return DeliveryError::EmptyReply;
        }
        if err.is_parse() || err.is_parse_status() || err.is_parse_too_large() {
            return DeliveryError::Protocol;
        }
        if err.is_timeout() {
            return DeliveryError::Timeout;
        }
        if err.is_body_write_aborted() || err.is_user() {
            return DeliveryError::Send;
        }
        DeliveryError::Reset
    }

    /// A failure to connect to one address, after which the next checked address is tried.
    fn is_connect_failure(self) -> bool {
        matches!(
            self,
            DeliveryError::ConnectionRefused | DeliveryError::Connection
        )
    }
}

/// What a [`Deliverer`] counts: handles to the service's metrics.
#[derive(Debug, Clone, Default)]
pub struct DeliveryCounters {
    /// Responses whose body was longer than [`MAX_RESPONSE_BODY`] (the rest is not read).
    pub bodies_truncated: Counter,
    /// Requests sent again on a new connection after a reused one closed unanswered.
    pub connection_retries: Counter,
    /// Resolved addresses beyond [`crate::policy::MAX_DIALLED_ADDRS`]: checked, never dialled.
    pub addresses_not_dialled: Counter,
    /// Deliveries whose deadline moved on by the time this process stood still.
    pub deadlines_extended: Counter,
}

/// Sends signed webhook bodies.
#[derive(Clone)]
pub struct Deliverer {
    policy: Arc<OutboundPolicy>,
    timeout: Duration,
    user_agent: HeaderValue,
    bodies_truncated: Counter,
    addresses_not_dialled: Counter,
    deadlines_extended: Counter,
    connections: Connections,
    stalls: StallClock,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What the outbound policy made of a hook URI, carried from the policy step (before the
/// claim, so that a refused URI is written without a POST) to the POST (after it).
#[derive(Debug)]
pub enum Route {
    /// The addresses that passed the policy: the POST goes to them.
    Checked(CheckedTarget),
    /// The host did not resolve: the attempt ends as cURL's 6 (`dns`) without a request, as
    /// Phorge's cURL call would, and is written after the claim like any attempt.
    Unresolved,
}

/// A delivery's deadline: the timeout after its start, moved on by the time this process
/// stood still since (`stall.rs`), never past `latest`.
struct Deadline {
    first: Instant,
    stalled_before: Duration,
    latest: Option<Instant>,
}

impl Deadline {
    /// The deadline as it stands now.
    fn now(&self, stalls: &StallClock) -> Instant {
        let moved = self.first + stalls.stalled().saturating_sub(self.stalled_before);
        self.latest.map_or(moved, |latest| moved.min(latest))
    }
}

/// One hop's answer.
struct Hop {
    status: u16,
    location: Option<Result<String, ()>>,
}

impl Deliverer {
    /// A deliverer behind `policy`, each POST (redirects included) bounded by `timeout`.
    pub fn new(
        policy: Arc<OutboundPolicy>,
        timeout: Duration,
        counters: DeliveryCounters,
        options: &ConnectionOptions,
    ) -> Self {
        let connections = connector::build(policy.clone(), options, counters.connection_retries);
        Self {
            policy,
            timeout,
            user_agent: HeaderValue::from_static(concat!(
                "gorge-webhook/",
                env!("CARGO_PKG_VERSION")
            )),
            bodies_truncated: counters.bodies_truncated,
            addresses_not_dialled: counters.addresses_not_dialled,
            deadlines_extended: counters.deadlines_extended,
            connections,
            stalls: StallClock::start(),
        }
    }

    /// Checks a hook URI against the outbound policy, resolving it within the delivery
    /// timeout (docs/webhook.md, "Outbound policy and redirects"). `Err` is a URI the policy
    /// refuses (Phorge's `hook`/`uri`), never [`PolicyError::Unresolvable`]: a host that does
    /// not resolve is a [`Route::Unresolved`], an attempt that fails.
    pub async fn route(&self, uri: &str) -> Result<Route, PolicyError> {
        match self.policy.check(uri, self.timeout).await {
            Ok(target) => Ok(Route::Checked(self.counted(target))),
            Err(PolicyError::Unresolvable) => Ok(Route::Unresolved),
            Err(refused) => Err(refused),
        }
    }

    /// Counts the checked addresses `target` will not dial.
    fn counted(&self, target: CheckedTarget) -> CheckedTarget {
        self.addresses_not_dialled.inc_by(target.not_dialled as u64);
        target
    }

    /// TCP connections opened so far (each TLS one is also a handshake).
    pub fn connections_opened(&self) -> u64 {
        self.connections.tcp_opened()
    }

    /// TLS handshakes started so far.
    pub fn tls_handshakes(&self) -> u64 {
        self.connections.tls_started()
    }

    /// POSTs `body` to an already checked target and returns the final HTTP status.
    /// The timeout covers every hop, redirect lookups and the bounded body reads.
    pub async fn deliver(
        &self,
        target: CheckedTarget,
        body: &[u8],
        signature: &str,
    ) -> Result<u16, DeliveryError> {
        self.deliver_before(target, body, signature, None).await
    }

    /// [`Self::deliver`], the timeout counting only time this process ran: when it runs out
    /// after the process stood still (`stall.rs`), it moves on by that long, never past
    /// `latest` (the claim's lease, less room for the result write), so an answer that came
    /// while the process was stopped is read, not written as the receiver's timeout.
    pub async fn deliver_before(
        &self,
        target: CheckedTarget,
        body: &[u8],
        signature: &str,
        latest: Option<Instant>,
    ) -> Result<u16, DeliveryError> {
        let signature = HeaderValue::from_str(signature).map_err(|_| DeliveryError::Send)?;
        let clock = Deadline {
            first: Instant::now() + self.timeout,
            stalled_before: self.stalls.stalled(),
            latest,
        };
        let mut deadline = clock.first;
        let hops = self.follow(target, Bytes::copy_from_slice(body), signature, &clock);
        tokio::pin!(hops);
        loop {
            if let Ok(result) = tokio::time::timeout_at(deadline, &mut hops).await {
                return result;
            }
            let moved = clock.now(&self.stalls);
            if moved <= deadline {
                return Err(DeliveryError::Timeout);
            }
            if deadline == clock.first {
                self.deadlines_extended.inc();
            }
            deadline = moved;
        }
    }

    async fn follow(
        &self,
        mut target: CheckedTarget,
        body: Bytes,
        signature: HeaderValue,
        deadline: &Deadline,
    ) -> Result<u16, DeliveryError> {
        // cURL with CURLOPT_CUSTOMREQUEST "POST": 301/302/303 continue as a POST without a
        // body (and stay bodiless after); 307/308 repeat the body.
        let mut with_body = true;
        let mut retries_left = MAX_FRESH_RETRIES;
        for hop in 0..=MAX_REDIRECTS {
            let sent = if with_body {
                body.clone()
            } else {
                Bytes::new()
            };
            let answer = match self
                .send_hop(&target, sent, with_body, &signature, &mut retries_left)
                .await
            {
                Ok(answer) => answer,
                // Once a receiver may have seen a request (an earlier hop, or a reused
                // connection that died), giving the row back would send it again: the
                // attempt fails as a connect failure, as before.
                Err(DeliveryError::Local(_)) if hop > 0 || retries_left < MAX_FRESH_RETRIES => {
                    return Err(DeliveryError::Connection)
                }
                Err(err) => return Err(err),
            };
            let Some(location) = answer.location else {
                return Ok(answer.status);
            };
            if hop == MAX_REDIRECTS {
                return Err(DeliveryError::TooManyRedirects);
            }
            if matches!(answer.status, 301..=303) {
                with_body = false;
            }
            let location = location.map_err(|()| DeliveryError::BadRedirect)?;
            let next = next_hop(&target.uri, &location)?;
            let remaining = deadline
                .now(&self.stalls)
                .saturating_duration_since(Instant::now());
            target = self.counted(
                self.policy
                    .check_url(next, remaining)
                    .await
                    .map_err(DeliveryError::from_policy)?,
            );
        }
        Err(DeliveryError::TooManyRedirects)
    }

    /// One request to `target`, trying its checked addresses in order until one connects.
    async fn send_hop(
        &self,
        target: &CheckedTarget,
        body: Bytes,
        with_body: bool,
        signature: &HeaderValue,
        retries_left: &mut u32,
    ) -> Result<Hop, DeliveryError> {
        let mut last = DeliveryError::Connection;
        for addr in &target.addrs {
            let request = self.request(target, *addr, body.clone(), with_body, signature)?;
            match self.connections.send(request, retries_left).await {
                Ok(response) => return Ok(self.finish(response).await),
                // cURL: "Connection died, tried 5 times before giving up" (55).
                Err(SendError::RetriesExhausted) => return Err(DeliveryError::Send),
                Err(SendError::Failed(err)) => {
                    let err = DeliveryError::from_client(&err);
                    if !err.is_connect_failure() {
                        return Err(err);
                    }
                    last = err;
                }
            }
        }
        Err(last)
    }

    /// The request, header names in Phorge's cURL order as far as hyper allows (title-cased
    /// on the wire): `Host`, `User-Agent`, `Accept`, `Content-Type`, the signature, then
    /// `Content-Length` when there is a body (cURL sends none on a bodiless redirect hop).
    fn request(
        &self,
        target: &CheckedTarget,
        addr: std::net::SocketAddr,
        body: Bytes,
        with_body: bool,
        signature: &HeaderValue,
    ) -> Result<Request<Full<Bytes>>, DeliveryError> {
        let uri = &target.uri;
        let host = uri.host_str().ok_or(DeliveryError::BadRedirect)?;
        let host_header = match uri.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        let mut path = uri.path().to_string();
        if let Some(query) = uri.query() {
            path.push('?');
            path.push_str(query);
        }
        let name = host.trim_start_matches('[').trim_end_matches(']');
        let pool_uri = connector::pool_uri(uri.scheme() == "https", name, addr, &path)
            .ok_or(DeliveryError::BadRedirect)?;
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(pool_uri)
            .header(HOST, host_header)
            .header(USER_AGENT, self.user_agent.clone())
            .header(ACCEPT, HeaderValue::from_static("*/*"))
            .header(
                CONTENT_TYPE,
                HeaderValue::from_static(webhook::CONTENT_TYPE),
            )
            .header(
                HeaderName::from_static(SIGNATURE_HEADER_LOWER),
                signature.clone(),
            )
            // cURL (Phorge's client) offers gzip; sent for parity only, since the answer's
            // body is read and dropped, never decoded.
            .header(ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        if with_body {
            builder = builder.header(CONTENT_LENGTH, body.len());
        }
        builder
            .body(Full::new(body))
            .map_err(|_| DeliveryError::BadRedirect)
    }

    /// The status and `Location`, after reading (and dropping) a bounded amount of the body
    /// so that a well-behaved connection can go back to the pool.
    async fn finish(&self, response: hyper::Response<hyper::body::Incoming>) -> Hop {
        let status = response.status().as_u16();
        let location = if matches!(status, 301 | 302 | 303 | 307 | 308) {
            response
                .headers()
                .get(LOCATION)
                .map(|value| value.to_str().map(|s| s.trim().to_string()).map_err(|_| ()))
        } else {
            None
        };
        let mut body = response.into_body();
        let mut read = 0u64;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            if let Some(data) = frame.data_ref() {
                read += data.len() as u64;
                if read > MAX_RESPONSE_BODY {
                    // Dropping the rest closes the connection instead of pooling it.
                    self.bodies_truncated.inc();
                    break;
                }
            }
        }
        Hop { status, location }
    }
}

/// `SIGNATURE_HEADER` as hyper stores names (lower case; title-cased when written).
const SIGNATURE_HEADER_LOWER: &str = "x-phabricator-webhook-signature";

/// Resolves a `Location` against the current URI (RFC 3986, `url::Url::join`): only
/// http/https targets are followed, the fragment is never sent.
fn next_hop(base: &Url, location: &str) -> Result<Url, DeliveryError> {
    if location.is_empty() {
        return Err(DeliveryError::BadRedirect);
    }
    let mut next = base
        .join(location)
        .map_err(|_| DeliveryError::BadRedirect)?;
    if !matches!(next.scheme(), "http" | "https") {
        return Err(DeliveryError::BadRedirect);
    }
    next.set_fragment(None);
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_header_constant_is_what_is_sent() {
        assert_eq!(
            SIGNATURE_HEADER_LOWER,
            webhook::SIGNATURE_HEADER.to_ascii_lowercase()
        );
    }

    #[test]
    fn curl_numbers() {
        let codes: Vec<(Option<u16>, &str)> = [
            DeliveryError::Dns,
            DeliveryError::ConnectionRefused,
            DeliveryError::Timeout,
            DeliveryError::Tls(TlsFailure::Handshake),
            DeliveryError::Tls(TlsFailure::UntrustedCertificate),
            DeliveryError::TooManyRedirects,
            DeliveryError::EmptyReply,
            DeliveryError::Send,
            DeliveryError::Reset,
            DeliveryError::Protocol,
            DeliveryError::BadRedirect,
            DeliveryError::BlockedRedirect,
        ]
        .iter()
        .map(|e| (e.curl_code(), e.reason()))
        .collect();
        assert_eq!(
            codes,
            [
                (Some(6), "dns"),
                (Some(7), "connection-refused"),
                (Some(28), "timeout"),
                (Some(35), "tls-handshake"),
                (Some(60), "certificate-not-trusted"),
                (Some(47), "too-many-redirects"),
                (Some(52), "empty-reply"),
                (Some(55), "send-failed"),
                (Some(56), "reset"),
                (Some(8), "protocol"),
                (Some(1), "bad-redirect"),
                (None, "blocked-redirect"),
            ]
        );
    }

    #[test]
    fn locations_resolve_against_the_current_uri() {
        let base = Url::parse("https://h.example:8443/a/b?x=1").unwrap();
        let join = |l: &str| next_hop(&base, l).map(|u| u.to_string());
        assert_eq!(join("http://other/x").unwrap(), "http://other/x");
        assert_eq!(join("//other/x").unwrap(), "https://other/x");
        assert_eq!(join("/root").unwrap(), "https://h.example:8443/root");
        assert_eq!(join("c?y").unwrap(), "https://h.example:8443/a/c?y");
        // The hand-written join got these wrong.
        assert_eq!(join("?q=2").unwrap(), "https://h.example:8443/a/b?q=2");
        assert_eq!(join("#frag").unwrap(), "https://h.example:8443/a/b?x=1");
        assert_eq!(join("../up").unwrap(), "https://h.example:8443/up");
        // Another scheme is refused, not taken as a path on the same host.
        assert_eq!(join("file:///etc/passwd"), Err(DeliveryError::BadRedirect));
        assert_eq!(join("ftp://h.example/x"), Err(DeliveryError::BadRedirect));
        assert_eq!(join(""), Err(DeliveryError::BadRedirect));
    }
}
