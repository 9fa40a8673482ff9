//! Webhook drills: a process killed mid-delivery, receivers that misbehave, and MariaDB
//! restarting under a drain.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{check, mariadb, Check, DrillEnv, Outcome};
use crate::herald_db::RowState;
use crate::receiver::{Behaviour, Receiver};
use crate::webhook::{Rig, ServiceSettings};

/// Settings shared by the webhook drills: short timeouts so lease expiry happens within a
/// drill, quick polls and retries.
fn drill_settings() -> ServiceSettings {
    ServiceSettings {
        max_concurrent: Some(8),
        poll_interval_ms: Some(200),
        delivery_timeout: Some(2),
        claim_lease_sec: Some(3),
        retry_backoff_sec: Some(1),
    }
}

/// Starts a [`Rig`] of `hooks` hooks with the drill settings and the drill's binary.
async fn drill_rig(
    env: &DrillEnv,
    hooks: usize,
    behaviour: Behaviour,
    uri: impl Fn(&Receiver, usize) -> String,
) -> Result<Rig, String> {
    Rig::new(
        hooks,
        behaviour,
        uri,
        env.webhook_binary.clone(),
        drill_settings(),
    )
    .await
}

fn plain_behaviour(latency_ms: u64) -> Behaviour {
    Behaviour {
        latency: Duration::from_millis(latency_ms),
        error_rate: 0.0,
        hang_rate: 0.0,
    }
}

