//! The fault schedule of a chaos run, drawn from its seed: which fault, on what, when and for
//! how long. Pure: the same seed, mode and services give the same schedule, byte for byte
//! (printed at the start of the run, so a failure can be replayed with `--seed`).
//!
//! The generator is a SplitMix64 written here rather than `rand`'s `StdRng`, whose stream
//! may change between `rand` versions: a seed printed in a report must replay the same
//! schedule after a dependency update.

use std::fmt;

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and fixed forever.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (the modulo bias is irrelevant at these ranges).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// What a fault acts on. Each resource takes one fault at a time; different resources
/// overlap freely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// gorge-notification node `i`.
    Node(usize),
    /// gorge-webhook process `i`.
    Webhook(usize),
    Redis,
    /// The proxy between the webhook processes and MariaDB.
    Database,
    /// The webhook receiver.
    Receiver,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Node(i) => write!(f, "node{i}"),
            Target::Webhook(i) => write!(f, "webhook{i}"),
            Target::Redis => f.write_str("redis"),
            Target::Database => f.write_str("db"),
            Target::Receiver => f.write_str("receiver"),
        }
    }
}

/// The kinds of fault, as the report counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// SIGKILL, restarted `down` later (systemd's `Restart=always` with a `RestartSec`).
    Kill,
    /// SIGSTOP, SIGCONT `down` later.
    Stop,
    /// SIGTERM, restarted as soon as it has exited (`systemctl restart`).
    Term,
    /// redis-server SIGSTOPped for `down`.
    RedisPause,
    /// redis-server SIGKILLed, restarted empty `down` later.
    RedisKill,
    /// Every database connection cut, and new ones refused, for `down`.
    DbCut,
    /// Every byte to and from the database delayed by `delay_ms` for `down`.
    DbDelay,
    /// Hooks that answer 200 flap between 200 and 500 for `down`.
    ReceiverFlap,
    /// Every hook hangs (never answers) for `down`.
    ReceiverHang,
    /// Hostile sockets held open against one node for `down`.
    HostileBurst,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Kill,
        Kind::Stop,
        Kind::Term,
        Kind::RedisPause,
        Kind::RedisKill,
        Kind::DbCut,
        Kind::DbDelay,
        Kind::ReceiverFlap,
        Kind::ReceiverHang,
        Kind::HostileBurst,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Kind::Kill => "sigkill",
            Kind::Stop => "sigstop",
            Kind::Term => "sigterm",
            Kind::RedisPause => "redis-pause",
            Kind::RedisKill => "redis-kill",
            Kind::DbCut => "db-cut",
            Kind::DbDelay => "db-delay",
            Kind::ReceiverFlap => "receiver-flap",
            Kind::ReceiverHang => "receiver-hang",
            Kind::HostileBurst => "hostile-burst",
        }
    }

    /// Whether this kind applies to a run of `services` in `broker` mode or not.
    fn applies(self, notification: bool, webhook: bool, broker: bool) -> bool {
        match self {
            Kind::Kill | Kind::Stop | Kind::Term => notification || webhook,
            Kind::RedisPause | Kind::RedisKill => notification && broker,
            Kind::HostileBurst => notification,
            Kind::DbCut | Kind::DbDelay | Kind::ReceiverFlap | Kind::ReceiverHang => webhook,
        }
    }
}

/// One planned fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub id: usize,
    /// When it starts, ms after the fault phase began.
    pub at_ms: u64,
    pub kind: Kind,
    pub target: Target,
    /// How long the fault lasts (the process down, paused, the link cut …), ms.
    pub down_ms: u64,
    /// For [`Kind::DbDelay`]: the added delay; for [`Kind::HostileBurst`]: sockets.
    pub amount: u64,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{:<3} t={:>7.1}s {:<13} {:<9} for {:>5.1}s",
            self.id,
            self.at_ms as f64 / 1000.0,
            self.kind.label(),
            self.target.to_string(),
            self.down_ms as f64 / 1000.0
        )?;
        match self.kind {
            Kind::DbDelay => write!(f, " (+{} ms per write)", self.amount),
            Kind::HostileBurst => write!(f, " ({} sockets)", self.amount),
            _ => Ok(()),
        }
    }
}

/// What the schedule is drawn for.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub seed: u64,
    /// Length of the fault phase, ms.
    pub length_ms: u64,
    pub notification: bool,
    pub webhook: bool,
    pub broker: bool,
    /// Processes of each service.
    pub processes: usize,
    /// Mean gap between fault starts, ms.
    pub mean_gap_ms: u64,
}

/// Longest a resource is assumed busy after its fault's `down` (a restart, a drain), ms:
/// the next fault on it is planned after that. The run also waits for the real end.
const SETTLE_AFTER_FAULT_MS: u64 = 3_000;
/// Extra time a SIGTERM takes (the drain, the start of the new process), ms.
const TERM_EXTRA_MS: u64 = 12_000;

