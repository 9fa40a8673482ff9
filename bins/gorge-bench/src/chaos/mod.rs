//! `gorge-bench chaos`: seeded, overlapping faults against both services under steady load,
//! and a checker on the recorded history that proves nothing was lost.
//!
//! One pass per mode (broker, then mesh): [`sut`] starts 3 gorge-notification nodes (with
//! their own redis-server in broker mode) and 3 gorge-webhook processes on one database
//! reached through a [`link`]; the load is simulated `JX.Aphlict` browsers ([`aphlict`]),
//! PHP's poster with its fail-over ([`poster`]) and rows inserted as the hand-over kit marks
//! them; the faults come from the seed ([`schedule`]) and are applied by [`faults`]; when
//! they end, the load stops, the system settles, and [`check`] reads the [`history`].
//! Beside it, this module checks what the history cannot hold: no process panicked, each
//! process's RSS came back within 20 % of its figure before the faults, and nothing stayed
//! queued (no row `queued`, every node's broker or peers up again).

mod aphlict;
mod check;
mod faults;
mod history;
mod hooks;
mod link;
mod poster;
mod schedule;
mod sut;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::drill::{check as holds, Check};
use crate::herald_db::RequestSpec;
use crate::procs;
use check::{FinalRow, Verdict};
use history::{History, Page, Row};
use schedule::{Fault, Plan, Target};
use sut::{Binaries, Sut};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Broker,
    Mesh,
    /// A broker pass, then a mesh pass.
    Both,
}

#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// Seed of the fault schedule (the same seed replays the same schedule).
    #[arg(long)]
    pub seed: u64,
    /// Length of each pass's fault phase, in minutes (fractions allowed).
    #[arg(long, default_value_t = 2.0)]
    pub minutes: f64,
    /// Services under test, comma separated: notification, webhook.
    #[arg(long, default_value = "notification,webhook", value_delimiter = ',')]
    pub services: Vec<String>,
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    pub mode: Mode,
    /// Messages posted per second.
    #[arg(long, default_value_t = 8.0)]
    pub rate: f64,
    /// Rows inserted per second.
    #[arg(long, default_value_t = 8.0)]
    pub rows_per_second: f64,
    /// Browsers per node.
    #[arg(long, default_value_t = 6)]
    pub browsers: usize,
    /// Mean gap between two fault starts, in seconds.
    #[arg(long, default_value_t = 4.0)]
    pub fault_gap: f64,
    /// Print the schedule of each pass and stop (nothing is started).
    #[arg(long)]
    pub schedule_only: bool,
    /// Whole-run limit in seconds (default: each pass's faults plus 4 minutes).
    #[arg(long, default_value_t = 0)]
    pub timeout: u64,
    #[arg(long)]
    pub notification_binary: Option<PathBuf>,
    #[arg(long)]
    pub webhook_binary: Option<PathBuf>,
}

/// Processes of each service.
const PROCESSES: usize = 3;
/// Hooks (each answering in its own way, see [`hooks::hook_mode`]).
const HOOKS: usize = 16;
/// Project PHIDs: a message is for one, each browser watches one (so a 60 s replay stays
/// well inside a socket's 256-frame queue at the default rate).
const PROJECTS: usize = 4;
/// Load before the faults, and the RSS figure taken at its end.
const WARM_UP: Duration = Duration::from_secs(6);
/// Load after the faults, before it stops.
const COOL_DOWN: Duration = Duration::from_secs(5);
/// Longest wait for rows to end and browsers to catch up after the load stops.
const SETTLE: Duration = Duration::from_secs(60);
/// RSS may end this much above its figure before the faults.
const RSS_SLACK: f64 = 1.2;

impl ChaosArgs {
    fn passes(&self) -> Vec<bool> {
        match self.mode {
            Mode::Broker => vec![true],
            Mode::Mesh => vec![false],
            Mode::Both => vec![true, false],
        }
    }

    /// The run's limit: the given one, or each pass's faults plus 4 minutes.
    pub fn limit_s(&self) -> u64 {
        if self.timeout > 0 {
            return self.timeout;
        }
        self.passes().len() as u64 * ((self.minutes * 60.0) as u64 + 240)
    }

    fn plan(&self, broker: bool) -> Plan {
        Plan {
            seed: self.seed,
            length_ms: (self.minutes * 60_000.0) as u64,
            notification: self.services.iter().any(|s| s == "notification"),
            webhook: self.services.iter().any(|s| s == "webhook"),
            broker,
            processes: PROCESSES,
            mean_gap_ms: (self.fault_gap * 1000.0) as u64,
        }
    }
}

