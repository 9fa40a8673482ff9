//! Whether Phorge hands requests over at all, for readiness and one log line.
//!
//! The service delivers only rows the hand-over kit marked (`gorge_claim::handover`), so a
//! gorge-webhook next to a stock or un-switched Phorge sends nothing — correct, but silent
//! unless it says so. Every few seconds it reads the newest rows of the table (sent or
//! not): if none of them is marked and the newest is older than [`GRACE_SEC`], Phorge is
//! delivering by itself, and `/readyz` answers 503 with [`NOTHING_HANDED_OVER`] until a
//! marked row shows up. Each change of that state is logged once
//! (`WEBHOOK_NOTHING_HANDED_OVER`, `WEBHOOK_HANDED_OVER`), never per sample: the state
//! only changes on evidence (a marked row among the newest; an unmarked newest row past the
//! grace), so an idle table, a young row or a failed sample leave it as it was. An empty
//! table (a new install) counts as ready.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gorge_claim::handover::HandoverSample;
use gorge_claim::ClaimStore;
use gorge_service::{emit, ReadinessCheck, Shutdown};
use slog::Logger;

use crate::clock::UnixClock;
use crate::events;

/// The readiness reason and log text while nothing is handed over.
pub const NOTHING_HANDED_OVER: &str =
    "no rows handed over: is compat/phorge applied and gorge.webhook.uri set?";

/// How old the newest row must be before "not marked" counts: Phorge marks a new row
/// right after inserting it, and its clock may differ from ours by a few seconds.
pub const GRACE_SEC: u64 = 30;

/// How often the newest rows are read.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// What the newest rows said last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Nothing to tell yet: no rows, or only rows younger than the grace.
    Unknown,
    /// A row among the newest was handed over.
    HandedOver,
    /// The newest rows are Phorge's own: it delivers by itself.
    NothingHandedOver,
}

/// The hand-over state of this process, fed by [`watch`].
pub struct HandoverWatch {
    state: Mutex<Handover>,
    log: Logger,
}

impl HandoverWatch {
    pub fn new(log: Logger) -> Arc<HandoverWatch> {
        Arc::new(HandoverWatch {
            state: Mutex::new(Handover::Unknown),
            log,
        })
    }

    pub fn state(&self) -> Handover {
        *self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `/readyz`'s reason while nothing is handed over.
    pub fn not_ready_reason(&self) -> Option<&'static str> {
        (self.state() == Handover::NothingHandedOver).then_some(NOTHING_HANDED_OVER)
    }

    /// Updates the state from `sample` taken at `now`; logs a change once.
    pub fn observe(&self, sample: HandoverSample, now: u64) {
        let next = if sample.any_marked {
            Handover::HandedOver
        } else {
            match sample.newest_created {
                Some(created) if created.saturating_add(GRACE_SEC) <= now => {
                    Handover::NothingHandedOver
                }
                _ => return,
            }
        };
        let previous = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *state, next)
        };
        if previous == next {
            return;
        }
        match next {
            Handover::NothingHandedOver => emit!(self.log, events::WEBHOOK_NOTHING_HANDED_OVER;
                "why" => NOTHING_HANDED_OVER,
                "newest_request_age_sec" => now.saturating_sub(sample.newest_created.unwrap_or(now))),
            Handover::HandedOver => emit!(self.log, events::WEBHOOK_HANDED_OVER;
                "why" => "Phorge hands requests over (compat/phorge); delivering them"),
            Handover::Unknown => {}
        }
    }
}

/// `check`, then, if it passed, "not ready" while nothing is handed over (a database that
/// cannot be reached is the more basic reason, so it is reported first).
pub fn gate(check: ReadinessCheck, watch: Arc<HandoverWatch>) -> ReadinessCheck {
    Arc::new(move || {
        let inner = check();
        let watch = Arc::clone(&watch);
        Box::pin(async move {
            inner.await?;
            match watch.not_ready_reason() {
                Some(reason) => Err(reason.to_owned()),
                None => Ok(()),
            }
        })
    })
}

/// Samples the newest rows every [`SAMPLE_INTERVAL`] until shutdown. A failed sample
/// changes nothing (the poll loop reports database errors).
pub async fn watch(
    store: ClaimStore,
    watch: Arc<HandoverWatch>,
    clock: Arc<dyn UnixClock>,
    shutdown: Shutdown,
) {
    loop {
        if let Ok(Ok(sample)) = tokio::time::timeout(SAMPLE_INTERVAL, store.handover_sample()).await
        {
            watch.observe(sample, clock.now_sec());
        }
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE_INTERVAL) => {}
            _ = shutdown.triggered() => return,
        }
    }
}
