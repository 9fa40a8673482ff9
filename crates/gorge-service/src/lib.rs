//! The service mechanism both gorge binaries share, and nothing domain-specific.
//!
//! - [`cli`]: the shared command line and the runtime `main` ends in;
//! - [`config`]: one-line validation errors, exit code 2, secrets, the `--check-config` format;
//! - [`envfile`]: `--env-file`, read exactly as systemd's `EnvironmentFile=` reads it;
//! - [`fdlimit`]: the open-file limit, read and raised to the hard limit;
//! - [`settings`]: the one declaration of a service's settings and everything made from it;
//! - [`derived`]: what follows from the settings (how long a stop may take, effective values),
//!   declared once and printed, logged, documented and handed to the chart from there;
//! - [`docs`]: the docs tables generated from declarations, and the check that they match;
//! - [`variables`]: every variable a service reads, as the docs table and the chart's catalog;
//! - [`events`]: one declaration per log event, emitted through it with [`emit!`];
//! - [`logging`]: slog JSON or text, levels (per component) from the environment, async drain;
//! - [`log_every`]: a repeated failure logged once per interval with a count;
//! - [`log_text`]: the text log format, one line per record;
//! - [`http`]: response helpers, the `{"error":…}` envelope, bounded body reading;
//! - [`http10`]: HTTP/1.0 WebSocket upgrades read as HTTP/1.1, as Node serves them;
//! - [`metrics`]: one declaration per metric family, the prefixed service registry with
//!   `build_info`, and the `process_*` metrics;
//! - [`probes`]: `/healthz`, `/readyz` (service-supplied readiness), `/metrics`;
//! - [`server`]: bind every listener first, then serve them all;
//! - [`shutdown`]: the shutdown signal and [`shutdown::run`], the coordinated graceful stop;
//! - [`takeover`]: before binding, refuse to start beside a copy that serves (not drains);
//! - [`healthcheck`]: the container `healthcheck` subcommand (images carry no curl).
//!
//! Where to start reading: [`shutdown::run`], which ties the others together.

#![warn(missing_docs)]

pub mod cli;
pub mod config;
pub mod derived;
pub mod docs;
pub mod envfile;
pub mod events;
pub mod fdlimit;
pub mod healthcheck;
pub mod http;
pub mod http10;
pub mod log_every;
pub mod log_text;
pub mod logging;
pub mod metrics;
pub mod probes;
pub mod server;
pub mod settings;
pub mod shutdown;
pub mod takeover;
pub mod variables;

pub use config::{ConfigError, Secret};
pub use http::{Body, Response};
pub use probes::{Probes, ReadinessCheck, ReadinessWarnings};
#[doc(hidden)]
pub use prometheus_client as __prometheus_client;
pub use server::{
    bind_all, Accepted, BindError, BoundListener, ConnectionCap, ConnectionSlot, Handler,
    ListenerSpec, TlsServing,
};
pub use shutdown::{run, DrainHook, RunError, RunOptions, Shutdown};
#[doc(hidden)]
pub use slog as __slog;
