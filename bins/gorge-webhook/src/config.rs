//! Configuration: defaults → optional TOML/JSON file → environment, validated into
//! [`Settings`] once at startup. Each setting is declared once, in [`RawSettings`] (see
//! `gorge_service::settings`): its kind decides how it parses and what an error says is
//! valid, and its help is the "Meaning" of docs/webhook.md's table (checked by a test).
//!
//! Every bad value is a [`ConfigError`] naming the variable and the value (exit code 2):
//! a webhook service that silently falls back to a default poll interval or blacklist is
//! worse than one that refuses to start. So is an unknown key in the file (a typo would
//! otherwise leave the default in place); unknown `GORGE_WEBHOOK_*` variables are only
//! warned about, because the environment is shared with others (Kubernetes service links).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use gorge_service::config::{env_value, CheckLine};
use gorge_service::logging::LogVars;
use gorge_service::settings::{
    self, unknown_env_warnings, unknown_file_key, Count, Declared, FileFormat, Layered, Millis,
    Port, Seconds, SecondsOrZero, SecretText, Text,
};
use gorge_service::{ConfigError, Secret};

use crate::policy::{OutboundPolicy, NO_BLACKLIST, PHORGE_DEFAULT_BLACKLIST};
use crate::tls::ExtraRoots;

/// The status/diagnostic port (the release-matrix check greps for this constant).
pub const DEFAULT_HEALTH_PORT: u16 = 8160;

/// A lease shorter than the delivery timeout plus this margin would let another process
/// claim a row whose POST is still running.
pub const LEASE_MARGIN_SEC: u64 = 5;

/// How long idle database connections are kept (one query connection always stays).
const POOL_IDLE_TTL: Duration = Duration::from_secs(30);

gorge_service::number_kind!(
    /// Either connection pool's bound: MariaDB's default `max_connections` is 151 and Phorge
    /// needs its own.
    Connections: usize, 1..=128, "a whole number from 1 to 128, e.g. 4"
);
gorge_service::number_kind!(
    /// Deliveries in flight per process.
    Concurrency: usize, 1..=256, "a whole number from 1 to 256, e.g. 8"
);

gorge_service::settings! {
    /// Every setting as layered, before validation.
    pub struct RawSettings, prefix "GORGE_WEBHOOK_" {
        mysql_host: Text = "127.0.0.1".into(), "MariaDB/MySQL server";
        mysql_port: Port = 3306, "MariaDB/MySQL port";
        mysql_user: Text = "phorge".into(),
            "needs the grants of [Database grants](operations.md#database-grants)";
        mysql_pass: SecretText = Secret::default(), "never logged or printed";
        mysql_socket: Text = String::new(),
            "a Unix socket to connect through instead of host and port. Empty: always TCP to \
             host:port (the driver's habit of moving onto the server's `@@socket` when that path \
             exists locally is switched off)";
        mysql_max_connections: Connections = 4,
            "query pool bound (polls, claims, result writes, API), 1–128; idle connections \
             above one are closed after 30 s";
        mysql_max_lock_connections: Connections = 16,
            "lock pool bound, 1–128: each delivery in flight holds one connection for its \
             per-hook lock, so `MAX_CONCURRENT` is lowered to this (logged as \
             `WEBHOOK_CONFIG_ADJUSTED`); idle ones are closed after 30 s";
        mysql_query_timeout_sec: Seconds = 10,
            "bound on every statement and on waiting for a pooled connection; a connection \
             whose statement timed out is closed, never reused";
        namespace: Text = "phabricator".into(),
            "Phorge's `storage.default-namespace`; the database is `{namespace}_herald`";
        poll_interval_ms: Millis = 1000, "idle poll period (a backlog is polled continuously)";
        max_concurrent: Concurrency = 8,
            "deliveries in flight per process (1–256; at most `MYSQL_MAX_LOCK_CONNECTIONS`)";
        delivery_timeout: Seconds = 15,
            "seconds for the whole request: DNS, connect, redirects, response (the PHP worker \
             uses 15)";
        claim_lease_sec: SecondsOrZero = 30,
            "how long a claimed row without a result is invisible to other claimants; raised \
             to at least timeout + 5 s";
        retry_backoff_sec: SecondsOrZero = 60,
            "wait before a failed `retry=forever` request is tried again";
        error_backoff_sec: Seconds = 300,
            "circuit-breaker window (Phorge's `HeraldWebhook` value)";
        error_threshold: Count = 10, "failures within the window that open a hook's breaker";
        #[doc_default("Phorge's default `security.outbound-blacklist`")]
        outbound_blacklist: Text = PHORGE_DEFAULT_BLACKLIST.into(),
            "CIDRs never connected to, separated by commas and/or whitespace; `none` for an \
             empty list. **Must mirror the Phorge setting.**";
        ca_file: Text = String::new(),
            "PEM bundle of CA certificates trusted for HTTPS receivers **in addition to** the \
             bundled Mozilla roots and the system store (Phorge's equivalents: Arcanist's \
             `resources/ssl/custom.pem`, PHP's `curl.cainfo`). Read once at startup; \
             unreadable, not PEM, no certificate, or a certificate that is not a usable CA → \
             exit 2 naming the variable";
        #[env("GORGE_LISTEN_ADDR")]
        listen_addr: Text = format!("0.0.0.0:{DEFAULT_HEALTH_PORT}"),
            "status/diagnostic HTTP listener, `IP:PORT` (file key `listen_addr`; shared name, \
             no `GORGE_WEBHOOK_` prefix)";
        #[env("GORGE_SERVICE_TOKEN")]
        service_token: SecretText = Secret::default(),
            "token for `/api/webhook/*`; empty disables auth (file key `service_token`)";
    }
}

