//! One row's way, top to bottom (docs/webhook.md, "Per-request steps"):
//!
//! [`Dispatcher::work`] holds the row's slot; `process` runs steps 1–3 (parse `properties`,
//! the hook, the hook's lock); with the lock held, `plan` runs steps 4–6 (breaker, outbound
//! policy — resolving the host only after the lock and breaker, so rows skipped this round
//! resolve nothing — and the object as Phorge loads it) and decides what the claim will be
//! used for; `claim` (7) makes the row ours; `post` (8) sends it, or takes the outcome a hook
//! error decided without a POST; `record` (9) writes the result while the row is still ours
//! — or, when this process could not send at all (no descriptor, memory or local port:
//! [`Shortage`]), `give_back` returns the row as it was, queued, for a later try;
//! `finish` counts and logs how the row ended ([`RowEnd`]); then the hook's next rows go
//! under the same lock (`hold.rs`).
//!
//! Each state of the row is a type, and each step takes the one before by value: a
//! [`Planned`] row is claimed into a [`Claimed`] one, only a `Claimed` row is posted into a
//! [`Posted`] one, and only a `Posted` row's result is recorded. Nothing is written before
//! the claim is won, except for rows that cannot be claimed at all
//! ([`Dispatcher::row_rejected`], `poll.rs`), which are failed with a compare-and-set of
//! their own.

use std::time::Duration;

use gorge_claim::{Candidate, Claim, ClaimError, Hook, HookLock, ObjectLoad, Unchecked};
use phorge_wire::values::{HookErrorCode, HookStatus};
use phorge_wire::webhook::{sign, PropertiesError, RequestProperties, WebhookPayload};
use tokio::sync::OwnedSemaphorePermit;

use super::hold::Held;
use super::state::Slot;
use super::Dispatcher;
use crate::delivery::{DeliveryError, Route, Shortage};
use crate::events;
use crate::outcome::{self, Decision, DeliveryOutcome, InvalidRowReason, SkipReason};
use gorge_service::emit;

/// How long a hook with an open breaker is left alone before its breaker is checked again.
/// Failures age out of the window one by one, so checking more often gains little.
const BREAKER_REST: Duration = Duration::from_secs(5);

/// Of a claim's lease, what a POST that ran past its timeout (its process stood still) must
/// leave for the result write: a write takes milliseconds, and retries go on to the lease's
/// end (`record`).
const RESULT_WRITE_ROOM: Duration = Duration::from_secs(2);

/// First and longest pause between attempts to write a result. Attempts go on while the
/// claim's lease protects the row: giving up earlier means a duplicate POST after the lease.
const WRITE_RETRY_FIRST: Duration = Duration::from_millis(200);
const WRITE_RETRY_MAX: Duration = Duration::from_secs(2);

/// What the poll round read for a row, for all its rows at once (see `poll.rs`): its
/// parsed properties with its object (loaded for usable properties only), its hook
/// (`None`: no such hook; `Err`: unreadable columns), and the hook's recent failures.
pub(super) struct Preload {
    pub properties: Result<Request, PropertiesError>,
    pub hook: Option<Result<Hook, &'static str>>,
    pub failures: u64,
}

/// A request's parsed `properties` and its object as Phorge's worker loads it.
pub(super) type Request = (RequestProperties, ObjectLoad);

/// Steps 1–6 are through and nothing is written yet: what the claim will be used for.
pub(super) struct Planned<'r> {
    row: &'r Candidate,
    attempt: Attempt<'r>,
}

/// What a claimed row gets.
enum Attempt<'r> {
    /// The signed POST to the addresses the policy checked (steps 8–9).
    Post {
        hook: &'r Hook,
        route: Route,
        properties: RequestProperties,
        /// The request's transactions as Phorge's worker loads them, newest first.
        transactions: Vec<String>,
    },
    /// A hook error found on the way: written without a POST.
    NoPost(Decision),
}

impl<'r> Planned<'r> {
    /// A row that ends in `decision` without a POST (it still needs its claim).
    fn no_post(row: &'r Candidate, decision: Decision) -> Self {
        Planned {
            row,
            attempt: Attempt::NoPost(decision),
        }
    }
}

/// Step 7 won: the row is ours while its `dateModified` is the claim's version.
pub(super) struct Claimed<'r> {
    row: &'r Candidate,
    claim: Claim,
    attempt: Attempt<'r>,
}

