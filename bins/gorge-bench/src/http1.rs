//! Just enough HTTP/1.1 for the bench: a keep-alive client for admin POSTs and probes, and
//! head reading for the webhook receiver (parsed by `httparse`).
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

/// Reads one head; `Ok(None)` on a clean end of stream before its first byte. Bytes after
/// the head stay in `reader`.
pub async fn read_head<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
) -> io::Result<Option<Head>> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let mut raw = Vec::new();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            if raw.is_empty() {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated head",
            ));
        }
        let before = raw.len();
        raw.extend_from_slice(available);
        let parsed = parse_head(&raw).map_err(|e| invalid(&format!("bad head: {e}")))?;
        if let Some((head, head_len)) = parsed {
            reader.consume(head_len - before);
            return Ok(Some(head));
        }
        let taken = raw.len() - before;
        reader.consume(taken);
        if raw.len() > MAX_HEAD_BYTES {
            return Err(invalid("head too large"));
        }
    }
}

/// The head at the start of `raw` and its length, `None` while it is incomplete. A request
/// or a response, told apart by the start line.
pub fn parse_head(raw: &[u8]) -> Result<Option<(Head, usize)>, httparse::Error> {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let (status, headers) = if raw.starts_with(b"HTTP/") {
        let mut response = httparse::Response::new(&mut slots);
        (response.parse(raw)?, response.headers)
    } else {
        let mut request = httparse::Request::new(&mut slots);
        (request.parse(raw)?, request.headers)
    };
    let httparse::Status::Complete(head_len) = status else {
        return Ok(None);
    };
    let line_end = raw.iter().position(|&b| b == b'\n').unwrap_or(0);
    let start_line = String::from_utf8_lossy(&raw[..line_end])
        .trim_end_matches('\r')
        .to_owned();
    let mut parsed = Vec::with_capacity(headers.len());
    for header in headers.iter() {
        let value = std::str::from_utf8(header.value).map_err(|_| httparse::Error::HeaderValue)?;
        parsed.push((header.name.to_owned(), value.trim().to_owned()));
    }
    Ok(Some((
        Head {
            start_line,
            headers: parsed,
        },
        head_len,
    )))
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

/// Reads one request with a body of at most `max_body` bytes (`Content-Length`, none if
/// absent); `None` when the connection should end: a clean end of stream, a bad or
/// truncated request, or a body over `max_body`.
pub async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    max_body: usize,
) -> Option<(Head, Vec<u8>)> {
    let head = read_head(reader).await.ok()??;
    let len = head.content_length().ok()?.unwrap_or(0);
    if len > max_body {
        return None;
    }
    let body = read_body(reader, len).await.ok()?;
    Some((head, body))
}

/// A notification server's two ports as the bench was given them.
pub struct ServerUrls {
    /// The client (WebSocket) port's address.
    pub client: SocketAddr,
    /// The path browsers connect to.
    pub client_path: String,
    /// The admin port's address.
    pub admin: SocketAddr,
    /// The admin URL's path (where messages are posted).
    pub admin_path: String,
    /// How to open TLS to the client port, when its URL is `wss://`.
    pub client_tls: Option<std::sync::Arc<crate::tls::ClientTls>>,
}

/// `--client` and `--admin` of the subcommands that drive a running notification server.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// WebSocket URL of the client port (`wss://` for TLS, with `--ca-file`).
    #[arg(long, default_value = "ws://127.0.0.1:22280/")]
    pub client: String,
    /// URL of the admin port.
    #[arg(long, default_value = "http://127.0.0.1:22281/")]
    pub admin: String,
    /// PEM file of the CA(s) a `wss://` client port's certificate must chain to (the only
    /// roots trusted).
    #[arg(long)]
    pub ca_file: Option<std::path::PathBuf>,
}

impl ServerArgs {
    /// Resolves both URLs (see [`parse_url`]); a `wss://` client URL also needs `--ca-file`.
    pub fn resolve(&self) -> Result<ServerUrls, String> {
        let (client_url, client_tls) = match self.client.strip_prefix("wss://") {
            Some(rest) => {
                let ca_file = self
                    .ca_file
                    .as_deref()
                    .ok_or_else(|| format!("--client {}: wss:// needs --ca-file", self.client))?;
                let authority = rest.split('/').next().unwrap_or("");
                let tls = crate::tls::ClientTls::new(ca_file, host_of(authority))?;
                (format!("ws://{rest}"), Some(std::sync::Arc::new(tls)))
            }
            None => (self.client.clone(), None),
        };
        let (client, client_path) = parse_url(&client_url)?;
        let (admin, admin_path) = parse_url(&self.admin)?;
        Ok(ServerUrls {
            client,
            client_path,
            admin,
            admin_path,
            client_tls,
        })
    }

    /// Resolves both URLs for a subcommand whose browsers speak plain `ws://` only.
    pub fn resolve_plain(&self, subcommand: &str) -> Result<ServerUrls, String> {
        if self.client.starts_with("wss://") {
            return Err(format!(
                "--client {}: {subcommand} speaks ws:// only (wss:// is for notify and handshakes)",
                self.client
            ));
        }
        self.resolve()
    }
}

/// The host of `host:port` or `[v6]:port`, brackets removed.
fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host)
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

/// One request on a kept-alive connection to `addr`, connecting first when there is none;
/// a connection that failed is dropped, so the next request connects afresh.
pub async fn request_kept(
    conn: &mut Option<HttpConn>,
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<HttpResponse> {
    let result = async {
        let c = match conn {
            Some(c) => c,
            None => conn.insert(HttpConn::connect(addr).await?),
        };
        c.request(method, target, headers, body).await
    }
    .await;
    if result.is_err() {
        *conn = None;
    }
    result
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
    async fn reads_a_response_head_and_keeps_what_follows() {
        let raw: &[u8] =
            b"HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200";
        let mut reader = BufReader::with_capacity(8, raw);
        let head = read_head(&mut reader).await.unwrap().unwrap();
        assert_eq!(head.start_line, "HTTP/1.1 302 Found");
        assert_eq!(head.second_word(), "302");
        assert_eq!(head.header("location"), Some("/x"));
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"HTTP/1.1 200");
    }

    #[tokio::test]
    async fn a_cut_or_broken_head_is_an_error() {
        let mut cut = BufReader::new(&b"GET / HTTP/1.1\r\nHost: x\r\n"[..]);
        assert_eq!(
            read_head(&mut cut).await.unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        let mut broken = BufReader::new(&b"GET / HTTP/1.1\r\nno colon here\r\n\r\n"[..]);
        assert_eq!(
            read_head(&mut broken).await.unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
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

    #[test]
    fn wss_needs_a_ca_file_and_other_subcommands_refuse_it() {
        let args = ServerArgs {
            client: "wss://127.0.0.1:22280/".into(),
            admin: "http://127.0.0.1:22281/".into(),
            ca_file: None,
        };
        let err = args.resolve().err().unwrap();
        assert!(err.contains("needs --ca-file"), "{err}");
        let err = args.resolve_plain("flood").err().unwrap();
        assert!(err.contains("flood speaks ws:// only"), "{err}");
        assert_eq!(host_of("127.0.0.1:22280"), "127.0.0.1");
        assert_eq!(host_of("[::1]:22280"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
    }
}
