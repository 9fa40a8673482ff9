//! Configuration: defaults → optional TOML/JSON file → environment, validated into
//! [`Settings`] once at startup.
//!
//! Every bad value is a [`ConfigError`] naming the variable and the value (exit code 2):
//! a webhook service that silently falls back to a default poll interval or blacklist is
//! worse than one that refuses to start. So is an unknown key in the file (a typo would
//! otherwise leave the default in place); unknown `GORGE_WEBHOOK_*` variables are only
//! warned about, because the environment is shared with others (Kubernetes service links).
//! Environment values are typed by the setting, so `MYSQL_USER=1234` stays a string.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Format, Json, Serialized, Toml};
use figment::value::Value;
use figment::{Figment, Provider};
use gorge_service::config::{
    env_value, extract, mask_secret, refuse_service_link, set_source, unknown_env_warnings,
    unknown_key_reason, CheckLine, Source, TypedEnv, NOT_A_STRING,
};
use gorge_service::{ConfigError, Secret};
use serde::{Deserialize, Serialize};

use crate::policy::{OutboundPolicy, NO_BLACKLIST, PHORGE_DEFAULT_BLACKLIST};
use crate::tls::ExtraRoots;

/// The status/diagnostic port (the release-matrix check greps for this constant).
pub const DEFAULT_HEALTH_PORT: u16 = 8160;

/// Prefix of the service's own environment variables.
pub const ENV_PREFIX: &str = "GORGE_WEBHOOK_";
/// Shared by both services, hence no service prefix.
pub const LISTEN_ADDR_VAR: &str = "GORGE_LISTEN_ADDR";
pub const SERVICE_TOKEN_VAR: &str = "GORGE_SERVICE_TOKEN";

/// A lease shorter than the delivery timeout plus this margin would let another process
/// claim a row whose POST is still running.
pub const LEASE_MARGIN_SEC: u64 = 5;

/// Upper bound on `max_concurrent`.
pub const MAX_CONCURRENT_LIMIT: u64 = 256;

/// Upper bound on either connection pool: MariaDB's default `max_connections` is 151 and
/// Phorge needs its own.
pub const MAX_CONNECTIONS_LIMIT: u64 = 128;

/// How long idle database connections are kept (one query connection always stays).
const POOL_IDLE_TTL: Duration = Duration::from_secs(30);

/// Settings exactly as layered, before validation. Keys are the environment variable names
/// without the prefix, lower-cased.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RawSettings {
    mysql_host: String,
    mysql_port: u16,
    mysql_user: String,
    #[serde(serialize_with = "serialize_secret")]
    mysql_pass: Secret,
    mysql_socket: String,
    mysql_max_connections: u64,
    mysql_max_lock_connections: u64,
    mysql_query_timeout_sec: u64,
    namespace: String,
    poll_interval_ms: i64,
    max_concurrent: u64,
    /// `GORGE_WEBHOOK_DELIVERY_TIMEOUT`, whose name (an operator contract) has no unit.
    #[serde(rename = "delivery_timeout")]
    delivery_timeout_sec: u64,
    claim_lease_sec: u64,
    retry_backoff_sec: u64,
    error_backoff_sec: u64,
    error_threshold: u64,
    outbound_blacklist: String,
    /// PEM bundle of extra CAs for receivers; empty = none.
    ca_file: String,
    listen_addr: String,
    #[serde(serialize_with = "serialize_secret")]
    service_token: Secret,
}

/// What each setting accepts, in plain words, for errors (figment's own say `u64`).
fn valid_text(key: &str) -> &'static str {
    match key {
        "mysql_port" => "a port number 1-65535",
        "poll_interval_ms" => "a whole number of milliseconds from 1 to 86400000, e.g. 250",
        "max_concurrent" => "a whole number from 1 to 256, e.g. 8",
        "delivery_timeout" => "a whole number of seconds, at least 1, e.g. 15",
        "claim_lease_sec" | "retry_backoff_sec" | "error_backoff_sec" => {
            "a whole number of seconds, e.g. 60"
        }
        "error_threshold" => "a whole number, at least 1, e.g. 10",
        _ => "a string",
    }
}

/// Upper bound of every seconds setting (a day), so no derived time can overflow.
const MAX_SECONDS: u64 = 86_400;

// Only ever used to seed figment with defaults, which are empty secrets.
fn serialize_secret<S: serde::Serializer>(secret: &Secret, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(secret.expose())
}

