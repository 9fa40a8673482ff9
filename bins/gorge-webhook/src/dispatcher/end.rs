//! How one row's steps end, and the one place each ending is counted and logged.
//!
//! The per-request steps ([`super::row`]) return a [`RowEnd`] from every exit, database
//! errors included; [`Dispatcher::finish_row`] turns it into the row's metric and log line.
//! A cause found along the way (invalid `properties`, a refused URI, an unreadable hook row)
//! is logged where it is found; how the row then ended is logged here.

use gorge_claim::ClaimError;

use super::Dispatcher;
use crate::events;
use crate::outcome::{Decision, DeliveryOutcome, SkipReason};
use gorge_claim::Candidate;
use gorge_service::emit;

/// How the per-request steps for one candidate ended.
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
    /// Counts and logs how `candidate`'s steps ended.
    pub(super) async fn finish_row(&self, candidate: &Candidate, end: RowEnd) {
        let request = &candidate.phid;
        let hook = &candidate.webhook_phid;
        if !matches!(end, RowEnd::DbError(_)) {
            self.local_state().row_db_failing = false;
        }
        match end {
            RowEnd::Skipped(reason) => self.metrics.skip(reason),
            RowEnd::NotClaimed { lost } => {
                self.local_state().row_errors.remove(&candidate.id);
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
                self.local_state().row_errors.remove(&candidate.id);
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
}
