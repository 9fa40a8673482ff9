//! The webhook receiver of the chaos run: each hook answers in its own way, chosen by its
//! number (200, 500, hang, a redirect to a 200, or a close without an answer), and the run
//! can make it flap (the 200 hooks answer 500 every other half second) or hang for a while.
//! Every request of a bench row is recorded into the run's [`History`].

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::history::{Answer, Arrival, History};
use crate::http1::read_request;
use crate::receiver::body_seq;

/// How a hook answers when nothing is wrong with the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookMode {
    Ok,
    Status500,
    Hang,
    /// 307 to `/ok/<hook>/<row>` (307 keeps the POST and its body, as cURL follows it).
    Redirect,
    Close,
}

/// Hook `n`'s mode: most answer 200 so that most rows are delivered.
pub fn hook_mode(n: usize) -> HookMode {
    match n % 8 {
        0..=3 => HookMode::Ok,
        4 => HookMode::Status500,
        5 => HookMode::Redirect,
        6 => HookMode::Close,
        _ => HookMode::Hang,
    }
}

/// Whether rows of hook `n` may be `retry=forever` (only hooks that end up answering 200:
/// Phorge retries the others forever).
pub fn may_retry_forever(n: usize) -> bool {
    matches!(hook_mode(n), HookMode::Ok | HookMode::Redirect)
}

/// What the receiver as a whole does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Trouble {
    None = 0,
    Flapping = 1,
    Hanging = 2,
}

pub struct HookReceiver {
    pub port: u16,
    trouble: Arc<AtomicU8>,
    accept: JoinHandle<()>,
}

impl Drop for HookReceiver {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A hung request is held at most this long (the service's delivery timeout ends it first).
const MAX_HANG: Duration = Duration::from_secs(120);
const MAX_BODY: usize = 1024 * 1024;

impl HookReceiver {
    pub async fn start(history: History) -> std::io::Result<HookReceiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let trouble = Arc::new(AtomicU8::new(Trouble::None as u8));
        let shared = trouble.clone();
        let epoch = Instant::now();
        let accept = tokio::spawn(async move {
            loop {
                if let Ok((stream, _)) = listener.accept().await {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(serve(stream, history.clone(), shared.clone(), epoch));
                }
            }
        });
        Ok(HookReceiver {
            port,
            trouble,
            accept,
        })
    }

    pub fn uri(&self, hook: usize) -> String {
        format!("http://127.0.0.1:{}/hook/{hook}", self.port)
    }

    pub fn set(&self, trouble: Trouble) {
        self.trouble.store(trouble as u8, Ordering::SeqCst);
    }
}

fn response(status: u16, reason: &str, extra: &str) -> Vec<u8> {
    format!("HTTP/1.1 {status} {reason}\r\n{extra}Content-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
        .into_bytes()
}

async fn serve(stream: TcpStream, history: History, trouble: Arc<AtomicU8>, epoch: Instant) {
    let mut reader = BufReader::new(stream);
    loop {
        let Some((head, body)) = read_request(&mut reader, MAX_BODY).await else {
            return;
        };
        let path = head.second_word().to_owned();
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let number = |i: usize| parts.get(i).and_then(|p| p.parse::<usize>().ok());
        let (hook, followed) = match (parts.first().copied(), number(1)) {
            (Some("hook"), Some(n)) => (n, false),
            (Some("ok"), Some(n)) => (n, true),
            _ => return,
        };
        let seq = if followed { number(2) } else { body_seq(&body) };
        let Some(seq) = seq else {
            return;
        };
        let mode = if followed {
            HookMode::Ok
        } else {
            hook_mode(hook)
        };
        let answer = match (trouble.load(Ordering::SeqCst), mode) {
            (2, _) => Answer::Hang,
            // Flapping: the hooks that answer 200 answer 500 every other half second.
            (1, HookMode::Ok) if (epoch.elapsed().as_millis() / 500) % 2 == 0 => Answer::Status500,
            (_, HookMode::Ok) => Answer::Ok,
            (_, HookMode::Status500) => Answer::Status500,
            (_, HookMode::Hang) => Answer::Hang,
            (_, HookMode::Redirect) => Answer::Redirect,
            (_, HookMode::Close) => Answer::Close,
        };
        let at_us = history.now_us();
        history.with(|log| {
            log.arrivals.push(Arrival {
                seq,
                hook,
                at_us,
                answer,
            })
        });
        let bytes = match answer {
            Answer::Ok => response(200, "OK", ""),
            Answer::Status500 => response(500, "Internal Server Error", ""),
            Answer::Redirect => response(
                307,
                "Temporary Redirect",
                &format!("Location: /ok/{hook}/{seq}\r\n"),
            ),
            Answer::Close => return,
            Answer::Hang => {
                let mut sink = [0u8; 1024];
                let _ = tokio::time::timeout(MAX_HANG, async {
                    while matches!(reader.read(&mut sink).await, Ok(n) if n > 0) {}
                })
                .await;
                return;
            }
        };
        if reader.get_mut().write_all(&bytes).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::herald_db::transaction_phid;
    use crate::http1::HttpConn;

    async fn post(receiver: &HookReceiver, path: &str, seq: usize) -> Option<u16> {
        let addr = SocketAddr::from(([127, 0, 0, 1], receiver.port));
        let body = format!(
            r#"{{"transactions":[{{"phid":"{}"}}]}}"#,
            transaction_phid(seq)
        );
        let attempt = async {
            let mut conn = HttpConn::connect(addr).await.ok()?;
            conn.request("POST", path, &[], body.as_bytes()).await.ok()
        };
        tokio::time::timeout(Duration::from_millis(500), attempt)
            .await
            .ok()
            .flatten()
            .map(|r| r.status)
    }

    #[tokio::test]
    async fn each_hook_answers_its_way_and_the_run_can_make_them_flap_or_hang() {
        let history = History::new();
        let receiver = HookReceiver::start(history.clone()).await.unwrap();
        assert_eq!(post(&receiver, "/hook/0", 1).await, Some(200));
        assert_eq!(post(&receiver, "/hook/4", 2).await, Some(500));
        assert_eq!(post(&receiver, "/hook/5", 3).await, Some(307));
        assert_eq!(post(&receiver, "/ok/5/3", 3).await, Some(200));
        assert_eq!(post(&receiver, "/hook/6", 4).await, None);
        assert_eq!(post(&receiver, "/hook/7", 5).await, None);
        receiver.set(Trouble::Hanging);
        assert_eq!(post(&receiver, "/hook/0", 6).await, None);
        receiver.set(Trouble::Flapping);
        // Every other half second the 200 hooks answer 500: within 1.5 s, both.
        let mut seen = std::collections::BTreeSet::new();
        for seq in 7..22 {
            seen.insert(post(&receiver, "/hook/1", seq).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(seen, [Some(200), Some(500)].into_iter().collect());
        let answers: Vec<(usize, Answer)> = history
            .snapshot()
            .arrivals
            .iter()
            .take(7)
            .map(|a| (a.seq, a.answer))
            .collect();
        assert_eq!(
            answers,
            [
                (1, Answer::Ok),
                (2, Answer::Status500),
                (3, Answer::Redirect),
                (3, Answer::Ok),
                (4, Answer::Close),
                (5, Answer::Hang),
                (6, Answer::Hang)
            ]
        );
    }
}
