//! `gorge-bench webhook`: drain a seeded backlog (or a trickle) with P gorge-webhook
//! processes against a local receiver, and report throughput, latency and correctness.
//!
//! [`Rig`] (database + receiver + processes) is shared with the webhook drills.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use crate::cpu_quota::CpuQuota;
use crate::herald_db::{self, HeraldDb, HookSpec, RequestSpec};
use crate::histogram::percentiles_of;
use crate::notify::round3;
use crate::procs::{self, Service};
use crate::receiver::{self, Answer, Behaviour, Receiver, Transport};

#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// gorge-webhook processes to run.
    #[arg(long, default_value_t = 1)]
    pub processes: usize,
    #[arg(long, default_value_t = 100)]
    pub hooks: usize,
    /// Queued rows to seed (with --trickle: rows inserted one at a time).
    #[arg(long, default_value_t = 20_000)]
    pub rows: usize,
    /// Receiver latency per request.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Fraction of requests answered 500.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Fraction of requests never answered (the sender's timeout ends them).
    #[arg(long, default_value_t = 0.0)]
    pub hang_rate: f64,
    /// Whole-run limit in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// gorge-webhook binary (default: next to this executable).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Insert into an idle queue one row at a time and measure insert→arrival.
    #[arg(long)]
    pub trickle: bool,
    /// Pause between trickled rows.
    #[arg(long, default_value_t = 100)]
    pub trickle_interval_ms: u64,
    /// GORGE_WEBHOOK_MAX_CONCURRENT (unset: the service default).
    #[arg(long)]
    pub max_concurrent: Option<u32>,
    /// GORGE_WEBHOOK_POLL_INTERVAL_MS (unset: the service default).
    #[arg(long)]
    pub poll_interval_ms: Option<u64>,
    /// GORGE_WEBHOOK_DELIVERY_TIMEOUT in seconds (unset: the service default).
    #[arg(long)]
    pub delivery_timeout: Option<u64>,
    /// GORGE_WEBHOOK_RETRY_BACKOFF_SEC; short so that failed rows retry within the run.
    #[arg(long, default_value_t = 1)]
    pub retry_backoff_sec: u64,
    /// Serve HTTPS with a certificate from a private CA made for the run, trusted by the
    /// service through GORGE_WEBHOOK_CA_FILE.
    #[arg(long)]
    pub tls: bool,
    /// The receiver closes every connection after its answer (connection reuse off).
    #[arg(long)]
    pub close_connections: bool,
    /// POST to `<URL>/hook/<n>` instead of the bench's own receiver (e.g. a local nginx
    /// answering 200). Deliveries are then the rows marked `sent`; duplicates, signatures
    /// and requests in flight per hook cannot be checked (reported as null).
    #[arg(long)]
    pub target_url: Option<String>,
    /// Give each gorge-webhook process a CPU budget of this many CPUs (a cgroup quota), as
    /// if each replica ran on a machine of its own: see `cpu_quota.rs`. Unset: the
    /// processes share the machine's cores with the database and the receiver.
    #[arg(long)]
    pub cpus_per_process: Option<f64>,
}

/// Service settings the rig passes through to every process.
#[derive(Debug, Clone, Default)]
pub struct ServiceSettings {
    pub max_concurrent: Option<u32>,
    pub poll_interval_ms: Option<u64>,
    pub delivery_timeout: Option<u64>,
    pub claim_lease_sec: Option<u64>,
    pub retry_backoff_sec: Option<u64>,
}

/// A fresh database, a receiver, and the gorge-webhook processes draining into it.
pub struct Rig {
    pub db: HeraldDb,
    pub receiver: Receiver,
    pub hooks: Vec<HookSpec>,
    pub processes: Vec<Service>,
    binary: PathBuf,
    settings: ServiceSettings,
    /// When each row's INSERT committed, µs on the receiver's clock.
    pub inserted_at_us: HashMap<usize, u64>,
    /// The hook (index) of each row.
    pub row_hook: HashMap<usize, usize>,
    started: usize,
    /// The private CA's PEM file when the receiver speaks TLS (removed at teardown).
    ca_file: Option<PathBuf>,
    /// CPUs each process started from now on may use (`None`: no budget).
    pub cpus_per_process: Option<f64>,
    /// The budgets of the processes started with one (removed at teardown).
    quotas: Vec<CpuQuota>,
}

