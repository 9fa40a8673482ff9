//! The per-hook MySQL named lock: one delivery at a time per hook, across all replicas.
//!
//! `GET_LOCK` belongs to a server session, so the lock owns the pooled connection it was
//! taken on until released. If the process dies, the server frees the lock with the session.
//! If a [`HookLock`] is dropped without [`HookLock::release`], the lock is released in the
//! background and, as a second line, the connection is reset when it returns to the pool
//! (`COM_RESET_CONNECTION` frees named locks), so a lock never outlives its holder. If the
//! release fails or times out, the connection is given up and its session killed from a
//! fresh connection (`conn.rs`): a session whose network path died would otherwise keep the
//! lock until the server's `wait_timeout`. Statements on the lock's own session (a held
//! hook's next rows, their claim, their result writes) give the session up when they fail
//! ([`ClaimStore::settle_on`]), so a lock that may be lost is never assumed held.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use ring::digest;

use crate::conn::Sessions;
use crate::error::ClaimError;
use crate::store::{ClaimStore, Timed};

/// Characters of Phorge's `PhabricatorHash::digestForIndex`, indexed by `byte & 0x3F`.
const INDEX_ALPHABET: &[u8; 64] =
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ._";

/// Phorge's `PhabricatorHash::digestToLength(s, 20)`: the first 7 bytes of `s`, `-`, and 12
/// characters of its SHA-1 (always hashed, however short `s` is).
fn digest_to_length_20(s: &str) -> String {
    let hash = digest::digest(&digest::SHA1_FOR_LEGACY_USE_ONLY, s.as_bytes());
    let prefix = &s.as_bytes()[..s.len().min(7)];
    let mut out = String::from_utf8_lossy(prefix).into_owned();
    out.push('-');
    out.extend(
        hash.as_ref()[..12]
            .iter()
            .map(|b| char::from(INDEX_ALPHABET[usize::from(b & 0x3F)])),
    );
    out
}

/// The MySQL lock name Phorge's `HeraldWebhookWorker` takes for a hook:
/// `PhabricatorGlobalLock::newLock('webhook(<hookPHID>)')`, i.e.
/// `ph:<D(namespace)>:<D("webhook(<hookPHID>)()")>` (the trailing `()` is the empty
/// parameter list). Taking the same name makes a PHP worker still running during the
/// hand-over and this service exclude each other per hook. Always 44 characters or fewer.
pub fn hook_lock_name(namespace: &str, hook_phid: &str) -> String {
    format!(
        "ph:{}:{}",
        digest_to_length_20(namespace),
        digest_to_length_20(&format!("webhook({hook_phid})()"))
    )
}

/// A held per-hook lock. Release it after the result write with [`HookLock::release`].
pub struct HookLock {
    conn: Option<Conn>,
    name: String,
    /// The store's gauge of held locks; decremented when the connection is given up.
    held: Arc<AtomicUsize>,
    timeout: Duration,
    /// Ends the session of a connection whose release failed.
    sessions: Sessions,
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
    pub(crate) fn held(
        mut conn: Conn,
        name: String,
        held: Arc<AtomicUsize>,
        timeout: Duration,
        sessions: Sessions,
    ) -> HookLock {
        // Until the lock is released, a connection that returns to the pool is reset
        // (which frees the lock) before anyone else gets it.
        conn.reset_connection(true);
        held.fetch_add(1, Ordering::SeqCst);
        HookLock {
            conn: Some(conn),
            name,
            held,
            timeout,
            sessions,
        }
    }

    /// The lock name on the server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session holding the lock, while it is still ours: statements run on it prove the
    /// session (and with it the lock) is alive (see `rows.rs`, `claims.rs`). After [`HookLock::give_up`],
    /// the error every statement on the lock's session then fails with.
    pub(crate) fn session(&mut self) -> Result<&mut Conn, ClaimError> {
        self.conn
            .as_mut()
            .ok_or(ClaimError::Timeout("the hook lock's session was given up"))
    }

    /// Gives up the lock's session after a statement on it failed or timed out: closed, and
    /// killed from a fresh connection so that the server frees the lock (see `conn.rs`).
    pub(crate) fn give_up(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.sessions.discard(conn);
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// True while the lock's session has not been given up.
    pub fn is_held(&self) -> bool {
        self.conn.is_some()
    }

    /// Releases the lock and returns the connection to the pool.
    pub async fn release(mut self) -> Result<(), ClaimError> {
        let Some(conn) = self.conn.take() else {
            return Ok(());
        };
        let released = release_on(conn, &self.name, self.timeout, &self.sessions).await;
        self.held.fetch_sub(1, Ordering::SeqCst);
        released
    }
}

/// `RELEASE_LOCK(name)` on `conn`, then back to the pool (without a reset: nothing is held
/// any more). On error or timeout the session may still hold the lock: the connection is
/// given up and its session killed, so that the server frees the lock.
async fn release_on(
    mut conn: Conn,
    name: &str,
    timeout: Duration,
    sessions: &Sessions,
) -> Result<(), ClaimError> {
    match tokio::time::timeout(timeout, conn.exec_drop("DO RELEASE_LOCK(?)", (name,))).await {
        Ok(Ok(())) => {
            conn.reset_connection(false);
            Ok(())
        }
        Ok(Err(err)) => {
            sessions.discard(conn);
            Err(ClaimError::Database(err))
        }
        Err(_) => {
            sessions.discard(conn);
            Err(ClaimError::Timeout("RELEASE_LOCK"))
        }
    }
}

impl Drop for HookLock {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let name = std::mem::take(&mut self.name);
        let (held, timeout) = (Arc::clone(&self.held), self.timeout);
        let sessions = self.sessions.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = release_on(conn, &name, timeout, &sessions).await;
                held.fetch_sub(1, Ordering::SeqCst);
            });
        } else {
            held.fetch_sub(1, Ordering::SeqCst);
        }
        // Without a runtime the connection returns to the pool, which resets it.
    }
}

