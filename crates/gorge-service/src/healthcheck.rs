//! The `healthcheck` subcommand: container images carry no curl, so the binary probes its own
//! `/healthz` over plain TCP and turns the answer into an exit code, printing why on failure.

use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

/// The subcommand's name on the command line, and the first word of each of its messages.
pub const SUBCOMMAND: &str = "healthcheck";

/// The exit code for anything but healthy (an invalid configuration or argument included):
/// never 2, which Docker reserves for a HEALTHCHECK command.
pub const EXIT_FAILED: i32 = 1;

/// Prints `healthcheck: <why>` on stderr and exits [`EXIT_FAILED`]: the one shape of every
/// failure of the subcommand.
pub fn exit_failed(why: impl fmt::Display) -> ! {
    eprintln!("{SUBCOMMAND}: {why}");
    std::process::exit(EXIT_FAILED)
}

/// Longest status line read back; anything longer is cut (it only goes into the message).
const STATUS_LINE_LIMIT: usize = 256;

/// Where to probe a service that listens on `listen`: a wildcard address (`0.0.0.0`, `[::]`)
/// is reached through the loopback address of the same family.
pub fn probe_target(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// Why a probe failed, as one line.
#[derive(Debug)]
pub enum ProbeFailure {
    /// The TCP connection could not be made (nothing listening, refused, unreachable).
    Connect(std::io::Error),
    /// The connection was made but writing the request or reading the answer failed or timed
    /// out.
    Io(std::io::Error),
    /// The connection closed before a status line arrived.
    NoAnswer,
    /// Anything but 200; the status line as received.
    Status(String),
}

impl fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeFailure::Connect(err) => write!(f, "cannot connect: {err}"),
            ProbeFailure::Io(err) if is_timeout(err) => {
                write!(f, "no answer within {} s", TIMEOUT.as_secs())
            }
            ProbeFailure::Io(err) => write!(f, "{err}"),
            ProbeFailure::NoAnswer => f.write_str("connection closed without an HTTP answer"),
            ProbeFailure::Status(line) => write!(f, "GET /healthz answered {line:?}"),
        }
    }
}

fn is_timeout(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// 0 when `GET /healthz` on `addr` answers 200 within two seconds; otherwise prints
/// `healthcheck: http://<addr>/healthz: <why>` on stderr and returns [`EXIT_FAILED`].
pub fn healthcheck(addr: SocketAddr) -> i32 {
    match probe(addr) {
        Ok(()) => 0,
        Err(why) => {
            eprintln!("{SUBCOMMAND}: http://{addr}/healthz: {why}");
            EXIT_FAILED
        }
    }
}

/// `GET /healthz` on `addr`: `Ok` for a 200 answer.
pub fn probe(addr: SocketAddr) -> Result<(), ProbeFailure> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(ProbeFailure::Connect)?;
    let io = ProbeFailure::Io;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    // One write: a server that answers after the first segment must not see a reset.
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut head = Vec::with_capacity(64);
    let mut chunk = [0u8; 64];
    while head.len() < STATUS_LINE_LIMIT && !head.contains(&b'\n') {
        match stream.read(&mut chunk).map_err(io)? {
            0 => break,
            n => head.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or("").trim_end();
    if line.is_empty() {
        return Err(ProbeFailure::NoAnswer);
    }
    let mut parts = line.split_ascii_whitespace();
    let version = parts.next().unwrap_or("");
    let code = parts.next().unwrap_or("");
    if version.starts_with("HTTP/1.") && code == "200" {
        Ok(())
    } else {
        Err(ProbeFailure::Status(line.chars().take(120).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_addresses_are_probed_on_loopback() {
        let target = |s: &str| probe_target(s.parse().unwrap()).to_string();
        assert_eq!(target("0.0.0.0:8160"), "127.0.0.1:8160");
        assert_eq!(target("[::]:22281"), "[::1]:22281");
        assert_eq!(target("10.1.2.3:22281"), "10.1.2.3:22281");
    }
}
