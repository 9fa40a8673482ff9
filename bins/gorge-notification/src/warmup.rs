//! Warm-up: a starting server fills its history from a ready peer before it is ready itself
//! (docs/notification.md, "Restarts"), so a browser that reconnects here and replays gets
//! what it missed while it was connected elsewhere or while this server was down.
//!
//! The peer side is `GET /history/?age=<ms>` on the admin port ([`export`]): every instance's
//! retained messages, oldest first, one JSON line each (`{"instance":…,"age_ms":…,
//! "message":{…}}`), or 503 while that server is not warm itself (so nobody warms from an
//! empty history). The starting side ([`run`]) asks its peers in turn and takes the first
//! 200; when every peer is down, not warm yet (the whole cluster is starting) or too slow,
//! it starts with what it has. Either way it then opens the history gate: `/readyz` turns
//! 200 and waiting `replay`s run.
//!
//! A message can arrive both ways: relayed here during the warm-up and also in the peer's
//! history. It is kept once, by its identity ([`identity`]): PHP's `uniqueID` (32 random
//! characters `PhabricatorNotificationClient` adds to every message, which Aphlict peers pass
//! on unchanged and browsers themselves de-duplicate by), or, for a message without one, the
//! message without its `touched` list (which differs by the route it took).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gorge_hub::{Hub, Warmed};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::events;
use crate::frames;
use crate::peers::PeerRelay;
use crate::state::ServerState;
use gorge_service::emit;

/// The admin path of the export.
pub const PATH: &str = "/history/";

/// Exports built at once, at most; more are answered 503 (`admin_rejected{reason=
/// "history_busy"}`): each copies up to the whole history.
pub const MAX_EXPORTS: usize = 2;

/// One exported line.
#[derive(Serialize)]
struct LineOut<'a> {
    instance: &'a str,
    age_ms: u64,
    message: &'a RawValue,
}

#[derive(Deserialize)]
struct LineIn<'a> {
    instance: String,
    age_ms: u64,
    #[serde(borrow)]
    message: &'a RawValue,
}