/// Step 8 is over: the outcome to write back, of the row's POST or of the hook error that
/// allowed none.
pub(super) struct Posted<'r> {
    row: &'r Candidate,
    claim: Claim,
    decision: Decision,
    /// The hook URI's host when a POST was attempted.
    host: Option<String>,
}

/// How one row's way ended.
pub(super) enum RowEnd {
    /// Left queued for a later poll, untouched (hook busy elsewhere, breaker open).
    Skipped(SkipReason),
    /// Not claimed: another claimant won (`lost`), or shutdown began before the claim.
    NotClaimed { lost: bool },
    /// A result was written for the claim at `version`: `landed` unless the row had been
    /// re-claimed after the lease. `host`: the hook URI's host when a POST was attempted.
    Written {
        decision: Decision,
        version: u64,
        landed: bool,
        host: Option<String>,
    },
    /// This process could not send (nothing reached the receiver): nothing was written, the
    /// claim was given back (`returned`: the row is at its version from before the claim;
    /// else it waits out the lease), the row stays queued.
    Local { shortage: Shortage, returned: bool },
    /// A database error: the row stays queued for a later poll.
    DbError(ClaimError),
    /// The server rejected a statement about this row (see [`Dispatcher::row_rejected`]).
    Rejected(ClaimError),
}

impl RowEnd {
    /// The row was POSTed, answered 2xx, and its `sent` result landed: the hook is taking
    /// requests, so its next rows may follow under the same lock.
    pub(super) fn delivered(&self) -> bool {
        matches!(self, RowEnd::Written { decision, landed: true, host: Some(_), .. }
            if decision.outcome == DeliveryOutcome::Sent)
    }
}

impl From<ClaimError> for RowEnd {
    fn from(err: ClaimError) -> Self {
        if err.is_row_data_error() {
            RowEnd::Rejected(err)
        } else {
            RowEnd::DbError(err)
        }
    }
}

impl Dispatcher {
    /// One row's whole way, in its slot (a concurrency permit, and the row and its hook
    /// marked in flight here until the way ends, a panic included).
    pub(super) async fn work(
        self: std::sync::Arc<Self>,
        candidate: Candidate,
        permit: OwnedSemaphorePermit,
        preload: Preload,
    ) {
        let _slot = Slot {
            dispatcher: &self,
            row: candidate.id,
            hook: &candidate.webhook_phid,
            _permit: permit,
        };
        self.metrics.in_flight.inc();
        let (end, held) = self.process(&candidate, preload).await;
        let go_on = end.delivered();
        self.finish(&candidate, end).await;
        if let Some(held) = held {
            // The hook's next rows under the same lock (`hold.rs`), which then releases it.
            self.hold(held, candidate.id, go_on).await;
        }
    }

    /// Steps 1–3, then the rest of the way under the hook's lock. Returns how the row
    /// ended and, when the lock was taken, the hook's lock still held, for its next rows.
    async fn process(&self, row: &Candidate, preload: Preload) -> (RowEnd, Option<Held>) {
        // 1. Properties.
        let request = match preload.properties {
            Ok(request) => request,
            Err(err) => {
                emit!(self.log, events::WEBHOOK_INVALID_PROPERTIES;
                    "request" => &row.phid, "error" => %err, "bytes" => row.properties.len());
                let decision = outcome::not_attempted(
                    HookErrorCode::InvalidProperties,
                    err.rewritten_properties(),
                );
                return (
                    self.without_lock(Planned::no_post(row, decision)).await,
                    None,
                );
            }
        };
        let properties = &request.0;
        // 2. The hook.
        let hook = match preload.hook {
            Some(Ok(hook)) => hook,
            None => {
                let decision = outcome::without_attempt(HookErrorCode::NotFound, properties);
                return (
                    self.without_lock(Planned::no_post(row, decision)).await,
                    None,
                );
            }
            Some(Err(why)) => {
                let decision = outcome::without_attempt(HookErrorCode::InvalidRow, properties);
                let end = self.without_lock(Planned::no_post(row, decision)).await;
                if !matches!(end, RowEnd::DbError(_) | RowEnd::Rejected(_)) {
                    self.metrics.invalid_row(InvalidRowReason::HookRow);
                    emit!(self.log, events::WEBHOOK_INVALID_ROW;
                        "id" => row.id, "reason" => InvalidRowReason::HookRow.label(),
                        "why" => why, "hook" => &row.webhook_phid);
                }
                return (end, None);
            }
        };
        // Phorge's `isDisabled()` compares with `disabled` only; other values deliver.
        if hook.hook_status() == Some(HookStatus::Disabled) {
            let decision = outcome::without_attempt(HookErrorCode::Disabled, properties);
            return (
                self.without_lock(Planned::no_post(row, decision)).await,
                None,
            );
        }
        // 3. One delivery per hook across every process (and Phorge's own worker).
        let mut lock = match self.store.try_hook_lock(&hook.phid).await {
            Ok(Some(lock)) => lock,
            Ok(None) => {
                self.lock_held_elsewhere(&hook.phid);
                return (RowEnd::Skipped(SkipReason::HookBusy), None);
            }
            Err(err) => return (RowEnd::from(err), None),
        };
        let since = self.clock.now_ms();
        self.local_state().lock_busy.remove(&hook.phid);
        let (end, _) = self
            .under_lock(row, &hook, preload.failures, request, &mut lock, None)
            .await;
        let held = Held {
            lock,
            hook,
            failures: preload.failures,
            since,
        };
        (end, Some(held))
    }

