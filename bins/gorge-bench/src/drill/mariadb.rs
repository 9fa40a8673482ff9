//! Stopping and starting the local MariaDB for the restart drill, and making sure it runs
//! again afterwards whatever happened (other work on this machine shares the server).

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SERVER_BINARY: &str = "/usr/sbin/mariadbd";
/// How long a start may take before the drill gives up on it.
const START_LIMIT: Duration = Duration::from_secs(60);

fn address() -> SocketAddr {
    let (host, port) = crate::herald_db::mysql_host_port();
    format!("{host}:{port}")
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 3306)))
}

/// Whether the server accepts TCP connections.
pub fn accepting() -> bool {
    TcpStream::connect_timeout(&address(), Duration::from_millis(500)).is_ok()
}

/// `mariadb-admin shutdown` (it returns once the server has stopped).
pub fn shutdown() -> Result<(), String> {
    let addr = address();
    let status = Command::new("mariadb-admin")
        .args([
            "--protocol=tcp",
            &format!("--host={}", addr.ip()),
            &format!("--port={}", addr.port()),
            "--user=root",
            "shutdown",
        ])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("mariadb-admin: {e}"))?;
    if !status.success() {
        return Err(format!("mariadb-admin shutdown: {status}"));
    }
    Ok(())
}

/// Starts mariadbd in the background and waits until it accepts connections.
pub fn start() -> Result<(), String> {
    let status = Command::new("start-stop-daemon")
        .args([
            "--start",
            "--oknodo",
            "--background",
            "--exec",
            SERVER_BINARY,
        ])
        .status()
        .map_err(|e| format!("start-stop-daemon: {e}"))?;
    if !status.success() {
        return Err(format!("start-stop-daemon: {status}"));
    }
    let until = Instant::now() + START_LIMIT;
    while Instant::now() < until {
        if accepting() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err("MariaDB did not accept connections within 60 s".to_string())
}

/// Starts MariaDB if it is not accepting connections. Called after every drill run.
pub fn ensure_running() {
    if accepting() {
        return;
    }
    eprintln!("MariaDB is down after the drill; starting it again");
    if let Err(e) = start() {
        eprintln!("could not restart MariaDB: {e}");
    }
}
