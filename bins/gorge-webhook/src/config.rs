//! Configuration: defaults → optional TOML/JSON file → environment, validated once at startup
//! into [`Config`], the plain struct the service runs with. Each setting is declared once, in
//! [`RawSettings`] (see `gorge_service::settings`): its kind decides how it parses and what an
//! error says is valid, and its help is the "Meaning" of docs/webhook.md's table (checked by a
//! test). What follows from the settings — effective values where one setting limits another,
//! how long a stop may take — is declared once too, in [`Config`]'s `DERIVED` list (see
//! `gorge_service::derived`); [`Loaded`] keeps what the configuration was built from, for
//! `--check-config`, `--print-config` and the started event.
//!
//! Every bad value is a [`ConfigError`] naming the variable and the value (exit code 2):
//! a webhook service that silently falls back to a default poll interval or blacklist is
//! worse than one that refuses to start. So is an unknown key in the file (a typo would
//! otherwise leave the default in place); unknown `GORGE_WEBHOOK_*` variables are only
//! warned about, because the environment is shared with others (Kubernetes service links).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gorge_claim::{ClaimTiming, StoreOptions};
use gorge_service::config::{env_value, CheckLine};
use gorge_service::derived::{self, Adjustment, Derived, Derives, Formula};
use gorge_service::events::Event;
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

/// Time for in-flight HTTP requests on the status port once the drain is over.
pub const REQUEST_GRACE_SEC: u64 = 5;

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
    pub struct RawSettings, prefix "GORGE_WEBHOOK_", keys Keys {
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
        listen_addr: Text = format!("127.0.0.1:{DEFAULT_HEALTH_PORT}"),
            "status/diagnostic HTTP listener, `IP:PORT`; loopback by default, like \
             gorge-notification's admin port (the chart and Compose set the pod/container \
             address). Any other address needs `GORGE_SERVICE_TOKEN` (file key `listen_addr`; \
             shared name, no `GORGE_WEBHOOK_` prefix)";
        #[env("GORGE_SERVICE_TOKEN")]
        service_token: SecretText = Secret::default(),
            "token for `/api/webhook/*`; empty disables auth, allowed only when the listener \
             is on a loopback address (else startup stops) (file key `service_token`)";
    }
}

/// Each setting's key, as code outside the declaration names it.
const KEYS: Keys = RawSettings::KEYS;

/// The effective claim lease: at least the delivery timeout plus [`LEASE_MARGIN_SEC`].
const CLAIM_LEASE: Formula = Formula::Max(&[
    Formula::Setting(KEYS.claim_lease_sec),
    Formula::Sum(&[
        Formula::Setting(KEYS.delivery_timeout),
        Formula::Constant(LEASE_MARGIN_SEC),
    ]),
]);

/// How long the drain may take: a row claimed just before SIGTERM has its POST and then its
/// result write retried while the claim's lease protects the row; the last attempt, begun
/// inside the lease, may wait one query timeout for a connection and one for the statement.
const DRAIN: Formula = Formula::Sum(&[
    CLAIM_LEASE,
    Formula::Times(2, &Formula::Setting(KEYS.mysql_query_timeout_sec)),
]);

/// The longest a stop takes after SIGTERM: the drain, then the grace for status requests.
const STOP_WITHIN: Formula = Formula::Sum(&[DRAIN, Formula::Constant(REQUEST_GRACE_SEC)]);

/// The server-side idle limit of lock sessions: longer than a lock is ever held without a
/// statement — the claim's lease (the POST and the result-write retries fall within it)
/// plus the statements before the claim (breaker, object, transactions, claim) and the last
/// write, each bounded by the query timeout.
const LOCK_SESSION_TIMEOUT: Formula = Formula::Sum(&[
    CLAIM_LEASE,
    Formula::Times(5, &Formula::Setting(KEYS.mysql_query_timeout_sec)),
]);

