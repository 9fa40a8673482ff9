//! The bench's browsers over `wss://`: a rustls client (ring provider) that trusts one CA
//! file given on the command line, and the stream type a browser socket reads and writes,
//! plain TCP or TLS over it.
//!
//! Every connection makes a full handshake (no session resumption): each bench socket
//! stands for a different browser, and the handshake-rate figure must count full
//! handshakes, the cost a reconnect storm puts on a server.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// How to open TLS to one server: the client configuration and the name its certificate
/// must carry (the host of the `wss://` URL, a DNS name or an IP address).
#[derive(Clone)]
pub struct ClientTls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl ClientTls {
    /// A client for `host` that trusts the certificates in the PEM file `ca_file` only.
    pub fn new(ca_file: &Path, host: &str) -> Result<ClientTls, String> {
        let pem = std::fs::read(ca_file).map_err(|e| format!("{}: {e}", ca_file.display()))?;
        let mut roots = rustls::RootCertStore::empty();
        let mut found = 0;
        for cert in rustls_pemfile_certs(&pem) {
            roots
                .add(cert)
                .map_err(|e| format!("{}: {e}", ca_file.display()))?;
            found += 1;
        }
        if found == 0 {
            return Err(format!("{}: no CERTIFICATE PEM block", ca_file.display()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.resumption = rustls::client::Resumption::disabled();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host}: not a server name: {e}"))?;
        Ok(ClientTls {
            connector: TlsConnector::from(Arc::new(config)),
            name,
        })
    }

    /// Runs the TLS handshake on `tcp`.
    pub async fn connect(&self, tcp: TcpStream) -> Result<BrowserStream, String> {
        let tls = self
            .connector
            .connect(self.name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        Ok(BrowserStream::Tls(Box::new(tls)))
    }
}

/// Every `CERTIFICATE` block of a PEM file, as DER.
fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}

/// The byte stream under a browser's WebSocket.
pub enum BrowserStream {
    Plain(TcpStream),
    /// Boxed: a TLS connection is some hundreds of bytes, a plain socket a few.
    Tls(Box<TlsStream<TcpStream>>),
}

impl BrowserStream {
    /// The negotiated protocol version and cipher suite, for the summary (`None` on plain
    /// TCP).
    pub fn tls_parameters(&self) -> Option<(String, String)> {
        let BrowserStream::Tls(tls) = self else {
            return None;
        };
        let (_, conn) = tls.get_ref();
        Some((
            format!("{:?}", conn.protocol_version()?),
            format!("{:?}", conn.negotiated_cipher_suite()?.suite()),
        ))
    }
}

impl AsyncRead for BrowserStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BrowserStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            BrowserStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BrowserStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BrowserStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            BrowserStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BrowserStream::Plain(s) => Pin::new(s).poll_flush(cx),
            BrowserStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BrowserStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            BrowserStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("gorge-bench-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = ClientTls::new(&empty, "127.0.0.1").err().unwrap();
        assert!(err.contains("no CERTIFICATE PEM block"), "{err}");
        assert!(ClientTls::new(&dir.join("missing.pem"), "127.0.0.1").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A `wss://` browser against an in-process TLS WebSocket server signed by a private CA:
    /// the handshake verifies against the CA file alone and frames flow both ways.
    #[tokio::test]
    async fn opens_a_websocket_over_tls_trusting_the_ca_file() {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let (ca_pem, server_config) = crate::receiver::private_ca().unwrap();
        let dir = std::env::temp_dir().join(format!("gorge-bench-tls-ok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config);
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let tls = acceptor.accept(tcp).await.unwrap();
            let mut ws = tokio_tungstenite::accept_async(tls).await.unwrap();
            let got = ws.next().await.unwrap().unwrap();
            ws.send(got).await.unwrap();
        });

        let tls = ClientTls::new(&ca_file, "127.0.0.1").unwrap();
        let url = format!("wss://{addr}/");
        let mut ws = crate::browser::open(&url, addr, None, None, Some(&tls))
            .await
            .unwrap();
        let (version, suite) = ws.get_ref().tls_parameters().unwrap();
        assert!(version.starts_with("TLSv1_"), "{version}");
        assert!(!suite.is_empty());
        ws.send(Message::text("echo")).await.unwrap();
        let back = tokio::time::timeout(std::time::Duration::from_secs(10), ws.next())
            .await
            .unwrap();
        assert_eq!(back.unwrap().unwrap(), Message::text("echo"));
        server.await.unwrap();

        // A CA that did not sign the server's certificate: the handshake fails.
        let (other_ca, _) = crate::receiver::private_ca().unwrap();
        std::fs::write(&ca_file, other_ca).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_, config) = crate::receiver::private_ca().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let _ = acceptor.accept(tcp).await;
        });
        let untrusted = ClientTls::new(&ca_file, "127.0.0.1").unwrap();
        let err = crate::browser::open(
            &format!("wss://{addr}/"),
            addr,
            None,
            None,
            Some(&untrusted),
        )
        .await
        .err()
        .unwrap();
        assert!(err.contains("TLS"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
