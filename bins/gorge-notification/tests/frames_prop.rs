//! Property tests of what faces every browser and every PHP POST: the client-frame reader
//! (`frames::Reader`) and the admin body parser (`phorge_wire::aphlict::parse_admin_message`).
//!
//! The reader is checked against tungstenite's own full parser (`WebSocket` in the server
//! role) as the oracle: random and mutated byte streams, fed to the reader split at random
//! points, must give the same messages and end with the same close code, never panic, and
//! hold no more than one incomplete frame and one message under way. The reader may reject a
//! frame as soon as its header shows the violation, where tungstenite first waits for its
//! payload: when the stream ends inside such a frame, the reader's code must be the one
//! tungstenite gives once the frame is complete.
//!
//! Bounded in time: a fixed number of cases (`PROPTEST_CASES` raises it for a longer run)
//! and a fixed seed per run of proptest's own choosing, shrunk and printed on failure.

use std::io::{self, Read, Write};

use bytes::Bytes;
use gorge_notification::frames::{Inbound, Reader};
use phorge_wire::aphlict::{parse_admin_message, AdminMessage};
use proptest::prelude::*;
use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error, Message};

/// A fixed number of cases, and no regression files written into the source tree (a failure
/// prints its shrunk input; pin it as a unit test in `frames.rs`).
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|cases| cases.parse().ok())
            .unwrap_or(2_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The frame and message limit both parsers are given (small, so limits are hit often).
const MAX: usize = 64;

/// What a parser made of a stream: its messages, then how it stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    messages: Vec<Event>,
    end: End,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Text(String),
    Binary,
    Ping(Vec<u8>),
    Pong,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// The stream ended inside a frame (or between frames): more bytes are needed.
    NeedMore,
    /// The client closed with this payload (code and reason, or nothing).
    Closed(Vec<u8>),
    /// The server closes with this code.
    Violation(u16),
}

/// A stream that yields `input` then reports "would block" (more may come), and discards
/// what the server writes (pongs, close replies).
struct Feed(io::Cursor<Vec<u8>>);

impl Read for Feed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.0.read(buf)? {
            0 => Err(io::ErrorKind::WouldBlock.into()),
            n => Ok(n),
        }
    }
}

impl Write for Feed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// tungstenite's reading of `stream`.
fn oracle(stream: &[u8]) -> Outcome {
    let config = WebSocketConfig::default()
        .max_frame_size(Some(MAX))
        .max_message_size(Some(MAX));
    let mut ws = WebSocket::from_raw_socket(
        Feed(io::Cursor::new(stream.to_vec())),
        Role::Server,
        Some(config),
    );
    let mut messages = Vec::new();
    loop {
        let end = match ws.read() {
            Ok(Message::Text(text)) => {
                messages.push(Event::Text(text.as_str().to_string()));
                continue;
            }
            Ok(Message::Binary(_)) => {
                messages.push(Event::Binary);
                continue;
            }
            Ok(Message::Ping(payload)) => {
                messages.push(Event::Ping(payload.to_vec()));
                continue;
            }
            Ok(Message::Pong(_)) => {
                messages.push(Event::Pong);
                continue;
            }
            Ok(Message::Frame(_)) => unreachable!("read never returns raw frames"),
            Ok(Message::Close(None)) => End::Closed(Vec::new()),
            // An invalid code is answered with 1002 (tungstenite replaces the frame).
            Ok(Message::Close(Some(frame)))
                if frame.code == CloseCode::Protocol
                    && frame.reason.as_str() == "Protocol violation" =>
            {
                End::Violation(1002)
            }
            Ok(Message::Close(Some(frame))) => {
                let mut payload = u16::from(frame.code).to_be_bytes().to_vec();
                payload.extend_from_slice(frame.reason.as_bytes());
                End::Closed(payload)
            }
            Err(Error::Io(err)) if err.kind() == io::ErrorKind::WouldBlock => End::NeedMore,
            Err(Error::Capacity(CapacityError::MessageTooLong { .. })) => End::Violation(1009),
            Err(Error::Utf8(_)) => End::Violation(1007),
            Err(Error::Protocol(ProtocolError::ResetWithoutClosingHandshake)) => End::NeedMore,
            Err(Error::Protocol(_)) => End::Violation(1002),
            Err(other) => panic!("tungstenite ended with {other:?}"),
        };
        return Outcome { messages, end };
    }
}

