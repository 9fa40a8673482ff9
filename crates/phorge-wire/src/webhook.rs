//! Herald webhook requests: the `properties` column Phorge writes, the JSON body
//! `HeraldWebhookWorker` POSTs, and its HMAC signature.
//!
//! The body is `PhutilJSON::encodeFormatted` of
//! `{object:{type,phid}, triggers:[{phid}], action:{test,silent,secure,epoch}, transactions:[{phid}]}`
//! in exactly that key order; receivers verify the signature over those exact bytes.
//! `compat/phutil-json-vectors.json` pins them against the real PHP output.

use std::fmt;

use ring::hmac;
use serde_json::{Map, Value};

use crate::phid::object_type_or_unknown;
use crate::phutil_json;
use crate::values::{ErrorType, RetryMode};

/// Header carrying [`sign`]'s output.
pub const SIGNATURE_HEADER: &str = "X-Phabricator-Webhook-Signature";

/// `Content-Type` of the body.
pub const CONTENT_TYPE: &str = "application/json";

/// Property keys Phorge writes on `herald_webhookrequest.properties`.
pub mod keys {
    /// `"forever"` or `"never"` ([`RetryMode`](crate::values::RetryMode)).
    pub const RETRY: &str = "retry";
    /// The transactions that triggered the request, as a list of PHIDs.
    pub const TRANSACTION_PHIDS: &str = "transactionPHIDs";
    /// The Herald rules (or test) that triggered it, as a list of PHIDs.
    pub const TRIGGER_PHIDS: &str = "triggerPHIDs";
    /// Whether the edit was silent (no notifications).
    pub const SILENT: &str = "silent";
    /// Phorge's secure-action flag.
    pub const SECURE: &str = "secure";
    /// Whether the request is a test sent from the hook's page.
    pub const TEST: &str = "test";
    /// Written by the worker after an attempt: the kind of the last error.
    pub const ERROR_TYPE: &str = "errorType";
    /// Written by the worker after an attempt: the status, cURL number or hook code.
    pub const ERROR_CODE: &str = "errorCode";
}

/// Everything the body is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookPayload {
    /// The object the request is about (`object.phid` in the body; its type is derived).
    pub object_phid: String,
    /// `triggers[].phid` in the body.
    pub trigger_phids: Vec<String>,
    /// `transactions[].phid` in the body.
    pub transaction_phids: Vec<String>,
    /// `action.test` in the body.
    pub test: bool,
    /// `action.silent` in the body.
    pub silent: bool,
    /// `action.secure` in the body.
    pub secure: bool,
    /// The row's `dateCreated`: the same on every retry.
    pub epoch: u64,
}

impl WebhookPayload {
    /// The payload for a request row with parsed `properties` and its `dateCreated`.
    pub fn from_properties(object_phid: &str, properties: &RequestProperties, epoch: u64) -> Self {
        WebhookPayload {
            object_phid: object_phid.to_owned(),
            trigger_phids: properties.trigger_phids.clone(),
            transaction_phids: properties.transaction_phids.clone(),
            test: properties.test,
            silent: properties.silent,
            secure: properties.secure,
            epoch,
        }
    }

    /// The payload as a JSON value, keys in Phorge's order.
    pub fn to_value(&self) -> Value {
        let phid_list = |phids: &[String]| -> Value {
            phids
                .iter()
                .map(|phid| {
                    let mut entry = Map::new();
                    entry.insert("phid".to_owned(), Value::from(phid.as_str()));
                    Value::Object(entry)
                })
                .collect()
        };
        let mut object = Map::new();
        object.insert(
            "type".to_owned(),
            Value::from(object_type_or_unknown(&self.object_phid)),
        );
        object.insert("phid".to_owned(), Value::from(self.object_phid.as_str()));
        let mut action = Map::new();
        action.insert("test".to_owned(), Value::Bool(self.test));
        action.insert("silent".to_owned(), Value::Bool(self.silent));
        action.insert("secure".to_owned(), Value::Bool(self.secure));
        action.insert("epoch".to_owned(), Value::from(self.epoch));
        let mut payload = Map::new();
        payload.insert("object".to_owned(), Value::Object(object));
        payload.insert("triggers".to_owned(), phid_list(&self.trigger_phids));
        payload.insert("action".to_owned(), Value::Object(action));
        payload.insert(
            "transactions".to_owned(),
            phid_list(&self.transaction_phids),
        );
        Value::Object(payload)
    }

