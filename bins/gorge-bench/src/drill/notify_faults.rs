//! Notification drills: peers killed and restarted under load, and a burst of reconnecting
//! sockets.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{check, DrillEnv, Outcome};
use crate::browser::{read_frames, Deliveries, ReaderEnd};
use crate::http1::HttpConn;
use crate::notify::{
    message_body, open_many, private_phid, shared_phid, Opened, Target, PHP_CONTENT_TYPE,
};
use crate::procs::{free_port_pairs, NotificationServer};
use crate::sys;

/// Posts message `seq` (to the shared PHID) through `conn`; true on a 200 receipt. A
/// keep-alive connection the server has closed is replaced once, as PHP opens a new one
/// for every message anyway.
async fn post(
    conn: &mut Option<HttpConn>,
    admin: std::net::SocketAddr,
    deliveries: &Deliveries,
    seq: usize,
) -> bool {
    let sent_us = deliveries.now_us().max(1);
    let body = message_body(seq, &[shared_phid(0)], sent_us, "");
    deliveries.posted_at_us[seq].store(sent_us, Ordering::Relaxed);
    for _ in 0..2 {
        if conn.is_none() {
            *conn = HttpConn::connect(admin).await.ok();
        }
        let Some(c) = conn.as_mut() else { return false };
        match c
            .request("POST", "/", &[("Content-Type", PHP_CONTENT_TYPE)], &body)
            .await
        {
            Ok(r) => return r.status == 200,
            Err(_) => *conn = None,
        }
    }
    false
}

/// Opens sockets `indices`, subscribed to the shared PHID; retries the failures up to
/// `attempts` times (as browsers reconnect). Returns the sockets and the failed attempts.
async fn open_subscribed(
    server: &NotificationServer,
    indices: std::ops::Range<usize>,
    concurrency: usize,
    attempts: usize,
    until: Instant,
) -> (Opened, usize) {
    let target = Target {
        url: server.client_url(),
        server: server.client_addr(),
        tls: None,
    };
    let phids = |i: usize| vec![private_phid(i), shared_phid(0)];
    let mut opened = open_many(&target, indices, concurrency, None, phids, until).await;
    let mut failed_attempts = opened.failed.len();
    for attempt in 1..attempts {
        if opened.failed.is_empty() || Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200 * attempt as u64)).await;
        let retry: Vec<usize> = std::mem::take(&mut opened.failed);
        for index in retry {
            let again = open_many(&target, index..index + 1, 1, None, phids, until).await;
            failed_attempts += again.failed.len();
            opened.sockets.extend(again.sockets);
            opened.failed.extend(again.failed);
        }
    }
    (opened, failed_attempts)
}

/// What each reading socket of the peers drill returns: its (server, generation) and end.
type TaggedReaders = JoinSet<((usize, u8), ReaderEnd)>;

/// Opens sockets `indices` on `server` (64 at a time, three attempts, within a minute) and
/// spawns a reader for each, tagged `tag`; fails if any socket could not be subscribed.
async fn spawn_readers(
    server: &NotificationServer,
    indices: std::ops::Range<usize>,
    env: &DrillEnv,
    deliveries: &Arc<Deliveries>,
    stop_rx: &watch::Receiver<bool>,
    readers: &mut TaggedReaders,
    tag: (usize, u8),
) -> Result<(), String> {
    let until = env.within(Duration::from_secs(60));
    let (opened, _) = open_subscribed(server, indices, 64, 3, until).await;
    if !opened.failed.is_empty() {
        return Err(format!(
            "{} sockets failed: {:?}",
            opened.failed.len(),
            opened.first_error
        ));
    }
    for (_, ws) in opened.sockets {
        let (d, s) = (deliveries.clone(), stop_rx.clone());
        readers.spawn(async move { (tag, read_frames(ws, d, s, true).await) });
    }
    Ok(())
}

