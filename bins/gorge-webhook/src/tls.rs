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
            // rustls checks the name last, so the chain and the dates passed.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if common_name_is(end_entity, server_name) => {
                return Ok(ServerCertVerified::assertion())
            }
            verified => return verified,
        }
        if !self.ca_file.iter().any(|cert| cert == end_entity) {
            // A CA's certificate presented as the receiver's own, not in the CA file: not
            // trusted (cURL: "self-signed certificate").
            return Err(CertificateError::UnknownIssuer.into());
        }
        let by_alt_name = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| CertificateError::BadEncoding)?
            .verify_is_valid_for_subject_name(server_name)
            .is_ok();
        if !by_alt_name && !common_name_is(end_entity, server_name) {
            return Err(CertificateError::NotValidForName.into());
        }
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

/// cURL's (OpenSSL backend) fallback for a certificate that names no host in
/// `subjectAltName`: the subject's last common name must be the host (`openssl req -x509
/// -subj /CN=hooks.example.com` makes such a certificate). Never when the certificate has a
/// DNS or IP `subjectAltName` (cURL: "subjectAltName does not match"). Compared exactly,
/// ignoring ASCII case; a wildcard common name is not matched, and a certificate this cannot
/// read matches nothing.
fn common_name_is(cert: &CertificateDer<'_>, server_name: &ServerName<'_>) -> bool {
    let host = match server_name {
        ServerName::DnsName(name) => name.as_ref().trim_end_matches('.').to_string(),
        ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        _ => return false,
    };
    match host_names(cert) {
        Some(HostNames {
            alt_names: false,
            common_name: Some(name),
        }) => name.eq_ignore_ascii_case(&host),
        _ => false,
    }
}

/// What cURL's host-name check reads from a certificate.
#[derive(Debug, PartialEq)]
struct HostNames {
    /// Whether `subjectAltName` holds a DNS name or an IP address.
    alt_names: bool,
    /// The subject's last common name, if it is text.
    common_name: Option<String>,
}

/// Reads [`HostNames`] from a DER certificate (RFC 5280 §4.1), `None` if it does not parse.
fn host_names(cert: &[u8]) -> Option<HostNames> {
    use yasna::models::ObjectIdentifier;
    use yasna::Tag;
    let common_name_oid = ObjectIdentifier::from_slice(&[2, 5, 4, 3]);
    let alt_name_oid = ObjectIdentifier::from_slice(&[2, 5, 29, 17]);
    let parsed = yasna::parse_der(cert, |r| {
        r.read_sequence(|r| {
            let names = r.next().read_sequence(|r| {
                let _version =
                    r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_der()))?;
                for _serial_signature_issuer_validity in 0..4 {
                    r.next().read_der()?;
                }
                let mut common_name = None;
                r.next().read_sequence_of(|r| {
                    r.read_set_of(|r| {
                        r.read_sequence(|r| {
                            let kind = r.next().read_oid()?;
                            let value = r.next().read_tagged_der()?;
                            if kind == common_name_oid {
                                common_name = String::from_utf8(value.value().to_vec()).ok();
                            }
                            Ok(())
                        })
                    })
                })?;
                let _public_key = r.next().read_der()?;
                // Then the optional unique identifiers [1], [2] and extensions [3].
                let mut extensions = None;
                while let Some(field) = r.read_optional(|r| r.read_tagged_der())? {
                    if field.tag() == Tag::context(3) {
                        extensions = Some(field.value().to_vec());
                    }
                }
                Ok((common_name, extensions))
            })?;
            let _signature_algorithm = r.next().read_der()?;
            let _signature = r.next().read_der()?;
            Ok(names)
        })
    })
    .ok()?;
    let (common_name, extensions) = parsed;
    let mut alt_names = false;
    if let Some(extensions) = extensions {
        let extensions = yasna::parse_der(&extensions, |r| {
            r.collect_sequence_of(|r| {
                r.read_sequence(|r| {
                    let id = r.next().read_oid()?;
                    let _critical = r.read_optional(|r| r.read_bool())?;
                    Ok((id, r.next().read_bytes()?))
                })
            })
        })
        .ok()?;
        for (id, value) in extensions {
            if id == alt_name_oid {
                // GeneralName: dNSName [2], iPAddress [7].
                let kinds = yasna::parse_der(&value, |r| {
                    r.collect_sequence_of(|r| Ok(r.read_tagged_der()?.tag()))
                })
                .ok()?;
                alt_names |= kinds
                    .iter()
                    .any(|tag| *tag == Tag::context(2) || *tag == Tag::context(7));
            }
        }
    }
    Some(HostNames {
        alt_names,
        common_name,
    })
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

    /// Made by `openssl req -x509 -newkey ec … -subj "/O=gorge test/CN=hooks.example.com"`
    /// (OpenSSL 3.0.19): no subjectAltName, as `openssl req -x509` makes by default.
    const OPENSSL_CN_ONLY: &str = "-----BEGIN CERTIFICATE-----
