//! Prometheus metrics of the notification service (listed in docs/notification.md,
//! "Metrics"), except the peer relay's own.
//! They are registered without a prefix: the registry the binary hands in adds
//! `gorge_notification_` to every name.
//!
//! Sockets are labelled by instance *class* (`default` or `named`), never by instance name:
//! names come from browsers' URLs, and a label per name would let anyone grow the exposition.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub instance_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// The label value for an instance name.
pub fn instance_class(instance: &str) -> ClassLabel {
    ClassLabel {
        instance_class: if instance == "default" {
            "default"
        } else {
            "named"
        },
    }
}

/// Label values of the labelled series, created at 0 so a fresh server shows them all.
pub const INSTANCE_CLASSES: [&str; 2] = ["default", "named"];
pub const SOCKET_REJECT_REASONS: [&str; 4] =
    ["max_sockets", "max_instances", "instance_name", "draining"];
pub const SOCKET_CLOSE_REASONS: [&str; 7] = [
    "client",
    "slow_consumer",
    "drain",
    "oversized_frame",
    "protocol_error",
    "invalid_utf8",
    "idle",
];
pub const ADMIN_REJECT_REASONS: [&str; 5] = [
    "bad_json",
    "not_object",
    "too_large",
    "instance_name",
    "fanout_full",
];

