//! The service's Prometheus metrics, each family declared once (see
//! `gorge_service::metrics`; docs/webhook.md's table is generated from this list and checked
//! by `tests/docs.rs`), registered once and shared by the dispatcher and API.
//!
//! The silent failures this service exists to prevent (double delivery, rows stuck past their
//! lease, hooks hammered while broken) each have a counter here, so they can be seen.

use gorge_service::metrics::exponential_buckets;
use prometheus_client::registry::Registry;

use crate::delivery::{DeliveryCounters, Shortage};
use crate::outcome::{DeliveryOutcome, InvalidRowReason, SkipReason};

/// The registry prefix of every family below (`gorge_webhook_claims_total`).
pub const PREFIX: &str = "gorge_webhook";

/// The `(pool, state)` series of the pool gauge, in [`Metrics::set_pool`] order.
const POOL_SERIES: [[&str; 2]; 5] = [
    ["query", "open"],
    ["query", "in_use"],
    ["query", "waiting"],
    ["lock", "open"],
    ["lock", "held"],
];

gorge_service::metrics! {
    /// Every metric the service exports. Cheap to clone (the metric handles are shared).
    pub struct Metrics {
        claims: Counter[result] = [["won"], ["lost"]],
            "CAS claims; lost = another claimant was first (a duplicate prevented)";
        // The outcomes a dashboard alerts on; other outcome/class pairs appear when they occur.
        deliveries: Counter[outcome, class] = [
            [DeliveryOutcome::Sent.label(), "2xx"],
            [DeliveryOutcome::Retry.label(), "5xx"],
            [DeliveryOutcome::Failed.label(), "4xx"],
        ], "Finished requests; outcome sent, retry (stays queued) or failed; class 2xx to 5xx, \
            other (a status outside 200-599), hook (no POST: invalid properties, missing or \
            disabled hook, blocked URI), or for a transport failure its reason (timeout, dns, \
            connection-refused, certificate-not-trusted... the reason column of the error-code \
            table below)";
        attempt_duration_seconds: Histogram(exponential_buckets(0.005, 2.0, 13)),
            "HTTP attempts, redirects included (buckets 5 ms to 20 s)";
        skipped: Counter[reason] = [
            [SkipReason::HookBusy.label()],
            [SkipReason::BreakerOpen.label()],
            [SkipReason::InFlight.label()],
        ], "Candidates passed over this round, by reason";
        held_rows: Counter,
            "Rows delivered under a hook lock kept from the hook's previous row (no GET_LOCK \
             and RELEASE_LOCK of their own; see Per-hook lock)";
        hold_bounds: Counter,
            "Lock holds ended by their bound (32 rows or 1 s); the hook then rests as long as \
             its lock was held";
        claims_unclear: Counter,
            "Batch claims of a hold's next rows that won some rows but not all (which ones \
             cannot be told): none is sent, the rows won wait out their lease";
        claims_given_back: Counter,
            "Rows a hold claimed with others and did not deliver (the hold ended first), made \
             fresh again";
        results_taken_over: Counter,
            "Result writes that found the row re-claimed after the lease (see below)";
        policy_blocks: Counter, "Hook URIs or redirect hops refused by the blacklist";
        poll_errors: Counter,
            "Database errors (poll, per-row queries); result-write retries are \
             result_write_retries_total";
        // Tests wait for "N more rounds" instead of sleeping.
        polls: Counter,
            "Poll rounds completed (candidates fetched, every startable one started); failed \
             rounds count in poll_errors_total";
        full_batches: Counter,
            "Polls that hit the candidate LIMIT (4 x max_concurrent): a backlog";
        exclusions_capped: Counter,
            "Polls with more hooks to leave out of the candidate query than its cap (1024); the \
             rest were fetched and skipped as before";
        response_bodies_truncated: Counter,
            "Receiver answers longer than 64 KiB (the rest is not read)";
        connection_retries: Counter,
            "Requests sent again on a new connection because the reused keep-alive connection \
             closed before answering (cURL does the same)";
        addresses_not_dialled: Counter,
            "Resolved receiver addresses beyond the 256 dialled per URI or redirect hop (every \
             one was checked against the blacklist)";
        breaker_open_hooks: Gauge, "Hooks this process saw with an open breaker";
        lock_unavailable_hooks: Gauge,
            "Hooks with rows waiting whose per-hook lock was held by another session at their \
             last try (another replica, Phorge's worker, or a session left behind by a dead \
             connection; sampled every 5 s)";
        lock_unavailable_seconds: Gauge,
            "How long the longest of those hooks has found its lock held (0 when none): longer \
             than the claim lease means the lock is not held for a delivery";
        in_flight: Gauge, "Rows being worked on in this process";
        queue_depth: Gauge,
            "Queued rows, handed over or still Phorge's (sampled every 5 s; keeps its last \
             value while the database is down: read it with db_up)";
        oldest_queued_age_seconds: Gauge,
            "Age of the oldest queued row by dateCreated, 0 when none (sampled like queue_depth)";
        db_pool_connections: Gauge[pool, state] = POOL_SERIES, "Database connections: the query pool's open (at most MYSQL_MAX_CONNECTIONS), \
            in_use and waiting; the lock pool's open (at most MYSQL_MAX_LOCK_CONNECTIONS) and \
            the hook locks held now";
        invalid_rows: Counter[reason] = [
            [InvalidRowReason::Unreadable.label()],
            [InvalidRowReason::Rejected.label()],
            [InvalidRowReason::HookRow.label()],
            [InvalidRowReason::Oversized.label()],
        ], "Requests failed with hook/invalid-row: a column not UTF-8, statements the server \
            kept rejecting (e.g. dateModified = 4294967295), a hook row with unreadable \
            columns, or properties longer than the service reads (1 MiB, or the server's \
            max_allowed_packet less 64 KiB)";
        rows_unaddressable: Counter,
            "Candidate rows whose id/dateModified could not be read (skipped; logged once)";
        rows_quarantined: Counter,
            "Rows that could be neither delivered nor failed; skipped by this process until \
             restart";
        object_unchecked: Counter[reason] = [["unknown-type"], ["no-table"], ["refused"]],
            "Deliveries whose object and transactions could not be checked (PHID type not in \
             Phorge's table, type without a table, SELECT refused or table missing); delivered \
             with the stored transaction list";
        delivery_deadlines_extended: Counter,
            "Deliveries whose timeout ran out after this process itself stood still (stopped, \
             or starved of CPU) and was moved on by that long, within the claim's lease: the \
             receiver's answer is read, not written as its timeout";
        result_write_retries: Counter,
            "Result writes retried after a database error, within the claim's lease";
        db_timeouts: Counter,
            "Statements that hit the query timeout (their connection was closed)";
        local_failures: Counter[reason] = [
            [Shortage::Descriptors.label()],
            [Shortage::Memory.label()],
            [Shortage::LocalPort.label()],
            [Shortage::Buffers.label()],
        ], "Attempts this process could not send (no file descriptor, no memory, no local \
            port, no socket buffer) before anything reached the receiver: nothing written, the \
            claim given back, the row stays queued; never a receiver failure, never counted \
            toward the breaker";
        queue_answers: Counter[source] = [["queried"], ["reused"]],
            "/api/webhook/queue answers: queried (the database read, one at a time) or reused \
             (the answer being made, or one made within the last 5 s)";
        status_connections_max: Gauge,
            "Connections the status port holds at most: the soft open-file limit less the \
             derived status_fd_reserve (kept for deliveries and the database), at least 8; -1 \
             without a limit";
        status_connections_closed: Counter[reason] = [["fd_reserve"], ["no_request"]],
            "Status-port connections closed unserved: fd_reserve when status_connections_max \
             were open (closed at accept), no_request when no request head came within 10 s";
        poll_loop_up: Gauge,
            "1 while the poll loop runs; 0 once it ended (the process then exits with code 3)";
        db_up: Gauge,
            "1 after a successful sample of the queue, 0 before the first and after a failed one";
    }
}

