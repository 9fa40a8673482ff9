//! WebSocket framing after the handshake (RFC 6455 §5): server frames encoded once into
//! shared bytes, and a small, bounded reader of client frames.
//!
//! Server-to-client frames are unmasked, so a message's whole frame is byte-identical for
//! every recipient: it is encoded once (tungstenite's header encoder) and the same `Bytes`
//! goes to every socket. Client frames are parsed with tungstenite's header parser; the
//! reader keeps only an incomplete frame (at most the frame limit), so an idle socket holds
//! no buffer at all, and every protocol violation maps to the close code the RFC asks for.

use std::io::Cursor;
use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;

/// Encodes one final, unmasked frame.
pub fn encode(opcode: OpCode, payload: &[u8]) -> Bytes {
    let header = FrameHeader {
        opcode,
        ..FrameHeader::default()
    };
    let length = payload.len() as u64;
    let mut frame = Vec::with_capacity(header.len(length) + payload.len());
    header
        .format(length, &mut frame)
        .expect("writing to a Vec cannot fail");
    frame.extend_from_slice(payload);
    Bytes::from(frame)
}

/// A text frame holding `text`.
pub fn text(text: &[u8]) -> Bytes {
    encode(OpCode::Data(Data::Text), text)
}

/// The payload of a frame made by [`text`] (what peers are relayed).
pub fn payload(frame: &Bytes) -> Bytes {
    let header_len = match frame.get(1).map(|b| b & 0x7f) {
        Some(126) => 4,
        Some(127) => 10,
        _ => 2,
    };
    frame.slice(header_len.min(frame.len())..)
}

/// A close frame with `code` and a short reason.
pub fn close(code: u16, reason: &str) -> Bytes {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason.as_bytes());
    encode(OpCode::Control(Control::Close), &payload)
}

/// A close frame without a status code.
pub fn close_empty() -> Bytes {
    encode(OpCode::Control(Control::Close), &[])
}

/// A pong answering a client's ping with `payload`.
pub fn pong(payload: &[u8]) -> Bytes {
    encode(OpCode::Control(Control::Pong), payload)
}

/// Aphlict's `{"type":"pong"}` text frame, encoded once for the process.
pub static APHLICT_PONG: LazyLock<Bytes> =
    LazyLock::new(|| text(phorge_wire::aphlict::PONG_TEXT.as_bytes()));

/// A server ping with an empty payload.
pub static PING: LazyLock<Bytes> = LazyLock::new(|| encode(OpCode::Control(Control::Ping), &[]));

/// One complete client message or control frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound {
    Text(String),
    Binary,
    Ping(Bytes),
    Pong,
    /// The client's close frame payload (code and reason), possibly empty.
    Close(Bytes),
}

/// Why the client's byte stream cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A frame or message over the limit: 1009.
    TooLarge,
    /// Not valid framing (reserved bits or opcodes, an unmasked frame, a bad control frame,
    /// a stray continuation): 1002.
    Protocol,
    /// A text message or close reason that is not UTF-8: 1007.
    InvalidUtf8,
}

impl Violation {
    pub fn code(self) -> u16 {
        match self {
            Violation::TooLarge => 1009,
            Violation::Protocol => 1002,
            Violation::InvalidUtf8 => 1007,
        }
    }
}

/// Reassembles client frames from whatever bytes arrive.
#[derive(Debug)]
pub struct Reader {
    /// Bytes of an incomplete frame (empty, and unallocated, between frames).
    buf: BytesMut,
    /// A fragmented message under way: text or binary, and what has arrived of it.
    fragment: Option<Fragment>,
    max_bytes: usize,
    /// Frames parsed since [`Reader::take_frames`] (fragments and control frames included:
    /// each is work a client made us do).
    frames: u64,
}

impl Reader {
    /// A reader that starts with `early` (bytes that came with the handshake) and refuses
    /// frames and messages over `max_bytes`.
    pub fn new(early: Bytes, max_bytes: usize) -> Self {
        Reader {
            buf: BytesMut::from(&early[..]),
            fragment: None,
            max_bytes,
            frames: 0,
        }
    }

