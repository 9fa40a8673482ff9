//! The `healthcheck` subcommand: container images carry no curl, so the binary probes its own
//! `/healthz` over plain TCP (or TLS, when its health port serves TLS) and turns the answer
//! into an exit code, printing why on failure.

use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

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

/// Where the health port is, and whether it serves TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthTarget {
    /// The address to probe (or the listen address, see [`probe_target`]).
    pub addr: SocketAddr,
    /// The port serves TLS: probe over TLS.
    pub tls: bool,
}

impl HealthTarget {
    /// A plaintext health port at `addr`.
    pub fn plain(addr: SocketAddr) -> HealthTarget {
        HealthTarget { addr, tls: false }
    }
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

/// 0 when `GET /healthz` on the target answers 200 within two seconds; otherwise prints
/// `healthcheck: http(s)://<addr>/healthz: <why>` on stderr and returns [`EXIT_FAILED`].
pub fn healthcheck(target: HealthTarget) -> i32 {
    let result = if target.tls {
        probe_tls(target.addr)
    } else {
        probe(target.addr)
    };
    match result {
        Ok(()) => 0,
        Err(why) => {
            let scheme = if target.tls { "https" } else { "http" };
            eprintln!("{SUBCOMMAND}: {scheme}://{}/healthz: {why}", target.addr);
            EXIT_FAILED
        }
    }
}

/// `GET /healthz` on `addr`: `Ok` for a 200 answer.
pub fn probe(addr: SocketAddr) -> Result<(), ProbeFailure> {
    let stream = connect(addr)?;
    exchange(addr, stream)
}

/// [`probe`] over TLS. The certificate is not verified: this probes our own process on a
/// loopback (or its own) address, where the certificate's names (the public host name) do
/// not match and its CA may not be in the image's store; what is checked is that the process
/// completes a handshake and answers, not who it is.
pub fn probe_tls(addr: SocketAddr) -> Result<(), ProbeFailure> {
    let tcp = connect(addr)?;
    let name = ServerName::IpAddress(addr.ip().into());
    let conn = rustls::ClientConnection::new(own_process_tls(), name)
        .map_err(|e| ProbeFailure::Io(std::io::Error::other(e)))?;
    exchange(addr, rustls::StreamOwned::new(conn, tcp))
}

/// A TLS client configuration for checks of our own process that does not verify the
/// certificate (see [`probe_tls`] for why that is enough there).
pub fn own_process_tls() -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports the default versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(OwnProcess(provider)))
            .with_no_client_auth(),
    )
}

fn connect(addr: SocketAddr) -> Result<TcpStream, ProbeFailure> {
    let stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(ProbeFailure::Connect)?;
    let io = ProbeFailure::Io;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    Ok(stream)
}

/// Accepts the certificate of our own process (see [`probe_tls`]); the handshake's
/// signatures are still checked.
#[derive(Debug)]
struct OwnProcess(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for OwnProcess {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Sends `GET /healthz` on `stream` and reads the status line.
fn exchange(addr: SocketAddr, mut stream: impl Read + Write) -> Result<(), ProbeFailure> {
    let io = ProbeFailure::Io;
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
