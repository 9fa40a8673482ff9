//! The poll loop and the per-request steps, in the spec's order (webhook.md §4):
//! parse properties → load hook → outbound policy → per-hook lock → breaker → claim → POST →
//! write the outcome (only while the row is still ours) → release the lock.
//!
//! A SELECT only finds candidates; nothing is sent or written for a row until the claim's
//! compare-and-set is won. Concurrency is one semaphore permit per row being worked on, so
//! at most `max_concurrent` POSTs run at once. The candidate query leaves out the hooks this
//! process would skip anyway (a delivery of the hook running here, its lock held elsewhere,
//! its breaker open), so a backlog of such a hook never fills the batch and hides the rows
//! of other hooks.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gorge_claim::{
    Candidate, Claim, ClaimError, ClaimStore, ClaimTiming, Hook, RowOutcome, MAX_EXCLUDED_HOOKS,
};
use gorge_service::Shutdown;
use phorge_wire::values::{ErrorType, HookErrorCode, HookStatus};
use phorge_wire::webhook::{sign, RequestProperties, WebhookPayload};
use slog::{debug, info, warn, Logger};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::clock::Clock;
use crate::delivery::{Deliverer, DeliveryError};
use crate::metrics::{DeliveryOutcome, Metrics, SkipReason};
use crate::outcome;
use crate::policy::{CheckedTarget, PolicyError};

/// First pause after a database error; doubled per consecutive error up to the maximum.
const DB_ERROR_BACKOFF_MIN: Duration = Duration::from_millis(500);
const DB_ERROR_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Candidates fetched per poll, as a multiple of `max_concurrent`: only one row per hook can
/// start at a time, so a batch of exactly `max_concurrent` rows could leave slots idle when
/// several of its rows belong to one hook.
const BATCH_FACTOR: usize = 4;

/// How long a hook with an open breaker is left alone before its breaker is checked again.
/// Failures age out of the window one by one, so checking more often gains little.
const BREAKER_REST: Duration = Duration::from_secs(5);

/// Pauses between attempts to write a result after a database error. The row is ours until
/// the lease expires; giving up early means a duplicate POST after the lease.
const WRITE_RETRY_PAUSES: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(3),
];

/// What the dispatcher needs from the configuration.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub poll_interval: Duration,
    pub max_concurrent: usize,
    pub timing: ClaimTiming,
    pub breaker_window_sec: u64,
    pub breaker_threshold: u64,
}

/// Rows and hooks this process is working on, and hooks whose breaker it saw open.
#[derive(Default)]
struct LocalState {
    rows: HashSet<u64>,
    hooks: HashSet<String>,
    /// Hooks skipped for a reason that will not change at once (lock held by another
    /// process, breaker open), and until when to leave them alone (the candidate query
    /// excludes them). Without this a backlog makes the loop re-poll at once after each skip
    /// and spin on the same hooks.
    resting: HashMap<String, Instant>,
    open_breakers: HashSet<String>,
}

/// What one poll round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Candidates returned by the query.
    pub fetched: usize,
    /// Rows handed to a worker task.
    pub started: usize,
    /// Rows skipped because this process is already working on them or on their hook (rows
    /// of one hook later in the same batch, or state that changed since the query).
    pub skipped_local: usize,
    /// Hooks left out of the query because a delivery of theirs is running here.
    pub excluded_busy: usize,
    /// Hooks left out of the query because they are resting (lock held elsewhere, breaker
    /// open).
    pub excluded_resting: usize,
    /// The batch was full or the slots ran out: more work is probably waiting.
    pub more_waiting: bool,
}

/// Polls `herald_webhookrequest` and delivers what it wins.
pub struct Dispatcher {
    store: ClaimStore,
    clock: Arc<dyn Clock>,
    deliverer: Deliverer,
    metrics: Metrics,
    log: Logger,
    config: DispatcherConfig,
    slots: Arc<Semaphore>,
    state: Mutex<LocalState>,
    finished: Notify,
    /// Set when the poll loop ends: rows not yet claimed are left alone.
    stopping: AtomicBool,
}

/// How a row's processing ended, for logs and metrics.
enum RowEnd {
    Done,
    Skipped(SkipReason),
}

