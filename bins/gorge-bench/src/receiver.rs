//! A local webhook receiver that records every POST and can misbehave on purpose.
//!
//! Routes (chosen per hook by its URI): `/hook/<n>` answers after the configured latency,
//! with the configured error and hang rates; `/big/<n>` and `/bigerr/<n>` answer 200 / 500
//! with a 3 MiB body; `/loop/<n>/<k>` redirects forever. A second listener resets every
//! connection. With [`Transport::tls`] the main listener speaks TLS with a certificate
//! from a private CA made at start ([`private_ca`]); with [`Transport::close_each`] every
//! answer closes its connection (no keep-alive). It records which row each POST carried (by its transaction PHID), when it
//! arrived, whether the signature verified, and how many requests of one hook overlapped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ring::hmac;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::herald_db::TRANSACTION_MARKER;
use crate::http1::read_request;

/// Size of the oversized bodies of `/big` and `/bigerr`.
pub const BIG_BODY_BYTES: usize = 3 * 1024 * 1024;
/// Largest request body read; webhook bodies are a few hundred bytes.
const MAX_REQUEST_BODY: usize = 1024 * 1024;
/// Arrivals kept; beyond this they are only counted (a bench must stay bounded too).
const MAX_ARRIVALS: usize = 5_000_000;
/// A hung request is held at most this long if the sender never gives up.
const MAX_HANG: Duration = Duration::from_secs(600);

/// How the main listener talks.
#[derive(Clone, Default)]
pub struct Transport {
    /// Serve TLS with this configuration.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Answer every request with `Connection: close` and close (reuse off).
    pub close_each: bool,
}

/// A private CA and a server configuration for 127.0.0.1/localhost signed by it; returns
/// the CA certificate as PEM (what `GORGE_WEBHOOK_CA_FILE` points at).
pub fn private_ca() -> Result<(String, Arc<rustls::ServerConfig>), String> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let err = |e: &dyn std::fmt::Display| format!("private CA: {e}");
    let mut ca_params = CertificateParams::new(Vec::new()).map_err(|e| err(&e))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "gorge-bench private CA");
    let ca_key = KeyPair::generate().map_err(|e| err(&e))?;
    let ca = ca_params.self_signed(&ca_key).map_err(|e| err(&e))?;
    let leaf_params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .map_err(|e| err(&e))?;
    let leaf_key = KeyPair::generate().map_err(|e| err(&e))?;
    let leaf = leaf_params
        .signed_by(&leaf_key, &ca, &ca_key)
        .map_err(|e| err(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&e))?
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .map_err(|e| err(&e))?;
    Ok((ca.pem(), Arc::new(config)))
}

#[derive(Debug, Clone, Copy)]
pub struct Behaviour {
    pub latency: Duration,
    pub error_rate: f64,
    pub hang_rate: f64,
}

/// How the receiver answered one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Error,
    Hang,
    Other,
}

#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    /// The row, when the body carried a bench transaction PHID.
    pub seq: Option<usize>,
    pub hook: usize,
    /// µs since the receiver's epoch.
    pub at_us: u64,
    pub answer: Answer,
}

pub struct ReceiverState {
    behaviour: Behaviour,
    keys: Vec<hmac::Key>,
    pub epoch: Instant,
    arrivals: Mutex<Vec<Arrival>>,
    pub arrivals_dropped: AtomicU64,
    inflight: Box<[AtomicU32]>,
    max_inflight: Box<[AtomicU32]>,
    pub bad_signatures: AtomicU64,
    pub unparsed: AtomicU64,
    pub resets: AtomicU64,
    pub requests: AtomicU64,
    /// Connections accepted on the main listener, and TLS handshakes completed on them.
    pub connections: AtomicU64,
    pub tls_handshakes: AtomicU64,
    close_each: bool,
}

