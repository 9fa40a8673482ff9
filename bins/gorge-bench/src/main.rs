//! gorge-bench: load figures and fault drills for gorge-notification and gorge-webhook.
//!
//! Every subcommand talks only to loopback, stops by itself within `--timeout`, and ends
//! with exactly one JSON summary line on stdout (progress and drill narration go to stderr).

mod browser;
mod chaos;
mod cluster;
mod cpu_quota;
mod drill;
mod flood;
mod floor;
mod handshakes;
mod herald_db;
mod histogram;
mod hogs;
mod http1;
mod notify;
mod procs;
mod raw_browser;
mod receiver;
mod redis_server;
mod server_metrics;
mod summary;
mod sys;
mod tls;
mod webhook;

use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(name = "gorge-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// WebSocket fan-out load against an Aphlict-compatible server.
    Notify(notify::NotifyArgs),
    /// Drain a seeded herald_webhookrequest backlog with gorge-webhook processes.
    Webhook(webhook::WebhookArgs),
    /// Cross-node POST→frame latency and CPU per message of a cluster, mesh or Redis.
    Cluster(cluster::ClusterArgs),
    /// Fault drills with a PASS/FAIL verdict.
    Drill(drill::DrillArgs),
    /// Anonymous sockets flooding one kind of frame while admin POSTs are timed.
    Flood(flood::FloodArgs),
    /// Anonymous sockets filling the subscription total; a newcomer's message, and RSS
    /// before, at the peak and after they close.
    Hogs(hogs::HogsArgs),
    /// Seeded overlapping faults against both services under load, checked for loss.
    Chaos(chaos::ChaosArgs),
    /// The floor to compare against: a minimal server that writes one pre-encoded frame to
    /// every socket in a tight non-blocking loop.
    Floor(floor::FloorArgs),
    /// New browser connections per second (TCP, TLS for wss://, WebSocket upgrade, close)
    /// and the server's CPU time per connection.
    Handshakes(handshakes::HandshakesArgs),
}

/// Longest share of `--timeout` kept back from the work for cleanup (stopping children,
/// dropping the database, printing the summary).
const CLEANUP_RESERVE: Duration = Duration::from_secs(15);

/// When a subcommand must stop working so that its cleanup still ends within `--timeout`
/// (the reserve is a fifth of the timeout, at most [`CLEANUP_RESERVE`]).
pub fn work_deadline(timeout_s: u64) -> Instant {
    let timeout = Duration::from_secs(timeout_s);
    Instant::now() + timeout - CLEANUP_RESERVE.min(timeout / 5)
}

fn main() {
    let cli = Cli::parse();
    // Two workers: the machine has two cores and the server under test needs them too (the
    // floor gets the same two, as gorge does, so a loaded machine treats both alike).
    let built = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let runtime = match built {
        Ok(rt) => rt,
        Err(e) => {
            println!(
                "{}",
                summary::summary_line("start", json!({"ok": false, "error": e.to_string()}))
            );
            std::process::exit(1);
        }
    };
    let (name, timeout) = match &cli.command {
        Command::Notify(a) => ("notify", a.timeout),
        Command::Webhook(a) => ("webhook", a.timeout),
        Command::Drill(a) => ("drill", a.timeout),
        Command::Cluster(a) => ("cluster", a.timeout),
        Command::Floor(a) => ("floor", a.timeout),
        Command::Flood(a) => ("flood", a.timeout),
        Command::Hogs(a) => ("hogs", a.timeout),
        Command::Handshakes(a) => ("handshakes", a.timeout),
        Command::Chaos(a) => ("chaos", a.limit_s()),
    };
    // The hard stop: dropping the work kills the children (kill_on_drop) and drops the
    // test database (TestDb's Drop); the subcommands' own deadlines normally end first.
    let limit = Duration::from_secs(timeout);
    let result = runtime.block_on(async move {
        let work = async move {
            match cli.command {
                Command::Notify(a) => notify::run(a).await,
                Command::Webhook(a) => webhook::run(a).await,
                Command::Drill(a) => drill::run(a).await,
                Command::Cluster(a) => cluster::run(a).await,
                Command::Floor(a) => floor::run(a).await,
                Command::Flood(a) => flood::run(a).await,
                Command::Hogs(a) => hogs::run(a).await,
                Command::Handshakes(a) => handshakes::run(a).await,
                Command::Chaos(a) => chaos::run(a).await,
            }
        };
        tokio::time::timeout(limit, work)
            .await
            .unwrap_or_else(|_| json!({"ok": false, "error": "timed out", "timeout_s": timeout}))
    });
    // A drill that restarts MariaDB must leave it running whatever happened above.
    if name == "drill" {
        drill::mariadb::ensure_running();
    }
    let line = summary::summary_line(name, result);
    println!("{line}");
    // Do not wait for stuck sockets or blocking tasks: the summary is out, the run is over.
    runtime.shutdown_timeout(Duration::from_secs(1));
    std::process::exit(if summary::is_ok(&line) { 0 } else { 1 });
}
