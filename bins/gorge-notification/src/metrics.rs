//! Prometheus metrics of the notification service, except the peer relay's own, each family
//! declared once (see `gorge_service::metrics`); docs/notification.md's table is generated
//! from this list and checked by `tests/docs.rs`. They are registered without a prefix: the
//! registry the binary hands in adds `gorge_notification_` to every name.
//!
//! Sockets are labelled by instance *class* (`default` or `named`), never by instance name:
//! names come from browsers' URLs, and a label per name would let anyone grow the exposition.

use gorge_service::metrics::exponential_buckets;

/// The registry prefix of every family below and of the peer relay's.
pub const PREFIX: &str = "gorge_notification";

/// The label value for an instance name.
pub fn instance_class(instance: &str) -> &'static str {
    if instance == "default" {
        "default"
    } else {
        "named"
    }
}

gorge_service::metrics! {
    /// Every metric of the service, cheap to clone (each is an `Arc` inside).
    pub struct Metrics {
        sockets_open: Gauge[instance_class] = [["default"], ["named"]],
            "Open sockets; instance_class is default or named (names are not labels)";
        sockets: Counter[instance_class] = [["default"], ["named"]],
            "Sockets ever accepted";
        sockets_rejected: Counter[reason] = [
            ["max_sockets"], ["max_instances"], ["instance_name"], ["draining"],
        ], "Upgrades refused, by reason";
        sockets_closed: Counter[reason] = [
            ["client"], ["slow_consumer"], ["drain"], ["oversized_frame"], ["protocol_error"],
            ["invalid_utf8"], ["inbound_frames"], ["inbound_bytes"], ["subscriptions"], ["idle"], ["upgrade_failed"],
        ], "Sockets closed, by reason: protocol_error is close 1002 (unmasked frame, reserved \
            bits or opcode, bad control frame, stray continuation, bad close code), \
            invalid_utf8 close 1007, inbound_frames and inbound_bytes close 1008 (the socket \
            sent more than its inbound budget), subscriptions close 1008 (it held the most \
            subscription bytes when all sockets together reached the total), upgrade_failed \
            when the connection ended between the 101 and the hand-over";
        messages_in: Counter, "Messages accepted";
        history_warm: Gauge,
            "1 once history is warm (filled from a peer or the broker at startup, or nothing \
             to fill it from); until then /readyz is 503 and replays wait";
        history_warmed: Counter[result] = [["kept"], ["duplicate"], ["invalid"]],
            "Messages of a peer's history taken at warm-up: kept, duplicate (already here by \
             relay) or invalid";
        messages_duplicate: Counter, "Messages that already carried our fingerprint";
        messages_out: Counter, "Frames queued for live delivery (replay excluded)";
        admin_rejected: Counter[reason] = [
            ["bad_json"], ["not_object"], ["too_large"], ["instance_name"], ["fanout_full"],
            ["history_busy"],
        ], "Admin requests refused, by reason; fanout_full is a 503: the hand-off to the \
            fan-out thread holds 4096 messages or 64 MiB; history_busy a 503 to a GET \
            /history/ while two exports run";
        // 10 µs .. ~0.65 s.
        fanout_seconds: Histogram(exponential_buckets(0.000_01, 2.0, 17)),
            "Accepted POST to last frame written or queued (buckets 10 µs to 0.65 s)";
        // 25 µs .. ~0.8 s.
        admin_post_seconds: Histogram(exponential_buckets(0.000_025, 2.0, 16)),
            "Time the admin port took to answer a POST from the accept of its connection: \
             head, body, parse, encode, hand-off to the fan-out; refusals included (buckets 25 µs to 0.8 s). What \
             PHP waits for, minus the network";
        // 1 .. 64 messages (the fan-out's batch limit).
        fanout_batch_messages: Histogram(exponential_buckets(1.0, 2.0, 7)),
            "Messages one fan-out pass delivered (buckets 1 to 64). Above 1 when POSTs arrive \
             faster than one pass over the sockets: the pass takes every message already \
             waiting (at most 64 or 1 MiB) and gives each socket all of its frames in one write";
        queue_dropped_frames: Counter,
            "Frames dropped by a full socket queue (overflow, or replay that did not fit)";
        slow_consumer_disconnects: Counter,
            "Sockets closed with 1008 after overflowing their queue (pongs and pings count \
             against it too)";
        replayed_frames: Counter, "Frames queued by replay";
        memory_trims: Counter,
            "Times freed heap memory was handed back to the system after a large release \
             (32 MiB of subscriptions or 2 000 sockets released, or a burst of 256 connections \
             ended, since the last time)";
        subscriptions_ignored: Counter, "PHIDs refused by the per-socket subscription limits";
        commands_ignored: Counter, "Client frames ignored as malformed, mistyped or unknown";
        oversized_frames: Counter, "Client frames over the frame limit (closed with 1009)";
        history_entries: Gauge, "Retained history entries";
        history_bytes: Gauge, "Retained history message bytes";
        draining: Gauge, "1 while draining after SIGTERM";
        replays_refused: Counter, "Replay commands refused by the per-socket rate limit";
        subscriptions_over_limit: Counter,
            "PHIDs refused because all sockets together hold the total subscription bytes and \
             no socket holds any to release (only when the total is below one socket's share)";
        subscription_evictions: Counter,
            "Sockets closed with 1008 because all sockets together held the total subscription \
             bytes and this one held the most (its subscriptions are released at once, so a \
             newcomer's subscription is taken, never dropped)";
        subscription_bytes: Gauge, "Bytes charged for every socket's subscriptions";
        instances: Gauge[kind] = [["confirmed"], ["anonymous"]],
            "Instances with state: confirmed (posted to) or anonymous (default is neither)";
        client_connections_max: Gauge,
            "Connections the client port may hold (sockets and connections not yet upgraded): \
             the open-file limit less a reserve for the admin port; -1 without a limit";
        client_connections_closed: Counter[reason] = [["fd_reserve"], ["upgrade_timeout"]],
            "Client-port connections closed before becoming a socket: fd_reserve when \
             client_connections_max were open, upgrade_timeout when no request head came \
             within 10 s of the accept";
        accept_errors: Counter,
            "Failed accepts on any listener (out of file descriptors and the like)";
        tls_certificate_expires_in_seconds: Gauge[port],
            "Seconds until the certificate a TLS port (client or admin) serves expires, as of \
             the last check of its files (every 60 s and on SIGHUP); negative once expired. \
             Only TLS ports have a series";
        tls_reloads: Counter[port, result],
            "Renewed certificate files found on a TLS port: taken (new handshakes use them), \
             or failed (unreadable, not PEM, key not matching: the old pair serves on; once \
             per distinct failure)";
        tls_plaintext_refused: Counter[port],
            "Connections to a TLS port closed unanswered because they spoke plaintext (an \
             http:// or ws:// URL pointed at it)";
        tls_handshakes_failed: Counter[port],
            "TLS handshakes that failed or did not finish within the first-request deadline \
             (10 s on the client port, 30 s on the admin port)";
    }
}

impl Metrics {
    /// Sets the hub's instance and subscription gauges.
    pub fn set_usage(&self, usage: gorge_hub::HubUsage) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.subscription_bytes.set(gauge(usage.subscription_bytes));
        self.instances
            .with(["confirmed"])
            .set(gauge(usage.confirmed_instances));
        self.instances
            .with(["anonymous"])
            .set(gauge(usage.anonymous_instances));
    }

    /// Sets the history gauges.
    pub fn set_history(&self, entries: usize, bytes: usize) {
        self.history_entries
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
        self.history_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}