    /// Steps 4–9 with the hook's `lock` held: plan → claim → post → record. `won`: the row's
    /// claim when it was won already (with the other rows of a hold, `hold.rs`); returned,
    /// unused, when the way ends before the claim step.
    pub(super) async fn under_lock(
        &self,
        row: &Candidate,
        hook: &Hook,
        failures: u64,
        request: Request,
        lock: &mut HookLock,
        won: Option<Claim>,
    ) -> (RowEnd, Option<Claim>) {
        let planned = match self.plan(row, hook, failures, request).await {
            Ok(planned) => planned,
            Err(end) => return (end, won),
        };
        let claimed = match self.claim(planned, won).await {
            Ok(claimed) => claimed,
            Err(ended) => return ended,
        };
        let posted = match self.post(claimed).await {
            Ok(posted) => posted,
            Err((claim, shortage)) => return (self.give_back(row, claim, shortage).await, None),
        };
        // A POST's result goes first through the lock's session (see `record`).
        let session = posted.host.is_some().then_some(lock);
        (self.record(posted, session).await, None)
    }

    /// Steps 7–9 for a row that ends in a hook error before its hook's lock: its claim, then
    /// the outcome written.
    async fn without_lock(&self, planned: Planned<'_>) -> RowEnd {
        let planned_row = planned.row;
        match self.claim(planned, None).await {
            Ok(claimed) => match self.post(claimed).await {
                Ok(posted) => self.record(posted, None).await,
                Err((claim, shortage)) => self.give_back(planned_row, claim, shortage).await,
            },
            Err((end, _)) => end,
        }
    }

