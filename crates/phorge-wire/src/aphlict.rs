//! Aphlict's wire formats: the server fingerprint, the admin receipt and status object, admin
//! messages (with the `touched` loop guard) and browser commands.
//!
//! Two callers we cannot change read these bytes: Phorge's PHP (`PhabricatorNotificationClient`
//! posts messages and reads `/status/`) and the browser's `JX.Aphlict` (subscribes, replays and
//! pings over the WebSocket). Neither reports a mismatch; a notification just never shows up,
//! so every format here is pinned byte for byte by the tests below.

use serde::Serialize;
use serde_json::Value;

/// Characters a server fingerprint is drawn from (Aphlict's alphabet: no `0 1 i l o I O`).
pub const FINGERPRINT_ALPHABET: &[u8; 55] =
    b"23456789abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ";

/// Length of a server fingerprint.
pub const FINGERPRINT_LEN: usize = 16;

/// The Aphlict protocol version Phorge shows on its notification status page.
pub const PROTOCOL_VERSION: u64 = 7;

/// The exact reply to a client `ping` command; `JX.Aphlict` matches on `type`.
pub const PONG_TEXT: &str = "{\"type\":\"pong\"}";

/// [`PONG_TEXT`] as bytes.
pub const PONG: &[u8] = PONG_TEXT.as_bytes();

/// Default and maximum replay window in milliseconds (Aphlict's 60 s history).
pub const MAX_REPLAY_AGE_MS: u64 = 60_000;

/// Draws a fingerprint from `fill`, which must fill its buffer from a CSPRNG.
///
/// The randomness source is the caller's so this crate stays free of I/O. Bytes are drawn by
/// rejection sampling so every character of the alphabet is equally likely.
pub fn generate_fingerprint(mut fill: impl FnMut(&mut [u8])) -> String {
    // Largest multiple of the alphabet size that fits in a byte; bytes above it are redrawn.
    const ACCEPT_BELOW: u8 = (256 / FINGERPRINT_ALPHABET.len() * FINGERPRINT_ALPHABET.len()) as u8;
    let mut out = String::with_capacity(FINGERPRINT_LEN);
    let mut buf = [0u8; 32];
    while out.len() < FINGERPRINT_LEN {
        fill(&mut buf);
        for &b in buf.iter().filter(|&&b| b < ACCEPT_BELOW) {
            if out.len() == FINGERPRINT_LEN {
                break;
            }
            out.push(char::from(
                FINGERPRINT_ALPHABET[usize::from(b) % FINGERPRINT_ALPHABET.len()],
            ));
        }
    }
    out
}

/// Whether `s` has the shape of a fingerprint (length and alphabet).
pub fn is_fingerprint(s: &str) -> bool {
    s.len() == FINGERPRINT_LEN && s.bytes().all(|b| FINGERPRINT_ALPHABET.contains(&b))
}

/// The admin `POST /` success body: exactly `{"fingerprint":"<fp>"}`, no envelope.
///
/// Peers learn each other's fingerprint from this receipt, and PHP only checks the status code.
pub fn receipt(fingerprint: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Receipt<'a> {
        fingerprint: &'a str,
    }
    serde_json::to_vec(&Receipt { fingerprint }).expect("a struct of one string serializes")
}

/// One instance's `GET /status/` object.
///
/// Field order and the dotted key names are what Phorge's status page reads; serialization is
/// compact and flat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    /// The instance these counters are for (`default` when the query names none).
    pub instance: String,
    /// Milliseconds since the process started.
    pub uptime: u64,
    /// Open sockets of this instance.
    #[serde(rename = "clients.active")]
    pub clients_active: u64,
    /// Sockets ever opened on this instance.
    #[serde(rename = "clients.total")]
    pub clients_total: u64,
    /// Accepted messages, all instances.
    #[serde(rename = "messages.in")]
    pub messages_in: u64,
    /// Frames of live delivery, all instances (replay excluded).
    #[serde(rename = "messages.out")]
    pub messages_out: u64,
    /// Always [`PROTOCOL_VERSION`].
    pub version: u64,
    /// Retained history entries of this instance.
    #[serde(rename = "history.size")]
    pub history_size: u64,
    /// Milliseconds since this instance's oldest retained entry; `null` (not 0) when none.
    #[serde(rename = "history.age")]
    pub history_age: Option<u64>,
    /// `"gorge-notification <version>"`; the one extra key the contract allows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

impl Status {
    /// Compact JSON bytes of the status object.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("status fields always serialize")
    }
}

/// Why an admin body was refused (the admin port answers 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminMessageError {
    /// Not JSON at all (including an empty body).
    InvalidJson(String),
    /// Valid JSON, but not an object (array, `null`, number, string, bool).
    NotAnObject,
}

