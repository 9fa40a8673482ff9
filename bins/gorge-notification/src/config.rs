//! Configuration: built-in defaults, then an Aphlict-format JSON file (`--config PATH` or
//! `GORGE_NOTIFICATION_CONFIG_FILE`), then `GORGE_NOTIFICATION_*` environment variables
//! (an empty variable means "use the default").
//!
//! Every invalid value stops startup with one line naming the key and the value (exit 2):
//! a notification server that silently falls back to some other port or to plain text where
//! TLS was configured breaks every browser without any error anyone would see.

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::Serialized;
use figment::Figment;
use gorge_hub::Limits;
use gorge_service::config::{env_layer, extract};
use gorge_service::ConfigError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Prefix of every environment variable of this service.
pub const ENV_PREFIX: &str = "GORGE_NOTIFICATION_";

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
}

/// A peer's admin port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerUrl {
    /// `http` or `https` (validated when parsed).
    pub protocol: String,
    pub host: String,
    pub port: u16,
}

impl fmt::Display for PeerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}://[{}]:{}", self.protocol, self.host, self.port)
        } else {
            write!(f, "{}://{}:{}", self.protocol, self.host, self.port)
        }
    }
}

/// Everything the peer relay needs (spec §8).
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
}

/// A setting that was accepted but ignored; logged once at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredKey {
    pub key: String,
    pub reason: &'static str,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub servers: Vec<ServerConfig>,
    pub hub: Limits,
    /// Largest inbound WebSocket frame/message.
    pub max_frame_bytes: usize,
    pub max_admin_body_bytes: usize,
    pub ping_interval: Duration,
    pub idle_timeout: Duration,
    /// Close frames are spread over this window on SIGTERM.
    pub drain_window: Duration,
    pub peers: PeerConfig,
    pub config_file: Option<PathBuf>,
    pub ignored: Vec<IgnoredKey>,
}

impl Config {
    /// The first admin listener's address (where `healthcheck` probes by default).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.servers
            .iter()
            .find(|s| s.kind == ServerKind::Admin)
            .map(|s| s.addr)
    }

    /// Hard bound of the whole drain: the window plus five seconds.
    pub fn drain_deadline(&self) -> Duration {
        self.drain_window + Duration::from_secs(5)
    }
}

/// The flat settings that environment variables set (and defaults fill in).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Settings {
    config_file: Option<String>,
    client_port: Option<u64>,
    admin_port: Option<u64>,
    listen_addr: Option<String>,
    peers: Option<String>,
    peer_dns: Option<String>,
    peer_dns_refresh_seconds: u64,
    peer_queue_capacity: usize,
    peer_timeout_ms: u64,
    max_frame_bytes: usize,
    max_admin_body_bytes: usize,
    max_sockets: usize,
    max_subscriptions: usize,
    max_phid_bytes: usize,
    max_instances: usize,
    max_instance_name_bytes: usize,
    queue_frames: usize,
    queue_bytes: usize,
    history_entries: usize,
    history_age_ms: u64,
    history_bytes: usize,
    ping_interval_seconds: u64,
    idle_timeout_seconds: u64,
    drain_seconds: u64,
}

impl Default for Settings {
    fn default() -> Self {
        let hub = Limits::default();
        Settings {
            config_file: None,
            client_port: None,
            admin_port: None,
            listen_addr: None,
            peers: None,
            peer_dns: None,
            peer_dns_refresh_seconds: 10,
            peer_queue_capacity: 1024,
            peer_timeout_ms: 5000,
            max_frame_bytes: 64 * 1024,
            max_admin_body_bytes: 1 << 20,
            max_sockets: hub.sockets,
            max_subscriptions: hub.subscriptions_per_socket,
            max_phid_bytes: hub.phid_bytes,
            max_instances: hub.instances,
            max_instance_name_bytes: hub.instance_name_bytes,
            queue_frames: hub.queue_frames,
            queue_bytes: hub.queue_bytes,
            history_entries: hub.history_entries,
            history_age_ms: hub.history_age_ms,
            history_bytes: hub.history_bytes,
            ping_interval_seconds: 30,
            idle_timeout_seconds: 75,
            drain_seconds: 10,
        }
    }
}

fn env_key(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.to_uppercase())
}

/// Loads the configuration from `cli_file` (if given), the environment and the defaults.
pub fn load(cli_file: Option<&Path>) -> Result<Config, ConfigError> {
    let figment =
        Figment::from(Serialized::defaults(Settings::default())).merge(env_layer(ENV_PREFIX));
    let settings: Settings = extract(&figment, ENV_PREFIX)?;
    let file_path = cli_file
        .map(Path::to_path_buf)
        .or_else(|| settings.config_file.as_ref().map(PathBuf::from));
    let file = match &file_path {
        Some(path) => Some(read_file(path)?),
        None => None,
    };
    build(settings, file, file_path)
}

