//! Prometheus metrics of the peer relay, each family declared once (see
//! `gorge_service::metrics`; docs/notification.md's table is generated from it): per-peer
//! relay outcomes and link state, the number of known peers, and the discovery limits being hit.
//!
//! Per-peer label sets are removed when a peer goes away, so DNS churn cannot grow the
//! exposition without bound.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// Outcome label values of `gorge_notification_peer_relays_total`.
const RESULTS: [&str; 5] = ["ok", "failed", "reconnected", "expired", "dropped"];

gorge_service::metrics! {
    /// Every metric the relay exports, registered once at start.
    pub struct PeerMetrics {
        peer_relays: Counter[peer, result],
            "Relays per peer (host:port): ok (delivered), failed (an attempt failed; an \
             unreachable peer's message is kept and retried), reconnected (the connection closed \
             before any answer and the POST went again at once on a new one), expired (given up \
             after the history age), dropped (queue full, peer removed, or past the drain \
             deadline)";
        peer_up: Gauge[peer],
            "1 while the last relay to this peer succeeded; 0 before the first success and \
             after a failure";
        peers_known: Gauge,
            "Peers messages are relayed to (this server excluded once detected)";
        peer_discovery_refused: Counter,
            "Peer addresses not added because the peer limit was reached (counted on every DNS \
             refresh)";
        peer_dns_failures: Counter,
            "Peer DNS lookups that failed or timed out (the previous peer set is kept)";
    }
}

/// The counters of one peer, held by its worker and by the relay so the hot path never
/// looks up a label set.
#[derive(Clone)]
pub(super) struct PeerCounters {
    pub(super) ok: Counter,
    pub(super) failed: Counter,
    pub(super) reconnected: Counter,
    pub(super) expired: Counter,
    pub(super) dropped: Counter,
    pub(super) up: Gauge,
}

impl PeerMetrics {
    pub(super) fn for_peer(&self, peer: &str) -> PeerCounters {
        let [ok, failed, reconnected, expired, dropped] = RESULTS.map(|result| {
            self.peer_relays
                .with_owned([peer.to_owned(), result.to_owned()])
        });
        PeerCounters {
            ok,
            failed,
            reconnected,
            expired,
            dropped,
            up: self.peer_up.with_owned([peer.to_owned()]),
        }
    }

    /// Forgets a vanished peer's label sets; its worker may still count into the detached
    /// handles while it winds down, which nobody scrapes.
    pub(super) fn forget_peer(&self, peer: &str) {
        for result in RESULTS {
            self.peer_relays
                .remove([peer.to_owned(), result.to_owned()]);
        }
        self.peer_up.remove([peer.to_owned()]);
    }
}