impl std::fmt::Display for AdminMessageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminMessageError::InvalidJson(e) => write!(f, "body is not valid JSON: {e}"),
            AdminMessageError::NotAnObject => f.write_str("body must be a JSON object"),
        }
    }
}

impl std::error::Error for AdminMessageError {}

/// What to do with an admin message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminMessage {
    /// `touched` already holds our fingerprint: the message went round the cluster. Answer with
    /// the receipt and do nothing else.
    AlreadySeen,
    /// A new message, stamped with our fingerprint, to store, deliver and relay.
    Accepted(StampedMessage),
}

/// An accepted admin message with our fingerprint appended to `touched`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StampedMessage {
    /// The `subscribers` strings; empty when missing or not a list, which reaches nobody.
    pub subscribers: Vec<String>,
    /// `touched` after stamping (earlier string entries, then our fingerprint).
    pub touched: Vec<String>,
    /// The message serialized once: original key order, numbers as written, `touched` in
    /// place (or appended last when it was absent).
    pub body: Vec<u8>,
}

/// Parses an admin `POST /` body and stamps it with `own_fingerprint`.
///
/// The message is an open object; only `subscribers` and `touched` mean anything here, every
/// other key passes through unchanged (serde_json's `preserve_order` + `arbitrary_precision`
/// keep key order and big integers).
pub fn parse_admin_message(
    body: &[u8],
    own_fingerprint: &str,
) -> Result<AdminMessage, AdminMessageError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| AdminMessageError::InvalidJson(e.to_string()))?;
    let Value::Object(mut object) = value else {
        return Err(AdminMessageError::NotAnObject);
    };
    let mut touched = strings_of(object.get("touched"));
    if touched.iter().any(|fp| fp == own_fingerprint) {
        return Ok(AdminMessage::AlreadySeen);
    }
    touched.push(own_fingerprint.to_owned());
    let subscribers = strings_of(object.get("subscribers"));
    object.insert(
        "touched".to_owned(),
        Value::Array(touched.iter().cloned().map(Value::String).collect()),
    );
    let body = serde_json::to_vec(&object).expect("a parsed JSON object serializes");
    Ok(AdminMessage::Accepted(StampedMessage {
        subscribers,
        touched,
        body,
    }))
}

/// The string entries of a JSON list; anything that is not a list yields nothing.
fn strings_of(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| item.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// A browser (or peer tool) command on the client WebSocket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCommand {
    /// Add these PHIDs to the socket's subscriptions.
    Subscribe(Vec<String>),
    /// Remove these PHIDs from the socket's subscriptions.
    Unsubscribe(Vec<String>),
    /// Re-send retained messages from the last `age_ms` milliseconds (already clamped).
    Replay {
        /// How far back, in milliseconds.
        age_ms: u64,
    },
    /// Answer with [`PONG`].
    Ping,
    /// Malformed, wrongly typed or unknown: ignored, the connection keeps working.
    Ignored,
}

/// Parses one inbound text frame `{"command": C, "data": D}`.
///
/// Never fails: anything that is not a well-formed known command is [`ClientCommand::Ignored`]
/// (Aphlict's handler wedges the socket on some of these; we do not copy that).
pub fn parse_client_command(frame: &str) -> ClientCommand {
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(frame) else {
        return ClientCommand::Ignored;
    };
    let data = object.get("data");
    // (Un)subscribe need `data` to be a list; any other shape is ignored, not an empty list.
    let phids = || matches!(data, Some(Value::Array(_))).then(|| strings_of(data));
    match object.get("command").and_then(Value::as_str) {
        Some("subscribe") => phids().map_or(ClientCommand::Ignored, ClientCommand::Subscribe),
        Some("unsubscribe") => phids().map_or(ClientCommand::Ignored, ClientCommand::Unsubscribe),
        Some("replay") => ClientCommand::Replay {
            age_ms: replay_age(data),
        },
        Some("ping") => ClientCommand::Ping,
        _ => ClientCommand::Ignored,
    }
}