MIIBtjCCAV2gAwIBAgIUKCtA2IocyDyzDtO9sfcUFaIELWMwCgYIKoZIzj0EAwIw
MTETMBEGA1UECgwKZ29yZ2UgdGVzdDEaMBgGA1UEAwwRaG9va3MuZXhhbXBsZS5j
b20wHhcNMjYxMjAxMjMyNDUzWhcNMzYxMTI4MjMyNDUzWjAxMRMwEQYDVQQKDApn
b3JnZSB0ZXN0MRowGAYDVQQDDBFob29rcy5leGFtcGxlLmNvbTBZMBMGByqGSM49
AgEGCCqGSM49AwEHA0IABEQ0kL++1LUC+Zn+OGzYf4kvTiBvpwt5XgExryQXLKXe
swlOf46w6OvflY/jkIxXG5xmrgS844c1U2UuU8b8ByijUzBRMB0GA1UdDgQWBBQa
4If1mGXcNKx5yd39tq/v02xliDAfBgNVHSMEGDAWgBQa4If1mGXcNKx5yd39tq/v
02xliDAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0cAMEQCIFco/jpJdJON
hhzYhDWjAt/n/4ib9nlmcScDyVikdbk+AiARc5Ns+5Q7LQ9tV0AOoQdpIENZOl9h
yEo7NOFGgwIT5w==
-----END CERTIFICATE-----
";

    /// The same with `-subj /CN=hooks.example.com -addext subjectAltName=IP:192.0.2.7`.
    const OPENSSL_IP_ALT_NAME: &str = "-----BEGIN CERTIFICATE-----
MIIBnjCCAUSgAwIBAgIUT1TP2l4D9FYUvny3BwBRbJYmyMEwCgYIKoZIzj0EAwIw
HDEaMBgGA1UEAwwRaG9va3MuZXhhbXBsZS5jb20wHhcNMjYxMjAxMjMyNDUzWhcN
MzYxMTI4MjMyNDUzWjAcMRowGAYDVQQDDBFob29rcy5leGFtcGxlLmNvbTBZMBMG
ByqGSM49AgEGCCqGSM49AwEHA0IABEUKUslkABFhVXgyNqMXGk30Nd42vx0rQFu5
rZiYHy7wwUlzv2e/R2yl4S17A5F+ayfNKMC5upv9xGmsh+E2gpujZDBiMB0GA1Ud
DgQWBBSjBNbRjS5mEMJs2UwH+UNtIqRcgzAfBgNVHSMEGDAWgBSjBNbRjS5mEMJs
2UwH+UNtIqRcgzAPBgNVHRMBAf8EBTADAQH/MA8GA1UdEQQIMAaHBMAAAgcwCgYI
KoZIzj0EAwIDSAAwRQIgBLeH3jFiUa6sB3K4AX0FHvKMmLkt6APbc/sgMtqMIGoC
IQCjgysbZhbCc5rMpiLP2kKNBRqGop+YcEHNPwlfwhH0/Q==
-----END CERTIFICATE-----
";

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn host_names_are_read_as_curl_reads_them() {
        assert_eq!(
            host_names(&der(OPENSSL_CN_ONLY)),
            Some(HostNames {
                alt_names: false,
                common_name: Some("hooks.example.com".into())
            })
        );
        assert_eq!(
            host_names(&der(OPENSSL_IP_ALT_NAME)),
            Some(HostNames {
                alt_names: true,
                common_name: Some("hooks.example.com".into())
            })
        );
        let with_dns = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        assert!(host_names(with_dns.cert.der()).unwrap().alt_names);
        assert_eq!(host_names(b"\x30\x00"), None);

        let name = |s: &str| ServerName::try_from(s.to_string()).unwrap();
        assert!(common_name_is(
            &der(OPENSSL_CN_ONLY),
            &name("hooks.example.com")
        ));
        assert!(common_name_is(
            &der(OPENSSL_CN_ONLY),
            &name("HOOKS.example.com.")
        ));
        assert!(!common_name_is(
            &der(OPENSSL_CN_ONLY),
            &name("other.example.com")
        ));
        assert!(!common_name_is(&der(OPENSSL_CN_ONLY), &name("192.0.2.7")));
        // A subjectAltName of any kind it checks turns the common name off.
        assert!(!common_name_is(
            &der(OPENSSL_IP_ALT_NAME),
            &name("hooks.example.com")
        ));
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