    /// The exact request body, trailing newline included.
    pub fn encode_body(&self) -> Vec<u8> {
        phutil_json::encode_formatted(&self.to_value()).into_bytes()
    }
}

/// Lowercase hex HMAC-SHA256 of `body` with the hook's `hmacKey` bytes as key.
pub fn sign(key: &[u8], body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    let tag = hmac::sign(&key, body);
    let mut hex = String::with_capacity(64);
    for byte in tag.as_ref() {
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
    }
    hex
}

/// Why a `properties` column cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub enum PropertiesError {
    /// Not JSON at all.
    NotJson(String),
    /// JSON, but not an object.
    NotAnObject,
    /// An object with a key of the wrong shape; `original` is the whole object, so the
    /// failure write can keep every key.
    InvalidField {
        /// The offending key.
        key: &'static str,
        /// What is wrong with its value.
        reason: &'static str,
        /// The whole object as parsed.
        original: Map<String, Value>,
    },
}

impl PropertiesError {
    /// The column text to write for this failure: the original object (when there was one)
    /// with `errorType` `hook` and `errorCode` `invalid-properties`.
    pub fn rewritten_properties(&self) -> String {
        self.rewritten_with(crate::values::HookErrorCode::InvalidProperties)
    }

    /// The same with another hook error code (a row failed for a reason of its own keeps
    /// what could be read of its properties).
    pub fn rewritten_with(&self, code: crate::values::HookErrorCode) -> String {
        let original = match self {
            PropertiesError::InvalidField { original, .. } => original.clone(),
            PropertiesError::NotJson(_) | PropertiesError::NotAnObject => Map::new(),
        };
        rewrite_properties(&original, ErrorType::Hook, code.as_str())
    }
}

impl fmt::Display for PropertiesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PropertiesError::NotJson(why) => write!(f, "properties are not JSON: {why}"),
            PropertiesError::NotAnObject => f.write_str("properties are not a JSON object"),
            PropertiesError::InvalidField { key, reason, .. } => {
                write!(f, "property `{key}` {reason}")
            }
        }
    }
}

impl std::error::Error for PropertiesError {}

/// A parsed `properties` column. The original object is kept whole, in order, so the
/// result write can preserve every key, including keys this code does not know.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestProperties {
    original: Map<String, Value>,
    /// `transactionPHIDs`; missing means none.
    pub transaction_phids: Vec<String>,
    /// `triggerPHIDs`; missing means none.
    pub trigger_phids: Vec<String>,
    /// `test`, read with PHP's truthiness (as the worker's `(bool)` cast does).
    pub test: bool,
    /// `silent`, read with PHP's truthiness (as the worker's `(bool)` cast does).
    pub silent: bool,
    /// `secure`, read with PHP's truthiness (as the worker's `(bool)` cast does).
    pub secure: bool,
    /// `retry`; anything but `forever` never retries, as in Phorge's worker.
    pub retry: RetryMode,
}

impl RequestProperties {
    /// Parses the column text.
    ///
    /// - `transactionPHIDs` / `triggerPHIDs`: a list, or an object whose values are taken in
    ///   order (test requests write `{"<id>":"PHID-XACT-…"}`); missing or `null` is empty;
    ///   any non-string PHID is an error.
    /// - `test` / `silent` / `secure`: PHP's `(bool)` cast, so `false`, `0`, `""`, `"0"`,
    ///   `null`, `[]`, `{}` and a missing key are false.
    /// - `retry`: `forever` retries; anything else never does (`HeraldWebhookWorker`
    ///   compares with `== RETRY_FOREVER`).
    ///
    /// An empty JSON list `[]` is read as an empty object: PHP cannot tell them apart.
    pub fn parse(text: &str) -> Result<Self, PropertiesError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| PropertiesError::NotJson(e.to_string()))?;
        let original = match value {
            Value::Object(map) => map,
            Value::Array(items) if items.is_empty() => Map::new(),
            _ => return Err(PropertiesError::NotAnObject),
        };
        let invalid = |key: &'static str, reason: &'static str| PropertiesError::InvalidField {
            key,
            reason,
            original: original.clone(),
        };
        let transaction_phids = phid_list(original.get(keys::TRANSACTION_PHIDS))
            .map_err(|reason| invalid(keys::TRANSACTION_PHIDS, reason))?;
        let trigger_phids = phid_list(original.get(keys::TRIGGER_PHIDS))
            .map_err(|reason| invalid(keys::TRIGGER_PHIDS, reason))?;
        let retry = match original.get(keys::RETRY) {
            Some(Value::String(mode)) if mode == RetryMode::Forever.as_str() => RetryMode::Forever,
            _ => RetryMode::Never,
        };
        Ok(RequestProperties {
            transaction_phids,
            trigger_phids,
            test: php_truthy(original.get(keys::TEST)),
            silent: php_truthy(original.get(keys::SILENT)),
            secure: php_truthy(original.get(keys::SECURE)),
            retry,
            original,
        })
    }

    /// The object as read, every key in its original order.
    pub fn original(&self) -> &Map<String, Value> {
        &self.original
    }

    /// The column text with `errorType` / `errorCode` set (see [`rewrite_properties`]).
    pub fn rewritten(&self, error_type: ErrorType, error_code: impl Into<ErrorCode>) -> String {
        rewrite_properties(&self.original, error_type, error_code)
    }
}

