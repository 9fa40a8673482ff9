//! Every log event of gorge-webhook, each declared once (see `gorge_service::events`) and
//! emitted only through that declaration; docs/webhook.md's table is generated from this list
//! (and the shared runtime's) and checked by `tests/docs.rs`.

use gorge_service::derived::{self, Derives};
use gorge_service::settings::Declared;

use crate::config::{Config, RawSettings};

/// How many fields [`STARTED_FIELDS`] holds.
const STARTED_COUNT: usize =
    derived::started_field_count(RawSettings::SETTINGS, <Config as Derives>::DERIVED);

/// The fields of `WEBHOOK_STARTED`: every setting by its key, every derived fact by its name
/// (the event carries `config::Loaded::started`).
pub const STARTED_FIELDS: [&str; STARTED_COUNT] =
    derived::started_fields(&[], RawSettings::SETTINGS, <Config as Derives>::DERIVED);

gorge_service::events! {
    /// Every event of the service, in the docs' order.
    pub const ALL = [
        WEBHOOK_STARTED: Info [..STARTED_FIELDS]
            "Serving: every setting by its key with its effective value (secrets masked), then \
             every derived fact (see Derived facts)";
        WEBHOOK_CONFIG_ADJUSTED: Info ["key", "configured", "effective", "why"]
            "An effective value differs from the configured one (see Configuration)";
        WEBHOOK_CONFIG_WARNING: Warning ["warning"]
            "A configuration that cannot take effect as written: unknown variables, \
             `OUTBOUND_BLACKLIST=none`, backoffs below the poll interval";
        WEBHOOK_BIND_FAILED: Error ["addr", "error"]
            "The status port cannot be bound: exit 1";
        WEBHOOK_DB_READY: Info ["database"]
            "The first successful poll, and the first after each outage";
        WEBHOOK_NOTHING_HANDED_OVER: Warning ["why", "newest_request_age_sec"]
            "The newest requests are all Phorge's own (`why`: `no rows handed over: is \
             compat/phorge applied and gorge.webhook.uri set?`): nothing is sent and `/readyz` \
             answers 503 until one is handed over — once per change, never per sample";
        WEBHOOK_HANDED_OVER: Info ["why"]
            "A handed-over request is among the newest (at start, or after \
             `WEBHOOK_NOTHING_HANDED_OVER`) — once per change";
        WEBHOOK_POLL_ERROR: Warning ["error", "retry_in_ms"]
            "A poll failed on a database error: polling backs off (`retry_in_ms`, 0.5 s \
             doubling to 30 s) and continues";
        WEBHOOK_GRANT_MISSING: Error ["grant", "failures"]
            "The database user lacks a privilege the service needs (`grant`: the statement to \
             run; docs/operations.md, \"Database grants\"): logged when the database becomes \
             ready, and for statements the server refuses at most once per 10 s, `failures` \
             counting them since the last line (0 at readiness)";
        WEBHOOK_LOCAL_FAILURE: Warning ["reason", "request", "hook", "given_back", "failures"]
            "This process could not send a request (reason no-descriptor, no-memory, \
             no-local-port, no-buffer-space) before anything reached the receiver: nothing \
             written, the row given back queued (`given_back` false: it waits out the lease); \
             at most one line per 10 s, `failures` counting the attempts since the last line";
        WEBHOOK_ROW_DB_ERROR: Warning ["error", "request", "hook"]
            "A database error in one row's steps: the row is left queued for a later poll; \
             logged for the first such row only, again after a row's steps end otherwise";
        WEBHOOK_POLLED: Debug @ "poll"
            ["fetched", "started", "skipped_local", "excluded_busy", "broken", "more_waiting"]
            "A poll round: candidate rows fetched, started, skipped because this process is on \
             their hook, hooks left out as busy here, rows failed as unusable, and whether more \
             is waiting (every round)";
        WEBHOOK_POSTED: Debug @ "delivery" ["request", "hook", "host", "result", "elapsed_ms"]
            "A POST ended, before its result is written: `result` is the HTTP status or the \
             failure (every attempt)";
        WEBHOOK_DELIVERED: Info ["request", "hook", "code"] "A 2xx was written back";
        WEBHOOK_DELIVERY_FAILED: Warning ["request", "hook", "code", "reason", "status", "host"]
            "A failure was written back: `code` is the `errorCode` written, `reason` the \
             readable reason (the `class` label of `deliveries_total`: `4xx`, `timeout`, \
             `hook` when no POST was made…), `status` the row's new status, `host` the hook \
             URI's host when a POST was attempted (absent for `hook` failures). Phorge's \
             Herald webhook pages show each request";
        WEBHOOK_INVALID_PROPERTIES: Warning ["request", "error", "bytes"]
            "A `properties` column could not be used (failed as `hook`/`invalid-properties`)";
        WEBHOOK_POLICY_BLOCKED: Warning ["request", "hook", "host", "reason"]
            "A hook URI was refused by the outbound policy";
        WEBHOOK_CLAIM_LOST: Debug @ "claim" ["request", "seen_version"] "Another claimant won a row";
        WEBHOOK_RESULT_TAKEN_OVER: Warning ["request", "version", "status"]
            "A result write found the row re-claimed after the lease; dropped";
        WEBHOOK_RESULT_WRITE_RETRY: Warning ["request", "error", "lease_left_ms"]
            "A result write failed; retried (0.2 s doubling to 2 s) while the claim's lease \
             protects the row — logged once per row";
        WEBHOOK_RESULT_WRITE_RECOVERED: Info ["request", "retries"]
            "A retried result write landed";
        WEBHOOK_RESULT_WRITE_ABANDONED: Warning ["request", "error", "retries", "why"]
            "The lease ran out before the database came back: the row will be delivered again";
        WEBHOOK_INVALID_ROW: Warning ["id", "reason", "why", "code", "status", "hook"]
            "A row was failed with `hook`/`invalid-row` — once per row; `hook` when the hook's \
             row was unreadable, `code` and `status` when a candidate's columns were";
        WEBHOOK_ROW_REJECTED: Warning ["id", "error", "gives_up_after"]
            "The server rejected a statement about a row (first time only; failed as \
             `invalid-row` after `gives_up_after` attempts)";
        WEBHOOK_ROW_QUARANTINED: Warning ["id", "error", "effect"]
            "A row that could not even be failed is skipped until restart (once per row)";
        WEBHOOK_ROW_UNADDRESSABLE: Warning ["rows", "why"]
            "Candidate rows whose id/version are unreadable are skipped (once per process)";
        WEBHOOK_OBJECT_SELECT_REFUSED: Warning ["database", "grant", "error", "effect"]
            "A SELECT on an application table was refused or the table is missing: the \
             `grant` that fixes it; once per database";
        WEBHOOK_OBJECT_TYPE_UNKNOWN: Warning ["phid_type", "effect"]
            "A PHID type not in Phorge's table: delivered unchecked; once per type";
        WEBHOOK_OBJECT_UNCHECKED: Info ["phid_type", "why"]
            "A PHID type without object/transaction table (e.g. `APPS`); once per type";
        WEBHOOK_BREAKER_OPEN: Warning ["hook", "failures", "threshold", "window_sec"]
            "A hook's breaker opened — once per change, never per row";
        WEBHOOK_BREAKER_CLOSED: Info ["hook", "failures"] "A hook's breaker closed again";
        WEBHOOK_LOCK_RELEASE_FAILED: Warning ["hook", "error"]
            "`RELEASE_LOCK` failed; the connection is closed and its session killed from a \
             fresh connection, which frees the lock";
        WEBHOOK_LOCK_CHECK_FAILED: Warning ["error", "effect"]
            "The poll round's check of which hooks' locks are held elsewhere failed; rows go \
             to `GET_LOCK` as they would without it — once until the check works again";
        WEBHOOK_API_DB_ERROR: Warning ["path", "error"]
            "An API call hit a database error (the client gets a 500 without details)";
        WEBHOOK_POLL_LOOP_DIED: Error ["why"]
            "The poll loop ended outside a shutdown: `/readyz` fails and the process exits \
             with code 3";
        WEBHOOK_FAILED: Error ["error"] "A runtime failure stopped the service (exit 1)";
        WEBHOOK_DRAINED: Info []
            "After SIGTERM, every in-flight delivery finished and wrote its result";
    ];
}
