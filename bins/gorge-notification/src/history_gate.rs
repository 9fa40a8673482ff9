//! Whether this server's history is warm: it holds every message of the history window the
//! cluster had, or there was nothing to fill it from. Until then `/readyz` answers 503 and
//! `replay` commands wait: a browser that reconnected here and replayed a history still being
//! filled would miss what it came back for.
//!
//! Two things fill history at start, never both (broker mode refuses peers): the mesh's
//! warm-up from a ready peer ([`crate::warmup`]) and broker mode's load from the stream
//! ([`crate::broker`]). Each opens the gate when it is done, whatever the outcome; the gate
//! opens once and never closes. Without either it is open from the start.

use std::sync::Arc;

use gorge_service::metrics::Gauge;
use tokio::sync::watch;

/// Closed until the history is filled; never closes again.
#[derive(Debug)]
pub struct HistoryGate {
    open: watch::Sender<bool>,
    /// `history_warm`: 1 once open.
    warm: Gauge,
    /// Why `/readyz` is 503 while closed.
    filling: &'static str,
}

impl HistoryGate {
    /// A gate that is already open (nothing to fill history from), or closed until
    /// [`HistoryGate::open`] while `filling` history (the `/readyz` reason until then).
    pub fn new(open: bool, filling: &'static str, warm: Gauge) -> HistoryGate {
        warm.set(i64::from(open));
        HistoryGate {
            open: watch::Sender::new(open),
            warm,
            filling,
        }
    }

    /// Opens the gate for good; returns whether it was closed.
    pub fn open(&self) -> bool {
        self.warm.set(1);
        !self.open.send_replace(true)
    }

    pub fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// Completes once the gate is open.
    pub async fn opened(&self) {
        if self.is_open() {
            return;
        }
        let _ = self.open.subscribe().wait_for(|open| *open).await;
    }

    /// The readiness check `/readyz` asks: not ready while history is still being filled.
    pub fn readiness(self: &Arc<Self>) -> gorge_service::ReadinessCheck {
        let gate = Arc::clone(self);
        Arc::new(move || {
            let open = gate.is_open();
            let filling = gate.filling;
            Box::pin(async move {
                if open {
                    Ok(())
                } else {
                    Err(filling.to_owned())
                }
            })
        })
    }
}
