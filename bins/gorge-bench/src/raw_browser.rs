//! A minimal browser (a WebSocket client of the client port) for load that must cost the
//! bench next to nothing: one task and one small buffer per socket, no WebSocket library,
//! frames parsed in place.
//!
//! `gorge-bench cluster` holds thousands of these at once on the same two cores as the
//! servers it measures; with a full client per socket the bench's own reading was what
//! saturated the machine (p50 above 200 ms at 1 000 sockets per node), so the figures said
//! more about the bench than about the servers. This client does what a browser's socket
//! does on the wire (handshake, `subscribe`, answer the server's pings) and nothing more.
//! It speaks only to servers on loopback that this bench started.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::browser;
use crate::http1;

/// What the server must answer to a ping command, exactly.
pub const PONG: &[u8] = br#"{"type":"pong"}"#;

/// Read buffer per socket; a frame longer than this is skipped in pieces, never held.
const BUFFER: usize = 4096;

/// Frames a client sends must be masked (RFC 6455 §5.3); the key need not be secret for a
/// bench talking to its own loopback servers.
const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// A connected, subscribed socket and the bytes it read past the handshake.
pub struct RawBrowser {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Bytes of `buf` not parsed yet.
    filled: usize,
    /// Payload bytes of an oversized frame still to skip.
    skipping: u64,
}

/// How a socket's reading ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `stop` flipped.
    Stopped,
    /// The server closed, reset or sent something this client does not speak.
    Closed,
}

