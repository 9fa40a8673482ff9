//! The per-hook circuit breaker (Phorge's `HeraldWebhook::isInErrorBackoff`): at least
//! `threshold` failed requests of a hook within the window keep its rows queued, untouched.
//! Only transitions are logged; the number of open hooks is a gauge.

use gorge_claim::ClaimError;

use super::Dispatcher;
use crate::events;
use gorge_service::emit;

impl Dispatcher {
    /// Records the breaker state for `hook`; true when it is open. Logs only transitions.
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
}
