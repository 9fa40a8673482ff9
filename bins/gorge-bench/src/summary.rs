//! The one JSON line every run ends with.
//!
//! Scripts (and docs/benchmarks.md) read exactly one line of stdout per run, so progress
//! goes to stderr and the summary is a single compact JSON object whose first keys are
//! always `command` and `ok`.

use serde_json::{Map, Value};

/// Builds the summary line for `command` from a result object (which must carry `ok`).
pub fn summary_line(command: &str, result: Value) -> String {
    let mut line = Map::new();
    line.insert("command".to_string(), Value::String(command.to_string()));
    let mut fields = match result {
        Value::Object(fields) => fields,
        other => {
            let mut fields = Map::new();
            fields.insert("ok".to_string(), Value::Bool(false));
            fields.insert("result".to_string(), other);
            fields
        }
    };
    // shift_remove keeps the other keys in their order (remove would swap the last one in).
    let ok = fields.shift_remove("ok").unwrap_or(Value::Bool(false));
    line.insert("ok".to_string(), ok);
    line.extend(fields);
    Value::Object(line).to_string()
}

/// Whether a summary reports success.
pub fn is_ok(line: &str) -> bool {
    serde_json::from_str::<Value>(line)
        .ok()
        .and_then(|v| v.get("ok").and_then(Value::as_bool))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_line_with_command_and_ok_first() {
        let line = summary_line(
            "notify",
            json!({"ok": true, "lost": 0, "dup": 1, "note": "a\nb"}),
        );
        assert_eq!(
            line,
            r#"{"command":"notify","ok":true,"lost":0,"dup":1,"note":"a\nb"}"#
        );
        assert!(!line.contains('\n'));
        assert!(is_ok(&line));
    }

    #[test]
    fn non_objects_and_missing_ok_count_as_failure() {
        let line = summary_line("drill", json!("boom"));
        assert_eq!(line, r#"{"command":"drill","ok":false,"result":"boom"}"#);
        assert!(!is_ok(&summary_line("drill", json!({"x": 1}))));
    }
}
