//! Every variable a service reads, as operators find them listed: the service's own settings
//! ([`crate::settings`]) followed by the logging variables both services read
//! ([`LogVars`]), rendered as the docs table and as the Helm chart's settings catalog. Apart
//! from [`crate::settings`] because it names the logging variables, which are declared with
//! the settings mechanism in [`crate::logging`].

use serde_json::Value;

use crate::logging::LogVars;
use crate::settings::{docs_rows, Declared, Shape};

/// The settings catalog the Helm chart validates `env` values with at template time
/// (`deploy/helm/gorge/files/settings/<service>.json`, checked against this by each
/// service's tests): every variable of `S` and the logging variables, with what is valid in
/// words and, where it can be checked without the binary, as a range or a list of words (for
/// the log level, the level words and the components of the service's `events`), and its
/// default (secrets and absent values have none).
pub fn chart_catalog<S: Declared>(events: &[crate::events::Event]) -> String {
    let mut catalog = serde_json::Map::new();
    let settings = S::SETTINGS.iter().map(|info| (info, S::PREFIX));
    let logging = LogVars::SETTINGS.iter().map(|info| (info, LogVars::PREFIX));
    let defaults = S::default().file_values().into_iter();
    let defaults = defaults.chain(LogVars::default().file_values());
    for ((info, prefix), default) in settings.chain(logging).zip(defaults) {
        let mut entry = serde_json::Map::new();
        entry.insert("valid".into(), Value::from(info.valid));
        // What an empty or absent variable means (formulas evaluate it: `crate::derived`).
        if !info.secret && !default.is_null() {
            entry.insert("default".into(), default);
        }
        match info.shape {
            Shape::Free => {}
            Shape::Range(min, max) => {
                entry.insert("min".into(), Value::from(min));
                entry.insert("max".into(), Value::from(max));
            }
            Shape::OneOf(words) => {
                entry.insert("oneOf".into(), Value::from(words.to_vec()));
            }
            Shape::LogLevels => {
                entry.insert(
                    "levels".into(),
                    Value::from(crate::logging::LEVEL_WORDS.to_vec()),
                );
                let components = crate::events::components(events);
                entry.insert("components".into(), Value::from(components));
            }
        }
        catalog.insert(info.env_var(prefix), Value::Object(entry));
    }
    let catalog = serde_json::json!({ "prefix": S::PREFIX, "settings": catalog });
    serde_json::to_string_pretty(&catalog).expect("a catalog serializes") + "\n"
}

/// A service's settings table in docs/: `S`, then the logging variables every service reads.
pub fn docs_table<S: Declared>() -> String {
    let mut rows = docs_rows::<S>();
    rows.extend(docs_rows::<LogVars>());
    crate::docs::table(&["Variable", "Default", "Meaning"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use crate::settings::{Optional, Port, SecretText, Text};

    crate::settings! {
        struct Demo, prefix "DEMO_" {
            port: Port = 80, "a port";
            name: Text = "x".into(), "a name";
            pass: SecretText = Secret::default(), "a secret";
            #[env("SHARED_ADDR")]
            addr: Text = "0.0.0.0:1".into(), "an address";
            #[env_only]
            file: Optional<Text> = None, "a file";
        }
    }

    #[test]
    fn the_chart_catalog_has_every_variable_with_what_is_valid() {
        let events = [crate::events::Event {
            name: "DEMO_EVENT",
            component: Some("demo"),
            ..crate::events::RUNTIME[0]
        }];
        let catalog: Value = serde_json::from_str(&chart_catalog::<Demo>(&events)).unwrap();
        assert_eq!(catalog["prefix"], "DEMO_");
        let settings = &catalog["settings"];
        assert_eq!(
            settings["DEMO_PORT"],
            serde_json::json!({"valid": "a port number 1-65535", "min": 1, "max": 65535, "default": 80})
        );
        assert_eq!(
            settings["DEMO_NAME"],
            serde_json::json!({"valid": "text", "default": "x"})
        );
        // A secret's default is never written, nor an absent one.
        assert_eq!(settings["DEMO_PASS"], serde_json::json!({"valid": "text"}));
        assert_eq!(settings["DEMO_FILE"], serde_json::json!({"valid": "text"}));
        assert_eq!(settings["SHARED_ADDR"]["valid"], "text");
        assert_eq!(
            settings["GORGE_LOG_FORMAT"],
            serde_json::json!({"valid": "json or text", "oneOf": ["json", "text"]})
        );
        let mut components = crate::events::components(&events);
        assert!(components.contains(&"demo"), "{components:?}");
        components.sort_unstable();
        assert_eq!(
            settings["GORGE_LOG_LEVEL"],
            serde_json::json!({
                "valid": crate::logging::LEVEL_VALID,
                "default": "info",
                "levels": ["trace", "debug", "info", "warn", "warning", "error", "critical"],
                "components": components,
            })
        );
        let names: Vec<&String> = settings.as_object().unwrap().keys().collect();
        assert_eq!(
            names,
            [
                "DEMO_PORT",
                "DEMO_NAME",
                "DEMO_PASS",
                "SHARED_ADDR",
                "DEMO_FILE",
                "GORGE_LOG_LEVEL",
                "GORGE_LOG_FORMAT"
            ]
        );
    }

    #[test]
    fn the_docs_table_lists_the_settings_then_the_logging_variables() {
        let table = docs_table::<Demo>();
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows[0], "| Variable | Default | Meaning |");
        assert_eq!(rows[2], "| `DEMO_PORT` | `80` | a port |");
        assert!(
            rows[7].starts_with("| `GORGE_LOG_LEVEL` | `info` |"),
            "{table}"
        );
        assert_eq!(rows.len(), 2 + 5 + 2);
    }
}
