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
//! - [`derived`]: what follows from the settings (the stop bound);
//! - this module: layering, cross-setting validation, `--check-config`, `--print-config`.

mod aphlict_file;
pub mod derived;
mod peer_url;
pub mod settings;

use std::collections::HashSet;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gorge_hub::Limits;

use crate::budget::InboundLimits;
use gorge_service::config::{env_value, CheckLine, Secret, Source};
use gorge_service::settings::{unknown_env_warnings, Declared, Layered, LogVars};
use gorge_service::ConfigError;
use serde_json::Value;

#[allow(unused_imports)] // PeerProtocol: for the peer relay's tests
pub use peer_url::{PeerProtocol, PeerUrl};
pub use settings::Settings;

use aphlict_file::{parse_file, parse_listen, read_file, FileLayer};
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
}

impl ServerConfig {
    /// A server of `kind` on `addr` whose address nobody chose (a default).
    pub fn new(kind: ServerKind, addr: SocketAddr) -> ServerConfig {
        ServerConfig {
            kind,
            addr,
            listen_chosen: false,
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
}

/// Broker mode (spec §8b): the Redis that carries messages between nodes and keeps history.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The URL as given (it may hold a password: printed masked).
    pub url: Secret,
    /// From `BROKER_PASSWORD_FILE`; wins over a password in the URL.
    pub password: Option<Secret>,
    /// From `BROKER_CA_FILE`: the PEM of the CA(s) a `rediss://` broker's certificate must
    /// chain to, instead of the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Keys are `<prefix>:stream` and `<prefix>:epoch`.
    pub prefix: String,
    /// Messages waiting to be published, at most.
    pub queue_capacity: usize,
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
    pub peers: PeerConfig,
    /// Broker mode, when `BROKER_URL` is set (never together with peers).
    pub broker: Option<BrokerConfig>,
    pub config_file: Option<PathBuf>,
    pub ignored: Vec<IgnoredKey>,
    /// Logged at startup and printed by `--check-config`.
    pub warnings: Vec<String>,
    /// The flat settings as layered, and where each came from.
    pub settings: Layered<Settings>,
    /// `GORGE_LOG_*`, shown by `--check-config`.
    pub log: Layered<LogVars>,
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
}

/// The environment variable of a setting.
pub fn env_key(key: &str) -> String {
    Settings::env_var(key)
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
    let mut layered = Layered::<Settings>::default();
    let config_var = env_key("config_file");
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
            layered.set_source("config_file", Source::Option("--config".into()));
            (Some(path.to_path_buf()), "--config".to_string())
        }
        (None, Some(path)) => {
            layered.set_source("config_file", Source::Env(config_var.clone()));
            (Some(PathBuf::from(path)), config_var)
        }
        (None, None) => (None, String::new()),
    };
    layered.values.config_file = file_path.as_ref().map(|p| p.display().to_string());
    let file = match &file_path {
        Some(path) => parse_file(path, &read_file(path, &named_by)?, &mut layered)?,
        None => FileLayer::default(),
    };
    layered.apply_env(env, &["config_file"])?;
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
    let settings = &layered.values;
    let client_port = settings.client_port;
    let admin_port = settings.admin_port;
    let listen = |key: &str, value: &Option<String>| {
        value
            .as_deref()
            .map(|s| parse_listen(&env_key(key), s))
            .transpose()
    };
    let shared_listen = listen("listen_addr", &settings.listen_addr)?;
    let client_listen = listen("client_listen_addr", &settings.client_listen_addr)?;
    let admin_listen = listen("admin_listen_addr", &settings.admin_listen_addr)?;

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
            static_peers.push(parse_peer_url(&env_key("peers"), part)?);
        }
    }
    let mut unique = HashSet::new();
    static_peers.retain(|p| unique.insert(p.clone()));
    let dns = match &settings.peer_dns {
        Some(text) => {
            let key = env_key("peer_dns");
            let bad = || ConfigError::new(&key, text, "expected host:port, e.g. gorge-peers:22281");
            let (host, port) = split_host_port(text.trim()).ok_or_else(bad)?;
            Some((host, parse_port_text(port).ok_or_else(bad)?))
        }
        None => None,
    };

    let broker = broker_config(settings, !static_peers.is_empty() || dns.is_some())?;

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
    if s.idle_timeout_seconds <= s.ping_interval_seconds {
        return Err(ConfigError::new(
            env_key("idle_timeout_seconds"),
            s.idle_timeout_seconds,
            format!(
                "must be longer than the ping interval ({} s)",
                s.ping_interval_seconds
            ),
        ));
    }
    if s.inbound_bytes_burst < s.max_frame_bytes {
        return Err(ConfigError::new(
            env_key("inbound_bytes_burst"),
            s.inbound_bytes_burst,
            format!(
                "must be at least the largest frame (MAX_FRAME_BYTES, {} bytes)",
                s.max_frame_bytes
            ),
        ));
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
        peers: PeerConfig {
            static_peers,
            dns,
            dns_refresh: Duration::from_secs(s.peer_dns_refresh_seconds),
            queue_capacity: usize_of(s.peer_queue_capacity),
            timeout: Duration::from_millis(s.peer_timeout_ms),
            keep_for: Duration::from_millis(s.history_age_ms),
        },
        broker,
        config_file,
        ignored: file.ignored,
        warnings: Vec::new(),
        settings: layered,
        log: Layered::default(),
        servers_source,
    })
}