/// `data.age` clamped to `1..=60000`; missing, zero, invalid, negative or too large → 60000.
fn replay_age(data: Option<&Value>) -> u64 {
    let age = data
        .and_then(|d| d.get("age"))
        .and_then(Value::as_f64)
        .filter(|age| age.is_finite() && *age >= 1.0 && *age <= MAX_REPLAY_AGE_MS as f64);
    match age {
        // Truncation is intended: the clamp above keeps the value in range.
        Some(age) => age as u64,
        None => MAX_REPLAY_AGE_MS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted(body: &str, fp: &str) -> StampedMessage {
        match parse_admin_message(body.as_bytes(), fp).unwrap() {
            AdminMessage::Accepted(m) => m,
            AdminMessage::AlreadySeen => panic!("unexpectedly already seen"),
        }
    }

    #[test]
    fn fingerprint_has_length_and_alphabet() {
        let mut seed = 0u8;
        let fp = generate_fingerprint(|buf| {
            for b in buf.iter_mut() {
                seed = seed.wrapping_add(97);
                *b = seed;
            }
        });
        assert_eq!(fp.len(), 16);
        assert!(is_fingerprint(&fp), "{fp}");
    }

    #[test]
    fn fingerprint_rejects_bytes_that_would_bias_the_alphabet() {
        // 220..=255 would map unevenly onto 55 characters; they must be skipped.
        let mut calls = 0;
        let fp = generate_fingerprint(|buf| {
            calls += 1;
            let byte = if calls == 1 { 250 } else { 0 };
            buf.fill(byte);
        });
        assert_eq!(calls, 2);
        assert_eq!(fp, "2222222222222222");
    }

    #[test]
    fn fingerprint_maps_bytes_onto_the_alphabet() {
        let fp = generate_fingerprint(|buf| {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = (i as u8) + 46;
            }
        });
        assert_eq!(fp, "RSTUVWXYZ2345678");
    }

    #[test]
    fn is_fingerprint_checks_alphabet() {
        assert!(is_fingerprint("abcdefghjkmnpqrs"));
        assert!(!is_fingerprint("abcdefghjkmnpqr0"));
        assert!(!is_fingerprint("abcdefghjkmnpqrsx"));
        assert!(!is_fingerprint("abcdefghjkmnpqrl"));
    }

    #[test]
    fn receipt_bytes() {
        assert_eq!(
            receipt("abcdEFGH23456789"),
            b"{\"fingerprint\":\"abcdEFGH23456789\"}"
        );
    }

    #[test]
    fn pong_bytes() {
        assert_eq!(PONG, b"{\"type\":\"pong\"}");
    }

    #[test]
    fn status_bytes_with_empty_history() {
        let status = Status {
            instance: "default".into(),
            uptime: 1234,
            clients_active: 0,
            clients_total: 0,
            messages_in: 0,
            messages_out: 0,
            version: PROTOCOL_VERSION,
            history_size: 0,
            history_age: None,
            server: None,
        };
        assert_eq!(
            String::from_utf8(status.to_json()).unwrap(),
            "{\"instance\":\"default\",\"uptime\":1234,\"clients.active\":0,\"clients.total\":0,\
             \"messages.in\":0,\"messages.out\":0,\"version\":7,\"history.size\":0,\
             \"history.age\":null}"
        );
    }

    #[test]
    fn status_bytes_with_history_and_server() {
        let status = Status {
            instance: "acme".into(),
            uptime: 5,
            clients_active: 2,
            clients_total: 3,
            messages_in: 4,
            messages_out: 6,
            version: PROTOCOL_VERSION,
            history_size: 1,
            history_age: Some(0),
            server: Some("gorge-notification 0.1.0".into()),
        };
        assert_eq!(
            String::from_utf8(status.to_json()).unwrap(),
            "{\"instance\":\"acme\",\"uptime\":5,\"clients.active\":2,\"clients.total\":3,\
             \"messages.in\":4,\"messages.out\":6,\"version\":7,\"history.size\":1,\
             \"history.age\":0,\"server\":\"gorge-notification 0.1.0\"}"
        );
    }

    #[test]
    fn admin_message_keeps_order_numbers_and_text_and_appends_touched() {
        let m = accepted(
            r#"{"z":1,"big":12345678901234567890,"f":1.50,"title":"build 100% done: a=1 & b=2","u":"héllo ✓","subscribers":["PHID-USER-a",7,"PHID-USER-b"],"a":null}"#,
            "FFFFFFFFFFFFFFFF",
        );
        assert_eq!(
            String::from_utf8(m.body).unwrap(),
            r#"{"z":1,"big":12345678901234567890,"f":1.50,"title":"build 100% done: a=1 & b=2","u":"héllo ✓","subscribers":["PHID-USER-a",7,"PHID-USER-b"],"a":null,"touched":["FFFFFFFFFFFFFFFF"]}"#
        );
        assert_eq!(m.subscribers, vec!["PHID-USER-a", "PHID-USER-b"]);
        assert_eq!(m.touched, vec!["FFFFFFFFFFFFFFFF"]);
    }

    #[test]
    fn admin_message_keeps_touched_in_place_and_earlier_string_entries() {
        let m = accepted(
            r#"{"touched":["AAAA",3,"BBBB"],"subscribers":[]}"#,
            "FFFFFFFFFFFFFFFF",
        );
        assert_eq!(
            String::from_utf8(m.body).unwrap(),
            r#"{"touched":["AAAA","BBBB","FFFFFFFFFFFFFFFF"],"subscribers":[]}"#
        );
        assert!(m.subscribers.is_empty());
    }

    #[test]
    fn admin_message_with_non_list_touched_starts_a_new_list() {
        let m = accepted(r#"{"touched":"AAAA"}"#, "FFFFFFFFFFFFFFFF");
        assert_eq!(
            String::from_utf8(m.body).unwrap(),
            r#"{"touched":["FFFFFFFFFFFFFFFF"]}"#
        );
    }

    #[test]
    fn admin_message_already_touched_is_seen() {
        assert_eq!(
            parse_admin_message(
                br#"{"touched":["AAAA","FFFFFFFFFFFFFFFF"],"subscribers":["x"]}"#,
                "FFFFFFFFFFFFFFFF"
            ),
            Ok(AdminMessage::AlreadySeen)
        );
    }

    #[test]
    fn admin_message_subscribers_that_are_not_a_list_reach_nobody() {
        for body in [
            r#"{}"#,
            r#"{"subscribers":null}"#,
            r#"{"subscribers":"PHID-USER-a"}"#,
            r#"{"subscribers":{"a":"PHID-USER-a"}}"#,
        ] {
            assert!(accepted(body, "F").subscribers.is_empty(), "{body}");
        }
    }

    #[test]
    fn admin_message_rejects_non_objects() {
        for body in ["[]", "null", "1", "\"x\"", "true"] {
            assert_eq!(
                parse_admin_message(body.as_bytes(), "F"),
                Err(AdminMessageError::NotAnObject),
                "{body}"
            );
        }
        for body in ["", "{", "{\"a\":}", "not json"] {
            assert!(
                matches!(
                    parse_admin_message(body.as_bytes(), "F"),
                    Err(AdminMessageError::InvalidJson(_))
                ),
                "{body}"
            );
        }
    }

    #[test]
    fn client_commands() {
        assert_eq!(
            parse_client_command(r#"{"command":"subscribe","data":["PHID-A",1,"PHID-B"]}"#),
            ClientCommand::Subscribe(vec!["PHID-A".into(), "PHID-B".into()])
        );
        assert_eq!(
            parse_client_command(r#"{"command":"unsubscribe","data":["PHID-A"]}"#),
            ClientCommand::Unsubscribe(vec!["PHID-A".into()])
        );
        assert_eq!(
            parse_client_command(r#"{"command":"ping"}"#),
            ClientCommand::Ping
        );
        assert_eq!(
            parse_client_command(r#"{"data":null,"command":"ping"}"#),
            ClientCommand::Ping
        );
    }

    #[test]
    fn client_commands_that_are_ignored() {
        for frame in [
            "",
            "not json",
            "[]",
            "null",
            r#"{"command":"subscribe","data":null}"#,
            r#"{"command":"subscribe","data":"PHID-A"}"#,
            r#"{"command":"subscribe"}"#,
            r#"{"command":"unsubscribe","data":{}}"#,
            r#"{"command":"dance","data":[]}"#,
            r#"{"command":7}"#,
            r#"{"data":[]}"#,
        ] {
            assert_eq!(
                parse_client_command(frame),
                ClientCommand::Ignored,
                "{frame}"
            );
        }
    }

    #[test]
    fn replay_age_is_clamped() {
        let age = |frame: &str| match parse_client_command(frame) {
            ClientCommand::Replay { age_ms } => age_ms,
            other => panic!("{other:?}"),
        };
        assert_eq!(age(r#"{"command":"replay","data":{"age":5000}}"#), 5000);
        assert_eq!(age(r#"{"command":"replay","data":{"age":60000}}"#), 60000);
        assert_eq!(age(r#"{"command":"replay","data":{"age":1.9}}"#), 1);
        assert_eq!(age(r#"{"command":"replay","data":{"age":0}}"#), 60000);
        assert_eq!(age(r#"{"command":"replay","data":{"age":-5}}"#), 60000);
        assert_eq!(age(r#"{"command":"replay","data":{"age":60001}}"#), 60000);
        assert_eq!(age(r#"{"command":"replay","data":{"age":"5000"}}"#), 60000);
        assert_eq!(age(r#"{"command":"replay","data":null}"#), 60000);
        assert_eq!(age(r#"{"command":"replay"}"#), 60000);
        assert_eq!(
            age(r#"{"command":"replay","data":{"age":123456789012345678901234567890}}"#),
            60000
        );
    }
}
