//! PHP's side of notifications: `PhabricatorNotificationClient::tryToPostMessage`, which
//! adds a 32-character random `uniqueID`, shuffles the admin servers and posts to each in
//! turn (a new connection each, 2 s timeout, no redirects) until one answers 200.

use std::net::SocketAddr;
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::Rng;
use tokio::sync::watch;

use super::history::{History, Post};
use super::stopped;
use crate::http1::HttpConn;
use crate::notify::PHP_CONTENT_TYPE;

/// `PhabricatorNotificationServerRef::newFuture`: `setTimeout(2)`.
const PHP_TIMEOUT: Duration = Duration::from_secs(2);

/// The PHIDs a message of sequence `seq` is for: one of `projects` project PHIDs.
pub fn message_phids(seq: usize, projects: usize) -> Vec<String> {
    vec![project_phid(seq % projects)]
}

pub fn project_phid(k: usize) -> String {
    format!("PHID-PROJ-chaos{k:04}")
}

fn unique_id() -> String {
    // `Filesystem::readRandomCharacters(32)`: letters and digits.
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..32)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// One POST; true on a 200.
async fn post_once(admin: SocketAddr, body: &[u8]) -> bool {
    let attempt = async {
        let mut conn = HttpConn::connect(admin).await.ok()?;
        conn.request("POST", "/", &[("Content-Type", PHP_CONTENT_TYPE)], body)
            .await
            .ok()
    };
    matches!(
        tokio::time::timeout(PHP_TIMEOUT, attempt).await,
        Ok(Some(r)) if r.status == 200
    )
}

/// Posts one message the way PHP does and records it.
pub async fn post(seq: usize, admins: &[SocketAddr], projects: usize, history: &History) {
    let unique = unique_id();
    let phids = message_phids(seq, projects);
    let body = serde_json::json!({
        "key": seq,
        "type": "notification",
        "subscribers": phids,
        "uniqueID": unique,
    })
    .to_string();
    let mut order: Vec<usize> = (0..admins.len()).collect();
    order.shuffle(&mut rand::rng());
    let start_us = history.now_us();
    let mut tried = Vec::new();
    let mut accepted_by = None;
    for node in order {
        tried.push(node);
        if post_once(admins[node], body.as_bytes()).await {
            accepted_by = Some(node);
            break;
        }
    }
    let end_us = history.now_us();
    history.with(|log| {
        log.posts.push(Post {
            unique_id: unique,
            phids,
            start_us,
            end_us,
            accepted_by,
            tried,
        })
    });
}

/// Posts at `rate` per second until `stop`; each message on its own task, as each PHP
/// request posts its own.
pub async fn run(
    admins: Vec<SocketAddr>,
    rate: f64,
    projects: usize,
    history: History,
    mut stop: watch::Receiver<bool>,
) {
    let interval = Duration::from_secs_f64(1.0 / rate.max(0.01));
    let mut tick = tokio::time::interval(interval);
    let mut tasks = tokio::task::JoinSet::new();
    let mut seq = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stopped(&mut stop) => break,
        }
        let (admins, history) = (admins.clone(), history.clone());
        tasks.spawn(async move { post(seq, &admins, projects, &history).await });
        seq += 1;
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}
