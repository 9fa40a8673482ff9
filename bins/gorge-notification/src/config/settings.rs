//! The flat settings, each named once in [`settings!`]: its field, its kind (which decides
//! how it parses, what the error says is valid and how it prints), its default and its help.
//! From that one list come the environment variable names, the Aphlict-file keys, the
//! unknown-variable warnings, `--check-config` and `--print-config`.

use gorge_hub::Limits;
use serde_json::Value;

/// What a setting's text must be, in plain words, and how it parses and prints.
pub trait Kind {
    type Value: Clone + PartialEq + std::fmt::Debug;
    /// What is valid, for error messages: "a port number 1-65535".
    const VALID: &'static str;
    fn parse(text: &str) -> Option<Self::Value>;
    /// From the Aphlict file: numbers must be JSON numbers and text JSON strings.
    fn from_json(value: &Value) -> Result<Self::Value, String>;
    fn show(value: &Self::Value) -> String;
    fn to_json(value: &Self::Value) -> Value;
}

fn number_from_json<const MIN: u64, const MAX: u64>(
    value: &Value,
    valid: &str,
) -> Result<u64, String> {
    match value {
        Value::Number(n) => n
            .as_u64()
            .filter(|n| (MIN..=MAX).contains(n))
            .ok_or_else(|| format!("expected {valid}")),
        Value::String(_) => Err(format!("expected {valid}: a number, not a string")),
        _ => Err(format!("expected {valid}")),
    }
}

macro_rules! number_kind {
    ($name:ident, $min:expr, $max:expr, $valid:expr) => {
        pub struct $name;
        impl Kind for $name {
            type Value = u64;
            const VALID: &'static str = $valid;
            fn parse(text: &str) -> Option<u64> {
                text.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| ($min..=$max).contains(n))
            }
            fn from_json(value: &Value) -> Result<u64, String> {
                number_from_json::<{ $min }, { $max }>(value, Self::VALID)
            }
            fn show(value: &u64) -> String {
                value.to_string()
            }
            fn to_json(value: &u64) -> Value {
                Value::from(*value)
            }
        }
    };
}

/// Upper bounds keep every derived duration and size far from overflow.
const DAY_SECONDS: u64 = 86_400;
const MAX_COUNT: u64 = 1 << 32;

number_kind!(Port, 1, 65_535, "a port number 1-65535");
number_kind!(
    Count,
    1,
    MAX_COUNT,
    "a whole number from 1 to 4294967296, e.g. 1024"
);
number_kind!(
    CountOrZero,
    0,
    MAX_COUNT,
    "a whole number from 0 to 4294967296, e.g. 1000"
);
number_kind!(
    Bytes,
    1,
    1 << 40,
    "a whole number of bytes greater than 0, e.g. 65536"
);
number_kind!(
    Seconds,
    1,
    DAY_SECONDS,
    "a whole number of seconds from 1 to 86400, e.g. 30"
);
number_kind!(
    SecondsOrZero,
    0,
    DAY_SECONDS,
    "a whole number of seconds from 0 to 86400, e.g. 10"
);
number_kind!(
    Millis,
    1,
    DAY_SECONDS * 1000,
    "a whole number of milliseconds from 1 to 86400000, e.g. 250"
);

/// Free text, validated where it is used (addresses, URLs).
pub struct Text;

impl Kind for Text {
    type Value = String;
    const VALID: &'static str = "text";
    fn parse(text: &str) -> Option<String> {
        Some(text.to_string())
    }
    fn from_json(value: &Value) -> Result<String, String> {
        match value {
            Value::String(s) => Ok(s.clone()),
            _ => Err("expected a string".to_string()),
        }
    }
    fn show(value: &String) -> String {
        value.clone()
    }
    fn to_json(value: &String) -> Value {
        Value::from(value.clone())
    }
}

/// A setting that may be absent (no default value).
pub struct Optional<K>(std::marker::PhantomData<K>);

impl<K: Kind> Kind for Optional<K> {
    type Value = Option<K::Value>;
    const VALID: &'static str = K::VALID;
    fn parse(text: &str) -> Option<Self::Value> {
        K::parse(text).map(Some)
    }
    fn from_json(value: &Value) -> Result<Self::Value, String> {
        match value {
            Value::Null => Ok(None),
            other => K::from_json(other).map(Some),
        }
    }
    fn show(value: &Self::Value) -> String {
        value
            .as_ref()
            .map_or_else(|| "(unset)".to_string(), K::show)
    }
    fn to_json(value: &Self::Value) -> Value {
        value.as_ref().map_or(Value::Null, K::to_json)
    }
}

/// Static facts about one setting.
#[derive(Debug, Clone, Copy)]
pub struct SettingInfo {
    /// The key: lower case, as in the Aphlict file; the variable is the prefix + upper case.
    pub key: &'static str,
    /// Shown by the documentation test, which checks docs/notification.md against this list.
    #[cfg_attr(not(test), allow(dead_code))]
    pub help: &'static str,
    /// Only from the environment (`config_file` cannot name itself).
    pub env_only: bool,
}

