//! Configuration helpers both services share: environment layers where an empty variable
//! means "use the default" and values are typed by the setting (not by how they look),
//! errors reduced to one line naming the key and the bad value in plain words, exit code 2,
//! warnings for unknown variables with a did-you-mean, the one `--check-config` format
//! (value and source of each setting), and a [`Secret`] string that never prints itself.

use std::fmt;

use figment::error::{Actual, Kind};
use figment::Figment;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// Exit code for an invalid configuration (distinct from 1, a runtime failure).
pub const CONFIG_EXIT_CODE: i32 = 2;

/// Reads one environment variable, treating unset and empty the same way.
pub fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// An invalid setting: which key, what value, and why. Displays as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The setting as the operator knows it (an environment variable, a file key, an option).
    pub key: String,
    /// The value as given (masked for secrets by the caller).
    pub value: String,
    /// What was expected instead, in plain words.
    pub reason: String,
}

impl ConfigError {
    /// An error for `key` set to `value`, refused because of `reason`.
    pub fn new(key: impl Into<String>, value: impl ToString, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The value is printed escaped so that a stray newline cannot split the line.
        write!(
            f,
            "invalid configuration: {}={:?}: {}",
            self.key, self.value, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

/// Extracts `T` from `figment`, turning figment's error into a [`ConfigError`] that names the
/// environment variable (`env_prefix` + key in upper case) when the value came from the
/// environment, or the dotted key path when it came from a file or the defaults.
pub fn extract<T: DeserializeOwned>(figment: &Figment, env_prefix: &str) -> Result<T, ConfigError> {
    figment
        .extract::<T>()
        .map_err(|err| describe_figment_error(figment, &err, env_prefix))
}

fn describe_figment_error(
    figment: &Figment,
    err: &figment::Error,
    env_prefix: &str,
) -> ConfigError {
    let path = err.path.join(".");
    let from_env = err
        .metadata
        .as_ref()
        .is_some_and(|md| md.name.contains("environment"));
    let key = if from_env {
        format!("{env_prefix}{}", err.path.join("_").to_uppercase())
    } else if let Some(source) = err.metadata.as_ref().and_then(|md| md.source.as_ref()) {
        format!("{path} (in {source})")
    } else {
        path.clone()
    };
    let value = match (&err.kind, from_env) {
        (_, true) => env_value(&key).unwrap_or_default(),
        (Kind::InvalidType(actual, _) | Kind::InvalidValue(actual, _), false) => {
            actual_text(actual)
        }
        _ => figment
            .find_value(&path)
            .map(|v| format!("{v:?}"))
            .unwrap_or_default(),
    };
    let reason = match &err.kind {
        // A quoted number in a file is a string to the parser; say so.
        Kind::InvalidType(Actual::Str(_), expected) if !from_env && is_numeric(expected) => {
            format!("expected {expected}: {NOT_A_STRING}")
        }
        Kind::InvalidType(_, expected) | Kind::InvalidValue(_, expected) => {
            format!("expected {expected}")
        }
        Kind::UnknownField(field, _) => format!("unknown key `{field}`"),
        Kind::MissingField(field) => format!("missing key `{field}`"),
        other => other.to_string(),
    };
    let key = match &err.kind {
        Kind::UnknownField(field, _) if key.is_empty() => field.clone(),
        Kind::MissingField(field) if key.is_empty() => field.to_string(),
        _ => key,
    };
    ConfigError::new(key, value, reason)
}

/// The suffix of an error about a quoted number in a file.
pub const NOT_A_STRING: &str = "a number, not a string";

fn is_numeric(expected: &str) -> bool {
    let name = expected.trim_start_matches("a ").trim_start_matches("an ");
    matches!(
        name,
        "u8" | "u16"
            | "u32"
            | "u64"
            | "u128"
            | "usize"
            | "i8"
            | "i16"
            | "i32"
            | "i64"
            | "i128"
            | "isize"
            | "f32"
            | "f64"
    )
}

fn actual_text(actual: &Actual) -> String {
    match actual {
        Actual::Str(s) => s.clone(),
        Actual::Signed(n) => n.to_string(),
        Actual::Unsigned(n) => n.to_string(),
        Actual::Float(n) => n.to_string(),
        Actual::Bool(b) => b.to_string(),
        other => other.to_string(),
    }
}

/// Records that setting `key` came from `source` in a `--check-config` source list.
pub fn set_source(sources: &mut [(&'static str, Source)], key: &str, source: Source) {
    if let Some(entry) = sources.iter_mut().find(|(k, _)| *k == key) {
        entry.1 = source;
    }
}

/// Where an effective value came from, as `--check-config` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// No file, variable or option set it.
    Default,
    /// The configuration file (its path).
    File(String),
    /// An environment variable (its name).
    Env(String),
    /// A command-line option (its name, e.g. `--config`).
    Option(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(path) => write!(f, "file {path}"),
            Source::Env(var) => write!(f, "env {var}"),
            Source::Option(name) => write!(f, "option {name}"),
        }
    }
}

/// One line of `--check-config`: the setting's name, its effective value, its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckLine {
    /// The setting's name (an environment variable name, or a file key where there is none).
    pub name: String,
    /// The effective value as printed (secrets masked).
    pub value: String,
    /// Where the value came from.
    pub source: Source,
}

/// The `--check-config` text both services print: `NAME = VALUE  # SOURCE` per setting,
/// names aligned, then one `warning: …` line per warning.
pub fn check_config_text(lines: &[CheckLine], warnings: &[String]) -> String {
    let width = lines.iter().map(|l| l.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for line in lines {
        out.push_str(&format!(
            "{:width$} = {}  # {}\n",
            line.name, line.value, line.source
        ));
    }
    for warning in warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}

/// A known name within a few edits of `name` (a typo), if any.
pub fn did_you_mean<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    known
        .into_iter()
        .map(|k| (strsim::levenshtein(&name, &k.to_ascii_lowercase()), k))
        .filter(|(distance, k)| *distance <= 2.max(k.len() / 5))
        .min()
        .map(|(_, k)| k)
}

/// `unknown key (did you mean `x`?)` or `unknown key`.
pub fn unknown_key_reason<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    match did_you_mean(name, known) {
        Some(near) => format!("unknown key (did you mean `{near}`?)"),
        None => "unknown key".to_string(),
    }
}

/// Whether `var` (with `value`) is one Kubernetes injects for a Service (service links):
/// `X_SERVICE_HOST`, `X_SERVICE_PORT[_NAME]`, `X_PORT=tcp://…`, `X_PORT_<n>_<PROTO>[_…]`.
pub fn is_service_link(var: &str, value: &str) -> bool {
    if var.ends_with("_SERVICE_HOST") || var.contains("_SERVICE_PORT") {
        return true;
    }
    if service_link_target(value).is_some() {
        return true;
    }
    var.split("_PORT_").nth(1).is_some_and(|rest| {
        let mut parts = rest.split('_');
        parts.next().is_some_and(|p| p.parse::<u16>().is_ok())
            && parts
                .next()
                .is_some_and(|p| matches!(p, "TCP" | "UDP" | "SCTP"))
    })
}

/// `tcp://10.0.0.1:22281` → `Some("10.0.0.1:22281")`: what a service link's value looks like.
pub fn service_link_target(value: &str) -> Option<&str> {
    ["tcp://", "udp://", "sctp://"]
        .iter()
        .find_map(|scheme| value.strip_prefix(scheme))
}

/// The reason for a setting whose value is a Kubernetes service link: Kubernetes injects
/// `<SERVICE>_PORT=tcp://ip:port` for every Service in the namespace, so a Service named
/// like the setting (`gorge-notification-admin` → `GORGE_NOTIFICATION_ADMIN_PORT`) sets it.
pub fn service_link_reason(var: &str) -> String {
    let service = var
        .strip_suffix("_PORT")
        .map(|name| {
            format!(
                " for a Service named {}",
                name.to_lowercase().replace('_', "-")
            )
        })
        .unwrap_or_default();
    format!(
        "a Kubernetes service link, not a value set here: Kubernetes injects this variable{service}; \
         set enableServiceLinks: false on the pod or set {var} explicitly"
    )
}

/// Refuses `value` of the setting variable `var` when it is a Kubernetes service link
/// (`tcp://…`), with [`service_link_reason`].
pub fn refuse_service_link(var: &str, value: &str) -> Result<(), ConfigError> {
    match service_link_target(value) {
        Some(_) => Err(ConfigError::new(var, value, service_link_reason(var))),
        None => Ok(()),
    }
}

/// Warnings for `prefix*` variables that are no setting, with a did-you-mean; Kubernetes
/// service-link variables are skipped (the environment is shared with them).
pub fn unknown_env_warnings(prefix: &str, known_keys: &[&str]) -> Vec<String> {
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(var, _)| var.starts_with(prefix))
        .collect();
    vars.sort();
    let known_vars: Vec<String> = known_keys
        .iter()
        .map(|k| format!("{prefix}{}", k.to_uppercase()))
        .collect();
    vars.into_iter()
        .filter(|(var, value)| !known_vars.contains(var) && !is_service_link(var, value))
        .map(
            |(var, _)| match did_you_mean(&var, known_vars.iter().map(String::as_str)) {
                Some(near) => format!("{var} is not a setting (did you mean {near}?); ignored"),
                None => format!("{var} is not a setting; ignored"),
            },
        )
        .collect()
}

