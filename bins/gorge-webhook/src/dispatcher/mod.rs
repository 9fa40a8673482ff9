//! The dispatcher: polls `herald_webhookrequest` and delivers the rows it wins.
//!
//! - this file: the poll loop, its back-off on database errors, progress for readiness,
//!   hooks' rests, and the sampling of gauges;
//! - [`poll`]: one poll round (which hooks to leave out, which rows to start, rows that
//!   cannot be used as stored);
//! - [`row`]: one row's way (docs/webhook.md, "Per-request steps"), top to bottom, each of
//!   its states a type, to how it ended, counted and logged in one place;
//! - [`hold`]: a hook's next rows under the lock its first row took, within a bound;
//! - [`state`]: what this process is working on right now.
//!
//! A SELECT only finds candidates; nothing is sent or written for a row until the claim's
//! compare-and-set is won. Concurrency is one semaphore permit per row being worked on, so
//! at most `max_concurrent` POSTs run at once. Every time read goes through the injected
//! [`UnixClock`].

mod hold;
mod poll;
mod row;
mod state;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gorge_claim::{ClaimError, ClaimStore, ClaimTiming};
use gorge_service::log_every::LogEvery;
use gorge_service::Shutdown;
use slog::Logger;
use tokio::sync::{Notify, Semaphore};

use crate::clock::UnixClock;
use crate::dberror::DbEndpoint;
use crate::delivery::Deliverer;
use crate::metrics::Metrics;

use crate::events;
use gorge_service::emit;
pub use poll::Round;
use state::LocalState;

/// First pause after a database error; doubled per consecutive error up to the maximum.
const DB_ERROR_BACKOFF_MIN: Duration = Duration::from_millis(500);
const DB_ERROR_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Shortest sleep of an idle poll loop waiting for a rest to end (see
/// [`Dispatcher::idle_wait`]).
const REST_WAKE_MIN: Duration = Duration::from_millis(50);

/// At most one `WEBHOOK_LOCAL_FAILURE` (or refused-statement `WEBHOOK_GRANT_MISSING`) line
/// per this interval, with a count.
const LOCAL_FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What the dispatcher needs from the configuration.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub poll_interval: Duration,
    pub max_concurrent: usize,
    pub timing: ClaimTiming,
    pub error_backoff_sec: u64,
    pub error_threshold: u64,
    /// Where the database is, for error messages.
    pub db: DbEndpoint,
}

/// Polls `herald_webhookrequest` and delivers what it wins.
pub struct Dispatcher {
    store: ClaimStore,
    clock: Arc<dyn UnixClock>,
    deliverer: Deliverer,
    metrics: Metrics,
    log: Logger,
    config: DispatcherConfig,
    slots: Arc<Semaphore>,
    state: Mutex<LocalState>,
    finished: Notify,
    /// Set when the poll loop ends: rows not yet claimed are left alone.
    stopping: AtomicBool,
    /// UnixClock milliseconds of the last sign of progress: a poll round that completed or a
    /// result that was written.
    progress: AtomicU64,
    /// `WEBHOOK_LOCAL_FAILURE`'s rate: while descriptors are short every row meets it.
    local_failures: LogEvery,
    /// `WEBHOOK_GRANT_MISSING`'s rate for refused statements: every row's claim meets it.
    refused_statements: LogEvery,
}