/// Refuses a file that does not parse or has a key [`RawSettings`] does not know, naming the
/// file and the first such key (in sorted order), so that a typo stops startup instead of
/// leaving the default in place.
fn check_file_keys(file: &impl Provider, path: &Path) -> Result<(), ConfigError> {
    let data = file
        .data()
        .map_err(|err| ConfigError::new("--config", path.display(), one_line(&err.to_string())))?;
    for (key, value) in data.values().flatten() {
        if !SETTING_KEYS.contains(&key.as_str()) {
            let value = match value {
                Value::String(_, s) => s.clone(),
                other => serde_json::to_string(other).unwrap_or_default(),
            };
            let reason = unknown_key_reason(key, SETTING_KEYS.iter().copied());
            return Err(ConfigError::new(
                format!("{key} (in {})", path.display()),
                value,
                reason,
            ));
        }
    }
    Ok(())
}

/// Every setting's key, in the order `--check-config` and `--print-config` show them.
const SETTING_KEYS: [&str; 20] = [
    "mysql_host",
    "mysql_port",
    "mysql_user",
    "mysql_pass",
    "mysql_socket",
    "mysql_max_connections",
    "mysql_max_lock_connections",
    "mysql_query_timeout_sec",
    "namespace",
    "poll_interval_ms",
    "max_concurrent",
    "delivery_timeout",
    "claim_lease_sec",
    "retry_backoff_sec",
    "error_backoff_sec",
    "error_threshold",
    "outbound_blacklist",
    "ca_file",
    "listen_addr",
    "service_token",
];

/// Where figment found each setting: defaults, the file, or the environment.
fn sources(figment: &Figment) -> Vec<(&'static str, Source)> {
    SETTING_KEYS
        .iter()
        .map(|key| {
            let source = match figment.find_metadata(key) {
                Some(md) if md.name.contains("environment") => {
                    Source::Env(format!("{ENV_PREFIX}{}", key.to_uppercase()))
                }
                Some(md) => match &md.source {
                    Some(figment::Source::File(path)) => Source::File(path.display().to_string()),
                    _ => Source::Default,
                },
                None => Source::Default,
            };
            (*key, source)
        })
        .collect()
}

/// figment's type names (`expected u16`) replaced by what the setting accepts; a string
/// in the file where a number belongs is said to be one.
fn plain_words(mut err: ConfigError) -> ConfigError {
    if !err.reason.starts_with("expected ") {
        return err;
    }
    let key = err
        .key
        .split(" (in ")
        .next()
        .unwrap_or_default()
        .trim_start_matches(ENV_PREFIX)
        .to_ascii_lowercase();
    let valid = valid_text(&key);
    err.reason = if err.reason.ends_with(NOT_A_STRING) {
        format!("expected {valid}: {NOT_A_STRING}")
    } else {
        format!("expected {valid}")
    };
    err
}

/// A parser message on one line: source excerpts (`  |` lines) dropped, the rest joined.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.contains('|'))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Default for RawSettings {
    fn default() -> Self {
        RawSettings {
            mysql_host: "127.0.0.1".into(),
            mysql_port: 3306,
            mysql_user: "phorge".into(),
            mysql_pass: Secret::default(),
            mysql_socket: String::new(),
            mysql_max_connections: 4,
            mysql_max_lock_connections: 16,
            mysql_query_timeout_sec: 10,
            namespace: "phabricator".into(),
            poll_interval_ms: 1000,
            max_concurrent: 8,
            delivery_timeout_sec: 15,
            claim_lease_sec: 30,
            retry_backoff_sec: 60,
            error_backoff_sec: 300,
            error_threshold: 10,
            outbound_blacklist: PHORGE_DEFAULT_BLACKLIST.into(),
            ca_file: String::new(),
            listen_addr: format!("0.0.0.0:{DEFAULT_HEALTH_PORT}"),
            service_token: Secret::default(),
        }
    }
}

