//! Prometheus metrics of the peer relay (listed in docs/notification.md, "Metrics"): per-peer relay outcomes and link state,
//! the number of known peers, and the discovery limits being hit.
//!
//! Per-peer label sets are removed when a peer goes away, so DNS churn cannot grow the
//! exposition without bound.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Outcome label values of `gorge_notification_peer_relays_total`.
const RESULT_OK: &str = "ok";
const RESULT_FAILED: &str = "failed";
const RESULT_DROPPED: &str = "dropped";
const RESULTS: [&str; 3] = [RESULT_OK, RESULT_FAILED, RESULT_DROPPED];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RelayLabels {
    peer: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: String,
}

/// Every metric the relay exports, registered once at start.
#[derive(Clone)]
pub(super) struct PeerMetrics {
    relays: Family<RelayLabels, Counter>,
    up: Family<PeerLabel, Gauge>,
    pub(super) known: Gauge,
    pub(super) refused: Counter,
    pub(super) dns_failures: Counter,
}

/// The counters of one peer, held by its worker and by the relay so the hot path never
/// looks up a label set.
#[derive(Clone)]
pub(super) struct PeerCounters {
    pub(super) ok: Counter,
    pub(super) failed: Counter,
    pub(super) dropped: Counter,
    pub(super) up: Gauge,
}

impl PeerMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = PeerMetrics {
            relays: Family::default(),
            up: Family::default(),
            known: Gauge::default(),
            refused: Counter::default(),
            dns_failures: Counter::default(),
        };
        registry.register(
            "peer_relays",
            "Messages relayed to a peer, by peer and result (ok, failed, dropped: queue full or shut down)",
            metrics.relays.clone(),
        );
        registry.register(
            "peer_up",
            "1 while the last relay to this peer succeeded, 0 before the first success and after a failure",
            metrics.up.clone(),
        );
        registry.register(
            "peers_known",
            "Peers messages are relayed to (this server itself excluded once detected)",
            metrics.known.clone(),
        );
        registry.register(
            "peer_discovery_refused",
            "Peer addresses not added because the peer limit was reached (counted again on every DNS refresh)",
            metrics.refused.clone(),
        );
        registry.register(
            "peer_dns_failures",
            "Peer DNS lookups that failed or timed out (the previous peer set is kept)",
            metrics.dns_failures.clone(),
        );
        metrics
    }

    pub(super) fn for_peer(&self, peer: &str) -> PeerCounters {
        let relay = |result| {
            self.relays.get_or_create_owned(&RelayLabels {
                peer: peer.to_owned(),
                result,
            })
        };
        PeerCounters {
            ok: relay(RESULT_OK),
            failed: relay(RESULT_FAILED),
            dropped: relay(RESULT_DROPPED),
            up: self.up.get_or_create_owned(&PeerLabel {
                peer: peer.to_owned(),
            }),
        }
    }

    /// Forgets a vanished peer's label sets; its worker may still count into the detached
    /// handles while it winds down, which nobody scrapes.
    pub(super) fn forget_peer(&self, peer: &str) {
        for result in RESULTS {
            self.relays.remove(&RelayLabels {
                peer: peer.to_owned(),
                result,
            });
        }
        self.up.remove(&PeerLabel {
            peer: peer.to_owned(),
        });
    }
}
