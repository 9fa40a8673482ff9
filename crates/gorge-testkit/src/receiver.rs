//! A scripted HTTP/1.1 receiver on an ephemeral loopback port, on threads: it records each
//! request's raw header names and body, answers as the test's script says per request
//! (status, redirect, delay, hold until released, large body, hang-up), and lets tests wait
//! for the n-th request.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// `HTTP/1.1`.
    pub version: String,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// Header names exactly as sent (case included), in arrival order.
    pub raw_names: Vec<String>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == &name.to_ascii_lowercase())
            .map(|(_, v)| v.as_str())
    }

    /// The `object.phid` of a webhook body.
    pub fn object_phid(&self) -> String {
        let value: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_default();
        value["object"]["phid"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// How the receiver answers.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16),
    /// Status with a `Location` header.
    Redirect(u16, String),
    /// Wait, then answer with the status.
    Delay(Duration, u16),
    /// Wait until [`Receiver::release`], then answer with the status.
    Hold(u16),
    /// Wait until [`Receiver::release`] (forever if it never comes), then answer as the
    /// inner reply says.
    HoldThen(Box<Reply>),
    /// The status with a body of this many bytes.
    Sized(u16, usize),
    /// The status with this body, labelled `application/json`.
    Json(u16, String),
    /// Close the connection without answering.
    Hangup,
}

type Behaviour = Arc<dyn Fn(&Recorded, usize) -> Reply + Send + Sync>;

#[derive(Default)]
struct Log {
    requests: Vec<Recorded>,
    in_flight: HashMap<String, usize>,
    max_in_flight: HashMap<String, usize>,
    released: bool,
}

struct Shared {
    log: Mutex<Log>,
    changed: Condvar,
    behaviour: Mutex<Behaviour>,
}

/// A threaded HTTP/1.1 receiver on 127.0.0.1.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Receiver {
    /// Starts a receiver answering every request with `status`.
    pub fn start(status: u16) -> Receiver {
        Receiver::with(move |_, _| Reply::Status(status))
    }

    /// Starts a receiver whose answer is chosen per request (the second argument is the
    /// request's 0-based arrival index).
    pub fn with(behaviour: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static) -> Receiver {
        Receiver::on(TcpListener::bind("127.0.0.1:0").unwrap(), behaviour)
    }

    /// [`Receiver::with`] on a listener the caller made (e.g. on a port it held, not
    /// listening, while a test needed a peer that refuses connections).
    pub fn on(
        listener: TcpListener,
        behaviour: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static,
    ) -> Receiver {
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            log: Mutex::new(Log::default()),
            changed: Condvar::new(),
            behaviour: Mutex::new(Arc::new(behaviour)),
        });
        let accept_shared = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let shared = accept_shared.clone();
                std::thread::spawn(move || serve(stream, shared));
            }
        });
        Receiver { addr, shared }
    }

    pub fn set_behaviour(
        &self,
        behaviour: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static,
    ) {
        *self.shared.behaviour.lock().unwrap() = Arc::new(behaviour);
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.log.lock().unwrap().requests.clone()
    }

    pub fn count(&self) -> usize {
        self.shared.log.lock().unwrap().requests.len()
    }

    /// Highest number of simultaneous requests seen on one path.
    pub fn max_in_flight_per_path(&self) -> usize {
        let log = self.shared.log.lock().unwrap();
        log.max_in_flight.values().copied().max().unwrap_or(0)
    }

    /// Lets held requests answer (and any later `Hold` answer at once).
    pub fn release(&self) {
        self.shared.log.lock().unwrap().released = true;
        self.shared.changed.notify_all();
    }

    /// Blocks until at least `n` requests arrived; panics after `timeout`.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Recorded> {
        let deadline = Instant::now() + timeout;
        let mut log = self.shared.log.lock().unwrap();
        while log.requests.len() < n {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("receiver got {} of {n} requests", log.requests.len()));
            log = self.shared.changed.wait_timeout(log, left).unwrap().0;
        }
        log.requests.clone()
    }
}

fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let Some(request) = read_request(&mut reader) else {
        return;
    };
    {
        let (index, behaviour) = {
            let mut log = shared.log.lock().unwrap();
            log.requests.push(request.clone());
            let now = {
                let n = log.in_flight.entry(request.path.clone()).or_insert(0);
                *n += 1;
                *n
            };
            let max = log.max_in_flight.entry(request.path.clone()).or_insert(0);
            *max = (*max).max(now);
            (
                log.requests.len() - 1,
                shared.behaviour.lock().unwrap().clone(),
            )
        };
        shared.changed.notify_all();
        let answer = answer(behaviour(&request, index), &shared);
        {
            let mut log = shared.log.lock().unwrap();
            if let Some(n) = log.in_flight.get_mut(&request.path) {
                *n -= 1;
            }
        }
        if let Some(answer) = answer {
            let _ = writer.write_all(&answer);
            let _ = writer.flush();
        }
    }
}

/// The response bytes for `reply` once it is due (after any delay or hold); `None` to hang
/// up.
fn answer(reply: Reply, shared: &Shared) -> Option<Vec<u8>> {
    let mut body = b"ok".to_vec();
    let mut extra_headers = String::new();
    let status = match reply {
        Reply::Hangup => return None,
        Reply::Status(s) => s,
        Reply::Sized(s, size) => {
            body = vec![b'x'; size];
            s
        }
        Reply::Json(s, json) => {
            body = json.into_bytes();
            extra_headers.push_str("Content-Type: application/json\r\n");
            s
        }
        Reply::Redirect(s, to) => {
            extra_headers.push_str(&format!("Location: {to}\r\n"));
            s
        }
        Reply::Delay(d, s) => {
            std::thread::sleep(d);
            s
        }
        Reply::Hold(s) => return answer(Reply::HoldThen(Box::new(Reply::Status(s))), shared),
        Reply::HoldThen(then) => {
            let mut log = shared.log.lock().unwrap();
            while !log.released {
                log = shared.changed.wait(log).unwrap();
            }
            drop(log);
            return answer(*then, shared);
        }
    };
    let head = format!(
        "HTTP/1.1 {status} {}\r\n{extra_headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        reason_phrase(status),
        body.len()
    );
    Some([head.into_bytes(), body].concat())
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Recorded> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let version = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    let mut raw_names = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        raw_names.push(name.trim().to_string());
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Recorded {
        method,
        path,
        version,
        headers,
        raw_names,
        body,
    })
}

/// The standard reason phrase of `status` (`Unknown` for codes without one), as a real
/// receiver would send.
fn reason_phrase(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|code| code.canonical_reason())
        .unwrap_or("Unknown")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::get_blocking;

    #[test]
    fn answers_from_the_script_and_records_raw_header_names() {
        let receiver = Receiver::with(|_, index| match index {
            0 => Reply::Json(201, r#"{"a":1}"#.to_owned()),
            1 => Reply::Redirect(302, "/next".to_owned()),
            _ => Reply::Status(503),
        });
        let json = get_blocking(receiver.addr, "/j", &[("X-Mixed-Case", "v")]);
        assert_eq!((json.status, json.reason.as_str()), (201, "Created"));
        assert_eq!(json.header("content-type"), Some("application/json"));
        assert_eq!(json.body, br#"{"a":1}"#);
        let redirect = get_blocking(receiver.addr, "/r", &[]);
        assert_eq!(
            (redirect.status, redirect.header("location")),
            (302, Some("/next"))
        );
        let unready = get_blocking(receiver.addr, "/u", &[]);
        assert_eq!(
            (unready.status, unready.reason.as_str()),
            (503, "Service Unavailable")
        );
        let first = &receiver.requests()[0];
        assert_eq!((first.method.as_str(), first.path.as_str()), ("GET", "/j"));
        assert!(first.raw_names.iter().any(|name| name == "X-Mixed-Case"));
        assert_eq!(first.header("x-mixed-case"), Some("v"));
    }

    #[test]
    fn a_held_request_answers_only_after_release() {
        let receiver = Receiver::with(|_, _| Reply::HoldThen(Box::new(Reply::Status(204))));
        let addr = receiver.addr;
        let pending = std::thread::spawn(move || get_blocking(addr, "/held", &[]).status);
        receiver.wait_for(1, crate::PATIENCE);
        // The request is recorded before its answer is chosen: give an answer that was not
        // held time to arrive before checking that none did.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!pending.is_finished());
        receiver.release();
        assert_eq!(pending.join().unwrap(), 204);
    }
}
