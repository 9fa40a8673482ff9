//! The TLS files of a server entry (Aphlict's `ssl.key`, `ssl.cert`, `ssl.chain`, or the
//! `GORGE_NOTIFICATION_{CLIENT,ADMIN}_TLS_*_FILE` settings), read and checked: readable, PEM,
//! a key the ring provider loads (PKCS#8, PKCS#1 RSA, SEC1 EC) that matches the leaf. Used
//! at startup (a broken pair stops it, naming the setting) and by [`crate::tls`] for each
//! re-read.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// The files of one server entry and the names the operator gave them (a file key such as
/// `servers[0].ssl.key`, or a variable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub cert_setting: String,
    pub key: PathBuf,
    pub key_setting: String,
    /// Sent after the certificate file's certificates, as Aphlict appends it.
    pub chain: Option<PathBuf>,
    pub chain_setting: String,
}

/// Why a pair cannot be served: the setting and file at fault, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairError {
    pub setting: String,
    pub file: PathBuf,
    pub reason: String,
}

impl std::fmt::Display for PairError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={}: {}",
            self.setting,
            self.file.display(),
            self.reason
        )
    }
}

/// The bytes of the files as last read, to tell a change from none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    chain: Vec<u8>,
}

/// A checked pair, ready to serve.
#[derive(Debug, Clone)]
pub struct Pair {
    pub certified: Arc<CertifiedKey>,
    /// The leaf's notAfter, seconds since the epoch (`None` if it could not be read).
    pub not_after: Option<i64>,
    pub contents: Contents,
}

impl TlsFiles {
    /// Reads and checks the pair: every file readable, PEM certificates in the certificate
    /// (and chain) file, a PKCS#8, PKCS#1 or SEC1 key that the ring provider loads and that
    /// matches the leaf.
    pub fn load(&self) -> Result<Pair, PairError> {
        let contents = self.read()?;
        self.check(contents)
    }

    fn refuse(&self, which: Which, reason: impl Into<String>) -> PairError {
        let (setting, file) = match which {
            Which::Cert => (&self.cert_setting, &self.cert),
            Which::Key => (&self.key_setting, &self.key),
            Which::Chain => (
                &self.chain_setting,
                self.chain.as_ref().unwrap_or(&self.cert),
            ),
        };
        PairError {
            setting: setting.clone(),
            file: file.clone(),
            reason: reason.into(),
        }
    }

    pub fn read(&self) -> Result<Contents, PairError> {
        let read = |which: Which, path: &Path| {
            std::fs::read(path).map_err(|e| self.refuse(which, format!("cannot be read: {e}")))
        };
        Ok(Contents {
            cert: read(Which::Cert, &self.cert)?,
            key: read(Which::Key, &self.key)?,
            chain: match &self.chain {
                Some(chain) => read(Which::Chain, chain)?,
                None => Vec::new(),
            },
        })
    }

    /// Checks files already read (see [`TlsFiles::load`]).
    pub fn check(&self, contents: Contents) -> Result<Pair, PairError> {
        let certs = |which: Which, pem: &[u8]| {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| self.refuse(which, format!("is not valid PEM: {e}")))?;
            if certs.is_empty() {
                return Err(self.refuse(
                    which,
                    "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                ));
            }
            Ok(certs)
        };
        let mut chain = certs(Which::Cert, &contents.cert)?;
        if self.chain.is_some() {
            chain.extend(certs(Which::Chain, &contents.chain)?);
        }
        let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| {
            self.refuse(
                Which::Key,
                format!("holds no usable PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC): {e}"),
            )
        })?;
        let signing = default_provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| self.refuse(Which::Key, format!("is not a usable private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signing);
        if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) =
            certified.keys_match()
        {
            return Err(self.refuse(
                Which::Key,
                format!(
                    "does not match the certificate of {}={}",
                    self.cert_setting,
                    self.cert.display()
                ),
            ));
        }
        let not_after = not_after(&certified.cert[0]);
        Ok(Pair {
            certified: Arc::new(certified),
            not_after,
            contents,
        })
    }
}

#[derive(Clone, Copy)]
enum Which {
    Cert,
    Key,
    Chain,
}

/// The certificates of a PEM text (`Err` if a block is not valid PEM).
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

/// The leaf certificate's notAfter in seconds since the epoch, read from its DER
/// (RFC 5280 §4.1: `Certificate → tbsCertificate → validity → notAfter`); webpki does not
/// expose it.
fn not_after(cert: &CertificateDer<'_>) -> Option<i64> {
    let certificate = der_item(cert.as_ref(), 0x30)?;
    let mut tbs = der_item(certificate, 0x30)?;
    // [0] version (optional), serialNumber, signature, issuer, validity.
    if tbs.first() == Some(&0xa0) {
        tbs = der_skip(tbs)?;
    }
    for _ in 0..3 {
        tbs = der_skip(tbs)?;
    }
    let validity = der_item(tbs, 0x30)?;
    let after = der_skip(validity)?;
    let (tag, time) = der_any(after)?;
    let text = std::str::from_utf8(time).ok()?;
    let (year, rest) = match tag {
        // UTCTime: YYMMDDHHMMSSZ, years 1950..2049.
        0x17 => {
            let yy: i64 = text.get(0..2)?.parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, text.get(2..)?)
        }
        // GeneralizedTime: YYYYMMDDHHMMSSZ.
        0x18 => (text.get(0..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    let field = |at: usize| -> Option<i64> { rest.get(at..at + 2)?.parse().ok() };
    let days = days_from_civil(year, field(0)?, field(2)?);
    Some(days * 86_400 + field(4)? * 3600 + field(6)? * 60 + field(8)?)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The tag and content of the DER item at the start of `der`.
fn der_any(der: &[u8]) -> Option<(u8, &[u8])> {
    let (tag, len, header) = der_header(der)?;
    Some((tag, der.get(header..header + len)?))
}

/// The content of the DER item at the start of `der`, which must have tag `tag`.
fn der_item(der: &[u8], tag: u8) -> Option<&[u8]> {
    let (found, len, header) = der_header(der)?;
    (found == tag).then_some(())?;
    der.get(header..header + len)
}

/// What follows the DER item at the start of `der`.
fn der_skip(der: &[u8]) -> Option<&[u8]> {
    let (_, len, header) = der_header(der)?;
    der.get(header + len..)
}

/// (tag, content length, header length) of the DER item at the start of `der`.
fn der_header(der: &[u8]) -> Option<(u8, usize, usize)> {
    let tag = *der.first()?;
    let first = *der.get(1)?;
    if first < 0x80 {
        return Some((tag, usize::from(first), 2));
    }
    let count = usize::from(first & 0x7f);
    if count == 0 || count > 4 {
        return None;
    }
    let mut len = 0usize;
    for byte in der.get(2..2 + count)? {
        len = (len << 8) | usize::from(*byte);
    }
    Some((tag, len, 2 + count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_from_civil_matches_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2026, 12, 7), 20_794);
    }
}
