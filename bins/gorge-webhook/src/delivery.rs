//! One webhook POST over ureq: pinned addresses, a whole-request deadline, manual redirects.
//!
//! Blocking by design (ureq); the dispatcher runs it on `spawn_blocking`, bounded by its
//! concurrency semaphore. Every hop connects only to addresses the outbound policy checked,
//! and every failure is reduced to a short stable code that fits Phorge's `errorCode`.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use ureq::http::{StatusCode, Uri};
use ureq::unversioned::transport::DefaultConnector;
use ureq::Agent;

use crate::policy::{CheckedTarget, OutboundPolicy, PinnedResolver, PolicyError};

/// Redirects followed before giving up (cURL-like, and enough for any sane receiver).
pub const MAX_REDIRECTS: u32 = 5;

/// The most response body read (and discarded) per hop; the status decides the outcome.
pub const MAX_RESPONSE_BODY: u64 = 64 * 1024;

/// Why an attempt produced no final HTTP status. `code()` is what lands in `errorCode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryError {
    Timeout,
    ConnectionRefused,
    Dns,
    Tls,
    Reset,
    TooManyRedirects,
    /// A redirect pointed at a URI the outbound policy rejects.
    BlockedRedirect,
    /// A 3xx without a usable `Location`.
    BadRedirect,
    /// The receiver spoke something that is not HTTP/1.1.
    Protocol,
    /// Any other connection failure.
    Connection,
}

impl DeliveryError {
    /// Phorge's `errorType`: `timeout` for timeouts, `http` for everything else.
    pub fn error_type(self) -> &'static str {
        match self {
            DeliveryError::Timeout => "timeout",
            _ => "http",
        }
    }

    /// The short stable `errorCode`.
    pub fn code(self) -> &'static str {
        match self {
            DeliveryError::Timeout => "timeout",
            DeliveryError::ConnectionRefused => "connection-refused",
            DeliveryError::Dns => "dns",
            DeliveryError::Tls => "tls",
            DeliveryError::Reset => "reset",
            DeliveryError::TooManyRedirects => "too-many-redirects",
            DeliveryError::BlockedRedirect => "blocked-redirect",
            DeliveryError::BadRedirect => "bad-redirect",
            DeliveryError::Protocol => "protocol",
            DeliveryError::Connection => "connection",
        }
    }

    fn from_ureq(err: &ureq::Error) -> Self {
        use std::io::ErrorKind;
        match err {
            ureq::Error::Timeout(_) => DeliveryError::Timeout,
            ureq::Error::HostNotFound => DeliveryError::Dns,
            ureq::Error::Tls(_) | ureq::Error::Rustls(_) | ureq::Error::TlsRequired => {
                DeliveryError::Tls
            }
            ureq::Error::Protocol(_) | ureq::Error::LargeResponseHeader(..) => {
                DeliveryError::Protocol
            }
            ureq::Error::Io(io) => match io.kind() {
                ErrorKind::ConnectionRefused => DeliveryError::ConnectionRefused,
                ErrorKind::TimedOut | ErrorKind::WouldBlock => DeliveryError::Timeout,
                ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof => DeliveryError::Reset,
                _ => DeliveryError::Connection,
            },
            _ => DeliveryError::Connection,
        }
    }

    fn from_policy(err: PolicyError) -> Self {
        match err {
            PolicyError::Unresolvable => DeliveryError::Dns,
            PolicyError::InvalidUri | PolicyError::Blocked(_) => DeliveryError::BlockedRedirect,
        }
    }
}

/// Sends signed webhook bodies.
#[derive(Debug, Clone)]
pub struct Deliverer {
    policy: Arc<OutboundPolicy>,
    timeout: Duration,
    user_agent: String,
    /// Responses whose body was longer than [`MAX_RESPONSE_BODY`] (the rest is not read).
    bodies_truncated: Counter,
}

impl Deliverer {
    pub fn new(policy: Arc<OutboundPolicy>, timeout: Duration, bodies_truncated: Counter) -> Self {
        Self {
            policy,
            timeout,
            user_agent: format!("gorge-webhook/{}", env!("CARGO_PKG_VERSION")),
            bodies_truncated,
        }
    }