/// The body of `GET /history/?age=<ms>`: retained messages of the last `age_ms`, all
/// instances, oldest first, one JSON line each. Bounded by the history limits.
pub fn export(hub: &Hub, age_ms: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for retained in hub.retained(age_ms) {
        let payload = frames::payload(&retained.frame);
        // History only holds messages this server serialized itself.
        let Ok(text) = std::str::from_utf8(&payload) else {
            continue;
        };
        let Ok(message) = serde_json::from_str::<&RawValue>(text) else {
            continue;
        };
        let line = LineOut {
            instance: &retained.instance,
            age_ms: retained.age_ms,
            message,
        };
        if serde_json::to_writer(&mut out, &line).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// The identity a message is kept once by: `uniqueID` when it has one, else the message
/// without `touched`.
pub fn identity(payload: &[u8]) -> u64 {
    #[derive(Deserialize)]
    struct Id {
        #[serde(rename = "uniqueID")]
        unique_id: Option<Value>,
    }
    let mut hasher = DefaultHasher::new();
    match serde_json::from_slice::<Id>(payload) {
        Ok(Id {
            unique_id: Some(Value::String(id)),
        }) => ("uniqueID", id).hash(&mut hasher),
        _ => match serde_json::from_slice::<Value>(payload) {
            Ok(Value::Object(mut object)) => {
                object.remove("touched");
                ("message", Value::Object(object).to_string()).hash(&mut hasher);
            }
            _ => ("bytes", payload).hash(&mut hasher),
        },
    }
    hasher.finish()
}

/// Parses an export body into entries for the hub; lines that do not parse are skipped
/// and counted.
fn parse(body: &[u8]) -> (Vec<Warmed>, usize) {
    let mut entries = Vec::new();
    let mut bad = 0;
    for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(line) = serde_json::from_slice::<LineIn<'_>>(line) else {
            bad += 1;
            continue;
        };
        let subscribers = match serde_json::from_str::<Value>(line.message.get()) {
            Ok(Value::Object(object)) => match object.get("subscribers") {
                Some(Value::Array(items)) => items
                    .iter()
                    .filter_map(|item| item.as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            },
            _ => {
                bad += 1;
                continue;
            }
        };
        entries.push(Warmed {
            instance: line.instance,
            subscribers,
            frame: frames::text(line.message.get().as_bytes()),
            age_ms: line.age_ms,
        });
    }
    (entries, bad)
}

/// How one peer answered.
enum Answer {
    Warm(Vec<u8>),
    /// Not warm itself, down, slow or wrong: the reason, for the log.
    Unusable(String),
}

/// Asks one peer (blocking: ureq).
fn ask(agent: &ureq::Agent, base_url: &str, age_ms: u64, limit: u64) -> Answer {
    let url = format!("{}{}?age={age_ms}", base_url.trim_end_matches('/'), PATH);
    let mut response = match agent.get(&url).call() {
        Ok(response) => response,
        Err(err) => return Answer::Unusable(err.to_string()),
    };
    let status = response.status().as_u16();
    if status != 200 {
        return Answer::Unusable(format!("HTTP status {status}"));
    }
    match response.body_mut().with_config().limit(limit).read_to_vec() {
        Ok(body) => Answer::Warm(body),
        Err(err) => Answer::Unusable(format!("reading history: {err}")),
    }
}

/// Warms history from the first ready peer of `relay`, then opens the history gate.
/// `deadline` bounds the whole warm-up (a server never stays unready because a peer hangs).
pub async fn run(state: Arc<ServerState>, relay: Arc<PeerRelay>, deadline: Duration) {
    let started = Instant::now();
    let limits = state.hub.limits();
    let age_ms = limits.history_age_ms;
    // Room for every retained message and its line's framing.
    let limit = (limits.history_bytes as u64).saturating_mul(2) + (1 << 20);
    // DNS peers are known only after the first lookup.
    let mut peers = relay.base_urls();
    while peers.is_empty() && relay.uses_dns() && started.elapsed() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        peers = relay.base_urls();
    }
    let agent = relay.agent();
    let mut reasons = Vec::new();
    for base_url in peers {
        let Some(left) = deadline.checked_sub(started.elapsed()) else {
            reasons.push(format!("{base_url}: warm-up deadline passed"));
            break;
        };
        let asked = {
            let agent = agent.clone();
            let url = base_url.clone();
            tokio::task::spawn_blocking(move || ask(&agent, &url, age_ms, limit))
        };
        let body = match tokio::time::timeout(left, asked).await {
            Ok(Ok(Answer::Warm(body))) => body,
            Ok(Ok(Answer::Unusable(reason))) => {
                reasons.push(format!("{base_url}: {reason}"));
                continue;
            }
            Ok(Err(_)) | Err(_) => {
                reasons.push(format!("{base_url}: no answer in time"));
                continue;
            }
        };
        let (mut entries, bad) = parse(&body);
        // Settled first, so a relayed message already taken in is in history for the
        // identity check; one taken in from now on is caught by its `uniqueID`.
        let hub = state.fanout.settled().await;
        let now_ms = hub.now_ms();
        let before = entries.len();
        entries.retain(|warmed| {
            crate::ingest::unique_id(&frames::payload(&warmed.frame))
                .is_none_or(|id| state.recent_ids.first_time(id, now_ms))
        });
        let already_here = before - entries.len();
        let mut counts = hub.warm_history(entries, |frame| identity(&frames::payload(frame)));
        counts.duplicates += already_here;
        state
            .metrics
            .history_warmed
            .with(["kept"])
            .inc_by(counts.kept as u64);
        state
            .metrics
            .history_warmed
            .with(["duplicate"])
            .inc_by(counts.duplicates as u64);
        state
            .metrics
            .history_warmed
            .with(["invalid"])
            .inc_by((counts.refused + bad) as u64);
        emit!(state.log, events::NOTIFY_HISTORY_WARMED;
            "peer" => &base_url, "entries" => counts.kept, "duplicates" => counts.duplicates,
            "invalid" => counts.refused + bad,
            "elapsed_ms" => started.elapsed().as_millis() as u64);
        open(&state);
        return;
    }
    emit!(state.log, events::NOTIFY_HISTORY_COLD;
        "reasons" => reasons.join("; "),
        "elapsed_ms" => started.elapsed().as_millis() as u64);
    open(&state);
}

fn open(state: &ServerState) {
    state.history_gate.open();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_the_unique_id_or_the_message_without_touched() {
        let a = br#"{"key":1,"uniqueID":"abc","touched":["A"]}"#;
        let b = br#"{"key":1,"uniqueID":"abc","touched":["A","B"]}"#;
        let other = br#"{"key":1,"uniqueID":"abd","touched":["A"]}"#;
        assert_eq!(identity(a), identity(b));
        assert_ne!(identity(a), identity(other));
        let plain_a = br#"{"key":1,"subscribers":["P"],"touched":["A"]}"#;
        let plain_b = br#"{"key":1,"subscribers":["P"],"touched":["A","C"]}"#;
        let plain_other = br#"{"key":2,"subscribers":["P"],"touched":["A"]}"#;
        assert_eq!(identity(plain_a), identity(plain_b));
        assert_ne!(identity(plain_a), identity(plain_other));
    }

    #[test]
    fn export_lines_parse_back() {
        let body = br#"{"instance":"a b","age_ms":12,"message":{"key":1,"big":12345678901234567890,"subscribers":["P","Q"]}}
not json
{"instance":"x","age_ms":0,"message":[1]}
"#;
        let (entries, bad) = parse(body);
        assert_eq!(bad, 2);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].instance, "a b");
        assert_eq!(entries[0].age_ms, 12);
        assert_eq!(entries[0].subscribers, ["P", "Q"]);
        assert_eq!(
            entries[0].frame,
            frames::text(br#"{"key":1,"big":12345678901234567890,"subscribers":["P","Q"]}"#)
        );
    }
}
