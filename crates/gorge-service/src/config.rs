//! Configuration helpers on figment: environment layers where an empty variable means "use
//! the default", errors reduced to one line naming the key and the bad value, exit code 2,
//! and a [`Secret`] string that never prints itself.

use std::fmt;

use figment::error::{Actual, Kind};
use figment::providers::Env;
use figment::Figment;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// Exit code for an invalid configuration (distinct from 1, a runtime failure).
pub const CONFIG_EXIT_CODE: i32 = 2;

/// An environment layer for variables starting with `prefix` (e.g. `"APP_"`), keyed by the rest
/// of the name in lowercase. Variables set to the empty string are left out, so compose files
/// that pass `VAR=""` get the default instead of a parse error or an empty value.
pub fn env_layer(prefix: &str) -> Env {
    let owned = prefix.to_string();
    Env::prefixed(prefix).filter(move |key| {
        std::env::var_os(format!("{owned}{key}")).is_some_and(|value| !value.is_empty())
    })
}

/// Reads one environment variable, treating unset and empty the same way.
pub fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// An invalid setting: which key, what value, and why. Displays as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl ConfigError {
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
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

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
        let figment = Figment::from(Serialized::defaults(defaults())).merge(env_layer(prefix));
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
    fn secrets_never_print() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret} {secret:?}"), "******** ********");
        assert_eq!(Secret::default().to_string(), "(empty)");
        assert_eq!(secret.expose(), "hunter2");
        let parsed: Secret = serde_json::from_str("12345").unwrap();
        assert_eq!(parsed.expose(), "12345");
    }
}
