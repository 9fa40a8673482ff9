//! Certificates made per test (root → intermediate → leaf for localhost/127.0.0.1, with rcgen;
//! keys in the formats openssl writes, with the `openssl` command), and clients that verify
//! the server against a given root only: `wss://` and `https://` over rustls.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::PATIENCE;

/// A CA: its certificate and key.
pub struct Ca {
    pub cert: rcgen::Certificate,
    pub key: rcgen::KeyPair,
}

impl Ca {
    /// A self-signed root.
    pub fn root(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = ca_params(name).self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// An intermediate CA signed by this one.
    pub fn intermediate(&self, name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = ca_params(name)
            .signed_by(&key, &self.cert, &self.key)
            .unwrap();
        Ca { cert, key }
    }

    /// A leaf for localhost and 127.0.0.1 signed by this CA: (certificate PEM, PKCS#8 key PEM).
    pub fn leaf(&self) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .unwrap()
            .signed_by(&key, &self.cert, &self.key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }
}

fn ca_params(name: &str) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params
}

/// A chain for the tests: root → intermediate → leaf, written to `dir` as `leaf.pem`,
/// `key.pem`, `chain.pem` (the intermediate) and `root.pem`.
pub struct Chain {
    pub root: Ca,
    pub intermediate: Ca,
    pub dir: PathBuf,
}

impl Chain {
    pub fn new(dir: &Path) -> Chain {
        let root = Ca::root("gorge test root");
        let intermediate = root.intermediate("gorge test intermediate");
        let (leaf, key) = intermediate.leaf();
        std::fs::write(dir.join("leaf.pem"), leaf).unwrap();
        std::fs::write(dir.join("key.pem"), key).unwrap();
        std::fs::write(dir.join("chain.pem"), intermediate.pem()).unwrap();
        std::fs::write(dir.join("root.pem"), root.pem()).unwrap();
        Chain {
            root,
            intermediate,
            dir: dir.to_path_buf(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn root_pem(&self) -> String {
        self.root.pem()
    }
}

/// A key and a self-signed certificate as `openssl req -x509` writes them, with the key in
/// `format` (`pkcs1` RSA, `sec1` EC or `pkcs8`): (certificate path, key path).
pub fn openssl_self_signed(dir: &Path, format: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(format!("{format}.key"));
    let cert = dir.join(format!("{format}.crt"));
    let keygen: Vec<&str> = match format {
        "pkcs1" => vec!["genrsa", "-traditional", "-out"],
        "sec1" => vec![
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
        ],
        "pkcs8" => vec!["genpkey", "-algorithm", "RSA", "-out"],
        other => panic!("no key format {other}"),
    };
    run(
        "openssl",
        keygen.iter().copied().chain([key.to_str().unwrap()]),
    );
    run(
        "openssl",
        [
            "req",
            "-x509",
            "-key",
            key.to_str().unwrap(),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-days",
            "30",
            "-out",
            cert.to_str().unwrap(),
        ],
    );
    (cert, key)
}

fn run<'a>(program: &str, args: impl IntoIterator<Item = &'a str>) {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{program}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A client configuration that trusts `root_pem` alone.
pub fn client_config(root_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A TLS connection to 127.0.0.1:`port` verified against `root_pem` for `localhost`; the
/// handshake's error if it fails.
pub async fn connect(port: u16, root_pem: &str) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let connector = tokio_rustls::TlsConnector::from(client_config(root_pem));
    let name = ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(PATIENCE, connector.connect(name, tcp))
        .await
        .expect("TLS handshake in time")
}

/// A TLS connection that accepts any certificate (the client configuration of the service's
/// own checks, `gorge_service::healthcheck::own_process_tls`); the caller compares what was
/// served ([`served_leaf`]) with what it expects.
pub async fn connect_unverified(port: u16) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let connector = tokio_rustls::TlsConnector::from(gorge_service::healthcheck::own_process_tls());
    let name = ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(PATIENCE, connector.connect(name, tcp))
        .await
        .expect("TLS handshake in time")
}

/// The leaf certificate (DER) the server presented on a connection.
pub fn served_leaf(stream: &TlsStream<TcpStream>) -> Vec<u8> {
    let (_, conn) = stream.get_ref();
    conn.peer_certificates().unwrap()[0].as_ref().to_vec()
}

/// The DER of the first certificate of a PEM text.
pub fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .as_ref()
        .to_vec()
}

/// A `wss://` socket verified against `root_pem`: the test client of `common`, over TLS.
pub type Wss = super::Ws<TlsStream<TcpStream>>;

impl Wss {
    pub async fn connect_tls(port: u16, path: &str, root_pem: &str) -> Wss {
        let stream = connect(port, root_pem).await.expect("TLS handshake");
        let url = format!("wss://localhost:{port}{path}");
        let (ws, response) =
            tokio::time::timeout(PATIENCE, tokio_tungstenite::client_async(url, stream))
                .await
                .expect("upgrade in time")
                .expect("upgrade");
        assert_eq!(response.status(), 101);
        Wss { ws }
    }
}

/// One HTTP/1.1 request over TLS (verified against `root_pem`), `Connection: close`;
/// returns the status and the body.
pub async fn https(
    port: u16,
    root_pem: &str,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let stream = connect(port, root_pem).await.expect("TLS handshake");
    request_on(stream, method, path, body).await
}

/// One HTTP/1.1 request on an open TLS connection, `Connection: close`.
pub async fn request_on(
    mut stream: TlsStream<TcpStream>,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let port = stream.get_ref().0.peer_addr().unwrap().port();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: \
         application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    // A server that closes without close_notify still gave its whole answer here.
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response))
        .await
        .expect("answer in time");
    let text = String::from_utf8_lossy(&response).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}
