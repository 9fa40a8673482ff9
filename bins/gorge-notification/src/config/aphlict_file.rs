//! The Aphlict-format JSON file: `servers[]` and `cluster[]` as Aphlict reads them, Aphlict's
//! own keys that have no effect here (`logs`, `pidfile`, `memory.hint`), and the flat
//! settings under their keys (`"max_sockets": 100000`, applied by the shared declaration),
//! which Aphlict itself ignores.
//!
//! `ssl.key`, `ssl.cert` and `ssl.chain` turn TLS on for their server entry, as Aphlict
//! (see [`crate::tls`]).
//!
//! An unknown key inside a `servers[]` or `cluster[]` entry is refused with a did-you-mean:
//! `"lisen": "127.0.0.1"` would otherwise leave the unauthenticated admin port on 0.0.0.0.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use gorge_service::config::unknown_key_reason;
use gorge_service::settings::{self, Declared, FileFormat, Kind, Layered, Port};
use gorge_service::ConfigError;
use serde_json::{Map, Value};

use super::peer_url::{PeerProtocol, PeerUrl};
use super::{IgnoredKey, ServerConfig, ServerKind, Settings, TlsSettings};

/// Keys of a `servers[]` entry.
const SERVER_KEYS: [&str; 6] = ["type", "port", "listen", "ssl.key", "ssl.cert", "ssl.chain"];
/// The TLS keys of a `servers[]` entry, as Aphlict reads them.
const SSL_KEYS: [&str; 3] = ["ssl.key", "ssl.cert", "ssl.chain"];
/// Keys of a `cluster[]` entry.
const CLUSTER_KEYS: [&str; 3] = ["host", "port", "protocol"];
/// Aphlict's top-level keys that mean nothing here, and why.
const IGNORED_KEYS: [(&str, &str); 3] = [
    ("logs", "logs go to stdout"),
    (
        "pidfile",
        "no pidfile is written; the supervisor tracks the process",
    ),
    ("memory.hint", "memory is bounded by the configured limits"),
];

/// The key under which `--print-config` writes the derived facts (not settings).
pub const DERIVED_KEY: &str = "derived";

/// What the file contributes besides the flat settings.
#[derive(Debug, Default)]
pub struct FileLayer {
    pub servers: Option<Vec<ServerConfig>>,
    pub cluster: Vec<PeerUrl>,
    pub ignored: Vec<IgnoredKey>,
}

/// Reads the Aphlict file at `path`, named by `named_by` (for errors about the file itself).
pub fn read_file(path: &Path, named_by: &str) -> Result<Map<String, Value>, ConfigError> {
    settings::read_file(path, named_by, &[FileFormat::Json])
}

fn json_text(value: &Value) -> String {
    settings::value_text(value)
}

/// Applies the file's flat settings to `layered` and returns what else it says.
pub fn parse_file(
    path: &Path,
    file: &Map<String, Value>,
    layered: &mut Layered<Settings>,
) -> Result<FileLayer, ConfigError> {
    let mut layer = FileLayer::default();
    for (key, value) in layered.apply_file(path, file)? {
        if let Some((_, reason)) = IGNORED_KEYS.iter().find(|(k, _)| *k == key) {
            layer.ignored.push(IgnoredKey {
                key,
                reason: (*reason).to_string(),
            });
            continue;
        }
        match key.as_str() {
            // What `--print-config` derived from the settings: informational, never read.
            DERIVED_KEY => {}
            "servers" => layer.servers = Some(parse_servers(&value)?),
            "cluster" => layer.cluster = parse_cluster(&value)?,
            _ => {
                let known = ["servers", "cluster"]
                    .into_iter()
                    .chain(IGNORED_KEYS.iter().map(|(k, _)| *k))
                    .chain(Settings::file_keys());
                layer.ignored.push(IgnoredKey {
                    reason: unknown_key_reason(&key, known),
                    key,
                });
            }
        }
    }
    Ok(layer)
}

fn entries<'a>(name: &str, value: &'a Value) -> Result<Vec<&'a Map<String, Value>>, ConfigError> {
    let Some(items) = value.as_array() else {
        return Err(ConfigError::new(name, json_text(value), "expected a list"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.as_object().ok_or_else(|| {
                // `cluster: ["http://a:22281"]` is the natural guess; say what Aphlict reads.
                let hint = match (name, item.as_str()) {
                    ("cluster", Some(_)) => format!(
                        r#" like {{"host": "a", "port": 22281, "protocol": "http"}} (Aphlict's format); a list of URLs goes in {}"#,
                        Settings::env_var(Settings::KEYS.peers)
                    ),
                    _ => String::new(),
                };
                ConfigError::new(
                    format!("{name}[{i}]"),
                    json_text(item),
                    format!("expected an object{hint}"),
                )
            })
        })
        .collect()
}