pub async fn run(args: ChaosArgs) -> Value {
    if let Some(bad) = args
        .services
        .iter()
        .find(|s| !matches!(s.as_str(), "notification" | "webhook"))
    {
        return json!({"ok": false, "error": format!("--services: {bad:?} is not notification or webhook")});
    }
    let binaries = Binaries {
        notification: args
            .notification_binary
            .clone()
            .unwrap_or_else(|| procs::sibling_binary("gorge-notification")),
        webhook: args
            .webhook_binary
            .clone()
            .unwrap_or_else(|| procs::sibling_binary("gorge-webhook")),
    };
    let _ = crate::sys::raise_nofile(8192);
    let deadline = crate::work_deadline(args.limit_s());
    let mut passes = Vec::new();
    let mut ok = true;
    for broker in args.passes() {
        let plan = args.plan(broker);
        let faults = schedule::draw(&plan);
        let mode = if broker { "broker" } else { "mesh" };
        eprintln!(
            "chaos: seed {} mode {mode}: {} faults over {:.1} min\n{}",
            args.seed,
            faults.len(),
            args.minutes,
            schedule::render(&faults)
        );
        if args.schedule_only {
            passes.push(json!({"mode": mode, "faults": schedule::count_by_kind(&faults)}));
            continue;
        }
        let result = pass(&args, &plan, &faults, &binaries, deadline).await;
        ok &= result["ok"] == json!(true);
        passes.push(json!({"mode": mode, "result": result}));
    }
    json!({"ok": ok, "seed": args.seed, "minutes": args.minutes, "passes": passes})
}

