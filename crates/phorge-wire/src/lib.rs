//! Phorge's wire formats, with no I/O.
//!
//! Everything here is a byte-level contract with software we cannot change: Phorge's PHP
//! (`PhutilJSON`, `HeraldWebhookWorker`, `PhabricatorNotificationClient`) and the browser's
//! `JX.Aphlict`. Each module pins one format; tests pin its exact bytes.

#![warn(missing_docs)]

pub mod aphlict;
pub mod phid;
pub mod phutil_json;
pub mod values;
pub mod webhook;
