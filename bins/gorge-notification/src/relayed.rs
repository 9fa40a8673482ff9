//! Taking in a message another server accepted, exactly as if that server had relayed it to
//! our admin port: stamped with our fingerprint, stored in history, delivered to our sockets
//! and counted in `messages.in`, never passed on. Broker mode's reader uses it for live
//! entries (`age_ms` 0) and for the history it loads at start (their age in the stream).

use std::time::Instant;

use phorge_wire::aphlict::{self, AdminMessage};

use crate::fanout::Job;
use crate::state::ServerState;
use crate::wire;

/// Why a message from elsewhere was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum NotTaken {
    /// It carries our fingerprint already.
    AlreadySeen,
    /// Not a JSON object.
    Malformed,
    /// The instance name is over the limit.
    InstanceName,
}

/// Hands `message` (a stamped admin message) to the fan-out as accepted `age_ms` ago. Waits
/// while the fan-out's hand-off is full rather than drop it: nothing waits on this but the
/// reader, which is where the back-pressure belongs.
pub async fn ingest_relayed(
    app: &ServerState,
    instance: &str,
    message: &[u8],
    age_ms: u64,
) -> Result<(), NotTaken> {
    let accepted_at = Instant::now();
    let stamped = match aphlict::parse_admin_message(message, &app.fingerprint) {
        Ok(AdminMessage::Accepted(stamped)) => stamped,
        Ok(AdminMessage::AlreadySeen) => return Err(NotTaken::AlreadySeen),
        Err(_) => return Err(NotTaken::Malformed),
    };
    if !app.hub.instance_name_ok(instance) {
        return Err(NotTaken::InstanceName);
    }
    let job = Job {
        instance: instance.to_owned(),
        subscribers: stamped.subscribers,
        frame: wire::text(&stamped.body),
        accepted_at,
        at_ms: 0,
    };
    let mut pause = std::time::Duration::from_millis(1);
    while app.fanout.submit_aged(job.clone(), age_ms).is_err() {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
    }
    app.hub.count_message_in();
    app.metrics.messages_in.inc();
    Ok(())
}
