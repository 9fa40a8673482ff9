//! A byte-compatible port of Phorge's `PhutilJSON::encodeFormatted()`.
//!
//! Webhook receivers verify an HMAC over the exact body, so the body must be the bytes PHP
//! would produce: 2-space indentation, `": "` after keys, `",\n"` between entries, `[]` for
//! an empty list, one trailing `"\n"`; scalars as PHP's `json_encode(…, JSON_UNESCAPED_SLASHES)`
//! writes them (see [`write_string`]). Keys keep their order (serde_json `preserve_order`)
//! and numbers their written form (`arbitrary_precision`).
//!
//! Unlike PHP, a `serde_json::Value` knows lists from objects, so a JSON object with keys
//! `"0"`, `"1"`… stays an object here; PHP would have turned it into a list. Payloads built by
//! this crate never contain such objects. An empty object is written `{}` (PHP has no empty
//! object in these payloads: an empty PHP array is always written `[]`).

use serde_json::Value;

/// `PhutilJSON::encodeFormatted($value)`: the formatted document with its trailing newline.
pub fn encode_formatted(value: &Value) -> String {
    let mut out = String::new();
    write_formatted(&mut out, value, 0);
    out.push('\n');
    out
}

/// The same scalars and escaping on one line with no spaces (PHP's `json_encode` layout),
/// for text that is stored rather than signed, such as a request's `properties` column.
pub fn encode_compact(value: &Value) -> String {
    let mut out = String::new();
    write_compact(&mut out, value);
    out
}

fn write_indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

fn write_formatted(out: &mut String, value: &Value, depth: usize) {
    match value {
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Array(items) => {
            out.push_str("[\n");
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push_str(",\n");
                }
                write_indent(out, depth + 1);
                write_formatted(out, item, depth + 1);
            }
            out.push('\n');
            write_indent(out, depth);
            out.push(']');
        }
        Value::Object(map) if map.is_empty() => out.push_str("{}"),
        Value::Object(map) => {
            out.push_str("{\n");
            for (index, (key, item)) in map.iter().enumerate() {
                if index > 0 {
                    out.push_str(",\n");
                }
                write_indent(out, depth + 1);
                write_string(out, key);
                out.push_str(": ");
                write_formatted(out, item, depth + 1);
            }
            out.push('\n');
            write_indent(out, depth);
            out.push('}');
        }
        scalar => write_scalar(out, scalar),
    }
}

fn write_compact(out: &mut String, value: &Value) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_compact(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (index, (key, item)) in map.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_compact(out, item);
            }
            out.push('}');
        }
        scalar => write_scalar(out, scalar),
    }
}

fn write_scalar(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        // With `arbitrary_precision` this is the number exactly as it was written.
        Value::Number(number) => out.push_str(&number.to_string()),
        Value::String(text) => write_string(out, text),
        Value::Array(_) | Value::Object(_) => write_compact(out, value),
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn push_u_escape(out: &mut String, unit: u16) {
    out.push_str("\\u");
    for shift in [12, 8, 4, 0] {
        out.push(char::from(HEX[usize::from((unit >> shift) & 0xf)]));
    }
}

/// A JSON string as PHP's `json_encode($s, JSON_UNESCAPED_SLASHES)` writes it: `"` and `\`
/// escaped; `\b \f \n \r \t` short; other control characters `\u00xx`; every non-ASCII
/// character as lowercase `\uxxxx` UTF-16 units (a surrogate pair above U+FFFF); `/`, `<`,
/// `>`, `&`, `'` and DEL (0x7f) as they are.
pub fn write_string(out: &mut String, text: &str) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => push_u_escape(out, c as u16),
            c if c.is_ascii() => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    push_u_escape(out, *unit);
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        write_string(&mut out, text);
        out
    }

    #[test]
    fn escaping_table() {
        let table: &[(&str, &str)] = &[
            ("plain", r#""plain""#),
            ("\"", r#""\"""#),
            ("\\", r#""\\""#),
            ("/", r#""/""#),
            ("</script>", r#""</script>""#),
            ("a&b'c", r#""a&b'c""#),
            ("\u{08}\u{0c}\n\r\t", r#""\b\f\n\r\t""#),
            ("\u{00}\u{01}\u{1f}", r#""\u0000\u0001\u001f""#),
            ("\u{0b}", r#""\u000b""#),
            ("\u{7f}", "\"\u{7f}\""),
            ("é", r#""\u00e9""#),
            ("\u{80}", r#""\u0080""#),
            ("日本", r#""\u65e5\u672c""#),
            ("\u{2028}\u{2029}", r#""\u2028\u2029""#),
            ("\u{fffd}", r#""\ufffd""#),
            ("😀", r#""\ud83d\ude00""#),
            ("\u{10ffff}", r#""\udbff\udfff""#),
            ("", r#""""#),
        ];
        for (input, expected) in table {
            assert_eq!(escaped(input), *expected, "input {input:?}");
        }
    }

    #[test]
    fn formatted_layout() {
        let value = json!({"a": [1, {"b": null}], "c": [], "d": {}, "e": true});
        assert_eq!(
            encode_formatted(&value),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": [],\n  \"d\": {},\n  \"e\": true\n}\n"
        );
    }

    #[test]
    fn scalars_at_top_level_get_one_newline() {
        assert_eq!(encode_formatted(&json!("x")), "\"x\"\n");
        assert_eq!(encode_formatted(&json!([])), "[]\n");
    }

    #[test]
    fn keys_keep_insertion_order_and_numbers_their_text() {
        let value: Value = serde_json::from_str(
            r#"{"z":1,"a":2.50,"m":9223372036854775807,"big":123456789012345678901234567890}"#,
        )
        .unwrap();
        assert_eq!(
            encode_compact(&value),
            r#"{"z":1,"a":2.50,"m":9223372036854775807,"big":123456789012345678901234567890}"#
        );
    }

    #[test]
    fn compact_escapes_like_formatted() {
        let value = json!({"k/é": ["a\"b", false]});
        assert_eq!(encode_compact(&value), r#"{"k/\u00e9":["a\"b",false]}"#);
    }
}
