//! Configuration: defaults → optional TOML/JSON file → environment, validated into
//! [`Settings`] once at startup.
//!
//! Every bad value is a [`ConfigError`] naming the variable and the value (exit code 2):
//! a webhook service that silently falls back to a default poll interval or blacklist is
//! worse than one that refuses to start. So is an unknown key in the file (a typo would
//! otherwise leave the default in place); unknown `GORGE_WEBHOOK_*` variables are ignored,
//! because the environment is shared with others (Kubernetes service links).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Format, Json, Serialized, Toml};
use figment::value::Value;
use figment::{Figment, Provider};
use gorge_service::config::{env_layer, env_value, extract, mask_secret};
use gorge_service::{ConfigError, Secret};
use serde::{Deserialize, Serialize};

use crate::policy::{OutboundPolicy, PHORGE_DEFAULT_BLACKLIST};

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
    delivery_timeout: u64,
    claim_lease_sec: u64,
    retry_backoff_sec: u64,
    error_backoff_sec: u64,
    error_threshold: u64,
    outbound_blacklist: String,
    listen_addr: String,
    #[serde(serialize_with = "serialize_secret")]
    service_token: Secret,
}

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
    let known = known_keys();
    for (key, value) in data.values().flatten() {
        if !known.iter().any(|k| k == key) {
            let value = match value {
                Value::String(_, s) => s.clone(),
                other => serde_json::to_string(other).unwrap_or_default(),
            };
            let reason = match closest_key(key, &known) {
                Some(near) => format!("unknown key (did you mean `{near}`?)"),
                None => "unknown key".to_string(),
            };
            return Err(ConfigError::new(
                format!("{key} (in {})", path.display()),
                value,
                reason,
            ));
        }
    }
    Ok(())
}

/// The file keys: the fields of [`RawSettings`].
fn known_keys() -> Vec<String> {
    match serde_json::to_value(RawSettings::default()) {
        Ok(serde_json::Value::Object(fields)) => fields.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// A known key within two single-character edits of `key` (a typo), if any.
fn closest_key<'a>(key: &str, known: &'a [String]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(key, k), k.as_str()))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
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
            delivery_timeout: 15,
            claim_lease_sec: 30,
            retry_backoff_sec: 60,
            error_backoff_sec: 300,
            error_threshold: 10,
            outbound_blacklist: PHORGE_DEFAULT_BLACKLIST.into(),
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
    /// As configured; see [`Settings::lease_sec`] for the effective value.
    pub configured_lease_sec: u64,
    /// Effective lease: at least the delivery timeout plus [`LEASE_MARGIN_SEC`].
    pub lease_sec: u64,
    pub retry_backoff_sec: u64,
    pub breaker_window_sec: u64,
    pub breaker_threshold: u64,
    pub outbound_policy: OutboundPolicy,
    /// Whether the blacklist is Phorge's default (for `--check-config`).
    pub outbound_blacklist_is_default: bool,
    pub listen_addr: SocketAddr,
    pub service_token: Secret,
}

