//! Child service processes for the webhook bench and the drills: find the binaries, pick
//! loopback ports, start with the right environment, wait for readiness, kill.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::http1;
use crate::sys;

/// The release (or debug) binary `name` built next to this executable.
pub fn sibling_binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// A loopback port that was free a moment ago (the kernel may hand it out again; the
/// services bind it right away, and a clash shows up as a failed start, never silently).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `n` pairs of loopback ports (a notification server's client and admin ports), all
/// distinct: every port stays bound until all are chosen, so the kernel cannot hand one out
/// twice (as [`free_port`] called repeatedly may).
pub fn free_port_pairs(n: usize) -> std::io::Result<Vec<(u16, u16)>> {
    let held = (0..2 * n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let ports = held
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect::<std::io::Result<Vec<u16>>>()?;
    Ok(ports.chunks(2).map(|p| (p[0], p[1])).collect())
}

/// Directory for the children's logs of this run.
pub fn log_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gorge-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// One running child service.
pub struct Service {
    pub name: String,
    pub child: Child,
    pub pid: u32,
    /// The HTTP port that answers /healthz and /readyz.
    pub probe_addr: SocketAddr,
}

impl Service {
    /// Starts `binary` with `env`, logging to `<log_dir>/<name>.log`.
    pub fn start(
        name: &str,
        binary: &Path,
        env: &[(String, String)],
        probe_addr: SocketAddr,
    ) -> Result<Service, String> {
        let log_path = log_dir().join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let log_err = log.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new(binary);
        command
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .kill_on_drop(true);
        let child = command
            .spawn()
            .map_err(|e| format!("start {}: {e}", binary.display()))?;
        let pid = child.id().ok_or("child exited at once")?;
        Ok(Service {
            name: name.to_string(),
            child,
            pid,
            probe_addr,
        })
    }

    /// Waits until `path` on the probe port answers 200, the child exits, or `limit` passes.
    pub async fn wait_ready(&mut self, path: &str, limit: Duration) -> Result<(), String> {
        let until = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("{} exited during startup: {status}", self.name));
            }
            if let Ok(r) = http1::get_once(self.probe_addr, path, Duration::from_millis(500)).await
            {
                if r.status == 200 {
                    return Ok(());
                }
            }
            if Instant::now() >= until {
                return Err(format!(
                    "{} not ready on {}{path} in time",
                    self.name, self.probe_addr
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL and reap.
    pub async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        if self.alive() {
            let _ = sys::send_signal(self.pid, sys::Signal::TERM);
            if tokio::time::timeout(grace, self.child.wait())
                .await
                .is_err()
            {
                self.kill9().await;
            }
        }
    }
}

/// Environment of one gorge-notification process on loopback.
pub fn notification_env(client_port: u16, admin_port: u16, peers: &[u16]) -> Vec<(String, String)> {
    let peers: Vec<String> = peers
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    vec![
        ("GORGE_NOTIFICATION_LISTEN_ADDR".into(), "127.0.0.1".into()),
        (
            "GORGE_NOTIFICATION_CLIENT_PORT".into(),
            client_port.to_string(),
        ),
        (
            "GORGE_NOTIFICATION_ADMIN_PORT".into(),
            admin_port.to_string(),
        ),
        ("GORGE_NOTIFICATION_PEERS".into(), peers.join(",")),
        ("GORGE_LOG_LEVEL".into(), "warn".into()),
    ]
}

/// A started gorge-notification process and its two ports.
pub struct NotificationServer {
    pub service: Service,
    pub client_port: u16,
    pub admin_port: u16,
}

impl NotificationServer {
    pub async fn start(
        name: &str,
        binary: &Path,
        client_port: u16,
        admin_port: u16,
        peers: &[u16],
    ) -> Result<NotificationServer, String> {
        let env = notification_env(client_port, admin_port, peers);
        let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
        let mut service = Service::start(name, binary, &env, admin)?;
        service
            .wait_ready("/readyz", Duration::from_secs(15))
            .await?;
        Ok(NotificationServer {
            service,
            client_port,
            admin_port,
        })
    }

    pub fn client_url(&self) -> String {
        format!("ws://127.0.0.1:{}/", self.client_port)
    }

    pub fn client_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    pub fn admin_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.admin_port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_pairs_are_distinct() {
        let pairs = free_port_pairs(3).unwrap();
        let mut ports: Vec<u16> = pairs.iter().flat_map(|&(c, a)| [c, a]).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 6);
    }
}
