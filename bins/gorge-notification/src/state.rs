//! What the admin and client handlers share: the hub, this server's fingerprint, metrics,
//! probes, the peer relay, the limits that apply per request or per socket, and the history
//! gate (is the history warm yet).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use gorge_hub::Hub;
use gorge_service::Probes;
use slog::Logger;
use tokio::sync::{watch, Notify};

use crate::budget::InboundLimits;
use crate::fanout::Fanout;
use crate::metrics::Metrics;
use crate::peers::PeerRelay;

/// Per-request and per-socket limits (the `GORGE_NOTIFICATION_MAX_*`, ping and idle settings).
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub max_frame_bytes: usize,
    /// Each socket's inbound budget (frames and bytes per second, with a burst).
    pub inbound: InboundLimits,
    pub max_admin_body_bytes: usize,
    pub ping_interval: Duration,
    pub idle_timeout: Duration,
}

pub struct ServerState {
    /// The hub as it is now, for what does not depend on messages still in the hand-off
    /// (leaving, queue bounds, drain, gauges, counting a POST in). Whatever must see every POST
    /// already answered takes the hub from [`Fanout::settled`] instead.
    pub hub: Arc<Hub>,
    /// Where the admin port hands accepted messages (it never delivers them itself), and the
    /// settled hub.
    pub fanout: Fanout,
    /// Fixed for the life of the process; peers learn it from our receipts.
    pub fingerprint: String,
    pub metrics: Metrics,
    pub probes: Arc<Probes>,
    pub relay: Arc<PeerRelay>,
    pub limits: ConnectionLimits,
    pub started: Instant,
    pub log: Logger,
    /// Signalled whenever a socket session ends (drain waits on it).
    pub session_ended: Notify,
    /// Set when the drain starts: when it stops waiting for sockets. A socket closed by the
    /// drain may take until then to write what is queued and its 1001.
    pub drain_ends: OnceLock<tokio::time::Instant>,
    /// Open once history holds what this server must be able to replay.
    pub history_gate: Arc<HistoryGate>,
    /// Messages taken in recently, by `uniqueID`: each is taken in once.
    pub recent_ids: crate::ingest::RecentIds,
    /// `GET /history/` exports being built now (each holds up to the history's bytes).
    pub history_exports: std::sync::atomic::AtomicUsize,
}

/// Whether this server's history is warm: it holds every message of the history window the
/// cluster had (warmed from a peer, or loaded from a broker), or there was nothing to warm
/// from. Until then `/readyz` answers 503 and `replay` commands wait: a browser that
/// reconnected here and replayed an empty history would miss what it came back for.
///
/// It opens once and never closes. Both ways of filling history (the mesh's warm-up from a
/// peer and a broker's load at start) open it when they are done, whatever the outcome.
#[derive(Debug)]
pub struct HistoryGate {
    open: watch::Sender<bool>,
}

impl HistoryGate {
    /// A gate that is already open (nothing to warm from) or closed until [`HistoryGate::open`].
    pub fn new(open: bool) -> HistoryGate {
        HistoryGate {
            open: watch::Sender::new(open),
        }
    }

    /// Opens the gate for good.
    pub fn open(&self) {
        self.open.send_replace(true);
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
            Box::pin(async move {
                if open {
                    Ok(())
                } else {
                    Err("history is warming up".to_owned())
                }
            })
        })
    }
}

impl ServerState {
    /// `"gorge-notification <version>"`, the extra `server` key of `/status/`.
    pub fn server_name() -> String {
        concat!("gorge-notification ", env!("CARGO_PKG_VERSION")).to_string()
    }
}