/// A blacklist that still blocks something (a documentation range) but not loopback,
/// where the receiver lives. An empty value would mean "Phorge's default", which blocks it.
const BENCH_BLACKLIST: &str = "192.0.2.0/24";

fn hmac_key(hook: usize) -> String {
    format!("benchkey{hook:06}{:018x}", rand::random::<u64>() >> 8)
        .chars()
        .take(32)
        .collect()
}

pub fn hook_phid(hook: usize) -> String {
    format!("PHID-HWBH-bench{hook:06}")
}

impl Rig {
    /// Creates the database and receiver and seeds `hooks` hooks; `uri(receiver, n)` picks
    /// each hook's URI (the route decides how the receiver behaves for it).
    pub async fn new(
        hooks: usize,
        behaviour: Behaviour,
        uri: impl Fn(&Receiver, usize) -> String,
        binary: PathBuf,
        settings: ServiceSettings,
    ) -> Result<Rig, String> {
        Rig::with_transport(hooks, behaviour, uri, binary, settings, false, false).await
    }

    /// [`Rig::new`] with an HTTPS receiver (private CA, passed to the service as
    /// `GORGE_WEBHOOK_CA_FILE`) and/or one that closes every connection.
    pub async fn with_transport(
        hooks: usize,
        behaviour: Behaviour,
        uri: impl Fn(&Receiver, usize) -> String,
        binary: PathBuf,
        settings: ServiceSettings,
        tls: bool,
        close_each: bool,
    ) -> Result<Rig, String> {
        let keys: Vec<String> = (0..hooks).map(hmac_key).collect();
        let mut transport = Transport {
            tls: None,
            close_each,
        };
        let mut ca_file = None;
        if tls {
            let (pem, config) = receiver::private_ca()?;
            let path = std::env::temp_dir().join(format!(
                "gorge-bench-ca-{}-{:x}.pem",
                std::process::id(),
                rand::random::<u32>()
            ));
            std::fs::write(&path, pem).map_err(|e| format!("CA file: {e}"))?;
            ca_file = Some(path);
            transport.tls = Some(config);
        }
        let receiver = Receiver::start(behaviour, &keys, transport)
            .await
            .map_err(|e| format!("receiver: {e}"))?;
        let db = HeraldDb::create().await?;
        let hooks: Vec<HookSpec> = keys
            .into_iter()
            .enumerate()
            .map(|(n, hmac_key)| HookSpec {
                phid: hook_phid(n),
                uri: uri(&receiver, n),
                hmac_key,
            })
            .collect();
        db.insert_hooks(&hooks).await?;
        Ok(Rig {
            db,
            receiver,
            hooks,
            processes: Vec::new(),
            binary,
            settings,
            inserted_at_us: HashMap::new(),
            row_hook: HashMap::new(),
            started: 0,
            ca_file,
            cpus_per_process: None,
            quotas: Vec::new(),
        })
    }