    pub fn policy(&self) -> &OutboundPolicy {
        &self.policy
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// POSTs `body` to an already checked target and returns the final HTTP status.
    /// The timeout covers every hop, redirect lookups and the bounded body read.
    pub fn deliver(
        &self,
        target: CheckedTarget,
        body: &[u8],
        signature: &str,
    ) -> Result<u16, DeliveryError> {
        let deadline = Instant::now() + self.timeout;
        let mut target = target;
        let mut post = true;
        for hop in 0..=MAX_REDIRECTS {
            let remaining = deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or(DeliveryError::Timeout)?;
            let status = self.send_once(&target, post, body, signature, remaining)?;
            let Some(next) = status.redirect else {
                return Ok(status.code);
            };
            if hop == MAX_REDIRECTS {
                return Err(DeliveryError::TooManyRedirects);
            }
            // cURL's behaviour: 301/302/303 continue as GET without a body; 307/308 re-POST.
            if matches!(status.code, 301..=303) {
                post = false;
            }
            let next_uri = join_location(&target.uri, &next).ok_or(DeliveryError::BadRedirect)?;
            let remaining = deadline
                .checked_duration_since(Instant::now())
                .ok_or(DeliveryError::Timeout)?;
            target = self
                .policy
                .check(&next_uri, remaining)
                .map_err(DeliveryError::from_policy)?;
        }
        Err(DeliveryError::TooManyRedirects)
    }

    fn send_once(
        &self,
        target: &CheckedTarget,
        post: bool,
        body: &[u8],
        signature: &str,
        remaining: Duration,
    ) -> Result<HopStatus, DeliveryError> {
        let resolver = PinnedResolver::new(target).ok_or(DeliveryError::BlockedRedirect)?;
        let config = Agent::config_builder()
            .timeout_global(Some(remaining))
            .max_redirects(0)
            .http_status_as_error(false)
            // A proxy would resolve and connect on its own, past the policy.
            .proxy(None)
            .user_agent(self.user_agent.as_str())
            .build();
        // One agent per hop: its resolver knows only this hop's checked addresses.
        let agent = Agent::with_parts(config, DefaultConnector::default(), resolver);
        let result = if post {
            agent
                .post(target.uri.clone())
                .header("Content-Type", "application/json")
                .header("X-Phabricator-Webhook-Signature", signature)
                .send(body)
        } else {
            agent
                .get(target.uri.clone())
                .header("X-Phabricator-Webhook-Signature", signature)
                .call()
        };
        let mut response = result.map_err(|e| DeliveryError::from_ureq(&e))?;
        let code = response.status();
        let redirect = if is_followed_redirect(code) {
            Some(
                response
                    .headers()
                    .get("location")
                    .and_then(|v| v.to_str().ok())
                    .ok_or(DeliveryError::BadRedirect)?
                    .to_string(),
            )
        } else {
            None
        };
        // Read (and drop) a bounded amount so well-behaved receivers finish cleanly; the
        // status is already decided, so a failing body read does not change the outcome.
        let mut reader = response.body_mut().as_reader();
        let read = std::io::copy(
            &mut (&mut reader).take(MAX_RESPONSE_BODY),
            &mut std::io::sink(),
        );
        if read.is_ok_and(|n| n == MAX_RESPONSE_BODY)
            && reader.read(&mut [0u8]).is_ok_and(|n| n > 0)
        {
            self.bodies_truncated.inc();
        }
        Ok(HopStatus {
            code: code.as_u16(),
            redirect,
        })
    }
}

struct HopStatus {
    code: u16,
    redirect: Option<String>,
}

fn is_followed_redirect(code: StatusCode) -> bool {
    matches!(code.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// Resolves a `Location` value against the URI it came from (absolute, scheme-relative,
/// absolute-path or relative-path forms).
fn join_location(base: &Uri, location: &str) -> Option<String> {
    let location = location.trim();
    if location.is_empty() {
        return None;
    }
    if let Ok(uri) = location.parse::<Uri>() {
        if uri.scheme().is_some() {
            return Some(location.to_string());
        }
    }
    let scheme = base.scheme_str()?;
    let authority = base.authority()?.as_str();
    if let Some(rest) = location.strip_prefix("//") {
        return Some(format!("{scheme}://{rest}"));
    }
    if location.starts_with('/') {
        return Some(format!("{scheme}://{authority}{location}"));
    }
    let path = base.path();
    let dir = &path[..path.rfind('/').map(|i| i + 1).unwrap_or(0)];
    let dir = if dir.is_empty() { "/" } else { dir };
    Some(format!("{scheme}://{authority}{dir}{location}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_short_and_stable() {
        assert_eq!(DeliveryError::Timeout.error_type(), "timeout");
        assert_eq!(DeliveryError::Timeout.code(), "timeout");
        assert_eq!(DeliveryError::ConnectionRefused.error_type(), "http");
        assert_eq!(
            DeliveryError::ConnectionRefused.code(),
            "connection-refused"
        );
        assert_eq!(DeliveryError::BlockedRedirect.code(), "blocked-redirect");
        assert_eq!(DeliveryError::TooManyRedirects.code(), "too-many-redirects");
    }

    #[test]
    fn io_errors_map_to_codes() {
        use std::io::{Error, ErrorKind};
        let map = |k| DeliveryError::from_ureq(&ureq::Error::Io(Error::from(k)));
        assert_eq!(
            map(ErrorKind::ConnectionRefused),
            DeliveryError::ConnectionRefused
        );
        assert_eq!(map(ErrorKind::ConnectionReset), DeliveryError::Reset);
        assert_eq!(map(ErrorKind::TimedOut), DeliveryError::Timeout);
        assert_eq!(
            DeliveryError::from_ureq(&ureq::Error::HostNotFound),
            DeliveryError::Dns
        );
        assert_eq!(
            DeliveryError::from_ureq(&ureq::Error::Timeout(ureq::Timeout::Global)),
            DeliveryError::Timeout
        );
    }

    #[test]
    fn locations_resolve_against_the_current_uri() {
        let base: Uri = "https://h.example:8443/a/b?x=1".parse().unwrap();
        assert_eq!(
            join_location(&base, "http://other/x").unwrap(),
            "http://other/x"
        );
        assert_eq!(
            join_location(&base, "//other/x").unwrap(),
            "https://other/x"
        );
        assert_eq!(
            join_location(&base, "/root").unwrap(),
            "https://h.example:8443/root"
        );
        assert_eq!(
            join_location(&base, "c?y").unwrap(),
            "https://h.example:8443/a/c?y"
        );
        assert_eq!(join_location(&base, "  "), None);
    }
}
