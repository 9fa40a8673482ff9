//! The service's Prometheus metrics, registered once and shared by the dispatcher and API.
//!
//! The silent failures this service exists to prevent (double delivery, rows stuck past their
//! lease, hooks hammered while broken) each have a counter here, so they can be seen.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::delivery::DeliveryCounters;
use crate::outcome::{DeliveryOutcome, InvalidRowReason, SkipReason};

type Labels1 = [(&'static str, &'static str); 1];
type Labels2 = [(&'static str, &'static str); 2];

/// Every metric the service exports. Cheap to clone (the metric handles are shared).
#[derive(Clone)]
pub struct Metrics {
    claims: Family<Labels1, Counter>,
    deliveries: Family<Labels2, Counter>,
    pub attempt_seconds: Histogram,
    skipped: Family<Labels1, Counter>,
    pub results_taken_over: Counter,
    pub policy_blocks: Counter,
    pub poll_errors: Counter,
    /// Completed poll rounds: tests wait for "N more rounds" instead of sleeping.
    pub polls: Counter,
    pub full_batches: Counter,
    pub exclusions_capped: Counter,
    pub response_bodies_truncated: Counter,
    pub connection_retries: Counter,
    pub addresses_not_dialled: Counter,
    pub breaker_open_hooks: Gauge,
    invalid_rows: Family<Labels1, Counter>,
    pub rows_unaddressable: Counter,
    pub rows_quarantined: Counter,
    object_unchecked: Family<Labels1, Counter>,
    pub result_write_retries: Counter,
    pub db_timeouts: Counter,
    pub poll_loop_up: Gauge,
    pub in_flight: Gauge,
    pub queue_depth: Gauge,
    pub oldest_queued_age_seconds: Gauge,
    db_pool: Family<Labels2, Gauge>,
    /// 1 after a successful sample of the queue, 0 before the first and after a failure.
    pub db_up: Gauge,
}

/// The `(pool, state)` series of the pool gauge, in [`Metrics::set_pool`] order.
const POOL_SERIES: [(&str, &str); 5] = [
    ("query", "open"),
    ("query", "in_use"),
    ("query", "waiting"),
    ("lock", "open"),
    ("lock", "held"),
];