    /// Bytes this reader holds: an incomplete frame and a fragmented message under way (each
    /// bounded by the frame limit once the frame's header has been read).
    pub fn held_bytes(&self) -> usize {
        self.buf.len() + self.fragment.as_ref().map_or(0, |f| f.data.len())
    }

    /// Adds bytes read from the socket.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// How many frames were parsed since the last call.
    pub fn take_frames(&mut self) -> u64 {
        std::mem::take(&mut self.frames)
    }

    /// The next complete message or control frame, if the bytes so far hold one.
    pub fn next_frame(&mut self) -> Result<Option<Inbound>, Violation> {
        loop {
            let mut cursor = Cursor::new(&self.buf[..]);
            let (header, length) = match FrameHeader::parse(&mut cursor) {
                Ok(Some(parsed)) => parsed,
                Ok(None) => {
                    self.release();
                    return Ok(None);
                }
                Err(_) => return Err(Violation::Protocol),
            };
            let header_len = cursor.position() as usize;
            // The size first, as tungstenite checks it (a frame both too large and malformed
            // closes with 1009); the rest is refused without waiting for the payload.
            if length > self.max_bytes as u64 {
                return Err(Violation::TooLarge);
            }
            if header.rsv1 || header.rsv2 || header.rsv3 {
                return Err(Violation::Protocol);
            }
            let Some(mask) = header.mask else {
                return Err(Violation::Protocol);
            };
            let control = matches!(header.opcode, OpCode::Control(_));
            if control && (!header.is_final || length > 125) {
                return Err(Violation::Protocol);
            }
            let length = length as usize;
            if self.buf.len() < header_len + length {
                return Ok(None);
            }
            self.frames += 1;
            let _ = self.buf.split_to(header_len);
            let mut payload = self.buf.split_to(length);
            for (i, byte) in payload.iter_mut().enumerate() {
                *byte ^= mask[i & 3];
            }
            self.release();
            if let Some(inbound) = self.frame(header.opcode, header.is_final, payload.freeze())? {
                return Ok(Some(inbound));
            }
        }
    }

    /// Frees the buffer between frames, so an idle socket holds none.
    fn release(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            self.buf = BytesMut::new();
        }
    }

    fn frame(
        &mut self,
        opcode: OpCode,
        is_final: bool,
        payload: Bytes,
    ) -> Result<Option<Inbound>, Violation> {
        let mut message = match opcode {
            OpCode::Control(Control::Ping) => return Ok(Some(Inbound::Ping(payload))),
            OpCode::Control(Control::Pong) => return Ok(Some(Inbound::Pong)),
            OpCode::Control(Control::Close) => return close_payload(payload).map(Some),
            OpCode::Control(Control::Reserved(_)) | OpCode::Data(Data::Reserved(_)) => {
                return Err(Violation::Protocol)
            }
            OpCode::Data(Data::Continue) => {
                let Some(mut fragment) = self.fragment.take() else {
                    return Err(Violation::Protocol);
                };
                if fragment.data.len() + payload.len() > self.max_bytes {
                    return Err(Violation::TooLarge);
                }
                fragment.data.extend_from_slice(&payload);
                fragment
            }
            OpCode::Data(kind) => {
                if self.fragment.is_some() {
                    return Err(Violation::Protocol);
                }
                Fragment {
                    is_text: kind == Data::Text,
                    data: payload.to_vec(),
                    valid_up_to: 0,
                }
            }
        };
        if !is_final {
            if message.is_text {
                message.check_utf8()?;
            }
            self.fragment = Some(message);
            return Ok(None);
        }
        if !message.is_text {
            return Ok(Some(Inbound::Binary));
        }
        String::from_utf8(message.data)
            .map(|text| Some(Inbound::Text(text)))
            .map_err(|_| Violation::InvalidUtf8)
    }
}