macro_rules! settings {
    ($( $(#[env_only $env_only:literal])? $field:ident : $kind:ty = $default:expr, $help:literal; )*) => {
        /// The flat settings' values.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Settings {
            $( pub $field: <$kind as Kind>::Value, )*
        }

        /// Every flat setting, in the documented order.
        pub const SETTINGS: &[SettingInfo] = &[
            $( SettingInfo {
                key: stringify!($field),
                help: $help,
                env_only: false $(|| $env_only)?,
            }, )*
        ];

        impl Default for Settings {
            fn default() -> Self {
                Settings { $( $field: $default, )* }
            }
        }

        impl Settings {
            /// Sets `key` from text; `Err(valid)` when the text is not valid for it.
            pub fn set_text(&mut self, key: &str, text: &str) -> Result<(), &'static str> {
                match key {
                    $( stringify!($field) => {
                        self.$field = <$kind as Kind>::parse(text).ok_or(<$kind as Kind>::VALID)?;
                    } )*
                    _ => {}
                }
                Ok(())
            }

            /// Sets `key` from a JSON value of the Aphlict file.
            pub fn set_json(&mut self, key: &str, value: &Value) -> Result<(), String> {
                match key {
                    $( stringify!($field) => {
                        self.$field = <$kind as Kind>::from_json(value)?;
                    } )*
                    _ => {}
                }
                Ok(())
            }

            /// `(key, value as printed)` for every setting.
            pub fn shown(&self) -> Vec<(&'static str, String)> {
                vec![ $( (stringify!($field), <$kind as Kind>::show(&self.$field)), )* ]
            }

            /// `(key, value as JSON)` for every setting.
            pub fn json(&self) -> Vec<(&'static str, Value)> {
                vec![ $( (stringify!($field), <$kind as Kind>::to_json(&self.$field)), )* ]
            }
        }
    };
}

settings! {
    #[env_only true]
    config_file: Optional<Text> = None, "Aphlict-format JSON file (like --config)";
    client_port: Optional<Port> = None, "Port of every client server (overrides the file)";
    admin_port: Optional<Port> = None, "Port of every admin server (overrides the file)";
    listen_addr: Optional<Text> = None, "IP address every server listens on (overrides the file)";
    peers: Optional<Text> = None, "Comma-separated peer admin URLs, http://host:port";
    peer_dns: Optional<Text> = None, "host:port: a name resolving to every peer's address";
    peer_dns_refresh_seconds: Seconds = 10, "How often peer_dns is resolved";
    peer_queue_capacity: Count = 1024, "Messages queued per peer before new ones are dropped";
    peer_timeout_ms: Millis = 5000, "Timeout of one relay POST";
    max_frame_bytes: Bytes = 64 * 1024, "Largest client WebSocket frame or message";
    max_admin_body_bytes: Bytes = 1 << 20, "Largest admin POST body";
    max_sockets: Count = hub().sockets as u64, "Open WebSocket connections at most";
    max_subscriptions: Count = hub().subscriptions_per_socket as u64, "Subscriptions per socket";
    max_phid_bytes: Count = hub().phid_bytes as u64, "Longest PHID accepted";
    max_instances: Count = hub().instances as u64, "Distinct instances at most";
    max_instance_name_bytes: Count = hub().instance_name_bytes as u64, "Longest instance name";
    queue_frames: Count = hub().queue_frames as u64, "Frames queued per socket before it is closed as slow";
    queue_bytes: Bytes = hub().queue_bytes as u64, "Bytes queued per socket before it is closed as slow";
    history_entries: CountOrZero = hub().history_entries as u64, "Messages kept for replay (0: none)";
    history_age_ms: Millis = hub().history_age_ms, "How long a message is kept for replay";
    history_bytes: Bytes = hub().history_bytes as u64, "Bytes of messages kept for replay";
    ping_interval_seconds: Seconds = 30, "Interval of server pings";
    idle_timeout_seconds: Seconds = 75, "A socket silent this long is closed";
    drain_seconds: SecondsOrZero = 10, "Close frames are spread over this window on SIGTERM";
}

/// The hub's own defaults, which the hub settings take.
fn hub() -> Limits {
    Limits::default()
}

/// The setting `key`, if it is one.
pub fn info(key: &str) -> Option<&'static SettingInfo> {
    SETTINGS.iter().find(|s| s.key == key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_round_trips_through_text() {
        let defaults = Settings::default();
        let shown = defaults.shown();
        let mut copy = Settings::default();
        for (key, text) in &shown {
            if text != "(unset)" {
                copy.set_text(key, text).unwrap();
            }
        }
        assert_eq!(copy, defaults);
    }

    #[test]
    fn docs_list_every_setting_with_its_default() {
        let docs = include_str!("../../../../docs/notification.md");
        for (key, default) in Settings::default().shown() {
            let info = info(key).unwrap();
            let var = super::super::env_key(key);
            let row = docs
                .lines()
                .find(|l| l.starts_with(&format!("| `{var}` |")))
                .unwrap_or_else(|| {
                    panic!("docs/notification.md: add | `{var}` | … | {} |", info.help)
                });
            if default != "(unset)" {
                assert!(
                    row.contains(&format!("| `{default}` |")),
                    "{row}: default {default}"
                );
            }
        }
    }

    #[test]
    fn numbers_are_bounded_and_named_in_plain_words() {
        assert_eq!(Port::parse("0"), None);
        assert_eq!(Port::parse("65536"), None);
        assert_eq!(SecondsOrZero::parse("18446744073709551615"), None);
        assert_eq!(SecondsOrZero::parse("18446744073709551616"), None);
        assert_eq!(
            Port::from_json(&Value::from("22280")).unwrap_err(),
            "expected a port number 1-65535: a number, not a string"
        );
        let mut s = Settings::default();
        assert_eq!(
            s.set_text("peer_timeout_ms", "5s"),
            Err("a whole number of milliseconds from 1 to 86400000, e.g. 250")
        );
    }
}
