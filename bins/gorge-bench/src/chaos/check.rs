//! The checker: reads a run's recorded [`Log`] and says whether nothing was lost.
//!
//! Messages: every message a node accepted reaches every browser that was subscribed to one
//! of its PHIDs when it was posted (a connection whose `subscribe` was confirmed before the
//! POST began and still open then), on that connection or by a later replay (a repeat has
//! the same `uniqueID`). Excused, and listed: a message whose node (or, in broker mode,
//! Redis) was SIGKILLed while it was still in flight — within 2 s of its POST, or later
//! while the way on (Redis, the browser's node) had been away since the POST, or back for
//! less than the 6 s the services take to reconnect (for a Redis kill, also away from a
//! fault that began while the message was in flight: the browser's node killed before it
//! read the entry); one whose node was SIGTERMed while the
//! way on stayed away for the whole drain window (the drain gives such messages up and
//! logs it); and one older than the browser's
//! next replay reached back (`JX.Aphlict` asks for at most 60 s). No connection carries one
//! message twice, unless PHP's fail-over posted it to two nodes.
//!
//! Rows: every row ends `sent` or `failed` as Phorge's rules say: `sent` when the last
//! answer the receiver gave it was 2xx, `failed` only for a `retry=never` row whose last
//! answer was not (a 500 recorded as `http`/`500`); never left `queued`. Each row reaches
//! the receiver with a 2xx at most once, except a repeat after a SIGKILL of a webhook
//! process that came between the two (listed with that kill).

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use super::history::{Answer, AppliedFault, Log, Post, Row};
use super::schedule::{Kind, Target};
use super::sut::NODE_DRAIN_SECONDS;
use crate::drill::{check, Check};

/// A message still in flight this long after its POST answered is assumed to have reached
/// the other nodes (a relay or a stream read takes milliseconds; a SIGKILL within this
/// window may take it down with the node).
const IN_FLIGHT_US: u64 = 2_000_000;

/// A webhook SIGKILL this long before the receiver recorded a request can still have come
/// after the process sent it (written to the socket, read and recorded by the receiver
/// later): such a kill is "between" that delivery and its repeat (seed 225: the kill and
/// the 200 both at 1623.787 s).
const SENT_BEFORE_RECORDED_US: u64 = 250_000;

/// How many failures are printed in full.
const PRINTED_FAILURES: usize = 20;

/// A row as read back from the database at the end.
#[derive(Debug, Clone)]
pub struct FinalRow {
    pub status: String,
    pub error_type: Option<String>,
    pub error_code: Option<String>,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub checks: Vec<Check>,
    /// Each broken promise, in full (the first [`PRINTED_FAILURES`]).
    pub failures: Vec<String>,
    pub facts: BTreeMap<&'static str, Value>,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.holds)
    }
}

/// The context around one failure: the seed, the faults within 10 s of `at_us`.
fn around(log: &Log, seed: u64, at_us: u64) -> String {
    let near: Vec<String> = log
        .faults
        .iter()
        .filter(|f| {
            let end = f.end_us.unwrap_or(u64::MAX);
            f.start_us <= at_us.saturating_add(10_000_000)
                && end.saturating_add(10_000_000) >= at_us
        })
        .map(describe_fault)
        .collect();
    format!(
        "seed {seed}; faults around t={:.3}s: [{}]",
        at_us as f64 / 1e6,
        near.join("; ")
    )
}

fn describe_fault(f: &AppliedFault) -> String {
    format!(
        "#{} {} {} {:.3}s..{}",
        f.id,
        f.kind.label(),
        f.target,
        f.start_us as f64 / 1e6,
        f.end_us.map_or("(not ended)".to_string(), |e| format!(
            "{:.3}s",
            e as f64 / 1e6
        ))
    )
}

/// How long the way on stays unusable after a fault on it ends: the services reconnect to
/// Redis with a jittered backoff of up to 5 s (and retry a peer's relays at their pace).
const RECOVERY_US: u64 = 6_000_000;

