//! Prometheus metrics of broker mode, each family declared once (see
//! `gorge_service::metrics`; docs/notification.md's table is generated from it). Registered in
//! mesh mode too (all 0), so dashboards and alert rules find the same series everywhere;
//! `broker_enabled` tells the modes apart (the `broker_up` alert needs it).

gorge_service::metrics! {
    /// Every metric broker mode exports.
    pub struct BrokerMetrics {
        broker_enabled: Gauge, "1 in broker mode (`BROKER_URL` set), 0 in mesh mode";
        broker_up: Gauge,
            "1 while the publisher's additions succeed and the reader reads this server's own \
             entries back within 2 s; 0 before the first success, after a failure, and while \
             the reader makes no progress (alert when 0 for minutes)";
        broker_published: Counter, "Messages added to the stream";
        broker_failed: Counter,
            "Stream additions (messages and probes) that failed or timed out; a message is \
             retried on a new connection";
        broker_dropped: Counter[reason] = [["queue_full"], ["expired"]],
            "Messages not published: queue_full (the publish queue was full while Redis was \
             slow or away), expired (still queued when older than the history age)";
        broker_received: Counter,
            "Other servers' messages read from the stream and delivered here";
        broker_own_skipped: Counter, "This server's own messages read back and skipped";
        broker_skipped: Counter[reason] =
            [["oversized"], ["no_message"], ["malformed"], ["instance_name"]],
            "Stream entries skipped as no message this server can take: oversized (larger \
             than an admin POST can carry; skipped by id and size, its bytes never sent), \
             no_message (no instance or message field), malformed (not a JSON object), \
             instance_name (over the limit)";
        broker_lag_seconds: GaugeF64,
            "Age of the last entry read from the stream when it was read (0 once the reader \
             has caught up and waits); alert when high";
        broker_hydrated_entries: Counter, "Messages loaded into history from the stream at start";
        broker_epoch_changes: Counter,
            "Times Redis was found restarted empty (its epoch key changed): the history it held \
             is gone";
        broker_probe_timeouts: Counter,
            "Times our own entry was not read back within 2 s: the reader was reported down \
             (a connection that looked healthy but delivered nothing, replaced; or a reader \
             held by a reply or the hand-off)";
        broker_reconnects: Counter, "New broker connections after the first (publisher and reader)";
    }
}