/// Where MariaDB is and how the service uses it.
#[derive(Debug, Clone)]
pub struct Database {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub pass: Secret,
    /// A Unix socket to connect through instead of host and port.
    pub socket: Option<String>,
    /// `{namespace}_herald`.
    pub name: String,
    /// The query pool's bound.
    pub max_connections: usize,
    /// The lock pool's bound.
    pub max_lock_connections: usize,
    /// Bound on every statement and on waiting for a pooled connection.
    pub query_timeout: Duration,
    /// The server's idle limit of lock sessions.
    pub lock_session_timeout: Duration,
}

impl Database {
    /// Connection options (the database and pools are set by the store). TCP to the
    /// configured host and port unless a socket is configured: mysql_async would otherwise
    /// move every connection onto the server's `@@socket` whenever that path exists locally,
    /// which with two local servers is the wrong one.
    pub fn mysql_opts(&self) -> mysql_async::Opts {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname(self.host.clone())
            .tcp_port(self.port)
            .user(Some(self.user.clone()))
            .pass((!self.pass.is_empty()).then(|| self.pass.expose().to_string()))
            .prefer_socket(false)
            .socket(self.socket.clone())
            .into()
    }

    /// Pool bounds and the statement timeout for the claim store.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            query_timeout: self.query_timeout,
            max_connections: self.max_connections,
            max_lock_connections: self.max_lock_connections,
            idle_timeout: POOL_IDLE_TTL,
            lock_session_timeout: self.lock_session_timeout,
        }
    }

    /// Where the service connects: `host:port`, or `socket PATH`.
    pub fn address(&self) -> String {
        match &self.socket {
            Some(path) => format!("socket {path}"),
            None if self.host.contains(':') => format!("[{}]:{}", self.host, self.port),
            None => format!("{}:{}", self.host, self.port),
        }
    }
}

/// What the service runs with: every setting validated, in the type it is used as, and
/// effective where another setting limits it (`DERIVED` says which, and why).
#[derive(Debug, Clone)]
pub struct Config {
    pub database: Database,
    pub poll_interval: Duration,
    /// At most one delivery per lock connection.
    pub max_concurrent: usize,
    pub delivery_timeout: Duration,
    /// At least the delivery timeout plus [`LEASE_MARGIN_SEC`].
    pub claim_lease: Duration,
    pub retry_backoff: Duration,
    /// The circuit breaker's window and the failures within it that open it.
    pub breaker_window: Duration,
    pub breaker_threshold: u64,
    pub outbound_policy: OutboundPolicy,
    /// The CA file, if one is set, and the CAs read from it at startup.
    pub ca_file: Option<PathBuf>,
    pub extra_roots: ExtraRoots,
    pub listen_addr: SocketAddr,
    pub service_token: Secret,
    /// The bound on the drain after SIGTERM (then [`REQUEST_GRACE_SEC`] for status requests).
    pub drain_deadline: Duration,
}

impl Config {
    /// Lease and backoff as the claim protocol takes them.
    pub fn claim_timing(&self) -> ClaimTiming {
        ClaimTiming {
            lease_sec: self.claim_lease.as_secs(),
            retry_backoff_sec: self.retry_backoff.as_secs(),
        }
    }

    /// The most database connections one process opens (query pool + lock pool, the lock
    /// pool never more than the deliveries that can run).
    pub fn connection_budget(&self) -> usize {
        self.database.max_connections + self.max_concurrent
    }

    /// Descriptors kept out of the status port's reach (see `fdlimit.rs`): the fixed base,
    /// the query pool, per delivery in flight its lock connection and its outbound
    /// connection, and the receivers' idle keep-alive connections of one host.
    pub fn fd_reserve(&self) -> usize {
        crate::fdlimit::FD_BASE
            + self.database.max_connections
            + 2 * self.max_concurrent
            + crate::connector::POOL_MAX_IDLE_PER_KEY
    }