/// Whether the way a message takes was blocked during all of `[from, to]`: every instant
/// under a fault of one of `kinds` on one of `targets`, or within [`RECOVERY_US`] after it
/// (intervals of consecutive or overlapping faults joined).
fn blocked(log: &Log, targets: &[(Target, &[Kind])], from: u64, to: u64) -> bool {
    let mut spans: Vec<(u64, u64)> = log
        .faults
        .iter()
        .filter(|f| {
            targets
                .iter()
                .any(|(t, kinds)| f.target == *t && kinds.contains(&f.kind))
        })
        .map(|f| {
            (
                f.start_us,
                f.end_us.map_or(u64::MAX, |e| e.saturating_add(RECOVERY_US)),
            )
        })
        .collect();
    spans.sort_unstable();
    let mut covered_to = from;
    for (start, end) in spans {
        if start <= covered_to && end > covered_to {
            covered_to = end;
        }
    }
    covered_to >= to
}

const PROCESS_DOWN: [Kind; 3] = [Kind::Kill, Kind::Stop, Kind::Term];
const REDIS_DOWN: [Kind; 2] = [Kind::RedisPause, Kind::RedisKill];

/// Why a lost message is excused: which fault took it, and whether the fault came while the
/// message was still in flight (within [`IN_FLIGHT_US`] of its POST) or later, with the way
/// on blocked all along since the POST. Counted apart, so a run shows how much each excuse
/// covers and how late the in-flight ones came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cause {
    /// The entry node SIGKILLed within [`IN_FLIGHT_US`] of the POST.
    NodeKilledInFlight,
    /// The entry node SIGKILLed later, the way on blocked from the POST to the kill.
    NodeKilledWhileBlocked,
    /// The entry node SIGTERMed, the way on blocked through its drain window.
    NodeDrainedWhileBlocked,
    /// Redis killed within [`IN_FLIGHT_US`] of the POST.
    RedisKilledInFlight,
    /// Redis killed later, Redis or the browser's node away from the POST to the kill.
    RedisKilledWhileBlocked,
    /// Redis killed later, Redis or the browser's node away from within [`IN_FLIGHT_US`] of
    /// the POST (the entry not yet read by the browser's node) to the kill.
    RedisKilledAfterWayBlockedInFlight,
}

impl Cause {
    fn label(self) -> &'static str {
        match self {
            Cause::NodeKilledInFlight => "entry node SIGKILLed in flight",
            Cause::NodeKilledWhileBlocked => "entry node SIGKILLed, way on blocked",
            Cause::NodeDrainedWhileBlocked => "entry node SIGTERMed, way on blocked",
            Cause::RedisKilledInFlight => "Redis killed in flight",
            Cause::RedisKilledWhileBlocked => "Redis killed, way on blocked",
            Cause::RedisKilledAfterWayBlockedInFlight => {
                "Redis killed, way on blocked from in flight"
            }
        }
    }
}