/// One pass: start, load, faults, settle, check, stop.
async fn pass(
    args: &ChaosArgs,
    plan: &Plan,
    faults: &[Fault],
    binaries: &Binaries,
    deadline: Instant,
) -> Value {
    let history = History::new();
    let label = if plan.broker { "broker" } else { "mesh" };
    let sut = match Sut::start(label, plan, HOOKS, binaries, &history).await {
        Ok(sut) => sut,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    let sut = std::sync::Arc::new(sut);
    let result = load_faults_and_check(args, plan, faults, &sut, &history, deadline).await;
    match std::sync::Arc::try_unwrap(sut) {
        Ok(sut) => sut.teardown().await,
        Err(_) => {
            eprintln!("chaos: a fault task still holds the system; its processes die with the run")
        }
    }
    result
}

async fn load_faults_and_check(
    args: &ChaosArgs,
    plan: &Plan,
    faults: &[Fault],
    sut: &std::sync::Arc<Sut>,
    history: &History,
    deadline: Instant,
) -> Value {
    let (stop_browsers, browsers_stop) = watch::channel(false);
    let (stop_load, load_stop) = watch::channel(false);
    let mut load = JoinSet::new();
    // Browsers, each on one node (a sticky balancer), watching its own user and a project.
    for (node, &(client, _)) in sut.node_ports.iter().enumerate() {
        for k in 0..args.browsers {
            let browser = node * args.browsers + k;
            let phids = vec![
                format!("PHID-USER-chaos{browser:06}"),
                poster::project_phid(browser % PROJECTS),
            ];
            history.with(|log| {
                log.pages.push(Page {
                    node,
                    phids: phids.clone(),
                })
            });
            load.spawn(aphlict::run(
                browser,
                client,
                phids,
                history.clone(),
                browsers_stop.clone(),
            ));
        }
    }
    let browsers = sut.node_ports.len() * args.browsers;
    let subscribed = within(Duration::from_secs(30), || {
        history.with(|log| {
            let mut up: Vec<bool> = vec![false; browsers];
            for c in &log.connections {
                up[c.browser] |= c.subscribed_us.is_some();
            }
            up.iter().all(|u| *u)
        })
    })
    .await;
    if !subscribed {
        return json!({"ok": false, "error": "browsers did not all subscribe within 30 s"});
    }
    // PHP's side: stopped, and waited for, before the settle reads the rows back (a row
    // whose INSERT was under way when the load stopped would otherwise commit after).
    let mut php = JoinSet::new();
    if plan.notification {
        php.spawn(poster::run(
            sut.admins(),
            args.rate,
            PROJECTS,
            history.clone(),
            load_stop.clone(),
        ));
    }
    if plan.webhook {
        php.spawn(insert_rows(
            sut.clone(),
            args.rows_per_second,
            history.clone(),
            load_stop.clone(),
        ));
    }
    tokio::time::sleep(WARM_UP).await;
    let idle_rss = sut.rss().await;

    // The faults, each at its time; faults on one target wait for each other.
    let faults_from = Instant::now();
    let mut applying = JoinSet::new();
    for fault in faults.iter().cloned() {
        let (sut, history) = (sut.clone(), history.clone());
        applying.spawn(async move {
            tokio::time::sleep_until((faults_from + Duration::from_millis(fault.at_ms)).into())
                .await;
            eprintln!("chaos: {fault}");
            faults::apply(&fault, &sut, &history).await
        });
    }
    let mut problems = Vec::new();
    let faults_deadline =
        deadline - SETTLE.min(deadline.saturating_duration_since(Instant::now()) / 3);
    loop {
        match tokio::time::timeout_at(faults_deadline.into(), applying.join_next()).await {
            Ok(Some(Ok(Some(problem)))) => problems.push(problem),
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => {
                problems.push("faults still running at the run's deadline".into());
                applying.abort_all();
                break;
            }
        }
    }
    let faults_end_us = history.now_us();
    eprintln!(
        "chaos: faults over at {:.1}s; load goes on {} s, then settles",
        faults_end_us as f64 / 1e6,
        COOL_DOWN.as_secs()
    );
    tokio::time::sleep(COOL_DOWN).await;
    let _ = stop_load.send(true);
    while php.join_next().await.is_some() {}
    // Rows end, browsers reconnect and replay; then a quiet moment for the last frames.
    let settle_until = (Instant::now() + SETTLE).min(deadline);
    let mut final_rows = HashMap::new();
    if let Some(db) = &sut.db {
        while Instant::now() < settle_until && !matches!(db.queued().await, Ok(0)) {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        match db.rows().await {
            Ok(rows) => {
                final_rows = rows
                    .into_iter()
                    .map(|r| {
                        (
                            r.seq,
                            FinalRow {
                                status: r.status,
                                error_type: r.error_type,
                                error_code: r.error_code,
                            },
                        )
                    })
                    .collect();
            }
            Err(e) => problems.push(format!("rows could not be read back: {e}")),
        }
    }
    let caught_up = within(
        settle_until.saturating_duration_since(Instant::now()),
        || {
            history.with(|log| {
                let now = history.now_us();
                // Every browser has a subscribed open connection, for a few seconds already.
                (0..browsers).all(|b| {
                    log.connections.iter().any(|c| {
                        c.browser == b
                            && c.closed_us.is_none()
                            && c.subscribed_us.is_some_and(|s| s + 3_000_000 < now)
                    })
                })
            })
        },
    )
    .await;
    if !caught_up {
        problems.push("not every browser was connected and subscribed at the end".into());
    }
    let final_rss = sut.rss().await;
    let queues = queues_drained(sut).await;
    let _ = stop_browsers.send(true);
    while tokio::time::timeout(Duration::from_secs(10), load.join_next())
        .await
        .ok()
        .flatten()
        .is_some()
    {}

    let log = history.snapshot();
    let mut verdict = Verdict::default();
    if plan.notification {
        check::check_messages(&log, plan.seed, plan.broker, &mut verdict);
    }
    if plan.webhook {
        check::check_rows(&log, plan.seed, &final_rows, &mut verdict);
    }
    verdict.checks.push(panics(sut).await);
    verdict.checks.push(rss_check(&idle_rss, &final_rss));
    verdict.checks.push(queues);
    verdict.checks.push(holds(
        "every fault was applied and every process came back",
        problems.is_empty(),
        if problems.is_empty() {
            "yes".to_string()
        } else {
            problems.join("; ")
        },
    ));
    let applied: Vec<Fault> = faults
        .iter()
        .filter(|f| {
            log.faults
                .iter()
                .any(|a| a.id == f.id && a.end_us.is_some())
        })
        .cloned()
        .collect();
    for c in &verdict.checks {
        eprintln!(
            "  must hold: {:<70} {}  ({})",
            c.must_hold,
            if c.holds { "holds" } else { "BROKEN" },
            c.detail
        );
    }
    for failure in &verdict.failures {
        eprintln!("  FAILURE {failure}");
    }
    let passed = verdict.passed();
    if !passed {
        eprintln!(
            "  verdict: FAIL (seed {}, mode {})",
            plan.seed,
            if plan.broker { "broker" } else { "mesh" }
        );
    }
    json!({
        "ok": passed,
        // The first start of each process is not a restart.
        "restarts": restarts(&log.starts),
        "faults_planned": faults.len(),
        "faults_applied": schedule::count_by_kind(&applied),
        "checks": verdict.checks,
        "failures": verdict.failures,
        "facts": verdict.facts,
        "rss_mib": rss_table(&idle_rss, &final_rss),
    })
}

/// Resolves once `stop` turns true (or its sender is gone), holding no borrow of it.
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Each start after a process's first, as `target@seconds`.
fn restarts(starts: &[history::Start]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    starts
        .iter()
        .filter(|s| !seen.insert(s.target))
        .map(|s| format!("{}@{:.1}s", s.target, s.at_us as f64 / 1e6))
        .collect()
}

/// Waits until `done` holds or `limit` passes, polling; true if it held.
async fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Inserts rows at `rate` per second, as a switched Phorge hands them over, recording each
/// once its INSERT committed; an INSERT that fails is tried again.
async fn insert_rows(
    sut: std::sync::Arc<Sut>,
    rate: f64,
    history: History,
    stop: watch::Receiver<bool>,
) {
    let Some(db) = &sut.db else { return };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.01)));
    let mut seq = 0usize;
    while !*stop.borrow() {
        tick.tick().await;
        // A hook that hangs takes the delivery timeout (3 s) per row, one row at a time: it
        // gets a quarter of its share (a row every 8 s), the rest go to a hook answering 200.
        let mut hook = seq % sut.hooks;
        if hooks::hook_mode(hook) == hooks::HookMode::Hang && (seq / sut.hooks) % 4 != 0 {
            hook -= hook % 8;
        }
        let retry_forever = hooks::may_retry_forever(hook) && (seq / sut.hooks) % 2 == 0;
        let spec = RequestSpec {
            seq,
            hook_phid: crate::webhook::hook_phid(hook),
            retry_forever,
        };
        if db
            .insert_requests(std::slice::from_ref(&spec), |_| {})
            .await
            .is_ok()
        {
            let inserted_us = history.now_us();
            history.with(|log| {
                log.rows.push(Row {
                    seq,
                    hook,
                    retry_forever,
                    inserted_us,
                })
            });
            seq += 1;
        }
    }
}

