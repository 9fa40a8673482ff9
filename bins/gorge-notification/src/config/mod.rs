//! Configuration: built-in defaults, then an Aphlict-format JSON file (`--config PATH` or
//! `GORGE_NOTIFICATION_CONFIG_FILE`), then `GORGE_NOTIFICATION_*` environment variables
//! (an empty variable means "use the default").
//!
//! Every invalid value stops startup with one line naming the key and the value (exit 2):
//! a notification server that silently falls back to some other port or to plain text where
//! TLS was configured breaks every browser without any error anyone would see.
//!
//! - [`settings`]: the flat settings, each named once;
//! - [`aphlict_file`]: the JSON file;
//! - [`peer_url`]: peer URLs and `host:port`;
//! - [`broker`]: broker mode's Redis URL, password and CA;
//! - [`tls_files`]: a server's TLS files, read and checked;
//! - [`derived`]: what follows from the settings (the stop bound);
//! - this module: layering, cross-setting validation, `--check-config`, `--print-config`.

mod aphlict_file;
mod broker;
pub mod derived;
mod peer_url;
pub mod settings;
pub mod tls_files;

use std::collections::HashSet;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gorge_hub::Limits;

use crate::budget::InboundLimits;
use gorge_service::config::{env_value, without_url_password, CheckLine, Secret, Source};
use gorge_service::logging::LogVars;
use gorge_service::settings::{unknown_env_warnings, Declared, Layered};
use gorge_service::ConfigError;
use serde_json::Value;
use tls_files::TlsFiles;

pub use broker::BrokerConfig;
#[allow(unused_imports)] // PeerProtocol: for the peer relay's tests
pub use peer_url::{PeerProtocol, PeerUrl};
pub use settings::Settings;

use aphlict_file::{parse_file, parse_listen, read_file, FileLayer};
use broker::broker_config;
use peer_url::{parse_peer_url, parse_port_text, split_host_port};

/// Default client (WebSocket) port, as Aphlict.
pub const DEFAULT_CLIENT_PORT: u16 = 22280;

/// Default admin port, which is also the health port (`/healthz`, `/readyz`, `/metrics`).
pub const DEFAULT_HEALTH_PORT: u16 = 22281;

/// Which listener a server entry opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// Browsers' WebSocket port.
    Client,
    /// Phorge's HTTP port (messages, status, probes).
    Admin,
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerKind::Client => "client",
            ServerKind::Admin => "admin",
        })
    }
}

/// One listener to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub kind: ServerKind,
    pub addr: SocketAddr,
    /// The operator chose this server's address for it: its own `listen` in the file, or
    /// the variable of its kind. Not for the defaults, a file entry without `listen`, or
    /// the shared `GORGE_NOTIFICATION_LISTEN_ADDR` (which may have been meant for the
    /// client port only): an admin port exposed that way is warned about at every start.
    pub listen_chosen: bool,
    /// The TLS files of this server, each with the setting that named it (none: plaintext).
    pub tls: TlsSettings,
}

/// A server's TLS files as the operator named them: each path with its setting (the file's
/// `servers[i].ssl.*` or a `GORGE_NOTIFICATION_*_TLS_*_FILE` variable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub cert: Option<(PathBuf, String)>,
    pub key: Option<(PathBuf, String)>,
    pub chain: Option<(PathBuf, String)>,
}

impl TlsSettings {
    /// The files to serve, when a certificate and its key are both given.
    pub fn files(&self) -> Option<TlsFiles> {
        let ((cert, cert_setting), (key, key_setting)) = (self.cert.clone()?, self.key.clone()?);
        let (chain, chain_setting) = match self.chain.clone() {
            Some((path, setting)) => (Some(path), setting),
            None => (None, String::new()),
        };
        Some(TlsFiles {
            cert,
            cert_setting,
            key,
            key_setting,
            chain,
            chain_setting,
        })
    }

    /// A certificate with its key, or neither; a chain only with a certificate; and the
    /// pair readable, PEM and matching (see [`TlsFiles::load`]).
    fn check(&self, kind: ServerKind) -> Result<(), ConfigError> {
        let k = Settings::KEYS;
        let (cert_var, key_var) = match kind {
            ServerKind::Client => (k.client_tls_cert_file, k.client_tls_key_file),
            ServerKind::Admin => (k.admin_tls_cert_file, k.admin_tls_key_file),
        };
        let needs = |(path, setting): &(PathBuf, String), what: &str, var: &str| {
            ConfigError::new(
                setting,
                path.display(),
                format!(
                    "needs {what} too (ssl.{} of the same server, or {})",
                    if what == "its key" { "key" } else { "cert" },
                    Settings::env_var(var)
                ),
            )
        };
        match (&self.cert, &self.key, &self.chain) {
            (Some(cert), None, _) => Err(needs(cert, "its key", key_var)),
            (None, Some(key), _) => Err(needs(key, "a certificate", cert_var)),
            (None, None, Some(chain)) => Err(needs(chain, "a certificate", cert_var)),
            _ => match self.files() {
                Some(files) => files
                    .load()
                    .map(|_| ())
                    .map_err(|e| ConfigError::new(e.setting, e.file.display(), e.reason)),
                None => Ok(()),
            },
        }
    }
}

impl ServerConfig {
    /// A server of `kind` on `addr` whose address nobody chose (a default), plaintext.
    pub fn new(kind: ServerKind, addr: SocketAddr) -> ServerConfig {
        ServerConfig {
            kind,
            addr,
            listen_chosen: false,
            tls: TlsSettings::default(),
        }
    }
}

/// Everything the peer relay needs: static peers, DNS discovery, per-peer queue and timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// From the file's `cluster[]` and `GORGE_NOTIFICATION_PEERS`, duplicates removed.
    pub static_peers: Vec<PeerUrl>,
    /// `GORGE_NOTIFICATION_PEER_DNS`: a name resolving to every peer pod, and their admin port.
    pub dns: Option<(String, u16)>,
    pub dns_refresh: Duration,
    /// Messages queued per peer before new ones are dropped (and counted).
    pub queue_capacity: usize,
    /// Per-request timeout of a relay POST.
    pub timeout: Duration,
    /// How long a relay to an unreachable peer is kept and retried: the history age, past
    /// which the message could not be replayed anyway.
    pub keep_for: Duration,
    /// From `PEER_CA_FILE`: the PEM of the CA(s) `https://` peers must chain to, instead of
    /// the system's roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl PeerConfig {
    /// The relay of `static_peers` and `dns`, with the relay settings of `settings`.
    pub fn new(
        static_peers: Vec<PeerUrl>,
        dns: Option<(String, u16)>,
        settings: &Settings,
    ) -> PeerConfig {
        PeerConfig {
            static_peers,
            dns,
            dns_refresh: Duration::from_secs(settings.peer_dns_refresh_seconds),
            queue_capacity: usize_of(settings.peer_queue_capacity),
            timeout: Duration::from_millis(settings.peer_timeout_ms),
            keep_for: Duration::from_millis(settings.history_age_ms),
            ca_pem: None,
        }
    }
}

impl Default for PeerConfig {
    /// No peers yet, and the declared defaults of the relay settings.
    fn default() -> PeerConfig {
        PeerConfig::new(Vec::new(), None, &Settings::default())
    }
}