    /// Steps 4–6, with the hook's lock held and nothing written yet: the breaker (open: the
    /// row ends untouched), the outbound policy (the host resolved once, every address
    /// checked and kept for the connect), the object and its transactions. What the claim
    /// will be used for.
    async fn plan<'r>(
        &self,
        row: &'r Candidate,
        hook: &'r Hook,
        failures: u64,
        (properties, object): Request,
    ) -> Result<Planned<'r>, RowEnd> {
        // 4. Breaker (failures counted when the round started).
        if self.note_breaker(&hook.phid, failures) {
            self.rest(&hook.phid, BREAKER_REST);
            return Err(RowEnd::Skipped(SkipReason::BreakerOpen));
        }
        // 5. Outbound policy.
        let route = match self.deliverer.route(&hook.uri).await {
            Ok(route) => route,
            Err(err) => {
                self.metrics.policy_blocks.inc();
                if self.local_state().blocked_first_time(row.id) {
                    emit!(self.log, events::WEBHOOK_POLICY_BLOCKED;
                        "request" => &row.phid, "hook" => &hook.phid,
                        "host" => uri_host(&hook.uri), "reason" => %err);
                }
                let decision = outcome::without_attempt(HookErrorCode::Uri, &properties);
                return Ok(Planned::no_post(row, decision));
            }
        };
        // 6. The object and its transactions, as Phorge's worker loads them.
        let transactions = match object {
            ObjectLoad::Missing => {
                let decision = outcome::without_attempt(HookErrorCode::Object, &properties);
                return Ok(Planned::no_post(row, decision));
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
        let attempt = Attempt::Post {
            hook,
            route,
            properties,
            transactions,
        };
        Ok(Planned { row, attempt })
    }

    /// Step 7: the row becomes ours, or its way ends — another claimant won, shutdown began
    /// (nothing new starts then: only rows already claimed are finished), a database error.
    /// `won`: a claim won already (a hold's), taken here; on an end before it is used, it is
    /// handed back with the end, for its hold to give back.
    async fn claim<'r>(
        &self,
        planned: Planned<'r>,
        won: Option<Claim>,
    ) -> Result<Claimed<'r>, (RowEnd, Option<Claim>)> {
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return Err((RowEnd::NotClaimed { lost: false }, won));
        }
        let claim = match won {
            Some(claim) => claim,
            None => match self.store.claim(planned.row, self.clock.now_sec()).await {
                Ok(Some(claim)) => claim,
                Ok(None) => return Err((RowEnd::NotClaimed { lost: true }, None)),
                Err(err) => return Err((RowEnd::from(err), None)),
            },
        };
        self.metrics.claim_won();
        Ok(Claimed {
            row: planned.row,
            claim,
            attempt: planned.attempt,
        })
    }

    /// Step 8: only after the claim, the body and its signature are built and the POST is
    /// sent (bounded by the delivery timeout); its answer becomes the outcome, in Phorge's
    /// values. A hook error's outcome is taken as it is. `Err`: this process could not send
    /// (nothing reached the receiver), with the claim to give back.
    async fn post<'r>(&self, claimed: Claimed<'r>) -> Result<Posted<'r>, (Claim, Shortage)> {
        let Claimed {
            row,
            claim,
            attempt,
        } = claimed;
        let (hook, route, properties, transactions) = match attempt {
            Attempt::NoPost(decision) => {
                return Ok(Posted {
                    row,
                    claim,
                    decision,
                    host: None,
                })
            }
            Attempt::Post {
                hook,
                route,
                properties,
                transactions,
            } => (hook, route, properties, transactions),
        };
        let mut loaded = properties.clone();
        loaded.transaction_phids = transactions;
        let payload = WebhookPayload::from_properties(&row.object_phid, &loaded, row.date_created);
        let body = payload.encode_body();
        let signature = sign(hook.hmac_key.as_bytes(), &body);
        let host = uri_host(&hook.uri);
        let result = match route {
            Route::Checked(target) => {
                let started = std::time::Instant::now();
                let result = self
                    .deliverer
                    .deliver_before(target, &body, &signature, Some(self.post_ends_by(&claim)))
                    .await;
                self.metrics
                    .attempt_duration_seconds
                    .observe(started.elapsed().as_secs_f64());
                emit!(self.log, events::WEBHOOK_POSTED;
                    "request" => &row.phid, "hook" => &hook.phid, "host" => &host,
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
        if let Err(DeliveryError::Local(shortage)) = result {
            return Err((claim, shortage));
        }
        Ok(Posted {
            row,
            claim,
            decision: outcome::after_attempt(&properties, result, self.clock.now_sec()),
            host: Some(host),
        })
    }

    /// The latest a POST may still run: the claim's lease, less [`RESULT_WRITE_ROOM`] for
    /// writing its result. Only a POST whose process stood still runs past its timeout
    /// (`Deliverer::deliver_before`); past the lease, another process may send the row again.
    fn post_ends_by(&self, claim: &Claim) -> tokio::time::Instant {
        let lease_end_ms = (claim.version + self.config.timing.lease_sec) * 1000;
        let left_ms = lease_end_ms.saturating_sub(self.clock.now_ms());
        tokio::time::Instant::now()
            + Duration::from_millis(left_ms).saturating_sub(RESULT_WRITE_ROOM)
    }

    /// Instead of step 9 when this process could not send: nothing is written (a failure of
    /// ours is not the receiver's, and must not count toward Phorge's breaker); the claim is
    /// given back, the row at its version from before the claim, so a later try takes it at
    /// once. Nothing was sent, so whoever claims it next sends it once. If the give-back
    /// fails too (the database connection needs a descriptor as well), the row waits out
    /// the claim's lease.
    async fn give_back(&self, row: &Candidate, claim: Claim, shortage: Shortage) -> RowEnd {
        let returned = self
            .store
            .unclaim(&claim, row.date_modified)
            .await
            .unwrap_or(false);
        RowEnd::Local { shortage, returned }
    }

    /// Step 9: writes the outcome while the row is still ours. Database errors are retried
    /// for as long as the claim's lease protects the row (never a taken-over row, never a
    /// statement the server rejects). With `session` (the hook's lock, after a POST), the
    /// first attempt runs on the lock's session: if that session is gone the write goes
    /// through the pool at once, and the caller sees the lock no longer held (a hold stops
    /// before the hook's next POST; see `hold.rs`).
    async fn record(&self, posted: Posted<'_>, mut session: Option<&mut HookLock>) -> RowEnd {
        let Posted {
            row,
            claim,
            decision,
            host,
        } = posted;
        let write = &decision.row;
        let lease_end_ms = (claim.version + self.config.timing.lease_sec) * 1000;
        let mut pause = WRITE_RETRY_FIRST;
        let mut retries = 0u32;
        // One time for every attempt, so that each writes the very same values: an attempt
        // whose answer was lost may have landed, and a retry can then recognise it.
        let now = self.clock.now_sec();
        // An attempt failed without an answer: it may have committed all the same.
        let mut unsure = false;
        let landed = loop {
            let out = match session.take() {
                Some(lock) if lock.is_held() => {
                    match self.store.write_result_on(lock, &claim, write, now).await {
                        // The session was given up: straight on through the pool.
                        Err(err) if !err.is_row_data_error() => {
                            unsure = true;
                            continue;
                        }
                        out => out,
                    }
                }
                _ => self.store.write_result(&claim, write, now).await,
            };
            match out {
                // No row changed after an attempt without an answer: if the row holds our
                // own write, that attempt landed (a result lost on the way back, not a
                // take-over); if the check itself fails, the row is as written either way
                // and only the count differs, so the take-over stands.
                Ok(false) if unsure => {
                    break self
                        .store
                        .holds_result(&claim, write, now)
                        .await
                        .unwrap_or(false)
                }
                Ok(landed) => break landed,
                Err(err) if err.is_row_data_error() => return RowEnd::Rejected(err),
                Err(err) => {
                    unsure = true;
                    if matches!(err, ClaimError::Timeout(_)) {
                        self.metrics.db_timeouts.inc();
                    }
                    let now = self.clock.now_ms();
                    if now + pause.as_millis() as u64 >= lease_end_ms {
                        emit!(self.log, events::WEBHOOK_RESULT_WRITE_ABANDONED;
                            "request" => &row.phid, "error" => %err, "retries" => retries,
                            "why" => "the claim's lease ran out; the row will be delivered again");
                        return RowEnd::DbError(err);
                    }
                    self.metrics.result_write_retries.inc();
                    if retries == 0 {
                        emit!(self.log, events::WEBHOOK_RESULT_WRITE_RETRY;
                            "request" => &row.phid, "error" => %err,
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
                "request" => &row.phid, "retries" => retries);
        }
        RowEnd::Written {
            decision,
            version: claim.version,
            landed,
            host,
        }
    }

    /// The end of a row's way: counted and logged here, every ending in one place.
    pub(super) async fn finish(&self, candidate: &Candidate, end: RowEnd) {
        let request = &candidate.phid;
        let hook = &candidate.webhook_phid;
        if !matches!(end, RowEnd::DbError(_)) {
            self.local_state().row_db_failing = false;
        }
        match end {
            RowEnd::Skipped(reason) => self.metrics.skip(reason),
            RowEnd::NotClaimed { lost } => {
                let mut state = self.local_state();
                state.row_errors.remove(&candidate.id);
                state.blocked_logged.remove(&candidate.id);
                drop(state);
                if lost {
                    self.metrics.claim_lost();
                    emit!(self.log, events::WEBHOOK_CLAIM_LOST;
                        "request" => request, "seen_version" => candidate.date_modified);
                }
            }
            RowEnd::Written {
                decision,
                version,
                landed,
                host,
            } => {
                let mut state = self.local_state();
                state.row_errors.remove(&candidate.id);
                state.blocked_logged.remove(&candidate.id);
                drop(state);
                if !landed {
                    self.metrics.results_taken_over.inc();
                    emit!(self.log, events::WEBHOOK_RESULT_TAKEN_OVER;
                        "request" => request, "version" => version,
                        "status" => decision.row.status().as_str());
                    return;
                }
                self.metrics.delivered(decision.outcome, decision.class);
                if decision.outcome == DeliveryOutcome::Sent {
                    emit!(self.log, events::WEBHOOK_DELIVERED;
                        "request" => request, "hook" => hook, "code" => &decision.code);
                } else if let Some(host) = host {
                    emit!(self.log, events::WEBHOOK_DELIVERY_FAILED;
                        "request" => request, "hook" => hook, "code" => &decision.code,
                        "reason" => decision.class, "status" => decision.row.status().as_str(),
                        "host" => host);
                } else {
                    // No POST was made (a `hook` failure): no host to name.
                    emit!(self.log, events::WEBHOOK_DELIVERY_FAILED;
                        "request" => request, "hook" => hook, "code" => &decision.code,
                        "reason" => decision.class, "status" => decision.row.status().as_str());
                }
            }
            RowEnd::Local { shortage, returned } => {
                self.local_state().row_errors.remove(&candidate.id);
                self.metrics.local_failure(shortage);
                if let Some(failures) = self.local_failures.occurred() {
                    emit!(self.log, events::WEBHOOK_LOCAL_FAILURE;
                        "reason" => shortage.label(), "request" => request, "hook" => hook,
                        "given_back" => returned, "failures" => failures);
                }
            }
            RowEnd::DbError(err) if err.is_access_denied() => {
                self.metrics.poll_errors.inc();
                // Every row's claim is refused the same way: the GRANT that fixes it, at
                // most once per interval with a count (the server's words if it cannot be
                // told).
                if let Some(failures) = self.refused_statements.occurred() {
                    let grant = match self.store.missing_grant().await {
                        Ok(Some(grant)) => grant,
                        _ => err.to_string(),
                    };
                    emit!(self.log, events::WEBHOOK_GRANT_MISSING;
                        "grant" => grant, "failures" => failures);
                }
            }
            RowEnd::DbError(err) => {
                self.metrics.poll_errors.inc();
                if matches!(err, ClaimError::Timeout(_)) {
                    self.metrics.db_timeouts.inc();
                }
                // Every row of a poll meets the same outage: one line until a row gets through.
                let first = !std::mem::replace(&mut self.local_state().row_db_failing, true);
                if first {
                    emit!(self.log, events::WEBHOOK_ROW_DB_ERROR;
                        "error" => %err, "request" => request, "hook" => hook);
                }
            }
            RowEnd::Rejected(err) => self.row_rejected(candidate.id, &err, Some(candidate)).await,
        }
    }

    /// Step 4, Phorge's `HeraldWebhook::isInErrorBackoff`: at least the threshold of failed
    /// requests of `hook` within the window keep its rows queued, untouched. Records the
    /// state and logs only its transitions (the number of open hooks is a gauge); true when
    /// open.
    pub(super) fn note_breaker(&self, hook: &str, failures: u64) -> bool {
        let open = failures >= self.config.error_threshold;
        let changed = {
            let mut state = self.local_state();
            let changed = if open {
                state.open_breakers.insert(hook.to_string())
            } else {
                state.open_breakers.remove(hook)
            };
            self.metrics
                .breaker_open_hooks
                .set(state.open_breakers.len() as i64);
            changed
        };
        if changed && open {
            emit!(self.log, events::WEBHOOK_BREAKER_OPEN;
                "hook" => hook, "failures" => failures,
                "threshold" => self.config.error_threshold,
                "window_sec" => self.config.error_backoff_sec);
        } else if changed {
            emit!(self.log, events::WEBHOOK_BREAKER_CLOSED; "hook" => hook, "failures" => failures);
        }
        open
    }

    /// Step 6's note of a delivery whose object or transactions could not be checked:
    /// counted, and logged once per PHID type or database.
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
}

/// The host of a hook URI for logs: URIs may carry credentials in the path or query.
fn uri_host(uri: &str) -> String {
    uri.parse::<hyper::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_string))
        .unwrap_or_default()
}