fn read_file(path: &Path) -> Result<Value, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("--config", &shown, format!("cannot read file: {e}")))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| ConfigError::new("--config", &shown, format!("not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ConfigError::new(
            "--config",
            shown,
            "the file must hold a JSON object",
        ));
    }
    Ok(value)
}

/// What the Aphlict file contributes.
#[derive(Debug, Default)]
struct FileLayer {
    servers: Option<Vec<ServerConfig>>,
    cluster: Vec<PeerUrl>,
    ignored: Vec<IgnoredKey>,
}

fn json_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn parse_file(file: &Value) -> Result<FileLayer, ConfigError> {
    let mut layer = FileLayer::default();
    let Some(object) = file.as_object() else {
        return Ok(layer);
    };
    for (key, value) in object {
        match key.as_str() {
            "servers" => layer.servers = Some(parse_servers(value)?),
            "cluster" => layer.cluster = parse_cluster(value)?,
            "logs" | "pidfile" | "memory.hint" => layer.ignored.push(IgnoredKey {
                key: key.clone(),
                reason: match key.as_str() {
                    "logs" => "logs go to stdout",
                    "pidfile" => "no pidfile is written; the supervisor tracks the process",
                    _ => "memory is bounded by the configured limits",
                },
            }),
            _ => layer.ignored.push(IgnoredKey {
                key: key.clone(),
                reason: "unknown key",
            }),
        }
    }
    Ok(layer)
}

fn parse_port(key: &str, value: &Value) -> Result<u16, ConfigError> {
    value
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| ConfigError::new(key, json_text(value), "port must be 1-65535"))
}

fn parse_listen(key: &str, value: &str) -> Result<IpAddr, ConfigError> {
    value
        .parse()
        .map_err(|_| ConfigError::new(key, value, "must be an IP address to listen on (host only)"))
}

fn parse_servers(value: &Value) -> Result<Vec<ServerConfig>, ConfigError> {
    let Some(items) = value.as_array() else {
        return Err(ConfigError::new(
            "servers",
            json_text(value),
            "must be a list",
        ));
    };
    let mut servers = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = |field: &str| format!("servers[{i}].{field}");
        let Some(entry) = item.as_object() else {
            return Err(ConfigError::new(
                format!("servers[{i}]"),
                json_text(item),
                "must be an object",
            ));
        };
        for ssl in ["ssl.key", "ssl.cert", "ssl.chain"] {
            if let Some(v) = entry.get(ssl).filter(|v| !v.is_null()) {
                return Err(ConfigError::new(
                    at(ssl),
                    json_text(v),
                    "TLS is not served here: terminate TLS in front of gorge-notification \
                     (ingress or proxy) and set ssl.* to null",
                ));
            }
        }
        let kind = match entry.get("type") {
            Some(Value::String(t)) if t == "client" => ServerKind::Client,
            Some(Value::String(t)) if t == "admin" => ServerKind::Admin,
            other => {
                return Err(ConfigError::new(
                    at("type"),
                    other.map(json_text).unwrap_or_default(),
                    "must be \"client\" or \"admin\"",
                ))
            }
        };
        let port = match entry.get("port") {
            Some(v) => parse_port(&at("port"), v)?,
            None => return Err(ConfigError::new(at("port"), "", "missing")),
        };
        let ip = match entry.get("listen") {
            None | Some(Value::Null) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            Some(Value::String(s)) => parse_listen(&at("listen"), s)?,
            Some(other) => {
                return Err(ConfigError::new(
                    at("listen"),
                    json_text(other),
                    "must be a string",
                ))
            }
        };
        servers.push(ServerConfig {
            kind,
            addr: SocketAddr::new(ip, port),
        });
    }
    Ok(servers)
}