impl ReceiverState {
    fn record(&self, arrival: Arrival) {
        let mut arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        if arrivals.len() < MAX_ARRIVALS {
            arrivals.push(arrival);
        } else {
            self.arrivals_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A copy of what arrived so far.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn arrival_count(&self) -> usize {
        self.arrivals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// The most requests of any one hook that were ever in flight at once.
    pub fn max_concurrent_per_hook(&self) -> u32 {
        self.max_inflight
            .iter()
            .map(|m| m.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    }

    pub fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }
}

/// Counts one hook's request as in flight for as long as it lives.
struct InFlight<'a> {
    state: &'a ReceiverState,
    hook: usize,
}

impl<'a> InFlight<'a> {
    fn enter(state: &'a ReceiverState, hook: usize) -> Option<InFlight<'a>> {
        let now = state.inflight.get(hook)?.fetch_add(1, Ordering::SeqCst) + 1;
        state.max_inflight[hook].fetch_max(now, Ordering::SeqCst);
        Some(InFlight { state, hook })
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.state.inflight[self.hook].fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct Receiver {
    pub addr: SocketAddr,
    pub tls: bool,
    pub reset_addr: SocketAddr,
    pub state: Arc<ReceiverState>,
    accept_loops: Vec<JoinHandle<()>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        for task in &self.accept_loops {
            task.abort();
        }
    }
}

enum Route {
    Hook(usize),
    Big(usize),
    BigError(usize),
    Loop(usize, u64),
    Unknown,
}

fn route(target: &str) -> Route {
    let path = target.split('?').next().unwrap_or("");
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let num = |i: usize| parts.get(i).and_then(|p| p.parse::<u64>().ok());
    match (parts.first().copied(), num(1)) {
        (Some("hook"), Some(n)) => Route::Hook(n as usize),
        (Some("big"), Some(n)) => Route::Big(n as usize),
        (Some("bigerr"), Some(n)) => Route::BigError(n as usize),
        (Some("loop"), Some(n)) => Route::Loop(n as usize, num(2).unwrap_or(0)),
        _ => Route::Unknown,
    }
}

/// Row sequence number carried in a webhook body.
pub fn body_seq(body: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find(TRANSACTION_MARKER)? + TRANSACTION_MARKER.len();
    let digits: String = text[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

pub fn hex_signature(key: &hmac::Key, body: &[u8]) -> String {
    hmac::sign(key, body)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Receiver {
    /// Starts both listeners on 127.0.0.1; `hmac_keys[n]` is the key of hook `n`.
    pub async fn start(
        behaviour: Behaviour,
        hmac_keys: &[String],
        transport: Transport,
    ) -> std::io::Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let reset_listener = TcpListener::bind("127.0.0.1:0").await?;
        let hooks = hmac_keys.len();
        let state = Arc::new(ReceiverState {
            behaviour,
            keys: hmac_keys
                .iter()
                .map(|k| hmac::Key::new(hmac::HMAC_SHA256, k.as_bytes()))
                .collect(),
            epoch: Instant::now(),
            arrivals: Mutex::new(Vec::new()),
            arrivals_dropped: AtomicU64::new(0),
            inflight: (0..hooks).map(|_| AtomicU32::new(0)).collect(),
            max_inflight: (0..hooks).map(|_| AtomicU32::new(0)).collect(),
            bad_signatures: AtomicU64::new(0),
            unparsed: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            tls_handshakes: AtomicU64::new(0),
            close_each: transport.close_each,
        });
        let acceptor = transport.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        let addr = listener.local_addr()?;
        let reset_addr = reset_listener.local_addr()?;
        let serving = {
            let state = state.clone();
            tokio::spawn(async move {
                let mut connections = JoinSet::new();
                loop {
                    tokio::select! {
                        accepted = listener.accept() => if let Ok((stream, _)) = accepted {
                            state.connections.fetch_add(1, Ordering::Relaxed);
                            let _ = stream.set_nodelay(true);
                            let state = state.clone();
                            match acceptor.clone() {
                                None => {
                                    connections.spawn(serve_connection(stream, state, addr));
                                }
                                Some(acceptor) => {
                                    connections.spawn(async move {
                                        if let Ok(stream) = acceptor.accept(stream).await {
                                            state.tls_handshakes.fetch_add(1, Ordering::Relaxed);
                                            serve_connection(stream, state, addr).await;
                                        }
                                    });
                                }
                            }
                        },
                        Some(_) = connections.join_next(), if !connections.is_empty() => {}
                    }
                }
            })
        };
        let resetting = {
            let state = state.clone();
            tokio::spawn(async move {
                let mut connections = JoinSet::new();
                loop {
                    tokio::select! {
                        accepted = reset_listener.accept() => if let Ok((stream, _)) = accepted {
                            let state = state.clone();
                            connections.spawn(async move {
                                // Closing with the request unread makes the kernel send RST.
                                // `peek` waits for request bytes without consuming them
                                // (`readable()` can fire before any arrive, and a close with
                                // nothing unread is a FIN: an empty reply, not a reset).
                                let mut first = [0u8; 1];
                                let _ = tokio::time::timeout(Duration::from_secs(5), stream.peek(&mut first)).await;
                                state.resets.fetch_add(1, Ordering::Relaxed);
                                drop(stream);
                            });
                        },
                        Some(_) = connections.join_next(), if !connections.is_empty() => {}
                    }
                }
            })
        };
        Ok(Receiver {
            addr,
            tls: transport.tls.is_some(),
            reset_addr,
            state,
            accept_loops: vec![serving, resetting],
        })
    }

    pub fn hook_uri(&self, hook: usize) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}/hook/{hook}", self.addr)
    }
}

async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    state: Arc<ReceiverState>,
    own_addr: SocketAddr,
) {
    let mut reader = BufReader::new(stream);
    loop {
        let Some((head, body)) = read_request(&mut reader, MAX_REQUEST_BODY).await else {
            return;
        };
        state.requests.fetch_add(1, Ordering::Relaxed);
        let response: Vec<u8> = match route(head.second_word()) {
            Route::Hook(hook) => {
                let seq = body_seq(&body);
                if seq.is_none() {
                    state.unparsed.fetch_add(1, Ordering::Relaxed);
                }
                let signed = head.header("x-phabricator-webhook-signature").unwrap_or("");
                if state
                    .keys
                    .get(hook)
                    .is_none_or(|key| hex_signature(key, &body) != signed)
                {
                    state.bad_signatures.fetch_add(1, Ordering::Relaxed);
                }
                let Some(inflight) = InFlight::enter(&state, hook) else {
                    return;
                };
                let roll: f64 = rand::random();
                let behaviour = state.behaviour;
                let answer = if roll < behaviour.hang_rate {
                    Answer::Hang
                } else if roll < behaviour.hang_rate + behaviour.error_rate {
                    Answer::Error
                } else {
                    Answer::Ok
                };
                state.record(Arrival {
                    seq,
                    hook,
                    at_us: state.now_us(),
                    answer,
                });
                if answer == Answer::Hang {
                    // Hold the request until the sender gives up and closes.
                    let mut sink = [0u8; 1024];
                    let _ = tokio::time::timeout(MAX_HANG, async {
                        while matches!(reader.read(&mut sink).await, Ok(n) if n > 0) {}
                    })
                    .await;
                    return;
                }
                if !behaviour.latency.is_zero() {
                    tokio::time::sleep(behaviour.latency).await;
                }
                let response = if answer == Answer::Ok {
                    plain_on(state.close_each, 200, "OK", b"ok")
                } else {
                    plain_on(state.close_each, 500, "Internal Server Error", b"no")
                };
                // No longer in flight once the answer is decided, before it is written: the
                // sender may read it and send the hook's next request before this task runs
                // again (a preempted task then saw two "in flight" that never overlapped).
                drop(inflight);
                if reader.get_mut().write_all(&response).await.is_err() || state.close_each {
                    let _ = reader.get_mut().shutdown().await;
                    return;
                }
                continue;
            }
            Route::Big(hook) | Route::BigError(hook) => {
                let status = if matches!(route(head.second_word()), Route::Big(_)) {
                    (200, "OK")
                } else {
                    (500, "Internal Server Error")
                };
                state.record(Arrival {
                    seq: body_seq(&body),
                    hook,
                    at_us: state.now_us(),
                    answer: Answer::Other,
                });
                let head = format!(
                    "HTTP/1.1 {} {}\r\nContent-Type: text/plain\r\nContent-Length: {BIG_BODY_BYTES}\r\n\r\n",
                    status.0, status.1
                );
                let stream = reader.get_mut();
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; 64 * 1024];
                for _ in 0..BIG_BODY_BYTES / chunk.len() {
                    if stream.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
                continue;
            }
            Route::Loop(hook, hop) => {
                state.record(Arrival {
                    seq: body_seq(&body),
                    hook,
                    at_us: state.now_us(),
                    answer: Answer::Other,
                });
                format!(
                    "HTTP/1.1 302 Found\r\nLocation: http://{own_addr}/loop/{hook}/{}\r\nContent-Length: 0\r\n\r\n",
                    hop + 1
                )
                .into_bytes()
            }
            Route::Unknown => plain(404, "Not Found", b"unknown route"),
        };
        if reader.get_mut().write_all(&response).await.is_err() {
            return;
        }
    }
}

fn plain(status: u16, reason: &str, body: &[u8]) -> Vec<u8> {
    plain_on(false, status, reason, body)
}

fn plain_on(close: bool, status: u16, reason: &str, body: &[u8]) -> Vec<u8> {
    let connection = if close { "Connection: close\r\n" } else { "" };
    let mut response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n{connection}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(body);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_row_in_formatted_body() {
        let body = b"{\n  \"transactions\": [\n    {\n      \"phid\": \"PHID-XACT-TASK-bench0000000123\"\n    }\n  ]\n}\n";
        assert_eq!(body_seq(body), Some(123));
        assert_eq!(body_seq(b"{}"), None);
    }

    #[tokio::test]
    async fn records_rows_checks_signatures_and_redirects() {
        use crate::http1::HttpConn;
        let behaviour = Behaviour {
            latency: Duration::ZERO,
            error_rate: 0.0,
            hang_rate: 0.0,
        };
        let receiver = Receiver::start(behaviour, &["k0".to_string()], Transport::default())
            .await
            .unwrap();
        let body = b"{\"phid\": \"PHID-XACT-TASK-bench0000000007\"}\n";
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"k0");
        let mut conn = HttpConn::connect(receiver.addr).await.unwrap();
        let signature = hex_signature(&key, body);
        let signed = [("X-Phabricator-Webhook-Signature", signature.as_str())];
        let ok = conn
            .request("POST", "/hook/0", &signed, body)
            .await
            .unwrap();
        assert_eq!((ok.status, ok.body.as_slice()), (200, &b"ok"[..]));
        let forged = [("X-Phabricator-Webhook-Signature", "00")];
        conn.request("POST", "/hook/0", &forged, body)
            .await
            .unwrap();
        let redirect = conn.request("GET", "/loop/0/3", &[], b"").await.unwrap();
        assert_eq!(redirect.status, 302);

        let state = &receiver.state;
        let arrivals = state.arrivals();
        assert_eq!(arrivals.len(), 3);
        assert_eq!((arrivals[0].seq, arrivals[0].answer), (Some(7), Answer::Ok));
        assert_eq!(state.bad_signatures.load(Ordering::Relaxed), 1);
        assert_eq!(state.max_concurrent_per_hook(), 1);
    }

    #[test]
    fn signature_is_lowercase_hex_sha256() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"key");
        // RFC 4231-style known answer for HMAC-SHA256("key", "The quick brown fox...").
        assert_eq!(
            hex_signature(&key, b"The quick brown fox jumps over the lazy dog"),
            "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
    }
}
