//! Which certificate authorities webhook receivers are checked against: the bundled Mozilla
//! roots, the system store and the operator's `GORGE_WEBHOOK_CA_FILE` (docs/webhook.md, "TLS
//! and connections"); a receiver whose own self-signed certificate is in that file, trusted
//! as cURL trusts it; and how a TLS failure is reduced to cURL's numbers (35 handshake, 60
//! peer certificate).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// The certificates of a CA file, read and checked at startup.
#[derive(Debug, Clone, Default)]
pub struct ExtraRoots(Vec<CertificateDer<'static>>);

impl ExtraRoots {
    /// Reads a PEM bundle. Every certificate must be usable as a trust anchor, and there
    /// must be at least one: a file that trusts nothing is a mistake worth stopping for.
    pub fn load(path: &Path) -> Result<ExtraRoots, String> {
        let data = std::fs::read(path).map_err(|err| format!("cannot be read: {err}"))?;
        let certs = CertificateDer::pem_slice_iter(&data)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| format!("is not a PEM certificate bundle: {err}"))?;
        if certs.is_empty() {
            return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
        }
        let mut store = RootCertStore::empty();
        for (n, cert) in certs.iter().enumerate() {
            store
                .add(cert.clone())
                .map_err(|err| format!("certificate {} is not a usable CA: {err}", n + 1))?;
        }
        Ok(ExtraRoots(certs))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The bundled Mozilla roots plus whatever the system store holds, loaded once per process
/// (reading the system store costs a few milliseconds).
fn base_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        // A missing or partly unreadable system store is not fatal: the bundled roots and
        // the CA file still apply.
        let system = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(system.certs);
        roots
    })
}

/// The client configuration for receivers: ring provider, TLS 1.2/1.3, HTTP/1.1 only,
/// certificates checked by [`ReceiverVerifier`].
pub fn client_config(extra: &ExtraRoots) -> Arc<ClientConfig> {
    let mut roots = base_roots().clone();
    for cert in &extra.0 {
        // Checked in `ExtraRoots::load`.
        let _ = roots.add(cert.clone());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .expect("the bundled roots are not empty");
    let verifier = ReceiverVerifier {
        webpki,
        ca_file: extra.0.clone(),
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// webpki's verification (chain to a trusted root, dates, host name), plus what cURL's
/// OpenSSL does with a certificate found in its CA file: trust it as it is. webpki refuses a
/// `CA:TRUE` certificate as a server's own (`openssl req -x509` makes exactly that); when the
/// receiver's certificate is, byte for byte, one of the CA file's, it is accepted once its
/// host name matches. Its dates were checked already: webpki checks them before it looks
/// at `CA:TRUE` (`a_self_signed_receiver_in_the_ca_file_is_trusted_as_curl_trusts_it`
/// holds that order). The handshake signature is still checked against its key.
#[derive(Debug)]
struct ReceiverVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    /// `GORGE_WEBHOOK_CA_FILE`'s certificates.
    ca_file: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for ReceiverVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(err) if is_ca_used_as_end_entity(&err) => {}
            verified => return verified,
        }
        if !self.ca_file.iter().any(|cert| cert == end_entity) {
            // A CA's certificate presented as the receiver's own, not in the CA file: not
            // trusted (cURL: "self-signed certificate").
            return Err(CertificateError::UnknownIssuer.into());
        }
        webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| CertificateError::BadEncoding)?
            .verify_is_valid_for_subject_name(server_name)
            .map_err(|_| CertificateError::NotValidForName)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Whether webpki refused the server's certificate for being a CA's.
fn is_ca_used_as_end_entity(err: &rustls::Error) -> bool {
    match err {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => matches!(
            other.0.downcast_ref::<webpki::Error>(),
            Some(webpki::Error::CaUsedAsEndEntity)
        ),
        _ => false,
    }
}

/// A TLS failure, in cURL's two numbers, with the readable reason for logs and labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// The peer's certificate chain does not end at a trusted CA (cURL 60).
    UntrustedCertificate,
    /// The certificate is not valid for the host name (cURL 60).
    WrongHost,
    /// Expired or not yet valid (cURL 60).
    CertificateDates,
    /// Any other certificate problem (cURL 60).
    BadCertificate,
    /// The handshake itself failed: alert, no shared version or cipher, garbage (cURL 35).
    Handshake,
}

impl TlsFailure {
    pub fn from_rustls(err: &rustls::Error) -> TlsFailure {
        match err {
            rustls::Error::InvalidCertificate(cert) => match cert {
                CertificateError::UnknownIssuer => TlsFailure::UntrustedCertificate,
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => TlsFailure::WrongHost,
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => TlsFailure::CertificateDates,
                _ => TlsFailure::BadCertificate,
            },
            _ => TlsFailure::Handshake,
        }
    }

    /// The rustls error inside an I/O error from `tokio-rustls`, if any.
    pub fn from_io(err: &std::io::Error) -> Option<TlsFailure> {
        let inner = err.get_ref()?;
        inner
            .downcast_ref::<rustls::Error>()
            .map(TlsFailure::from_rustls)
    }

    pub fn curl_code(self) -> u16 {
        match self {
            TlsFailure::Handshake => 35,
            _ => 60,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            TlsFailure::UntrustedCertificate => "certificate not trusted",
            TlsFailure::WrongHost => "certificate not valid for host",
            TlsFailure::CertificateDates => "certificate expired or not yet valid",
            TlsFailure::BadCertificate => "certificate invalid",
            TlsFailure::Handshake => "tls handshake failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_files_must_hold_usable_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        assert!(ExtraRoots::load(&missing)
            .unwrap_err()
            .starts_with("cannot be read"));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificates here\n").unwrap();
        assert!(ExtraRoots::load(&empty)
            .unwrap_err()
            .starts_with("holds no PEM certificate"));
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(ExtraRoots::load(&garbage).is_err());
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, ca.cert.pem()).unwrap();
        assert_eq!(ExtraRoots::load(&good).unwrap().len(), 1);
    }

    #[test]
    fn certificate_failures_are_60_and_handshake_failures_35() {
        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert_eq!(TlsFailure::from_rustls(&unknown).curl_code(), 60);
        assert_eq!(
            TlsFailure::from_rustls(&unknown).reason(),
            "certificate not trusted"
        );
        let name = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        assert_eq!(TlsFailure::from_rustls(&name), TlsFailure::WrongHost);
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure);
        assert_eq!(TlsFailure::from_rustls(&alert).curl_code(), 35);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, unknown);
        assert_eq!(
            TlsFailure::from_io(&io),
            Some(TlsFailure::UntrustedCertificate)
        );
    }
}
