//! `herald_webhook` rows and the breaker counts of hooks, for all hooks of a poll round in
//! one query each (`IN` lists padded to powers of two, so the prepared-statement cache sees
//! a few shapes).

use std::collections::HashMap;

use phorge_wire::values::HookStatus;

use crate::error::ClaimError;
use crate::store::{int, text, ClaimStore};

/// A `herald_webhook` row, as much of it as delivery needs.
#[derive(Clone, PartialEq, Eq)]
pub struct Hook {
    /// The hook's PHID (`PHID-HWBH-…`).
    pub phid: String,
    /// Where requests are POSTed, as stored.
    pub uri: String,
    /// Raw `status`; see [`Hook::hook_status`].
    pub status: String,
    /// The HMAC key (secret: never log it; `Debug` masks it).
    pub hmac_key: String,
}

impl Hook {
    /// The typed status; `None` for a value Phorge does not define.
    pub fn hook_status(&self) -> Option<HookStatus> {
        HookStatus::parse(&self.status)
    }
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hook")
            .field("phid", &self.phid)
            .field("uri", &self.uri)
            .field("status", &self.status)
            .field("hmac_key", &"********")
            .finish()
    }
}

impl ClaimStore {
    /// The hook row, or `None` when it does not exist. A hook whose columns are not UTF-8
    /// text is [`ClaimError::InvalidRow`].
    pub async fn load_hook(&self, phid: &str) -> Result<Option<Hook>, ClaimError> {
        match self.load_hooks(&[phid]).await?.remove(phid) {
            None => Ok(None),
            Some(Ok(hook)) => Ok(Some(hook)),
            Some(Err(why)) => Err(ClaimError::InvalidRow(why)),
        }
    }

    /// The hook rows of `phids` that exist, by PHID, in one query; `Err` for a hook whose
    /// columns are not UTF-8 text.
    pub async fn load_hooks(
        &self,
        phids: &[&str],
    ) -> Result<HashMap<String, Result<Hook, &'static str>>, ClaimError> {
        let rows = self
            .select_in(phids, &[], "hook query", |list| {
                format!(
                    "SELECT phid, webhookURI, status, hmacKey FROM herald_webhook \
                     WHERE phid IN ({list})"
                )
            })
            .await?;
        let mut hooks = HashMap::new();
        for mut row in rows {
            // A PHID that matched a UTF-8 one is UTF-8 itself (the column is binary).
            let Some(phid) = text(&mut row, 0) else {
                continue;
            };
            let hook = (|| {
                Some(Hook {
                    phid: phid.clone(),
                    uri: text(&mut row, 1)?,
                    status: text(&mut row, 2)?,
                    hmac_key: text(&mut row, 3)?,
                })
            })();
            hooks.insert(
                phid,
                hook.ok_or("a herald_webhook column is not UTF-8 text"),
            );
        }
        Ok(hooks)
    }

    /// Circuit breaker input: rows of this hook whose last request failed at or after
    /// `since_epoch` (served by the `key_ratelimit` index).
    pub async fn recent_failures(
        &self,
        hook_phid: &str,
        since_epoch: u64,
    ) -> Result<u64, ClaimError> {
        let counts = self
            .recent_failures_by_hook(&[hook_phid], since_epoch)
            .await?;
        Ok(counts.get(hook_phid).copied().unwrap_or(0))
    }

    /// [`ClaimStore::recent_failures`] of each hook in `hook_phids`, in one query per
    /// 512 hooks; hooks without recent failures are absent.
    pub async fn recent_failures_by_hook(
        &self,
        hook_phids: &[&str],
        since_epoch: u64,
    ) -> Result<HashMap<String, u64>, ClaimError> {
        let rows = self
            .select_in(hook_phids, &[since_epoch.into()], "breaker query", |list| {
                format!(
                    "SELECT webhookPHID, COUNT(*) FROM herald_webhookrequest \
                     WHERE webhookPHID IN ({list}) AND lastRequestResult = 'fail' \
                     AND lastRequestEpoch >= ? GROUP BY webhookPHID"
                )
            })
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|mut row| Some((text(&mut row, 0)?, int(&mut row, 1)?)))
            .collect())
    }
}