fn parse_cluster(value: &Value) -> Result<Vec<PeerUrl>, ConfigError> {
    let Some(items) = value.as_array() else {
        return Err(ConfigError::new(
            "cluster",
            json_text(value),
            "must be a list",
        ));
    };
    let mut peers = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = |field: &str| format!("cluster[{i}].{field}");
        let Some(entry) = item.as_object() else {
            return Err(ConfigError::new(
                format!("cluster[{i}]"),
                json_text(item),
                "must be an object",
            ));
        };
        let host = match entry.get("host") {
            Some(Value::String(h)) if !h.is_empty() => h.clone(),
            other => {
                return Err(ConfigError::new(
                    at("host"),
                    other.map(json_text).unwrap_or_default(),
                    "must be a non-empty host name",
                ))
            }
        };
        let port = match entry.get("port") {
            Some(v) => parse_port(&at("port"), v)?,
            None => return Err(ConfigError::new(at("port"), "", "missing")),
        };
        let protocol = match entry.get("protocol") {
            None | Some(Value::Null) => "http".to_string(),
            Some(Value::String(p)) if p == "http" || p == "https" => p.clone(),
            Some(other) => {
                return Err(ConfigError::new(
                    at("protocol"),
                    json_text(other),
                    "must be \"http\" or \"https\"",
                ))
            }
        };
        peers.push(PeerUrl {
            protocol,
            host,
            port,
        });
    }
    Ok(peers)
}

/// Parses `http://host:port` (a trailing `/` is allowed; nothing else after the port).
fn parse_peer_url(key: &str, text: &str) -> Result<PeerUrl, ConfigError> {
    let bad = |reason: &str| ConfigError::new(key, text, reason.to_string());
    let (protocol, rest) = if let Some(rest) = text.strip_prefix("http://") {
        ("http", rest)
    } else if let Some(rest) = text.strip_prefix("https://") {
        ("https", rest)
    } else {
        return Err(bad("peer URL must start with http:// or https://"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) =
        split_host_port(rest).ok_or_else(|| bad("peer URL must be http://host:port"))?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| bad("peer port must be 1-65535"))?;
    Ok(PeerUrl {
        protocol: protocol.to_string(),
        host,
        port,
    })
}

/// Splits `host:port` or `[v6]:port`; the host must be non-empty and free of `/`, `@`, `?`.
fn split_host_port(text: &str) -> Option<(String, &str)> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':')?)
    } else {
        text.rsplit_once(':')?
    };
    let bad_char =
        |c: char| matches!(c, '/' | '@' | '?' | '#' | ' ') || (c == ':' && !text.starts_with('['));
    if host.is_empty() || host.contains(bad_char) {
        return None;
    }
    Some((host.to_string(), port))
}

fn positive<T: PartialOrd + Default + fmt::Display + Copy>(
    key: &str,
    value: T,
) -> Result<T, ConfigError> {
    if value > T::default() {
        Ok(value)
    } else {
        Err(ConfigError::new(
            env_key(key),
            value,
            "must be greater than 0",
        ))
    }
}

fn env_port(key: &str, value: Option<u64>) -> Result<Option<u16>, ConfigError> {
    value
        .map(|p| {
            u16::try_from(p)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| ConfigError::new(env_key(key), p, "port must be 1-65535"))
        })
        .transpose()
}

fn build(
    settings: Settings,
    file: Option<Value>,
    config_file: Option<PathBuf>,
) -> Result<Config, ConfigError> {
    let file = match &file {
        Some(value) => parse_file(value)?,
        None => FileLayer::default(),
    };
    let client_port = env_port("client_port", settings.client_port)?;
    let admin_port = env_port("admin_port", settings.admin_port)?;
    let listen = settings
        .listen_addr
        .as_deref()
        .map(|s| parse_listen(&env_key("listen_addr"), s))
        .transpose()?;

    let mut servers = file.servers.unwrap_or_else(|| {
        vec![
            ServerConfig {
                kind: ServerKind::Client,
                addr: SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), DEFAULT_CLIENT_PORT),
            },
            ServerConfig {
                kind: ServerKind::Admin,
                addr: SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), DEFAULT_HEALTH_PORT),
            },
        ]
    });
    // The environment wins over the file: it overrides every server of the kind it names.
    for server in &mut servers {
        let port = match server.kind {
            ServerKind::Client => client_port,
            ServerKind::Admin => admin_port,
        };
        if let Some(port) = port {
            server.addr.set_port(port);
        }
        if let Some(ip) = listen {
            server.addr.set_ip(ip);
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
            let bad = || ConfigError::new(&key, text, "must be host:port");
            let (host, port) = split_host_port(text.trim()).ok_or_else(bad)?;
            let port = port
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(bad)?;
            Some((host, port))
        }
        None => None,
    };

    let hub = Limits {
        queue_frames: positive("queue_frames", settings.queue_frames)?,
        queue_bytes: positive("queue_bytes", settings.queue_bytes)?,
        history_entries: settings.history_entries,
        history_age_ms: positive("history_age_ms", settings.history_age_ms)?,
        history_bytes: positive("history_bytes", settings.history_bytes)?,
        subscriptions_per_socket: positive("max_subscriptions", settings.max_subscriptions)?,
        phid_bytes: positive("max_phid_bytes", settings.max_phid_bytes)?,
        instances: positive("max_instances", settings.max_instances)?,
        instance_name_bytes: positive("max_instance_name_bytes", settings.max_instance_name_bytes)?,
        sockets: positive("max_sockets", settings.max_sockets)?,
        ..Limits::default()
    };
    let ping = positive("ping_interval_seconds", settings.ping_interval_seconds)?;
    let idle = positive("idle_timeout_seconds", settings.idle_timeout_seconds)?;
    if idle <= ping {
        return Err(ConfigError::new(
            env_key("idle_timeout_seconds"),
            idle,
            "must be longer than the ping interval",
        ));
    }
    Ok(Config {
        servers,
        hub,
        max_frame_bytes: positive("max_frame_bytes", settings.max_frame_bytes)?,
        max_admin_body_bytes: positive("max_admin_body_bytes", settings.max_admin_body_bytes)?,
        ping_interval: Duration::from_secs(ping),
        idle_timeout: Duration::from_secs(idle),
        drain_window: Duration::from_secs(settings.drain_seconds),
        peers: PeerConfig {
            static_peers,
            dns,
            dns_refresh: Duration::from_secs(positive(
                "peer_dns_refresh_seconds",
                settings.peer_dns_refresh_seconds,
            )?),
            queue_capacity: positive("peer_queue_capacity", settings.peer_queue_capacity)?,
            timeout: Duration::from_millis(positive("peer_timeout_ms", settings.peer_timeout_ms)?),
        },
        config_file,
        ignored: file.ignored,
    })
}