/// The reader's reading of `stream`, given to it in pieces ending at `cuts`; also checks
/// that it never holds more than one incomplete frame and one message under way.
fn ours(stream: &[u8], cuts: &[usize]) -> Outcome {
    let mut reader = Reader::new(Bytes::new(), MAX);
    let mut messages = Vec::new();
    let mut start = 0;
    let ends = cuts.iter().copied().chain([stream.len()]);
    for end in ends {
        let end = end.clamp(start, stream.len());
        reader.extend(&stream[start..end]);
        start = end;
        loop {
            match reader.next_frame() {
                Ok(None) => break,
                Ok(Some(Inbound::Text(text))) => messages.push(Event::Text(text)),
                Ok(Some(Inbound::Binary)) => messages.push(Event::Binary),
                Ok(Some(Inbound::Ping(payload))) => messages.push(Event::Ping(payload.to_vec())),
                Ok(Some(Inbound::Pong)) => messages.push(Event::Pong),
                Ok(Some(Inbound::Close(payload))) => {
                    return Outcome {
                        messages,
                        end: End::Closed(payload.to_vec()),
                    }
                }
                Err(violation) => {
                    return Outcome {
                        messages,
                        end: End::Violation(violation.code()),
                    }
                }
            }
        }
        // Between reads: at most one incomplete frame (14 header bytes and the limit) and
        // one fragmented message (the limit).
        assert!(
            reader.held_bytes() <= 14 + 2 * MAX,
            "holds {} bytes",
            reader.held_bytes()
        );
    }
    Outcome {
        messages,
        end: End::NeedMore,
    }
}

/// Checks the reader against the oracle on `stream` split at `cuts`.
fn agree(stream: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
    let expected = oracle(stream);
    let got = ours(stream, cuts);
    if got == expected {
        return Ok(());
    }
    // Rejected early, inside a frame whose end has not arrived: tungstenite must reject the
    // completed frame the same way, after the same messages.
    if expected.end == End::NeedMore && matches!(got.end, End::Violation(_)) {
        let mut padded = stream.to_vec();
        padded.extend(std::iter::repeat_n(0u8, MAX + 14));
        let completed = oracle(&padded);
        prop_assert_eq!(&got.messages, &expected.messages);
        prop_assert_eq!(&got, &completed, "stream {:02x?}", stream);
        return Ok(());
    }
    prop_assert_eq!(got, expected, "stream {:02x?}", stream);
    Ok(())
}

