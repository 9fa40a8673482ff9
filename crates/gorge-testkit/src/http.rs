//! One raw HTTP/1.1 client for tests: a request with `Connection: close`, the whole response
//! read to the end of the stream and parsed with `httparse`, from async code (tokio) or
//! blocking code (std). Bytes go out exactly as given, so tests can also send malformed ones.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::PATIENCE;

/// A response as received.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    /// The reason phrase of the status line.
    pub reason: String,
    /// Names exactly as sent, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body, cut at `Content-Length` when there is one.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The request bytes for `method target` with `Host`, `Connection: close`, `Content-Length`
/// and `headers`.
pub fn request_bytes(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    [head.as_bytes(), body].concat()
}

/// Parses a whole response (head and everything after it); `None` if there is no complete
/// head.
pub fn parse_response(raw: &[u8]) -> Option<HttpResponse> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head_len) = response.parse(raw).ok()? else {
        return None;
    };
    let headers: Vec<(String, String)> = response
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let mut parsed = HttpResponse {
        status: response.code?,
        reason: response.reason.unwrap_or_default().to_owned(),
        headers,
        body: raw[head_len..].to_vec(),
    };
    if let Some(len) = parsed
        .header("content-length")
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        parsed.body.truncate(len);
    }
    Some(parsed)
}

/// One request on a fresh connection to 127.0.0.1:`port`; panics without a response.
pub async fn request(
    port: u16,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    raw(port, &request_bytes(addr, method, target, headers, body)).await
}

/// Sends raw request bytes to 127.0.0.1:`port` and parses the response; panics without one.
pub async fn raw(port: u16, request: &[u8]) -> HttpResponse {
    try_raw(port, request).await.expect("an HTTP response")
}

/// [`raw`], or `None` when the connection is refused or closed without a response (a
/// listener that is closing). Panics if nothing happens within [`PATIENCE`].
pub async fn try_raw(port: u16, request: &[u8]) -> Option<HttpResponse> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        // The server may answer (and close) before reading everything, e.g. a 413.
        let _ = stream.write_all(request).await;
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw).await;
        Some(raw)
    };
    let raw = tokio::time::timeout(PATIENCE, exchange)
        .await
        .expect("HTTP response in time")?;
    parse_response(&raw)
}

/// A blocking GET on a fresh connection to `addr`; panics without a response.
pub fn get_blocking(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> HttpResponse {
    raw_blocking(addr, &request_bytes(addr, "GET", target, headers, b""))
}

/// Sends raw request bytes to `addr` from blocking code and parses the response; panics
/// without one.
pub fn raw_blocking(addr: SocketAddr, request: &[u8]) -> HttpResponse {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let _ = stream.write_all(request);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    parse_response(&raw).unwrap_or_else(|| {
        panic!(
            "no HTTP response from {addr}: {:?}",
            String::from_utf8_lossy(&raw)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_headers_and_cuts_the_body_at_its_length() {
        let raw =
            b"HTTP/1.1 503 Service Unavailable\r\nX-Case: A\r\nContent-Length: 2\r\n\r\nokEXTRA";
        let r = parse_response(raw).unwrap();
        assert_eq!((r.status, r.reason.as_str()), (503, "Service Unavailable"));
        assert_eq!(r.headers[0], ("X-Case".to_owned(), "A".to_owned()));
        assert_eq!(r.header("x-case"), Some("A"));
        assert_eq!(r.body, b"ok");
    }

    #[test]
    fn an_incomplete_head_is_no_response() {
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-").is_none());
        assert!(parse_response(b"").is_none());
    }

    #[test]
    fn requests_carry_length_and_close() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 9));
        let bytes = request_bytes(addr, "POST", "/x", &[("A", "b")], b"hi");
        assert_eq!(
            bytes,
            b"POST /x HTTP/1.1\r\nHost: 127.0.0.1:9\r\nConnection: close\r\nContent-Length: 2\r\nA: b\r\n\r\nhi"
        );
    }
}