/// Broker mode's settings, validated: a `redis://` or `rediss://` URL the client accepts, a
/// readable password file, a usable prefix, and no peers (both would deliver every message).
fn broker_config(
    settings: &Settings,
    has_peers: bool,
) -> Result<Option<BrokerConfig>, ConfigError> {
    let url_key = env_key("broker_url");
    let Some(url) = settings.broker_url.clone().filter(|url| !url.is_empty()) else {
        return Ok(None);
    };
    if has_peers {
        return Err(ConfigError::new(
            &url_key,
            &url,
            "cannot be combined with peers (GORGE_NOTIFICATION_PEERS, GORGE_NOTIFICATION_PEER_DNS \
             or the file's cluster[]): both would deliver every message; use one",
        ));
    }
    let password = match &settings.broker_password_file {
        Some(path) => {
            let key = env_key("broker_password_file");
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError::new(&key, path, format!("cannot be read: {e}")))?;
            let line = text.trim_end_matches(['\r', '\n']);
            if line.is_empty() || line.contains('\n') {
                return Err(ConfigError::new(&key, path, "must hold one non-empty line"));
            }
            Some(Secret::new(line))
        }
        None => None,
    };
    let ca_pem = match &settings.broker_ca_file {
        Some(path) => {
            let key = env_key("broker_ca_file");
            let pem = std::fs::read(path)
                .map_err(|e| ConfigError::new(&key, path, format!("cannot be read: {e}")))?;
            if !url.expose().starts_with("rediss://") {
                return Err(ConfigError::new(
                    &key,
                    path,
                    "is only for a rediss:// (TLS) GORGE_NOTIFICATION_BROKER_URL",
                ));
            }
            Some(pem)
        }
        None => None,
    };
    let broker = BrokerConfig {
        url,
        password,
        ca_pem,
        prefix: settings.broker_prefix.trim().to_string(),
        queue_capacity: usize_of(settings.broker_queue_capacity),
    };
    if let Err(why) = crate::broker::connection_info(&broker) {
        return Err(ConfigError::new(&url_key, &broker.url, why));
    }
    // Only a CA can make the client unusable once the URL is valid: build it now with the
    // CA, so that a file that is no usable CA stops startup here.
    if let Some(path) = settings.broker_ca_file.as_deref() {
        if let Err(why) = crate::broker::client(&broker) {
            return Err(ConfigError::new(env_key("broker_ca_file"), path, why));
        }
    }
    if broker.prefix.is_empty() || broker.prefix.contains(char::is_whitespace) {
        return Err(ConfigError::new(
            env_key("broker_prefix"),
            &settings.broker_prefix,
            "must be non-empty, without spaces (e.g. gorge:notification)",
        ));
    }
    Ok(Some(broker))
}