/// How this server reaches the other servers of its cluster, chosen once from the settings
/// (peers and a broker exclude each other: both would deliver every message). The service
/// starts the matching [`crate::cluster::Cluster`]; nothing else tells the modes apart.
#[derive(Debug, Clone)]
pub enum ClusterConfig {
    /// No peers and no broker: messages reach the browsers of this server only, and history
    /// is warm from the start.
    Alone,
    /// Messages are relayed to peers (the file's `cluster[]`, `PEERS`, `PEER_DNS`), and a
    /// starting server fills its history from one of them.
    Mesh(PeerConfig),
    /// Messages go through a Redis stream (`BROKER_URL`), which is also the history a
    /// starting server loads.
    Broker(BrokerConfig),
}

impl ClusterConfig {
    /// The peers listed in the configuration (none unless in a mesh).
    pub fn static_peers(&self) -> &[PeerUrl] {
        match self {
            ClusterConfig::Mesh(peers) => &peers.static_peers,
            ClusterConfig::Alone | ClusterConfig::Broker(_) => &[],
        }
    }
}

/// A file key that was accepted but ignored; logged once at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredKey {
    pub key: String,
    pub reason: String,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub servers: Vec<ServerConfig>,
    pub hub: Limits,
    /// Largest inbound WebSocket frame/message.
    pub max_frame_bytes: usize,
    /// Each socket's inbound budget.
    pub inbound: InboundLimits,
    /// Added to the nice value of the client sockets' threads (0..=19).
    pub client_worker_nice: i32,
    pub max_admin_body_bytes: usize,
    pub ping_interval: Duration,
    pub idle_timeout: Duration,
    /// Close frames are spread over this window on SIGTERM.
    pub drain_window: Duration,
    pub cluster: ClusterConfig,
    pub config_file: Option<PathBuf>,
    pub ignored: Vec<IgnoredKey>,
    /// Logged at startup and printed by `--check-config`.
    pub warnings: Vec<String>,
    /// The flat settings as layered, with where each came from: only for `--check-config`
    /// and `--print-config`, which show them as the operator set them.
    layered: Layered<Settings>,
    /// `GORGE_LOG_*`, shown by `--check-config`.
    log: Layered<LogVars>,
    /// Where `servers[]` came from: the file, or the defaults.
    servers_source: Source,
}

impl Config {
    /// The first admin listener's address (where `healthcheck` probes by default).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.servers
            .iter()
            .find(|s| s.kind == ServerKind::Admin)
            .map(|s| s.addr)
    }

    /// Admin listeners on a non-loopback address that nobody chose for the admin port (the
    /// shared `LISTEN_ADDR`, or a file entry without `listen`). PHP cannot authenticate, so
    /// anyone who reaches the admin port can post to every browser; operators should know
    /// when it is exposed by accident. An address set for the admin port itself (its
    /// `listen`, or `ADMIN_LISTEN_ADDR`, as the chart does next to its NetworkPolicy) is a
    /// decision, and a warning at every start would only teach operators to ignore warnings.
    pub fn exposed_admin_addrs(&self) -> Vec<SocketAddr> {
        self.servers
            .iter()
            .filter(|s| {
                s.kind == ServerKind::Admin && !s.listen_chosen && !s.addr.ip().is_loopback()
            })
            .map(|s| s.addr)
            .collect()
    }
}

/// Loads the configuration from `cli_file` (if given), the environment and the defaults,
/// and validates the logging variables too, so `--check-config` refuses what startup would.
pub fn load(cli_file: Option<&Path>) -> Result<Config, ConfigError> {
    let log = gorge_service::logging::log_vars(crate::events::ALL)?;
    let mut config = load_from(cli_file, &|var| env_value(var))?;
    config.log = log;
    config
        .warnings
        .extend(unknown_env_warnings::<Settings>(std::env::vars()));
    config
        .warnings
        .extend(unknown_env_warnings::<LogVars>(std::env::vars()));
    Ok(config)
}

pub(crate) fn load_from(
    cli_file: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let key = Settings::KEYS.config_file;
    let mut layered = Layered::<Settings>::default();
    let config_var = Settings::env_var(key);
    let mut warnings = Vec::new();
    // --config wins over the variable, as an option given for one run should; a variable
    // naming another file is said so, never silently dropped.
    let (file_path, named_by) = match (cli_file, env(&config_var)) {
        (Some(path), other) => {
            if let Some(other) = other.filter(|other| Path::new(other) != path) {
                warnings.push(format!(
                    "--config {} is read, not {config_var}={other}",
                    path.display()
                ));
            }
            layered.set_source(key, Source::Option("--config".into()));
            (Some(path.to_path_buf()), "--config".to_string())
        }
        (None, Some(path)) => {
            layered.set_source(key, Source::Env(config_var.clone()));
            (Some(PathBuf::from(path)), config_var)
        }
        (None, None) => (None, String::new()),
    };
    layered.values.config_file = file_path.as_ref().map(|p| p.display().to_string());
    let file = match &file_path {
        Some(path) => parse_file(path, &read_file(path, &named_by)?, &mut layered)?,
        None => FileLayer::default(),
    };
    layered.apply_env(env, &[key])?;
    let mut config = build(layered, file, file_path)?;
    config.warnings = warnings;
    Ok(config)
}