impl Metrics {
    /// Metrics registered nowhere (tests of single components).
    pub fn unregistered() -> Metrics {
        Metrics::register(&mut Registry::default())
    }

    /// The counters the deliverer increments.
    pub fn delivery_counters(&self) -> DeliveryCounters {
        DeliveryCounters {
            bodies_truncated: self.response_bodies_truncated.clone(),
            connection_retries: self.connection_retries.clone(),
            addresses_not_dialled: self.addresses_not_dialled.clone(),
            deadlines_extended: self.delivery_deadlines_extended.clone(),
        }
    }

    pub fn claim_won(&self) {
        self.claims.with(["won"]).inc();
    }

    pub fn claim_lost(&self) {
        self.claims.with(["lost"]).inc();
    }

    pub fn claims(&self, won: bool) -> u64 {
        self.claims.with([if won { "won" } else { "lost" }]).get()
    }

    pub fn delivered(&self, outcome: DeliveryOutcome, class: &'static str) {
        self.deliveries.with([outcome.label(), class]).inc();
    }

    pub fn deliveries(&self, outcome: DeliveryOutcome, class: &'static str) -> u64 {
        self.deliveries.with([outcome.label(), class]).get()
    }

    pub fn skip(&self, reason: SkipReason) {
        self.skipped.with([reason.label()]).inc();
    }