/// Validated, effective settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub mysql_host: String,
    pub mysql_port: u16,
    pub mysql_user: String,
    pub mysql_pass: Secret,
    /// A Unix socket to connect through instead of host and port; empty: TCP only.
    pub mysql_socket: String,
    /// Query pool bound (polls, claims, result writes, the API).
    pub mysql_max_connections: usize,
    /// Lock pool bound: connections holding a per-hook lock across a POST.
    pub mysql_max_lock_connections: usize,
    pub mysql_query_timeout: Duration,
    pub namespace: String,
    pub poll_interval: Duration,
    /// Effective: at most one delivery per lock connection.
    pub max_concurrent: usize,
    pub configured_max_concurrent: usize,
    pub delivery_timeout: Duration,
    /// As configured; see [`Settings::claim_lease_sec`] for the effective value.
    pub configured_claim_lease_sec: u64,
    /// Effective lease: at least the delivery timeout plus [`LEASE_MARGIN_SEC`].
    pub claim_lease_sec: u64,
    pub retry_backoff_sec: u64,
    pub error_backoff_sec: u64,
    pub error_threshold: u64,
    pub outbound_policy: OutboundPolicy,
    /// Whether the blacklist is Phorge's default (for `--check-config`).
    pub outbound_blacklist_is_default: bool,
    /// `GORGE_WEBHOOK_CA_FILE`, if set, and the CAs read from it at startup.
    pub ca_file: Option<std::path::PathBuf>,
    pub extra_roots: ExtraRoots,
    pub listen_addr: SocketAddr,
    pub service_token: Secret,
    /// The values as layered (for `--check-config` and `--print-config`) and their sources.
    raw: RawSettings,
    sources: Vec<(&'static str, Source)>,
    /// Unknown `GORGE_WEBHOOK_*` variables, found when loading.
    environment_warnings: Vec<String>,
}