/// Validated, effective settings. Derefs to the declared values ([`RawSettings`]:
/// `settings.mysql_host`); its own fields are what validation derived from them — durations,
/// parsed addresses and lists, effective limits — and take precedence by name.
#[derive(Debug, Clone)]
pub struct Settings {
    pub mysql_query_timeout: Duration,
    pub poll_interval: Duration,
    /// Effective: at most one delivery per lock connection.
    pub max_concurrent: usize,
    pub delivery_timeout: Duration,
    /// Effective lease: at least the delivery timeout plus [`LEASE_MARGIN_SEC`].
    pub claim_lease_sec: u64,
    pub outbound_policy: OutboundPolicy,
    /// `GORGE_WEBHOOK_CA_FILE`, if set, and the CAs read from it at startup.
    pub ca_file: Option<std::path::PathBuf>,
    pub extra_roots: ExtraRoots,
    pub listen_addr: SocketAddr,
    /// The values as layered, with their sources (for `--check-config` and `--print-config`).
    layered: Layered<RawSettings>,
    log: Layered<LogVars>,
    /// Unknown `GORGE_WEBHOOK_*` and `GORGE_LOG_*` variables, found when loading.
    environment_warnings: Vec<String>,
}

impl std::ops::Deref for Settings {
    type Target = RawSettings;

    fn deref(&self) -> &RawSettings {
        &self.layered.values
    }
}

/// A table (`[mysql]`, a JSON object) where the file has flat keys: names the keys to write
/// instead.
fn flat_keys_error(path: &Path, key: &str, value: &serde_json::Value) -> ConfigError {
    let prefix = format!("{key}_");
    let keys: Vec<&str> = RawSettings::file_keys()
        .filter(|k| k.starts_with(&prefix))
        .collect();
    let instead = match keys.is_empty() {
        true => String::new(),
        false => format!(": write `{}` at the top level", keys.join("`, `")),
    };
    let reason = format!("settings are flat keys, not tables{instead}");
    ConfigError::new(
        format!("{key} (in {})", path.display()),
        settings::value_text(value),
        reason,
    )
}

/// The formats `--config` reads, by extension.
const FILE_FORMATS: [FileFormat; 2] = [FileFormat::Toml, FileFormat::Json];