fn usize_of(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

fn build(
    layered: Layered<Settings>,
    file: FileLayer,
    config_file: Option<PathBuf>,
) -> Result<Config, ConfigError> {
    let (settings, k) = (&layered.values, Settings::KEYS);
    let client_port = settings.client_port;
    let admin_port = settings.admin_port;
    let listen = |key: &str, value: &Option<String>| {
        value
            .as_deref()
            .map(|s| parse_listen(&layered.name(key), s))
            .transpose()
    };
    let shared_listen = listen(k.listen_addr, &settings.listen_addr)?;
    let client_listen = listen(k.client_listen_addr, &settings.client_listen_addr)?;
    let admin_listen = listen(k.admin_listen_addr, &settings.admin_listen_addr)?;

    let servers_source = match (&file.servers, &config_file) {
        (Some(_), Some(path)) => Source::File(path.display().to_string()),
        _ => Source::Default,
    };
    // Aphlict's default configuration: browsers on every interface, PHP on loopback (the
    // admin port has no authentication).
    let mut servers = file.servers.unwrap_or_else(|| {
        vec![
            ServerConfig::new(
                ServerKind::Client,
                SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), DEFAULT_CLIENT_PORT),
            ),
            ServerConfig::new(
                ServerKind::Admin,
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), DEFAULT_HEALTH_PORT),
            ),
        ]
    });
    // The environment wins over the file: it overrides every server of the kind it names,
    // and a kind's own address wins over the shared one.
    for server in &mut servers {
        let (port, own_listen) = match server.kind {
            ServerKind::Client => (client_port, client_listen),
            ServerKind::Admin => (admin_port, admin_listen),
        };
        if let Some(port) = port {
            server.addr.set_port(port);
        }
        if let Some(ip) = own_listen {
            server.addr.set_ip(ip);
            server.listen_chosen = true;
        } else if let Some(ip) = shared_listen {
            server.addr.set_ip(ip);
            server.listen_chosen = false;
        }
    }
    // TLS files from the environment win over the file's `ssl.*`, one by one.
    for server in &mut servers {
        let (cert, key, chain) = match server.kind {
            ServerKind::Client => (
                (k.client_tls_cert_file, &settings.client_tls_cert_file),
                (k.client_tls_key_file, &settings.client_tls_key_file),
                (k.client_tls_chain_file, &settings.client_tls_chain_file),
            ),
            ServerKind::Admin => (
                (k.admin_tls_cert_file, &settings.admin_tls_cert_file),
                (k.admin_tls_key_file, &settings.admin_tls_key_file),
                (k.admin_tls_chain_file, &settings.admin_tls_chain_file),
            ),
        };
        let tls = &mut server.tls;
        for ((key, value), slot) in [
            (cert, &mut tls.cert),
            (key, &mut tls.key),
            (chain, &mut tls.chain),
        ] {
            if let Some(path) = value.as_deref().filter(|p| !p.is_empty()) {
                *slot = Some((PathBuf::from(path), layered.name(key)));
            }
        }
    }
    for server in &servers {
        server.tls.check(server.kind)?;
    }
    for kind in [ServerKind::Client, ServerKind::Admin] {
        if !servers.iter().any(|s| s.kind == kind) {
            return Err(ConfigError::new(
                "servers",
                format!("{} server(s)", servers.len()),
                format!("at least one {kind} server is required"),
            ));
        }
    }
    let mut seen = HashSet::new();
    for (i, server) in servers.iter().enumerate() {
        if !seen.insert(server.addr) {
            return Err(ConfigError::new(
                format!("servers[{i}]"),
                server.addr,
                "duplicate listen address",
            ));
        }
    }
    // Listeners bind with SO_REUSEPORT, so a client and an admin server on one port but
    // different addresses both bind, and the kernel hands each connection to whichever
    // matches best: PHP's POSTs would reach the WebSocket server, or browsers the admin one.
    for (i, server) in servers.iter().enumerate() {
        let other = servers[..i]
            .iter()
            .find(|o| o.kind != server.kind && o.addr.port() == server.addr.port());
        if let Some(other) = other {
            return Err(ConfigError::new(
                format!("servers[{i}]"),
                server.addr,
                format!(
                    "the {} server shares port {} with the {} server on {}: give each kind \
                     its own port",
                    server.kind,
                    server.addr.port(),
                    other.kind,
                    other.addr.ip()
                ),
            ));
        }
    }

    let mut static_peers = file.cluster;
    if let Some(list) = &settings.peers {
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            static_peers.push(parse_peer_url(&layered.name(k.peers), part)?);
        }
    }
    let mut unique = HashSet::new();
    static_peers.retain(|p| unique.insert(p.clone()));
    let dns = match &settings.peer_dns {
        Some(text) => {
            let bad = || layered.refuse(k.peer_dns, "expected host:port, e.g. gorge-peers:22281");
            let (host, port) = split_host_port(text.trim()).ok_or_else(bad)?;
            Some((host, parse_port_text(port).ok_or_else(bad)?))
        }
        None => None,
    };

    let has_peers = !static_peers.is_empty() || dns.is_some();
    let cluster = match broker_config(&layered, has_peers)? {
        Some(broker) => ClusterConfig::Broker(broker),
        None if has_peers => ClusterConfig::Mesh(PeerConfig {
            ca_pem: peer_ca(&layered)?,
            ..PeerConfig::new(static_peers, dns, settings)
        }),
        None => ClusterConfig::Alone,
    };

    let s = settings;
    let hub = Limits {
        queue_frames: usize_of(s.queue_frames),
        queue_bytes: usize_of(s.queue_bytes),
        history_entries: usize_of(s.history_entries),
        history_age_ms: s.history_age_ms,
        history_bytes: usize_of(s.history_bytes),
        subscriptions_per_socket: usize_of(s.max_subscriptions),
        phid_bytes: usize_of(s.max_phid_bytes),
        instances: usize_of(s.max_instances),
        instance_name_bytes: usize_of(s.max_instance_name_bytes),
        sockets: usize_of(s.max_sockets),
        ..Limits::default()
    };
    // Rules between two settings name the one the operator set (an operator who raised the
    // frame size never wrote the burst, whose default is then what stands in the way).
    if s.idle_timeout_seconds <= s.ping_interval_seconds {
        let (idle, ping) = (k.idle_timeout_seconds, k.ping_interval_seconds);
        return Err(match layered.blame(idle, ping) {
            key if key == idle => layered.refuse(
                idle,
                format!(
                    "must be longer than the ping interval ({}, {} s)",
                    layered.name(ping),
                    s.ping_interval_seconds
                ),
            ),
            _ => layered.refuse(
                ping,
                format!(
                    "must be shorter than the idle timeout ({}, {} s), or a socket is closed \
                     before its ping is answered",
                    layered.name(idle),
                    s.idle_timeout_seconds
                ),
            ),
        });
    }
    if s.inbound_bytes_burst < s.max_frame_bytes {
        let (burst, frame) = (k.inbound_bytes_burst, k.max_frame_bytes);
        return Err(match layered.blame(burst, frame) {
            key if key == burst => layered.refuse(
                burst,
                format!(
                    "must be at least the largest frame ({}, {} bytes)",
                    layered.name(frame),
                    s.max_frame_bytes
                ),
            ),
            _ => layered.refuse(
                frame,
                format!(
                    "must be at most {} ({} bytes), what a socket may send at once: raise \
                     that too",
                    layered.name(burst),
                    s.inbound_bytes_burst
                ),
            ),
        });
    }
    Ok(Config {
        servers,
        hub,
        max_frame_bytes: usize_of(s.max_frame_bytes),
        inbound: InboundLimits {
            frames_per_second: s.inbound_frames_per_second,
            frames_burst: s.inbound_frames_burst,
            bytes_per_second: s.inbound_bytes_per_second,
            bytes_burst: s.inbound_bytes_burst,
        },
        client_worker_nice: s.client_worker_nice,
        max_admin_body_bytes: usize_of(s.max_admin_body_bytes),
        ping_interval: Duration::from_secs(s.ping_interval_seconds),
        idle_timeout: Duration::from_secs(s.idle_timeout_seconds),
        drain_window: Duration::from_secs(s.drain_seconds),
        cluster,
        config_file,
        ignored: file.ignored,
        warnings: Vec::new(),
        layered,
        log: Layered::default(),
        servers_source,
    })
}