impl Settings {
    /// Layers defaults, the optional file and the environment, then validates.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(RawSettings::default()));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::new("--config", path.display(), "no such file"));
            }
            let is_json = path
                .extension()
                .is_some_and(|ext| ext.eq_ignore_ascii_case("json"));
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
        figment = figment.merge(env_layer(ENV_PREFIX));
        let mut raw: RawSettings = extract(&figment, ENV_PREFIX)?;
        // The two shared variables have no service prefix.
        if let Some(addr) = env_value(LISTEN_ADDR_VAR) {
            raw.listen_addr = addr;
        }
        if let Some(token) = env_value(SERVICE_TOKEN_VAR) {
            raw.service_token = Secret::new(token);
        }
        Settings::validate(raw)
    }

    fn validate(raw: RawSettings) -> Result<Settings, ConfigError> {
        let var = |key: &str| format!("{ENV_PREFIX}{}", key.to_uppercase());
        if raw.poll_interval_ms <= 0 {
            return Err(ConfigError::new(
                var("poll_interval_ms"),
                raw.poll_interval_ms,
                "must be greater than 0",
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
        if raw.delivery_timeout == 0 {
            return Err(ConfigError::new(
                var("delivery_timeout"),
                raw.delivery_timeout,
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
            ConfigError::new(var("outbound_blacklist"), bad, "not a CIDR or IP address")
        })?;
        let listen_addr: SocketAddr = raw
            .listen_addr
            .parse()
            .map_err(|_| ConfigError::new(LISTEN_ADDR_VAR, &raw.listen_addr, "expected IP:PORT"))?;
        let lease_sec = raw
            .claim_lease_sec
            .max(raw.delivery_timeout + LEASE_MARGIN_SEC);
        Ok(Settings {
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
            delivery_timeout: Duration::from_secs(raw.delivery_timeout),
            configured_lease_sec: raw.claim_lease_sec,
            lease_sec,
            retry_backoff_sec: raw.retry_backoff_sec,
            breaker_window_sec: raw.error_backoff_sec,
            breaker_threshold: raw.error_threshold,
            outbound_policy,
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
        if self.lease_sec != self.configured_lease_sec {
            out.push((
                "GORGE_WEBHOOK_CLAIM_LEASE_SEC",
                self.configured_lease_sec,
                self.lease_sec,
                "raised to the delivery timeout + 5 s so a running POST is never re-claimed",
            ));
        }
        out
    }

    /// Combinations that cannot take effect as written; logged as warnings at startup.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let poll_ms = self.poll_interval.as_millis() as u64;
        if self.retry_backoff_sec * 1000 < poll_ms {
            out.push(format!(
                "GORGE_WEBHOOK_RETRY_BACKOFF_SEC={} is shorter than the poll interval ({poll_ms} ms): \
                 an idle queue retries only once per poll",
                self.retry_backoff_sec
            ));
        }
        if self.breaker_window_sec * 1000 < poll_ms {
            out.push(format!(
                "GORGE_WEBHOOK_ERROR_BACKOFF_SEC={} is shorter than the poll interval ({poll_ms} ms): \
                 the breaker window closes between polls",
                self.breaker_window_sec
            ));
        }
        out
    }

    /// `key = value` lines for `--check-config`, secrets masked.
    pub fn describe(&self) -> String {
        let lines = [
            ("GORGE_WEBHOOK_MYSQL_HOST", self.mysql_host.clone()),
            ("GORGE_WEBHOOK_MYSQL_PORT", self.mysql_port.to_string()),
            ("GORGE_WEBHOOK_MYSQL_USER", self.mysql_user.clone()),
            (
                "GORGE_WEBHOOK_MYSQL_PASS",
                mask_secret(self.mysql_pass.expose()).to_string(),
            ),
            (
                "GORGE_WEBHOOK_MYSQL_SOCKET",
                if self.mysql_socket.is_empty() {
                    "(none: TCP to host and port)".to_string()
                } else {
                    self.mysql_socket.clone()
                },
            ),
            (
                "GORGE_WEBHOOK_MYSQL_MAX_CONNECTIONS",
                self.mysql_max_connections.to_string(),
            ),
            (
                "GORGE_WEBHOOK_MYSQL_MAX_LOCK_CONNECTIONS",
                format!(
                    "{} (connection budget: {} per process)",
                    self.mysql_max_lock_connections,
                    self.connection_budget()
                ),
            ),
            (
                "GORGE_WEBHOOK_MYSQL_QUERY_TIMEOUT_SEC",
                self.mysql_query_timeout.as_secs().to_string(),
            ),
            (
                "GORGE_WEBHOOK_NAMESPACE",
                format!("{} (database {})", self.namespace, self.database()),
            ),
            (
                "GORGE_WEBHOOK_POLL_INTERVAL_MS",
                self.poll_interval.as_millis().to_string(),
            ),
            (
                "GORGE_WEBHOOK_MAX_CONCURRENT",
                if self.max_concurrent == self.configured_max_concurrent {
                    self.max_concurrent.to_string()
                } else {
                    format!(
                        "{} (configured {}, limited by the lock connections)",
                        self.max_concurrent, self.configured_max_concurrent
                    )
                },
            ),
            (
                "GORGE_WEBHOOK_DELIVERY_TIMEOUT",
                self.delivery_timeout.as_secs().to_string(),
            ),
            (
                "GORGE_WEBHOOK_CLAIM_LEASE_SEC",
                if self.lease_sec == self.configured_lease_sec {
                    self.lease_sec.to_string()
                } else {
                    format!(
                        "{} (configured {}, raised to timeout + {LEASE_MARGIN_SEC})",
                        self.lease_sec, self.configured_lease_sec
                    )
                },
            ),
            (
                "GORGE_WEBHOOK_RETRY_BACKOFF_SEC",
                self.retry_backoff_sec.to_string(),
            ),
            (
                "GORGE_WEBHOOK_ERROR_BACKOFF_SEC",
                self.breaker_window_sec.to_string(),
            ),
            (
                "GORGE_WEBHOOK_ERROR_THRESHOLD",
                self.breaker_threshold.to_string(),
            ),
            (
                "GORGE_WEBHOOK_OUTBOUND_BLACKLIST",
                format!(
                    "{} networks{}",
                    self.outbound_policy.len(),
                    if self.outbound_blacklist_is_default {
                        " (Phorge's default)"
                    } else {
                        ""
                    }
                ),
            ),
            (LISTEN_ADDR_VAR, self.listen_addr.to_string()),
            (
                SERVICE_TOKEN_VAR,
                mask_secret(self.service_token.expose()).to_string(),
            ),
        ];
        let mut out = String::new();
        for (key, value) in lines {
            out.push_str(&format!("{key} = {value}\n"));
        }
        for warning in self.warnings() {
            out.push_str(&format!("warning: {warning}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(edit: impl FnOnce(&mut RawSettings)) -> Result<Settings, ConfigError> {
        let mut raw = RawSettings::default();
        edit(&mut raw);
        Settings::validate(raw)
    }

    #[test]
    fn defaults_are_the_spec_values() {
        let s = validate(|_| {}).unwrap();
        assert_eq!(s.database(), "phabricator_herald");
        assert_eq!(s.poll_interval, Duration::from_millis(1000));
        assert_eq!(s.max_concurrent, 8);
        assert_eq!(s.delivery_timeout, Duration::from_secs(15));
        assert_eq!((s.configured_lease_sec, s.lease_sec), (30, 30));
        assert_eq!(s.retry_backoff_sec, 60);
        assert_eq!((s.breaker_window_sec, s.breaker_threshold), (300, 10));
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
            r.delivery_timeout = 20;
        })
        .unwrap();
        assert_eq!(s.lease_sec, 25);
        assert_eq!(s.adjustments().len(), 1);
        assert!(s
            .describe()
            .contains("GORGE_WEBHOOK_CLAIM_LEASE_SEC = 25 (configured 10, raised to timeout + 5)"));
    }

    #[test]
    fn invalid_values_name_the_variable_and_value() {
        let err = validate(|r| r.poll_interval_ms = 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: GORGE_WEBHOOK_POLL_INTERVAL_MS=\"0\": must be greater than 0"
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
        assert!(text.contains("GORGE_WEBHOOK_MYSQL_PASS = ********"));
        assert!(text.contains("GORGE_SERVICE_TOKEN = ********"));
    }

    #[test]
    fn file_keys_are_the_settings_and_typos_get_a_hint() {
        let mut keys = known_keys();
        keys.sort();
        assert_eq!(
            keys,
            [
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
        assert_eq!(
            closest_key("poll_intervall_ms", &keys),
            Some("poll_interval_ms")
        );
        assert_eq!(closest_key("mysqlhost", &keys), Some("mysql_host"));
        assert_eq!(closest_key("port", &keys), None);
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
        // W8: never moved onto the local Unix socket unless one is configured.
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
