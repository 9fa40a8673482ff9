//! gorge-webhook: delivers Phorge's Herald webhook requests from Phorge's own
//! `herald_webhookrequest` table, byte-compatible with `HeraldWebhookWorker`.
//!
//! Where to start reading: [`service`] (wiring and shutdown order), then [`dispatcher`]
//! (the poll loop and the per-request steps), then [`delivery`] and [`policy`] (the POST and where it may go). The claim protocol itself
//! lives in the `gorge-claim` crate, the request bytes in `phorge-wire`.
//!
//! - [`service`]: wiring and graceful shutdown (the counterpart of gorge-notification's
//!   `service`);
//! - [`config`]: settings from defaults, file and environment, validated at startup;
//! - [`policy`]: the outbound blacklist and the checked (pinned) addresses;
//! - [`delivery`]: one signed POST with redirects and a whole-request timeout;
//! - [`connector`]: connections to receivers: the pooled hyper client and the connector that
//!   dials only checked addresses;
//! - [`tls`]: trusted CAs (bundled, system, `GORGE_WEBHOOK_CA_FILE`) and TLS error codes;
//! - [`fdlimit`]: the status port's connection cap, keeping descriptors for deliveries;
//! - [`dberror`]: database errors with where the service connects and the usual fixes;
//! - [`dispatcher`]: polling, claiming, the breaker, writing results;
//! - [`handover`]: whether Phorge hands requests over at all (readiness, one log line);
//! - [`outcome`]: what an attempt writes back, in Phorge's values, and the labels it is
//!   counted under;
//! - [`api`]: `/api/webhook/*` and the probes;
//! - [`metrics`]: the Prometheus metrics;
//! - [`clock`]: injectable time.

pub mod api;
pub mod clock;
pub mod config;
pub mod connector;
pub mod dberror;
pub mod delivery;
pub mod dispatcher;
pub mod events;
pub mod fdlimit;
pub mod handover;
pub mod metrics;
pub mod outcome;
pub mod policy;
pub mod service;
pub mod stall;
pub mod tls;
