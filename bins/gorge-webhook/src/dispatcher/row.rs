//! The per-request steps (docs/webhook.md, "Per-request steps") for one candidate, top to
//! bottom:
//!
//! parse `properties` → load the hook → per-hook lock → breaker → outbound policy (resolves
//! the host; after the lock and breaker so skipped rows resolve nothing) → load the object
//! and its transactions as Phorge does → claim → POST → write the result (only while the
//! row is still ours) → the hook's next rows under the same lock, then release it
//! (`hold.rs`).
//!
//! Nothing is written before the claim is won, except for rows that cannot be claimed at
//! all (see [`Dispatcher::row_rejected`]), which are failed with a compare-and-set of their
//! own.

use std::time::Duration;

use gorge_claim::{Candidate, Claim, ClaimError, Hook, HookLock, ObjectLoad, Unchecked};
use phorge_wire::values::{HookErrorCode, HookStatus};
use phorge_wire::webhook::{sign, PropertiesError, RequestProperties, WebhookPayload};
use tokio::sync::OwnedSemaphorePermit;

use super::end::RowEnd;
use super::hold::Held;
use super::state::Slot;
use super::Dispatcher;
use crate::delivery::{DeliveryError, Route};
use crate::events;
use crate::outcome;
use crate::outcome::{Decision, InvalidRowReason, SkipReason};
use gorge_service::emit;

/// How long a hook with an open breaker is left alone before its breaker is checked again.
/// Failures age out of the window one by one, so checking more often gains little.
const BREAKER_REST: Duration = Duration::from_secs(5);

/// Shortest rest of a hook whose lock is held elsewhere (before jitter). The holder is most
/// often another gorge-webhook process running through the hook's rows (`hold.rs`, at most
/// 1 s), or Phorge's worker sending one request: both let go soon, and a replica that
/// waited a whole poll interval for every such hook left most of the hooks idle (see
/// [`lock_busy_rest`]).
const LOCK_BUSY_REST_MIN: Duration = Duration::from_millis(50);

/// How long a hook whose lock was just found held elsewhere is left out of the candidate
/// query: as long as it has been found held at every try so far (`busy_for`, milliseconds),
/// at least [`LOCK_BUSY_REST_MIN`], at most the poll interval, then times `jitter` in
/// [0.5, 1.5) (so 25 ms to 1.5 poll intervals in all).
///
/// So the tries back off like doubling: a lock let go soon is taken again soon, one held
/// for long (a session left behind, a long delivery) is tried once per poll interval as
/// before. The jitter keeps replicas that lost the same lock from all trying again at the
/// same moment.
pub(super) fn lock_busy_rest(busy_for: u64, poll_interval: Duration, jitter: f64) -> Duration {
    let cap = poll_interval.as_millis() as u64;
    let base = busy_for.max(LOCK_BUSY_REST_MIN.as_millis() as u64).min(cap);
    Duration::from_millis((base as f64 * jitter.clamp(0.5, 1.5)) as u64)
}

