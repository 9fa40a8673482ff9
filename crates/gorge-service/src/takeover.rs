//! Before binding: is another copy of this service already serving on one of its ports?
//!
//! Listeners bind with `SO_REUSEPORT` so that a new process can take the ports of one that
//! drains (a same-host restart). The same option lets a second copy started by mistake bind
//! beside a first one that is serving, silently: the kernel then splits the connections
//! between them (PHP's POSTs and the browsers between two notification hubs) — also when the
//! two share only one port (a copy of the configuration with another admin port still binds
//! the client port; Aphlict, without `SO_REUSEPORT`, would fail to bind there). So before
//! binding, a service asks whatever answers `GET /readyz` on **every** address it binds, its
//! health address first:
//!
//! - nothing listens (connection refused): bind — a draining copy has closed all of its
//!   listeners when its drain started (`shutdown::run`);
//! - a copy that drains (`503 {"status":"draining"}`, on its health port while it closes its
//!   listeners): bind, and take over from it;
//! - anything else that answers or accepts (a ready copy, one that is not ready yet, a
//!   copy too busy to answer within [`PROBE_TIMEOUT`]), still so after [`SETTLE`] (a copy
//!   sent SIGTERM just before this one started needs a moment to start draining): refuse to
//!   start, with one line that names the address, the other copy's pid when it says it (the
//!   [`PID_HEADER`] of its probe answers), and how to restart in place.
//!
//! What this does not guarantee: two copies started at the same instant can both find the
//! port free and both bind. The check catches the mistake operators make (a second start
//! of a service that is already running); it is not a lock.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use slog::Logger;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::healthcheck::probe_target;
use crate::{emit, events};

/// The header of every probe answer that carries the answering process's pid.
pub const PID_HEADER: &str = "x-gorge-pid";

/// How long the other process has to accept and answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a serving copy may take to start draining before this one refuses: `kill;
/// start` with no pause (`bin/aphlict restart`, scripts) starts this process while the old
/// one may not have handled its SIGTERM yet.
pub const SETTLE: Duration = Duration::from_secs(2);

/// Pause between two probes while waiting for a serving copy to start draining.
const REPROBE_PAUSE: Duration = Duration::from_millis(100);

/// Most bytes of the answer read (a probe answer is a few hundred).
const ANSWER_LIMIT: usize = 4096;

/// Who holds a health address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Nothing accepts connections there.
    Nobody,
    /// A copy that is draining: it hands the port over.
    Draining,
    /// Something that serves and is not draining.
    Serving {
        /// Its pid, when it said it.
        pid: Option<u32>,
        /// What it answered, in a few words (`200`, `503 …`, `nothing within 2 s`).
        answer: String,
    },
}

/// Another copy serves on a health address: startup stops (exit 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnotherCopy {
    /// The health address probed.
    pub addr: SocketAddr,
    /// The other copy's pid, when it said it.
    pub pid: Option<u32>,
    /// What it answered.
    pub answer: String,
}

impl fmt::Display for AnotherCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (who, term) = match self.pid {
            Some(pid) => (
                format!("another copy (pid {pid})"),
                format!("kill -TERM {pid}"),
            ),
            None => ("another copy".to_string(), "kill -TERM <pid>".to_string()),
        };
        write!(
            f,
            "{who} is already serving on {} (GET /readyz: {}); a second one on the same ports \
             would split the traffic between them. Stop it, or restart in place: SIGTERM it \
             (systemctl restart, or {term}) and start this one at once, which takes over \
             while the old one drains",
            self.addr, self.answer
        )
    }
}

impl std::error::Error for AnotherCopy {}

/// Probes each of `addrs` — every address the process is about to bind, its health address
/// first (port 0 is skipped: a fresh port has no holder) — and refuses the first one another
/// copy still serves on after [`SETTLE`], logging `ANOTHER_COPY_SERVING`.
pub async fn refuse_if_serving(
    addrs: impl IntoIterator<Item = SocketAddr>,
    log: &Logger,
) -> Result<(), AnotherCopy> {
    for addr in addrs.into_iter().filter(|a| a.port() != 0) {
        let deadline = tokio::time::Instant::now() + SETTLE;
        loop {
            let Holder::Serving { pid, answer } = holder(addr, PROBE_TIMEOUT).await else {
                break;
            };
            if tokio::time::Instant::now() < deadline {
                tokio::time::sleep(REPROBE_PAUSE).await;
                continue;
            }
            let pid_text = pid.map_or_else(|| "unknown".to_string(), |p| p.to_string());
            emit!(log, events::ANOTHER_COPY_SERVING;
                "addr" => %addr, "pid" => pid_text, "answer" => &answer);
            return Err(AnotherCopy { addr, pid, answer });
        }
    }
    Ok(())
}

