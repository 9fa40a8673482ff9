//! `gorge-bench drill`: fault drills. Each drill states what must hold, checks it, and
//! ends in PASS or FAIL; the narration goes to stderr, the verdicts into the summary line.

pub mod mariadb;
mod notify_faults;
mod webhook_faults;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::{json, Value};

use crate::procs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DrillName {
    /// SIGKILL a webhook process mid-delivery: no row lost, duplicates only at the crash.
    Kill9Webhook,
    /// Resets, 3 MiB bodies, redirect loops: final states, stable codes, no crash or hang.
    ReceiverFaults,
    /// Restart MariaDB during a drain: no row lost, no duplicate.
    MariadbRestart,
    /// Three peers, one killed and restarted under load: live sockets get every message.
    NotifyPeers,
    /// 5 000 sockets reconnecting at once: all end subscribed and get the final message.
    ReconnectBurst,
    /// Every drill, one after the other.
    All,
}

impl DrillName {
    fn each() -> [DrillName; 5] {
        [
            DrillName::Kill9Webhook,
            DrillName::ReceiverFaults,
            DrillName::MariadbRestart,
            DrillName::NotifyPeers,
            DrillName::ReconnectBurst,
        ]
    }

    fn label(self) -> &'static str {
        match self {
            DrillName::Kill9Webhook => "kill9-webhook",
            DrillName::ReceiverFaults => "receiver-faults",
            DrillName::MariadbRestart => "mariadb-restart",
            DrillName::NotifyPeers => "notify-peers",
            DrillName::ReconnectBurst => "reconnect-burst",
            DrillName::All => "all",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct DrillArgs {
    #[arg(value_enum)]
    pub name: DrillName,
    /// Whole-run limit in seconds (all drills together).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// gorge-webhook binary (default: next to this executable).
    #[arg(long)]
    pub webhook_binary: Option<PathBuf>,
    /// gorge-notification binary (default: next to this executable).
    #[arg(long)]
    pub notification_binary: Option<PathBuf>,
}

/// One thing a drill promises, and whether it held.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub must_hold: String,
    pub holds: bool,
    pub detail: String,
}

pub fn check(must_hold: &str, holds: bool, detail: impl Into<String>) -> Check {
    Check {
        must_hold: must_hold.to_string(),
        holds,
        detail: detail.into(),
    }
}

/// What one drill found.
pub struct Outcome {
    pub checks: Vec<Check>,
    pub facts: Value,
}

impl Outcome {
    pub fn failed_to_run(error: String) -> Outcome {
        Outcome {
            checks: vec![check("the drill runs to the end", false, error)],
            facts: Value::Null,
        }
    }

    fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.holds)
    }
}

/// Binaries and the time left, handed to each drill.
pub struct DrillEnv {
    pub webhook_binary: PathBuf,
    pub notification_binary: PathBuf,
    pub deadline: Instant,
}

impl DrillEnv {
    /// A deadline for one step: `budget` from now, but never past the run's own.
    pub fn within(&self, budget: Duration) -> Instant {
        (Instant::now() + budget).min(self.deadline)
    }
}

pub async fn run(args: DrillArgs) -> Value {
    let env = DrillEnv {
        webhook_binary: args
            .webhook_binary
            .clone()
            .unwrap_or_else(|| procs::sibling_binary("gorge-webhook")),
        notification_binary: args
            .notification_binary
            .clone()
            .unwrap_or_else(|| procs::sibling_binary("gorge-notification")),
        deadline: crate::work_deadline(args.timeout),
    };
    let names: Vec<DrillName> = match args.name {
        DrillName::All => DrillName::each().to_vec(),
        one => vec![one],
    };
    let mut results = Vec::new();
    let mut all_passed = true;
    for name in names {
        if Instant::now() >= env.deadline {
            results.push(json!({"name": name.label(), "verdict": "NOT RUN", "reason": "run timeout reached"}));
            all_passed = false;
            continue;
        }
        eprintln!("== drill {} ==", name.label());
        let started = Instant::now();
        let outcome = match name {
            DrillName::Kill9Webhook => webhook_faults::kill9(&env).await,
            DrillName::ReceiverFaults => webhook_faults::receiver_faults(&env).await,
            DrillName::MariadbRestart => webhook_faults::mariadb_restart(&env).await,
            DrillName::NotifyPeers => notify_faults::peers(&env).await,
            DrillName::ReconnectBurst => notify_faults::reconnect_burst(&env).await,
            DrillName::All => unreachable_all(),
        };
        let passed = outcome.passed();
        all_passed &= passed;
        for c in &outcome.checks {
            eprintln!(
                "  must hold: {:<60} {}  ({})",
                c.must_hold,
                if c.holds { "holds" } else { "BROKEN" },
                c.detail
            );
        }
        let verdict = if passed { "PASS" } else { "FAIL" };
        eprintln!("  verdict: {verdict}");
        results.push(json!({
            "name": name.label(),
            "verdict": verdict,
            "elapsed_s": crate::notify::round3(started.elapsed().as_secs_f64()),
            "checks": outcome.checks,
            "facts": outcome.facts,
        }));
    }
    json!({"ok": all_passed, "drills": results})
}

/// `All` is expanded before dispatch; reaching it would be a bug in `run`.
fn unreachable_all() -> Outcome {
    Outcome::failed_to_run("internal: `all` dispatched as one drill".to_string())
}