/// An `errorCode` value as Phorge's worker writes it: a JSON integer for an HTTP status or
/// a cURL error number (`$status->getStatusCode()`), a string for the hook errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorCode {
    /// An HTTP status or a cURL error number, written as a JSON integer.
    Number(u16),
    /// A hook error code (`uri`, `disabled`…), written as a JSON string.
    Text(String),
}

impl From<u16> for ErrorCode {
    fn from(code: u16) -> Self {
        ErrorCode::Number(code)
    }
}

impl From<&str> for ErrorCode {
    fn from(code: &str) -> Self {
        ErrorCode::Text(code.to_owned())
    }
}

impl From<String> for ErrorCode {
    fn from(code: String) -> Self {
        ErrorCode::Text(code)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorCode::Number(code) => write!(f, "{code}"),
            ErrorCode::Text(code) => f.write_str(code),
        }
    }
}

impl From<ErrorCode> for Value {
    fn from(code: ErrorCode) -> Self {
        match code {
            ErrorCode::Number(code) => Value::from(code),
            ErrorCode::Text(code) => Value::from(code),
        }
    }
}

/// The new `properties` text: `original` with `errorType` and `errorCode` set the way PHP's
/// `setProperty()` does it (an existing key keeps its place, a new one is appended), every
/// other key untouched, written compactly with PhutilJSON's escaping.
pub fn rewrite_properties(
    original: &Map<String, Value>,
    error_type: ErrorType,
    error_code: impl Into<ErrorCode>,
) -> String {
    let mut properties = original.clone();
    properties.insert(
        keys::ERROR_TYPE.to_owned(),
        Value::from(error_type.as_str()),
    );
    properties.insert(keys::ERROR_CODE.to_owned(), Value::from(error_code.into()));
    phutil_json::encode_compact(&Value::Object(properties))
}

fn phid_list(value: Option<&Value>) -> Result<Vec<String>, &'static str> {
    let items: Vec<&Value> = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().collect(),
        Some(Value::Object(map)) => map.values().collect(),
        Some(_) => return Err("is neither a list nor an object"),
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::String(phid) => Ok(phid.clone()),
            _ => Err("holds a value that is not a string"),
        })
        .collect()
}