/// Who answers `GET /readyz` on `listen` (a wildcard address is asked on loopback).
pub async fn holder(listen: SocketAddr, timeout: Duration) -> Holder {
    let addr = probe_target(listen);
    let mut stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => stream,
        // Refused, unreachable: nobody listens. (A connect that hangs is no listener of
        // ours on this host either: a local listener answers the handshake at once.)
        Ok(Err(_)) | Err(_) => return Holder::Nobody,
    };
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let exchange = async {
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::with_capacity(512);
        let mut chunk = [0u8; 512];
        while answer.len() < ANSWER_LIMIT {
            match stream.read(&mut chunk).await? {
                0 => break,
                n => answer.extend_from_slice(&chunk[..n]),
            }
        }
        Ok::<_, std::io::Error>(answer)
    };
    let silent = |answer: String| Holder::Serving { pid: None, answer };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(answer)) => classify(&answer),
        Ok(Err(err)) => silent(format!("no answer ({err})")),
        Err(_) => silent(format!("no answer within {} s", timeout.as_secs())),
    }
}

/// What an answer to `GET /readyz` says about its sender.
fn classify(raw: &[u8]) -> Holder {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or("").trim();
    let Some(code) = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split_ascii_whitespace().nth(1))
    else {
        return Holder::Serving {
            pid: None,
            answer: "no HTTP answer".to_string(),
        };
    };
    let pid = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case(PID_HEADER)
            .then(|| value.trim().parse().ok())
            .flatten()
    });
    let body = body.trim();
    if code == "503" && body.contains(r#""status":"draining""#) {
        return Holder::Draining;
    }
    let answer = if body.is_empty() || code == "200" {
        code.to_string()
    } else {
        format!("{code} {}", body.chars().take(120).collect::<String>())
    };
    Holder::Serving { pid, answer }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified() {
        let ready = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nX-Gorge-Pid: 4242\r\n\r\n{\"status\":\"ok\"}";
        assert_eq!(
            classify(ready),
            Holder::Serving {
                pid: Some(4242),
                answer: "200".into()
            }
        );
        let draining =
            b"HTTP/1.1 503 Service Unavailable\r\nx-gorge-pid: 7\r\n\r\n{\"status\":\"draining\"}";
        assert_eq!(classify(draining), Holder::Draining);
        let not_ready = b"HTTP/1.1 503 Service Unavailable\r\n\r\n{\"status\":\"unavailable\",\"reason\":\"no rows handed over\"}";
        assert_eq!(
            classify(not_ready),
            Holder::Serving {
                pid: None,
                answer: r#"503 {"status":"unavailable","reason":"no rows handed over"}"#.into()
            }
        );
        assert_eq!(
            classify(b"SSH-2.0-OpenSSH\r\n"),
            Holder::Serving {
                pid: None,
                answer: "no HTTP answer".into()
            }
        );
    }

    #[test]
    fn the_refusal_is_one_line_naming_the_pid_and_the_way_to_restart() {
        let copy = AnotherCopy {
            addr: "127.0.0.1:22281".parse().unwrap(),
            pid: Some(4242),
            answer: "200".into(),
        };
        let line = copy.to_string();
        assert!(!line.contains('\n'));
        assert!(
            line.starts_with(
                "another copy (pid 4242) is already serving on 127.0.0.1:22281 (GET /readyz: 200)"
            ),
            "{line}"
        );
        assert!(line.contains("kill -TERM 4242"), "{line}");
    }

    /// A loopback server answering its n-th connection with `answer(n)`.
    async fn answering(answer: fn(usize) -> &'static str) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            for n in 0.. {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request).await;
                let _ = stream.write_all(answer(n).as_bytes()).await;
            }
        });
        addr
    }

    const READY: &str =
        "HTTP/1.1 200 OK\r\nx-gorge-pid: 99\r\ncontent-length: 15\r\n\r\n{\"status\":\"ok\"}";
    const DRAINING: &str =
        "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 21\r\n\r\n{\"status\":\"draining\"}";

    #[tokio::test]
    async fn a_copy_that_starts_draining_soon_is_taken_over_one_that_serves_on_is_refused() {
        let log = Logger::root(slog::Discard, slog::o!());
        // SIGTERM'd just before this copy started: ready for a moment, then draining.
        let stopping = answering(|n| if n < 3 { READY } else { DRAINING }).await;
        assert_eq!(refuse_if_serving([stopping], &log).await, Ok(()));
        let serving = answering(|_| READY).await;
        let started = tokio::time::Instant::now();
        assert_eq!(
            refuse_if_serving([serving], &log).await,
            Err(AnotherCopy {
                addr: serving,
                pid: Some(99),
                answer: "200".into()
            })
        );
        assert!(started.elapsed() >= SETTLE);
    }

    #[tokio::test]
    async fn a_port_nobody_listens_on_is_free_and_a_silent_listener_is_not() {
        // Held, so nobody else can take it meanwhile; not listening, so connects are refused.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = socket.local_addr().unwrap();
        assert_eq!(holder(addr, PROBE_TIMEOUT).await, Holder::Nobody);
        // Listening, but never answering: something holds the port.
        let listener = socket.listen(8).unwrap();
        let silent = holder(addr, Duration::from_millis(200)).await;
        assert!(
            matches!(&silent, Holder::Serving { pid: None, answer } if answer.starts_with("no answer")),
            "{silent:?}"
        );
        drop(listener);
    }
}