fn refuse_unknown(at: &str, entry: &Map<String, Value>, known: &[&str]) -> Result<(), ConfigError> {
    match entry.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(ConfigError::new(
            format!("{at}.{key}"),
            json_text(&entry[key]),
            unknown_key_reason(key, known.iter().copied()),
        )),
        None => Ok(()),
    }
}

fn parse_port(key: &str, value: Option<&Value>) -> Result<u16, ConfigError> {
    let Some(value) = value else {
        return Err(ConfigError::new(
            key,
            "",
            format!("missing: expected {}", Port::VALID),
        ));
    };
    Port::from_file(value).map_err(|reason| ConfigError::new(key, json_text(value), reason))
}

pub fn parse_listen(key: &str, value: &str) -> Result<IpAddr, ConfigError> {
    value.parse().map_err(|_| {
        ConfigError::new(
            key,
            value,
            "expected an IP address to listen on, e.g. 0.0.0.0 or 127.0.0.1 (no port)",
        )
    })
}

fn parse_servers(value: &Value) -> Result<Vec<ServerConfig>, ConfigError> {
    let mut servers = Vec::new();
    for (i, entry) in entries("servers", value)?.into_iter().enumerate() {
        let at = |field: &str| format!("servers[{i}].{field}");
        refuse_unknown(&format!("servers[{i}]"), entry, &SERVER_KEYS)?;
        let mut ssl = [None, None, None];
        for (slot, name) in ssl.iter_mut().zip(SSL_KEYS) {
            *slot = match entry.get(name) {
                None | Some(Value::Null) => None,
                Some(Value::String(path)) if !path.is_empty() => Some(PathBuf::from(path)),
                Some(other) => {
                    return Err(ConfigError::new(
                        at(name),
                        json_text(other),
                        "expected the path of a PEM file as a string, or null",
                    ))
                }
            };
        }
        let kind = match entry.get("type") {
            Some(Value::String(t)) if t == "client" => ServerKind::Client,
            Some(Value::String(t)) if t == "admin" => ServerKind::Admin,
            other => {
                return Err(ConfigError::new(
                    at("type"),
                    other.map(json_text).unwrap_or_default(),
                    "expected \"client\" or \"admin\"",
                ))
            }
        };
        let port = parse_port(&at("port"), entry.get("port"))?;
        // Aphlict listens on every interface when `listen` is absent.
        let (ip, listen_chosen) = match entry.get("listen") {
            None | Some(Value::Null) => (IpAddr::V4(Ipv4Addr::UNSPECIFIED), false),
            Some(Value::String(s)) => (parse_listen(&at("listen"), s)?, true),
            Some(other) => {
                return Err(ConfigError::new(
                    at("listen"),
                    json_text(other),
                    "expected an IP address as a string, e.g. \"127.0.0.1\"",
                ))
            }
        };
        let [key, cert, chain] = ssl;
        servers.push(ServerConfig {
            kind,
            addr: SocketAddr::new(ip, port),
            listen_chosen,
            tls: TlsSettings {
                cert: cert.map(|path| (path, at("ssl.cert"))),
                key: key.map(|path| (path, at("ssl.key"))),
                chain: chain.map(|path| (path, at("ssl.chain"))),
            },
        });
    }
    Ok(servers)
}

fn parse_cluster(value: &Value) -> Result<Vec<PeerUrl>, ConfigError> {
    let mut peers = Vec::new();
    for (i, entry) in entries("cluster", value)?.into_iter().enumerate() {
        let at = |field: &str| format!("cluster[{i}].{field}");
        refuse_unknown(&format!("cluster[{i}]"), entry, &CLUSTER_KEYS)?;
        let host = match entry.get("host") {
            Some(Value::String(h)) if !h.is_empty() => h.clone(),
            other => {
                return Err(ConfigError::new(
                    at("host"),
                    other.map(json_text).unwrap_or_default(),
                    "expected a non-empty host name",
                ))
            }
        };
        let port = parse_port(&at("port"), entry.get("port"))?;
        let protocol = match entry.get("protocol") {
            None | Some(Value::Null) => PeerProtocol::Http,
            Some(other) => other
                .as_str()
                .and_then(PeerProtocol::parse)
                .ok_or_else(|| {
                    ConfigError::new(
                        at("protocol"),
                        json_text(other),
                        "expected \"http\" or \"https\"",
                    )
                })?,
        };
        peers.push(PeerUrl {
            protocol,
            host,
            port,
        });
    }
    Ok(peers)
}
