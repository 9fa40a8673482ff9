//! The per-hook MySQL named lock: one delivery at a time per hook, across all replicas.
//!
//! `GET_LOCK` belongs to a server session, so the lock owns the pooled connection it was
//! taken on until released. If the process dies, the server frees the lock with the session.
//! If a [`HookLock`] is dropped without [`HookLock::release`], the lock is released in the
//! background and, as a second line, the connection is reset when it returns to the pool
//! (`COM_RESET_CONNECTION` frees named locks), so a lock never outlives its holder.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use ring::digest;

use crate::error::ClaimError;

/// MySQL 5.7+ rejects lock names longer than this many characters.
const MAX_LOCK_NAME_CHARS: usize = 64;

/// The lock name for a hook: `webhook(<hookPHID>)` (the name Phorge's worker used), or,
/// when that exceeds MySQL's 64-character limit, `webhook-sha256(<48 hex>)` from the
/// SHA-256 of the PHID, stable across processes and versions.
pub fn hook_lock_name(hook_phid: &str) -> String {
    let plain = format!("webhook({hook_phid})");
    if plain.chars().count() <= MAX_LOCK_NAME_CHARS {
        return plain;
    }
    let hash = digest::digest(&digest::SHA256, hook_phid.as_bytes());
    let hex: String = hash.as_ref()[..24]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("webhook-sha256({hex})")
}

/// A held per-hook lock. Release it after the result write with [`HookLock::release`].
pub struct HookLock {
    conn: Option<Conn>,
    name: String,
}

impl std::fmt::Debug for HookLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookLock")
            .field("name", &self.name)
            .finish()
    }
}

impl HookLock {
    /// Wraps the connection on which `GET_LOCK(name, …)` returned 1.
    pub(crate) fn held(mut conn: Conn, name: String) -> HookLock {
        // Whatever the pool options say, a connection that carried a lock is reset
        // (which frees the lock) before anyone else gets it.
        conn.reset_connection(true);
        HookLock {
            conn: Some(conn),
            name,
        }
    }

    /// The lock name on the server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Releases the lock and returns the connection to the pool.
    pub async fn release(mut self) -> Result<(), ClaimError> {
        let Some(conn) = self.conn.take() else {
            return Ok(());
        };
        release_on(conn, &self.name)
            .await
            .map_err(ClaimError::Database)
    }
}

/// `RELEASE_LOCK(name)` on `conn`, then back to the pool. On error the session may still
/// hold the lock: it is ended so that the server frees the lock.
async fn release_on(mut conn: Conn, name: &str) -> Result<(), mysql_async::Error> {
    let released = conn.exec_drop("DO RELEASE_LOCK(?)", (name,)).await;
    if released.is_err() {
        let _ = conn.disconnect().await;
    }
    released
}

impl Drop for HookLock {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let name = std::mem::take(&mut self.name);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = release_on(conn, &name).await;
            });
        }
        // Without a runtime the connection returns to the pool, which resets it.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_phid_uses_phorge_name() {
        assert_eq!(
            hook_lock_name("PHID-HWBH-abcdefghijklmnopqrst"),
            "webhook(PHID-HWBH-abcdefghijklmnopqrst)"
        );
    }

    #[test]
    fn long_phid_is_hashed_within_the_limit() {
        let phid = format!("PHID-HWBH-{}", "x".repeat(60));
        let name = hook_lock_name(&phid);
        assert_eq!(name.len(), 64);
        assert!(name.starts_with("webhook-sha256("));
        assert_eq!(name, hook_lock_name(&phid));
        assert_ne!(name, hook_lock_name(&format!("{phid}y")));
    }

    #[test]
    fn limit_is_inclusive() {
        let phid = "P".repeat(64 - "webhook()".len());
        assert_eq!(hook_lock_name(&phid), format!("webhook({phid})"));
    }
}