/// A fragmented message under way.
#[derive(Debug)]
struct Fragment {
    is_text: bool,
    data: Vec<u8>,
    /// How much of a text message's `data` is known to be valid UTF-8.
    valid_up_to: usize,
}

impl Fragment {
    /// Fails a text message at the first fragment that makes it invalid UTF-8 (as
    /// tungstenite does), not at its end. Only the bytes not yet checked are read again, so
    /// a message of many small fragments costs linear time.
    fn check_utf8(&mut self) -> Result<(), Violation> {
        match std::str::from_utf8(&self.data[self.valid_up_to..]) {
            Ok(_) => {
                self.valid_up_to = self.data.len();
                Ok(())
            }
            // A character cut by the fragment's end: the next fragment may complete it.
            Err(err) if err.error_len().is_none() => {
                self.valid_up_to += err.valid_up_to();
                Ok(())
            }
            Err(_) => Err(Violation::InvalidUtf8),
        }
    }
}

fn close_payload(payload: Bytes) -> Result<Inbound, Violation> {
    match payload.len() {
        0 => Ok(Inbound::Close(payload)),
        1 => Err(Violation::Protocol),
        _ => {
            // The reason before the code, as tungstenite checks them.
            if std::str::from_utf8(&payload[2..]).is_err() {
                return Err(Violation::InvalidUtf8);
            }
            let code = u16::from_be_bytes([payload[0], payload[1]]);
            // Codes a peer may send: RFC 6455 §7.4 and the IANA registry's 1012 and 1013
            // (what tungstenite accepts; a browser sends only 1000 and 3000-4999 anyway).
            let valid = matches!(code, 1000..=1003 | 1007..=1013 | 3000..=4999);
            if !valid {
                return Err(Violation::Protocol);
            }
            Ok(Inbound::Close(payload))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame.
    fn client(first: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [1, 2, 3, 4];
        let mut out = vec![first];
        match payload.len() {
            n if n < 126 => out.push(0x80 | n as u8),
            n if n <= 0xffff => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
        out
    }

    fn read(bytes: &[u8]) -> Result<Option<Inbound>, Violation> {
        let mut reader = Reader::new(Bytes::new(), 64);
        reader.extend(bytes);
        reader.next_frame()
    }

    #[test]
    fn encodes_server_frames_exactly() {
        assert_eq!(&text(b"hi")[..], b"\x81\x02hi");
        assert_eq!(&APHLICT_PONG[..], b"\x81\x0f{\"type\":\"pong\"}");
        assert_eq!(&PING[..], b"\x89\x00");
        assert_eq!(&close(1008, "x")[..], b"\x88\x03\x03\xf0x");
        let big = text(&[b'a'; 70_000]);
        assert_eq!(&big[..10], b"\x81\x7f\x00\x00\x00\x00\x00\x01\x11\x70");
        assert_eq!(payload(&big).len(), 70_000);
        assert_eq!(&payload(&text(&[b'b'; 300]))[..], &[b'b'; 300][..]);
        assert_eq!(&payload(&text(b"hi"))[..], b"hi");
    }

    #[test]
    fn reads_frames_split_anywhere() {
        let frame = client(0x81, b"{\"command\":\"ping\"}");
        let mut reader = Reader::new(Bytes::from(frame[..3].to_vec()), 64);
        assert_eq!(reader.next_frame(), Ok(None));
        reader.extend(&frame[3..]);
        assert_eq!(
            reader.next_frame(),
            Ok(Some(Inbound::Text("{\"command\":\"ping\"}".into())))
        );
        assert_eq!(reader.next_frame(), Ok(None));
        assert_eq!(reader.buf.capacity(), 0);
    }

    #[test]
    fn reassembles_fragments_between_control_frames() {
        let mut bytes = client(0x01, b"ab");
        bytes.extend(client(0x89, b"p"));
        bytes.extend(client(0x80, b"cd"));
        let mut reader = Reader::new(Bytes::from(bytes), 64);
        assert_eq!(
            reader.next_frame(),
            Ok(Some(Inbound::Ping(Bytes::from_static(b"p"))))
        );
        assert_eq!(reader.next_frame(), Ok(Some(Inbound::Text("abcd".into()))));
        // Three frames for one message and one ping.
        assert_eq!(reader.take_frames(), 3);
        assert_eq!(reader.take_frames(), 0);
    }

    #[test]
    fn violations_get_their_rfc_codes() {
        // Unmasked.
        assert_eq!(read(b"\x81\x01a"), Err(Violation::Protocol));
        // Reserved bit, reserved opcode, stray continuation, fragmented or long control.
        assert_eq!(read(&client(0xc1, b"a")), Err(Violation::Protocol));
        assert_eq!(read(&client(0x83, b"a")), Err(Violation::Protocol));
        assert_eq!(read(&client(0x80, b"a")), Err(Violation::Protocol));
        assert_eq!(read(&client(0x09, b"a")), Err(Violation::Protocol));
        let mut roomy = Reader::new(Bytes::from(client(0x89, &[0; 126])), 256);
        assert_eq!(roomy.next_frame(), Err(Violation::Protocol));
        // A close with one byte or a code no one may send.
        assert_eq!(read(&client(0x88, b"\x03")), Err(Violation::Protocol));
        assert_eq!(read(&client(0x88, b"\x03\xed")), Err(Violation::Protocol));
        // Not UTF-8.
        assert_eq!(read(&client(0x81, b"\xff")), Err(Violation::InvalidUtf8));
        assert_eq!(
            read(&client(0x88, b"\x03\xe8\xff")),
            Err(Violation::InvalidUtf8)
        );
        // Too large, as one frame or as fragments.
        assert_eq!(read(&client(0x81, &[b'a'; 65])), Err(Violation::TooLarge));
        let mut parts = client(0x01, &[b'a'; 40]);
        parts.extend(client(0x80, &[b'a'; 40]));
        assert_eq!(read(&parts), Err(Violation::TooLarge));
        assert_eq!(Violation::InvalidUtf8.code(), 1007);
    }

    /// Where the reader disagreed with tungstenite (found by tests/frames_prop.rs), pinned.
    #[test]
    fn violations_are_coded_as_tungstenite_codes_them() {
        // Too large and malformed (a reserved bit, no mask): the size decides, 1009.
        let mut header = vec![0x28, 0x41];
        header.extend([0; 65]);
        assert_eq!(read(&header), Err(Violation::TooLarge));
        // A close whose code is invalid and whose reason is not UTF-8: the reason, 1007.
        assert_eq!(
            read(b"\x88\x83\0\0\0\0\x61\xc3\xa9"),
            Err(Violation::InvalidUtf8)
        );
        // 1012 and 1013 (IANA) are codes a peer may send.
        for code in [b"\x03\xf4", b"\x03\xf5"] {
            assert_eq!(
                read(&client(0x88, code)),
                Ok(Some(Inbound::Close(Bytes::copy_from_slice(code))))
            );
        }
        assert_eq!(read(&client(0x88, b"\x03\xf6")), Err(Violation::Protocol));
        // A text fragment that cannot be UTF-8 fails at once, before the ping behind it...
        let mut bytes = client(0x01, b"a\xff");
        bytes.extend(client(0x89, b"p"));
        assert_eq!(read(&bytes), Err(Violation::InvalidUtf8));
        // ...but a character cut between fragments is fine.
        let mut bytes = client(0x01, b"\xc3");
        bytes.extend(client(0x80, b"\xa9"));
        assert_eq!(read(&bytes), Ok(Some(Inbound::Text("é".into()))));
    }

    #[test]
    fn close_and_binary_frames() {
        assert_eq!(
            read(&client(0x88, b"\x03\xe8bye")),
            Ok(Some(Inbound::Close(Bytes::from_static(b"\x03\xe8bye"))))
        );
        assert_eq!(read(&client(0x82, b"\x00")), Ok(Some(Inbound::Binary)));
        assert_eq!(read(&client(0x8a, b"")), Ok(Some(Inbound::Pong)));
    }
}