impl ClaimStore {
    /// [`ClaimStore::settle`] for a statement on the session of `lock`: on an error or a
    /// timeout the session is given up ([`HookLock::give_up`]), so the lock is no longer
    /// assumed held.
    pub(crate) fn settle_on<'a, T>(
        &self,
        lock: &'a mut HookLock,
        out: Timed<T>,
        what: &'static str,
    ) -> Result<(&'a mut Conn, T), ClaimError> {
        match out {
            Ok(Ok(value)) => Ok((lock.session()?, value)),
            Ok(Err(err)) => {
                lock.give_up();
                Err(self.err(err))
            }
            Err(_) => {
                lock.give_up();
                Err(ClaimError::Timeout(what))
            }
        }
    }

    /// Takes the per-hook named lock (Phorge's name, see [`hook_lock_name`]) without
    /// waiting; `None`: another delivery of this hook (in any process, PHP's worker
    /// included) holds it. The lock lives on a connection of the lock pool owned by the
    /// [`HookLock`].
    pub async fn try_hook_lock(&self, hook_phid: &str) -> Result<Option<HookLock>, ClaimError> {
        let name = hook_lock_name(&self.namespace, hook_phid);
        let mut conn = Self::conn_from(&self.locks, &self.options, &self.database).await?;
        let out = self
            .timed(conn.exec_first::<Option<i64>, _, _>("SELECT GET_LOCK(?, 0)", (&name,)))
            .await;
        let got = match out {
            Ok(Ok(got)) => got,
            Ok(Err(err)) => return Err(self.err(err)),
            Err(_) => {
                // The server may have granted the lock to a session we cannot hear from.
                self.sessions.discard(conn);
                return Err(ClaimError::Timeout("GET_LOCK"));
            }
        };
        match got.flatten() {
            Some(1) => Ok(Some(HookLock::held(
                conn,
                name,
                Arc::clone(&self.locks_held),
                self.options.query_timeout,
                self.sessions.clone(),
            ))),
            Some(_) => Ok(None),
            None => Err(ClaimError::UnexpectedNull("GET_LOCK")),
        }
    }

    /// Which of `hooks` have their lock held by some session right now (`IS_FREE_LOCK`, one
    /// statement for all of them). A poll round asks before starting rows, so that the rows
    /// of hooks another replica (or Phorge's worker) is delivering do not take its free
    /// slots only to be skipped at `GET_LOCK`. A hint, not a lock: a lock can be taken or
    /// freed right after, and [`ClaimStore::try_hook_lock`] still decides.
    ///
    /// The list is padded to a power of two (repeating its last hook) so that the driver's
    /// statement cache sees a few shapes. A `NULL` answer (an error on the server's side)
    /// counts as free: `GET_LOCK` will tell.
    pub async fn hooks_locked_now(
        &self,
        hooks: &[&str],
    ) -> Result<std::collections::HashSet<String>, ClaimError> {
        let mut locked = std::collections::HashSet::new();
        let Some(last) = hooks.last() else {
            return Ok(locked);
        };
        let width = hooks.len().next_power_of_two();
        let mut names: Vec<String> = hooks
            .iter()
            .map(|hook| hook_lock_name(&self.namespace, hook))
            .collect();
        names.resize(width, hook_lock_name(&self.namespace, last));
        let sql = format!("SELECT {}", vec!["IS_FREE_LOCK(?)"; width].join(", "));
        let mut conn = self.conn().await?;
        let out = self
            .timed(conn.exec_first::<mysql_async::Row, _, _>(sql, names))
            .await;
        let (_conn, row) = self.settle(conn, out, "lock check")?;
        let Some(row) = row else {
            return Ok(locked);
        };
        for (i, hook) in hooks.iter().enumerate() {
            if let Some(Ok(Some(0))) = row.get_opt::<Option<i64>, _>(i) {
                locked.insert((*hook).to_owned());
            }
        }
        Ok(locked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_phorges() {
        assert_eq!(
            hook_lock_name("phabricator", "PHID-HWBH-aaaaaaaaaaaaaaaaaaaa"),
            "ph:phabric-6rILUDHKjHKu:webhook-5PEtnTSnIh3k"
        );
        // A namespace shorter than the prefix is still hashed.
        assert_eq!(
            hook_lock_name("x", "PHID-HWBH-aaaaaaaaaaaaaaaaaaaa"),
            "ph:x-hSJe5GF4HGZY:webhook-5PEtnTSnIh3k"
        );
    }

    #[test]
    fn long_phids_stay_within_mysql_limit() {
        let phid = format!("PHID-HWBH-{}", "x".repeat(200));
        assert!(hook_lock_name(&"n".repeat(64), &phid).len() <= 64);
    }
}