impl Metrics {
    /// Creates the metrics and registers them in `registry`, which names them: the service's
    /// registry ([`gorge_service::metrics::service_registry`]) adds `gorge_webhook_`.
    pub fn register(registry: &mut Registry) -> Metrics {
        let metrics = Metrics {
            claims: Family::default(),
            deliveries: Family::default(),
            attempt_seconds: Histogram::new(exponential_buckets(0.005, 2.0, 13)),
            skipped: Family::default(),
            results_taken_over: Counter::default(),
            policy_blocks: Counter::default(),
            poll_errors: Counter::default(),
            polls: Counter::default(),
            full_batches: Counter::default(),
            exclusions_capped: Counter::default(),
            response_bodies_truncated: Counter::default(),
            connection_retries: Counter::default(),
            addresses_not_dialled: Counter::default(),
            breaker_open_hooks: Gauge::default(),
            invalid_rows: Family::default(),
            rows_unaddressable: Counter::default(),
            rows_quarantined: Counter::default(),
            object_unchecked: Family::default(),
            result_write_retries: Counter::default(),
            db_timeouts: Counter::default(),
            poll_loop_up: Gauge::default(),
            in_flight: Gauge::default(),
            queue_depth: Gauge::default(),
            oldest_queued_age_seconds: Gauge::default(),
            db_pool: Family::default(),
            db_up: Gauge::default(),
        };
        // Series that exist from the start, so dashboards see 0 rather than nothing.
        for result in ["won", "lost"] {
            let _ = metrics.claims.get_or_create(&[("result", result)]);
        }
        for (pool, state) in POOL_SERIES {
            let _ = metrics
                .db_pool
                .get_or_create(&[("pool", pool), ("state", state)]);
        }
        for reason in [
            InvalidRowReason::Unreadable,
            InvalidRowReason::Rejected,
            InvalidRowReason::HookRow,
        ] {
            let _ = metrics
                .invalid_rows
                .get_or_create(&[("reason", reason.label())]);
        }
        for reason in ["unknown-type", "no-table", "refused"] {
            let _ = metrics
                .object_unchecked
                .get_or_create(&[("reason", reason)]);
        }
        for reason in [
            SkipReason::HookBusy,
            SkipReason::BreakerOpen,
            SkipReason::InFlight,
        ] {
            let _ = metrics.skipped.get_or_create(&[("reason", reason.label())]);
        }
        // The outcomes a dashboard alerts on; other outcome/class pairs appear when they occur.
        for (outcome, class) in [
            (DeliveryOutcome::Sent, "2xx"),
            (DeliveryOutcome::Retry, "5xx"),
            (DeliveryOutcome::Failed, "4xx"),
        ] {
            let _ = metrics
                .deliveries
                .get_or_create(&[("outcome", outcome.label()), ("class", class)]);
        }
        let r = registry;
        r.register(
            "claims",
            "Claim attempts by result (won, lost: another claimant got the row first)",
            metrics.claims.clone(),
        );
        r.register(
            "deliveries",
            "Finished requests by outcome (sent, retry, failed) and class (2xx..5xx, timeout, transport, hook)",
            metrics.deliveries.clone(),
        );
        r.register(
            "attempt_duration_seconds",
            "Duration of HTTP delivery attempts, redirects included",
            metrics.attempt_seconds.clone(),
        );
        r.register(
            "skipped",
            "Candidates passed over this round by reason",
            metrics.skipped.clone(),
        );
        r.register(
            "results_taken_over",
            "Result writes that found the row claimed by someone else after the lease expired",
            metrics.results_taken_over.clone(),
        );
        r.register(
            "policy_blocks",
            "Requests or redirects refused by the outbound blacklist",
            metrics.policy_blocks.clone(),
        );
        r.register(
            "poll_errors",
            "Database errors while polling or writing",
            metrics.poll_errors.clone(),
        );
        r.register(
            "polls",
            "Poll rounds completed (candidates fetched and every startable one started)",
            metrics.polls.clone(),
        );
        r.register(
            "full_batches",
            "Polls that hit the candidate LIMIT (more work was waiting)",
            metrics.full_batches.clone(),
        );
        r.register(
            "exclusions_capped",
            "Polls that had more hooks to leave out of the candidate query than its cap (1024); the rest were not left out",
            metrics.exclusions_capped.clone(),
        );
        r.register(
            "response_bodies_truncated",
            "Receiver responses longer than 64 KiB (the rest is not read)",
            metrics.response_bodies_truncated.clone(),
        );
        r.register(
            "connection_retries",
            "Requests sent again on a new connection because the reused keep-alive connection closed before answering (cURL does the same)",
            metrics.connection_retries.clone(),
        );
        r.register(
            "addresses_not_dialled",
            "Resolved receiver addresses beyond the 256 dialled per URI or redirect hop (every one was checked against the blacklist)",
            metrics.addresses_not_dialled.clone(),
        );
        r.register(
            "breaker_open_hooks",
            "Hooks whose circuit breaker is open",
            metrics.breaker_open_hooks.clone(),
        );
        r.register(
            "in_flight",
            "Deliveries in progress in this process",
            metrics.in_flight.clone(),
        );
        r.register(
            "queue_depth",
            "Queued requests (sampled every few seconds)",
            metrics.queue_depth.clone(),
        );
        r.register(
            "oldest_queued_age_seconds",
            "Age of the oldest queued request, 0 when none (sampled every few seconds)",
            metrics.oldest_queued_age_seconds.clone(),
        );
        r.register(
            "db_pool_connections",
            "Database connections by pool (query, lock) and state (query: open, in_use, waiting; lock: open, held)",
            metrics.db_pool.clone(),
        );
        r.register(
            "invalid_rows",
            "Requests failed with hook/invalid-row, by reason (unreadable, rejected, hook-row)",
            metrics.invalid_rows.clone(),
        );
        r.register(
            "rows_unaddressable",
            "Candidate rows whose id or version could not be read (skipped)",
            metrics.rows_unaddressable.clone(),
        );
        r.register(
            "rows_quarantined",
            "Rows that could be neither delivered nor failed; skipped until restart",
            metrics.rows_quarantined.clone(),
        );
        r.register(
            "object_unchecked",
            "Deliveries whose object/transactions could not be checked, by reason (unknown-type, no-table, refused)",
            metrics.object_unchecked.clone(),
        );
        r.register(
            "result_write_retries",
            "Result writes retried after a database error (within the claim's lease)",
            metrics.result_write_retries.clone(),
        );
        r.register(
            "db_timeouts",
            "Database statements that hit the query timeout (their connection was closed)",
            metrics.db_timeouts.clone(),
        );
        r.register(
            "poll_loop_up",
            "1 while the poll loop runs; 0 once it ended (the process then exits non-zero)",
            metrics.poll_loop_up.clone(),
        );
        r.register(
            "db_up",
            "1 while the database answers the queue sample (every few seconds), else 0",
            metrics.db_up.clone(),
        );
        metrics
    }

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
        }
    }

    pub fn claim_won(&self) {
        self.claims.get_or_create(&[("result", "won")]).inc();
    }

    pub fn claim_lost(&self) {
        self.claims.get_or_create(&[("result", "lost")]).inc();
    }

    pub fn claims(&self, won: bool) -> u64 {
        let result = if won { "won" } else { "lost" };
        self.claims.get_or_create(&[("result", result)]).get()
    }

    pub fn delivered(&self, outcome: DeliveryOutcome, class: &'static str) {
        self.deliveries
            .get_or_create(&[("outcome", outcome.label()), ("class", class)])
            .inc();
    }

    pub fn deliveries(&self, outcome: DeliveryOutcome, class: &'static str) -> u64 {
        self.deliveries
            .get_or_create(&[("outcome", outcome.label()), ("class", class)])
            .get()
    }

    pub fn skip(&self, reason: SkipReason) {
        self.skipped
            .get_or_create(&[("reason", reason.label())])
            .inc();
    }

    pub fn set_pool(&self, pool: &gorge_claim::PoolState) {
        let values = [
            pool.connections,
            pool.in_use,
            pool.waiting,
            pool.lock_connections,
            pool.locks_held,
        ];
        for ((pool, state), value) in POOL_SERIES.into_iter().zip(values) {
            self.db_pool
                .get_or_create(&[("pool", pool), ("state", state)])
                .set(value as i64);
        }
    }

    pub fn pool_gauge(&self, pool: &'static str, state: &'static str) -> i64 {
        self.db_pool
            .get_or_create(&[("pool", pool), ("state", state)])
            .get()
    }

    pub fn invalid_row(&self, reason: InvalidRowReason) {
        self.invalid_rows
            .get_or_create(&[("reason", reason.label())])
            .inc();
    }

    pub fn invalid_rows(&self, reason: InvalidRowReason) -> u64 {
        self.invalid_rows
            .get_or_create(&[("reason", reason.label())])
            .get()
    }

    pub fn object_unchecked(&self, reason: &'static str) {
        self.object_unchecked
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    pub fn objects_unchecked(&self, reason: &'static str) -> u64 {
        self.object_unchecked
            .get_or_create(&[("reason", reason)])
            .get()
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