/// One client frame: `first` byte (FIN, RSV, opcode), masked or not, with `payload`.
fn frame(first: u8, masked: bool, mask: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(bit | n as u8),
        n if n <= 0xffff => {
            out.push(bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if masked {
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

/// Payloads: text (sometimes with invalid UTF-8 or split characters), close payloads with
/// any code, binary, up to a little over the limit.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => "[a-z{}\":é€😀]{0,24}".prop_map(String::into_bytes),
        2 => (any::<u16>(), "[a-zé]{0,8}").prop_map(|(code, reason)| {
            let mut p = code.to_be_bytes().to_vec();
            p.extend(reason.into_bytes());
            p
        }),
        2 => (prop_oneof![Just(1000u16), Just(1001), Just(1004), Just(1005), Just(1012),
                          Just(1014), Just(2999), Just(3000), Just(4999), Just(5000)],
              proptest::collection::vec(any::<u8>(), 0..4))
            .prop_map(|(code, reason)| {
                let mut p = code.to_be_bytes().to_vec();
                p.extend(reason);
                p
            }),
        2 => proptest::collection::vec(any::<u8>(), 0..(MAX + 8)),
        1 => proptest::collection::vec(any::<u8>(), 120..130),
    ]
}

/// Mostly well-formed client frames (final or not, any opcode, sometimes a reserved bit or
/// no mask), which reach deep states: fragments, control frames between them, limits.
fn frames() -> impl Strategy<Value = Vec<u8>> {
    let one = (
        prop_oneof![
            Just(0x0u8),
            Just(0x1),
            Just(0x2),
            Just(0x3),
            Just(0x8),
            Just(0x9),
            Just(0xa),
            Just(0xb)
        ],
        any::<bool>(),
        prop_oneof![8 => Just(0u8), 1 => Just(0x40), 1 => Just(0x20), 1 => Just(0x10)],
        prop_oneof![15 => Just(true), 1 => Just(false)],
        any::<[u8; 4]>(),
        payload(),
    )
        .prop_map(|(opcode, fin, rsv, masked, mask, payload)| {
            let first = opcode | rsv | if fin { 0x80 } else { 0 };
            frame(first, masked, mask, &payload)
        });
    proptest::collection::vec(one, 0..6).prop_map(|frames| frames.concat())
}

/// A stream with some bytes flipped, cut short, or spliced with random bytes.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        frames(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        any::<prop::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(|(mut stream, flips, cut, truncate)| {
            if !stream.is_empty() {
                for (at, xor) in flips {
                    let i = at.index(stream.len());
                    stream[i] ^= xor;
                }
                if truncate {
                    stream.truncate(cut.index(stream.len() + 1));
                }
            }
            stream
        })
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(0usize..600, 0..8).prop_map(|mut cuts| {
        cuts.sort_unstable();
        cuts
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn well_formed_streams_read_as_tungstenite_reads_them(stream in frames(), cuts in cuts()) {
        agree(&stream, &cuts)?;
    }

    #[test]
    fn mutated_streams_read_as_tungstenite_reads_them(stream in mutated(), cuts in cuts()) {
        agree(&stream, &cuts)?;
    }

    #[test]
    fn random_bytes_read_as_tungstenite_reads_them(
        stream in proptest::collection::vec(any::<u8>(), 0..200),
        cuts in cuts(),
    ) {
        agree(&stream, &cuts)?;
    }
}

/// Admin bodies: JSON objects with `subscribers`, `touched` and other keys, as PHP sends them,
/// then mutated.
fn admin_body() -> impl Strategy<Value = Vec<u8>> {
    let phids = proptest::collection::vec("PHID-[A-Z]{4}-[a-z0-9]{0,6}", 0..4);
    let value = prop_oneof![
        Just(serde_json::json!(null)),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        "[a-z\"\\\\é]{0,6}".prop_map(|s| serde_json::json!(s)),
        Just(serde_json::json!(12345678901234567890123_u128.to_string())),
    ];
    (
        phids.clone(),
        phids,
        proptest::collection::vec(("[a-z]{1,5}", value), 0..4),
    )
        .prop_map(|(subscribers, touched, extra)| {
            let mut object = serde_json::Map::new();
            for (key, value) in extra {
                object.insert(key, value);
            }
            object.insert("subscribers".into(), serde_json::json!(subscribers));
            object.insert("touched".into(), serde_json::json!(touched));
            serde_json::to_vec(&object).unwrap()
        })
}

proptest! {
    #![proptest_config(config())]

    /// Never panics; an accepted body is the same object with this server's fingerprint
    /// appended to `touched`, its `subscribers` the string entries PHP sent, and stamping
    /// it again is recognised as already seen.
    #[test]
    fn admin_bodies_are_stamped_or_refused_never_mangled(
        body in admin_body(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
    ) {
        let mut body = body;
        for (at, xor) in flips {
            let i = at.index(body.len());
            body[i] ^= xor;
        }
        let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&body);
        match parse_admin_message(&body, "fp-self") {
            Err(_) => prop_assert!(!matches!(parsed, Ok(serde_json::Value::Object(_)))),
            Ok(AdminMessage::AlreadySeen) => {
                let touched = parsed.unwrap()["touched"].clone();
                prop_assert!(touched.as_array().unwrap().iter().any(|t| t == "fp-self"));
            }
            Ok(AdminMessage::Accepted(stamped)) => {
                let Ok(serde_json::Value::Object(sent)) = parsed else {
                    return Err(TestCaseError::fail("accepted a body that is not an object"));
                };
                let strings = |key: &str| -> Vec<String> {
                    sent.get(key)
                        .and_then(|v| v.as_array())
                        .map(|items| items.iter().filter_map(|i| i.as_str().map(str::to_owned)).collect())
                        .unwrap_or_default()
                };
                prop_assert_eq!(&stamped.subscribers, &strings("subscribers"));
                let mut touched = strings("touched");
                touched.push("fp-self".into());
                prop_assert_eq!(&stamped.touched, &touched);
                let serde_json::Value::Object(out) =
                    serde_json::from_slice(&stamped.body).unwrap() else { unreachable!() };
                for (key, value) in &sent {
                    if key != "touched" {
                        prop_assert_eq!(out.get(key), Some(value), "{}", key);
                    }
                }
                prop_assert_eq!(out.len(), sent.len() + usize::from(!sent.contains_key("touched")));
                prop_assert_eq!(
                    parse_admin_message(&stamped.body, "fp-self").unwrap(),
                    AdminMessage::AlreadySeen
                );
            }
        }
    }
}
