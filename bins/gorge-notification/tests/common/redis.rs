//! A `redis-server` of one test only (broker mode), on a free loopback port with persistence
//! off, so the test can pause (`SIGSTOP`), kill and restart it; or one that speaks only TLS,
//! with a certificate from a CA made for the test ([`Redis::start_tls`]).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gorge_testkit::{free_port, within_blocking, Process, PATIENCE};

/// A `redis-server` of this test only: loopback, no persistence. Killed on drop.
pub struct Redis {
    pub process: Process,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Redis {
        (0..5)
            .find_map(|_| Redis::start_on(free_port()))
            .expect("redis-server started")
    }

    /// Starts on `port` (once); `None` if it did not answer `PING` in time.
    pub fn start_on(port: u16) -> Option<Redis> {
        gorge_testkit::prerequisites::require("redis-server");
        let mut command = Command::new("redis-server");
        command.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        let process = Process::spawn(command);
        within_blocking(PATIENCE, || ping(port)).then_some(Redis { process, port })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A plain connection of the test's own, to write or inspect the stream directly.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|client| client.get_connection())
            .expect("a connection to the test's redis-server")
    }

    /// A Redis that accepts only TLS on its port, with a certificate for 127.0.0.1 signed by
    /// a CA made now; its files go in `dir`. Returns it and the CA's PEM (what
    /// `BROKER_CA_FILE` holds). Clients need no certificate of their own.
    pub fn start_tls(dir: &Path) -> (Redis, String) {
        gorge_testkit::prerequisites::require("redis-server");
        let ca = throwaway_ca("gorge test broker CA");
        let leaf_key = rcgen::KeyPair::generate().expect("a key");
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
            .expect("leaf parameters")
            .signed_by(&leaf_key, &ca.certificate, &ca.key)
            .expect("a leaf certificate");
        let file = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("a certificate file");
            path.to_str().expect("a UTF-8 path").to_string()
        };
        let cert = file("redis.crt", leaf.pem());
        let key = file("redis.key", leaf_key.serialize_pem());
        let ca_file = file("ca.crt", ca.certificate.pem());
        for _ in 0..5 {
            let port = free_port();
            let mut command = Command::new("redis-server");
            command.args(["--port", "0", "--tls-port", &port.to_string()]);
            command.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
            command.args(["--tls-cert-file", &cert, "--tls-key-file", &key]);
            command.args(["--tls-ca-cert-file", &ca_file, "--tls-auth-clients", "no"]);
            let process = Process::spawn(command);
            // Redis listens once it is ready to serve; a plain PING cannot pass TLS.
            if within_blocking(PATIENCE, || TcpStream::connect(("127.0.0.1", port)).is_ok()) {
                return (Redis { process, port }, ca.certificate.pem());
            }
        }
        panic!("redis-server with TLS did not listen");
    }

    /// The `rediss://` URL of a [`Redis::start_tls`] server.
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }

    /// Kills it and starts an empty one on the same port.
    pub fn restart_empty(&mut self) {
        self.process.kill();
        let port = self.port;
        *self = Redis::start_on(port).expect("redis-server restarted on its port");
    }
}

/// Whether a Redis on `port` answers `PING` within a second.
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut answer = [0u8; 7];
    stream.read_exact(&mut answer).is_ok() && &answer == b"+PONG\r\n"
}

/// A self-signed CA certificate and its key.
pub struct Ca {
    pub certificate: rcgen::Certificate,
    pub key: rcgen::KeyPair,
}

/// A CA made for one test, trusted by nothing else.
pub fn throwaway_ca(name: &str) -> Ca {
    let mut params = rcgen::CertificateParams::new(Vec::new()).expect("CA parameters");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().expect("a CA key");
    let certificate = params.self_signed(&key).expect("a CA certificate");
    Ca { certificate, key }
}
