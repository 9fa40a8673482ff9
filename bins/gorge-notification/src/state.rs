//! What the admin and client handlers share: the hub, this server's fingerprint, metrics,
//! probes, the way to the other servers (alone, peers or a broker), the limits that apply per request or per socket, and
//! the history gate (is the history warm yet).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use gorge_service::Probes;
use slog::Logger;
use tokio::sync::Notify;

use crate::budget::InboundLimits;
use crate::cluster::Cluster;
use crate::fanout::{Fanout, HubNow};
use crate::history_gate::HistoryGate;
use crate::metrics::Metrics;
use crate::recent_ids::RecentIds;

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
    /// already answered takes the hub from [`Fanout::settled`], the only way to the rest.
    pub hub: HubNow,
    /// Where the admin port hands accepted messages (it never delivers them itself), and the
    /// settled hub.
    pub fanout: Fanout,
    /// Fixed for the life of the process; peers learn it from our receipts.
    pub fingerprint: String,
    pub metrics: Metrics,
    pub probes: Arc<Probes>,
    /// Alone, a mesh of peers, or a broker: chosen once at startup.
    pub cluster: Cluster,
    pub limits: ConnectionLimits,
    pub started: Instant,
    pub log: Logger,
    /// Signalled whenever a socket session ends (drain waits on it).
    pub session_ended: Notify,
    /// Set when the drain starts: when it stops waiting for sockets. A socket closed by the
    /// drain may take until then to write what is queued and its 1001.
    pub drain_ends: OnceLock<tokio::time::Instant>,
    /// Open once history holds what this server must be able to replay (at once without
    /// peers or a broker to fill it from).
    pub history_gate: Arc<HistoryGate>,
    /// Messages taken in recently, by `uniqueID`: each is taken in once.
    pub recent_ids: RecentIds,
    /// `GET /history/` exports being built now (each holds up to the history's bytes).
    pub history_exports: std::sync::atomic::AtomicUsize,
}

impl ServerState {
    /// `"gorge-notification <version>"`, the extra `server` key of `/status/`.
    pub fn server_name() -> String {
        concat!("gorge-notification ", env!("CARGO_PKG_VERSION")).to_string()
    }
}