/// No process wrote a panic into its log.
async fn panics(sut: &Sut) -> Check {
    let mut found = Vec::new();
    for slot in sut.nodes.iter().chain(&sut.webhooks) {
        let name = slot.lock().await.name.clone();
        let path = procs::log_dir().join(format!("{name}.log"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("panicked")) {
            found.push(format!("{name}: {line}"));
        }
    }
    holds(
        "no process panics",
        found.is_empty(),
        if found.is_empty() {
            "none".to_string()
        } else {
            found.join("; ")
        },
    )
}

fn rss_table(
    idle: &[(Target, Option<u64>)],
    end: &[(Target, Option<u64>)],
) -> BTreeMap<String, Value> {
    let mib = |b: Option<u64>| b.map(|b| crate::notify::round3(b as f64 / 1_048_576.0));
    idle.iter()
        .zip(end)
        .map(|((t, before), (_, after))| {
            (
                t.to_string(),
                json!({"before_faults": mib(*before), "after": mib(*after)}),
            )
        })
        .collect()
}

/// Each process's RSS after the faults is within 20 % of its figure before them (Redis
/// is not ours and is left out).
fn rss_check(idle: &[(Target, Option<u64>)], end: &[(Target, Option<u64>)]) -> Check {
    let mut over = Vec::new();
    for ((target, before), (_, after)) in idle.iter().zip(end) {
        if *target == Target::Redis {
            continue;
        }
        match (before, after) {
            (Some(b), Some(a)) if (*a as f64) <= *b as f64 * RSS_SLACK => {}
            _ => over.push(format!("{target}: {before:?} → {after:?} bytes")),
        }
    }
    holds(
        "each process's RSS returns within 20 % of its figure before the faults",
        over.is_empty(),
        if over.is_empty() {
            "all".to_string()
        } else {
            over.join("; ")
        },
    )
}

/// Nothing stays queued: no row `queued` (checked with the rows), and every node's way to
/// the others is up again (broker up and caught up, or every peer up).
async fn queues_drained(sut: &Sut) -> Check {
    let mut stuck = Vec::new();
    if let Some(db) = &sut.db {
        match db.queued().await {
            Ok(0) => {}
            Ok(n) => stuck.push(format!("{n} rows queued")),
            Err(e) => stuck.push(format!("queued rows unknown: {e}")),
        }
    }
    let broker = sut.redis.is_some();
    for (i, admin) in sut.admins().into_iter().enumerate() {
        let Some(m) = crate::server_metrics::snapshot(admin).await else {
            stuck.push(format!("node{i}: no /metrics"));
            continue;
        };
        if broker {
            if m.sum_where("gorge_notification_broker_up", "") != 1.0 {
                stuck.push(format!("node{i}: broker not up"));
            }
        } else {
            let peers = m.sum_where("gorge_notification_peers_known", "");
            let up = m.sum_where("gorge_notification_peer_up", "");
            if up < peers {
                stuck.push(format!("node{i}: {up} of {peers} peers up"));
            }
        }
    }
    holds(
        "nothing stays queued once the faults end",
        stuck.is_empty(),
        if stuck.is_empty() {
            "nothing".to_string()
        } else {
            stuck.join("; ")
        },
    )
}
