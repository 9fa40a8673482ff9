//! TLS on a server entry (Aphlict's `ssl.key`, `ssl.cert`, `ssl.chain`, or the
//! `GORGE_NOTIFICATION_{CLIENT,ADMIN}_TLS_*_FILE` settings): the pair a listener serves,
//! swapped while it serves when its files (checked by `config::tls_files`) change.
//!
//! The files are read at startup (a broken pair stops startup, exit 2, naming the setting),
//! then re-read every [`RECHECK`] and at once on SIGHUP. The *content* is compared, not the
//! path's mtime or inode: certbot replaces files by rename, and a Kubernetes Secret volume
//! swaps a `..data` symlink under unchanged paths. A new pair is taken only whole and
//! matching; otherwise the old one keeps serving and the failure is logged and counted once
//! per distinct failure. Handshakes already done keep their session: sockets opened before a
//! swap are not touched.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::crypto::ring::default_provider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use slog::Logger;

use crate::config::tls_files::{Contents, Pair, PairError, TlsFiles};
use crate::config::ServerKind;
use crate::events;
use crate::metrics::Metrics;
use gorge_service::emit;

/// How often the files are re-read when no SIGHUP comes.
pub const RECHECK: Duration = Duration::from_secs(60);

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