/// An environment layer for figment that types each value by its setting's default (a
/// string setting gets the text as written, so `USER=1234` stays a string) and knows only
/// the settings in `defaults`. Variables set to the empty string are left out, so compose
/// files that pass `VAR=""` get the default instead of a parse error or an empty value.
#[derive(Debug, Clone)]
pub struct TypedEnv {
    prefix: String,
    defaults: serde_json::Map<String, serde_json::Value>,
}

impl TypedEnv {
    /// A layer reading `{prefix}{KEY}` for each key of `defaults` (a serializable struct of the
    /// settings with their default values), typed like that default.
    pub fn new(prefix: &str, defaults: &impl serde::Serialize) -> TypedEnv {
        let defaults = match serde_json::to_value(defaults) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        TypedEnv {
            prefix: prefix.to_string(),
            defaults,
        }
    }

    /// `(key, value)` for every set, non-empty variable of a known setting.
    pub fn values(&self) -> Vec<(String, figment::value::Value)> {
        use figment::value::Value;
        let mut out = Vec::new();
        for (key, default) in &self.defaults {
            let Some(text) = env_value(&format!("{}{}", self.prefix, key.to_uppercase())) else {
                continue;
            };
            let value = match default {
                serde_json::Value::Number(_) => text
                    .parse::<u64>()
                    .map(Value::from)
                    .or_else(|_| text.parse::<i64>().map(Value::from))
                    .unwrap_or_else(|_| Value::from(text)),
                serde_json::Value::Bool(_) => match text.to_ascii_lowercase().as_str() {
                    "true" => Value::from(true),
                    "false" => Value::from(false),
                    _ => Value::from(text),
                },
                _ => Value::from(text),
            };
            out.push((key.clone(), value));
        }
        out
    }
}