/// A number in [0.5, 1.5) that differs between processes, hooks and moments (std's
/// randomly keyed hasher; no randomness crate needed for a jitter).
fn jitter_of(hook: &str, now_ms: u64) -> f64 {
    use std::hash::BuildHasher;
    let hash = std::collections::hash_map::RandomState::new().hash_one((hook, now_ms));
    0.5 + (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// Times the server may reject a statement for the same row before the row is failed
/// with `invalid-row` (a poison row must not be retried every poll forever).
pub(super) const MAX_ROW_ATTEMPTS: u32 = 3;

/// First and longest pause between attempts to write a result. Attempts go on while the
/// claim's lease protects the row: giving up earlier means a duplicate POST after the lease.
const WRITE_RETRY_FIRST: Duration = Duration::from_millis(200);
const WRITE_RETRY_MAX: Duration = Duration::from_secs(2);

/// What the poll round read for a row, for all its rows at once (see `poll.rs`): its
/// parsed properties with its object (loaded for usable properties only), its hook
/// (`None`: no such hook; `Err`: unreadable columns), and the hook's recent failures.
pub(super) struct Preload {
    pub properties: Result<(RequestProperties, ObjectLoad), PropertiesError>,
    pub hook: Option<Result<Hook, &'static str>>,
    pub failures: u64,
}

impl Dispatcher {
    pub(super) async fn work(
        self: std::sync::Arc<Self>,
        candidate: Candidate,
        permit: OwnedSemaphorePermit,
        preload: Preload,
    ) {
        // Cleans up on every exit, a panic included, so a row or hook is never stuck as
        // "in flight here".
        let _slot = Slot {
            dispatcher: &self,
            row: candidate.id,
            hook: &candidate.webhook_phid,
            _permit: permit,
        };
        self.metrics.in_flight.inc();
        let mut held = None;
        let end = self
            .process(&candidate, preload, &mut held)
            .await
            .unwrap_or_else(RowEnd::from);
        let go_on = end.delivered();
        self.finish_row(&candidate, end).await;
        if let Some(held) = held {
            // The hook's next rows under the same lock (`hold.rs`), which then releases it.
            self.hold(held, candidate.id, go_on).await;
        }
    }

    /// The per-request steps for one candidate, in the order of this module's doc. When the
    /// hook's lock was taken, it is left in `held` (not released) with the hook, for the
    /// caller to go on with the hook's next rows.
    async fn process(
        &self,
        candidate: &Candidate,
        preload: Preload,
        held: &mut Option<Held>,
    ) -> Result<RowEnd, ClaimError> {
        // 1. Properties.
        let (properties, object) = match preload.properties {
            Ok(loaded) => loaded,
            Err(err) => {
                emit!(self.log, events::WEBHOOK_INVALID_PROPERTIES;
                    "request" => &candidate.phid, "error" => %err,
                    "bytes" => candidate.properties.len());
                let decision = outcome::not_attempted(
                    HookErrorCode::InvalidProperties,
                    err.rewritten_properties(),
                );
                return self
                    .fail_before_delivery(candidate, decision, &mut None)
                    .await;
            }
        };
        // 2. The hook.
        let hook = match preload.hook {
            Some(Ok(hook)) => hook,
            None => {
                return self
                    .fail_hook(candidate, &properties, HookErrorCode::NotFound, &mut None)
                    .await
            }
            Some(Err(why)) => {
                let end = self
                    .fail_hook(candidate, &properties, HookErrorCode::InvalidRow, &mut None)
                    .await?;
                self.metrics.invalid_row(InvalidRowReason::HookRow);
                emit!(self.log, events::WEBHOOK_INVALID_ROW;
                    "id" => candidate.id, "reason" => InvalidRowReason::HookRow.label(),
                    "why" => why, "hook" => &candidate.webhook_phid);
                return Ok(end);
            }
        };
        // Phorge's `isDisabled()` compares with `disabled` only; other values deliver.
        if hook.hook_status() == Some(HookStatus::Disabled) {
            return self
                .fail_hook(candidate, &properties, HookErrorCode::Disabled, &mut None)
                .await;
        }
        // 3. One delivery per hook across every process (and Phorge's own worker).
        let Some(mut lock) = self.store.try_hook_lock(&hook.phid).await? else {
            self.lock_held_elsewhere(&hook.phid);
            return Ok(RowEnd::Skipped(SkipReason::HookBusy));
        };
        let since = self.clock.now_ms();
        self.local_state().lock_busy.remove(&hook.phid);
        let result = self
            .deliver_locked(
                candidate,
                &hook,
                preload.failures,
                (properties, object),
                &mut lock,
                &mut None,
            )
            .await;
        *held = Some(Held {
            lock,
            hook,
            failures: preload.failures,
            since,
        });
        result
    }

    /// Steps 4–9, with the hook lock held. `claimed`: the row's claim when it was won
    /// already (with the other rows of a hold, `hold.rs`); taken when the steps reach the
    /// claim, and left in place when they end before it.
    pub(super) async fn deliver_locked(
        &self,
        candidate: &Candidate,
        hook: &Hook,
        failures: u64,
        (properties, object): (RequestProperties, ObjectLoad),
        lock: &mut HookLock,
        claimed: &mut Option<Claim>,
    ) -> Result<RowEnd, ClaimError> {
        let properties = &properties;
        // 4. Breaker (failures counted when the round started).
        if self.note_breaker(&hook.phid, failures) {
            self.rest(&hook.phid, BREAKER_REST);
            return Ok(RowEnd::Skipped(SkipReason::BreakerOpen));
        }
        // 5. Outbound policy: resolve once, check every address, keep them for the connect.
        let route = match self.deliverer.route(&hook.uri).await {
            Ok(route) => route,
            Err(err) => {
                self.metrics.policy_blocks.inc();
                emit!(self.log, events::WEBHOOK_POLICY_BLOCKED;
                    "request" => &candidate.phid, "hook" => &hook.phid,
                    "host" => uri_host(&hook.uri), "reason" => %err);
                return self
                    .fail_hook(candidate, properties, HookErrorCode::Uri, claimed)
                    .await;
            }
        };
        // 6. The object and its transactions, as Phorge's worker loads them.
        let transactions = match object {
            ObjectLoad::Missing => {
                return self
                    .fail_hook(candidate, properties, HookErrorCode::Object, claimed)
                    .await
            }
            ObjectLoad::Found {
                transactions,
                unchecked,
            } => {
                if let Some(unchecked) = unchecked {
                    self.note_unchecked(&unchecked);
                }
                transactions
            }
        };
        // 7. Claim.
        let claim = match self.claim(candidate, claimed).await? {
            Ok(claim) => claim,
            Err(end) => return Ok(end),
        };
        // 8. POST.
        let mut loaded = properties.clone();
        loaded.transaction_phids = transactions;
        let payload = WebhookPayload::from_properties(
            &candidate.object_phid,
            &loaded,
            candidate.date_created,
        );
        let body = payload.encode_body();
        let signature = sign(hook.hmac_key.as_bytes(), &body);
        let result = match route {
            Route::Checked(target) => {
                let started = std::time::Instant::now();
                let result = self.deliverer.deliver(target, &body, &signature).await;
                self.metrics
                    .attempt_duration_seconds
                    .observe(started.elapsed().as_secs_f64());
                emit!(self.log, events::WEBHOOK_POSTED;
                    "request" => &candidate.phid, "hook" => &hook.phid,
                    "host" => uri_host(&hook.uri),
                    "result" => match &result {
                        Ok(status) => status.to_string(),
                        Err(err) => format!("{err:?}"),
                    },
                    "elapsed_ms" => started.elapsed().as_millis() as u64);
                result
            }
            // No request: nothing was timed or posted.
            Route::Unresolved => Err(DeliveryError::Dns),
        };
        if result == Err(DeliveryError::BlockedRedirect) {
            self.metrics.policy_blocks.inc();
        }
        // 9. The outcome, in Phorge's values.
        let decision = outcome::after_attempt(properties, result, self.clock.now_sec());
        self.write(
            candidate,
            &claim,
            decision,
            Some(uri_host(&hook.uri)),
            Some(lock),
        )
        .await
    }

    /// Notes that `hook`'s lock was found held by another session, and rests the hook for
    /// [`lock_busy_rest`].
    pub(super) fn lock_held_elsewhere(&self, hook: &str) {
        let now = self.clock.now_ms();
        // Tries of a hook that stays locked come at most a rest (1.5 poll intervals) and a
        // poll interval apart; a longer gap means nobody looked in between.
        let max_gap = 3 * self.config.poll_interval.as_millis() as u64;
        let busy_for = self.local_state().lock_busy(hook, now, max_gap);
        let rest = lock_busy_rest(busy_for, self.config.poll_interval, jitter_of(hook, now));
        self.rest(hook, rest);
    }

    /// Leaves `hook` alone for `duration` of clock time (the candidate query excludes it).
    pub(super) fn rest(&self, hook: &str, duration: std::time::Duration) {
        let until = self.clock.now_ms() + duration.as_millis() as u64;
        self.local_state().resting.insert(hook.to_string(), until);
    }

    /// Counts a delivery whose object or transactions could not be checked, and logs it
    /// once per PHID type or database.
    fn note_unchecked(&self, unchecked: &Unchecked) {
        self.metrics.object_unchecked(match unchecked {
            Unchecked::UnknownType(_) => "unknown-type",
            Unchecked::NoTable(_) => "no-table",
            Unchecked::Refused { .. } => "refused",
        });
        match unchecked {
            Unchecked::UnknownType(kind) => {
                if self.local_state().first_time(format!("type:{kind}")) {
                    emit!(self.log, events::WEBHOOK_OBJECT_TYPE_UNKNOWN;
                        "phid_type" => kind,
                        "effect" => "delivered without checking the object; transactions as stored");
                }
            }
            Unchecked::NoTable(kind) => {
                if self.local_state().first_time(format!("notable:{kind}")) {
                    emit!(self.log, events::WEBHOOK_OBJECT_UNCHECKED;
                        "phid_type" => kind, "why" => "no object or transaction table");
                }
            }
            Unchecked::Refused {
                database,
                grant,
                error,
            } => {
                if self.local_state().first_time(format!("db:{database}")) {
                    emit!(self.log, events::WEBHOOK_OBJECT_SELECT_REFUSED;
                        "database" => database, "grant" => grant, "error" => error,
                        "effect" => "delivered with transactions in stored order");
                }
            }
        }
    }

    /// Claims `candidate`, or takes its claim from `claimed` when it was won already; how
    /// the row ends instead when the claim is lost, or when shutdown began (nothing new
    /// starts then: only rows already claimed are finished, and a claim left in `claimed`
    /// is given back by its hold).
    async fn claim(
        &self,
        candidate: &Candidate,
        claimed: &mut Option<Claim>,
    ) -> Result<Result<Claim, RowEnd>, ClaimError> {
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(Err(RowEnd::NotClaimed { lost: false }));
        }
        if let Some(claim) = claimed.take() {
            self.metrics.claim_won();
            return Ok(Ok(claim));
        }
        match self.store.claim(candidate, self.clock.now_sec()).await? {
            Some(claim) => {
                self.metrics.claim_won();
                Ok(Ok(claim))
            }
            None => Ok(Err(RowEnd::NotClaimed { lost: true })),
        }
    }

    /// Writes `decision` while the row is still ours. Database errors are retried for as
    /// long as the claim's lease protects the row (never a taken-over row, never a statement
    /// the server rejects). `host`: the hook URI's host when a POST was attempted. With
    /// `lock`, the first attempt runs on the lock's session: if that session is gone the
    /// write goes through the pool at once, and the caller sees the lock no longer held (a
    /// hold stops before the hook's next POST; see `hold.rs`).
    async fn write(
        &self,
        candidate: &Candidate,
        claim: &Claim,
        decision: Decision,
        host: Option<String>,
        mut lock: Option<&mut HookLock>,
    ) -> Result<RowEnd, ClaimError> {
        let write = &decision.row;
        let lease_end_ms = (claim.version + self.config.timing.lease_sec) * 1000;
        let mut pause = WRITE_RETRY_FIRST;
        let mut retries = 0u32;
        let landed = loop {
            let now = self.clock.now_sec();
            let out = match lock.take() {
                Some(lock) if lock.is_held() => {
                    match self.store.write_result_on(lock, claim, write, now).await {
                        // The session was given up: straight on through the pool.
                        Err(err) if !err.is_row_data_error() => continue,
                        out => out,
                    }
                }
                _ => self.store.write_result(claim, write, now).await,
            };
            match out {
                Ok(landed) => break landed,
                Err(err) if err.is_row_data_error() => return Err(err),
                Err(err) => {
                    if matches!(err, ClaimError::Timeout(_)) {
                        self.metrics.db_timeouts.inc();
                    }
                    let now = self.clock.now_ms();
                    if now + pause.as_millis() as u64 >= lease_end_ms {
                        emit!(self.log, events::WEBHOOK_RESULT_WRITE_ABANDONED;
                            "request" => &candidate.phid, "error" => %err, "retries" => retries,
                            "why" => "the claim's lease ran out; the row will be delivered again");
                        return Err(err);
                    }
                    self.metrics.result_write_retries.inc();
                    if retries == 0 {
                        emit!(self.log, events::WEBHOOK_RESULT_WRITE_RETRY;
                            "request" => &candidate.phid, "error" => %err,
                            "lease_left_ms" => lease_end_ms - now);
                    }
                    retries += 1;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(WRITE_RETRY_MAX);
                }
            }
        };
        self.made_progress();
        if retries > 0 {
            emit!(self.log, events::WEBHOOK_RESULT_WRITE_RECOVERED;
                "request" => &candidate.phid, "retries" => retries);
        }
        Ok(RowEnd::Written {
            decision,
            version: claim.version,
            landed,
            host,
        })
    }

    async fn fail_hook(
        &self,
        candidate: &Candidate,
        properties: &RequestProperties,
        code: HookErrorCode,
        claimed: &mut Option<Claim>,
    ) -> Result<RowEnd, ClaimError> {
        let decision = outcome::without_attempt(code, properties);
        self.fail_before_delivery(candidate, decision, claimed)
            .await
    }

    /// A terminal failure without a POST, written only after winning the claim so that two
    /// processes never both write it.
    async fn fail_before_delivery(
        &self,
        candidate: &Candidate,
        decision: Decision,
        claimed: &mut Option<Claim>,
    ) -> Result<RowEnd, ClaimError> {
        let claim = match self.claim(candidate, claimed).await? {
            Ok(claim) => claim,
            Err(end) => return Ok(end),
        };
        self.write(candidate, &claim, decision, None, None).await
    }

    /// The server rejected a statement about row `id` (e.g. the claim UPDATE is out of
    /// range). Logged once; after [`MAX_ROW_ATTEMPTS`] the row is failed with
    /// `invalid-row` without a claim, or, if even that is rejected, left alone for the
    /// life of the process (one more log line).
    pub(super) async fn row_rejected(
        &self,
        id: u64,
        err: &ClaimError,
        candidate: Option<&Candidate>,
    ) {
        let attempts = self.local_state().row_failed(id);
        if attempts == 1 {
            emit!(self.log, events::WEBHOOK_ROW_REJECTED;
                "id" => id, "error" => %err, "gives_up_after" => MAX_ROW_ATTEMPTS);
        }
        if attempts < MAX_ROW_ATTEMPTS {
            return;
        }
        self.local_state().row_errors.remove(&id);
        if let Some(candidate) = candidate {
            let properties = outcome::invalid_row_properties(Some(&candidate.properties));
            match self
                .store
                .fail_unclaimable(id, candidate.date_modified, &properties)
                .await
            {
                Ok(true) => {
                    self.invalid_row(
                        id,
                        InvalidRowReason::Rejected,
                        "the server rejected its claim or result write",
                    );
                    return;
                }
                // Someone else changed the row meanwhile: nothing left to do here.
                Ok(false) => return,
                Err(_) => {}
            }
        }
        self.local_state().quarantine(id);
        self.metrics.rows_quarantined.inc();
        emit!(self.log, events::WEBHOOK_ROW_QUARANTINED;
            "id" => id, "error" => %err,
            "effect" => "skipped by this process until it restarts; fix or delete the row");
    }
}

/// The host of a hook URI for logs: URIs may carry credentials in the path or query.
fn uri_host(uri: &str) -> String {
    uri.parse::<hyper::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_string))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{jitter_of, lock_busy_rest};

    const POLL: Duration = Duration::from_millis(1000);

    #[test]
    fn a_lock_found_held_for_the_first_time_is_tried_again_soon() {
        assert_eq!(lock_busy_rest(0, POLL, 1.0), Duration::from_millis(50));
        assert_eq!(lock_busy_rest(0, POLL, 0.5), Duration::from_millis(25));
    }

    #[test]
    fn the_rest_grows_with_how_long_the_lock_has_been_held_up_to_the_poll_interval() {
        assert_eq!(lock_busy_rest(120, POLL, 1.0), Duration::from_millis(120));
        assert_eq!(lock_busy_rest(900, POLL, 1.0), Duration::from_millis(900));
        assert_eq!(lock_busy_rest(60_000, POLL, 1.0), POLL);
        assert_eq!(
            lock_busy_rest(60_000, POLL, 1.49),
            Duration::from_millis(1490)
        );
        // A poll interval below the minimum caps the rest too.
        let fast = Duration::from_millis(20);
        assert_eq!(lock_busy_rest(0, fast, 1.0), fast);
    }

    #[test]
    fn jitter_stays_in_its_range_and_varies() {
        let samples: Vec<f64> = (0..200).map(|t| jitter_of("PHID-HWBH-x", t)).collect();
        assert!(
            samples.iter().all(|j| (0.5..1.5).contains(j)),
            "{samples:?}"
        );
        let low = samples.iter().filter(|j| **j < 1.0).count();
        assert!((40..160).contains(&low), "{low} of 200 below 1.0");
    }
}
