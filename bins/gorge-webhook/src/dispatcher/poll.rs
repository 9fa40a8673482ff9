//! One poll round: which hooks to leave out of the candidate query, which candidates to
//! start, and what to do with rows that cannot be used as stored.
//!
//! The candidate query leaves out the hooks this process would skip anyway (a delivery of
//! the hook running here, its lock held elsewhere, its breaker open), so a backlog of such
//! a hook never fills the batch and hides the rows of other hooks.

use std::collections::HashSet;
use std::sync::Arc;

use gorge_claim::{
    BrokenRow, Candidate, ClaimError, ObjectLoad, MAX_EXCLUDED_HOOKS, MAX_PROPERTIES_BYTES,
};
use phorge_wire::values::HookErrorCode;
use phorge_wire::webhook::{PropertiesError, RequestProperties};
use tokio::sync::OwnedSemaphorePermit;

use super::row::Preload;
use super::Dispatcher;
use crate::events;
use crate::outcome::{self, InvalidRowReason, SkipReason};
use gorge_service::emit;

/// Candidates fetched per poll, as a multiple of `max_concurrent`: only one row per hook can
/// start at a time, so a batch of exactly `max_concurrent` rows could leave slots idle when
/// several of its rows belong to one hook.
const BATCH_FACTOR: usize = 4;

/// Times the server may reject a statement for the same row before the row is failed
/// with `invalid-row` (a poison row must not be retried every poll forever).
pub(super) const MAX_ROW_ATTEMPTS: u32 = 3;

/// What one poll round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Rows returned by the query (broken ones included).
    pub fetched: usize,
    /// Rows handed to a worker task.
    pub started: usize,
    /// Rows skipped because this process is already working on them or on their hook (rows
    /// of one hook later in the same batch, or state that changed since the query).
    pub skipped_local: usize,
    /// Hooks left out of the query because a delivery of theirs is running here.
    pub excluded_busy: usize,
    /// Rows that could not be used as stored and were failed (`invalid-row`).
    pub broken: usize,
    /// The batch was full or the slots ran out: more work is probably waiting.
    pub more_waiting: bool,
}

impl Dispatcher {
    /// Candidates per poll.
    pub fn batch_limit(&self) -> usize {
        self.config.max_concurrent * BATCH_FACTOR
    }