/// The SIGKILL (of the entry node, or of Redis in broker mode), or the SIGTERM of the entry
/// node whose drain could not pass the message on, that excuses `post`'s loss for a browser
/// on `browser_node`, if any, why, and for an in-flight cause how long after the POST the
/// fault came (the kill, or the fault that blocked the way on).
fn kill_excuse<'a>(
    log: &'a Log,
    post: &Post,
    browser_node: usize,
    broker: bool,
) -> Option<(&'a AppliedFault, Cause, u64)> {
    let entry = post.accepted_by?;
    // What a message needs to reach the browser's node: Redis up in broker mode (and the
    // browser's node up to read it), the browser's node up in a mesh.
    let browser_node = Target::Node(browser_node);
    let broker_way: [(Target, &[Kind]); 2] =
        [(Target::Redis, &REDIS_DOWN), (browser_node, &PROCESS_DOWN)];
    let mesh_way: [(Target, &[Kind]); 1] = [(browser_node, &PROCESS_DOWN)];
    let way: &[(Target, &[Kind])] = if broker { &broker_way } else { &mesh_way };
    let publish_way: &[(Target, &[Kind])] = if broker { &broker_way[..1] } else { &mesh_way };
    let in_flight = |at: u64| at.saturating_sub(post.end_us);
    // A fault on the way on that began while the message was still in flight, and blocked
    // it from then to `to`: the browser's node, say, killed 2 ms after the POST, before it
    // read the entry (seed 209).
    let blocked_from_in_flight = |to: u64| {
        log.faults
            .iter()
            .filter(|w| {
                w.start_us >= post.start_us
                    && w.start_us <= post.end_us + IN_FLIGHT_US
                    && way
                        .iter()
                        .any(|(t, kinds)| w.target == *t && kinds.contains(&w.kind))
            })
            .find(|w| blocked(log, way, w.start_us, to))
            .map(|w| in_flight(w.start_us))
    };
    log.faults.iter().find_map(|f| {
        let k = f.start_us;
        if k < post.start_us {
            return None;
        }
        let soon = k <= post.end_us + IN_FLIGHT_US;
        let cause = match (f.kind, f.target) {
            // The node that took it died before it could pass it on: at once, or later while
            // the way on was blocked all along (Redis away; the browser's node away).
            // Blocked first: "in flight" is then only what no blocked way explains, and its
            // latest delay says how long a message really stays unpublished.
            (Kind::Kill, Target::Node(n)) if n == entry => {
                if blocked(log, publish_way, post.start_us, k) {
                    Some(Cause::NodeKilledWhileBlocked)
                } else {
                    soon.then_some(Cause::NodeKilledInFlight)
                }
            }
            // A SIGTERM drains for its window: what was still queued for the way on all
            // through the window is given up, logged and counted (NOTIFY_BROKER_NOT_FLUSHED,
            // NOTIFY_PEER_QUEUES_DROPPED).
            (Kind::Term, Target::Node(n)) if n == entry => {
                let drained = k + NODE_DRAIN_SECONDS * 1_000_000;
                blocked(log, publish_way, post.start_us, drained)
                    .then_some(Cause::NodeDrainedWhileBlocked)
            }
            // Redis died with the entry still unread by the browser's node: at once, or later
            // while Redis or that node was away all along.
            (Kind::RedisKill, Target::Redis) if broker => {
                if blocked(log, way, post.start_us, k) {
                    Some(Cause::RedisKilledWhileBlocked)
                } else if soon {
                    Some(Cause::RedisKilledInFlight)
                } else if let Some(after) = blocked_from_in_flight(k) {
                    return Some((f, Cause::RedisKilledAfterWayBlockedInFlight, after));
                } else {
                    None
                }
            }
            _ => None,
        };
        cause.map(|cause| (f, cause, in_flight(k)))
    })
}

