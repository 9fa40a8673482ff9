//! Taking a message in: parse, stamp with our fingerprint, count, and hand it to the fan-out.
//! The admin port ([`crate::admin`]) takes PHP's and peers' POSTs through [`accept`] and then
//! relays what entered the cluster here; anything else that brings messages from the other
//! servers (a broker's reader) calls [`ingest_relayed`], which stores and delivers exactly as
//! a relayed POST would and never relays.

use std::time::Instant;

use bytes::Bytes;
use phorge_wire::aphlict::{self, AdminMessage, AdminMessageError};

use crate::events;
use crate::fanout::Job;
use crate::state::ServerState;
use crate::wire;
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
    app: &ServerState,
    instance: String,
    body: &[u8],
    accepted_at: Instant,
) -> Result<Ingested, IngestError> {
    let message = match aphlict::parse_admin_message(body, &app.fingerprint) {
        Ok(AdminMessage::Accepted(message)) => message,
        Ok(AdminMessage::AlreadySeen) => {
            // Not delivered again, but Aphlict counts every POST it parsed.
            app.hub.count_message_in();
            app.metrics.messages_duplicate.inc();
            return Ok(Ingested::AlreadySeen);
        }
        Err(err) => return Err(IngestError::Message(err)),
    };
    if !app.hub.instance_name_ok(&instance) {
        return Err(IngestError::InstanceName);
    }
    // Encoded once: every recipient, the history and the peers share these bytes.
    let frame = wire::text(&message.body);
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
    if app.fanout.submit(job).is_err() {
        return Err(IngestError::FanoutFull);
    }
    app.hub.count_message_in();
    app.metrics.messages_in.inc();
    emit!(app.log, events::NOTIFY_MESSAGE_ACCEPTED;
        "instance" => &instance, "subscribers" => subscribers, "bytes" => frame.len());
    Ok(Ingested::Accepted {
        payload: wire::payload(&frame),
        touched: message.touched,
    })
}

/// Takes in a message another server accepted (its `touched` names that server), as a relayed
/// admin POST is taken in: stored, delivered, counted in `messages.in`, never relayed on.
pub fn ingest_relayed(
    app: &ServerState,
    instance: String,
    body: &[u8],
) -> Result<Ingested, IngestError> {
    accept(app, instance, body, Instant::now())
}