impl Settings {
    /// Layers defaults, the optional file and the environment, then validates (the logging
    /// variables too, so `--check-config` refuses what startup refuses).
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        let log = gorge_service::logging::log_vars(crate::events::ALL)?;
        let mut settings = Settings::load_from(file, &|var| env_value(var))?;
        settings.log = log;
        settings.environment_warnings = unknown_env_warnings::<RawSettings>(std::env::vars());
        let log_warnings = unknown_env_warnings::<LogVars>(std::env::vars());
        settings.environment_warnings.extend(log_warnings);
        Ok(settings)
    }

    /// [`Settings::load`] with the environment as `env` reads it.
    fn load_from(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let mut layered = Layered::<RawSettings>::default();
        if let Some(path) = file {
            let mut entries = settings::read_file(path, "--config", &FILE_FORMATS)?;
            // A list is what TOML (and the chart's value) makes natural for the blacklist;
            // read it as the variable's comma-separated text.
            if let Some(serde_json::Value::Array(items)) = entries.get("outbound_blacklist") {
                if let Some(texts) = items.iter().map(|i| i.as_str()).collect::<Option<Vec<_>>>() {
                    let joined = texts.join(", ");
                    entries.insert("outbound_blacklist".into(), joined.into());
                }
            }
            let mut unknown = layered.apply_file(path, &entries)?;
            // The first in sorted order, whatever order the file has.
            unknown.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some((key, value)) = unknown.first() {
                return Err(match value {
                    serde_json::Value::Object(_) => flat_keys_error(path, key, value),
                    _ => unknown_file_key(path, key, value, RawSettings::file_keys()),
                });
            }
        }
        layered.apply_env(env, &[])?;
        Settings::validate(layered)
    }

    fn validate(layered: Layered<RawSettings>) -> Result<Settings, ConfigError> {
        let raw = &layered.values;
        // Each setting as the operator wrote it: `namespace (in PATH)` for a file's value.
        let var = |key: &str| layered.name(key);
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
                var("listen_addr"),
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
        Ok(Settings {
            mysql_query_timeout: Duration::from_secs(raw.mysql_query_timeout_sec),
            poll_interval: Duration::from_millis(raw.poll_interval_ms),
            max_concurrent: raw.max_concurrent.min(raw.mysql_max_lock_connections),
            delivery_timeout: Duration::from_secs(raw.delivery_timeout),
            claim_lease_sec: raw
                .claim_lease_sec
                .max(raw.delivery_timeout + LEASE_MARGIN_SEC),
            outbound_policy,
            ca_file,
            extra_roots,
            listen_addr,
            layered,
            log: Layered::default(),
            environment_warnings: Vec::new(),
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
            lock_session_timeout: self.lock_session_timeout(),
        }
    }

    /// The server-side idle limit of lock sessions: longer than a lock is ever held without
    /// a statement — the claim's lease (the POST and the result-write retries fall within
    /// it) plus the statements before the claim (breaker, object, transactions, claim) and
    /// the last write, each bounded by the query timeout.
    pub fn lock_session_timeout(&self) -> Duration {
        Duration::from_secs(self.claim_lease_sec) + self.mysql_query_timeout * 5
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
        if self.max_concurrent != self.layered.values.max_concurrent {
            out.push((
                "GORGE_WEBHOOK_MAX_CONCURRENT",
                self.layered.values.max_concurrent as u64,
                self.max_concurrent as u64,
                "lowered to GORGE_WEBHOOK_MYSQL_MAX_LOCK_CONNECTIONS: each delivery holds one lock connection",
            ));
        }
        if self.claim_lease_sec != self.layered.values.claim_lease_sec {
            out.push((
                "GORGE_WEBHOOK_CLAIM_LEASE_SEC",
                self.layered.values.claim_lease_sec,
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

    /// The `--check-config` lines, secrets masked, each with its source; the logging
    /// variables last.
    pub fn check_lines(&self) -> Vec<CheckLine> {
        let mut lines = self.layered.check_lines(|key| self.annotated(key));
        lines.extend(self.log.log_check_lines());
        lines
    }

    /// What `--check-config` says about `key` beyond its value, where context matters.
    fn annotated(&self, key: &str) -> Option<String> {
        Some(match key {
            "namespace" => format!("{} (database {})", self.namespace, self.database()),
            "claim_lease_sec" if self.claim_lease_sec != self.layered.values.claim_lease_sec => {
                format!(
                    "{} (configured {}, raised to timeout + {LEASE_MARGIN_SEC})",
                    self.claim_lease_sec, self.layered.values.claim_lease_sec
                )
            }
            "mysql_socket" if self.mysql_socket.is_empty() => {
                "(none: TCP to host and port)".to_string()
            }
            "mysql_max_lock_connections" => format!(
                "{} (connection budget: {} per process)",
                self.mysql_max_lock_connections,
                self.connection_budget()
            ),
            "max_concurrent" if self.max_concurrent != self.layered.values.max_concurrent => {
                format!(
                    "{} (configured {}, limited by the lock connections)",
                    self.max_concurrent, self.layered.values.max_concurrent
                )
            }
            "outbound_blacklist" => format!(
                "{} networks{}",
                self.outbound_policy.len(),
                if self.outbound_blacklist == PHORGE_DEFAULT_BLACKLIST {
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
            _ => return None,
        })
    }

    /// `--check-config`'s text: one line per setting, then the warnings.
    pub fn describe(&self) -> String {
        gorge_service::config::check_config_text(&self.check_lines(), &self.warnings())
    }

    /// A TOML file holding every setting with its effective value (the defaults when
    /// nothing is set); secrets are written empty, never printed.
    pub fn print_config(&self) -> String {
        settings::toml_file(
            "# gorge-webhook configuration (--config PATH). Environment variables\n\
             # GORGE_WEBHOOK_<KEY> override these; see docs/webhook.md.\n",
            &self.layered.values,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loads the defaults overridden by `vars` (as environment variables).
    fn load_env(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::load_from(None, &move |var| {
            vars.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
        })
    }

    fn shown(s: &Settings, name: &str) -> String {
        s.check_lines()
            .into_iter()
            .find(|l| l.name == name)
            .map(|l| l.value)
            .unwrap()
    }

    #[test]
    fn ca_file_must_be_a_readable_pem_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let missing = missing.display().to_string();
        let err = load_env(&[("GORGE_WEBHOOK_CA_FILE", &missing)]).unwrap_err();
        assert_eq!(err.key, "GORGE_WEBHOOK_CA_FILE");
        let text = err.to_string();
        assert!(
            text.contains("GORGE_WEBHOOK_CA_FILE") && text.contains("cannot be read"),
            "{text}"
        );
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, ca.cert.pem()).unwrap();
        let s = load_env(&[("GORGE_WEBHOOK_CA_FILE", &good.display().to_string())]).unwrap();
        assert_eq!(s.extra_roots.len(), 1);
        assert!(load_env(&[]).unwrap().ca_file.is_none());
    }

    #[test]
    fn defaults_are_the_spec_values() {
        let s = load_env(&[]).unwrap();
        assert_eq!(s.database(), "phabricator_herald");
        assert_eq!(s.poll_interval, Duration::from_millis(1000));
        assert_eq!(s.max_concurrent, 8);
        assert_eq!(s.delivery_timeout, Duration::from_secs(15));
        assert_eq!(
            (s.layered.values.claim_lease_sec, s.claim_lease_sec),
            (30, 30)
        );
        assert_eq!(s.retry_backoff_sec, 60);
        assert_eq!((s.error_backoff_sec, s.error_threshold), (300, 10));
        assert_eq!(s.listen_addr, "0.0.0.0:8160".parse().unwrap());
        assert_eq!(s.outbound_policy.len(), 29);
        assert!(s.adjustments().is_empty());
        assert!(s.warnings().is_empty());
    }

    #[test]
    fn lease_is_raised_to_cover_the_timeout_and_reported() {
        let s = load_env(&[
            ("GORGE_WEBHOOK_CLAIM_LEASE_SEC", "10"),
            ("GORGE_WEBHOOK_DELIVERY_TIMEOUT", "20"),
        ])
        .unwrap();
        assert_eq!(s.claim_lease_sec, 25);
        assert_eq!(s.adjustments().len(), 1);
        assert_eq!(
            shown(&s, "GORGE_WEBHOOK_CLAIM_LEASE_SEC"),
            "25 (configured 10, raised to timeout + 5)"
        );
    }

    #[test]
    fn the_raised_lease_line_in_the_docs_is_what_the_defaults_give() {
        let s = load_env(&[("GORGE_WEBHOOK_CLAIM_LEASE_SEC", "10")]).unwrap();
        let line = shown(&s, "GORGE_WEBHOOK_CLAIM_LEASE_SEC");
        let docs = include_str!("../../../docs/webhook.md");
        assert!(
            docs.contains(&format!(
                "`GORGE_WEBHOOK_CLAIM_LEASE_SEC=10` is shown as `{line}`"
            )),
            "docs/webhook.md: say that CLAIM_LEASE_SEC=10 is shown as `{line}`"
        );
    }

    #[test]
    fn invalid_values_name_the_variable_and_value() {
        let err = load_env(&[("GORGE_WEBHOOK_POLL_INTERVAL_MS", "0")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: GORGE_WEBHOOK_POLL_INTERVAL_MS=\"0\": \
             expected a whole number of milliseconds from 1 to 86400000, e.g. 250"
        );
        for var in [
            "GORGE_WEBHOOK_MAX_CONCURRENT",
            "GORGE_WEBHOOK_ERROR_THRESHOLD",
            "GORGE_WEBHOOK_MYSQL_MAX_CONNECTIONS",
            "GORGE_WEBHOOK_MYSQL_QUERY_TIMEOUT_SEC",
            "GORGE_WEBHOOK_DELIVERY_TIMEOUT",
            "GORGE_WEBHOOK_ERROR_BACKOFF_SEC",
        ] {
            assert_eq!(load_env(&[(var, "0")]).unwrap_err().key, var);
        }
        let err = load_env(&[("GORGE_WEBHOOK_MYSQL_MAX_LOCK_CONNECTIONS", "1000")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: GORGE_WEBHOOK_MYSQL_MAX_LOCK_CONNECTIONS=\"1000\": \
             expected a whole number from 1 to 128, e.g. 4"
        );
        let err = load_env(&[("GORGE_WEBHOOK_OUTBOUND_BLACKLIST", "10.0.0.0/8 10.0.0.0/99")])
            .unwrap_err();
        assert_eq!(
            (err.key.as_str(), err.value.as_str()),
            ("GORGE_WEBHOOK_OUTBOUND_BLACKLIST", "10.0.0.0/99")
        );
        let err = load_env(&[("GORGE_LISTEN_ADDR", "nowhere")]).unwrap_err();
        assert_eq!(
            (err.key.as_str(), err.value.as_str()),
            ("GORGE_LISTEN_ADDR", "nowhere")
        );
        let err = load_env(&[("GORGE_WEBHOOK_NAMESPACE", "x; DROP")]).unwrap_err();
        assert_eq!(err.key, "GORGE_WEBHOOK_NAMESPACE");
        let err = load_env(&[("GORGE_WEBHOOK_MYSQL_PORT", "0")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: GORGE_WEBHOOK_MYSQL_PORT=\"0\": expected a port number 1-65535"
        );
        let err =
            load_env(&[("GORGE_WEBHOOK_RETRY_BACKOFF_SEC", "18446744073709551615")]).unwrap_err();
        assert_eq!(err.key, "GORGE_WEBHOOK_RETRY_BACKOFF_SEC");
    }

    /// A value from the file is named by its file key; a variable's spelling there gets the key.
    #[test]
    fn file_values_are_named_as_the_operator_wrote_them() {
        let dir = tempfile::tempdir().unwrap();
        let load = |text: &str| {
            let path = dir.path().join("webhook.toml");
            std::fs::write(&path, text).unwrap();
            (
                Settings::load_from(Some(&path), &|_| None).unwrap_err(),
                path,
            )
        };
        let (err, path) = load("namespace = \"x; DROP\"\n");
        assert_eq!(
            (err.key, err.value),
            (
                format!("namespace (in {})", path.display()),
                "x; DROP".into()
            )
        );
        let (err, _) = load("gorge_listen_addr = \"127.0.0.1:8160\"\n");
        assert_eq!(err.reason, "unknown key (did you mean `listen_addr`?)");
    }

    #[test]
    fn the_shared_variables_have_one_name() {
        let err = load_env(&[("GORGE_WEBHOOK_SERVICE_TOKEN", "tok")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: GORGE_WEBHOOK_SERVICE_TOKEN=\"********\": \
             not read: this setting's variable is GORGE_SERVICE_TOKEN"
        );
        let err = load_env(&[("GORGE_WEBHOOK_LISTEN_ADDR", "127.0.0.1:1")]).unwrap_err();
        assert_eq!(err.key, "GORGE_WEBHOOK_LISTEN_ADDR");
        let s = load_env(&[("GORGE_SERVICE_TOKEN", "tok")]).unwrap();
        assert_eq!(s.service_token.expose(), "tok");
    }

    #[test]
    fn describe_masks_secrets() {
        let s = load_env(&[
            ("GORGE_WEBHOOK_MYSQL_PASS", "hunter2"),
            ("GORGE_SERVICE_TOKEN", "tok"),
        ])
        .unwrap();
        let text = s.describe();
        assert!(
            !text.contains("hunter2") && !text.contains("tok\n"),
            "{text}"
        );
        assert_eq!(shown(&s, "GORGE_WEBHOOK_MYSQL_PASS"), "********");
        assert_eq!(shown(&s, "GORGE_SERVICE_TOKEN"), "********");
    }

    #[test]
    fn file_keys_are_the_settings_and_typos_get_a_hint() {
        let mut keys: Vec<&str> = RawSettings::file_keys().collect();
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
        let reason = |key| gorge_service::config::unknown_key_reason(key, keys.iter().copied());
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
    fn no_blacklist_and_short_backoff_warn() {
        let s = load_env(&[("GORGE_WEBHOOK_OUTBOUND_BLACKLIST", "none")]).unwrap();
        assert!(s.warnings()[0].contains("SSRF"), "{:?}", s.warnings());
        let s = load_env(&[("GORGE_WEBHOOK_RETRY_BACKOFF_SEC", "0")]).unwrap();
        assert_eq!(s.warnings().len(), 1);
    }

    #[test]
    fn connections_are_bounded_apart_from_concurrency_and_tcp_by_default() {
        let s = load_env(&[]).unwrap();
        assert_eq!(
            (s.mysql_max_connections, s.mysql_max_lock_connections),
            (4, 16)
        );
        assert_eq!(s.connection_budget(), 4 + 8);
        // Never moved onto the local Unix socket unless one is configured.
        assert!(!s.mysql_opts().prefer_socket());
        assert_eq!(s.mysql_opts().socket(), None);
        let s = load_env(&[("GORGE_WEBHOOK_MYSQL_SOCKET", "/run/mysqld/mysqld.sock")]).unwrap();
        assert_eq!(s.mysql_opts().socket(), Some("/run/mysqld/mysqld.sock"));

        let s = load_env(&[("GORGE_WEBHOOK_MAX_CONCURRENT", "256")]).unwrap();
        assert_eq!(s.max_concurrent, 16, "one lock connection per delivery");
        assert_eq!(s.connection_budget(), 20);
        assert_eq!(s.adjustments()[0].0, "GORGE_WEBHOOK_MAX_CONCURRENT");
    }
}
