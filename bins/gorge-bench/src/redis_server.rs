//! A `redis-server` of a bench run, from `PATH` (Debian's package): loopback, persistence
//! off, on a port fixed at its start, so a restart comes back empty on the same address (the
//! chaos run's "Redis killed and restarted empty"). Killed when dropped (SIGKILL, which also
//! ends one left SIGSTOPped by a pause).

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// How long a started server may take to answer its first PING.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

pub struct Redis {
    pub port: u16,
    child: Option<Child>,
}

impl Redis {
    /// Starts a server on `port` and waits for its PONG.
    pub async fn start(port: u16) -> Result<Redis, String> {
        let mut redis = Redis { port, child: None };
        redis.restart().await?;
        Ok(redis)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The running server's pid (`None` while killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Starts a fresh (empty) server, the running one killed first, and waits for its PONG.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.kill().await;
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start redis-server: {e}"))?;
        self.child = Some(child);
        let until = Instant::now() + ANSWER_WITHIN;
        while Instant::now() < until {
            if pong(self.port).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("redis-server did not answer on port {}", self.port))
    }
}

/// Whether a server on `port` answers PING within a second.
async fn pong(port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut answer = [0u8; 7];
        stream.read_exact(&mut answer).await.ok()?;
        Some(&answer == b"+PONG\r\n")
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}