    /// How long without progress (a completed poll round or a written result) before the
    /// service reports not ready: a POST may take the whole delivery timeout, and a poll or
    /// a write the query timeout, twice over.
    pub fn stall_limit(&self) -> Duration {
        self.delivery_timeout
            + self.database.query_timeout * 2
            + self.poll_interval
            + Duration::from_secs(5)
    }
}

impl Derives for Config {
    type Settings = RawSettings;
    const DERIVED: &'static [Derived<Config>] = &[
        Derived::computed(
            "",
            |c: &Config| c.max_concurrent.into(),
            "deliveries in flight at most: one per lock connection",
        )
        .adjusting(
            KEYS.max_concurrent,
            "lowered to the lock connections: each delivery holds one",
        ),
        Derived::formula(
            "",
            CLAIM_LEASE,
            "how long a claimed row is invisible to other claimants: never shorter than a POST \
             may take, so a POST still running is never claimed again",
        )
        .adjusting(KEYS.claim_lease_sec, "raised to cover the delivery timeout"),
        Derived::formula(
            "stop_within_sec",
            STOP_WITHIN,
            "the longest a stop takes after SIGTERM: the claim's lease (a POST, then its result \
             write retried while the lease protects the row), the last write attempt (a \
             connection and a statement, each bounded by the query timeout), then the status \
             requests' grace. The systemd unit's `TimeoutStopSec` and the chart's grace period \
             leave the process at least this (a process killed sooner sends the row again)",
        ),
        Derived::computed(
            "database",
            |c: &Config| c.database.name.as_str().into(),
            "the database read and written: `{namespace}_herald`",
        ),
        Derived::computed(
            "mysql_address",
            |c: &Config| c.database.address().into(),
            "where the service connects: host:port over TCP, or `socket PATH` when a socket is \
             set",
        ),
        Derived::computed(
            "mysql_connection_budget",
            |c: &Config| c.connection_budget().into(),
            "the most database connections one process opens: the query pool's bound plus one \
             lock connection per delivery in flight",
        ),
        Derived::computed(
            "status_fd_reserve",
            |c: &Config| c.fd_reserve().into(),
            "file descriptors the status port's connections never take, kept for deliveries \
             and the database: 64, the query pool's bound, two per delivery in flight (its \
             lock connection and its outbound connection) and 16 idle receiver connections. \
             The status port holds at most the soft open-file limit less this (at least 8); \
             one more is closed at once and counted in \
             `status_connections_closed_total{reason=\"fd_reserve\"}`",
        ),
        Derived::formula(
            "lock_session_timeout_sec",
            LOCK_SESSION_TIMEOUT,
            "the server's idle limit (`wait_timeout`) of lock sessions: longer than a lock is \
             ever held without a statement, so the server ends a lock session whose network \
             path died",
        ),
        Derived::computed(
            "readiness_stall_ms",
            |c: &Config| (c.stall_limit().as_millis() as u64).into(),
            "`/readyz` answers 503 after this long without a poll round or a result write: a \
             POST's timeout, two query timeouts, a poll interval and 5 s",
        ),
        Derived::computed(
            "outbound_networks",
            |c: &Config| c.outbound_policy.len().into(),
            "networks the outbound blacklist holds",
        ),
        Derived::computed(
            "extra_ca_certificates",
            |c: &Config| c.extra_roots.len().into(),
            "CA certificates read from the CA file, trusted with the bundled and system roots",
        ),
    ];
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

/// The configuration as loaded: the validated [`Config`], and what it was built from — the
/// settings as layered with their sources, the logging variables, unknown variables — for
/// `--check-config`, `--print-config`, the started event and the startup warnings.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    layered: Layered<RawSettings>,
    log: Layered<LogVars>,
    /// Unknown `GORGE_WEBHOOK_*` and `GORGE_LOG_*` variables, found when loading.
    unknown_variables: Vec<String>,
}

