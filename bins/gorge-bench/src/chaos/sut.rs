//! The system under test of one chaos pass, all on loopback: 3 gorge-notification nodes
//! (broker mode with their own `redis-server`, or a mesh), 3 gorge-webhook processes on one
//! Phorge-schema namespace reached through a [`Link`], and the hook receiver. Each process
//! lives in a slot that a fault can empty and refill (restart on the same ports, as
//! systemd would).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::Mutex;

use super::history::History;
use super::hooks::HookReceiver;
use super::link::Link;
use super::schedule::{Plan, Target};
use crate::herald_db::{self, HeraldDb, HookSpec};
use crate::procs::{self, Service};
use crate::redis_server::Redis;
use crate::sys;

/// How long a (re)started process may take to become ready.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// One process the run may kill and start again.
pub struct Slot {
    pub target: Target,
    pub name: String,
    pub binary: PathBuf,
    pub env: Vec<(String, String)>,
    pub probe: SocketAddr,
    /// `/readyz` for the nodes; `/healthz` for the webhook processes (their readiness
    /// follows the database, which the run cuts on purpose).
    pub ready_path: &'static str,
    pub service: Option<Service>,
}

impl Slot {
    /// Starts the process and waits until it answers ready.
    pub async fn start(&mut self, history: &History) -> Result<(), String> {
        let mut service = Service::start(&self.name, &self.binary, &self.env, self.probe)?;
        let ready = service.wait_ready(self.ready_path, READY_WITHIN).await;
        self.service = Some(service);
        ready?;
        history.started(self.target);
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.service.as_ref().map(|s| s.pid)
    }
}

/// Everything one pass runs.
pub struct Sut {
    pub nodes: Vec<Mutex<Slot>>,
    /// Each node's (client, admin) ports.
    pub node_ports: Vec<(u16, u16)>,
    pub redis: Option<Mutex<Redis>>,
    pub webhooks: Vec<Mutex<Slot>>,
    pub db: Option<HeraldDb>,
    pub link: Option<Link>,
    pub receiver: Option<HookReceiver>,
    pub hooks: usize,
}

/// Every node's drain window (`GORGE_NOTIFICATION_DRAIN_SECONDS`): short, so that a SIGTERM
/// restart takes seconds.
pub const NODE_DRAIN_SECONDS: u64 = 2;

/// Settings every node runs with.
fn node_env(client: u16, admin: u16, peers: &[u16], broker: Option<&str>) -> Vec<(String, String)> {
    let mut env = procs::notification_env(client, admin, peers);
    env.push((
        "GORGE_NOTIFICATION_DRAIN_SECONDS".into(),
        NODE_DRAIN_SECONDS.to_string(),
    ));
    if let Some(url) = broker {
        env.push(("GORGE_NOTIFICATION_BROKER_URL".into(), url.into()));
    }
    env
}

