//! The recorded history of a chaos run: every fault as applied, every message posted and
//! every frame each simulated browser got, every row inserted and every request the
//! receiver answered, all on one clock (µs since the run began). The checker reads only this.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::schedule::{Kind, Target};

/// A fault as it was applied (the schedule says when it was planned).
#[derive(Debug, Clone)]
pub struct AppliedFault {
    pub id: usize,
    pub kind: Kind,
    pub target: Target,
    pub start_us: u64,
    /// When the target was back to normal (restarted and ready, resumed, reconnected).
    pub end_us: Option<u64>,
}

/// One message PHP posted (`PhabricatorNotificationClient::tryToPostMessage`).
#[derive(Debug, Clone)]
pub struct Post {
    pub unique_id: String,
    pub phids: Vec<String>,
    pub start_us: u64,
    pub end_us: u64,
    /// The node whose 200 ended the fail-over, if any did.
    pub accepted_by: Option<usize>,
    /// Every node tried, in order (a timed-out node may still have taken the message).
    pub tried: Vec<usize>,
}

/// One browser (`JX.Aphlict` page) and what it subscribes to.
#[derive(Debug, Clone)]
pub struct Page {
    pub node: usize,
    pub phids: Vec<String>,
}

/// One WebSocket connection of a browser.
#[derive(Debug, Clone)]
pub struct Connection {
    pub browser: usize,
    pub connection: usize,
    pub opened_us: u64,
    /// When the pong after its `subscribe` came back: from here on it is subscribed.
    pub subscribed_us: Option<u64>,
    pub closed_us: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Replay {
    pub browser: usize,
    pub connection: usize,
    pub at_us: u64,
    pub age_ms: u64,
}

#[derive(Debug, Clone)]
pub struct Frame {
    pub browser: usize,
    pub connection: usize,
    pub at_us: u64,
    pub unique_id: String,
}

/// One `herald_webhookrequest` row inserted (handed over, as the kit marks it).
#[derive(Debug, Clone)]
pub struct Row {
    pub seq: usize,
    pub hook: usize,
    pub retry_forever: bool,
    pub inserted_us: u64,
}

/// How the receiver answered one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Status500,
    /// A redirect to the hook's 200 path (the follow-up arrives as its own request).
    Redirect,
    /// Closed without answering.
    Close,
    /// Never answered; the sender's timeout ends it.
    Hang,
}

#[derive(Debug, Clone)]
pub struct Arrival {
    pub seq: usize,
    pub hook: usize,
    pub at_us: u64,
    pub answer: Answer,
}

/// A process (re)started and ready, by target.
#[derive(Debug, Clone)]
pub struct Start {
    pub target: Target,
    pub at_us: u64,
}

/// Everything recorded.
#[derive(Debug, Clone, Default)]
pub struct Log {
    pub faults: Vec<AppliedFault>,
    pub starts: Vec<Start>,
    pub posts: Vec<Post>,
    pub pages: Vec<Page>,
    pub connections: Vec<Connection>,
    pub replays: Vec<Replay>,
    pub frames: Vec<Frame>,
    pub rows: Vec<Row>,
    pub arrivals: Vec<Arrival>,
}

/// The shared recorder.
#[derive(Debug, Clone)]
pub struct History {
    epoch: Instant,
    log: Arc<Mutex<Log>>,
}

impl History {
    pub fn new() -> History {
        History {
            epoch: Instant::now(),
            log: Arc::new(Mutex::new(Log::default())),
        }
    }

    pub fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Appends under the lock (never held across I/O).
    pub fn with<R>(&self, f: impl FnOnce(&mut Log) -> R) -> R {
        f(&mut self.log.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn snapshot(&self) -> Log {
        self.with(|log| log.clone())
    }

    pub fn fault_started(&self, id: usize, kind: Kind, target: Target) {
        let now = self.now_us();
        self.with(|log| {
            log.faults.push(AppliedFault {
                id,
                kind,
                target,
                start_us: now,
                end_us: None,
            })
        });
    }

    pub fn fault_ended(&self, id: usize) {
        let now = self.now_us();
        self.with(|log| {
            if let Some(f) = log.faults.iter_mut().rev().find(|f| f.id == id) {
                f.end_us = Some(now);
            }
        });
    }

    pub fn started(&self, target: Target) {
        let at_us = self.now_us();
        self.with(|log| log.starts.push(Start { target, at_us }));
    }
}