/// The effective configuration as printed by `--check-config` (no secrets exist here).
pub fn describe(config: &Config) -> Value {
    let servers: Vec<Value> = config
        .servers
        .iter()
        .map(|s| serde_json::json!({"type": s.kind.to_string(), "listen": s.addr.ip().to_string(), "port": s.addr.port()}))
        .collect();
    let h = &config.hub;
    serde_json::json!({
        "config_file": config.config_file.as_ref().map(|p| p.display().to_string()),
        "servers": servers,
        "peers": config.peers.static_peers.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "peer_dns": config.peers.dns.as_ref().map(|(h, p)| format!("{h}:{p}")),
        "peer_dns_refresh_seconds": config.peers.dns_refresh.as_secs(),
        "peer_queue_capacity": config.peers.queue_capacity,
        "peer_timeout_ms": config.peers.timeout.as_millis() as u64,
        "max_frame_bytes": config.max_frame_bytes,
        "max_admin_body_bytes": config.max_admin_body_bytes,
        "max_sockets": h.sockets,
        "max_subscriptions": h.subscriptions_per_socket,
        "max_phid_bytes": h.phid_bytes,
        "max_instances": h.instances,
        "max_instance_name_bytes": h.instance_name_bytes,
        "queue_frames": h.queue_frames,
        "queue_bytes": h.queue_bytes,
        "history_entries": h.history_entries,
        "history_age_ms": h.history_age_ms,
        "history_bytes": h.history_bytes,
        "ping_interval_seconds": config.ping_interval.as_secs(),
        "idle_timeout_seconds": config.idle_timeout.as_secs(),
        "drain_seconds": config.drain_window.as_secs(),
        "ignored_file_keys": config.ignored.iter().map(|k| k.key.clone()).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build_with(settings: Settings, file: Option<Value>) -> Result<Config, ConfigError> {
        build(settings, file, None)
    }

    #[test]
    fn defaults() {
        let c = build_with(Settings::default(), None).unwrap();
        assert_eq!(
            c.servers,
            vec![
                ServerConfig {
                    kind: ServerKind::Client,
                    addr: "0.0.0.0:22280".parse().unwrap()
                },
                ServerConfig {
                    kind: ServerKind::Admin,
                    addr: "0.0.0.0:22281".parse().unwrap()
                },
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
        let e = build_with(
            Settings {
                client_port: Some(70000),
                ..Settings::default()
            },
            None,
        )
        .unwrap_err();
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
            let e = build_with(
                Settings {
                    peers: Some(format!("http://ok:1,{bad}")),
                    ..Settings::default()
                },
                None,
            )
            .unwrap_err();
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
        let e = build_with(
            Settings {
                queue_frames: 0,
                ..Settings::default()
            },
            None,
        )
        .unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("GORGE_NOTIFICATION_QUEUE_FRAMES", "0")
        );
    }
}