impl Dispatcher {
    pub fn new(
        store: ClaimStore,
        clock: Arc<dyn UnixClock>,
        deliverer: Deliverer,
        metrics: Metrics,
        config: DispatcherConfig,
        log: Logger,
    ) -> Arc<Dispatcher> {
        let now = clock.now_ms();
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
            progress: AtomicU64::new(now),
            local_failures: LogEvery::new(LOCAL_FAILURE_LOG_INTERVAL),
            refused_statements: LogEvery::new(LOCAL_FAILURE_LOG_INTERVAL),
            config,
        })
    }

    /// The local state. Poisoning is ignored: it is plain sets and maps, and a worker that
    /// panicked has its row and hook released by its `Slot` anyway.
    fn local_state(&self) -> MutexGuard<'_, LocalState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn made_progress(&self) {
        self.progress.store(self.clock.now_ms(), Ordering::SeqCst);
    }

    /// How long ago (clock time) the dispatcher last made progress.
    pub fn since_progress(&self) -> Duration {
        let last = self.progress.load(Ordering::SeqCst);
        Duration::from_millis(self.clock.now_ms().saturating_sub(last))
    }

    /// Polls until `shutdown`, then waits for in-flight deliveries to write their results.
    /// The caller closes the pool afterwards.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        let mut error_backoff = DB_ERROR_BACKOFF_MIN;
        let mut db_ok: Option<bool> = None;
        let mut backlog = false;
        loop {
            // Wait for a free slot first: polling without one only re-reads rows. In a
            // backlog, wait for a quarter of them, so that each round (a candidate query
            // and one read per table for all its rows) starts several rows, not one. Not
            // more: a slot now often runs a hold of a hook's rows (`hold.rs`), so slots
            // free up one at a time, and waiting for half of them left a quarter of the
            // slots idle on average.
            let wanted = if backlog {
                u32::try_from((self.config.max_concurrent / 4).max(1)).unwrap_or(1)
            } else {
                1
            };
            let mut slots = tokio::select! {
                slots = self.slots.clone().acquire_many_owned(wanted) => match slots {
                    Ok(slots) => slots,
                    Err(_) => break,
                },
                _ = shutdown.triggered() => break,
            };
            // Keep one for the round; the others go back for it to take.
            let permit = slots.split(1).unwrap_or(slots);
            if shutdown.is_triggered() {
                break;
            }
            match self.poll_round(Some(permit)).await {
                Err(err) => {
                    backlog = false;
                    self.metrics.poll_errors.inc();
                    emit!(self.log, events::WEBHOOK_POLL_ERROR;
                        "error" => crate::dberror::explain(&err, &self.config.db),
                        "retry_in_ms" => error_backoff.as_millis() as u64);
                    db_ok = Some(false);
                    tokio::select! {
                        _ = tokio::time::sleep(error_backoff) => {}
                        _ = shutdown.triggered() => break,
                    }
                    error_backoff = (error_backoff * 2).min(DB_ERROR_BACKOFF_MAX);
                }
                Ok(round) => {
                    emit!(self.log, events::WEBHOOK_POLLED; "fetched" => round.fetched,
                        "started" => round.started, "skipped_local" => round.skipped_local,
                        "excluded_busy" => round.excluded_busy, "broken" => round.broken,
                        "more_waiting" => round.more_waiting);
                    if db_ok != Some(true) {
                        emit!(self.log, events::WEBHOOK_DB_READY; "database" => self.store.database());
                        db_ok = Some(true);
                        // Polls only read: a user without UPDATE gets this far, and would
                        // otherwise learn it from each refused claim.
                        if let Ok(Some(grant)) = self.store.missing_grant().await {
                            emit!(self.log, events::WEBHOOK_GRANT_MISSING;
                                "grant" => grant, "failures" => 0u64);
                        }
                    }
                    error_backoff = DB_ERROR_BACKOFF_MIN;
                    backlog = round.more_waiting && round.started > 0;
                    if backlog {
                        // Backlog: poll again as soon as a slot is free (top of the loop).
                        continue;
                    }
                    let wake_on_finish =
                        round.skipped_local > 0 || round.excluded_busy > 0 || round.more_waiting;
                    tokio::select! {
                        _ = tokio::time::sleep(self.idle_wait()) => {}
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

    /// How long the poll loop sleeps when there is no backlog to go on with: the poll
    /// interval, or less when a resting hook's rest ends sooner, since its rows may go then.
    /// A hook's backlog that hit its hold bound (`hold.rs`) otherwise waited a whole poll
    /// interval after each rest: one hook drained 32 rows per second. Never less than
    /// [`REST_WAKE_MIN`], so that many rests ending one after the other cost at most one
    /// poll round per that time.
    fn idle_wait(&self) -> Duration {
        let now = self.clock.now_ms();
        let rest_left = self
            .local_state()
            .resting
            .values()
            .min()
            .map(|until| Duration::from_millis(until.saturating_sub(now)));
        match rest_left {
            Some(left) => left.max(REST_WAKE_MIN).min(self.config.poll_interval),
            None => self.config.poll_interval,
        }
    }

    /// Waits until no delivery is running in this process.
    pub async fn wait_idle(&self) {
        let all = u32::try_from(self.config.max_concurrent).unwrap_or(u32::MAX);
        if let Ok(permits) = self.slots.acquire_many(all).await {
            drop(permits);
        }
    }

    /// One poll and the rows it starts, then waits for them all to finish (tests drive the
    /// dispatcher with this and an injected clock; resting hooks stay resting until the
    /// clock passes their rest).
    pub async fn run_round(self: &Arc<Self>) -> Result<Round, ClaimError> {
        let round = self.poll_round(None).await?;
        self.wait_idle().await;
        Ok(round)
    }

    /// Samples the queue depth, pool state, hooks whose lock is held elsewhere and open
    /// breakers into the metrics.
    pub async fn sample(&self) -> Result<(), ClaimError> {
        self.metrics.set_pool(&self.store.pool_state());
        let (hooks, longest_ms) = self.local_state().lock_busy_summary(self.clock.now_ms());
        self.metrics.lock_unavailable_hooks.set(hooks as i64);
        self.metrics
            .lock_unavailable_seconds
            .set((longest_ms / 1000) as i64);
        let depth = self.store.queue_depth(self.clock.now_sec()).await?;
        self.metrics.queue_depth.set(depth.queued as i64);
        self.metrics
            .oldest_queued_age_seconds
            .set(depth.oldest_age_sec.unwrap_or(0) as i64);
        self.reevaluate_breakers().await
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
            .now_sec()
            .saturating_sub(self.config.error_backoff_sec);
        for hook in open {
            let failures = self.store.recent_failures(&hook, since).await?;
            self.note_breaker(&hook, failures);
        }
        Ok(())
    }

    /// Notes that `hook`'s lock was found held by another session, and rests the hook for
    /// [`state::lock_busy_rest`].
    pub(super) fn lock_held_elsewhere(&self, hook: &str) {
        let now = self.clock.now_ms();
        // Tries of a hook that stays locked come at most a rest (1.5 poll intervals) and a
        // poll interval apart; a longer gap means nobody looked in between.
        let max_gap = 3 * self.config.poll_interval.as_millis() as u64;
        let busy_for = self.local_state().lock_busy(hook, now, max_gap);
        let rest = state::lock_busy_rest(
            busy_for,
            self.config.poll_interval,
            state::jitter_of(hook, now),
        );
        self.rest(hook, rest);
    }

    /// Leaves `hook` alone for `duration` of clock time (the candidate query excludes it).
    pub(super) fn rest(&self, hook: &str, duration: std::time::Duration) {
        let until = self.clock.now_ms() + duration.as_millis() as u64;
        self.local_state().resting.insert(hook.to_string(), until);
    }
}