pub async fn peers(env: &DrillEnv) -> Outcome {
    const SOCKETS_PER_SERVER: usize = 150;
    const PER_PHASE: usize = 200;
    const RATE: f64 = 100.0;
    let _ = sys::raise_nofile(16_384);
    let ports = match free_port_pairs(3) {
        Ok(p) => p,
        Err(e) => return Outcome::failed_to_run(format!("ports: {e}")),
    };
    let peers_of =
        |i: usize| -> Vec<u16> { (0..3).filter(|&j| j != i).map(|j| ports[j].1).collect() };
    let mut servers = Vec::new();
    for (i, (client, admin)) in ports.iter().enumerate() {
        match NotificationServer::start(
            &format!("gorge-notification-{i}"),
            &env.notification_binary,
            *client,
            *admin,
            &peers_of(i),
        )
        .await
        {
            Ok(s) => servers.push(s),
            Err(e) => return Outcome::failed_to_run(e),
        }
    }
    let deliveries = Arc::new(Deliveries::new(Instant::now(), 3 * PER_PHASE));
    let (stop_tx, stop_rx) = watch::channel(false);
    // (server, generation) of every reading socket, in spawn order.
    let mut readers: TaggedReaders = JoinSet::new();
    for (i, server) in servers.iter().enumerate() {
        let base = i * SOCKETS_PER_SERVER;
        let indices = base..base + SOCKETS_PER_SERVER;
        let spawned = spawn_readers(
            server,
            indices,
            env,
            &deliveries,
            &stop_rx,
            &mut readers,
            (i, 0),
        );
        if let Err(e) = spawned.await {
            return Outcome::failed_to_run(format!("server {i}: {e}"));
        }
    }

    let mut conns: Vec<Option<HttpConn>> = vec![None, None, None];
    let mut target_of = vec![usize::MAX; 3 * PER_PHASE];
    let mut failed_posts = 0usize;
    let interval = Duration::from_secs_f64(1.0 / RATE);
    // Phase A: all three; B: survivors only; C: all three after the restart.
    let mut phase_failures = Vec::new();
    for phase in 0..3 {
        if phase == 1 {
            servers[2].service.kill9().await;
            eprintln!("  killed gorge-notification-2 with SIGKILL under load");
        }
        if phase == 2 {
            let (client, admin) = ports[2];
            match NotificationServer::start(
                "gorge-notification-2b",
                &env.notification_binary,
                client,
                admin,
                &peers_of(2),
            )
            .await
            {
                Ok(s) => {
                    servers[2] = s;
                    conns[2] = None;
                }
                Err(e) => return Outcome::failed_to_run(format!("restart: {e}")),
            }
            let base = 3 * SOCKETS_PER_SERVER;
            let indices = base..base + SOCKETS_PER_SERVER;
            let spawned = spawn_readers(
                &servers[2],
                indices,
                env,
                &deliveries,
                &stop_rx,
                &mut readers,
                (2, 1),
            );
            if let Err(e) = spawned.await {
                return Outcome::failed_to_run(format!("restarted server: {e}"));
            }
            eprintln!("  restarted gorge-notification-2 and resubscribed its sockets");
        }
        let range = phase * PER_PHASE..(phase + 1) * PER_PHASE;
        let targets: &[usize] = if phase == 1 { &[0, 1] } else { &[0, 1, 2] };
        let start = Instant::now();
        let mut failures = 0;
        for (k, seq) in range.enumerate() {
            tokio::time::sleep_until((start + interval * k as u32).into()).await;
            let server = targets[k % targets.len()];
            target_of[seq] = server;
            if !post(
                &mut conns[server],
                servers[server].admin_addr(),
                &deliveries,
                seq,
            )
            .await
            {
                failures += 1;
            }
        }
        failed_posts += failures;
        phase_failures.push(failures);
    }
    // Relays are asynchronous: give the last ones a moment (there is no completion
    // signal to wait on across three processes).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = stop_tx.send(true);
    let mut ends = Vec::new();
    while let Some(joined) = readers.join_next().await {
        if let Ok(end) = joined {
            ends.push(end);
        }
    }
    for server in &mut servers {
        server.service.stop(Duration::from_secs(3)).await;
    }

    // Which messages each socket must have exactly once.
    let must_see = |(server, generation): (usize, u8), seq: usize| -> bool {
        let phase = seq / PER_PHASE;
        let posted_to_killed_before_kill = phase == 0 && target_of[seq] == 2;
        match (server, generation) {
            (2, 0) => false,      // the killed server's own sockets died with it
            (2, _) => phase == 2, // the restarted server's sockets exist from phase C on
            _ => !posted_to_killed_before_kill,
        }
    };
    let mut missing = 0u64;
    let mut duplicated = 0u64;
    let mut restarted_missing = 0u64;
    let mut survivors_closed = 0;
    for ((server, generation), end) in &ends {
        if *server != 2 && end.closed_early {
            survivors_closed += 1;
        }
        for (seq, &count) in end.counts.iter().enumerate() {
            if count > 1 {
                duplicated += u64::from(count - 1);
            }
            if must_see((*server, *generation), seq) && count == 0 {
                missing += 1;
                if *server == 2 {
                    restarted_missing += 1;
                }
            }
        }
    }
    let facts: Value = json!({
        "sockets": ends.len(),
        "messages": 3 * PER_PHASE,
        "posts_failed_by_phase": phase_failures,
        "post_to_frame_ms": deliveries.latency.percentiles(),
    });
    Outcome {
        checks: vec![
            check(
                "messages posted to live servers arrive on every live socket",
                missing == 0,
                format!("{missing} socket-messages missing ({restarted_missing} on the restarted server)"),
            ),
            check("no socket gets a message twice", duplicated == 0, format!("{duplicated} duplicates")),
            check(
                "survivors' sockets stay open",
                survivors_closed == 0,
                format!("{survivors_closed} closed"),
            ),
            check(
                "admin POSTs to live servers succeed",
                failed_posts == 0,
                format!("{failed_posts} failed"),
            ),
        ],
        facts,
    }
}