impl Settings {
    /// Layers defaults, the optional file and the environment, then validates (the logging
    /// variables too, so `--check-config` refuses what startup refuses).
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        gorge_service::logging::LogSettings::from_env()?;
        let mut figment = Figment::from(Serialized::defaults(RawSettings::default()));
        if let Some(path) = file {
            let ext = path
                .extension()
                .map(|e| e.to_string_lossy().to_ascii_lowercase());
            let is_json = match ext.as_deref() {
                Some("json") => true,
                Some("toml") => false,
                _ => {
                    return Err(ConfigError::new(
                        "--config",
                        path.display(),
                        "the file must end in .toml or .json (those are the formats read)",
                    ))
                }
            };
            if !path.is_file() {
                return Err(ConfigError::new("--config", path.display(), "no such file"));
            }
            figment = if is_json {
                let file = Json::file(path);
                check_file_keys(&file, path)?;
                figment.merge(file)
            } else {
                let file = Toml::file(path);
                check_file_keys(&file, path)?;
                figment.merge(file)
            };
        }
        let env = TypedEnv::new(ENV_PREFIX, &RawSettings::default());
        for (key, value) in env.values() {
            if let Some(text) = value.as_str() {
                refuse_service_link(&format!("{ENV_PREFIX}{}", key.to_uppercase()), text)?;
            }
        }
        figment = figment.merge(env);
        let mut raw: RawSettings = extract(&figment, ENV_PREFIX).map_err(plain_words)?;
        let mut sources = sources(&figment);
        // The two shared variables have no service prefix.
        if let Some(addr) = env_value(LISTEN_ADDR_VAR) {
            raw.listen_addr = addr;
            set_source(
                &mut sources,
                "listen_addr",
                Source::Env(LISTEN_ADDR_VAR.into()),
            );
        }
        if let Some(token) = env_value(SERVICE_TOKEN_VAR) {
            raw.service_token = Secret::new(token);
            set_source(
                &mut sources,
                "service_token",
                Source::Env(SERVICE_TOKEN_VAR.into()),
            );
        }
        let mut settings = Settings::validate(raw)?;
        settings.sources = sources;
        settings.environment_warnings = unknown_env_warnings(ENV_PREFIX, &SETTING_KEYS);
        Ok(settings)
    }

    fn validate(raw: RawSettings) -> Result<Settings, ConfigError> {
        let var = |key: &str| format!("{ENV_PREFIX}{}", key.to_uppercase());
        if raw.mysql_port == 0 {
            return Err(ConfigError::new(
                var("mysql_port"),
                raw.mysql_port,
                "expected a port number 1-65535",
            ));
        }
        for (key, value) in [
            ("delivery_timeout", raw.delivery_timeout_sec),
            ("claim_lease_sec", raw.claim_lease_sec),
            ("retry_backoff_sec", raw.retry_backoff_sec),
            ("error_backoff_sec", raw.error_backoff_sec),
        ] {
            if value > MAX_SECONDS {
                return Err(ConfigError::new(
                    var(key),
                    value,
                    format!("expected at most {MAX_SECONDS} seconds (a day)"),
                ));
            }
        }
        if raw.poll_interval_ms <= 0 || raw.poll_interval_ms as u64 > MAX_SECONDS * 1000 {
            return Err(ConfigError::new(
                var("poll_interval_ms"),
                raw.poll_interval_ms,
                "expected a whole number of milliseconds from 1 to 86400000, e.g. 250",
            ));
        }
        if raw.max_concurrent == 0 || raw.max_concurrent > MAX_CONCURRENT_LIMIT {
            return Err(ConfigError::new(
                var("max_concurrent"),
                raw.max_concurrent,
                format!("must be between 1 and {MAX_CONCURRENT_LIMIT}"),
            ));
        }
        for (key, value) in [
            ("mysql_max_connections", raw.mysql_max_connections),
            ("mysql_max_lock_connections", raw.mysql_max_lock_connections),
        ] {
            if value == 0 || value > MAX_CONNECTIONS_LIMIT {
                return Err(ConfigError::new(
                    var(key),
                    value,
                    format!("must be between 1 and {MAX_CONNECTIONS_LIMIT}"),
                ));
            }
        }
        if raw.mysql_query_timeout_sec == 0 {
            return Err(ConfigError::new(
                var("mysql_query_timeout_sec"),
                raw.mysql_query_timeout_sec,
                "must be at least 1 second",
            ));
        }
        if raw.delivery_timeout_sec == 0 {
            return Err(ConfigError::new(
                var("delivery_timeout"),
                raw.delivery_timeout_sec,
                "must be at least 1 second",
            ));
        }
        if raw.error_threshold == 0 {
            return Err(ConfigError::new(
                var("error_threshold"),
                raw.error_threshold,
                "must be at least 1",
            ));
        }
        if raw.error_backoff_sec == 0 {
            return Err(ConfigError::new(
                var("error_backoff_sec"),
                raw.error_backoff_sec,
                "must be at least 1 second",
            ));
        }
        // The namespace becomes part of a database name in every query.
        if raw.namespace.is_empty()
            || !raw
                .namespace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(ConfigError::new(
                var("namespace"),
                &raw.namespace,
                "expected letters, digits and underscores",
            ));
        }
        if raw.mysql_host.trim().is_empty() {
            return Err(ConfigError::new(
                var("mysql_host"),
                &raw.mysql_host,
                "must not be empty",
            ));
        }
        let outbound_policy = OutboundPolicy::parse(&raw.outbound_blacklist).map_err(|bad| {
            ConfigError::new(
                var("outbound_blacklist"),
                bad,
                "expected CIDRs or IP addresses separated by commas or spaces, or none",
            )
        })?;
        let listen_addr: SocketAddr = raw.listen_addr.parse().map_err(|_| {
            ConfigError::new(
                LISTEN_ADDR_VAR,
                &raw.listen_addr,
                "expected IP:PORT, e.g. 0.0.0.0:8160",
            )
        })?;
        let ca_file = Some(raw.ca_file.trim())
            .filter(|path| !path.is_empty())
            .map(std::path::PathBuf::from);
        let extra_roots = match &ca_file {
            Some(path) => ExtraRoots::load(path).map_err(|reason| {
                ConfigError::new(
                    var("ca_file"),
                    path.display(),
                    format!("{reason} (expected a readable PEM file of CA certificates)"),
                )
            })?,
            None => ExtraRoots::default(),
        };
        let claim_lease_sec = raw
            .claim_lease_sec
            .max(raw.delivery_timeout_sec + LEASE_MARGIN_SEC);
        let raw_copy = raw.clone();
        Ok(Settings {
            raw: raw_copy,
            sources: SETTING_KEYS.iter().map(|k| (*k, Source::Default)).collect(),
            environment_warnings: Vec::new(),
            mysql_host: raw.mysql_host,
            mysql_port: raw.mysql_port,
            mysql_user: raw.mysql_user,
            mysql_pass: raw.mysql_pass,
            mysql_socket: raw.mysql_socket,
            mysql_max_connections: raw.mysql_max_connections as usize,
            mysql_max_lock_connections: raw.mysql_max_lock_connections as usize,
            mysql_query_timeout: Duration::from_secs(raw.mysql_query_timeout_sec),
            configured_max_concurrent: raw.max_concurrent as usize,
            outbound_blacklist_is_default: raw.outbound_blacklist == PHORGE_DEFAULT_BLACKLIST,
            namespace: raw.namespace,
            poll_interval: Duration::from_millis(raw.poll_interval_ms as u64),
            max_concurrent: raw.max_concurrent.min(raw.mysql_max_lock_connections) as usize,
            delivery_timeout: Duration::from_secs(raw.delivery_timeout_sec),
            configured_claim_lease_sec: raw.claim_lease_sec,
            claim_lease_sec,
            retry_backoff_sec: raw.retry_backoff_sec,
            error_backoff_sec: raw.error_backoff_sec,
            error_threshold: raw.error_threshold,
            outbound_policy,
            ca_file,
            extra_roots,
            listen_addr,
            service_token: raw.service_token,
        })
    }

    /// `{namespace}_herald`.
    pub fn database(&self) -> String {
        format!("{}_herald", self.namespace)
    }

    /// Connection options for the MariaDB/MySQL server (the database and pools are set by
    /// the store). TCP to the configured host and port unless a socket is configured:
    /// mysql_async would otherwise move every connection onto the server's `@@socket`
    /// whenever that path exists locally, which with two local servers is the wrong one.
    pub fn mysql_opts(&self) -> mysql_async::Opts {
        let socket = (!self.mysql_socket.is_empty()).then(|| self.mysql_socket.clone());
        mysql_async::OptsBuilder::default()
            .ip_or_hostname(self.mysql_host.clone())
            .tcp_port(self.mysql_port)
            .user(Some(self.mysql_user.clone()))
            .pass((!self.mysql_pass.is_empty()).then(|| self.mysql_pass.expose().to_string()))
            .prefer_socket(false)
            .socket(socket)
            .into()
    }

    /// Pool bounds and the statement timeout for the claim store.
    pub fn store_options(&self) -> gorge_claim::StoreOptions {
        gorge_claim::StoreOptions {
            query_timeout: self.mysql_query_timeout,
            max_connections: self.mysql_max_connections,
            max_lock_connections: self.mysql_max_lock_connections,
            idle_timeout: POOL_IDLE_TTL,
        }
    }

    /// The most database connections one process opens (query pool + lock pool, the lock
    /// pool never more than the deliveries that can run).
    pub fn connection_budget(&self) -> usize {
        self.mysql_max_connections + self.max_concurrent
    }

    /// Effective values that differ from the configured ones, as `(key, configured,
    /// effective, why)`; logged once at startup.
    pub fn adjustments(&self) -> Vec<(&'static str, u64, u64, &'static str)> {
        let mut out = Vec::new();
        if self.max_concurrent != self.configured_max_concurrent {
            out.push((
                "GORGE_WEBHOOK_MAX_CONCURRENT",
                self.configured_max_concurrent as u64,
                self.max_concurrent as u64,
                "lowered to GORGE_WEBHOOK_MYSQL_MAX_LOCK_CONNECTIONS: each delivery holds one lock connection",
            ));
        }
        if self.claim_lease_sec != self.configured_claim_lease_sec {
            out.push((
                "GORGE_WEBHOOK_CLAIM_LEASE_SEC",
                self.configured_claim_lease_sec,
                self.claim_lease_sec,
                "raised to the delivery timeout + 5 s so a running POST is never re-claimed",
            ));
        }
        out
    }

    /// Combinations that cannot take effect as written; logged as warnings at startup.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = self.environment_warnings.clone();
        if self.outbound_policy.is_empty() {
            out.push(format!(
                "GORGE_WEBHOOK_OUTBOUND_BLACKLIST={NO_BLACKLIST}: webhooks may reach any address, \
                 including this network's private ones and cloud metadata (SSRF); mirror \
                 Phorge's security.outbound-blacklist instead"
            ));
        }
        let poll_ms = self.poll_interval.as_millis() as u64;
        if self.retry_backoff_sec * 1000 < poll_ms {
            out.push(format!(
                "GORGE_WEBHOOK_RETRY_BACKOFF_SEC={} is shorter than the poll interval ({poll_ms} ms): \
                 an idle queue retries only once per poll",
                self.retry_backoff_sec
            ));
        }
        if self.error_backoff_sec * 1000 < poll_ms {
            out.push(format!(
                "GORGE_WEBHOOK_ERROR_BACKOFF_SEC={} is shorter than the poll interval ({poll_ms} ms): \
                 the breaker window closes between polls",
                self.error_backoff_sec
            ));
        }
        out
    }

    /// The `--check-config` lines, secrets masked, each with its source.
    pub fn check_lines(&self) -> Vec<CheckLine> {
        SETTING_KEYS
            .iter()
            .map(|key| {
                let name = match *key {
                    "listen_addr" => LISTEN_ADDR_VAR.to_string(),
                    "service_token" => SERVICE_TOKEN_VAR.to_string(),
                    _ => format!("{ENV_PREFIX}{}", key.to_uppercase()),
                };
                let source = self
                    .sources
                    .iter()
                    .find(|(k, _)| k == key)
                    .map_or(Source::Default, |(_, s)| s.clone());
                CheckLine {
                    name,
                    value: self.shown(key),
                    source,
                }
            })
            .collect()
    }

    fn shown(&self, key: &str) -> String {
        match key {
            "mysql_host" => self.mysql_host.clone(),
            "mysql_port" => self.mysql_port.to_string(),
            "mysql_user" => self.mysql_user.clone(),
            "mysql_pass" => mask_secret(self.mysql_pass.expose()).to_string(),
            "namespace" => format!("{} (database {})", self.namespace, self.database()),
            "poll_interval_ms" => self.poll_interval.as_millis().to_string(),
            "delivery_timeout" => self.delivery_timeout.as_secs().to_string(),
            "claim_lease_sec" if self.claim_lease_sec != self.configured_claim_lease_sec => {
                format!(
                    "{} (configured {}, raised to timeout + {LEASE_MARGIN_SEC})",
                    self.claim_lease_sec, self.configured_claim_lease_sec
                )
            }
            "mysql_socket" if self.mysql_socket.is_empty() => {
                "(none: TCP to host and port)".to_string()
            }
            "mysql_socket" => self.mysql_socket.clone(),
            "mysql_max_connections" => self.mysql_max_connections.to_string(),
            "mysql_max_lock_connections" => format!(
                "{} (connection budget: {} per process)",
                self.mysql_max_lock_connections,
                self.connection_budget()
            ),
            "mysql_query_timeout_sec" => self.mysql_query_timeout.as_secs().to_string(),
            "max_concurrent" if self.max_concurrent != self.configured_max_concurrent => format!(
                "{} (configured {}, limited by the lock connections)",
                self.max_concurrent, self.configured_max_concurrent
            ),
            "claim_lease_sec" => self.claim_lease_sec.to_string(),
            "retry_backoff_sec" => self.retry_backoff_sec.to_string(),
            "error_backoff_sec" => self.error_backoff_sec.to_string(),
            "error_threshold" => self.error_threshold.to_string(),
            "max_concurrent" => self.max_concurrent.to_string(),
            "outbound_blacklist" => format!(
                "{} networks{}",
                self.outbound_policy.len(),
                if self.outbound_blacklist_is_default {
                    " (Phorge's default)"
                } else {
                    ""
                }
            ),
            "ca_file" => match &self.ca_file {
                Some(path) => format!(
                    "{} ({} certificates, trusted with the bundled and system roots)",
                    path.display(),
                    self.extra_roots.len()
                ),
                None => "(none: bundled and system roots)".to_string(),
            },
            "listen_addr" => self.listen_addr.to_string(),
            "service_token" => mask_secret(self.service_token.expose()).to_string(),
            _ => String::new(),
        }
    }

    /// `--check-config`'s text: one line per setting, then the warnings.
    pub fn describe(&self) -> String {
        gorge_service::config::check_config_text(&self.check_lines(), &self.warnings())
    }

    /// A TOML file holding every setting with its effective value (the defaults when
    /// nothing is set); secrets are written empty, never printed.
    pub fn print_config(&self) -> String {
        let mut out = String::from(
            "# gorge-webhook configuration (--config PATH). Environment variables\n\
             # GORGE_WEBHOOK_<KEY> override these; see docs/webhook.md.\n",
        );
        let values = match serde_json::to_value(&self.raw) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        for key in SETTING_KEYS {
            let line = match (key, values.get(key)) {
                ("mysql_pass" | "service_token", _) => {
                    format!("# {key}: a secret; set it here or in the environment\n{key} = \"\"")
                }
                (_, Some(serde_json::Value::String(text))) => {
                    // TOML basic strings share JSON's escapes.
                    format!("{key} = {}", serde_json::Value::from(text.as_str()))
                }
                (_, Some(value)) => format!("{key} = {value}"),
                (_, None) => continue,
            };
            out.push_str(&line);
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_file_must_be_a_readable_pem_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = validate(|r| r.ca_file = missing.display().to_string()).unwrap_err();
        assert_eq!(err.key, "GORGE_WEBHOOK_CA_FILE");
        let text = err.to_string();
        assert!(
            text.contains("GORGE_WEBHOOK_CA_FILE") && text.contains("cannot be read"),
            "{text}"
        );
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, ca.cert.pem()).unwrap();
        let s = validate(|r| r.ca_file = good.display().to_string()).unwrap();
        assert_eq!(s.extra_roots.len(), 1);
        assert!(validate(|_| {}).unwrap().ca_file.is_none());
    }

    fn validate(edit: impl FnOnce(&mut RawSettings)) -> Result<Settings, ConfigError> {
        let mut raw = RawSettings::default();
        edit(&mut raw);
        Settings::validate(raw)
    }

    fn shown(s: &Settings, name: &str) -> String {
        s.check_lines()
            .into_iter()
            .find(|l| l.name == name)
            .map(|l| l.value)
            .unwrap()
    }

    #[test]
    fn defaults_are_the_spec_values() {
        let s = validate(|_| {}).unwrap();
        assert_eq!(s.database(), "phabricator_herald");
        assert_eq!(s.poll_interval, Duration::from_millis(1000));
        assert_eq!(s.max_concurrent, 8);
        assert_eq!(s.delivery_timeout, Duration::from_secs(15));
        assert_eq!((s.configured_claim_lease_sec, s.claim_lease_sec), (30, 30));
        assert_eq!(s.retry_backoff_sec, 60);
        assert_eq!((s.error_backoff_sec, s.error_threshold), (300, 10));
        assert_eq!(s.listen_addr, "0.0.0.0:8160".parse().unwrap());
        assert_eq!(s.outbound_policy.len(), 29);
        assert!(s.outbound_blacklist_is_default);
        assert!(s.adjustments().is_empty());
        assert!(s.warnings().is_empty());
    }

    #[test]
    fn lease_is_raised_to_cover_the_timeout_and_reported() {
        let s = validate(|r| {
            r.claim_lease_sec = 10;
            r.delivery_timeout_sec = 20;
        })
        .unwrap();
        assert_eq!(s.claim_lease_sec, 25);
        assert_eq!(s.adjustments().len(), 1);
        assert_eq!(
            shown(&s, "GORGE_WEBHOOK_CLAIM_LEASE_SEC"),
            "25 (configured 10, raised to timeout + 5)"
        );
    }

    #[test]
    fn invalid_values_name_the_variable_and_value() {
        let err = validate(|r| r.poll_interval_ms = 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: GORGE_WEBHOOK_POLL_INTERVAL_MS=\"0\": \
             expected a whole number of milliseconds from 1 to 86400000, e.g. 250"
        );
        let err = validate(|r| r.max_concurrent = 0).unwrap_err();
        assert_eq!(err.key, "GORGE_WEBHOOK_MAX_CONCURRENT");
        let err = validate(|r| r.error_threshold = 0).unwrap_err();
        assert_eq!(err.key, "GORGE_WEBHOOK_ERROR_THRESHOLD");
        let err = validate(|r| r.outbound_blacklist = "10.0.0.0/8 10.0.0.0/99".into()).unwrap_err();
        assert_eq!(
            (err.key.as_str(), err.value.as_str()),
            ("GORGE_WEBHOOK_OUTBOUND_BLACKLIST", "10.0.0.0/99")
        );
        let err = validate(|r| r.listen_addr = "nowhere".into()).unwrap_err();
        assert_eq!(
            (err.key.as_str(), err.value.as_str()),
            ("GORGE_LISTEN_ADDR", "nowhere")
        );
        let err = validate(|r| r.namespace = "x; DROP".into()).unwrap_err();
        assert_eq!(err.key, "GORGE_WEBHOOK_NAMESPACE");
    }

    #[test]
    fn describe_masks_secrets() {
        let s = validate(|r| {
            r.mysql_pass = Secret::new("hunter2");
            r.service_token = Secret::new("tok");
        })
        .unwrap();
        let text = s.describe();
        assert!(
            !text.contains("hunter2") && !text.contains("tok\n"),
            "{text}"
        );
        assert_eq!(shown(&s, "GORGE_WEBHOOK_MYSQL_PASS"), "********");
        assert_eq!(shown(&s, "GORGE_SERVICE_TOKEN"), "********");
    }

    /// The file keys: the fields of [`RawSettings`].
    fn known_keys() -> Vec<String> {
        match serde_json::to_value(RawSettings::default()) {
            Ok(serde_json::Value::Object(fields)) => fields.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn file_keys_are_the_settings_and_typos_get_a_hint() {
        let mut keys = known_keys();
        keys.sort();
        assert_eq!(
            keys,
            [
                "ca_file",
                "claim_lease_sec",
                "delivery_timeout",
                "error_backoff_sec",
                "error_threshold",
                "listen_addr",
                "max_concurrent",
                "mysql_host",
                "mysql_max_connections",
                "mysql_max_lock_connections",
                "mysql_pass",
                "mysql_port",
                "mysql_query_timeout_sec",
                "mysql_socket",
                "mysql_user",
                "namespace",
                "outbound_blacklist",
                "poll_interval_ms",
                "retry_backoff_sec",
                "service_token",
            ]
        );
        assert_eq!(keys, {
            let mut listed = SETTING_KEYS.to_vec();
            listed.sort();
            listed
        });
        let reason = |key| unknown_key_reason(key, keys.iter().map(String::as_str));
        assert_eq!(
            reason("poll_intervall_ms"),
            "unknown key (did you mean `poll_interval_ms`?)"
        );
        assert_eq!(
            reason("mysqlhost"),
            "unknown key (did you mean `mysql_host`?)"
        );
        assert_eq!(reason("port"), "unknown key");
    }

    #[test]
    fn port_zero_huge_durations_and_no_blacklist() {
        let err = validate(|r| r.mysql_port = 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: GORGE_WEBHOOK_MYSQL_PORT=\"0\": expected a port number 1-65535"
        );
        let err = validate(|r| r.retry_backoff_sec = u64::MAX).unwrap_err();
        assert_eq!(err.key, "GORGE_WEBHOOK_RETRY_BACKOFF_SEC");
        let s = validate(|r| r.outbound_blacklist = "none".into()).unwrap();
        assert!(s.warnings()[0].contains("SSRF"), "{:?}", s.warnings());
    }

    #[test]
    fn short_backoff_below_poll_interval_warns() {
        let s = validate(|r| {
            r.retry_backoff_sec = 0;
        })
        .unwrap();
        assert_eq!(s.warnings().len(), 1);
    }

    #[test]
    fn connections_are_bounded_apart_from_concurrency_and_tcp_by_default() {
        let s = validate(|_| {}).unwrap();
        assert_eq!(
            (s.mysql_max_connections, s.mysql_max_lock_connections),
            (4, 16)
        );
        assert_eq!(s.connection_budget(), 4 + 8);
        // Never moved onto the local Unix socket unless one is configured.
        assert!(!s.mysql_opts().prefer_socket());
        assert_eq!(s.mysql_opts().socket(), None);
        let s = validate(|r| r.mysql_socket = "/run/mysqld/mysqld.sock".into()).unwrap();
        assert_eq!(s.mysql_opts().socket(), Some("/run/mysqld/mysqld.sock"));

        let s = validate(|r| r.max_concurrent = 256).unwrap();
        assert_eq!(s.max_concurrent, 16, "one lock connection per delivery");
        assert_eq!(s.connection_budget(), 20);
        assert_eq!(s.adjustments()[0].0, "GORGE_WEBHOOK_MAX_CONCURRENT");

        let err = validate(|r| r.mysql_max_connections = 0).unwrap_err();
        assert!(err
            .to_string()
            .contains("GORGE_WEBHOOK_MYSQL_MAX_CONNECTIONS"));
        let err = validate(|r| r.mysql_max_lock_connections = 1000).unwrap_err();
        assert!(err
            .to_string()
            .contains("GORGE_WEBHOOK_MYSQL_MAX_LOCK_CONNECTIONS"));
        assert!(validate(|r| r.mysql_query_timeout_sec = 0).is_err());
    }
}