    fn env(&self, listen: SocketAddr) -> Vec<(String, String)> {
        let (host, port) = herald_db::mysql_host_port();
        let mut env: Vec<(String, String)> = vec![
            ("GORGE_WEBHOOK_MYSQL_HOST".into(), host),
            ("GORGE_WEBHOOK_MYSQL_PORT".into(), port.to_string()),
            ("GORGE_WEBHOOK_MYSQL_USER".into(), "root".into()),
            ("GORGE_WEBHOOK_MYSQL_PASS".into(), String::new()),
            ("GORGE_WEBHOOK_NAMESPACE".into(), self.db.namespace.clone()),
            (
                "GORGE_WEBHOOK_OUTBOUND_BLACKLIST".into(),
                BENCH_BLACKLIST.into(),
            ),
            ("GORGE_LISTEN_ADDR".into(), listen.to_string()),
            ("GORGE_LOG_LEVEL".into(), "warn".into()),
        ];
        if let Some(path) = &self.ca_file {
            env.push(("GORGE_WEBHOOK_CA_FILE".into(), path.display().to_string()));
        }
        let s = &self.settings;
        let optional = [
            (
                "GORGE_WEBHOOK_MAX_CONCURRENT",
                s.max_concurrent.map(u64::from),
            ),
            ("GORGE_WEBHOOK_POLL_INTERVAL_MS", s.poll_interval_ms),
            ("GORGE_WEBHOOK_DELIVERY_TIMEOUT", s.delivery_timeout),
            ("GORGE_WEBHOOK_CLAIM_LEASE_SEC", s.claim_lease_sec),
            ("GORGE_WEBHOOK_RETRY_BACKOFF_SEC", s.retry_backoff_sec),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                env.push((key.into(), value.to_string()));
            }
        }
        env
    }

    /// Starts one more process and waits until its /readyz answers 200.
    pub async fn start_process(&mut self) -> Result<usize, String> {
        self.start_processes(1).await?;
        Ok(self.processes.len() - 1)
    }

    /// Starts `n` more processes at once, then waits until each one's /readyz answers 200:
    /// a drain starts in all of them at about the same moment, not one start-up after the
    /// other (which would measure the first process alone for a while).
    pub async fn start_processes(&mut self, n: usize) -> Result<(), String> {
        let first = self.processes.len();
        for _ in 0..n {
            let port = procs::free_port().map_err(|e| format!("free port: {e}"))?;
            let listen = SocketAddr::from(([127, 0, 0, 1], port));
            let name = format!("gorge-webhook-{}", self.started);
            self.started += 1;
            // The budget exists before the process does, so that a machine without cgroups
            // stops the run before anything starts.
            let quota = match self.cpus_per_process {
                Some(cores) => Some(CpuQuota::new(
                    &format!("gorge-bench-{}-{name}", std::process::id()),
                    cores,
                )?),
                None => None,
            };
            let mut service = Service::start(&name, &self.binary, &self.env(listen), listen)?;
            if let Some(quota) = quota {
                if let Err(e) = quota.add(service.pid) {
                    // Most likely it exited at once: say so rather than blame the cgroup.
                    return Err(match service.child.try_wait() {
                        Ok(Some(status)) => format!("{name} exited during startup: {status}"),
                        _ => e,
                    });
                }
                self.quotas.push(quota);
            }
            self.processes.push(service);
        }
        for service in &mut self.processes[first..] {
            service
                .wait_ready("/readyz", Duration::from_secs(20))
                .await?;
        }
        Ok(())
    }

    /// Inserts rows `seqs` spread round robin over the hooks (interleaved, as many
    /// independent hooks firing would leave them).
    pub async fn insert_rows(
        &mut self,
        seqs: std::ops::Range<usize>,
        retry_forever: bool,
    ) -> Result<(), String> {
        let hooks = self.hooks.len();
        let rows: Vec<(usize, usize)> = seqs.map(|seq| (seq, seq % hooks)).collect();
        self.insert_rows_for(&rows, retry_forever).await
    }

    /// Inserts rows given as (sequence number, hook index), in that order.
    pub async fn insert_rows_for(
        &mut self,
        rows: &[(usize, usize)],
        retry_forever: bool,
    ) -> Result<(), String> {
        let rows: Vec<RequestSpec> = rows
            .iter()
            .map(|&(seq, hook)| {
                self.row_hook.insert(seq, hook);
                RequestSpec {
                    seq,
                    hook_phid: self.hooks[hook].phid.clone(),
                    retry_forever,
                }
            })
            .collect();
        let state = self.receiver.state.clone();
        let inserted = &mut self.inserted_at_us;
        self.db
            .insert_requests(&rows, |chunk| {
                let now = state.now_us();
                for row in chunk {
                    inserted.insert(row.seq, now);
                }
            })
            .await
    }

    /// Waits until no row is `queued` (true) or `until` passes (false). Database errors
    /// (a restarting server) are waited out.
    pub async fn wait_final(&self, until: Instant) -> bool {
        loop {
            if let Ok(0) = self.db.queued().await {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Number of processes that exited on their own.
    pub fn exited(&mut self) -> usize {
        self.processes
            .iter_mut()
            .map(|p| !p.alive())
            .filter(|dead| *dead)
            .count()
    }

    /// Stops every process (SIGTERM, then SIGKILL) and drops the database.
    pub async fn teardown(mut self) {
        for process in &mut self.processes {
            // Short grace: the run is over, and --timeout bounds the whole run.
            process.stop(Duration::from_secs(3)).await;
        }
        // Each cgroup is empty now, so it can go.
        self.quotas.clear();
        self.db.drop_database().await;
        if let Some(path) = &self.ca_file {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Every non-zero counter of the running processes' `/metrics`, summed over them, and
    /// how many processes answered (a process that exited is missing from the sums).
    pub async fn service_counters(&self) -> (std::collections::BTreeMap<String, f64>, usize) {
        let mut sum = std::collections::BTreeMap::new();
        let mut answered = 0;
        for process in &self.processes {
            let Some(snapshot) = crate::server_metrics::snapshot(process.probe_addr).await else {
                continue;
            };
            answered += 1;
            for (series, value) in snapshot.counters().filter(|(_, v)| *v != 0.0) {
                *sum.entry(series.to_string()).or_insert(0.0) += value;
            }
        }
        (sum, answered)
    }

    /// Seconds the processes' CPU budgets held them back, summed.
    pub fn throttled_seconds(&self) -> f64 {
        self.quotas
            .iter()
            .filter_map(CpuQuota::throttled_seconds)
            .sum()
    }

    /// What the receiver saw, per row.
    pub fn report(&self) -> DeliveryReport {
        let arrivals = self.receiver.state.arrivals();
        let mut per_row: HashMap<usize, RowArrivals> = HashMap::new();
        let mut first_us = u64::MAX;
        let mut last_ok_us = 0;
        for a in &arrivals {
            first_us = first_us.min(a.at_us);
            let Some(seq) = a.seq else { continue };
            let row = per_row.entry(seq).or_default();
            row.attempts += 1;
            if a.answer == Answer::Ok {
                row.ok += 1;
                row.first_ok_us.get_or_insert(a.at_us);
                last_ok_us = last_ok_us.max(a.at_us);
            }
        }
        let mut latencies: Vec<u64> = per_row
            .iter()
            .filter_map(|(seq, row)| {
                let inserted = self.inserted_at_us.get(seq)?;
                Some(row.first_ok_us?.saturating_sub(*inserted))
            })
            .collect();
        let delivered = per_row.values().filter(|r| r.ok > 0).count() as u64;
        let span_s = if last_ok_us > first_us {
            (last_ok_us - first_us) as f64 / 1e6
        } else {
            0.0
        };
        DeliveryReport {
            requests: arrivals.len() as u64,
            delivered,
            duplicates: per_row
                .values()
                .map(|r| u64::from(r.ok.saturating_sub(1)))
                .sum(),
            repeat_requests: per_row
                .values()
                .map(|r| u64::from(r.attempts.saturating_sub(1)))
                .sum(),
            duplicated_rows: per_row
                .iter()
                .filter(|(_, r)| r.ok > 1)
                .map(|(seq, _)| *seq)
                .collect(),
            deliveries_per_s: if span_s > 0.0 {
                delivered as f64 / span_s
            } else {
                0.0
            },
            latency: percentiles_of(&mut latencies),
        }
    }
}

#[derive(Default)]
struct RowArrivals {
    attempts: u32,
    ok: u32,
    first_ok_us: Option<u64>,
}

pub struct DeliveryReport {
    pub requests: u64,
    /// Rows that got at least one 2xx answer.
    pub delivered: u64,
    /// 2xx answers beyond the first, summed over rows: the receiver got the same POST twice.
    pub duplicates: u64,
    /// All requests beyond the first per row (retries after errors included).
    pub repeat_requests: u64,
    pub duplicated_rows: Vec<usize>,
    pub deliveries_per_s: f64,
    pub latency: crate::histogram::Percentiles,
}

pub async fn run(args: WebhookArgs) -> Value {
    let deadline = crate::work_deadline(args.timeout);
    let behaviour = Behaviour {
        latency: Duration::from_millis(args.latency_ms),
        error_rate: args.error_rate,
        hang_rate: args.hang_rate,
    };
    let settings = ServiceSettings {
        max_concurrent: args.max_concurrent,
        poll_interval_ms: args.poll_interval_ms,
        delivery_timeout: args.delivery_timeout,
        claim_lease_sec: None,
        retry_backoff_sec: Some(args.retry_backoff_sec),
    };
    let binary = args
        .binary
        .clone()
        .unwrap_or_else(|| procs::sibling_binary("gorge-webhook"));
    let mut rig = match Rig::with_transport(
        args.hooks.max(1),
        behaviour,
        |r, n| match &args.target_url {
            Some(url) => format!("{}/hook/{n}", url.trim_end_matches('/')),
            None => r.hook_uri(n),
        },
        binary,
        settings,
        args.tls,
        args.close_connections,
    )
    .await
    {
        Ok(rig) => rig,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    rig.cpus_per_process = args.cpus_per_process;
    if !args.trickle {
        // Seeding (rows, tasks, transactions) stays out of the measured costs.
        if let Err(e) = seed(&mut rig, &args).await {
            return json!({"ok": false, "error": e});
        }
    }
    let mariadb_pid = mariadb_pid();
    let cpu = |pid: Option<u32>| pid.and_then(|p| crate::sys::cpu_seconds(p).ok());
    let (mariadb_before, bench_before) = (cpu(mariadb_pid), cpu(Some(std::process::id())));
    let counters_before = rig.db.statement_counters().await.unwrap_or_default();
    let outcome = drive(&mut rig, &args, deadline).await;
    let counters_after = rig.db.statement_counters().await.unwrap_or_default();
    // Where the CPU went during the run (the processes started inside it, so their total
    // is their share).
    let webhook_cpu: f64 = rig.processes.iter().filter_map(|p| cpu(Some(p.pid))).sum();
    let mariadb_cpu = cpu(mariadb_pid).zip(mariadb_before).map(|(a, b)| a - b);
    let throttled_s: Option<f64> = rig.cpus_per_process.map(|_| rig.throttled_seconds());
    let bench_cpu = cpu(Some(std::process::id()))
        .zip(bench_before)
        .map(|(a, b)| a - b);
    let (counters, counted) = rig.service_counters().await;
    let mut report = rig.report();
    let rows = rig.db.rows().await.unwrap_or_default();
    let exited = rig.exited();
    let state = rig.receiver.state.clone();
    rig.teardown().await;
    let (wall_s, all_final) = match outcome {
        Ok(v) => v,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    let count = |status: &str| rows.iter().filter(|r| r.status == status).count();
    let external = args.target_url.is_some();
    if external {
        // Nothing reached our receiver: count what the rows say was delivered.
        report.delivered = count("sent") as u64;
        report.deliveries_per_s = report.delivered as f64 / wall_s.max(1e-9);
    }
    let not_final = count("queued");
    let max_per_hook = state.max_concurrent_per_hook();
    let connections = state.connections.load(std::sync::atomic::Ordering::Relaxed);
    let handshakes = state
        .tls_handshakes
        .load(std::sync::atomic::Ordering::Relaxed);
    let bad_signatures = state
        .bad_signatures
        .load(std::sync::atomic::Ordering::Relaxed);
    // Against an external target our receiver sees nothing, so its checks cannot fail
    // there: they count only when it is the target (and are reported as null otherwise).
    let receiver_ok = report.duplicates == 0 && max_per_hook <= 1 && bad_signatures == 0;
    let ok = all_final && (external || receiver_ok) && exited == 0;
    let checked = |v: Value| if external { Value::Null } else { v };
    json!({
        "ok": ok,
        "mode": if args.trickle { "trickle" } else { "backlog" },
        "processes": args.processes,
        "hooks": args.hooks,
        "rows": args.rows,
        "receiver_latency_ms": args.latency_ms,
        "error_rate": args.error_rate,
        "hang_rate": args.hang_rate,
        "sent": count("sent"),
        "failed": count("failed"),
        "not_final": not_final,
        "requests_seen": report.requests,
        "delivered": report.delivered,
        "deliveries_per_s": round3(report.deliveries_per_s),
        "deliveries_per_s_per_process": round3(report.deliveries_per_s / args.processes.max(1) as f64),
        "insert_to_delivery_ms": report.latency,
        "target_url": args.target_url,
        "duplicates": checked(json!(report.duplicates)),
        "repeat_requests": checked(json!(report.repeat_requests)),
        "max_concurrent_per_hook": checked(json!(max_per_hook)),
        "bad_signatures": checked(json!(bad_signatures)),
        "unparsed_bodies": state.unparsed.load(std::sync::atomic::Ordering::Relaxed),
        "tls": args.tls,
        "connection_reuse": !args.close_connections,
        "connections": connections,
        "tls_handshakes": handshakes,
        "connections_per_delivery": (report.delivered > 0)
            .then(|| round3(connections as f64 / report.delivered as f64)),
        "tls_handshakes_per_delivery": (report.delivered > 0)
            .then(|| round3(handshakes as f64 / report.delivered as f64)),
        "processes_exited": exited,
        "cpus_per_process": args.cpus_per_process,
        "throttled_s": throttled_s.map(round3),
        "wall_s": round3(wall_s),
        "cpu_s": {
            "webhook": round3(webhook_cpu),
            "mariadb": mariadb_cpu.map(round3),
            "bench": bench_cpu.map(round3),
        },
        "webhook_cpu_us_per_delivery": (report.delivered > 0)
            .then(|| round3(webhook_cpu * 1e6 / report.delivered as f64)),
        "mariadb_cpu_us_per_delivery": mariadb_cpu
            .filter(|_| report.delivered > 0)
            .map(|cpu| round3(cpu * 1e6 / report.delivered as f64)),
        "statements_per_delivery": per_delivery(&counters_before, &counters_after, report.delivered),
        // The processes' own counters, summed: polls, claims, skips, holds.
        "service_counters": counters,
        "service_counters_processes": counted,
    })
}

/// Each counter's growth over the run, per delivery (server-wide counters: anything else
/// using the server during the run counts too).
fn per_delivery(before: &[(String, u64)], after: &[(String, u64)], delivered: u64) -> Value {
    let mut out = serde_json::Map::new();
    for (name, end) in after {
        let start = before
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v);
        let per = end.saturating_sub(start) as f64 / delivered.max(1) as f64;
        out.insert(name.clone(), json!(round3(per)));
    }
    Value::Object(out)
}

/// The local MariaDB server's process, for its share of the CPU.
fn mariadb_pid() -> Option<u32> {
    std::fs::read_to_string("/run/mysqld/mysqld.pid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Seeds the backlog of a drain run.
async fn seed(rig: &mut Rig, args: &WebhookArgs) -> Result<(), String> {
    let seeding = Instant::now();
    rig.insert_rows(0..args.rows, true).await?;
    eprintln!(
        "webhook: seeded {} rows over {} hooks in {:.1}s; starting {} process(es)",
        args.rows,
        args.hooks,
        seeding.elapsed().as_secs_f64(),
        args.processes
    );
    Ok(())
}

/// Runs (a trickle seeds as it goes; a drain was seeded by [`seed`]); returns (seconds
/// from first process start to all rows final, all final).
async fn drive(
    rig: &mut Rig,
    args: &WebhookArgs,
    deadline: Instant,
) -> Result<(f64, bool), String> {
    let wait_until = deadline;
    if args.trickle {
        rig.start_processes(args.processes.max(1)).await?;
        let started = Instant::now();
        eprintln!(
            "webhook: trickling {} rows every {} ms",
            args.rows, args.trickle_interval_ms
        );
        for seq in 0..args.rows {
            if Instant::now() >= wait_until {
                break;
            }
            rig.insert_rows(seq..seq + 1, true).await?;
            tokio::time::sleep(Duration::from_millis(args.trickle_interval_ms)).await;
        }
        let all_final = rig.wait_final(wait_until).await;
        return Ok((started.elapsed().as_secs_f64(), all_final));
    }
    let started = Instant::now();
    rig.start_processes(args.processes.max(1)).await?;
    let all_final = rig.wait_final(wait_until).await;
    Ok((started.elapsed().as_secs_f64(), all_final))
}
