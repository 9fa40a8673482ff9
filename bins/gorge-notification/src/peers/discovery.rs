//! DNS peer discovery: re-resolves `GORGE_NOTIFICATION_PEER_DNS` every refresh
//! period so the replicas of a Kubernetes Deployment find each other through a headless
//! Service, and turns each answer into peers to add and remove. After the first answer this
//! server announces itself to every address in it (`POST /peers/announce`), so that the
//! siblings relay to it at once rather than at their next refresh.

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;

use super::Shared;
use crate::events;
use gorge_service::emit;

/// A refresh period below this would turn a misconfiguration into a resolver flood.
const MIN_REFRESH: Duration = Duration::from_millis(100);

/// One known peer as discovery sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct KnownPeer<'a> {
    pub(super) address: &'a str,
    pub(super) from_dns: bool,
}

/// What one DNS answer changes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct DnsPlan {
    /// Addresses of DNS peers that are no longer in the answer.
    pub(super) remove: Vec<String>,
    /// New addresses, in address order so the choice under the cap is stable.
    pub(super) add: Vec<SocketAddr>,
    /// New addresses left out because the peer limit was reached.
    pub(super) refused: usize,
}

/// Compares the known peers with a DNS answer. Static peers are never removed; an address
/// known to be this server is neither added nor refused.
pub(super) fn plan(
    known: &[KnownPeer<'_>],
    resolved: &BTreeSet<SocketAddr>,
    self_addresses: &HashSet<String>,
    max_peers: usize,
) -> DnsPlan {
    let resolved: Vec<(SocketAddr, String)> = resolved
        .iter()
        .map(|addr| (*addr, addr.to_string()))
        .collect();
    let remove: Vec<String> = known
        .iter()
        .filter(|peer| peer.from_dns && !resolved.iter().any(|(_, a)| a == peer.address))
        .map(|peer| peer.address.to_owned())
        .collect();
    let mut room = max_peers.saturating_sub(known.len() - remove.len());
    let mut plan = DnsPlan {
        remove,
        ..DnsPlan::default()
    };
    for (addr, address) in resolved {
        let is_known = known.iter().any(|peer| peer.address == address);
        if is_known || self_addresses.contains(&address) {
            continue;
        }
        if room == 0 {
            plan.refused += 1;
        } else {
            room -= 1;
            plan.add.push(addr);
        }
    }
    plan
}

/// Resolves `host:port` now and then every `refresh` until aborted. A failed, timed-out or
/// empty answer keeps the previous peers: a resolver hiccup must not cut the cluster apart.
pub(super) async fn run(
    shared: Arc<Shared>,
    host: String,
    port: u16,
    refresh: Duration,
    lookup_timeout: Duration,
) {
    let mut ticker = tokio::time::interval(refresh.max(MIN_REFRESH));
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut failing = false;
    let mut announced = false;
    loop {
        ticker.tick().await;
        let answer = tokio::time::timeout(
            lookup_timeout,
            tokio::net::lookup_host((host.as_str(), port)),
        )
        .await;
        let resolved: Result<BTreeSet<SocketAddr>, String> = match answer {
            Ok(Ok(addrs)) => Ok(addrs.collect()),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err("lookup timed out".to_owned()),
        };
        match resolved {
            Ok(resolved) if !resolved.is_empty() => {
                if failing {
                    emit!(shared.log, events::NOTIFY_PEER_DNS_RECOVERED; "host" => &host);
                    failing = false;
                }
                shared.apply_dns(&resolved);
                if !announced {
                    // Once, at start: the siblings learn of us now, not at their next refresh.
                    announced = true;
                    let shared = Arc::clone(&shared);
                    tokio::task::spawn_blocking(move || announce(&shared, &resolved));
                }
            }
            other => {
                shared.metrics.peer_dns_failures.inc();
                if !failing {
                    let reason = other.err().unwrap_or_else(|| "no addresses".to_owned());
                    emit!(shared.log, events::NOTIFY_PEER_DNS_FAILED; "host" => &host, "reason" => reason);
                    failing = true;
                }
            }
        }
    }
}

/// Tells every resolved sibling that this server is here (blocking: ureq). An address that is
/// this server answers too, and is found to be us by the relay as usual.
fn announce(shared: &Shared, resolved: &BTreeSet<SocketAddr>) {
    let mut told = 0usize;
    for addr in resolved {
        let url = format!("http://{addr}{}", super::ANNOUNCE_PATH);
        if let Ok(response) = shared.agent.post(&url).send(&[] as &[u8]) {
            told += usize::from(response.status().as_u16() == 200);
        }
    }
    emit!(shared.log, events::NOTIFY_PEER_ANNOUNCED; "siblings" => resolved.len(), "told" => told);
}
