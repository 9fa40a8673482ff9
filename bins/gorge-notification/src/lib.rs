//! gorge-notification: a drop-in replacement for Phorge's Aphlict notification server, as a
//! library so that tests can run it in-process (with the hub's manual clock).
//!
//! Where to start reading: [`service`] (wiring), then [`admin`] (PHP's port) and [`client_port`] /
//! [`session`] (browsers' port). The hub itself is the `gorge-hub` crate, the wire formats
//! `phorge-wire`.
//!
//! - [`state`]: what the handlers share (the hub, metrics, limits, the relay);
//! - [`config`]: defaults, the Aphlict file and the environment, validated at startup;
//! - [`admin`]: `POST /`, `/status/`, `/history/` and the probes;
//! - [`runtimes`]: the admin port's own thread, out of the browsers' reach, and the
//!   browsers' sockets' threads, at a lower scheduling priority;
//! - [`ingest`]: taking a message in (parse, stamp, count, hand to the fan-out), from PHP, a
//!   peer or the broker;
//! - [`recent_ids`]: the `uniqueID`s taken in recently, so each message is taken in once;
//! - [`warmup`]: a starting server fills its history from a ready peer;
//! - [`client_port`]: WebSocket upgrades and the exact 501;
//! - [`session`]: one task per socket (reads, and the writes the fan-out could not finish);
//! - [`budget`]: each socket's inbound budget (frames and bytes per second);
//! - [`fanout`]: the thread that delivers accepted messages, so the admin POST never waits;
//! - [`frames`]: WebSocket frames encoded once, and the bounded reader of client frames;
//! - [`drain`]: the graceful drain on SIGTERM;
//! - [`cluster`]: alone, a mesh of peers or a broker, chosen once at startup;
//! - [`peers`]: relaying to the other servers of a cluster;
//! - [`broker`]: broker mode, the cluster on a Redis stream instead of peers;
//! - [`history_gate`]: `/readyz` and client commands wait until the history is filled;
//! - [`metrics`]: the Prometheus metrics;
//! - [`fdlimit`]: raising the open-file limit at startup;
//! - [`memory`]: handing freed heap memory back after a large release (an attack's sockets);
//! - [`tls`]: TLS on a server entry, its files checked and a renewal taken while serving;
//! - [`inspect`]: the `selftest` and `status` subcommands, which check a running server.

pub mod admin;
pub mod broker;
pub mod budget;
pub mod client_port;
pub mod cluster;
pub mod config;
pub mod drain;
pub mod events;
pub mod fanout;
pub mod fdlimit;
pub mod frames;
pub mod history_gate;
pub mod ingest;
pub mod inspect;
pub mod memory;
pub mod metrics;
pub mod peers;
pub mod recent_ids;
pub mod runtimes;
pub mod service;
pub mod session;
pub mod state;
pub mod tls;
pub mod warmup;