    pub fn skips(&self, reason: SkipReason) -> u64 {
        self.skipped.with([reason.label()]).get()
    }

    pub fn set_pool(&self, pool: &gorge_claim::PoolState) {
        let values = [
            pool.connections,
            pool.in_use,
            pool.waiting,
            pool.lock_connections,
            pool.locks_held,
        ];
        for (series, value) in POOL_SERIES.into_iter().zip(values) {
            self.db_pool_connections.with(series).set(value as i64);
        }
    }

    pub fn pool_gauge(&self, pool: &'static str, state: &'static str) -> i64 {
        self.db_pool_connections.with([pool, state]).get()
    }

    pub fn invalid_row(&self, reason: InvalidRowReason) {
        self.invalid_rows.with([reason.label()]).inc();
    }

    pub fn invalid_rows(&self, reason: InvalidRowReason) -> u64 {
        self.invalid_rows.with([reason.label()]).get()
    }

    pub fn local_failure(&self, shortage: Shortage) {
        self.local_failures.with([shortage.label()]).inc();
    }

    pub fn local_failures(&self, shortage: Shortage) -> u64 {
        self.local_failures.with([shortage.label()]).get()
    }

    pub fn object_unchecked(&self, reason: &'static str) {
        self.object_unchecked.with([reason]).inc();
    }

    pub fn objects_unchecked(&self, reason: &'static str) -> u64 {
        self.object_unchecked.with([reason]).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::status_class;

    #[test]
    fn exposition_has_the_documented_names() {
        let mut registry = gorge_service::metrics::service_registry("gorge_webhook", "0.1.0");
        let m = Metrics::register(&mut registry);
        m.claim_won();
        m.claim_lost();
        m.claim_lost();
        m.delivered(DeliveryOutcome::Sent, status_class(204));
        m.skip(SkipReason::HookBusy);
        m.set_pool(&gorge_claim::PoolState {
            connections: 3,
            in_use: 1,
            waiting: 0,
            lock_connections: 2,
            locks_held: 1,
        });
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "gorge_webhook_claims_total{result=\"lost\"} 2",
            "gorge_webhook_claims_total{result=\"won\"} 1",
            "gorge_webhook_deliveries_total{outcome=\"sent\",class=\"2xx\"} 1",
            "gorge_webhook_skipped_total{reason=\"hook-busy\"} 1",
            "gorge_webhook_db_pool_connections{pool=\"query\",state=\"open\"} 3",
            "gorge_webhook_db_pool_connections{pool=\"lock\",state=\"held\"} 1",
            "gorge_webhook_invalid_rows_total{reason=\"rejected\"} 0",
            "gorge_webhook_object_unchecked_total{reason=\"refused\"} 0",
            "gorge_webhook_poll_loop_up 0",
            "gorge_webhook_breaker_open_hooks 0",
            "gorge_webhook_policy_blocks_total 0",
            "gorge_webhook_results_taken_over_total 0",
            "gorge_webhook_exclusions_capped_total 0",
            "gorge_webhook_connection_retries_total 0",
            "gorge_webhook_addresses_not_dialled_total 0",
            "gorge_webhook_db_up 0",
            "gorge_webhook_skipped_total{reason=\"in-flight\"} 0",
            "gorge_webhook_deliveries_total{outcome=\"retry\",class=\"5xx\"} 0",
            "gorge_webhook_build_info{version=\"0.1.0\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        assert!(text.contains("gorge_webhook_attempt_duration_seconds_bucket"));
    }

    #[test]
    fn status_classes() {
        assert_eq!(status_class(200), "2xx");
        assert_eq!(status_class(302), "3xx");
        assert_eq!(status_class(404), "4xx");
        assert_eq!(status_class(503), "5xx");
        assert_eq!(status_class(99), "other");
    }
}