impl figment::Provider for TypedEnv {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named("environment variable(s)")
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        let dict: figment::value::Dict = self.values().into_iter().collect();
        Ok(figment::Profile::Default.collect(dict))
    }
}

/// Prints the error as one line on stderr and exits with [`CONFIG_EXIT_CODE`].
pub fn exit_config_error(err: &ConfigError) -> ! {
    eprintln!("{err}");
    std::process::exit(CONFIG_EXIT_CODE)
}

/// What to print in place of a secret: whether it is set, never what it is.
pub fn mask_secret(secret: &str) -> &'static str {
    if secret.is_empty() {
        "(empty)"
    } else {
        "********"
    }
}

/// A string setting that must never appear in logs or printed configuration. `Debug`,
/// `Display` and slog serialization all print the mask; only [`Secret::expose`] reveals it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value read from configuration.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for the one place that needs it (a password sent to MySQL, a token
    /// compared in constant time).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no secret is set (for a token: authentication is off).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(mask_secret(&self.0))
    }
}

impl slog::Value for Secret {
    fn serialize(
        &self,
        _record: &slog::Record<'_>,
        key: slog::Key,
        serializer: &mut dyn slog::Serializer,
    ) -> slog::Result {
        serializer.emit_str(key, mask_secret(&self.0))
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Numbers are accepted too: an all-digit password arrives from the environment as one.
        let value = serde_json::Value::deserialize(deserializer)?;
        match value {
            serde_json::Value::String(s) => Ok(Secret(s)),
            serde_json::Value::Number(n) => Ok(Secret(n.to_string())),
            serde_json::Value::Bool(b) => Ok(Secret(b.to_string())),
            _ => Err(serde::de::Error::custom("expected a string")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::providers::{Format, Serialized};
    use serde::Serialize;
    use std::sync::Mutex;

    // Tests that touch the process environment must not interleave.
    static ENV_LOCK: Mutex<()> = Mutex::new(());

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    struct Settings {
        poll_interval_ms: u64,
        listen: String,
    }

    fn defaults() -> Settings {
        Settings {
            poll_interval_ms: 1000,
            listen: "0.0.0.0".into(),
        }
    }

    fn load(prefix: &str) -> Result<Settings, ConfigError> {
        let figment = Figment::from(Serialized::defaults(defaults()))
            .merge(TypedEnv::new(prefix, &defaults()));
        extract(&figment, prefix)
    }

    #[test]
    fn empty_env_var_means_default() {
        let _guard = ENV_LOCK.lock().unwrap();
        std::env::set_var("GSTEST_A_POLL_INTERVAL_MS", "");
        std::env::set_var("GSTEST_A_LISTEN", "127.0.0.1");
        let settings = load("GSTEST_A_").unwrap();
        assert_eq!(settings.poll_interval_ms, 1000);
        assert_eq!(settings.listen, "127.0.0.1");
    }

    #[test]
    fn invalid_env_value_names_the_variable_and_value() {
        let _guard = ENV_LOCK.lock().unwrap();
        std::env::set_var("GSTEST_B_POLL_INTERVAL_MS", "soon");
        let err = load("GSTEST_B_").unwrap_err();
        assert_eq!(err.key, "GSTEST_B_POLL_INTERVAL_MS");
        assert_eq!(err.value, "soon");
        let line = err.to_string();
        assert!(
            line.starts_with("invalid configuration: GSTEST_B_POLL_INTERVAL_MS=\"soon\": expected"),
            "{line}"
        );
        assert!(!line.contains('\n'));
    }

    #[test]
    fn invalid_file_value_names_the_dotted_key() {
        let figment = Figment::from(Serialized::defaults(defaults())).merge(
            figment::providers::Json::string(r#"{"poll_interval_ms": -5}"#),
        );
        let err = extract::<Settings>(&figment, "X_").unwrap_err();
        assert_eq!(err.key, "poll_interval_ms");
        assert_eq!(err.value, "-5");
    }

    #[test]
    fn typed_env_keeps_digit_only_strings_as_strings() {
        let _guard = ENV_LOCK.lock().unwrap();
        std::env::set_var("GSTEST_C_LISTEN", "1234");
        std::env::set_var("GSTEST_C_POLL_INTERVAL_MS", "250");
        let figment = Figment::from(Serialized::defaults(defaults()))
            .merge(TypedEnv::new("GSTEST_C_", &defaults()));
        let settings: Settings = extract(&figment, "GSTEST_C_").unwrap();
        assert_eq!(settings.listen, "1234");
        assert_eq!(settings.poll_interval_ms, 250);
    }

    #[test]
    fn service_links_and_typos() {
        assert!(is_service_link("X_PORT", "tcp://10.0.0.1:80"));
        assert!(is_service_link("X_PORT_80_TCP_ADDR", "10.0.0.1"));
        assert!(is_service_link("X_ADMIN_SERVICE_PORT_HTTP", "80"));
        assert!(!is_service_link("X_CLIENT_PROT", "22280"));
        assert_eq!(
            did_you_mean(
                "GORGE_X_CLIENT_PROT",
                ["GORGE_X_CLIENT_PORT", "GORGE_X_PEERS"]
            ),
            Some("GORGE_X_CLIENT_PORT")
        );
        assert_eq!(did_you_mean("port", ["mysql_port_number"]), None);
    }

    #[test]
    fn check_config_lines_show_value_and_source() {
        let text = check_config_text(
            &[
                CheckLine {
                    name: "A_PORT".into(),
                    value: "1".into(),
                    source: Source::Default,
                },
                CheckLine {
                    name: "A_LONGER".into(),
                    value: "x".into(),
                    source: Source::Env("A_LONGER".into()),
                },
            ],
            &["careful".into()],
        );
        assert_eq!(
            text,
            "A_PORT   = 1  # default\nA_LONGER = x  # env A_LONGER\nwarning: careful\n"
        );
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret} {secret:?}"), "******** ********");
        assert_eq!(Secret::default().to_string(), "(empty)");
        assert_eq!(secret.expose(), "hunter2");
        let parsed: Secret = serde_json::from_str("12345").unwrap();
        assert_eq!(parsed.expose(), "12345");
    }
}