impl Dispatcher {
    pub fn new(
        store: ClaimStore,
        clock: Arc<dyn Clock>,
        deliverer: Deliverer,
        metrics: Metrics,
        config: DispatcherConfig,
        log: Logger,
    ) -> Arc<Dispatcher> {
        Arc::new(Dispatcher {
            slots: Arc::new(Semaphore::new(config.max_concurrent)),
            store,
            clock,
            deliverer,
            metrics,
            log,
            state: Mutex::new(LocalState::default()),
            finished: Notify::new(),
            stopping: AtomicBool::new(false),
            config,
        })
    }

    /// The local state. Poisoning is ignored: it is plain sets and maps, and a worker that
    /// panicked has its row and hook released by its `Slot` anyway.
    fn local_state(&self) -> MutexGuard<'_, LocalState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Candidates per poll.
    pub fn batch_limit(&self) -> usize {
        self.config.max_concurrent * BATCH_FACTOR
    }

    /// Polls until `shutdown`, then waits for in-flight deliveries to write their results.
    /// The caller closes the pool afterwards.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        let mut error_backoff = DB_ERROR_BACKOFF_MIN;
        let mut db_ok: Option<bool> = None;
        loop {
            // Wait for a free slot first: polling without one only re-reads rows.
            let permit = tokio::select! {
                permit = self.slots.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
                _ = shutdown.triggered() => break,
            };
            if shutdown.is_triggered() {
                break;
            }
            match self.poll_round(Some(permit)).await {
                Err(err) => {
                    self.metrics.poll_errors.inc();
                    warn!(self.log, "WEBHOOK_POLL_ERROR";
                        "error" => %err, "retry_in_ms" => error_backoff.as_millis() as u64);
                    db_ok = Some(false);
                    tokio::select! {
                        _ = tokio::time::sleep(error_backoff) => {}
                        _ = shutdown.triggered() => break,
                    }
                    error_backoff = (error_backoff * 2).min(DB_ERROR_BACKOFF_MAX);
                }
                Ok(round) => {
                    if db_ok != Some(true) {
                        info!(self.log, "WEBHOOK_DB_READY"; "database" => self.store.database());
                        db_ok = Some(true);
                    }
                    error_backoff = DB_ERROR_BACKOFF_MIN;
                    if round.more_waiting && round.started > 0 {
                        // Backlog: poll again as soon as a slot is free (top of the loop).
                        continue;
                    }
                    let wake_on_finish =
                        round.skipped_local > 0 || round.excluded_busy > 0 || round.more_waiting;
                    tokio::select! {
                        _ = tokio::time::sleep(self.config.poll_interval) => {}
                        // A finished delivery frees its hook: rows skipped for it may go now.
                        _ = self.finished.notified(), if wake_on_finish => {}
                        _ = shutdown.triggered() => break,
                    }
                }
            }
        }
        self.stopping.store(true, Ordering::SeqCst);
        self.wait_idle().await;
    }

    /// Waits until no delivery is running in this process.
    pub async fn wait_idle(&self) {
        let all = u32::try_from(self.config.max_concurrent).unwrap_or(u32::MAX);
        if let Ok(permits) = self.slots.acquire_many(all).await {
            drop(permits);
        }
    }

    /// One poll and the rows it starts, then waits for them all to finish (tests drive the
    /// dispatcher with this and an injected clock).
    /// A round driven this way looks at every hook, including resting ones.
    pub async fn run_round(self: &Arc<Self>) -> Result<Round, ClaimError> {
        {
            let mut state = self.local_state();
            state.resting.clear();
        }
        let round = self.poll_round(None).await?;
        self.wait_idle().await;
        Ok(round)
    }

    /// Fetches candidates and starts a task for each one a slot is free for. `first` is a
    /// slot the caller already holds.
    pub async fn poll_round(
        self: &Arc<Self>,
        first: Option<OwnedSemaphorePermit>,
    ) -> Result<Round, ClaimError> {
        let now = self.clock.now();
        let limit = self.batch_limit();
        let (excluded, mut round) = self.hooks_to_exclude();
        if excluded.len() > MAX_EXCLUDED_HOOKS {
            self.metrics.exclusions_capped.inc();
        }
        let candidates = self
            .store
            .candidates(now, &self.config.timing, limit, &excluded)
            .await?;
        round.fetched = candidates.len();
        round.more_waiting = candidates.len() >= limit;
        if round.more_waiting {
            self.metrics.full_batches.inc();
        }
        let mut first = first;
        for candidate in candidates {
            {
                let state = self.local_state();
                if state.rows.contains(&candidate.id) {
                    self.metrics.skip(SkipReason::InFlight);
                    round.skipped_local += 1;
                    continue;
                }
                if state.hooks.contains(&candidate.webhook_phid) {
                    self.metrics.skip(SkipReason::HookBusy);
                    round.skipped_local += 1;
                    continue;
                }
                if state.resting.contains_key(&candidate.webhook_phid) {
                    continue;
                }
            }
            let permit = match first.take() {
                Some(permit) => permit,
                None => match self.slots.clone().try_acquire_owned() {
                    Ok(permit) => permit,
                    Err(_) => {
                        round.more_waiting = true;
                        break;
                    }
                },
            };
            {
                let mut state = self.local_state();
                state.rows.insert(candidate.id);
                state.hooks.insert(candidate.webhook_phid.clone());
            }
            round.started += 1;
            let this = Arc::clone(self);
            tokio::spawn(async move { this.work(candidate, permit).await });
        }
        Ok(round)
    }

    /// The hooks this round would skip, for the candidate query: hooks with a delivery
    /// running here first (at most `max_concurrent`, and they free up soonest), then resting
    /// ones. Forgets rests that are over. The store uses the first [`MAX_EXCLUDED_HOOKS`].
    fn hooks_to_exclude(&self) -> (Vec<String>, Round) {
        let now = Instant::now();
        let mut state = self.local_state();
        state.resting.retain(|_, until| *until > now);
        let mut excluded: Vec<String> = state.hooks.iter().cloned().collect();
        // A hook can be both busy here and resting (a rest set while its delivery ends).
        let resting = state
            .resting
            .keys()
            .filter(|hook| !state.hooks.contains(*hook));
        excluded.extend(resting.cloned());
        let round = Round {
            excluded_busy: state.hooks.len(),
            excluded_resting: excluded.len() - state.hooks.len(),
            ..Round::default()
        };
        (excluded, round)
    }

    async fn work(self: Arc<Self>, candidate: Candidate, permit: OwnedSemaphorePermit) {
        // Cleans up on every exit, a panic included, so a row or hook is never stuck as
        // "in flight here".
        let _slot = Slot {
            dispatcher: &self,
            row: candidate.id,
            hook: &candidate.webhook_phid,
            _permit: permit,
        };
        self.metrics.in_flight.inc();
        match self.process(&candidate).await {
            Ok(RowEnd::Done) => {}
            Ok(RowEnd::Skipped(reason)) => self.metrics.skip(reason),
            Err(err) => {
                self.metrics.poll_errors.inc();
                warn!(self.log, "WEBHOOK_POLL_ERROR";
                    "error" => %err, "request" => &candidate.phid, "hook" => &candidate.webhook_phid);
            }
        }
    }

    /// The §4 steps for one candidate.
    async fn process(&self, candidate: &Candidate) -> Result<RowEnd, ClaimError> {
        // 1. Properties.
        let properties = match RequestProperties::parse(&candidate.properties) {
            Ok(properties) => properties,
            Err(err) => {
                warn!(self.log, "WEBHOOK_INVALID_PROPERTIES";
                    "request" => &candidate.phid, "error" => %err,
                    "bytes" => candidate.properties.len());
                let text = err.rewritten_properties();
                return self
                    .fail_before_delivery(candidate, HookErrorCode::InvalidProperties, text)
                    .await;
            }
        };
        // 2. The hook.
        let Some(hook) = self.store.load_hook(&candidate.webhook_phid).await? else {
            return self
                .fail_hook(candidate, &properties, HookErrorCode::NotFound)
                .await;
        };
        // Phorge's `isDisabled()` compares with `disabled` only; other values deliver.
        if hook.hook_status() == Some(HookStatus::Disabled) {
            return self
                .fail_hook(candidate, &properties, HookErrorCode::Disabled)
                .await;
        }
        // 3. Outbound policy: resolve once, check every address, keep them for the connect.
        let target = match self.check_policy(&hook).await {
            Ok(target) => Ok(target),
            Err(PolicyError::Unresolvable) => Err(DeliveryError::Dns),
            Err(err) => {
                self.metrics.policy_blocks.inc();
                warn!(self.log, "WEBHOOK_POLICY_BLOCKED";
                    "request" => &candidate.phid, "hook" => &hook.phid,
                    "host" => uri_host(&hook.uri), "reason" => %err);
                return self
                    .fail_hook(candidate, &properties, HookErrorCode::Uri)
                    .await;
            }
        };
        // 4. One delivery per hook across every process.
        let Some(lock) = self.store.try_hook_lock(&hook.phid).await? else {
            self.rest(&hook.phid, self.config.poll_interval);
            return Ok(RowEnd::Skipped(SkipReason::HookBusy));
        };
        let result = self
            .deliver_locked(candidate, &hook, &properties, target)
            .await;
        if let Err(err) = lock.release().await {
            // The server frees the lock with the session that the release just closed.
            warn!(self.log, "WEBHOOK_LOCK_RELEASE_FAILED"; "hook" => &hook.phid, "error" => %err);
        }
        result
    }

    /// Steps 5–8, with the hook lock held.
    async fn deliver_locked(
        &self,
        candidate: &Candidate,
        hook: &Hook,
        properties: &RequestProperties,
        target: Result<CheckedTarget, DeliveryError>,
    ) -> Result<RowEnd, ClaimError> {
        // 5. Breaker.
        let now = self.clock.now();
        let since = now.saturating_sub(self.config.breaker_window_sec);
        let failures = self.store.recent_failures(&hook.phid, since).await?;
        if self.note_breaker(&hook.phid, failures) {
            self.rest(&hook.phid, BREAKER_REST);
            return Ok(RowEnd::Skipped(SkipReason::BreakerOpen));
        }
        // 6. Claim.
        let Some(claim) = self.claim(candidate).await? else {
            return Ok(RowEnd::Done);
        };
        // 7. POST.
        let payload = WebhookPayload::from_properties(
            &candidate.object_phid,
            properties,
            candidate.date_created,
        );
        let body = payload.encode_body();
        let signature = sign(hook.hmac_key.as_bytes(), &body);
        let result = match target {
            Ok(target) => {
                let started = Instant::now();
                let result = self.deliverer.deliver(target, &body, &signature).await;
                self.metrics
                    .attempt_seconds
                    .observe(started.elapsed().as_secs_f64());
                result
            }
            Err(err) => Err(err),
        };
        if result == Err(DeliveryError::BlockedRedirect) {
            self.metrics.policy_blocks.inc();
        }
        // 8. The outcome, in Phorge's values.
        let decision = outcome::after_attempt(properties, result, self.clock.now());
        if self.write(candidate, &claim, &decision.row).await? {
            self.metrics.delivered(decision.outcome, decision.class);
            if decision.outcome == DeliveryOutcome::Sent {
                info!(self.log, "WEBHOOK_DELIVERED";
                    "request" => &candidate.phid, "hook" => &hook.phid, "code" => &decision.code);
            } else {
                warn!(self.log, "WEBHOOK_DELIVERY_FAILED";
                    "request" => &candidate.phid, "hook" => &hook.phid, "code" => &decision.code,
                    "reason" => decision.reason, "status" => decision.row.status.as_str());
            }
        }
        Ok(RowEnd::Done)
    }

    /// Resolves and checks the hook URI on a blocking thread.
    async fn check_policy(&self, hook: &Hook) -> Result<CheckedTarget, PolicyError> {
        let deliverer = self.deliverer.clone();
        let uri = hook.uri.clone();
        tokio::task::spawn_blocking(move || deliverer.policy().check(&uri, deliverer.timeout()))
            .await
            .unwrap_or(Err(PolicyError::Unresolvable))
    }

    /// Leaves `hook` alone for `duration` (candidates of it are skipped without a query).
    fn rest(&self, hook: &str, duration: Duration) {
        let until = Instant::now() + duration;
        let mut state = self.local_state();
        state.resting.insert(hook.to_string(), until);
    }

    /// Records the breaker state for `hook`; true when it is open. Logs only transitions.
    fn note_breaker(&self, hook: &str, failures: u64) -> bool {
        let open = failures >= self.config.breaker_threshold;
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
            warn!(self.log, "WEBHOOK_BREAKER_OPEN";
                "hook" => hook, "failures" => failures,
                "threshold" => self.config.breaker_threshold,
                "window_sec" => self.config.breaker_window_sec);
        } else if changed {
            info!(self.log, "WEBHOOK_BREAKER_CLOSED"; "hook" => hook, "failures" => failures);
        }
        open
    }

    /// Re-checks hooks whose breaker this process saw open, so the gauge and the
    /// `WEBHOOK_BREAKER_CLOSED` line follow the window even when the hook has no rows left.
    pub async fn reevaluate_breakers(&self) -> Result<(), ClaimError> {
        let open: Vec<String> = {
            let state = self.local_state();
            state.open_breakers.iter().cloned().collect()
        };
        let since = self
            .clock
            .now()
            .saturating_sub(self.config.breaker_window_sec);
        for hook in open {
            let failures = self.store.recent_failures(&hook, since).await?;
            self.note_breaker(&hook, failures);
        }
        Ok(())
    }

    /// Claims `candidate`; `None` when lost, or when shutdown began (nothing new starts
    /// then: only rows already claimed are finished).
    async fn claim(&self, candidate: &Candidate) -> Result<Option<Claim>, ClaimError> {
        if self.stopping.load(Ordering::SeqCst) {
            return Ok(None);
        }
        let claim = self.store.claim(candidate, self.clock.now()).await?;
        match claim {
            Some(_) => self.metrics.claim_won(),
            None => {
                self.metrics.claim_lost();
                debug!(self.log, "WEBHOOK_CLAIM_LOST";
                    "request" => &candidate.phid, "seen_version" => candidate.date_modified);
            }
        }
        Ok(claim)
    }

    /// Writes the outcome while the row is still ours; retries database errors a few times
    /// (never a taken-over row). True when it landed.
    async fn write(
        &self,
        candidate: &Candidate,
        claim: &Claim,
        outcome: &RowOutcome,
    ) -> Result<bool, ClaimError> {
        let mut pauses = WRITE_RETRY_PAUSES.iter();
        let landed = loop {
            match self
                .store
                .write_outcome(claim, outcome, self.clock.now())
                .await
            {
                Ok(landed) => break landed,
                Err(err) => match pauses.next() {
                    Some(pause) => {
                        self.metrics.poll_errors.inc();
                        warn!(self.log, "WEBHOOK_RESULT_WRITE_RETRY";
                            "request" => &candidate.phid, "error" => %err);
                        tokio::time::sleep(*pause).await;
                    }
                    None => return Err(err),
                },
            }
        };
        if !landed {
            self.metrics.results_taken_over.inc();
            warn!(self.log, "WEBHOOK_RESULT_TAKEN_OVER";
                "request" => &candidate.phid, "version" => claim.version,
                "status" => outcome.status.as_str());
        }
        Ok(landed)
    }

    async fn fail_hook(
        &self,
        candidate: &Candidate,
        properties: &RequestProperties,
        code: HookErrorCode,
    ) -> Result<RowEnd, ClaimError> {
        let text = properties.rewritten(ErrorType::Hook, code.as_str());
        self.fail_before_delivery(candidate, code, text).await
    }

    /// A terminal failure without a POST, written only after winning the claim so that two
    /// processes never both write it.
    async fn fail_before_delivery(
        &self,
        candidate: &Candidate,
        code: HookErrorCode,
        properties: String,
    ) -> Result<RowEnd, ClaimError> {
        let Some(claim) = self.claim(candidate).await? else {
            return Ok(RowEnd::Done);
        };
        let decision = outcome::without_attempt(code, properties);
        if self.write(candidate, &claim, &decision.row).await? {
            self.metrics.delivered(decision.outcome, decision.class);
            warn!(self.log, "WEBHOOK_DELIVERY_FAILED";
                "request" => &candidate.phid, "hook" => &candidate.webhook_phid,
                "error_type" => "hook", "code" => &decision.code,
                "status" => decision.row.status.as_str());
        }
        Ok(RowEnd::Done)
    }

    /// Samples the queue depth, pool state and open breakers into the metrics.
    pub async fn sample(&self) -> Result<(), ClaimError> {
        let pool = self.store.pool_state();
        self.metrics
            .set_pool(pool.connections, pool.in_use, pool.waiting);
        let depth = self.store.queue_depth(self.clock.now()).await?;
        self.metrics.queue_depth.set(depth.queued as i64);
        self.metrics
            .oldest_queued_age_seconds
            .set(depth.oldest_age_sec.unwrap_or(0) as i64);
        self.reevaluate_breakers().await
    }
}

/// One row being worked on: releases the row, its hook and the concurrency slot on drop.
struct Slot<'a> {
    dispatcher: &'a Dispatcher,
    row: u64,
    hook: &'a str,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        {
            let mut state = self.dispatcher.local_state();
            state.rows.remove(&self.row);
            state.hooks.remove(self.hook);
        }
        self.dispatcher.metrics.in_flight.dec();
        // The permit (a field) is released right after this body; a poll loop woken by the
        // notification waits for a free slot before polling anyway.
        self.dispatcher.finished.notify_one();
    }
}

/// The host of a hook URI for logs: URIs may carry credentials in the path or query.
fn uri_host(uri: &str) -> String {
    uri.parse::<ureq::http::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_string))
        .unwrap_or_default()
}