/// Settings every webhook process runs with: short timeouts so that the faults play out
/// within minutes, a breaker that never opens (the 500 hooks would otherwise hold their
/// rows queued for the breaker's 5 minutes), and the database through the link.
fn webhook_env(db: &HeraldDb, link_port: u16, listen: SocketAddr) -> Vec<(String, String)> {
    let (host, _) = herald_db::mysql_host_port();
    [
        ("GORGE_WEBHOOK_MYSQL_HOST", host.as_str()),
        ("GORGE_WEBHOOK_MYSQL_PORT", &link_port.to_string()),
        ("GORGE_WEBHOOK_MYSQL_USER", "root"),
        ("GORGE_WEBHOOK_MYSQL_PASS", ""),
        ("GORGE_WEBHOOK_MYSQL_QUERY_TIMEOUT_SEC", "5"),
        ("GORGE_WEBHOOK_NAMESPACE", &db.namespace),
        ("GORGE_WEBHOOK_OUTBOUND_BLACKLIST", "192.0.2.0/24"),
        ("GORGE_WEBHOOK_DELIVERY_TIMEOUT", "3"),
        ("GORGE_WEBHOOK_CLAIM_LEASE_SEC", "12"),
        ("GORGE_WEBHOOK_RETRY_BACKOFF_SEC", "1"),
        ("GORGE_WEBHOOK_ERROR_THRESHOLD", "1000000"),
        ("GORGE_WEBHOOK_POLL_INTERVAL_MS", "250"),
        ("GORGE_LISTEN_ADDR", &listen.to_string()),
        ("GORGE_LOG_LEVEL", "warn"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

pub struct Binaries {
    pub notification: PathBuf,
    pub webhook: PathBuf,
}

impl Sut {
    /// Starts everything; `label` prefixes the process logs (one pass's from another's).
    pub async fn start(
        label: &str,
        plan: &Plan,
        hooks: usize,
        binaries: &Binaries,
        history: &History,
    ) -> Result<Sut, String> {
        let (notification, webhook, broker, processes) =
            (plan.notification, plan.webhook, plan.broker, plan.processes);
        let mut sut = Sut {
            nodes: Vec::new(),
            node_ports: Vec::new(),
            redis: None,
            webhooks: Vec::new(),
            db: None,
            link: None,
            receiver: None,
            hooks,
        };
        if notification {
            let redis = if broker {
                let port = procs::free_port().map_err(|e| e.to_string())?;
                Some(Redis::start(port).await?)
            } else {
                None
            };
            let ports = procs::free_port_pairs(processes).map_err(|e| e.to_string())?;
            for (i, &(client, admin)) in ports.iter().enumerate() {
                let peers: Vec<u16> = if broker {
                    Vec::new()
                } else {
                    ports.iter().filter(|p| p.1 != admin).map(|p| p.1).collect()
                };
                let url = redis.as_ref().map(Redis::url);
                let mut slot = Slot {
                    target: Target::Node(i),
                    name: format!("{label}-node{i}"),
                    binary: binaries.notification.clone(),
                    env: node_env(client, admin, &peers, url.as_deref()),
                    probe: SocketAddr::from(([127, 0, 0, 1], admin)),
                    ready_path: "/readyz",
                    service: None,
                };
                slot.start(history).await?;
                sut.nodes.push(Mutex::new(slot));
            }
            sut.node_ports = ports;
            sut.redis = redis.map(Mutex::new);
        }
        if webhook {
            let receiver = HookReceiver::start(history.clone())
                .await
                .map_err(|e| format!("receiver: {e}"))?;
            let db = HeraldDb::create().await?;
            let specs: Vec<HookSpec> = (0..hooks)
                .map(|n| HookSpec {
                    phid: crate::webhook::hook_phid(n),
                    uri: receiver.uri(n),
                    hmac_key: format!("chaoskey{n:024}"),
                })
                .collect();
            db.insert_hooks(&specs).await?;
            let (host, port) = herald_db::mysql_host_port();
            let upstream: SocketAddr = format!("{host}:{port}")
                .parse()
                .map_err(|e| format!("MariaDB address {host}:{port}: {e}"))?;
            let link = Link::start(upstream)
                .await
                .map_err(|e| format!("link: {e}"))?;
            for i in 0..processes {
                let port = procs::free_port().map_err(|e| e.to_string())?;
                let listen = SocketAddr::from(([127, 0, 0, 1], port));
                let mut slot = Slot {
                    target: Target::Webhook(i),
                    name: format!("{label}-webhook{i}"),
                    binary: binaries.webhook.clone(),
                    env: webhook_env(&db, link.port, listen),
                    probe: listen,
                    ready_path: "/healthz",
                    service: None,
                };
                slot.start(history).await?;
                sut.webhooks.push(Mutex::new(slot));
            }
            sut.db = Some(db);
            sut.link = Some(link);
            sut.receiver = Some(receiver);
        }
        Ok(sut)
    }

    pub fn admins(&self) -> Vec<SocketAddr> {
        self.node_ports
            .iter()
            .map(|&(_, admin)| SocketAddr::from(([127, 0, 0, 1], admin)))
            .collect()
    }

    pub fn slot(&self, target: Target) -> Option<&Mutex<Slot>> {
        match target {
            Target::Node(i) => self.nodes.get(i),
            Target::Webhook(i) => self.webhooks.get(i),
            _ => None,
        }
    }

    /// Every process's RSS now, by target (a process being restarted reads as absent).
    pub async fn rss(&self) -> Vec<(Target, Option<u64>)> {
        let mut out = Vec::new();
        for slot in self.nodes.iter().chain(&self.webhooks) {
            let slot = slot.lock().await;
            out.push((slot.target, slot.pid().and_then(|p| sys::rss_bytes(p).ok())));
        }
        if let Some(redis) = &self.redis {
            let redis = redis.lock().await;
            out.push((
                Target::Redis,
                redis.pid().and_then(|p| sys::rss_bytes(p).ok()),
            ));
        }
        out
    }

    /// Stops every process and drops the database.
    pub async fn teardown(self) {
        for slot in self.nodes.iter().chain(&self.webhooks) {
            let mut slot = slot.lock().await;
            if let Some(service) = slot.service.as_mut() {
                let _ = sys::send_signal(service.pid, sys::Signal::CONT);
                service.kill9().await;
            }
        }
        if let Some(redis) = &self.redis {
            redis.lock().await.kill().await;
        }
        if let Some(db) = self.db {
            db.drop_database().await;
        }
    }
}