/// Draws the schedule: faults start at gaps drawn around `mean_gap_ms`, each of a kind drawn
/// among those that apply (process faults with twice the weight), on a target drawn among those of its kind; a fault
/// whose target is still busy with an earlier one starts once that one is planned to end.
/// Faults on different targets overlap.
pub fn draw(plan: &Plan) -> Vec<Fault> {
    // The mode and services are part of the stream, so that a broker pass and a mesh pass
    // of one seed are different (but each reproducible) schedules.
    let salt =
        u64::from(plan.notification) | u64::from(plan.webhook) << 1 | u64::from(plan.broker) << 2;
    let mut rng = SplitMix64::new(plan.seed ^ salt.wrapping_mul(0xA076_1D64_78BD_642F));
    // Process faults are drawn twice as often as the others: they have twice the targets.
    let kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| k.applies(plan.notification, plan.webhook, plan.broker))
        .flat_map(|k| match k {
            Kind::Kill | Kind::Stop | Kind::Term => vec![k, k],
            _ => vec![k],
        })
        .collect();
    let mut busy_until: std::collections::HashMap<Target, u64> = Default::default();
    let mut faults = Vec::new();
    let mut t = 1_000;
    if kinds.is_empty() {
        return faults;
    }
    loop {
        t += rng.between(plan.mean_gap_ms / 2, plan.mean_gap_ms * 3 / 2);
        if t >= plan.length_ms {
            break;
        }
        let kind = kinds[rng.below(kinds.len())];
        let target = match kind {
            Kind::Kill | Kind::Stop | Kind::Term => {
                let both = plan.notification && plan.webhook;
                let node = if both {
                    rng.below(2) == 0
                } else {
                    plan.notification
                };
                let i = rng.below(plan.processes);
                if node {
                    Target::Node(i)
                } else {
                    Target::Webhook(i)
                }
            }
            Kind::RedisPause | Kind::RedisKill => Target::Redis,
            Kind::DbCut | Kind::DbDelay => Target::Database,
            Kind::ReceiverFlap | Kind::ReceiverHang => Target::Receiver,
            Kind::HostileBurst => Target::Node(rng.below(plan.processes)),
        };
        let down_ms = match kind {
            Kind::Kill => rng.between(300, 5_000),
            Kind::Stop => rng.between(500, 8_000),
            Kind::Term => 0,
            Kind::RedisPause => rng.between(500, 6_000),
            Kind::RedisKill => rng.between(300, 5_000),
            Kind::DbCut => rng.between(500, 8_000),
            Kind::DbDelay => rng.between(1_000, 8_000),
            Kind::ReceiverFlap => rng.between(2_000, 10_000),
            Kind::ReceiverHang => rng.between(1_000, 6_000),
            Kind::HostileBurst => rng.between(2_000, 8_000),
        };
        let amount = match kind {
            Kind::DbDelay => rng.between(50, 1_500),
            Kind::HostileBurst => rng.between(100, 500),
            _ => 0,
        };
        // A hostile burst does not take its node down: it may overlap the node's own faults,
        // but not another burst (it is planned on a resource of its own).
        let resource = match kind {
            Kind::HostileBurst => (Target::Node(usize::MAX), target),
            _ => (target, target),
        };
        let free_at = busy_until.get(&resource.0).copied().unwrap_or(0);
        let at_ms = t.max(free_at);
        if at_ms >= plan.length_ms {
            continue;
        }
        let extra = if kind == Kind::Term { TERM_EXTRA_MS } else { 0 };
        busy_until.insert(resource.0, at_ms + down_ms + extra + SETTLE_AFTER_FAULT_MS);
        faults.push(Fault {
            id: 0,
            at_ms,
            kind,
            target: resource.1,
            down_ms,
            amount,
        });
    }
    faults.sort_by_key(|f| (f.at_ms, f.target));
    for (id, fault) in faults.iter_mut().enumerate() {
        fault.id = id;
    }
    faults
}

/// The schedule as printed: one line per fault.
pub fn render(faults: &[Fault]) -> String {
    faults.iter().map(|f| format!("{f}\n")).collect()
}

/// Faults applied per kind, every kind listed (0 when none).
pub fn count_by_kind(faults: &[Fault]) -> std::collections::BTreeMap<&'static str, usize> {
    let mut counts: std::collections::BTreeMap<&'static str, usize> =
        Kind::ALL.iter().map(|k| (k.label(), 0)).collect();
    for fault in faults {
        *counts.entry(fault.kind.label()).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(seed: u64, broker: bool) -> Plan {
        Plan {
            seed,
            length_ms: 30 * 60_000,
            notification: true,
            webhook: true,
            broker,
            processes: 3,
            mean_gap_ms: 4_000,
        }
    }

    #[test]
    fn splitmix_matches_the_reference_stream() {
        // The first outputs for seed 1234567 of the reference C implementation.
        let mut rng = SplitMix64::new(1_234_567);
        assert_eq!(rng.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_another_seed_another() {
        let a = render(&draw(&plan(7, true)));
        assert_eq!(a, render(&draw(&plan(7, true))));
        assert_ne!(a, render(&draw(&plan(8, true))));
        assert_ne!(a, render(&draw(&plan(7, false))));
    }

    #[test]
    fn faults_on_one_target_never_overlap_but_others_do() {
        let faults = draw(&plan(3, true));
        let mut overlapping = 0;
        for (i, a) in faults.iter().enumerate() {
            for b in &faults[i + 1..] {
                let a_end = a.at_ms + a.down_ms;
                if b.at_ms < a_end {
                    if a.target == b.target && a.kind != Kind::HostileBurst {
                        assert_eq!(b.kind, Kind::HostileBurst, "{a} overlaps {b}");
                    }
                    overlapping += 1;
                }
            }
        }
        assert!(overlapping > 10, "only {overlapping} overlaps");
    }

    #[test]
    fn thirty_minutes_apply_every_kind_at_least_five_times() {
        for seed in 1..=10 {
            let counts = count_by_kind(&draw(&plan(seed, true)));
            assert!(counts.values().all(|n| *n >= 5), "seed {seed}: {counts:?}");
        }
    }

    #[test]
    fn mesh_mode_draws_no_redis_fault() {
        let counts = count_by_kind(&draw(&plan(5, false)));
        assert_eq!(counts["redis-pause"] + counts["redis-kill"], 0);
        assert!(counts["sigkill"] > 0);
    }
}