/// PHP's `(bool)` cast of a decoded JSON value; a missing key is false.
fn php_truthy(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Bool(flag)) => *flag,
        Some(Value::Number(number)) => number.as_f64().is_some_and(|n| n != 0.0),
        Some(Value::String(text)) => !(text.is_empty() || text == "0"),
        Some(Value::Array(items)) => !items.is_empty(),
        Some(Value::Object(map)) => !map.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_form_and_defaults() {
        let props = RequestProperties::parse(
            r#"{"retry":"forever","transactionPHIDs":["PHID-XACT-TASK-1","PHID-XACT-TASK-2"],"triggerPHIDs":["PHID-HRUL-1"]}"#,
        )
        .unwrap();
        assert_eq!(
            props.transaction_phids,
            ["PHID-XACT-TASK-1", "PHID-XACT-TASK-2"]
        );
        assert_eq!(props.trigger_phids, ["PHID-HRUL-1"]);
        assert_eq!(props.retry, RetryMode::Forever);
        assert!(!props.test && !props.silent && !props.secure);
    }

    #[test]
    fn object_form_keeps_value_order() {
        let props = RequestProperties::parse(
            r#"{"transactionPHIDs":{"99":"PHID-XACT-DREV-99","98":"PHID-XACT-DREV-98","100":"PHID-XACT-DREV-100"},"test":true}"#,
        )
        .unwrap();
        assert_eq!(
            props.transaction_phids,
            [
                "PHID-XACT-DREV-99",
                "PHID-XACT-DREV-98",
                "PHID-XACT-DREV-100"
            ]
        );
        assert!(props.test);
        assert_eq!(props.retry, RetryMode::Never);
    }

    #[test]
    fn php_bool_cast() {
        for (text, expected) in [
            ("true", true),
            ("false", false),
            ("1", true),
            ("0", false),
            ("0.0", false),
            ("\"\"", false),
            ("\"0\"", false),
            ("\"false\"", true),
            ("null", false),
            ("[]", false),
            ("[0]", true),
        ] {
            let props = RequestProperties::parse(&format!(r#"{{"silent":{text}}}"#)).unwrap();
            assert_eq!(props.silent, expected, "silent = {text}");
        }
    }

    #[test]
    fn unknown_retry_mode_never_retries() {
        for retry in [r#""sometimes""#, "true", r#""Forever""#] {
            let props = RequestProperties::parse(&format!(r#"{{"retry":{retry}}}"#)).unwrap();
            assert_eq!(props.retry, RetryMode::Never, "retry = {retry}");
        }
    }

    #[test]
    fn unparsable_properties_are_typed_errors() {
        assert!(matches!(
            RequestProperties::parse("{not json"),
            Err(PropertiesError::NotJson(_))
        ));
        assert_eq!(
            RequestProperties::parse(r#""text""#),
            Err(PropertiesError::NotAnObject)
        );
        assert_eq!(
            RequestProperties::parse(r#"["PHID-XACT-1"]"#),
            Err(PropertiesError::NotAnObject)
        );
        let err = RequestProperties::parse(r#"{"keep":1,"triggerPHIDs":[7]}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "property `triggerPHIDs` holds a value that is not a string"
        );
        assert_eq!(
            err.rewritten_properties(),
            r#"{"keep":1,"triggerPHIDs":[7],"errorType":"hook","errorCode":"invalid-properties"}"#
        );
        let err = RequestProperties::parse("garbage").unwrap_err();
        assert_eq!(
            err.rewritten_properties(),
            r#"{"errorType":"hook","errorCode":"invalid-properties"}"#
        );
    }

    #[test]
    fn empty_list_reads_as_empty_object() {
        let props = RequestProperties::parse("[]").unwrap();
        assert!(props.original().is_empty());
        assert!(props.transaction_phids.is_empty());
    }

    #[test]
    fn rewrite_preserves_every_key_in_order() {
        let text = r#"{"zeta":{"n":1.50},"retry":"never","errorCode":"old","transactionPHIDs":{"2":"PHID-XACT-A"},"unknown/key":"é","test":false}"#;
        let props = RequestProperties::parse(text).unwrap();
        assert_eq!(
            props.rewritten(ErrorType::Http, 200),
            r#"{"zeta":{"n":1.50},"retry":"never","errorCode":200,"transactionPHIDs":{"2":"PHID-XACT-A"},"unknown/key":"\u00e9","test":false,"errorType":"http"}"#
        );
        // Phorge writes the HTTP status and cURL numbers as integers, hook codes as strings.
        assert_eq!(
            props.rewritten(ErrorType::Hook, "uri"),
            r#"{"zeta":{"n":1.50},"retry":"never","errorCode":"uri","transactionPHIDs":{"2":"PHID-XACT-A"},"unknown/key":"\u00e9","test":false,"errorType":"hook"}"#
        );
        assert_eq!(ErrorCode::from(7).to_string(), "7");
    }

    #[test]
    fn signature_is_lowercase_hex_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn malformed_object_phid_types_as_unknown() {
        let payload = WebhookPayload {
            object_phid: "not-a-phid".to_owned(),
            trigger_phids: Vec::new(),
            transaction_phids: Vec::new(),
            test: false,
            silent: false,
            secure: false,
            epoch: 1,
        };
        assert_eq!(payload.to_value()["object"]["type"], "????");
    }
}