pub async fn reconnect_burst(env: &DrillEnv) -> Outcome {
    const SOCKETS: usize = 5000;
    const CYCLES: usize = 2;
    let _ = sys::raise_nofile(3 * SOCKETS as u64 + 1024);
    let Ok(&[(client, admin)]) = free_port_pairs(1).as_deref() else {
        return Outcome::failed_to_run("no free ports".to_string());
    };
    let mut server = match NotificationServer::start(
        "gorge-notification-burst",
        &env.notification_binary,
        client,
        admin,
        &[],
    )
    .await
    {
        Ok(s) => s,
        Err(e) => return Outcome::failed_to_run(e),
    };
    let until = env.within(Duration::from_secs(180));
    let mut cycle_facts = Vec::new();
    let mut opened = None;
    for cycle in 0..=CYCLES {
        // Everything at once: this is the thundering herd after a deploy or network blip.
        drop(opened.take());
        let started = Instant::now();
        let (sockets, failed_attempts) =
            open_subscribed(&server, 0..SOCKETS, SOCKETS, 5, until).await;
        cycle_facts.push(json!({
            "cycle": cycle,
            "subscribed": sockets.sockets.len(),
            "failed_attempts": failed_attempts,
            "first_error": sockets.first_error,
            "seconds": crate::notify::round3(started.elapsed().as_secs_f64()),
        }));
        eprintln!(
            "  cycle {cycle}: {} subscribed, {failed_attempts} failed attempts",
            sockets.sockets.len()
        );
        opened = Some(sockets);
    }
    let sockets = opened.map(|o| o.sockets).unwrap_or_default();
    let subscribed = sockets.len();
    let deliveries = Arc::new(Deliveries::new(Instant::now(), 1));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut readers = JoinSet::new();
    for (_, ws) in sockets {
        readers.spawn(read_frames(ws, deliveries.clone(), stop_rx.clone(), true));
    }
    let mut conn = None;
    let posted = post(&mut conn, server.admin_addr(), &deliveries, 0).await;
    let wait_until = Instant::now() + Duration::from_secs(15);
    while deliveries.frames.load(Ordering::Relaxed) < subscribed as u64
        && Instant::now() < wait_until
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Sampled while the sockets are still open: the old generations should be gone.
    let status = crate::http1::get_once(server.admin_addr(), "/status/", Duration::from_secs(2))
        .await
        .ok()
        .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok());
    let _ = stop_tx.send(true);
    let mut received_once = 0;
    let mut duplicated = 0;
    while let Some(joined) = readers.join_next().await {
        if let Ok(end) = joined {
            match end.counts.first().copied().unwrap_or(0) {
                1 => received_once += 1,
                0 => {}
                _ => duplicated += 1,
            }
        }
    }
    let alive = server.service.alive();
    server.service.stop(Duration::from_secs(3)).await;
    Outcome {
        checks: vec![
            check(
                "every socket ends subscribed",
                subscribed == SOCKETS,
                format!("{subscribed}/{SOCKETS}"),
            ),
            check(
                "every socket receives the final message exactly once",
                posted && received_once == SOCKETS && duplicated == 0,
                format!("{received_once}/{SOCKETS} once, {duplicated} more than once"),
            ),
            check("the server survives the burst", alive, ""),
        ],
        facts: json!({
            "cycles": cycle_facts,
            "final_message_ms": deliveries.latency.percentiles(),
            "status_clients_active": status.as_ref().and_then(|s| s.get("clients.active").cloned()),
        }),
    }
}
