//! Taking a message in: parse, stamp with our fingerprint, count, and hand it to the fan-out.
//! The admin port ([`crate::admin`]) takes PHP's and peers' POSTs through [`accept`] and then
//! relays what entered the cluster here; anything else that brings messages from the other
//! servers (a broker's reader) calls [`ingest_relayed`], which stores and delivers exactly as
//! a relayed POST would and never relays.
//!
//! A message is taken in once per `uniqueID` ([`crate::recent_ids`]): in a cluster the same message
//! can come twice — by relay and in a peer's history at warm-up, or again when a relay whose
//! answer was lost is retried — and a browser must never get it twice on one connection.
//! PHP gives every message a fresh `uniqueID`, so this never refuses one of PHP's own POSTs;
//! a message without one (tools, tests) is taken in every time, as Aphlict does.

use std::hash::{Hash, Hasher};
use std::time::Instant;

use bytes::Bytes;
use phorge_wire::aphlict::{self, AdminMessage, AdminMessageError};

use crate::events;
use crate::fanout::Job;
use crate::frames;
use crate::state::ServerState;
use gorge_service::emit;

/// A message that was taken in.
#[derive(Debug)]
pub enum Ingested {
    /// Stored and handed to the fan-out.
    Accepted {
        /// The stamped message (the frame's payload), as peers are sent it.
        payload: Bytes,
        /// `touched` after our fingerprint was appended.
        touched: Vec<String>,
    },
    /// It already carried our fingerprint: counted in `messages.in`, nothing else.
    AlreadySeen,
}

/// Why a message was not taken in.
#[derive(Debug)]
pub enum IngestError {
    /// Not JSON, or not an object.
    Message(AdminMessageError),
    /// The instance name is over the limit.
    InstanceName,
    /// The hand-off to the fan-out is full.
    FanoutFull,
}

/// Takes one message in (`accepted_at`: when its body had been read).
pub fn accept(
    state: &ServerState,
    instance: String,
    body: &[u8],
    accepted_at: Instant,
) -> Result<Ingested, IngestError> {
    accept_aged(state, instance, body, accepted_at, 0)
}

/// [`accept`] for a message accepted `age_ms` ago elsewhere (see [`Fanout::submit_aged`]).
///
/// [`Fanout::submit_aged`]: crate::fanout::Fanout::submit_aged
fn accept_aged(
    state: &ServerState,
    instance: String,
    body: &[u8],
    accepted_at: Instant,
    age_ms: u64,
) -> Result<Ingested, IngestError> {
    let parsed = aphlict::parse_admin_message(body, &state.fingerprint);
    let id = matches!(parsed, Ok(AdminMessage::Accepted(_)))
        .then(|| unique_id(body))
        .flatten();
    let seen_before = id.is_some_and(|id| !state.recent_ids.first_time(id, state.hub.now_ms()));
    let message = match parsed {
        Ok(AdminMessage::Accepted(_)) if seen_before => {
            state.hub.count_message_in();
            state.metrics.messages_duplicate.inc();
            return Ok(Ingested::AlreadySeen);
        }
        Ok(AdminMessage::Accepted(message)) => message,
        Ok(AdminMessage::AlreadySeen) => {
            // Not delivered again, but Aphlict counts every POST it parsed.
            state.hub.count_message_in();
            state.metrics.messages_duplicate.inc();
            return Ok(Ingested::AlreadySeen);
        }
        Err(err) => return Err(IngestError::Message(err)),
    };
    if !state.hub.instance_name_ok(&instance) {
        id.inspect(|id| state.recent_ids.forget(*id));
        return Err(IngestError::InstanceName);
    }
    // Encoded once: every recipient, the history and the peers share these bytes.
    let frame = frames::text(&message.body);
    drop(message.body);
    let subscribers = message.subscribers.len();
    let job = Job {
        instance,
        subscribers: message.subscribers,
        frame: frame.clone(),
        accepted_at,
        at_ms: 0,
    };
    let instance = job.instance.clone();
    if state.fanout.submit_aged(job, age_ms).is_err() {
        // Not taken in: a retry of it must be.
        id.inspect(|id| state.recent_ids.forget(*id));
        return Err(IngestError::FanoutFull);
    }
    state.hub.count_message_in();
    state.metrics.messages_in.inc();
    emit!(state.log, events::NOTIFY_MESSAGE_ACCEPTED;
        "instance" => &instance, "subscribers" => subscribers, "bytes" => frame.len());
    Ok(Ingested::Accepted {
        payload: frames::payload(&frame),
        touched: message.touched,
    })
}

/// Why a message from elsewhere was not taken in.
#[derive(Debug, PartialEq, Eq)]
pub enum NotTaken {
    /// It carries our fingerprint already (counted in `messages.in`, as a relayed POST is).
    AlreadySeen,
    /// Not JSON, or not an object.
    Malformed,
    /// The instance name is over the limit.
    InstanceName,
}

/// Takes in a message another server accepted `age_ms` ago (its `touched` names that
/// server), as a relayed admin POST is taken in: stored, delivered, counted in
/// `messages.in`, never relayed on. Broker mode's reader uses it for live entries (`age_ms`
/// 0) and for the history it loads at start (their age in the stream). Waits while the
/// fan-out's hand-off is full rather than drop it: nothing waits on this but the reader,
/// which is where the back-pressure belongs.
pub async fn ingest_relayed(
    state: &ServerState,
    instance: &str,
    body: &[u8],
    age_ms: u64,
) -> Result<(), NotTaken> {
    let accepted_at = Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match accept_aged(state, instance.to_owned(), body, accepted_at, age_ms) {
            Ok(Ingested::Accepted { .. }) => return Ok(()),
            Ok(Ingested::AlreadySeen) => return Err(NotTaken::AlreadySeen),
            Err(IngestError::Message(_)) => return Err(NotTaken::Malformed),
            Err(IngestError::InstanceName) => return Err(NotTaken::InstanceName),
            Err(IngestError::FanoutFull) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(100));
            }
        }
    }
}

/// The `uniqueID` of a message, hashed; `None` when it has none (or is not an object).
pub fn unique_id(payload: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(rename = "uniqueID", borrow)]
        unique_id: Option<std::borrow::Cow<'a, str>>,
    }
    let id = serde_json::from_slice::<Id<'_>>(payload).ok()?.unique_id?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut hasher);
    Some(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_ids_are_read_from_the_message() {
        assert_eq!(
            unique_id(br#"{"uniqueID":"a"}"#),
            unique_id(br#"{"x":1,"uniqueID":"a"}"#)
        );
        assert_ne!(
            unique_id(br#"{"uniqueID":"a"}"#),
            unique_id(br#"{"uniqueID":"b"}"#)
        );
        assert_eq!(unique_id(br#"{"key":1}"#), None);
        assert_eq!(unique_id(b"[1]"), None);
    }
}
