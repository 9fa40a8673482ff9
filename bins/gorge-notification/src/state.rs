//! What the admin and client handlers share: the hub, this server's fingerprint, metrics,
//! probes, the peer relay or the broker, the history gate and the limits that apply per request or per socket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gorge_hub::Hub;
use gorge_service::Probes;
use slog::Logger;
use tokio::sync::Notify;

use crate::broker::Broker;
use crate::fanout::Fanout;
use crate::history_gate::HistoryGate;
use crate::metrics::Metrics;
use crate::peers::PeerRelay;

/// Per-request and per-socket limits (the `GORGE_NOTIFICATION_MAX_*`, ping and idle settings).
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub max_frame_bytes: usize,
    pub max_admin_body_bytes: usize,
    pub ping_interval: Duration,
    pub idle_timeout: Duration,
}

pub struct ServerState {
    pub hub: Arc<Hub>,
    /// Where the admin port hands accepted messages (it never delivers them itself).
    pub fanout: Fanout,
    /// Fixed for the life of the process; peers learn it from our receipts.
    pub fingerprint: String,
    pub metrics: Metrics,
    pub probes: Arc<Probes>,
    pub relay: Arc<PeerRelay>,
    /// Broker mode's publishing side, when `BROKER_URL` is set.
    pub broker: Option<Arc<Broker>>,
    /// Open once the history is loaded (at once without a broker).
    pub history_gate: Arc<HistoryGate>,
    pub limits: ConnectionLimits,
    pub started: Instant,
    pub log: Logger,
    /// Signalled whenever a socket session ends (drain waits on it).
    pub session_ended: Notify,
}

impl ServerState {
    /// `"gorge-notification <version>"`, the extra `server` key of `/status/`.
    pub fn server_name() -> String {
        concat!("gorge-notification ", env!("CARGO_PKG_VERSION")).to_string()
    }
}
