//! Whether this server's history is warm: `/readyz` answers 503 and `replay` waits until it is.
//! A server that fills its history from elsewhere at start (broker mode: from the stream) must
//! not be sent browsers, nor answer their `replay`, before then: a replay answered from an
//! empty history loses every message the browser missed. Without such a source the gate is
//! open from the start.

use tokio::sync::watch;

/// Closed until the history is loaded; never closes again.
pub struct HistoryGate {
    warm: watch::Sender<bool>,
}

impl HistoryGate {
    /// A gate that is open already (nothing to load).
    pub fn open_now() -> Self {
        HistoryGate {
            warm: watch::Sender::new(true),
        }
    }

    /// A gate that opens when [`HistoryGate::open`] is called.
    pub fn closed() -> Self {
        HistoryGate {
            warm: watch::Sender::new(false),
        }
    }

    /// Opens the gate; returns whether it was closed.
    pub fn open(&self) -> bool {
        !self.warm.send_replace(true)
    }

    pub fn is_warm(&self) -> bool {
        *self.warm.borrow()
    }

    /// Completes once the gate is open.
    pub async fn warm(&self) {
        if self.is_warm() {
            return;
        }
        let _ = self.warm.subscribe().wait_for(|warm| *warm).await;
    }
}