/// `PEER_CA_FILE`, read and checked: a readable file holding PEM certificates.
fn peer_ca(layered: &Layered<Settings>) -> Result<Option<Vec<u8>>, ConfigError> {
    let key = Settings::KEYS.peer_ca_file;
    let Some(path) = layered
        .values
        .peer_ca_file
        .as_deref()
        .filter(|p| !p.is_empty())
    else {
        return Ok(None);
    };
    let pem =
        std::fs::read(path).map_err(|e| layered.refuse(key, format!("cannot be read: {e}")))?;
    if tls_files::pem_certificates(&pem).map_or(true, |certs| certs.is_empty()) {
        return Err(layered.refuse(
            key,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(Some(pem))
}

/// The settings that override the port and the address of a kind's servers.
fn server_keys(kind: ServerKind) -> (&'static str, &'static str) {
    let k = Settings::KEYS;
    match kind {
        ServerKind::Client => (k.client_port, k.client_listen_addr),
        ServerKind::Admin => (k.admin_port, k.admin_listen_addr),
    }
}

/// What `--check-config` shows for a setting folded into `servers[]`: the value in force on
/// the servers it overrides (which, unset, is the file's or the default), and where that
/// came from. `None` for every other setting.
fn in_force(config: &Config, key: &str) -> Option<(String, Source)> {
    let layered = &config.layered;
    // The first of `keys` the operator set, else where the servers came from.
    let source = |keys: &[&str]| {
        keys.iter()
            .map(|key| layered.source(key))
            .find(|source| *source != Source::Default)
            .unwrap_or_else(|| config.servers_source.clone())
    };
    let distinct = |kind: ServerKind, part: fn(&SocketAddr) -> String| {
        let mut values: Vec<String> = Vec::new();
        for server in config.servers.iter().filter(|s| s.kind == kind) {
            let value = part(&server.addr);
            if !values.contains(&value) {
                values.push(value);
            }
        }
        values.join(", ")
    };
    let shared = Settings::KEYS.listen_addr;
    if key == shared {
        return layered.values.listen_addr.is_none().then(|| {
            (
                "(unset: each kind keeps its own address)".into(),
                Source::Default,
            )
        });
    }
    [ServerKind::Client, ServerKind::Admin]
        .into_iter()
        .find_map(|kind| match server_keys(kind) {
            (port, _) if key == port => Some((
                distinct(kind, |addr| addr.port().to_string()),
                source(&[port]),
            )),
            (_, listen) if key == listen => Some((
                distinct(kind, |addr| addr.ip().to_string()),
                source(&[listen, shared]),
            )),
            _ => None,
        })
}

/// The `--check-config` lines: servers, peers, every flat setting with its source (the ones
/// folded into `servers[]` with the values in force), then the logging variables.
pub fn check_lines(config: &Config) -> Vec<CheckLine> {
    let mut lines = Vec::new();
    let layered = &config.layered;
    let env_source = |key: &str| Some(layered.source(key)).filter(|s| matches!(s, Source::Env(_)));
    for (i, server) in config.servers.iter().enumerate() {
        let (port_key, listen_key) = server_keys(server.kind);
        let tls = match server.tls.files() {
            Some(files) => {
                format!(
                    " tls cert={} key={}",
                    files.cert.display(),
                    files.key.display()
                ) + &files
                    .chain
                    .map(|c| format!(" chain={}", c.display()))
                    .unwrap_or_default()
            }
            None => String::new(),
        };
        lines.push(CheckLine {
            name: format!("servers[{i}]"),
            value: format!("{} {}{tls}", server.kind, server.addr),
            source: env_source(port_key)
                .or_else(|| env_source(listen_key))
                .or_else(|| env_source(Settings::KEYS.listen_addr))
                .unwrap_or_else(|| config.servers_source.clone()),
        });
    }
    let peers: Vec<String> = config
        .cluster
        .static_peers()
        .iter()
        .map(ToString::to_string)
        .collect();
    lines.push(CheckLine {
        name: "peers (cluster[] and PEERS)".to_string(),
        value: if peers.is_empty() {
            "(none)".to_string()
        } else {
            peers.join(", ")
        },
        source: Source::Default,
    });
    for (info, mut line) in Settings::SETTINGS.iter().zip(layered.check_lines(|_| None)) {
        if let Some((value, source)) = in_force(config, info.key) {
            (line.value, line.source) = (value, source);
        }
        lines.push(line);
    }
    // Then each derived fact on its line.
    lines.extend(gorge_service::derived::fact_lines(config, &config.layered));
    lines.extend(config.log.log_check_lines());
    lines
}

/// The `--check-config` warnings: those logged at startup, then one per ignored file key.
pub fn check_warnings(config: &Config) -> Vec<String> {
    let file = config
        .config_file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let ignored = config
        .ignored
        .iter()
        .map(|k| format!("{} (in {file}) is ignored: {}", k.key, k.reason));
    // The same warning NOTIFY_ADMIN_NOT_LOOPBACK logs at start.
    let exposed = config.exposed_admin_addrs().into_iter().map(|addr| {
        format!(
            "the admin server listens on {addr}, not loopback: it has no authentication; \
                 keep it off public networks"
        )
    });
    config
        .warnings
        .iter()
        .cloned()
        .chain(ignored)
        .chain(exposed)
        .collect()
}

/// An Aphlict-format file holding the effective configuration (the defaults, when nothing
/// is set): `servers[]`, `cluster[]` and every flat setting under its key. Phorge's own
/// `bin/aphlict` checks top-level keys strictly and would refuse the flat ones; this file is
/// for gorge-notification, which reads Aphlict's files as they are.
pub fn print_config(config: &Config) -> Value {
    let mut out = serde_json::Map::new();
    let servers: Vec<Value> = config
        .servers
        .iter()
        .map(|s| {
            serde_json::json!({
                "type": s.kind.to_string(),
                "port": s.addr.port(),
                "listen": s.addr.ip().to_string(),
                "ssl.key": path_of(&s.tls.key),
                "ssl.cert": path_of(&s.tls.cert),
                "ssl.chain": path_of(&s.tls.chain),
            })
        })
        .collect();
    out.insert("servers".into(), Value::from(servers));
    let cluster: Vec<Value> = config
        .cluster
        .static_peers()
        .iter()
        .map(|p| serde_json::json!({"host": p.host, "port": p.port, "protocol": p.protocol.to_string()}))
        .collect();
    out.insert("cluster".into(), Value::from(cluster));
    let k = Settings::KEYS;
    // Folded into servers[] and cluster[] above.
    let folded = [
        k.client_port,
        k.admin_port,
        k.listen_addr,
        k.client_listen_addr,
        k.admin_listen_addr,
        k.peers,
    ];
    for (info, value) in Settings::SETTINGS
        .iter()
        .zip(config.layered.values.file_values())
    {
        let folded = folded.contains(&info.key);
        if !info.env_only && !folded {
            out.insert(info.key.into(), value);
        }
    }
    // Not settings: what follows from them (a file with this key loads back unchanged).
    out.insert(
        aphlict_file::DERIVED_KEY.into(),
        gorge_service::derived::json(config, &config.layered),
    );
    Value::Object(out)
}

/// A TLS file's path for `--print-config`, or null.
fn path_of(file: &Option<(PathBuf, String)>) -> Value {
    file.as_ref().map_or(Value::Null, |(path, _)| {
        Value::from(path.display().to_string())
    })
}

/// What `--print-config` could not write, for stderr (a JSON file has no comments): a
/// password in the broker URL, unless the password file gives it anyway.
pub fn print_config_notes(config: &Config) -> Vec<String> {
    let (values, k) = (&config.layered.values, Settings::KEYS);
    let url = values.broker_url.as_ref().map(Secret::expose);
    match url {
        Some(url) if values.broker_password_file.is_none() && without_url_password(url) != url => {
            vec![format!(
                "the password of {} is not printed: put it in {}, or into the printed URL \
                 yourself",
                Settings::env_var(k.broker_url),
                Settings::env_var(k.broker_password_file)
            )]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build_with(settings: Settings, file: Option<Value>) -> Result<Config, ConfigError> {
        let mut layered = Layered::default();
        layered.values = settings;
        let layer = match file {
            Some(Value::Object(entries)) => {
                parse_file(Path::new("/etc/aphlict.json"), &entries, &mut layered)?
            }
            _ => FileLayer::default(),
        };
        build(layered, layer, None)
    }

    fn load_env(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        load_from(None, &move |var| {
            vars.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn broker_settings_are_validated() {
        assert!(matches!(
            load_env(&[]).unwrap().cluster,
            ClusterConfig::Alone
        ));
        let c =
            load_env(&[("GORGE_NOTIFICATION_BROKER_URL", "rediss://u:p@redis:6380/2")]).unwrap();
        let ClusterConfig::Broker(broker) = c.cluster else {
            panic!("not broker mode: {:?}", c.cluster)
        };
        assert_eq!(broker.prefix, "gorge:notification");
        assert_eq!(broker.queue_capacity, 4096);
        // The URL may hold a password: never printed.
        assert_eq!(broker.url.to_string(), "********");

        let refused = |vars: &[(&str, &str)]| load_env(vars).unwrap_err();
        let e = refused(&[("GORGE_NOTIFICATION_BROKER_URL", "http://redis:6379")]);
        assert_eq!(e.key, "GORGE_NOTIFICATION_BROKER_URL");
        assert!(e.reason.contains("redis:// or rediss://"), "{e}");
        let e = refused(&[("GORGE_NOTIFICATION_BROKER_URL", "redis://redis:notaport/0")]);
        assert!(e.reason.contains("not a valid Redis URL"), "{e}");
        let e = refused(&[
            ("GORGE_NOTIFICATION_BROKER_URL", "redis://redis:6379/0"),
            (
                "GORGE_NOTIFICATION_BROKER_PASSWORD_FILE",
                "/nonexistent/gorge-password",
            ),
        ]);
        assert_eq!(e.key, "GORGE_NOTIFICATION_BROKER_PASSWORD_FILE");
        let e = refused(&[
            ("GORGE_NOTIFICATION_BROKER_URL", "redis://redis:6379/0"),
            ("GORGE_NOTIFICATION_BROKER_PREFIX", "two words"),
        ]);
        assert_eq!(e.key, "GORGE_NOTIFICATION_BROKER_PREFIX");
        let e = refused(&[
            ("GORGE_NOTIFICATION_BROKER_URL", "redis://redis:6379/0"),
            ("GORGE_NOTIFICATION_PEERS", "http://peer:22281"),
        ]);
        assert!(e.reason.contains("cannot be combined with peers"), "{e}");
    }

    #[test]
    fn the_broker_password_file_wins_over_the_url() {
        let dir = std::env::temp_dir().join(format!("gorge-broker-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "from-file\n").unwrap();
        let c = load_env(&[
            (
                "GORGE_NOTIFICATION_BROKER_URL",
                "redis://user:from-url@redis:6379/0",
            ),
            (
                "GORGE_NOTIFICATION_BROKER_PASSWORD_FILE",
                file.to_str().unwrap(),
            ),
        ])
        .unwrap();
        let ClusterConfig::Broker(broker) = c.cluster else {
            panic!("not broker mode: {:?}", c.cluster)
        };
        let info = broker.connection_info().unwrap();
        assert_eq!(info.redis_settings().password(), Some("from-file"));
        assert_eq!(info.redis_settings().username(), Some("user"));
        std::fs::write(&file, "\n").unwrap();
        let e = load_env(&[
            ("GORGE_NOTIFICATION_BROKER_URL", "redis://redis:6379/0"),
            (
                "GORGE_NOTIFICATION_BROKER_PASSWORD_FILE",
                file.to_str().unwrap(),
            ),
        ])
        .unwrap_err();
        assert!(e.reason.contains("one non-empty line"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn defaults() {
        let c = build_with(Settings::default(), None).unwrap();
        // Aphlict's default configuration: the unauthenticated admin port on loopback.
        assert_eq!(
            c.servers,
            vec![
                ServerConfig::new(ServerKind::Client, "0.0.0.0:22280".parse().unwrap()),
                ServerConfig::new(ServerKind::Admin, "127.0.0.1:22281".parse().unwrap()),
            ]
        );
        assert_eq!(c.max_frame_bytes, 65536);
        assert_eq!(c.max_admin_body_bytes, 1 << 20);
        assert_eq!(c.drain_window, Duration::from_secs(10));
        assert_eq!(c.drain_deadline(), Duration::from_secs(15));
        assert!(matches!(c.cluster, ClusterConfig::Alone), "{:?}", c.cluster);
        assert_eq!(PeerConfig::default().timeout, Duration::from_secs(5));
        assert_eq!(DEFAULT_HEALTH_PORT, 22281);
    }

    #[test]
    fn aphlict_file_servers_cluster_and_ignored_keys() {
        let file = json!({
            "servers": [
                {"type": "client", "port": 22280, "listen": "0.0.0.0", "ssl.key": null, "ssl.cert": null, "ssl.chain": null},
                {"type": "admin", "port": 22281, "listen": "127.0.0.1", "ssl.key": null, "ssl.cert": null}
            ],
            "logs": [{"path": "/var/log/aphlict.log"}],
            "cluster": [{"host": "peer-a", "port": 22281, "protocol": "http"}],
            "pidfile": "/var/tmp/aphlict/pid/aphlict.pid",
            "memory.hint": 256
        });
        let c = build_with(Settings::default(), Some(file)).unwrap();
        assert_eq!(c.servers[1].addr, "127.0.0.1:22281".parse().unwrap());
        assert_eq!(
            c.cluster.static_peers()[0].to_string(),
            "http://peer-a:22281"
        );
        let ignored: Vec<_> = c.ignored.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(ignored, ["logs", "pidfile", "memory.hint"]);
    }

    #[test]
    fn env_overrides_file_ports() {
        let file =
            json!({"servers": [{"type": "client", "port": 1000}, {"type": "admin", "port": 1001}]});
        let settings = Settings {
            admin_port: Some(2001),
            listen_addr: Some("127.0.0.1".into()),
            ..Settings::default()
        };
        let c = build_with(settings, Some(file)).unwrap();
        assert_eq!(c.servers[0].addr, "127.0.0.1:1000".parse().unwrap());
        assert_eq!(c.servers[1].addr, "127.0.0.1:2001".parse().unwrap());
    }

    /// Each server as `kind addr`, with `*` when its address was chosen for it.
    fn servers(c: &Config) -> Vec<String> {
        c.servers
            .iter()
            .map(|s| {
                let chosen = if s.listen_chosen { "*" } else { "" };
                format!("{} {}{chosen}", s.kind, s.addr)
            })
            .collect()
    }

    #[test]
    fn listen_addresses_kind_variables_win_over_the_shared_one() {
        let env = |vars: &[(&str, &str)]| servers(&load_env(vars).unwrap());
        assert_eq!(env(&[]), ["client 0.0.0.0:22280", "admin 127.0.0.1:22281"]);
        assert_eq!(
            env(&[("GORGE_NOTIFICATION_LISTEN_ADDR", "10.0.0.1")]),
            ["client 10.0.0.1:22280", "admin 10.0.0.1:22281"]
        );
        assert_eq!(
            env(&[
                ("GORGE_NOTIFICATION_LISTEN_ADDR", "10.0.0.1"),
                ("GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR", "0.0.0.0"),
            ]),
            ["client 10.0.0.1:22280", "admin 0.0.0.0:22281*"]
        );
        assert_eq!(
            env(&[
                ("GORGE_NOTIFICATION_CLIENT_LISTEN_ADDR", "::"),
                ("GORGE_NOTIFICATION_LISTEN_ADDR", "10.0.0.1"),
            ]),
            ["client [::]:22280*", "admin 10.0.0.1:22281"]
        );
        assert_eq!(
            env(&[("GORGE_NOTIFICATION_CLIENT_LISTEN_ADDR", "127.0.0.1")]),
            ["client 127.0.0.1:22280*", "admin 127.0.0.1:22281"]
        );
        let e = load_env(&[("GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR", "0.0.0.0:22281")]).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR", "0.0.0.0:22281")
        );
    }

    #[test]
    fn a_file_listen_is_chosen_and_the_kind_variable_overrides_it() {
        let file = json!({"servers": [
            {"type": "client", "port": 1000},
            {"type": "admin", "port": 1001},
            {"type": "admin", "port": 1002, "listen": "0.0.0.0"},
        ]});
        let c = build_with(Settings::default(), Some(file.clone())).unwrap();
        // Without `listen`, Aphlict listens everywhere; nobody chose that for an admin port.
        assert_eq!(
            servers(&c),
            [
                "client 0.0.0.0:1000",
                "admin 0.0.0.0:1001",
                "admin 0.0.0.0:1002*"
            ]
        );
        let settings = Settings {
            admin_listen_addr: Some("127.0.0.2".into()),
            listen_addr: Some("127.0.0.3".into()),
            ..Settings::default()
        };
        let c = build_with(settings, Some(file)).unwrap();
        assert_eq!(
            servers(&c),
            [
                "client 127.0.0.3:1000",
                "admin 127.0.0.2:1001*",
                "admin 127.0.0.2:1002*"
            ]
        );
    }

    #[test]
    fn a_client_and_an_admin_server_on_one_port_are_refused() {
        let e = file_error(json!({"servers": [
            {"type": "client", "port": 22280, "listen": "0.0.0.0"},
            {"type": "admin", "port": 22280, "listen": "127.0.0.1"},
        ]}));
        assert_eq!(
            e.to_string(),
            "invalid configuration: servers[1]=\"127.0.0.1:22280\": the admin server shares \
             port 22280 with the client server on 0.0.0.0: give each kind its own port"
        );
        let e = load_env(&[
            ("GORGE_NOTIFICATION_CLIENT_PORT", "22281"),
            ("GORGE_NOTIFICATION_CLIENT_LISTEN_ADDR", "0.0.0.0"),
        ])
        .unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("servers[1]", "127.0.0.1:22281")
        );
        // Two servers of one kind may share a port: the same handler answers either way.
        let c = build_with(
            Settings::default(),
            Some(json!({"servers": [
                {"type": "client", "port": 1, "listen": "0.0.0.0"},
                {"type": "client", "port": 1, "listen": "127.0.0.1"},
                {"type": "admin", "port": 2},
            ]})),
        )
        .unwrap();
        assert_eq!(c.servers.len(), 3);
    }

    fn file_error(file: Value) -> ConfigError {
        build_with(Settings::default(), Some(file)).unwrap_err()
    }

    /// TLS needs a certificate and its key: one alone names itself and what is missing.
    #[test]
    fn an_ssl_key_without_a_certificate_is_a_startup_error() {
        let e = file_error(
            json!({"servers": [{"type": "client", "port": 22280, "ssl.key": "/k.pem"}, {"type": "admin", "port": 22281}]}),
        );
        assert_eq!(e.key, "servers[0].ssl.key");
        assert_eq!(e.value, "/k.pem");
        assert_eq!(
            e.reason,
            "needs a certificate too (ssl.cert of the same server, or \
             GORGE_NOTIFICATION_CLIENT_TLS_CERT_FILE)"
        );
        let e = load_env(&[("GORGE_NOTIFICATION_ADMIN_TLS_CERT_FILE", "/c.pem")]).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("GORGE_NOTIFICATION_ADMIN_TLS_CERT_FILE", "/c.pem")
        );
        assert!(e.reason.starts_with("needs its key too"), "{e}");
    }

    #[test]
    fn invalid_servers_name_the_key() {
        let cases = [
            (
                json!({"servers": [{"type": "client", "port": 70000}]}),
                "servers[0].port",
                "70000",
            ),
            (
                json!({"servers": [{"type": "client", "port": 0}]}),
                "servers[0].port",
                "0",
            ),
            (
                json!({"servers": [{"type": "web", "port": 1}]}),
                "servers[0].type",
                "web",
            ),
            (
                json!({"servers": [{"type": "client", "port": 1, "listen": "nowhere"}]}),
                "servers[0].listen",
                "nowhere",
            ),
            (
                json!({"servers": [{"type": "client", "port": 1}]}),
                "servers",
                "1 server(s)",
            ),
            (
                json!({"servers": [{"type": "client", "port": 1}, {"type": "admin", "port": 1}]}),
                "servers[1]",
                "0.0.0.0:1",
            ),
            (
                json!({"cluster": [{"host": "a", "port": 1, "protocol": "ftp"}]}),
                "cluster[0].protocol",
                "ftp",
            ),
            (
                json!({"cluster": [{"host": "", "port": 1}]}),
                "cluster[0].host",
                "",
            ),
            (
                json!({"cluster": ["peer-a:22281"]}),
                "cluster[0]",
                "peer-a:22281",
            ),
        ];
        for (file, key, value) in cases {
            let e = file_error(file.clone());
            assert_eq!((e.key.as_str(), e.value.as_str()), (key, value), "{file}");
        }
    }

    #[test]
    fn env_ports_and_peers_are_validated() {
        let e = load_env(&[("GORGE_NOTIFICATION_CLIENT_PORT", "70000")]).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("GORGE_NOTIFICATION_CLIENT_PORT", "70000")
        );
        for bad in [
            "ftp://a:1",
            "http://a",
            "http://a:0",
            "http://:1",
            "http://a:1/x",
            "http://u@a:1",
        ] {
            let list = format!("http://ok:1,{bad}");
            let e = load_env(&[("GORGE_NOTIFICATION_PEERS", &list)]).unwrap_err();
            assert_eq!(
                (e.key.as_str(), e.value.as_str()),
                ("GORGE_NOTIFICATION_PEERS", bad)
            );
        }
    }

    #[test]
    fn peers_from_env_file_and_dns() {
        let settings = Settings {
            peers: Some(" http://a:1/ , https://[::1]:2,http://peer-a:22281".into()),
            peer_dns: Some("gorge-notification-headless:22281".into()),
            ..Settings::default()
        };
        let file = json!({"cluster": [{"host": "peer-a", "port": 22281}]});
        let c = build_with(settings, Some(file)).unwrap();
        let ClusterConfig::Mesh(mesh) = c.cluster else {
            panic!("not a mesh: {:?}", c.cluster)
        };
        let peers: Vec<_> = mesh.static_peers.iter().map(ToString::to_string).collect();
        assert_eq!(
            peers,
            ["http://peer-a:22281", "http://a:1", "https://[::1]:2"]
        );
        assert_eq!(
            mesh.dns,
            Some(("gorge-notification-headless".to_string(), 22281))
        );
        let e = build_with(
            Settings {
                peer_dns: Some("no-port".into()),
                ..Settings::default()
            },
            None,
        )
        .unwrap_err();
        assert_eq!(e.key, "GORGE_NOTIFICATION_PEER_DNS");
    }

    #[test]
    fn zero_limits_are_refused() {
        let e = load_env(&[("GORGE_NOTIFICATION_QUEUE_FRAMES", "0")]).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("GORGE_NOTIFICATION_QUEUE_FRAMES", "0")
        );
    }

    #[test]
    fn only_unchosen_non_loopback_admin_listeners_are_warned_about() {
        let mut config = load_env(&[]).unwrap();
        let server = |kind, addr: &str| ServerConfig::new(kind, addr.parse().unwrap());
        let chosen = |addr: &str| ServerConfig {
            listen_chosen: true,
            ..server(ServerKind::Admin, addr)
        };
        config.servers = vec![
            server(ServerKind::Admin, "127.0.0.1:1"),
            server(ServerKind::Admin, "[::1]:2"),
            server(ServerKind::Admin, "0.0.0.0:3"),
            server(ServerKind::Admin, "10.1.2.3:4"),
            server(ServerKind::Client, "0.0.0.0:5"),
            chosen("0.0.0.0:6"),
            chosen("10.1.2.3:7"),
        ];
        let exposed: Vec<String> = config
            .exposed_admin_addrs()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(exposed, ["0.0.0.0:3", "10.1.2.3:4"]);
    }

    /// What `--check-config` shows of `config` (values only, the file's own path left out),
    /// the listeners and the cluster: everything the server would run with.
    fn effective(config: &Config) -> Vec<String> {
        // The shared address and the peers' list are folded into `servers[]` and `cluster[]`,
        // which the lines of the servers and the peers show.
        let folded =
            ["CONFIG_FILE", "LISTEN_ADDR", "PEERS"].map(|k| format!("GORGE_NOTIFICATION_{k}"));
        let mut out: Vec<String> = check_lines(config)
            .into_iter()
            .filter(|line| !folded.contains(&line.name))
            .map(|line| format!("{} = {}", line.name, line.value))
            .collect();
        out.extend(
            config
                .servers
                .iter()
                .map(|s| format!("{} {}", s.kind, s.addr)),
        );
        out.push(format!("{:?}", config.cluster));
        out
    }

    /// Loads what `--print-config` printed for `config`, with no variable set.
    fn printed_and_loaded(config: &Config) -> Config {
        let dir = std::env::temp_dir().join(format!(
            "gorge-print-config-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("aphlict.json");
        let printed = serde_json::to_string_pretty(&print_config(config)).unwrap();
        std::fs::write(&path, &printed).unwrap();
        let loaded = load_from(Some(&path), &|_| None)
            .unwrap_or_else(|e| panic!("{e}\nprinted:\n{printed}"));
        std::fs::remove_dir_all(dir).unwrap();
        loaded
    }

    /// Every setting the file can hold, away from its default, in a mesh and in broker mode
    /// (which exclude each other): what `--print-config` prints loads back as the same
    /// configuration. Only a password is not printed (see the broker test below).
    #[test]
    fn print_config_loads_back_as_the_same_configuration() {
        let mesh = [
            ("GORGE_NOTIFICATION_CLIENT_PORT", "3000"),
            ("GORGE_NOTIFICATION_ADMIN_PORT", "3001"),
            ("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.2"),
            ("GORGE_NOTIFICATION_CLIENT_LISTEN_ADDR", "::1"),
            ("GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR", "127.0.0.3"),
            (
                "GORGE_NOTIFICATION_PEERS",
                "http://peer-a:22281,https://[::1]:2",
            ),
            ("GORGE_NOTIFICATION_PEER_DNS", "gorge-peers:22281"),
            ("GORGE_NOTIFICATION_PEER_DNS_REFRESH_SECONDS", "86400"),
            ("GORGE_NOTIFICATION_PEER_QUEUE_CAPACITY", "4294967296"),
            ("GORGE_NOTIFICATION_PEER_TIMEOUT_MS", "1"),
            ("GORGE_NOTIFICATION_MAX_FRAME_BYTES", "1024"),
            ("GORGE_NOTIFICATION_MAX_ADMIN_BODY_BYTES", "1099511627776"),
            ("GORGE_NOTIFICATION_INBOUND_FRAMES_PER_SECOND", "1"),
            ("GORGE_NOTIFICATION_INBOUND_FRAMES_BURST", "2"),
            ("GORGE_NOTIFICATION_INBOUND_BYTES_PER_SECOND", "3"),
            ("GORGE_NOTIFICATION_INBOUND_BYTES_BURST", "2048"),
            ("GORGE_NOTIFICATION_CLIENT_WORKER_NICE", "0"),
            ("GORGE_NOTIFICATION_MAX_SOCKETS", "5"),
            ("GORGE_NOTIFICATION_MAX_SUBSCRIPTIONS", "6"),
            ("GORGE_NOTIFICATION_MAX_PHID_BYTES", "7"),
            ("GORGE_NOTIFICATION_MAX_INSTANCES", "8"),
            ("GORGE_NOTIFICATION_MAX_INSTANCE_NAME_BYTES", "9"),
            ("GORGE_NOTIFICATION_QUEUE_FRAMES", "10"),
            ("GORGE_NOTIFICATION_QUEUE_BYTES", "11"),
            ("GORGE_NOTIFICATION_HISTORY_ENTRIES", "0"),
            ("GORGE_NOTIFICATION_HISTORY_AGE_MS", "12"),
            ("GORGE_NOTIFICATION_HISTORY_BYTES", "13"),
            ("GORGE_NOTIFICATION_PING_INTERVAL_SECONDS", "14"),
            ("GORGE_NOTIFICATION_IDLE_TIMEOUT_SECONDS", "15"),
            ("GORGE_NOTIFICATION_DRAIN_SECONDS", "0"),
        ];
        let dir = std::env::temp_dir().join(format!("gorge-round-trip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let password = dir.join("password");
        std::fs::write(&password, "hunter2\n").unwrap();
        let password = password.to_str().unwrap();
        let broker = [
            ("GORGE_NOTIFICATION_BROKER_URL", "redis://redis:6380/2"),
            ("GORGE_NOTIFICATION_BROKER_PASSWORD_FILE", password),
            ("GORGE_NOTIFICATION_BROKER_PREFIX", "phorge-b:notification"),
            ("GORGE_NOTIFICATION_BROKER_QUEUE_CAPACITY", "1"),
        ];
        // Every file key is set by one of the two.
        let set: Vec<String> = mesh
            .iter()
            .chain(&broker)
            .map(|(var, _)| var.to_string())
            .collect();
        for key in Settings::file_keys() {
            let var = Settings::env_var(key);
            // Files that must exist and hold PEM certificates.
            let skipped = [
                "GORGE_NOTIFICATION_BROKER_CA_FILE",
                "GORGE_NOTIFICATION_PEER_CA_FILE",
            ];
            assert!(
                set.contains(&var) || skipped.contains(&var.as_str()),
                "{var} is not set"
            );
        }
        for vars in [&mesh[..], &broker[..]] {
            let config = load_env(vars).unwrap();
            let loaded = printed_and_loaded(&config);
            assert_eq!(effective(&loaded), effective(&config), "{vars:?}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A broker URL is printed as it is, but for its password; `--check-config` masks only the
    /// password.
    #[test]
    fn only_the_password_of_the_broker_url_is_kept_out_of_print() {
        let url = |config: &Config| {
            check_lines(config)
                .into_iter()
                .find(|line| line.name == "GORGE_NOTIFICATION_BROKER_URL")
                .unwrap()
                .value
        };
        let plain = load_env(&[("GORGE_NOTIFICATION_BROKER_URL", "redis://redis:6379/0")]).unwrap();
        assert_eq!(url(&plain), "redis://redis:6379/0");
        assert_eq!(print_config(&plain)["broker_url"], "redis://redis:6379/0");
        assert!(matches!(
            printed_and_loaded(&plain).cluster,
            ClusterConfig::Broker(_)
        ));
        let with_password = load_env(&[(
            "GORGE_NOTIFICATION_BROKER_URL",
            "rediss://user:hunter2@redis:6380/2",
        )])
        .unwrap();
        assert_eq!(url(&with_password), "rediss://user:********@redis:6380/2");
        assert_eq!(
            print_config(&with_password)["broker_url"],
            "rediss://user@redis:6380/2"
        );
    }

    /// The ports and listen addresses `--check-config` shows are the ones in force, with
    /// where they came from, never `(unset)`.
    #[test]
    fn check_config_shows_the_ports_and_addresses_in_force() {
        let shown = |config: &Config| -> Vec<String> {
            check_lines(config)
                .into_iter()
                .filter(|line| line.name.ends_with("_PORT") || line.name.ends_with("_ADDR"))
                .map(|line| format!("{} = {}  # {}", line.name, line.value, line.source))
                .collect()
        };
        assert_eq!(
            shown(&load_env(&[]).unwrap()),
            [
                "GORGE_NOTIFICATION_CLIENT_PORT = 22280  # default",
                "GORGE_NOTIFICATION_ADMIN_PORT = 22281  # default",
                "GORGE_NOTIFICATION_LISTEN_ADDR = (unset: each kind keeps its own address)  # default",
                "GORGE_NOTIFICATION_CLIENT_LISTEN_ADDR = 0.0.0.0  # default",
                "GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR = 127.0.0.1  # default",
            ]
        );
        let file = json!({"servers": [
            {"type": "client", "port": 1000, "listen": "10.0.0.1"},
            {"type": "client", "port": 1001, "listen": "10.0.0.1"},
            {"type": "admin", "port": 1002},
        ]});
        let settings = Settings {
            listen_addr: Some("10.0.0.2".into()),
            ..Settings::default()
        };
        let mut layered = Layered::default();
        layered.values = settings;
        layered.set_source(
            "listen_addr",
            Source::Env("GORGE_NOTIFICATION_LISTEN_ADDR".into()),
        );
        let Value::Object(entries) = file else {
            unreachable!()
        };
        let path = Path::new("/etc/aphlict.json");
        let layer = parse_file(path, &entries, &mut layered).unwrap();
        let config = build(layered, layer, Some(path.to_path_buf())).unwrap();
        assert_eq!(
            shown(&config),
            [
                "GORGE_NOTIFICATION_CLIENT_PORT = 1000, 1001  # file /etc/aphlict.json",
                "GORGE_NOTIFICATION_ADMIN_PORT = 1002  # file /etc/aphlict.json",
                "GORGE_NOTIFICATION_LISTEN_ADDR = 10.0.0.2  # env GORGE_NOTIFICATION_LISTEN_ADDR",
                "GORGE_NOTIFICATION_CLIENT_LISTEN_ADDR = 10.0.0.2  # env GORGE_NOTIFICATION_LISTEN_ADDR",
                "GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR = 10.0.0.2  # env GORGE_NOTIFICATION_LISTEN_ADDR",
            ]
        );
    }

    /// A rule between two settings names the one the operator set, as they wrote it.
    #[test]
    fn a_refused_pair_names_the_setting_the_operator_set() {
        let refused = |vars: &[(&str, &str)]| {
            let e = load_env(vars).unwrap_err();
            (e.key, e.value)
        };
        let var = |name: &str| format!("GORGE_NOTIFICATION_{name}");
        assert_eq!(
            refused(&[("GORGE_NOTIFICATION_MAX_FRAME_BYTES", "4294967297")]),
            (var("MAX_FRAME_BYTES"), "4294967297".into())
        );
        let e = load_env(&[("GORGE_NOTIFICATION_MAX_FRAME_BYTES", "4294967297")]).unwrap_err();
        assert_eq!(
            e.reason,
            "must be at most GORGE_NOTIFICATION_INBOUND_BYTES_BURST (1048576 bytes), what a \
             socket may send at once: raise that too"
        );
        assert_eq!(
            refused(&[("GORGE_NOTIFICATION_INBOUND_BYTES_BURST", "1000")]),
            (var("INBOUND_BYTES_BURST"), "1000".into())
        );
        assert_eq!(
            refused(&[
                ("GORGE_NOTIFICATION_MAX_FRAME_BYTES", "2000"),
                ("GORGE_NOTIFICATION_INBOUND_BYTES_BURST", "1000"),
            ]),
            (var("INBOUND_BYTES_BURST"), "1000".into())
        );
        assert_eq!(
            refused(&[("GORGE_NOTIFICATION_PING_INTERVAL_SECONDS", "100")]),
            (var("PING_INTERVAL_SECONDS"), "100".into())
        );
        assert_eq!(
            refused(&[("GORGE_NOTIFICATION_IDLE_TIMEOUT_SECONDS", "30")]),
            (var("IDLE_TIMEOUT_SECONDS"), "30".into())
        );
    }

    /// A value from the file is named by its file key, as the operator wrote it there.
    #[test]
    fn a_file_value_is_named_by_its_file_key() {
        let cases = [
            (json!({"peer_dns": "no-port"}), "peer_dns", "no-port"),
            (json!({"peers": "ftp://a:1"}), "peers", "ftp://a:1"),
            (json!({"listen_addr": "nowhere"}), "listen_addr", "nowhere"),
            (json!({"admin_listen_addr": "x"}), "admin_listen_addr", "x"),
            (
                json!({"broker_url": "http://redis"}),
                "broker_url",
                "http://redis",
            ),
            (
                json!({"broker_url": "redis://r", "broker_prefix": "two words"}),
                "broker_prefix",
                "two words",
            ),
            (
                json!({"ping_interval_seconds": 90}),
                "ping_interval_seconds",
                "90",
            ),
        ];
        for (file, key, value) in cases {
            let e = file_error(file.clone());
            assert_eq!(
                (e.key.as_str(), e.value.as_str()),
                (format!("{key} (in /etc/aphlict.json)").as_str(), value),
                "{file}"
            );
        }
    }

    #[test]
    fn a_variable_spelt_as_a_file_key_gets_a_suggestion() {
        let c = build_with(
            Settings::default(),
            Some(json!({"gorge_listen_addr": "127.0.0.1", "GORGE_NOTIFICATION_PEER_DNS": "a:1"})),
        )
        .unwrap();
        let ignored: Vec<String> = c
            .ignored
            .iter()
            .map(|k| format!("{}: {}", k.key, k.reason))
            .collect();
        assert_eq!(
            ignored,
            [
                "gorge_listen_addr: unknown key (did you mean `listen_addr`?)",
                "GORGE_NOTIFICATION_PEER_DNS: unknown key (did you mean `peer_dns`?)",
            ]
        );
    }
}
