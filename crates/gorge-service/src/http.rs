//! Response helpers shared by every endpoint: JSON bodies, the error envelope
//! `{"error":{"code":"ERR_…","message":"…"}}`, and request bodies read under a size limit.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::StatusCode;
use serde::Serialize;

/// The body of every response: the whole body in one buffer (no streaming anywhere).
pub type Body = Full<Bytes>;
/// The response type every handler returns.
pub type Response = hyper::Response<Body>;

/// `Content-Type` of JSON answers.
pub const JSON: &str = "application/json";

/// The message of every 500: internals (driver text, addresses, SQL) stay in the logs.
pub const INTERNAL_MESSAGE: &str = "internal error";

/// A response with the given status, content type and body.
pub fn bytes_response(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response {
    let mut response = hyper::Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    if let Ok(value) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

/// Compact JSON. Serializing our own types cannot fail; if it somehow does, answer 500.
pub fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => bytes_response(status, JSON, body),
        Err(_) => internal_error(),
    }
}

/// The stable `code` of the error envelope for a status (`ERR_` and the status's name), the
/// same in both services so a client can match on it.
pub fn error_code(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "ERR_BAD_REQUEST",
        StatusCode::UNAUTHORIZED => "ERR_UNAUTHORIZED",
        StatusCode::FORBIDDEN => "ERR_FORBIDDEN",
        StatusCode::NOT_FOUND => "ERR_NOT_FOUND",
        StatusCode::METHOD_NOT_ALLOWED => "ERR_METHOD_NOT_ALLOWED",
        StatusCode::PAYLOAD_TOO_LARGE => "ERR_TOO_LARGE",
        StatusCode::REQUEST_TIMEOUT => "ERR_TIMEOUT",
        StatusCode::SERVICE_UNAVAILABLE => "ERR_UNAVAILABLE",
        _ => "ERR_INTERNAL",
    }
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: EnvelopeError<'a>,
}

#[derive(Serialize)]
struct EnvelopeError<'a> {
    code: &'static str,
    message: &'a str,
}

/// The error envelope with the code derived from `status`. For a 500 use [`internal_error`],
/// which ignores whatever message the caller might have wanted to pass.
pub fn error_response(status: StatusCode, message: &str) -> Response {
    let message = if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
        INTERNAL_MESSAGE
    } else {
        message
    };
    let envelope = Envelope {
        error: EnvelopeError {
            code: error_code(status),
            message,
        },
    };
    json_response(status, &envelope)
}

/// 500 with the fixed message.
pub fn internal_error() -> Response {
    error_response(StatusCode::INTERNAL_SERVER_ERROR, INTERNAL_MESSAGE)
}

/// 405 with the `Allow` header listing what the resource accepts.
pub fn method_not_allowed(allow: &str) -> Response {
    let mut response = error_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    if let Ok(value) = HeaderValue::from_str(allow) {
        response.headers_mut().insert(ALLOW, value);
    }
    response
}

/// Why [`read_body_limited`] did not return a body.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// The body is longer than the limit (declared or actual).
    TooLarge,
    /// The connection failed while the body was being read.
    Read,
}

/// Reads the whole body, refusing anything over `limit` bytes. A declared `Content-Length`
/// over the limit is refused before reading anything.
pub async fn read_body_limited(
    request: hyper::Request<Incoming>,
    limit: usize,
) -> Result<Bytes, BodyError> {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge),
        Err(_) => Err(BodyError::Read),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_text(response: Response) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn envelope_bytes_are_exact() {
        let response = error_response(StatusCode::NOT_FOUND, "no such path");
        assert_eq!(response.status(), 404);
        assert_eq!(response.headers()[CONTENT_TYPE], JSON);
        assert_eq!(
            body_text(response).await,
            r#"{"error":{"code":"ERR_NOT_FOUND","message":"no such path"}}"#
        );
    }

    #[tokio::test]
    async fn internal_error_never_leaks_details() {
        let leaked = "mysql://phorge:hunter2@db.internal:3306 Access denied";
        let response = error_response(StatusCode::INTERNAL_SERVER_ERROR, leaked);
        assert_eq!(
            body_text(response).await,
            r#"{"error":{"code":"ERR_INTERNAL","message":"internal error"}}"#
        );
        assert_eq!(
            body_text(internal_error()).await,
            r#"{"error":{"code":"ERR_INTERNAL","message":"internal error"}}"#
        );
    }

    #[tokio::test]
    async fn method_not_allowed_names_allowed_methods() {
        let response = method_not_allowed("GET, POST");
        assert_eq!(response.headers()[ALLOW], "GET, POST");
        assert_eq!(
            body_text(response).await,
            r#"{"error":{"code":"ERR_METHOD_NOT_ALLOWED","message":"method not allowed"}}"#
        );
    }

    #[test]
    fn codes_for_statuses() {
        assert_eq!(error_code(StatusCode::BAD_REQUEST), "ERR_BAD_REQUEST");
        assert_eq!(error_code(StatusCode::PAYLOAD_TOO_LARGE), "ERR_TOO_LARGE");
        assert_eq!(error_code(StatusCode::UNAUTHORIZED), "ERR_UNAUTHORIZED");
        assert_eq!(error_code(StatusCode::BAD_GATEWAY), "ERR_INTERNAL");
    }
}
