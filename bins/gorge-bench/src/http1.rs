//! Just enough HTTP/1.1 for the bench: a keep-alive client for admin POSTs and probes, and
//! request-head parsing for the webhook receiver.
//!
//! Written by hand instead of using hyper's client because the receiver must misbehave on
//! purpose (reset, hang, 3 MiB bodies, redirect loops) and the client must stay a few bytes
//! of state per connection; both are simplest with direct control of the socket.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Longest request or response head accepted.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest response body the client reads into memory.
const MAX_CLIENT_BODY: usize = 4 * 1024 * 1024;

/// The start line and headers of a request or response.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    pub start_line: String,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn content_length(&self) -> io::Result<Option<usize>> {
        match self.header("content-length") {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad content-length")),
        }
    }

    /// Second word of the start line: the status of a response, the target of a request.
    pub fn second_word(&self) -> &str {
        self.start_line.split(' ').nth(1).unwrap_or("")
    }
}

/// Reads one head; `Ok(None)` on a clean end of stream before its first byte.
pub async fn read_head<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
) -> io::Result<Option<Head>> {
    let mut line = String::new();
    let mut total = 0;
    let mut start_line = None;
    let mut headers = Vec::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).await?;
        if n == 0 {
            if start_line.is_none() && total == 0 {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated head",
            ));
        }
        total += n;
        if total > MAX_HEAD_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
        }
        let trimmed = line.trim_end_matches(['\r', '\n']);
        match start_line {
            None => start_line = Some(trimmed.to_string()),
            Some(_) if trimmed.is_empty() => break,
            Some(_) => {
                let (name, value) = trimmed
                    .split_once(':')
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad header"))?;
                headers.push((name.trim().to_string(), value.trim().to_string()));
            }
        }
    }
    Ok(Some(Head {
        start_line: start_line.unwrap_or_default(),
        headers,
    }))
}

/// Reads exactly `len` body bytes.
pub async fn read_body<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    len: usize,
) -> io::Result<Vec<u8>> {
    let mut body = vec![0; len];
    reader.read_exact(&mut body).await?;
    Ok(body)
}

/// Resolves `http://host:port/path` (or `ws://`) into an address and the path with query.
pub fn parse_url(url: &str) -> Result<(SocketAddr, String), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("ws://"))
        .ok_or_else(|| format!("{url}: only http:// and ws:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .next()
        .ok_or_else(|| format!("{url}: host has no address"))?;
    Ok((addr, path.to_string()))
}

/// One keep-alive client connection.
pub struct HttpConn {
    stream: BufReader<TcpStream>,
    host: String,
}

/// A response's status and body.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

impl HttpConn {
    pub async fn connect(addr: SocketAddr) -> io::Result<HttpConn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(HttpConn {
            stream: BufReader::new(stream),
            host: addr.to_string(),
        })
    }

    /// Sends one request and reads its response. The connection is unusable after an error.
    pub async fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<HttpResponse> {
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {}\r\n", self.host);
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        self.stream.get_mut().write_all(&request).await?;
        let head = read_head(&mut self.stream).await?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "closed before response")
        })?;
        let status: u16 = head
            .second_word()
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad status line"))?;
        if head
            .header("transfer-encoding")
            .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "chunked responses are not supported",
            ));
        }
        let body = match head.content_length()? {
            Some(len) if len > MAX_CLIENT_BODY => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "response body too large",
                ))
            }
            Some(len) => read_body(&mut self.stream, len).await?,
            None => {
                let mut body = Vec::new();
                (&mut self.stream)
                    .take(MAX_CLIENT_BODY as u64)
                    .read_to_end(&mut body)
                    .await?;
                body
            }
        };
        Ok(HttpResponse { status, body })
    }
}

/// One GET on a fresh connection, bounded by `limit`.
pub async fn get_once(addr: SocketAddr, target: &str, limit: Duration) -> io::Result<HttpResponse> {
    tokio::time::timeout(limit, async {
        let mut conn = HttpConn::connect(addr).await?;
        conn.request("GET", target, &[], b"").await
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "request timed out"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn parses_head_and_body() {
        let raw: &[u8] = b"POST /hook/3 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloNEXT";
        let mut reader = BufReader::new(raw);
        let head = read_head(&mut reader).await.unwrap().unwrap();
        assert_eq!(head.start_line, "POST /hook/3 HTTP/1.1");
        assert_eq!(head.second_word(), "/hook/3");
        assert_eq!(head.header("CONTENT-length"), Some("5"));
        assert_eq!(read_body(&mut reader, 5).await.unwrap(), b"hello");
    }

    #[tokio::test]
    async fn clean_eof_is_not_an_error() {
        let mut reader = BufReader::new(&b""[..]);
        assert!(read_head(&mut reader).await.unwrap().is_none());
    }

    #[test]
    fn parses_urls() {
        let (addr, path) = parse_url("ws://127.0.0.1:22280/").unwrap();
        assert_eq!((addr.port(), path.as_str()), (22280, "/"));
        let (_, path) = parse_url("http://127.0.0.1:9").unwrap();
        assert_eq!(path, "/");
        assert!(parse_url("https://127.0.0.1/").is_err());
    }
}