impl Loaded {
    /// Layers defaults, the optional file and the environment, then validates (the logging
    /// variables too, against the components of `events`, so `--check-config` refuses what
    /// startup refuses).
    pub fn load(file: Option<&Path>, events: &[Event]) -> Result<Loaded, ConfigError> {
        let log = gorge_service::logging::log_vars(events)?;
        let mut loaded = Loaded::load_from(file, &|var| env_value(var))?;
        loaded.log = log;
        loaded.unknown_variables = unknown_env_warnings::<RawSettings>(std::env::vars());
        let log_warnings = unknown_env_warnings::<LogVars>(std::env::vars());
        loaded.unknown_variables.extend(log_warnings);
        Ok(loaded)
    }

    /// Every setting at its default.
    pub fn defaults() -> Loaded {
        Loaded::load_from(None, &|_| None).expect("the defaults are valid")
    }

    /// [`Loaded::load`] with the environment as `env` reads it.
    fn load_from(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Loaded, ConfigError> {
        let mut layered = Layered::<RawSettings>::default();
        if let Some(path) = file {
            let mut entries = settings::read_file(path, "--config", &FILE_FORMATS)?;
            // A list is what TOML (and the chart's value) makes natural for the blacklist;
            // read it as the variable's comma-separated text.
            if let Some(serde_json::Value::Array(items)) = entries.get(KEYS.outbound_blacklist) {
                if let Some(texts) = items.iter().map(|i| i.as_str()).collect::<Option<Vec<_>>>() {
                    let joined = texts.join(", ");
                    entries.insert(KEYS.outbound_blacklist.into(), joined.into());
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
        Ok(Loaded {
            config: validate(&layered)?,
            layered,
            log: Layered::default(),
            unknown_variables: Vec::new(),
        })
    }

    /// Effective values that differ from the configured ones; logged once at startup.
    pub fn adjustments(&self) -> Vec<Adjustment> {
        derived::adjustments(&self.config, &self.layered)
    }

    /// The started event's fields (`events::STARTED_FIELDS`).
    pub fn started(&self) -> derived::Started {
        derived::started(&self.config, &self.layered)
    }

    /// Combinations that cannot take effect as written; logged as warnings at startup.
    pub fn warnings(&self) -> Vec<String> {
        let config = &self.config;
        let var = RawSettings::env_var;
        let mut out = self.unknown_variables.clone();
        if config.outbound_policy.is_empty() {
            out.push(format!(
                "{}={NO_BLACKLIST}: webhooks may reach any address, including this network's \
                 private ones and cloud metadata (SSRF); mirror Phorge's \
                 security.outbound-blacklist instead",
                var(KEYS.outbound_blacklist)
            ));
        }
        let poll_ms = config.poll_interval.as_millis() as u64;
        if (config.retry_backoff.as_millis() as u64) < poll_ms {
            out.push(format!(
                "{}={} is shorter than the poll interval ({poll_ms} ms): an idle queue retries \
                 only once per poll",
                var(KEYS.retry_backoff_sec),
                config.retry_backoff.as_secs()
            ));
        }
        if !config.listen_addr.ip().is_loopback() {
            out.push(format!(
                "{}={} is not a loopback address: the status port (/api/webhook/*, /metrics) is \
                 reachable from the network; keep it behind a firewall or NetworkPolicy",
                var(KEYS.listen_addr),
                config.listen_addr
            ));
        }
        if (config.breaker_window.as_millis() as u64) < poll_ms {
            out.push(format!(
                "{}={} is shorter than the poll interval ({poll_ms} ms): the breaker window \
                 closes between polls",
                var(KEYS.error_backoff_sec),
                config.breaker_window.as_secs()
            ));
        }
        out
    }

    /// The `--check-config` lines, secrets masked, each with its source: the settings (an
    /// adjusted one with what was configured), the derived facts, the logging variables.
    pub fn check_lines(&self) -> Vec<CheckLine> {
        let mut lines = derived::check_lines(&self.config, &self.layered);
        lines.extend(self.log.log_check_lines());
        lines
    }

    /// `--check-config`'s text: one line per setting and derived fact, then the warnings.
    pub fn describe(&self) -> String {
        gorge_service::config::check_config_text(&self.check_lines(), &self.warnings())
    }

    /// A TOML file holding every setting with its effective value (the defaults when
    /// nothing is set; secrets are written empty, never printed), then the derived facts as
    /// comments.
    pub fn print_config(&self) -> String {
        let mut out = settings::toml_file(&print_config_header(), &self.layered.values);
        out.push_str(&derived::print_comments(&self.config, &self.layered));
        out
    }

    /// docs/webhook.md's table of derived facts, with these settings' values.
    pub fn derived_table(&self) -> String {
        derived::docs_table(&self.config, &self.layered)
    }
}

/// `--print-config`'s header: which variables override the file, from the declaration (the
/// prefix + the key in upper case, except the settings whose `#[env]` names a shared one).
fn print_config_header() -> String {
    let prefix = RawSettings::PREFIX;
    let mut header = format!(
        "# gorge-webhook configuration (--config PATH). Environment variables override\n\
         # these: {prefix}<KEY>, the key in upper case"
    );
    let mut shared = RawSettings::SETTINGS
        .iter()
        .filter_map(|info| Some((info.key, info.own_env_var()?)))
        .peekable();
    if shared.peek().is_some() {
        header.push_str(", except:\n");
        for (key, var) in shared {
            header.push_str(&format!("#   {key}: {var}\n"));
        }
    } else {
        header.push_str(".\n");
    }
    header.push_str("# See docs/webhook.md.\n");
    header
}

/// Validates the settings into the [`Config`] the service runs with.
fn validate(layered: &Layered<RawSettings>) -> Result<Config, ConfigError> {
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
            var(KEYS.namespace),
            &raw.namespace,
            "expected letters, digits and underscores",
        ));
    }
    if raw.mysql_host.trim().is_empty() {
        return Err(ConfigError::new(
            var(KEYS.mysql_host),
            &raw.mysql_host,
            "must not be empty",
        ));
    }
    let outbound_policy = OutboundPolicy::parse(&raw.outbound_blacklist).map_err(|bad| {
        ConfigError::new(
            var(KEYS.outbound_blacklist),
            bad,
            "expected CIDRs or IP addresses separated by commas or spaces, or none",
        )
    })?;
    let listen_addr: SocketAddr = raw.listen_addr.parse().map_err(|_| {
        ConfigError::new(
            var(KEYS.listen_addr),
            &raw.listen_addr,
            "expected IP:PORT, e.g. 127.0.0.1:8160",
        )
    })?;
    // The API's counts and PHIDs are for operators: open only where only this host reaches.
    if raw.service_token.is_empty() && !listen_addr.ip().is_loopback() {
        return Err(ConfigError::new(
            var(KEYS.service_token),
            "",
            format!(
                "empty while {}={listen_addr} is not a loopback address: /api/webhook/* would \
                 be open to the network; set a token (Phorge's gorge.webhook.token) or listen \
                 on 127.0.0.1",
                var(KEYS.listen_addr)
            ),
        ));
    }
    let ca_file = Some(raw.ca_file.trim())
        .filter(|path| !path.is_empty())
        .map(PathBuf::from);
    let extra_roots = match &ca_file {
        Some(path) => ExtraRoots::load(path).map_err(|reason| {
            ConfigError::new(
                var(KEYS.ca_file),
                path.display(),
                format!("{reason} (expected a readable PEM file of CA certificates)"),
            )
        })?,
        None => ExtraRoots::default(),
    };
    let seconds = |formula: Formula| Duration::from_secs(formula.of(raw));
    Ok(Config {
        database: Database {
            host: raw.mysql_host.clone(),
            port: raw.mysql_port,
            user: raw.mysql_user.clone(),
            pass: raw.mysql_pass.clone(),
            socket: Some(raw.mysql_socket.clone()).filter(|path| !path.is_empty()),
            name: format!("{}_herald", raw.namespace),
            max_connections: raw.mysql_max_connections,
            max_lock_connections: raw.mysql_max_lock_connections,
            query_timeout: Duration::from_secs(raw.mysql_query_timeout_sec),
            lock_session_timeout: seconds(LOCK_SESSION_TIMEOUT),
        },
        poll_interval: Duration::from_millis(raw.poll_interval_ms),
        max_concurrent: raw.max_concurrent.min(raw.mysql_max_lock_connections),
        delivery_timeout: Duration::from_secs(raw.delivery_timeout),
        claim_lease: seconds(CLAIM_LEASE),
        retry_backoff: Duration::from_secs(raw.retry_backoff_sec),
        breaker_window: Duration::from_secs(raw.error_backoff_sec),
        breaker_threshold: raw.error_threshold,
        outbound_policy,
        ca_file,
        extra_roots,
        listen_addr,
        service_token: raw.service_token.clone(),
        drain_deadline: seconds(DRAIN),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loads the defaults overridden by `vars` (as environment variables).
    fn load_env(vars: &[(&str, &str)]) -> Result<Loaded, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Loaded::load_from(None, &move |var| {
            vars.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
        })
    }

    fn shown(s: &Loaded, name: &str) -> String {
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
        assert_eq!(s.config.extra_roots.len(), 1);
        assert_eq!(shown(&s, "extra_ca_certificates"), "1");
        assert!(load_env(&[]).unwrap().config.ca_file.is_none());
    }

    #[test]
    fn defaults_are_the_spec_values() {
        let s = load_env(&[]).unwrap();
        let c = &s.config;
        assert_eq!(c.database.name, "phabricator_herald");
        assert_eq!(c.poll_interval, Duration::from_millis(1000));
        assert_eq!(c.max_concurrent, 8);
        assert_eq!(c.delivery_timeout, Duration::from_secs(15));
        assert_eq!(c.claim_lease, Duration::from_secs(30));
        assert_eq!(c.retry_backoff, Duration::from_secs(60));
        assert_eq!(
            (c.breaker_window, c.breaker_threshold),
            (Duration::from_secs(300), 10)
        );
        assert_eq!(c.listen_addr, "127.0.0.1:8160".parse().unwrap());
        assert_eq!(c.outbound_policy.len(), 29);
        assert!(s.adjustments().is_empty());
        assert!(s.warnings().is_empty());
    }

    /// The stop bound is what the shutdown is given: the drain's deadline, then the grace of
    /// status requests.
    #[test]
    fn the_stop_bound_is_the_drain_deadline_and_the_request_grace() {
        for vars in [
            &[][..],
            &[("GORGE_WEBHOOK_CLAIM_LEASE_SEC", "120")][..],
            &[("GORGE_WEBHOOK_DELIVERY_TIMEOUT", "60")][..],
            &[("GORGE_WEBHOOK_MYSQL_QUERY_TIMEOUT_SEC", "30")][..],
        ] {
            let s = load_env(vars).unwrap();
            let stop: u64 = shown(&s, "stop_within_sec").parse().unwrap();
            assert_eq!(
                Duration::from_secs(stop),
                s.config.drain_deadline + Duration::from_secs(REQUEST_GRACE_SEC),
                "{vars:?}"
            );
        }
        assert_eq!(shown(&load_env(&[]).unwrap(), "stop_within_sec"), "55");
        let lease = load_env(&[("GORGE_WEBHOOK_DELIVERY_TIMEOUT", "60")]).unwrap();
        assert_eq!(lease.config.claim_lease, Duration::from_secs(65));
        assert_eq!(shown(&lease, "stop_within_sec"), "90");
    }

    #[test]
    fn lease_is_raised_to_cover_the_timeout_and_reported() {
        let s = load_env(&[
            ("GORGE_WEBHOOK_CLAIM_LEASE_SEC", "10"),
            ("GORGE_WEBHOOK_DELIVERY_TIMEOUT", "20"),
        ])
        .unwrap();
        assert_eq!(s.config.claim_lease, Duration::from_secs(25));
        let adjusted = s.adjustments();
        assert_eq!(adjusted.len(), 1);
        assert_eq!(
            (
                adjusted[0].var.as_str(),
                adjusted[0].configured.to_string(),
                adjusted[0].effective.to_string()
            ),
            (
                "GORGE_WEBHOOK_CLAIM_LEASE_SEC",
                "10".to_string(),
                "25".to_string()
            )
        );
        assert_eq!(
            shown(&s, "GORGE_WEBHOOK_CLAIM_LEASE_SEC"),
            "25 (configured 10, raised to cover the delivery timeout)"
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
            (Loaded::load_from(Some(&path), &|_| None).unwrap_err(), path)
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
        assert_eq!(s.config.service_token.expose(), "tok");
    }

    /// The status port is loopback unless configured; elsewhere it needs a token, and
    /// `--check-config` warns that it is reachable.
    #[test]
    fn an_open_api_is_allowed_on_loopback_only() {
        let s = load_env(&[]).unwrap();
        assert!(s.config.listen_addr.ip().is_loopback());
        assert_eq!(shown(&s, "GORGE_LISTEN_ADDR"), "127.0.0.1:8160");
        let err = load_env(&[("GORGE_LISTEN_ADDR", "0.0.0.0:8160")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: GORGE_SERVICE_TOKEN=\"\": empty while \
             GORGE_LISTEN_ADDR=0.0.0.0:8160 is not a loopback address: /api/webhook/* would be \
             open to the network; set a token (Phorge's gorge.webhook.token) or listen on \
             127.0.0.1"
        );
        let s = load_env(&[("GORGE_LISTEN_ADDR", "[::1]:8160")]).unwrap();
        assert!(s.warnings().is_empty(), "{:?}", s.warnings());
        let s = load_env(&[
            ("GORGE_LISTEN_ADDR", "0.0.0.0:8160"),
            ("GORGE_SERVICE_TOKEN", "tok"),
        ])
        .unwrap();
        assert_eq!(
            s.warnings(),
            [
                "GORGE_LISTEN_ADDR=0.0.0.0:8160 is not a loopback address: the status port \
              (/api/webhook/*, /metrics) is reachable from the network; keep it behind a \
              firewall or NetworkPolicy"
            ]
        );
    }

    /// `--print-config`'s header names the variables that override each key, and each one
    /// it names is the one read (a `GORGE_WEBHOOK_LISTEN_ADDR` is refused).
    #[test]
    fn the_print_config_header_names_the_variables_read() {
        let printed = Loaded::defaults().print_config();
        let header: Vec<&str> = printed.lines().take_while(|l| l.starts_with('#')).collect();
        assert_eq!(
            header,
            [
                "# gorge-webhook configuration (--config PATH). Environment variables override",
                "# these: GORGE_WEBHOOK_<KEY>, the key in upper case, except:",
                "#   listen_addr: GORGE_LISTEN_ADDR",
                "#   service_token: GORGE_SERVICE_TOKEN",
                "# See docs/webhook.md.",
            ]
        );
        let s = load_env(&[("GORGE_LISTEN_ADDR", "127.0.0.1:9999")]).unwrap();
        assert_eq!(s.config.listen_addr.port(), 9999);
        let s = load_env(&[("GORGE_WEBHOOK_POLL_INTERVAL_MS", "250")]).unwrap();
        assert_eq!(s.config.poll_interval, Duration::from_millis(250));
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
        let started: Vec<String> = s
            .started()
            .fields()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert!(
            started.contains(&"mysql_pass=********".to_string()),
            "{started:?}"
        );
        assert!(!format!("{started:?}").contains("hunter2"));
    }

    /// The started event carries each setting by its key and each derived fact by its name,
    /// exactly the fields `WEBHOOK_STARTED` declares.
    #[test]
    fn the_started_fields_are_the_declared_ones() {
        let s = load_env(&[("GORGE_WEBHOOK_MAX_CONCURRENT", "64")]).unwrap();
        let started = s.started();
        let keys: Vec<&str> = started.fields().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, crate::events::WEBHOOK_STARTED.fields);
        let value = |key: &str| {
            started
                .fields()
                .iter()
                .find(|(k, _)| *k == key)
                .unwrap()
                .1
                .to_string()
        };
        assert_eq!(value("max_concurrent"), "16", "the effective value");
        assert_eq!(value("delivery_timeout"), "15");
        assert_eq!(value("stop_within_sec"), "55");
        assert_eq!(value("database"), "phabricator_herald");
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
        assert_eq!(
            s.warnings(),
            [
                "GORGE_WEBHOOK_RETRY_BACKOFF_SEC=0 is shorter than the poll interval (1000 ms): \
              an idle queue retries only once per poll"
            ]
        );
    }

    /// The status port's reserve follows the pools and the concurrency.
    #[test]
    fn the_descriptor_reserve_covers_the_pools_and_deliveries() {
        let s = load_env(&[]).unwrap();
        // 64 + query pool 4 + 8 deliveries × (lock + outbound) + 16 idle outbound.
        assert_eq!(s.config.fd_reserve(), 100);
        assert_eq!(shown(&s, "status_fd_reserve"), "100");
        let s = load_env(&[
            ("GORGE_WEBHOOK_MAX_CONCURRENT", "64"),
            ("GORGE_WEBHOOK_MYSQL_MAX_LOCK_CONNECTIONS", "64"),
            ("GORGE_WEBHOOK_MYSQL_MAX_CONNECTIONS", "10"),
        ])
        .unwrap();
        assert_eq!(s.config.fd_reserve(), 64 + 10 + 128 + 16);
    }

    #[test]
    fn connections_are_bounded_apart_from_concurrency_and_tcp_by_default() {
        let s = load_env(&[]).unwrap();
        let db = &s.config.database;
        assert_eq!((db.max_connections, db.max_lock_connections), (4, 16));
        assert_eq!(s.config.connection_budget(), 4 + 8);
        assert_eq!(shown(&s, "mysql_address"), "127.0.0.1:3306");
        // Never moved onto the local Unix socket unless one is configured.
        assert!(!db.mysql_opts().prefer_socket());
        assert_eq!(db.mysql_opts().socket(), None);
        let s = load_env(&[("GORGE_WEBHOOK_MYSQL_SOCKET", "/run/mysqld/mysqld.sock")]).unwrap();
        assert_eq!(
            s.config.database.mysql_opts().socket(),
            Some("/run/mysqld/mysqld.sock")
        );
        assert_eq!(shown(&s, "mysql_address"), "socket /run/mysqld/mysqld.sock");

        let s = load_env(&[("GORGE_WEBHOOK_MAX_CONCURRENT", "256")]).unwrap();
        assert_eq!(
            s.config.max_concurrent, 16,
            "one lock connection per delivery"
        );
        assert_eq!(s.config.connection_budget(), 20);
        assert_eq!(s.adjustments()[0].var, "GORGE_WEBHOOK_MAX_CONCURRENT");
        assert_eq!(
            shown(&s, "GORGE_WEBHOOK_MAX_CONCURRENT"),
            "16 (configured 256, lowered to the lock connections: each delivery holds one)"
        );
    }
}
