//! The claim protocol over Phorge's `{namespace}_herald.herald_webhookrequest` table.
//!
//! Phorge inserts one row per webhook call; this crate decides which process may deliver it,
//! using only the columns Phorge already has (no DDL, no new values):
//!
//! - Only rows Phorge has handed over are ever candidates, claimed or written: rows whose
//!   `properties` carry the kit's marker ([`handover`]); every other row is Phorge's own.
//! - [`ClaimStore::candidates`] only *finds* rows (leaving out hooks the caller will skip
//!   anyway); a row is ours only after [`ClaimStore::claim`] won a compare-and-set on
//!   `dateModified`, used as a row version.
//! - [`ClaimStore::write_result`] lands only while the row is still at our version, so a
//!   row taken over after a lease expiry is never written twice.
//! - A result write sets `dateModified = lastRequestEpoch`, the marker for "not in flight",
//!   so the claim lease (in-flight rows) and the retry backoff (rows with a result) are
//!   independent settings.
//! - [`ClaimStore::try_hook_lock`] serialises deliveries per hook across replicas (and with
//!   Phorge's own PHP worker) with Phorge's MySQL named lock, held on a dedicated connection.
//! - A process holding a hook's lock finds that hook's next fresh rows with
//!   [`ClaimStore::next_hook_rows`] (a bounded index scan, on the lock's own session) and
//!   delivers them under the same lock.
//! - [`ClaimStore::load_objects`] loads requests' objects and transactions as Phorge's
//!   worker does ([`objects`] says where each PHID type is stored).
//!
//! Every query takes `now` (Unix seconds) from the caller: time is injected, never read with
//! `UNIX_TIMESTAMP()`, so tests move the clock instead of sleeping.
//!
//! Row states, told apart without new columns:
//!
//! | state | condition | candidate when |
//! |---|---|---|
//! | fresh (as Lisk inserts it) | `dateModified = dateCreated AND lastRequestEpoch = 0` | at once |
//! | result written, still `queued` (`retry=forever`) | `dateModified = lastRequestEpoch` | `lastRequestEpoch <= now - backoff` |
//! | in flight (claimed, no result yet) | anything else | `dateModified <= now - lease` |
//!
//! Rows last saved by Phorge's PHP worker (`dateModified != lastRequestEpoch`) fall under the
//! lease rule.

#![warn(missing_docs)]

mod claims;
mod conn;
mod error;
pub mod handover;
mod hooks;
mod lock;
mod object_load;
pub mod objects;
mod rows;
mod stats;
mod store;
#[cfg(feature = "test-support")]
// Test support (never in a release build) whose row fields, which mirror the table's
// columns, are not documented yet; drop this allow once they are.
#[allow(missing_docs)]
pub mod testdb;

pub use claims::{BatchClaim, Claim, ResultWrite};
pub use error::ClaimError;
pub use hooks::Hook;
pub use lock::{hook_lock_name, HookLock};
pub use object_load::{ObjectLoad, Unchecked};
pub use phorge_wire::values::{RequestResult, RequestStatus};
pub use rows::{
    Batch, BrokenRow, Candidate, HOOK_SCAN_ROWS, MAX_EXCLUDED_HOOKS, MAX_PROPERTIES_BYTES,
};
pub use stats::{HookQueue, QueueDepth, Stats};
pub use store::{ClaimStore, ClaimTiming, PoolState, StoreOptions};