/// Every metric of the service, cheap to clone (each is an `Arc` inside).
#[derive(Clone)]
pub struct Metrics {
    pub sockets_open: Family<ClassLabel, Gauge>,
    pub sockets: Family<ClassLabel, Counter>,
    pub sockets_rejected: Family<ReasonLabel, Counter>,
    pub sockets_closed: Family<ReasonLabel, Counter>,
    pub messages_in: Counter,
    pub messages_duplicate: Counter,
    pub messages_out: Counter,
    pub admin_rejected: Family<ReasonLabel, Counter>,
    pub fanout_seconds: Histogram,
    pub admin_post_seconds: Histogram,
    pub fanout_batch_messages: Histogram,
    pub queue_dropped_frames: Counter,
    pub slow_consumer_disconnects: Counter,
    pub replayed_frames: Counter,
    pub subscriptions_ignored: Counter,
    pub commands_ignored: Counter,
    pub oversized_frames: Counter,
    pub history_entries: Gauge,
    pub history_bytes: Gauge,
    pub draining: Gauge,
    pub replays_refused: Counter,
    pub subscriptions_over_total: Counter,
    pub subscription_bytes: Gauge,
    pub instances: Family<KindLabel, Gauge>,
    pub accept_errors: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let metrics = Metrics {
            sockets_open: Family::default(),
            sockets: Family::default(),
            sockets_rejected: Family::default(),
            sockets_closed: Family::default(),
            messages_in: Counter::default(),
            messages_duplicate: Counter::default(),
            messages_out: Counter::default(),
            admin_rejected: Family::default(),
            // 10 µs .. ~0.65 s.
            fanout_seconds: Histogram::new(exponential_buckets(0.000_01, 2.0, 17)),
            // 25 µs .. ~0.8 s.
            admin_post_seconds: Histogram::new(exponential_buckets(0.000_025, 2.0, 16)),
            // 1 .. 64 messages (the fan-out's batch limit).
            fanout_batch_messages: Histogram::new(exponential_buckets(1.0, 2.0, 7)),
            queue_dropped_frames: Counter::default(),
            slow_consumer_disconnects: Counter::default(),
            replayed_frames: Counter::default(),
            subscriptions_ignored: Counter::default(),
            commands_ignored: Counter::default(),
            oversized_frames: Counter::default(),
            history_entries: Gauge::default(),
            history_bytes: Gauge::default(),
            draining: Gauge::default(),
            replays_refused: Counter::default(),
            subscriptions_over_total: Counter::default(),
            subscription_bytes: Gauge::default(),
            instances: Family::default(),
            accept_errors: Counter::default(),
        };
        for instance_class in INSTANCE_CLASSES {
            let _ = metrics
                .sockets_open
                .get_or_create(&ClassLabel { instance_class });
            let _ = metrics
                .sockets
                .get_or_create(&ClassLabel { instance_class });
        }
        for reason in SOCKET_REJECT_REASONS {
            let _ = metrics
                .sockets_rejected
                .get_or_create(&ReasonLabel { reason });
        }
        for reason in SOCKET_CLOSE_REASONS {
            let _ = metrics
                .sockets_closed
                .get_or_create(&ReasonLabel { reason });
        }
        for kind in ["confirmed", "anonymous"] {
            let _ = metrics.instances.get_or_create(&KindLabel { kind });
        }
        for reason in ADMIN_REJECT_REASONS {
            let _ = metrics
                .admin_rejected
                .get_or_create(&ReasonLabel { reason });
        }
        let m = metrics.clone();
        registry.register("sockets_open", "Open WebSocket connections", m.sockets_open);
        registry.register("sockets", "WebSocket connections ever accepted", m.sockets);
        registry.register(
            "sockets_rejected",
            "WebSocket upgrades refused (max_sockets, max_instances, instance_name, draining)",
            m.sockets_rejected,
        );
        registry.register(
            "sockets_closed",
            "WebSocket connections closed, by reason",
            m.sockets_closed,
        );
        registry.register(
            "messages_in",
            "Messages accepted on the admin port",
            m.messages_in,
        );
        registry.register(
            "messages_duplicate",
            "Messages that already carried our fingerprint in touched (ignored)",
            m.messages_duplicate,
        );
        registry.register(
            "messages_out",
            "Frames queued for live delivery (replay excluded)",
            m.messages_out,
        );
        registry.register(
            "admin_rejected",
            "Admin messages refused (bad_json, not_object, too_large, instance_name)",
            m.admin_rejected,
        );
        registry.register(
            "fanout_seconds",
            "Time from an accepted POST to its last frame queued",
            m.fanout_seconds,
        );
        registry.register(
            "admin_post_seconds",
            "Time the admin port took to answer a POST once its head arrived (body, parse, encode, hand-off)",
            m.admin_post_seconds,
        );
        registry.register(
            "fanout_batch_messages",
            "Messages delivered by one fan-out pass (more than one when POSTs arrive faster than a pass)",
            m.fanout_batch_messages,
        );
        registry.register(
            "queue_dropped_frames",
            "Frames dropped because a socket's outbound queue was full",
            m.queue_dropped_frames,
        );
        registry.register(
            "slow_consumer_disconnects",
            "Sockets closed with 1008 because their outbound queue overflowed",
            m.slow_consumer_disconnects,
        );
        registry.register(
            "replayed_frames",
            "Frames queued by replay",
            m.replayed_frames,
        );
        registry.register(
            "subscriptions_ignored",
            "PHIDs ignored by the per-socket or per-PHID subscription limit",
            m.subscriptions_ignored,
        );
        registry.register(
            "commands_ignored",
            "Client frames ignored as malformed, wrongly typed or unknown",
            m.commands_ignored,
        );
        registry.register(
            "oversized_frames",
            "Client frames over the frame limit (socket closed with 1009)",
            m.oversized_frames,
        );
        registry.register(
            "history_entries",
            "Retained history entries",
            m.history_entries,
        );
        registry.register(
            "history_bytes",
            "Retained history message bytes",
            m.history_bytes,
        );
        registry.register("draining", "1 while draining after SIGTERM", m.draining);
        registry.register(
            "replays_refused",
            "Replay commands refused by the per-socket replay rate limit",
            m.replays_refused,
        );
        registry.register(
            "subscriptions_over_limit",
            "PHIDs refused because all sockets together hold the total subscription bytes",
            m.subscriptions_over_total,
        );
        registry.register(
            "subscription_bytes",
            "Bytes charged for the subscriptions of all sockets",
            m.subscription_bytes,
        );
        registry.register(
            "instances",
            "Instances with state, by kind (confirmed: default or posted to; anonymous)",
            m.instances,
        );
        registry.register(
            "accept_errors",
            "Failed accepts on any listener (out of file descriptors and the like)",
            m.accept_errors,
        );
        metrics
    }

    /// Sets the hub's instance and subscription gauges.
    pub fn set_usage(&self, usage: gorge_hub::HubUsage) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.subscription_bytes.set(gauge(usage.subscription_bytes));
        for (kind, n) in [
            ("confirmed", usage.confirmed_instances),
            ("anonymous", usage.anonymous_instances),
        ] {
            self.instances
                .get_or_create(&KindLabel { kind })
                .set(gauge(n));
        }
    }

    /// Sets the history gauges.
    pub fn set_history(&self, entries: usize, bytes: usize) {
        self.history_entries
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
        self.history_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Counts a refused WebSocket upgrade.
    pub fn reject_socket(&self, reason: &'static str) {
        self.sockets_rejected
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts a refused admin message.
    pub fn reject_admin(&self, reason: &'static str) {
        self.admin_rejected
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_registry_shows_every_label_value_at_zero() {
        let mut registry = gorge_service::metrics::service_registry("gorge_notification", "0");
        let _metrics = Metrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let mut expected = Vec::new();
        for class in INSTANCE_CLASSES {
            expected.push(format!(
                "gorge_notification_sockets_open{{instance_class=\"{class}\"}} 0"
            ));
            expected.push(format!(
                "gorge_notification_sockets_total{{instance_class=\"{class}\"}} 0"
            ));
        }
        for (name, reasons) in [
            ("sockets_rejected", &SOCKET_REJECT_REASONS[..]),
            ("sockets_closed", &SOCKET_CLOSE_REASONS[..]),
            ("admin_rejected", &ADMIN_REJECT_REASONS[..]),
        ] {
            for reason in reasons {
                expected.push(format!(
                    "gorge_notification_{name}_total{{reason=\"{reason}\"}} 0"
                ));
            }
        }
        for line in expected {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert!(!text.contains("notify_"), "{text}");
    }
}
