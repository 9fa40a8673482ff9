//! TLS on a server entry (Aphlict's `ssl.key`, `ssl.cert`, `ssl.chain`, or the
//! `GORGE_NOTIFICATION_{CLIENT,ADMIN}_TLS_*_FILE` settings): the PEM files read and checked,
//! and the pair a listener serves, swapped while it serves when the files change.
//!
//! The files are read at startup (a broken pair stops startup, exit 2, naming the setting),
//! then re-read every [`RECHECK`] and at once on SIGHUP. The *content* is compared, not the
//! path's mtime or inode: certbot replaces files by rename, and a Kubernetes Secret volume
//! swaps a `..data` symlink under unchanged paths. A new pair is taken only whole and
//! matching; otherwise the old one keeps serving and the failure is logged and counted once
//! per distinct failure. Handshakes already done keep their session: sockets opened before a
//! swap are not touched.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use slog::Logger;

use crate::config::ServerKind;
use crate::events;
use crate::metrics::Metrics;
use gorge_service::emit;

/// How often the files are re-read when no SIGHUP comes.
pub const RECHECK: Duration = Duration::from_secs(60);

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
struct Contents {
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
    contents: Contents,
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

    fn read(&self) -> Result<Contents, PairError> {
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

    fn check(&self, contents: Contents) -> Result<Pair, PairError> {
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

/// The pair a listener serves, swapped whole (an `Arc`) when a renewal is taken.
#[derive(Debug)]
pub struct ServedPair {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ServedPair {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // Held for a clone of the Arc only.
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

/// What a check of the files found that differs from the last check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// The files are what is served (or what already failed, logged then).
    Unchanged,
    /// A new pair is served from now on.
    Taken,
    /// The files changed into something that cannot be served; the old pair serves on.
    Failed(PairError),
}

/// One TLS listener's files, the pair it serves and what the last check found.
#[derive(Debug)]
pub struct PortTls {
    pub kind: ServerKind,
    pub files: TlsFiles,
    served: Arc<ServedPair>,
    state: Mutex<CheckState>,
}

#[derive(Debug)]
struct CheckState {
    /// The files' bytes of the pair served.
    served: Contents,
    not_after: Option<i64>,
    /// The failure the files are in now, if they are (logged and counted once).
    failed: Option<PairError>,
}

impl PortTls {
    /// The listener's TLS from a pair checked at startup.
    pub fn new(kind: ServerKind, files: TlsFiles, pair: Pair) -> PortTls {
        PortTls {
            kind,
            files,
            served: Arc::new(ServedPair {
                current: RwLock::new(pair.certified),
            }),
            state: Mutex::new(CheckState {
                served: pair.contents,
                not_after: pair.not_after,
                failed: None,
            }),
        }
    }

    /// The rustls configuration a listener serves with: this port's pair, whatever it is at
    /// each handshake; HTTP/1.1 only (ALPN), as Aphlict's Node server.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports the default versions")
            .with_no_client_auth()
            .with_cert_resolver(self.served.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// The failure the files are in now, if a renewal could not be taken.
    pub fn failure(&self) -> Option<PairError> {
        self.lock().failed.clone()
    }

    /// Seconds from now until the served certificate expires (negative once it has).
    pub fn expires_in(&self) -> Option<i64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.lock().not_after.map(|at| at - now)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CheckState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-reads the files (blocking file I/O: small local files) and takes a new pair when
    /// they changed into a good one.
    pub fn check(&self) -> Checked {
        let found = self.files.read().and_then(|contents| {
            if contents == self.lock().served {
                Ok(None)
            } else {
                self.files.check(contents).map(Some)
            }
        });
        let mut state = self.lock();
        match found {
            Ok(None) => {
                state.failed = None;
                Checked::Unchanged
            }
            Ok(Some(pair)) => {
                *self
                    .served
                    .current
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = pair.certified;
                state.served = pair.contents;
                state.not_after = pair.not_after;
                state.failed = None;
                Checked::Taken
            }
            Err(e) if state.failed.as_ref() == Some(&e) => Checked::Unchanged,
            Err(e) => {
                state.failed = Some(e.clone());
                Checked::Failed(e)
            }
        }
    }
}

/// Checks every TLS listener's files, counts and logs what changed, and sets the expiry
/// gauges.
pub fn check_all(ports: &[Arc<PortTls>], metrics: &Metrics, log: &Logger) {
    for port in ports {
        let label = port_label(port.kind);
        match port.check() {
            Checked::Unchanged => {}
            Checked::Taken => {
                metrics.tls_reloads.with([label, "taken"]).inc();
                emit!(log, events::NOTIFY_TLS_RELOADED; "port" => label,
                    "expires_in_seconds" => port.expires_in().unwrap_or(0));
            }
            Checked::Failed(e) => {
                metrics.tls_reloads.with([label, "failed"]).inc();
                emit!(log, events::NOTIFY_TLS_RELOAD_FAILED; "port" => label,
                    "setting" => &e.setting, "file" => %e.file.display(), "reason" => &e.reason);
            }
        }
        set_expiry(port, metrics);
    }
}

/// The `port` label of a listener kind.
pub fn port_label(kind: ServerKind) -> &'static str {
    match kind {
        ServerKind::Client => "client",
        ServerKind::Admin => "admin",
    }
}

/// Sets the port's expiry gauge.
pub fn set_expiry(port: &PortTls, metrics: &Metrics) {
    if let Some(seconds) = port.expires_in() {
        metrics
            .tls_certificate_expires_in_seconds
            .with([port_label(port.kind)])
            .set(seconds);
    }
}

/// Re-checks the files every `every` and whenever `now` is notified (SIGHUP), until the
/// task is dropped.
pub async fn watch(
    ports: Vec<Arc<PortTls>>,
    metrics: Metrics,
    log: Logger,
    every: Duration,
    now: Arc<tokio::sync::Notify>,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = now.notified() => {}
        }
        let (ports, metrics, log) = (ports.clone(), metrics.clone(), log.clone());
        let _ = tokio::task::spawn_blocking(move || check_all(&ports, &metrics, &log)).await;
    }
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