/// The `--check-config` lines: servers, peers, every flat setting with its source, then the
/// logging variables.
pub fn check_lines(config: &Config) -> Vec<CheckLine> {
    let mut lines = Vec::new();
    let env_source =
        |key: &str| Some(config.settings.source(key)).filter(|s| matches!(s, Source::Env(_)));
    for (i, server) in config.servers.iter().enumerate() {
        let (port_key, listen_key) = match server.kind {
            ServerKind::Client => ("client_port", "client_listen_addr"),
            ServerKind::Admin => ("admin_port", "admin_listen_addr"),
        };
        lines.push(CheckLine {
            name: format!("servers[{i}]"),
            value: format!("{} {}", server.kind, server.addr),
            source: env_source(port_key)
                .or_else(|| env_source(listen_key))
                .or_else(|| env_source("listen_addr"))
                .unwrap_or_else(|| config.servers_source.clone()),
        });
    }
    let peers: Vec<String> = config
        .peers
        .static_peers
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
    // The flat settings, then each derived fact on its line.
    lines.extend(gorge_service::derived::check_lines(
        config,
        &config.settings,
    ));
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
    let exposed = crate::service::exposed_admin_addrs(config)
        .into_iter()
        .map(|addr| {
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
                "ssl.key": null,
                "ssl.cert": null,
                "ssl.chain": null,
            })
        })
        .collect();
    out.insert("servers".into(), Value::from(servers));
    let cluster: Vec<Value> = config
        .peers
        .static_peers
        .iter()
        .map(|p| serde_json::json!({"host": p.host, "port": p.port, "protocol": p.protocol.to_string()}))
        .collect();
    out.insert("cluster".into(), Value::from(cluster));
    for (info, value) in Settings::SETTINGS
        .iter()
        .zip(config.settings.values.file_values())
    {
        // Folded into servers[] and cluster[] above.
        let folded = matches!(
            info.key,
            "client_port"
                | "admin_port"
                | "listen_addr"
                | "client_listen_addr"
                | "admin_listen_addr"
                | "peers"
        );
        if !info.env_only && !folded {
            out.insert(info.key.into(), value);
        }
    }
    // Not settings: what follows from them (a file with this key loads back unchanged).
    out.insert(
        aphlict_file::DERIVED_KEY.into(),
        gorge_service::derived::json(config, &config.settings),
    );
    Value::Object(out)
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
        assert!(load_env(&[]).unwrap().broker.is_none());
        let c =
            load_env(&[("GORGE_NOTIFICATION_BROKER_URL", "rediss://u:p@redis:6380/2")]).unwrap();
        let broker = c.broker.unwrap();
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
        let info = crate::broker::connection_info(&c.broker.unwrap()).unwrap();
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
        assert_eq!(c.peers.timeout, Duration::from_secs(5));
        assert!(c.peers.static_peers.is_empty());
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
        assert_eq!(c.peers.static_peers[0].to_string(), "http://peer-a:22281");
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

    #[test]
    fn ssl_is_a_startup_error() {
        let e = file_error(
            json!({"servers": [{"type": "client", "port": 22280, "ssl.key": "/k.pem"}, {"type": "admin", "port": 22281}]}),
        );
        assert_eq!(e.key, "servers[0].ssl.key");
        assert_eq!(e.value, "/k.pem");
        assert!(e.reason.contains("terminate TLS"), "{e}");
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
        let peers: Vec<_> = c
            .peers
            .static_peers
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            peers,
            ["http://peer-a:22281", "http://a:1", "https://[::1]:2"]
        );
        assert_eq!(
            c.peers.dns,
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
}
