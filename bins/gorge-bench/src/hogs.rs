//! `gorge-bench hogs`: anonymous sockets that each subscribe to as many long PHIDs as a socket
//! may hold, until the server's subscription total is reached (issue 21 item 8). Then a new
//! browser subscribes to one PHID and must receive the message posted to it; then every hog
//! closes and the server's resident size is followed until it settles. Reports RSS idle,
//! at the peak and after the hogs left, and how the hogs were closed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::browser::{self, Ws};
use crate::http1::{HttpConn, ServerArgs, ServerUrls};
use crate::notify::PHP_CONTENT_TYPE;
use crate::sys;

#[derive(Debug, Clone, Args)]
pub struct HogsArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Hogging sockets.
    #[arg(long, default_value_t = 600)]
    pub sockets: usize,
    /// PHIDs each hog subscribes to.
    #[arg(long, default_value_t = 4096)]
    pub phids: usize,
    /// Length of each PHID in bytes (at least 20).
    #[arg(long, default_value_t = 32)]
    pub phid_bytes: usize,
    /// Server process to sample RSS from (/proc).
    #[arg(long)]
    pub pid: Option<u32>,
    /// How long RSS is followed after the hogs closed.
    #[arg(long, default_value_t = 10)]
    pub settle_seconds: u64,
    /// Whole-run limit in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
}

/// `index`'s PHIDs: distinct per hog, `len` bytes each.
fn phids_of(index: usize, count: usize, len: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let head = format!("PHID-USER-{index:05}");
            format!("{head}{i:0width$}", width = len.saturating_sub(head.len()))
        })
        .collect()
}

async fn post(admin: SocketAddr, body: &str) -> Result<u16, String> {
    let mut conn = HttpConn::connect(admin)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let response = conn
        .request(
            "POST",
            "/",
            &[("Content-Type", PHP_CONTENT_TYPE)],
            body.as_bytes(),
        )
        .await
        .map_err(|e| format!("POST: {e}"))?;
    Ok(response.status)
}

/// Waits for a text frame containing `needle`; its arrival after `from`.
async fn frame_with(ws: &mut Ws, needle: &str, limit: Duration) -> Option<Duration> {
    let from = Instant::now();
    tokio::time::timeout(limit, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(text))) if text.as_str().contains(needle) => {
                    return Some(from.elapsed())
                }
                Some(Ok(_)) => {}
                _ => return None,
            }
        }
    })
    .await
    .ok()
    .flatten()
}

pub async fn run(args: HogsArgs) -> Value {
    let deadline = crate::work_deadline(args.timeout);
    let ServerUrls {
        client,
        client_path: path,
        admin,
        ..
    } = match args.server.resolve_plain("hogs") {
        Ok(parsed) => parsed,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    let url = format!("ws://{client}{path}");
    let limit = Duration::from_secs(30);
    let rss_idle = sys::rss_mib(args.pid);
    let anon_idle = sys::rss_anon_mib(args.pid);

    // The hogs, 32 at a time.
    let started = Instant::now();
    let mut rss_peak = rss_idle.unwrap_or(0.0);
    let mut ended: std::collections::BTreeMap<String, u64> = Default::default();
    let mut hogs: Vec<Ws> = Vec::new();
    let mut next = 0;
    while next < args.sockets && Instant::now() < deadline {
        let batch: Vec<usize> = (next..(next + 32).min(args.sockets)).collect();
        next += batch.len();
        let tasks: Vec<_> = batch
            .into_iter()
            .map(|index| {
                let (url, phids) = (
                    url.clone(),
                    phids_of(index, args.phids, args.phid_bytes.max(20)),
                );
                let source = browser::source_ip(client, index);
                tokio::spawn(async move {
                    let mut ws = browser::open(&url, client, source, None, None).await?;
                    browser::subscribe_confirmed(&mut ws, &phids, limit)
                        .await
                        .map(|()| ws)
                })
            })
            .collect();
        for task in tasks {
            match task.await {
                Ok(Ok(ws)) => hogs.push(ws),
                Ok(Err(why)) => *ended.entry(why).or_default() += 1,
                Err(e) => *ended.entry(e.to_string()).or_default() += 1,
            }
        }
        rss_peak = rss_peak.max(sys::rss_mib(args.pid).unwrap_or(0.0));
    }
    let hogs_seconds = started.elapsed().as_secs_f64();
    let anon_peak = sys::rss_anon_mib(args.pid);

    // A new browser's one PHID, and a message to it.
    let newcomer = async {
        let mut ws = browser::open(&url, client, None, None, None).await?;
        let phid = vec!["PHID-USER-newcomer00000000000000".to_string()];
        browser::subscribe_confirmed(&mut ws, &phid, limit).await?;
        let body = r#"{"key":"hogs-newcomer","type":"notification","subscribers":["PHID-USER-newcomer00000000000000"]}"#;
        let status = post(admin, body).await?;
        if status != 200 {
            return Err(format!("POST answered {status}"));
        }
        frame_with(&mut ws, "hogs-newcomer", Duration::from_secs(10))
            .await
            .ok_or_else(|| "no frame within 10 s".to_string())
    }
    .await;

    // Every hog that subscribed is still open; each is closed (a close frame, then the
    // connection).
    let subscribed = hogs.len();
    for mut ws in hogs {
        let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
    }
    let closed_at = Instant::now();
    let mut samples = Vec::new();
    while closed_at.elapsed() < Duration::from_secs(args.settle_seconds)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Some(rss) = sys::rss_mib(args.pid) {
            samples.push(json!([
                (closed_at.elapsed().as_secs_f64() * 10.0).round() / 10.0,
                rss
            ]));
        }
    }
    let rss_after = sys::rss_mib(args.pid);
    let anon_after = sys::rss_anon_mib(args.pid);
    let back_within_20pct = match (rss_idle, rss_after) {
        (Some(idle), Some(after)) => Some(after <= idle * 1.2),
        _ => None,
    };
    json!({
        "ok": newcomer.is_ok() && back_within_20pct != Some(false),
        "sockets": args.sockets,
        "phids_per_socket": args.phids,
        "phid_bytes": args.phid_bytes,
        "hogs_subscribed": subscribed,
        "hogs_open_at_the_end": subscribed,
        "hogs_ended_early": ended,
        "hogs_seconds": hogs_seconds,
        "newcomer_frame_ms": newcomer.as_ref().map(|d| d.as_secs_f64() * 1000.0).ok(),
        "newcomer_error": newcomer.err(),
        "rss_idle_mib": rss_idle,
        "rss_peak_mib": rss_peak,
        "rss_after_mib": rss_after,
        "rss_after_close": samples,
        "rss_anon_idle_mib": anon_idle,
        "rss_anon_peak_mib": anon_peak,
        "rss_anon_after_mib": anon_after,
        "rss_back_within_20pct": back_within_20pct,
    })
}