    /// Fetches candidates and starts a task for each one a slot is free for. `first` is a
    /// slot the caller already holds.
    pub async fn poll_round(
        self: &Arc<Self>,
        first: Option<OwnedSemaphorePermit>,
    ) -> Result<Round, ClaimError> {
        let now = self.clock.now_sec();
        let limit = self.batch_limit();
        let (excluded, mut round) = self.hooks_to_exclude();
        if excluded.len() > MAX_EXCLUDED_HOOKS {
            self.metrics.exclusions_capped.inc();
        }
        let batch = self
            .store
            .batch(now, &self.config.timing, limit, &excluded)
            .await
            .inspect_err(|err| {
                if matches!(err, ClaimError::Timeout(_)) {
                    self.metrics.db_timeouts.inc();
                }
            })?;
        self.made_progress();
        round.fetched = batch.fetched;
        round.more_waiting = batch.fetched >= limit;
        if round.more_waiting {
            self.metrics.full_batches.inc();
        }
        if batch.unaddressable > 0 {
            self.metrics
                .rows_unaddressable
                .inc_by(batch.unaddressable as u64);
            if self.local_state().first_time("unaddressable".into()) {
                emit!(self.log, events::WEBHOOK_ROW_UNADDRESSABLE;
                    "rows" => batch.unaddressable,
                    "why" => "id or dateModified unreadable; the row is skipped");
            }
        }
        for broken in &batch.broken {
            if self.fail_broken(broken).await? {
                round.broken += 1;
            }
        }
        let locked_elsewhere = self.hooks_locked_elsewhere(&batch.rows).await;
        let mut first = first;
        let mut starts = Vec::new();
        for candidate in batch.rows {
            if locked_elsewhere.contains(&candidate.webhook_phid)
                && !self
                    .local_state()
                    .resting
                    .contains_key(&candidate.webhook_phid)
            {
                // Once per hook: it rests from now on, and its later rows are passed over
                // below.
                self.metrics.skip(SkipReason::HookBusy);
                self.lock_held_elsewhere(&candidate.webhook_phid);
                continue;
            }
            {
                let state = self.local_state();
                if state.quarantined.contains(&candidate.id) {
                    continue;
                }
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
            starts.push((candidate, permit));
        }
        let preloads = match self.preload(&starts).await {
            Ok(preloads) => preloads,
            Err(err) => {
                // Nothing was done with these rows yet: leave them for the next poll.
                let mut state = self.local_state();
                for (candidate, _) in &starts {
                    state.rows.remove(&candidate.id);
                    state.hooks.remove(&candidate.webhook_phid);
                }
                return Err(err);
            }
        };
        round.started = starts.len();
        for ((candidate, permit), preload) in starts.into_iter().zip(preloads) {
            let this = Arc::clone(self);
            tokio::spawn(async move { this.work(candidate, permit, preload).await });
        }
        self.metrics.polls.inc();
        Ok(round)
    }

    /// The hooks of `rows` that this process could start now but whose lock another session
    /// holds (another replica, Phorge's worker): their rows would only take a free slot to
    /// be skipped at `GET_LOCK` (see `ClaimStore::hooks_locked_now`). Asked for once per
    /// round; when asking fails, nothing is known and `GET_LOCK` decides as before (logged
    /// once until the check works again).
    async fn hooks_locked_elsewhere(&self, rows: &[Candidate]) -> HashSet<String> {
        let hooks: Vec<&str> = {
            let state = self.local_state();
            let mut seen = HashSet::new();
            rows.iter()
                .map(|row| row.webhook_phid.as_str())
                .filter(|hook| {
                    !state.hooks.contains(*hook)
                        && !state.resting.contains_key(*hook)
                        && seen.insert(*hook)
                })
                .collect()
        };
        match self.store.hooks_locked_now(&hooks).await {
            Ok(locked) => {
                self.local_state().lock_check_failing = false;
                locked
            }
            Err(err) => {
                if matches!(err, ClaimError::Timeout(_)) {
                    self.metrics.db_timeouts.inc();
                }
                let first = !std::mem::replace(&mut self.local_state().lock_check_failing, true);
                if first {
                    emit!(self.log, events::WEBHOOK_LOCK_CHECK_FAILED;
                        "error" => crate::dberror::explain(&err, &self.config.db),
                        "effect" => "rows go to GET_LOCK unchecked");
                }
                HashSet::new()
            }
        }
    }

    /// The per-row reads for every row the round starts, in one query each: the hooks,
    /// their recent failures (breaker input), and each request's object and transactions.
    async fn preload(
        &self,
        starts: &[(Candidate, OwnedSemaphorePermit)],
    ) -> Result<Vec<Preload>, ClaimError> {
        if starts.is_empty() {
            return Ok(Vec::new());
        }
        let candidates: Vec<&Candidate> = starts.iter().map(|(candidate, _)| candidate).collect();
        let hooks: Vec<&str> = candidates
            .iter()
            .map(|candidate| candidate.webhook_phid.as_str())
            .collect();
        let since = self
            .clock
            .now_sec()
            .saturating_sub(self.config.error_backoff_sec);
        let mut loaded_hooks = self.store.load_hooks(&hooks).await?;
        let failures = self.store.recent_failures_by_hook(&hooks, since).await?;
        let requests = self.load_requests(&candidates).await?;
        Ok(candidates
            .iter()
            .zip(requests)
            .map(|(candidate, properties)| Preload {
                properties,
                // One row per hook starts per round: each hook is taken once.
                hook: loaded_hooks.remove(&candidate.webhook_phid),
                failures: failures.get(&candidate.webhook_phid).copied().unwrap_or(0),
            })
            .collect())
    }

    /// Each candidate's parsed properties with its object and transactions, loaded in one
    /// query per table for all of them (objects only for rows with usable properties: only
    /// they get that far).
    pub(super) async fn load_requests(
        &self,
        candidates: &[&Candidate],
    ) -> Result<Vec<Result<(RequestProperties, ObjectLoad), PropertiesError>>, ClaimError> {
        let properties: Vec<Result<RequestProperties, PropertiesError>> = candidates
            .iter()
            .map(|candidate| RequestProperties::parse(&candidate.properties))
            .collect();
        let wanted: Vec<(usize, (&str, &[String]))> = candidates
            .iter()
            .zip(&properties)
            .enumerate()
            .filter_map(|(i, (candidate, properties))| {
                let properties = properties.as_ref().ok()?;
                Some((
                    i,
                    (
                        candidate.object_phid.as_str(),
                        properties.transaction_phids.as_slice(),
                    ),
                ))
            })
            .collect();
        let requests: Vec<(&str, &[String])> = wanted.iter().map(|(_, r)| *r).collect();
        let mut objects: Vec<Option<ObjectLoad>> = vec![None; candidates.len()];
        for ((i, _), load) in wanted.iter().zip(self.store.load_objects(&requests).await?) {
            objects[*i] = Some(load);
        }
        Ok(properties
            .into_iter()
            .zip(objects)
            // Every row with usable properties has its object.
            .map(|(properties, object)| {
                properties.map(|properties| (properties, object.unwrap_or(ObjectLoad::Missing)))
            })
            .collect())
    }

    /// The hooks this round would skip, for the candidate query: hooks with a delivery
    /// running here first (at most `max_concurrent`, and they free up soonest), then resting
    /// ones. Forgets rests that are over. The store uses the first [`MAX_EXCLUDED_HOOKS`].
    fn hooks_to_exclude(&self) -> (Vec<String>, Round) {
        let now = self.clock.now_ms();
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
            ..Round::default()
        };
        (excluded, round)
    }