/// Waits until the receiver has seen `count` requests (or `until`).
async fn wait_arrivals(receiver: &Receiver, count: usize, until: Instant) -> bool {
    while receiver.state.arrival_count() < count {
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Every one of the `expected` rows ended `sent` (and the drill saw them all final).
fn no_row_lost(all_final: bool, rows: &[RowState], expected: usize) -> Check {
    let sent = rows.iter().filter(|r| r.status == "sent").count();
    check(
        "no row lost: every row ends sent",
        all_final && sent == expected,
        format!("{sent}/{expected} sent"),
    )
}

/// Seeds `rows` retry-forever rows, starts two processes on them and waits until `started`
/// requests have arrived.
async fn start_two_processes(
    rig: &mut Rig,
    rows: usize,
    started: usize,
    env: &DrillEnv,
) -> Result<(), String> {
    rig.insert_rows(0..rows, true).await?;
    rig.start_process().await?;
    rig.start_process().await?;
    if !wait_arrivals(&rig.receiver, started, env.within(Duration::from_secs(60))).await {
        return Err("deliveries did not start".to_string());
    }
    Ok(())
}

pub async fn kill9(env: &DrillEnv) -> Outcome {
    const ROWS: usize = 2000;
    const MAX_CONCURRENT: u64 = 8;
    let mut rig = match drill_rig(env, 20, plain_behaviour(30), |r, n| r.hook_uri(n)).await {
        Ok(rig) => rig,
        Err(e) => return Outcome::failed_to_run(e),
    };
    let result = async {
        start_two_processes(&mut rig, ROWS, ROWS / 4, env).await?;
        rig.processes[0].kill9().await;
        eprintln!("  killed gorge-webhook-0 with SIGKILL mid-delivery");
        // Requests the dead process had already written reach the receiver shortly after.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let arrived: HashSet<usize> = rig
            .receiver
            .state
            .arrivals()
            .iter()
            .filter_map(|a| a.seq)
            .collect();
        let rows_at_kill = rig.db.rows().await?;
        let in_flight: HashSet<usize> = rows_at_kill
            .iter()
            .filter(|r| r.status == "queued" && arrived.contains(&r.seq))
            .map(|r| r.seq)
            .collect();
        rig.start_process().await?;
        let all_final = rig.wait_final(env.within(Duration::from_secs(120))).await;
        Ok((in_flight, all_final))
    }
    .await;
    let report = rig.report();
    let rows = rig.db.rows().await.unwrap_or_default();
    let survivors_alive = rig.processes.iter_mut().skip(1).all(|p| p.alive());
    let max_per_hook = rig.receiver.state.max_concurrent_per_hook();
    rig.teardown().await;
    let (in_flight, all_final) = match result {
        Ok(v) => v,
        Err(e) => return Outcome::failed_to_run(e),
    };
    let outside: Vec<usize> = report
        .duplicated_rows
        .iter()
        .copied()
        .filter(|seq| !in_flight.contains(seq))
        .collect();
    Outcome {
        checks: vec![
            no_row_lost(all_final, &rows, ROWS),
            check(
                "duplicates only for rows in flight at the kill",
                outside.is_empty(),
                format!(
                    "{} duplicates, {} rows in flight at the kill, {} duplicated outside them",
                    report.duplicates,
                    in_flight.len(),
                    outside.len()
                ),
            ),
            check(
                "no more duplicates than one process has in flight",
                report.duplicates <= MAX_CONCURRENT,
                format!("{} <= {MAX_CONCURRENT}", report.duplicates),
            ),
            check("the other processes keep running", survivors_alive, ""),
        ],
        facts: json!({
            "rows": ROWS,
            "duplicates": report.duplicates,
            "in_flight_at_kill": in_flight.len(),
            "repeat_requests": report.repeat_requests,
            "max_concurrent_per_hook": max_per_hook,
        }),
    }
}

/// Receiver fault classes, `HOOKS_PER_FAULT` hooks each, routed by URI.
const FAULTS: [&str; 5] = ["reset", "big-200", "big-500", "redirect-loop", "control"];
const HOOKS_PER_FAULT: usize = 3;

fn fault_uri(receiver: &Receiver, hook: usize) -> String {
    let (addr, reset) = (receiver.addr, receiver.reset_addr);
    match FAULTS[hook / HOOKS_PER_FAULT] {
        "reset" => format!("http://{reset}/hook/{hook}"),
        "big-200" => format!("http://{addr}/big/{hook}"),
        "big-500" => format!("http://{addr}/bigerr/{hook}"),
        "redirect-loop" => format!("http://{addr}/loop/{hook}/0"),
        _ => format!("http://{addr}/hook/{hook}"),
    }
}

/// A stable error code is short, one token, and machine-like.
fn is_stable_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= 40
        && code
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

pub async fn receiver_faults(env: &DrillEnv) -> Outcome {
    // Below the breaker threshold (10 failures per hook), so every fault row gets tried.
    const ROWS_PER_HOOK: usize = 8;
    // Enough to open the breaker of every failing hook and leave more queued rows of those
    // hooks than one poll fetches (4 x concurrency).
    const BREAKER_ROWS_PER_HOOK: usize = 12;
    const LATE_CONTROL_ROWS: usize = 30;
    let hooks = FAULTS.len() * HOOKS_PER_FAULT;
    let class_of = |hook: usize| FAULTS[hook / HOOKS_PER_FAULT];
    let rows_total = hooks * ROWS_PER_HOOK;
    let mut rig = match drill_rig(env, hooks, plain_behaviour(0), fault_uri).await {
        Ok(rig) => rig,
        Err(e) => return Outcome::failed_to_run(e),
    };
    let failing: Vec<usize> = (0..hooks)
        .filter(|&h| matches!(class_of(h), "reset" | "big-500" | "redirect-loop"))
        .collect();
    let control: Vec<usize> = (0..hooks).filter(|&h| class_of(h) == "control").collect();
    let late_control: Vec<usize> = (0..LATE_CONTROL_ROWS)
        .map(|k| rows_total + failing.len() * BREAKER_ROWS_PER_HOOK + k)
        .collect();
    let result = async {
        // Phase 1. retry=never: one attempt each, so every row must reach a final state.
        rig.insert_rows(0..rows_total, false).await?;
        rig.start_process().await?;
        let all_final = rig.wait_final(env.within(Duration::from_secs(90))).await;
        let phase1 = rig.db.rows().await?;
        let phase1_arrivals = rig.receiver.state.arrivals();
        // Phase 2: open the failing hooks' breakers with older rows, then queue rows for
        // healthy hooks behind them. The healthy rows must not wait for the breakers.
        let mut rows: Vec<(usize, usize)> = Vec::new();
        for k in 0..failing.len() * BREAKER_ROWS_PER_HOOK {
            rows.push((rows_total + k, failing[k % failing.len()]));
        }
        for (k, &seq) in late_control.iter().enumerate() {
            rows.push((seq, control[k % control.len()]));
        }
        let pid = rig.processes.first().map(|p| p.pid).unwrap_or(0);
        let cpu_before = crate::sys::cpu_seconds(pid).unwrap_or(0.0);
        let phase2_started = Instant::now();
        rig.insert_rows_for(&rows, false).await?;
        let until = env.within(Duration::from_secs(30));
        let late_sent = loop {
            let sent = rig
                .db
                .rows()
                .await
                .unwrap_or_default()
                .iter()
                .filter(|r| late_control.contains(&r.seq) && r.status == "sent")
                .count();
            if sent == LATE_CONTROL_ROWS || Instant::now() >= until {
                break sent;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        // CPU share while waiting: a poller that refetches the same skipped rows spins.
        let cpu_share = (crate::sys::cpu_seconds(pid).unwrap_or(0.0) - cpu_before)
            / phase2_started.elapsed().as_secs_f64();
        Ok::<_, String>((all_final, phase1, phase1_arrivals, late_sent, cpu_share))
    }
    .await;
    let alive = rig.processes.iter_mut().all(|p| p.alive());
    let healthy = match rig.processes.first() {
        Some(p) => crate::http1::get_once(p.probe_addr, "/healthz", Duration::from_secs(2))
            .await
            .is_ok_and(|r| r.status == 200),
        None => false,
    };
    let row_hook = rig.row_hook.clone();
    rig.teardown().await;
    let (all_final, rows, arrivals, late_sent, phase2_cpu_share) = match result {
        Ok(v) => v,
        Err(e) => return Outcome::failed_to_run(e),
    };

    // Outcome tuples per fault class (phase 1 rows only).
    let mut outcomes: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    let mut codes_stable = true;
    for row in rows.iter().filter(|r| r.seq < rows_total) {
        let class = class_of(row_hook.get(&row.seq).copied().unwrap_or(0));
        let code = row.error_code.clone().unwrap_or_default();
        if !is_stable_code(&code) {
            codes_stable = false;
        }
        let tuple = format!(
            "{}/{}/{}/{}",
            row.status,
            row.last_result,
            row.error_type.clone().unwrap_or_default(),
            code
        );
        *outcomes.entry(class).or_default().entry(tuple).or_default() += 1;
    }
    let uniform = outcomes.values().all(|tuples| tuples.len() == 1);
    let control_sent = outcomes
        .get("control")
        .and_then(|t| t.get("sent/okay/http/200"))
        .copied()
        .unwrap_or(0);
    let loop_hooks: HashSet<usize> = (0..hooks)
        .filter(|&h| class_of(h) == "redirect-loop")
        .collect();
    let loop_rows = loop_hooks.len() * ROWS_PER_HOOK;
    let loop_requests = arrivals
        .iter()
        .filter(|a| loop_hooks.contains(&a.hook))
        .count();
    let queued = rows
        .iter()
        .filter(|r| r.seq < rows_total && r.status == "queued")
        .count();
    Outcome {
        checks: vec![
            check(
                "every row reaches a final state (no hang)",
                all_final && queued == 0,
                format!("{queued} of {rows_total} still queued"),
            ),
            check(
                "the process does not crash and stays healthy",
                alive && healthy,
                format!("alive={alive} healthz={healthy}"),
            ),
            check(
                "one fault gives one outcome (status/result/errorType/errorCode)",
                uniform,
                format!("{outcomes:?}"),
            ),
            check(
                "error codes are short stable tokens",
                codes_stable,
                "[A-Za-z0-9._-]{1,40}",
            ),
            check(
                "healthy hooks still deliver",
                control_sent == HOOKS_PER_FAULT * ROWS_PER_HOOK,
                format!("{control_sent}/{} control rows sent", HOOKS_PER_FAULT * ROWS_PER_HOOK),
            ),
            check(
                "redirects are followed at most 20 times (as Phorge's cURL call, then 47)",
                loop_requests <= loop_rows * 21,
                format!("{loop_requests} requests for {loop_rows} rows"),
            ),
            check(
                "healthy hooks are not starved by rows of hooks whose breaker is open",
                late_sent == LATE_CONTROL_ROWS,
                format!(
                    "{late_sent}/{LATE_CONTROL_ROWS} healthy rows sent within 30 s, queued behind {} rows of {} breaker-open hooks",
                    failing.len() * BREAKER_ROWS_PER_HOOK,
                    failing.len()
                ),
            ),
        ],
        facts: json!({
            "outcomes": outcomes,
            "redirect_requests": loop_requests,
            "breaker_phase_cpu_share": crate::notify::round3(phase2_cpu_share),
        }),
    }
}

pub async fn mariadb_restart(env: &DrillEnv) -> Outcome {
    const ROWS: usize = 3000;
    let mut rig = match drill_rig(env, 20, plain_behaviour(20), |r, n| r.hook_uri(n)).await {
        Ok(rig) => rig,
        Err(e) => return Outcome::failed_to_run(e),
    };
    let result = async {
        start_two_processes(&mut rig, ROWS, ROWS / 5, env).await?;
        eprintln!("  shutting MariaDB down mid-drain");
        let at_shutdown = rig.receiver.state.arrival_count();
        let down_started = Instant::now();
        let restart = tokio::task::spawn_blocking(|| {
            mariadb::shutdown()?;
            // Stay down long enough for in-flight deliveries to finish and hit the dead DB.
            std::thread::sleep(Duration::from_secs(3));
            mariadb::start()
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        eprintln!("  MariaDB restarted: {restart:?}");
        restart?;
        let down_s = down_started.elapsed().as_secs_f64();
        let at_restart = rig.receiver.state.arrival_count();
        let all_final = rig.wait_final(env.within(Duration::from_secs(180))).await;
        Ok((all_final, at_shutdown, at_restart, down_s))
    }
    .await;
    mariadb::ensure_running();
    let report = rig.report();
    let rows = rig.db.rows().await.unwrap_or_default();
    let exited = rig.exited();
    rig.teardown().await;
    let (all_final, at_shutdown, at_restart, down_s) = match result {
        Ok(v) => v,
        Err(e) => return Outcome::failed_to_run(e),
    };
    Outcome {
        checks: vec![
            no_row_lost(all_final, &rows, ROWS),
            check(
                "no duplicate delivery",
                report.duplicates == 0,
                format!(
                    "{} duplicates over {} rows",
                    report.duplicates,
                    report.duplicated_rows.len()
                ),
            ),
            check(
                "no process exits because the database went away",
                exited == 0,
                format!("{exited} exited"),
            ),
            check("MariaDB runs again", mariadb::accepting(), ""),
        ],
        facts: json!({
            "rows": ROWS,
            "requests_before_shutdown": at_shutdown,
            "requests_while_down": at_restart - at_shutdown,
            "down_s": crate::notify::round3(down_s),
            "duplicates": report.duplicates,
            "repeat_requests": report.repeat_requests,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_codes() {
        assert!(is_stable_code("connection-refused"));
        assert!(is_stable_code("500"));
        assert!(!is_stable_code("error: connection reset\nby peer"));
        assert!(!is_stable_code(""));
    }
}
