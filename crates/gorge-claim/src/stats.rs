//! Counts for the API and the gauges: requests by status, active hooks, the backlog and its
//! oldest row, per hook. Read-only; never on the delivery path.

use mysql_async::prelude::Queryable;
use phorge_wire::values::RequestStatus;

use crate::error::ClaimError;
use crate::store::ClaimStore;

/// Row counts for `/api/webhook/stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Rows with status `queued`.
    pub queued: u64,
    /// Rows with status `sent`.
    pub sent: u64,
    /// Rows with status `failed`.
    pub failed: u64,
    /// Hooks with status `enabled` or `firehose`.
    pub active_hooks: u64,
}

/// The backlog, for a gauge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepth {
    /// Rows with status `queued`, in flight or waiting.
    pub queued: u64,
    /// `now - MIN(dateCreated)` over queued rows; `None` when nothing is queued.
    pub oldest_age_sec: Option<u64>,
}

/// One hook's part of the backlog, for the diagnostic API: counts and PHIDs only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookQueue {
    /// The hook's PHID.
    pub hook_phid: String,
    /// Its rows with status `queued` (Phorge's own included).
    pub queued: u64,
    /// `now - dateCreated` of its oldest queued row.
    pub oldest_age_sec: u64,
    /// The PHID of that row (the one Phorge's Herald webhook page lists first).
    pub oldest_request_phid: String,
}

impl ClaimStore {
    /// Request counts by status and the number of active hooks.
    pub async fn stats(&self) -> Result<Stats, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.query::<(String, u64), _>(
                "SELECT status, COUNT(*) FROM herald_webhookrequest GROUP BY status",
            ))
            .await;
        let (mut conn, by_status) = self.settle(conn, out, "stats query")?;
        let out = self
            .timed(conn.query_first::<u64, _>(
                "SELECT COUNT(*) FROM herald_webhook WHERE status IN ('enabled', 'firehose')",
            ))
            .await;
        let (_conn, active) = self.settle(conn, out, "stats query")?;
        let mut stats = Stats {
            active_hooks: active.unwrap_or(0),
            ..Stats::default()
        };
        for (status, count) in by_status {
            match RequestStatus::parse(&status) {
                Some(RequestStatus::Queued) => stats.queued = count,
                Some(RequestStatus::Sent) => stats.sent = count,
                Some(RequestStatus::Failed) => stats.failed = count,
                None => {}
            }
        }
        Ok(stats)
    }

    /// Number of hooks, whatever their status.
    pub async fn hook_count(&self) -> Result<u64, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.query_first::<u64, _>("SELECT COUNT(*) FROM herald_webhook"))
            .await;
        let (_conn, count) = self.settle(conn, out, "hook count")?;
        Ok(count.unwrap_or(0))
    }

    /// Queued rows and the age of the oldest one.
    pub async fn queue_depth(&self, now: u64) -> Result<QueueDepth, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.query_first::<(u64, Option<u64>), _>(
                "SELECT COUNT(*), MIN(dateCreated) FROM herald_webhookrequest WHERE status = 'queued'",
            ))
            .await;
        let (_conn, row) = self.settle(conn, out, "queue depth")?;
        let (queued, oldest) = row.unwrap_or((0, None));
        Ok(QueueDepth {
            queued,
            oldest_age_sec: oldest.map(|created| now.saturating_sub(created)),
        })
    }

    /// The hooks with queued rows, the one waiting longest first, at most `limit` of them.
    /// One grouped scan of the queued rows (the `key_status` index), then one row per hook.
    pub async fn queue_by_hook(&self, now: u64, limit: u64) -> Result<Vec<HookQueue>, ClaimError> {
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec::<(String, u64, u64, String), _, _>(
                "SELECT g.webhookPHID, g.queued, g.oldest, r.phid FROM \
                   (SELECT webhookPHID, COUNT(*) AS queued, MIN(dateCreated) AS oldest, \
                           MIN(id) AS first_id \
                    FROM herald_webhookrequest WHERE status = 'queued' \
                    GROUP BY webhookPHID ORDER BY first_id LIMIT ?) AS g \
                 JOIN herald_webhookrequest AS r ON r.id = g.first_id \
                 ORDER BY g.first_id",
                (limit,),
            ))
            .await;
        let (_conn, rows) = self.settle(conn, out, "queue by hook")?;
        Ok(rows
            .into_iter()
            .map(|(hook_phid, queued, oldest, phid)| HookQueue {
                hook_phid,
                queued,
                oldest_age_sec: now.saturating_sub(oldest),
                oldest_request_phid: phid,
            })
            .collect())
    }
}