    /// Fails a row that cannot be read as stored (`invalid-row`), without a claim (the
    /// status change is the compare-and-set). True when this process wrote it.
    async fn fail_broken(&self, broken: &BrokenRow) -> Result<bool, ClaimError> {
        if self.local_state().quarantined.contains(&broken.id) {
            return Ok(false);
        }
        let properties = crate::outcome::invalid_row_properties(broken.properties.as_deref());
        match self
            .store
            .fail_unclaimable(broken.id, broken.date_modified, &properties)
            .await
        {
            Ok(true) => {
                match broken.oversized {
                    Some(bytes) => self.invalid_row(
                        broken.id,
                        InvalidRowReason::Oversized,
                        &format!(
                            "{} ({bytes} bytes; at most {MAX_PROPERTIES_BYTES}, or the \
                             server's max_allowed_packet less 64 KiB)",
                            broken.reason
                        ),
                    ),
                    None => {
                        self.invalid_row(broken.id, InvalidRowReason::Unreadable, broken.reason)
                    }
                }
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(err) if err.is_row_data_error() => {
                self.row_rejected(broken.id, &err, None).await;
                Ok(false)
            }
            Err(err) => Err(err),
        }
    }

    /// Counts and logs (once per row) a row failed with `invalid-row`.
    pub(super) fn invalid_row(&self, id: u64, reason: InvalidRowReason, why: &str) {
        self.metrics.invalid_row(reason);
        self.metrics.delivered(
            crate::outcome::DeliveryOutcome::Failed,
            crate::outcome::NOT_ATTEMPTED,
        );
        emit!(self.log, events::WEBHOOK_INVALID_ROW;
            "id" => id, "reason" => reason.label(), "why" => why,
            "code" => HookErrorCode::InvalidRow.as_str(), "status" => "failed");
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