/// Checks the notification half of `log`.
pub fn check_messages(log: &Log, seed: u64, broker: bool, verdict: &mut Verdict) {
    let mut got: HashMap<(usize, &str), Vec<usize>> = HashMap::new();
    let mut per_connection: HashMap<(usize, usize, &str), usize> = HashMap::new();
    for f in &log.frames {
        got.entry((f.browser, f.unique_id.as_str()))
            .or_default()
            .push(f.connection);
        *per_connection
            .entry((f.browser, f.connection, f.unique_id.as_str()))
            .or_default() += 1;
    }
    let posts_by_id: HashMap<&str, &Post> = log
        .posts
        .iter()
        .map(|p| (p.unique_id.as_str(), p))
        .collect();
    let (mut required, mut delivered, mut excused_kill, mut excused_window) = (0, 0, 0, 0);
    let mut missed = Vec::new();
    let mut excuses = Vec::new();
    // Per cause: pairs excused, and for the in-flight ones the latest fault after its POST.
    let mut by_cause: BTreeMap<Cause, (usize, u64)> = BTreeMap::new();
    let accepted = log.posts.iter().filter(|p| p.accepted_by.is_some()).count();
    for post in log.posts.iter().filter(|p| p.accepted_by.is_some()) {
        for (b, page) in log.pages.iter().enumerate() {
            if !page.phids.iter().any(|p| post.phids.contains(p)) {
                continue;
            }
            let Some(conn) = log.connections.iter().find(|c| {
                c.browser == b
                    && c.subscribed_us.is_some_and(|s| s <= post.start_us)
                    && c.closed_us.is_none_or(|cl| cl > post.start_us)
            }) else {
                continue;
            };
            required += 1;
            if got.contains_key(&(b, post.unique_id.as_str())) {
                delivered += 1;
                continue;
            }
            if let Some((kill, cause, after_us)) = kill_excuse(log, post, page.node, broker) {
                excused_kill += 1;
                let counted = by_cause.entry(cause).or_default();
                counted.0 += 1;
                counted.1 = counted.1.max(after_us);
                excuses.push(format!(
                    "message {} (browser {b}) lost with #{} {} {}",
                    post.unique_id,
                    kill.id,
                    kill.kind.label(),
                    kill.target
                ));
                continue;
            }
            // The browser's next replay after this connection closed, if it closed.
            let replay = conn.closed_us.and_then(|closed| {
                log.replays
                    .iter()
                    .find(|r| r.browser == b && r.at_us > closed)
            });
            if let Some(r) = replay {
                if r.at_us.saturating_sub(r.age_ms * 1000) > post.start_us {
                    excused_window += 1;
                    continue;
                }
            }
            missed.push((post, b, conn.connection, replay.cloned()));
        }
    }
    for (post, b, connection, replay) in missed.iter().take(PRINTED_FAILURES) {
        let frames: Vec<String> = log
            .frames
            .iter()
            .filter(|f| f.browser == *b && f.at_us + 5_000_000 >= post.start_us)
            .take(3)
            .map(|f| format!("{}@{:.3}s", f.unique_id, f.at_us as f64 / 1e6))
            .collect();
        let conns: Vec<String> = log
            .connections
            .iter()
            .filter(|c| c.browser == *b)
            .map(|c| {
                let t = |v: Option<u64>| v.map_or("-".into(), |v| format!("{:.3}", v as f64 / 1e6));
                format!(
                    "#{} {:.3}/{}/{}",
                    c.connection,
                    c.opened_us as f64 / 1e6,
                    t(c.subscribed_us),
                    t(c.closed_us)
                )
            })
            .collect();
        verdict.failures.push(format!(
            "MISSED message {} (phids {:?}) posted {:.3}s..{:.3}s, accepted by node{} after trying {:?}: \
             browser {b} on node{} subscribed on connection {connection}; its connections \
             (opened/subscribed/closed) [{}]; next replay {}; its next frames [{}]; {}",
            post.unique_id,
            post.phids,
            post.start_us as f64 / 1e6,
            post.end_us as f64 / 1e6,
            post.accepted_by.unwrap_or(usize::MAX),
            post.tried,
            log.pages[*b].node,
            conns.join(", "),
            replay
                .as_ref()
                .map_or("none".into(), |r| format!(
                    "on connection {} at {:.3}s, age {} ms",
                    r.connection,
                    r.at_us as f64 / 1e6,
                    r.age_ms
                )),
            frames.join(", "),
            around(log, seed, post.start_us)
        ));
    }
    let mut twice = 0;
    let mut twice_excused = 0;
    for ((b, connection, id), n) in &per_connection {
        if *n < 2 {
            continue;
        }
        if posts_by_id.get(id).is_some_and(|p| p.tried.len() > 1) {
            twice_excused += 1;
            continue;
        }
        twice += 1;
        if verdict.failures.len() < PRINTED_FAILURES {
            let at = posts_by_id.get(id).map_or(0, |p| p.start_us);
            verdict.failures.push(format!(
                "TWICE message {id} came {n} times on connection {connection} of browser {b}; {}",
                around(log, seed, at)
            ));
        }
    }
    verdict.checks.push(check(
        "every accepted message reaches every browser subscribed when it was posted",
        missed.is_empty() && required > 0,
        format!(
            "{required} browser×message pairs required, {delivered} delivered, {} missed, \
             {excused_kill} lost with a SIGKILL (or a SIGTERM's drain) in flight{}, \
             {excused_window} older than the next replay's window",
            missed.len(),
            cause_summary(&by_cause),
        ),
    ));
    verdict.checks.push(check(
        "no connection carries one message twice",
        twice == 0,
        format!("{twice} repeats ({twice_excused} more of messages PHP posted to two nodes)"),
    ));
    verdict
        .facts
        .insert("messages_posted", json!(log.posts.len()));
    verdict.facts.insert("messages_accepted", json!(accepted));
    verdict
        .facts
        .insert("message_pairs_required", json!(required));
    verdict
        .facts
        .insert("message_pairs_delivered", json!(delivered));
    verdict
        .facts
        .insert("message_pairs_lost_at_sigkill", json!(excused_kill));
    verdict
        .facts
        .insert("message_pairs_beyond_replay_window", json!(excused_window));
    verdict.facts.insert(
        "message_pairs_lost_by_cause",
        by_cause
            .iter()
            .map(|(cause, (pairs, _))| (cause.label().to_string(), json!(pairs)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
    );
    verdict.facts.insert(
        "message_losses_at_sigkill",
        json!(excuses
            .into_iter()
            .take(PRINTED_FAILURES)
            .collect::<Vec<_>>()),
    );
}

/// `" (N entry node SIGKILLed in flight, the latest 0.412 s after its POST; …)"`, or nothing
/// when no loss was excused.
fn cause_summary(by_cause: &BTreeMap<Cause, (usize, u64)>) -> String {
    if by_cause.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = by_cause
        .iter()
        .map(|(cause, (pairs, latest_us))| match cause {
            Cause::NodeKilledInFlight
            | Cause::RedisKilledInFlight
            | Cause::RedisKilledAfterWayBlockedInFlight => format!(
                "{pairs} {}, the latest {:.3} s after its POST",
                cause.label(),
                *latest_us as f64 / 1e6
            ),
            _ => format!("{pairs} {}", cause.label()),
        })
        .collect();
    format!(" ({})", parts.join("; "))
}

/// Checks the webhook half of `log` against the rows as they ended.
pub fn check_rows(
    log: &Log,
    seed: u64,
    final_rows: &HashMap<usize, FinalRow>,
    verdict: &mut Verdict,
) {
    let mut arrivals: HashMap<usize, Vec<&super::history::Arrival>> = HashMap::new();
    for a in &log.arrivals {
        arrivals.entry(a.seq).or_default().push(a);
    }
    let kills: Vec<&AppliedFault> = log
        .faults
        .iter()
        .filter(|f| f.kind == Kind::Kill && matches!(f.target, Target::Webhook(_)))
        .collect();
    let (mut sent, mut failed, mut wrong, mut duplicates, mut repeats_at_kill) = (0, 0, 0, 0, 0);
    let mut repeats = Vec::new();
    let describe = |row: &Row, fin: Option<&FinalRow>, list: &[&super::history::Arrival]| {
        let events: Vec<String> = list
            .iter()
            .map(|a| format!("{:?}@{:.3}s", a.answer, a.at_us as f64 / 1e6))
            .collect();
        format!(
            "row {} (hook {}, retry {}) inserted {:.3}s, ended {:?}; receiver saw [{}] (hooks {:?}); {}",
            row.seq,
            row.hook,
            if row.retry_forever { "forever" } else { "never" },
            row.inserted_us as f64 / 1e6,
            fin,
            events.join(", "),
            list.iter().map(|a| a.hook).collect::<std::collections::BTreeSet<_>>(),
            around(log, seed, list.last().map_or(row.inserted_us, |a| a.at_us))
        )
    };
    for row in &log.rows {
        let list = arrivals.get(&row.seq).map(Vec::as_slice).unwrap_or(&[]);
        let fin = final_rows.get(&row.seq);
        let last = list.iter().rev().find(|a| a.answer != Answer::Redirect);
        let ok = match (fin.map(|f| f.status.as_str()), last.map(|a| a.answer)) {
            (Some("sent"), Some(Answer::Ok)) => {
                sent += 1;
                true
            }
            (Some("failed"), Some(answer)) if answer != Answer::Ok && !row.retry_forever => {
                failed += 1;
                // A 500 is the receiver's, recorded as Phorge records it.
                answer != Answer::Status500
                    || fin.is_some_and(|f| {
                        f.error_type.as_deref() == Some("http")
                            && f.error_code.as_deref() == Some("500")
                    })
            }
            _ => false,
        };
        if !ok {
            wrong += 1;
            if verdict.failures.len() < PRINTED_FAILURES {
                verdict
                    .failures
                    .push(format!("WRONG END {}", describe(row, fin, list)));
            }
        }
        let oks: Vec<u64> = list
            .iter()
            .filter(|a| a.answer == Answer::Ok)
            .map(|a| a.at_us)
            .collect();
        for pair in oks.windows(2) {
            match kills
                .iter()
                .find(|k| k.start_us + SENT_BEFORE_RECORDED_US >= pair[0] && k.start_us <= pair[1])
            {
                Some(kill) => {
                    repeats_at_kill += 1;
                    repeats.push(format!(
                        "row {} again at {:.3}s after #{} sigkill {} at {:.3}s",
                        row.seq,
                        pair[1] as f64 / 1e6,
                        kill.id,
                        kill.target,
                        kill.start_us as f64 / 1e6
                    ));
                }
                None => {
                    duplicates += 1;
                    if verdict.failures.len() < PRINTED_FAILURES {
                        verdict
                            .failures
                            .push(format!("DELIVERED TWICE {}", describe(row, fin, list)));
                    }
                }
            }
        }
    }
    let rows = log.rows.len();
    verdict.checks.push(check(
        "every row ends sent or failed as Phorge's rules say",
        wrong == 0 && rows > 0,
        format!(
            "{rows} rows: {sent} sent, {failed} failed, {wrong} not as the receiver's answers say"
        ),
    ));
    verdict.checks.push(check(
        "each row is delivered once, repeats only after a SIGKILL",
        duplicates == 0,
        format!("{duplicates} repeats without a kill, {repeats_at_kill} after a SIGKILL"),
    ));
    verdict.facts.insert("rows", json!(rows));
    verdict.facts.insert("rows_sent", json!(sent));
    verdict.facts.insert("rows_failed", json!(failed));
    verdict
        .facts
        .insert("row_repeats_at_sigkill", json!(repeats));
}

#[cfg(test)]
mod tests {
    use super::super::history::{Arrival, Connection, Frame, Page, Replay};
    use super::*;

    const S: u64 = 1_000_000;

    fn post(id: &str, at: u64, node: usize) -> Post {
        Post {
            unique_id: id.into(),
            phids: vec!["P".into()],
            start_us: at,
            end_us: at + 1000,
            accepted_by: Some(node),
            tried: vec![node],
        }
    }

    fn one_browser(closed_us: Option<u64>) -> Log {
        Log {
            pages: vec![Page {
                node: 1,
                phids: vec!["P".into()],
            }],
            connections: vec![Connection {
                browser: 0,
                connection: 0,
                opened_us: 0,
                subscribed_us: Some(S),
                closed_us,
            }],
            ..Log::default()
        }
    }

    fn frame(id: &str, at: u64, connection: usize) -> Frame {
        Frame {
            browser: 0,
            connection,
            at_us: at,
            unique_id: id.into(),
        }
    }

    fn fault(kind: Kind, target: Target, start_us: u64, end_us: u64) -> AppliedFault {
        AppliedFault {
            id: 9,
            kind,
            target,
            start_us,
            end_us: Some(end_us),
        }
    }

    fn messages(log: &Log) -> Verdict {
        let mut v = Verdict::default();
        check_messages(log, 42, true, &mut v);
        v
    }

    #[test]
    fn a_message_missed_by_a_subscribed_browser_fails_with_its_context() {
        let mut log = one_browser(None);
        log.posts = vec![
            post("a", 2 * S, 0),
            post("b", 3 * S, 0),
            post("early", S / 2, 0),
        ];
        log.frames = vec![frame("a", 2 * S + 10, 0)];
        // A fault still going at the end is part of the context (and no overflow).
        log.faults = vec![AppliedFault {
            end_us: None,
            ..fault(Kind::Stop, Target::Node(2), 2 * S, 0)
        }];
        let v = messages(&log);
        assert!(!v.passed());
        assert!(
            v.failures[0].contains("sigstop node2 2.000s..(not ended)"),
            "{}",
            v.failures[0]
        );
        assert_eq!(v.failures.len(), 1, "{:?}", v.failures);
        assert!(
            v.failures[0].starts_with("MISSED message b"),
            "{}",
            v.failures[0]
        );
        assert!(v.failures[0].contains("seed 42"), "{}", v.failures[0]);
        // Posted before the subscription was confirmed: not owed.
        assert_eq!(v.facts["message_pairs_required"], json!(2));
    }

    #[test]
    fn a_sigkill_of_the_entry_node_in_flight_excuses_the_loss() {
        let mut log = one_browser(None);
        log.posts = vec![post("a", 2 * S, 0)];
        log.faults = vec![fault(Kind::Kill, Target::Node(0), 2 * S + 500, 4 * S)];
        let v = messages(&log);
        assert!(v.passed());
        assert_eq!(
            v.facts["message_pairs_lost_by_cause"],
            json!({"entry node SIGKILLed in flight": 1})
        );
        assert!(
            v.checks[0]
                .detail
                .contains("1 entry node SIGKILLed in flight, the latest 0.000 s after its POST"),
            "{}",
            v.checks[0].detail
        );
        // A kill of another node, or long after, does not.
        log.faults = vec![fault(Kind::Kill, Target::Node(2), 2 * S + 500, 4 * S)];
        assert!(!messages(&log).passed());
        log.faults = vec![fault(Kind::Kill, Target::Node(0), 9 * S, 10 * S)];
        assert!(!messages(&log).passed());
        // …unless Redis was away from the POST until the kill (broker mode).
        log.faults
            .push(fault(Kind::RedisPause, Target::Redis, 2 * S, 9 * S + 1));
        let v = messages(&log);
        assert!(v.passed());
        assert_eq!(
            v.facts["message_pairs_lost_by_cause"],
            json!({"entry node SIGKILLed, way on blocked": 1})
        );
    }

    #[test]
    fn a_sigterm_excuses_only_what_its_drain_could_not_pass_on() {
        let mut log = one_browser(None);
        log.posts = vec![post("a", 2 * S, 0)];
        // Drained while Redis was up: the drain publishes it, so it is owed.
        log.faults = vec![fault(Kind::Term, Target::Node(0), 3 * S, 6 * S)];
        assert!(!messages(&log).passed());
        // Redis away from the POST to past the end of the drain window: given up.
        log.faults.push(fault(
            Kind::RedisKill,
            Target::Redis,
            2 * S - 10,
            3 * S + 2 * S + 1,
        ));
        let v = messages(&log);
        assert!(v.passed(), "{:?}", v.failures);
        // Back well before the drain (and reconnected): the drain could publish it.
        log.faults[0].start_us = 12 * S;
        log.faults[1].end_us = Some(4 * S);
        assert!(!messages(&log).passed());
    }

    #[test]
    fn a_redis_kill_excuses_what_the_browsers_node_could_not_read_before() {
        let mut log = one_browser(None);
        log.posts = vec![post("a", 2 * S, 0)];
        // Redis paused from the POST, the browser's node (node1) stopped before Redis came
        // back, Redis killed while node1 was still away: the entry went with Redis.
        log.faults = vec![
            fault(Kind::RedisPause, Target::Redis, 2 * S - 1, 4 * S),
            fault(Kind::Stop, Target::Node(1), 3 * S, 30 * S),
            fault(Kind::RedisKill, Target::Redis, 20 * S, 21 * S),
        ];
        assert!(messages(&log).passed());
        // Node1 up all along: it read the entry before the kill.
        log.faults.remove(1);
        assert!(!messages(&log).passed());
    }

    #[test]
    fn a_redis_kill_excuses_what_the_browsers_node_went_down_before_reading() {
        // Seed 209: the browser's node SIGKILLed 2 ms after the POST, Redis killed and back
        // empty before the node returned: the entry never reached the node, whose history
        // then loaded from the empty Redis.
        let mut log = one_browser(None);
        log.posts = vec![post("a", 2 * S, 0)];
        log.faults = vec![
            fault(Kind::Kill, Target::Node(1), 2 * S + 3_000, 7 * S),
            fault(Kind::RedisKill, Target::Redis, 5 * S, 6 * S),
        ];
        let v = messages(&log);
        assert!(v.passed(), "{:?}", v.failures);
        assert_eq!(
            v.facts["message_pairs_lost_by_cause"],
            json!({"Redis killed, way on blocked from in flight": 1})
        );
        assert!(
            v.checks[0]
                .detail
                .contains("the latest 0.002 s after its POST"),
            "{}",
            v.checks[0].detail
        );
        // The node went down 3 s after the POST: it had read the entry, so it is owed.
        log.faults[0].start_us = 5 * S + 1_000;
        log.faults[1].start_us = 5 * S + 2_000;
        assert!(!messages(&log).passed());
    }

    #[test]
    fn a_replay_that_reaches_back_must_bring_the_message_and_one_that_cannot_excuses_it() {
        let mut log = one_browser(Some(2 * S + 500));
        log.posts = vec![post("a", 2 * S, 0)];
        log.replays = vec![Replay {
            browser: 0,
            connection: 1,
            at_us: 3 * S,
            age_ms: 60_000,
        }];
        assert!(!messages(&log).passed());
        log.frames = vec![frame("a", 3 * S + 1, 1)];
        assert!(messages(&log).passed());
        log.frames.clear();
        log.replays[0].age_ms = 500;
        let v = messages(&log);
        assert!(v.passed());
        assert_eq!(v.facts["message_pairs_beyond_replay_window"], json!(1));
    }

    #[test]
    fn one_message_twice_on_a_connection_fails_unless_posted_to_two_nodes() {
        let mut log = one_browser(None);
        log.posts = vec![post("a", 2 * S, 0)];
        log.frames = vec![frame("a", 2 * S + 1, 0), frame("a", 2 * S + 2, 0)];
        assert!(!messages(&log).passed());
        log.posts[0].tried = vec![1, 0];
        assert!(messages(&log).passed());
    }

    fn rows_verdict(log: &Log, fin: &[(usize, &str, Option<&str>)]) -> Verdict {
        let final_rows = fin
            .iter()
            .map(|(seq, status, code)| {
                (
                    *seq,
                    FinalRow {
                        status: status.to_string(),
                        error_type: code.map(|_| "http".to_string()),
                        error_code: code.map(str::to_string),
                    },
                )
            })
            .collect();
        let mut v = Verdict::default();
        check_rows(log, 1, &final_rows, &mut v);
        v
    }

    fn arrival(seq: usize, at_us: u64, answer: Answer) -> Arrival {
        Arrival {
            seq,
            hook: 0,
            at_us,
            answer,
        }
    }

    fn row(seq: usize, retry_forever: bool) -> Row {
        Row {
            seq,
            hook: 0,
            retry_forever,
            inserted_us: 0,
        }
    }

    #[test]
    fn rows_end_as_the_last_answer_says() {
        let mut log = Log {
            rows: vec![row(0, false), row(1, true), row(2, false)],
            arrivals: vec![
                arrival(0, S, Answer::Status500),
                arrival(1, S, Answer::Status500),
                arrival(1, 2 * S, Answer::Redirect),
                arrival(1, 2 * S + 1, Answer::Ok),
                arrival(2, S, Answer::Hang),
            ],
            ..Log::default()
        };
        let good = [
            (0, "failed", Some("500")),
            (1, "sent", None),
            (2, "failed", Some("28")),
        ];
        assert!(rows_verdict(&log, &good).passed());
        // Left queued; sent after a 500; a 500 recorded as something else.
        for bad in [
            [
                (0, "failed", Some("500")),
                (1, "queued", None),
                (2, "failed", None),
            ],
            [(0, "sent", None), (1, "sent", None), (2, "failed", None)],
            [
                (0, "failed", Some("timeout")),
                (1, "sent", None),
                (2, "failed", None),
            ],
        ] {
            assert!(!rows_verdict(&log, &bad).passed(), "{bad:?}");
        }
        // A retry=forever row is never `failed`.
        log.arrivals.truncate(2);
        assert!(!rows_verdict(
            &log,
            &[(0, "failed", Some("500")), (1, "failed", Some("500"))]
        )
        .passed());
    }

    #[test]
    fn a_second_delivery_is_excused_only_by_a_sigkill_between() {
        let mut log = Log {
            rows: vec![row(0, false)],
            arrivals: vec![arrival(0, S, Answer::Ok), arrival(0, 5 * S, Answer::Ok)],
            ..Log::default()
        };
        let fin = [(0, "sent", None)];
        assert!(!rows_verdict(&log, &fin).passed());
        log.faults = vec![fault(Kind::Stop, Target::Webhook(1), 2 * S, 3 * S)];
        assert!(!rows_verdict(&log, &fin).passed());
        log.faults = vec![fault(Kind::Kill, Target::Webhook(1), 2 * S, 3 * S)];
        let v = rows_verdict(&log, &fin);
        assert!(v.passed());
        assert_eq!(
            v.facts["row_repeats_at_sigkill"].as_array().unwrap().len(),
            1
        );
        // A kill a moment before the receiver recorded the first: sent, then killed.
        log.faults = vec![fault(Kind::Kill, Target::Webhook(1), S - 1_000, 3 * S)];
        assert!(rows_verdict(&log, &fin).passed());
        // A kill well before it: the killed process did not send it.
        log.faults = vec![fault(Kind::Kill, Target::Webhook(1), S - 1_000_000, 3 * S)];
        assert!(!rows_verdict(&log, &fin).passed());
    }
}