/// Opens a WebSocket to `server`, subscribes to `phids` and waits for the pong that proves
/// the subscription took effect (the server handles one socket's commands in order).
pub async fn open(
    server: SocketAddr,
    index: usize,
    phids: &[String],
    limit: Duration,
) -> Result<RawBrowser, String> {
    tokio::time::timeout(limit, async {
        let mut stream = browser::connect(server, browser::source_ip(server, index), None).await?;
        let request = format!(
            "GET / HTTP/1.1\r\nHost: {server}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = vec![0u8; BUFFER];
        let mut filled = 0;
        let (head, head_end) = loop {
            if filled == buf.len() {
                return Err("handshake answer too long".to_string());
            }
            let n = stream
                .read(&mut buf[filled..])
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("closed during the handshake".to_string());
            }
            filled += n;
            let parsed =
                http1::parse_head(&buf[..filled]).map_err(|e| format!("handshake answer: {e}"))?;
            if let Some(parsed) = parsed {
                break parsed;
            }
        };
        if head.second_word() != "101" {
            return Err(format!("handshake refused: {}", head.start_line));
        }
        buf.copy_within(head_end..filled, 0);
        let mut ws = RawBrowser {
            stream,
            buf,
            filled: filled - head_end,
            skipping: 0,
        };
        let subscribe = serde_json::json!({"command": "subscribe", "data": phids}).to_string();
        let mut out = masked(0x1, subscribe.as_bytes());
        out.extend(masked(0x1, br#"{"command":"ping","data":null}"#));
        ws.stream
            .write_all(&out)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut ponged = false;
        while !ponged {
            if ws.read_some().await? == 0 {
                return Err("closed before pong".to_string());
            }
            ws.parse(|text| ponged |= text == PONG).await?;
        }
        Ok(ws)
    })
    .await
    .map_err(|_| "no pong in time".to_string())?
}

impl RawBrowser {
    /// Reads frames until `stop` flips or the connection ends, calling `on_text` with each
    /// text frame's payload (pongs included) and answering pings.
    pub async fn read(
        mut self,
        mut stop: watch::Receiver<bool>,
        mut on_text: impl FnMut(&[u8]),
    ) -> End {
        loop {
            if self.parse(&mut on_text).await.is_err() {
                return End::Closed;
            }
            tokio::select! {
                read = self.read_some() => match read {
                    Ok(0) | Err(_) => return if *stop.borrow() { End::Stopped } else { End::Closed },
                    Ok(_) => {}
                },
                _ = stop.changed() => return End::Stopped,
            }
        }
    }

    async fn read_some(&mut self) -> Result<usize, String> {
        if self.filled == self.buf.len() {
            return Err("frame header larger than the buffer".to_string());
        }
        let n = self
            .stream
            .read(&mut self.buf[self.filled..])
            .await
            .map_err(|e| format!("read: {e}"))?;
        self.filled += n;
        Ok(n)
    }

    /// Handles every whole frame in the buffer and keeps the rest for the next read.
    async fn parse(&mut self, mut on_text: impl FnMut(&[u8])) -> Result<(), String> {
        let mut at = 0;
        loop {
            if self.skipping > 0 {
                let take = (self.skipping as usize).min(self.filled - at);
                self.skipping -= take as u64;
                at += take;
                if self.skipping > 0 {
                    break;
                }
            }
            let Some((opcode, header, len)) = frame_header(&self.buf[at..self.filled])? else {
                break;
            };
            let whole = header as u64 + len;
            if whole > self.buf.len() as u64 {
                // Larger than the buffer: a bench frame never is; skip it unread.
                self.skipping = whole - (self.filled - at) as u64;
                at = self.filled;
                continue;
            }
            if ((self.filled - at) as u64) < whole {
                break;
            }
            let payload = &self.buf[at + header..at + whole as usize];
            match opcode {
                0x1 => on_text(payload),
                0x9 => {
                    let pong = masked(0xA, payload);
                    self.stream
                        .write_all(&pong)
                        .await
                        .map_err(|e| format!("write: {e}"))?;
                }
                0x8 => return Err("closed by the server".to_string()),
                _ => {}
            }
            at += whole as usize;
        }
        self.buf.copy_within(at..self.filled, 0);
        self.filled -= at;
        Ok(())
    }
}

/// `(opcode, header length, payload length)` of the unmasked server frame at the start of
/// `bytes`, or `None` when its header is not all there yet.
pub fn frame_header(bytes: &[u8]) -> Result<Option<(u8, usize, u64)>, String> {
    if bytes.len() < 2 {
        return Ok(None);
    }
    if bytes[1] & 0x80 != 0 {
        return Err("a masked frame from the server".to_string());
    }
    let opcode = bytes[0] & 0x0f;
    Ok(match bytes[1] & 0x7f {
        126 if bytes.len() >= 4 => Some((
            opcode,
            4,
            u64::from(u16::from_be_bytes([bytes[2], bytes[3]])),
        )),
        127 if bytes.len() >= 10 => {
            let mut len = [0u8; 8];
            len.copy_from_slice(&bytes[2..10]);
            Some((opcode, 10, u64::from_be_bytes(len)))
        }
        126 | 127 => None,
        short => Some((opcode, 2, u64::from(short))),
    })
}

/// One final, masked client frame.
pub fn masked(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(payload.len() + 14);
    frame.push(0x80 | opcode);
    match payload.len() {
        len if len < 126 => frame.push(0x80 | len as u8),
        len if len <= 0xffff => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        }
        len => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(&MASK);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_headers_of_every_length_form() {
        assert_eq!(frame_header(&[0x81]).unwrap(), None);
        assert_eq!(frame_header(&[0x81, 5]).unwrap(), Some((1, 2, 5)));
        assert_eq!(frame_header(&[0x89, 126, 1]).unwrap(), None);
        assert_eq!(frame_header(&[0x81, 126, 1, 0]).unwrap(), Some((1, 4, 256)));
        let mut long = vec![0x82, 127];
        long.extend_from_slice(&70_000u64.to_be_bytes());
        assert_eq!(frame_header(&long).unwrap(), Some((2, 10, 70_000)));
        assert!(frame_header(&[0x81, 0x85]).is_err());
    }

    /// A server that answers the upgrade with `head`, then the client's first frames with
    /// `then` (and holds the connection).
    async fn answering(head: &'static [u8], then: &'static [u8]) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            stream.write_all(head).await.unwrap();
            let _ = stream.read(&mut request).await;
            stream.write_all(then).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        addr
    }

    #[tokio::test]
    async fn opens_once_the_pong_arrives() {
        let head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
            Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
        let server = answering(head, b"\x81\x0f{\"type\":\"pong\"}").await;
        let opened = open(server, 0, &["PHID-X".to_string()], Duration::from_secs(5)).await;
        assert!(opened.is_ok(), "{:?}", opened.err());
    }

    #[tokio::test]
    async fn a_refused_handshake_names_the_status_line() {
        let server = answering(
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            b"",
        )
        .await;
        let opened = open(server, 0, &[], Duration::from_secs(5)).await;
        assert_eq!(
            opened.err().as_deref(),
            Some("handshake refused: HTTP/1.1 400 Bad Request")
        );
    }

    #[test]
    fn client_frames_are_masked_as_rfc_6455_says() {
        let frame = masked(0x1, b"hi");
        assert_eq!(&frame[..2], &[0x81, 0x82]);
        assert_eq!(&frame[2..6], &MASK);
        assert_eq!(&frame[6..], &[b'h' ^ MASK[0], b'i' ^ MASK[1]]);
        assert_eq!(&masked(0xA, &[0u8; 200])[..4], &[0x8A, 0xFE, 0, 200]);
    }
}
