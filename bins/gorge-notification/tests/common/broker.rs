//! What the broker-mode tests share: nodes in broker mode on a `redis-server` of the test
//! (`common::redis`), the messages they post and read, and a TCP proxy in front of Redis that
//! can wedge the reader's connections.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use gorge_testkit::{eventually, http};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{Server, Ws, PATIENCE};

pub const INSTANCE: &str = "broker";
pub const PHID: &str = "PHID-USER-broker";

pub const BROKER_URL: &str = "GORGE_NOTIFICATION_BROKER_URL";
pub const BROKER_CA: &str = "GORGE_NOTIFICATION_BROKER_CA_FILE";

/// A node in broker mode, once `/readyz` answers 200 (its history is loaded).
pub async fn node(url: &str) -> Server {
    let server = Server::start(&[(BROKER_URL, url)]);
    ready(&server).await;
    server
}

/// A node restarted on the ports of one that is gone.
pub async fn node_on(client_port: u16, admin_port: u16, url: &str) -> Server {
    let server = Server::start_on(client_port, admin_port, &[(BROKER_URL, url)])
        .expect("restarted on its ports");
    ready(&server).await;
    server
}

pub async fn readyz(server: &Server) -> u16 {
    http::request(server.admin_port, "GET", "/readyz", &[], b"")
        .await
        .status
}

pub async fn ready(server: &Server) {
    eventually(PATIENCE, "/readyz answers 200", || async {
        readyz(server).await == 200
    })
    .await;
}

pub fn message(key: &str) -> String {
    serde_json::json!({"key": key, "type": "notification", "subscribers": [PHID]}).to_string()
}

pub async fn post(server: &Server, key: &str) {
    server
        .post_ok(&format!("?instance={INSTANCE}"), &message(key))
        .await;
}

pub async fn subscribed(server: &Server) -> Ws {
    let mut ws = server.ws(&format!("/~{INSTANCE}/")).await;
    ws.subscribe(&[PHID]).await;
    ws
}

/// The `key` of a delivered frame.
pub fn key_of(frame: &str) -> String {
    let value: Value = serde_json::from_str(frame).unwrap();
    value["key"].as_str().unwrap().to_string()
}

/// The next `n` frames' keys.
pub async fn keys(ws: &mut Ws, n: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for _ in 0..n {
        keys.push(key_of(&ws.next_text().await));
    }
    keys
}

pub async fn metric(server: &Server, name: &str) -> f64 {
    server.metric(name).await.unwrap_or(0.0)
}

/// A browser's first moves on a server: subscribe, then `replay` 60 s; what it got, in order.
pub async fn replayed(server: &Server) -> Vec<String> {
    let mut ws = subscribed(server).await;
    ws.send(r#"{"command":"replay","data":{"age":60000}}"#)
        .await;
    ws.sync().await.iter().map(|frame| key_of(frame)).collect()
}

/// A TCP proxy on a free loopback port in front of the Redis on `upstream`: each connection
/// it accepts is connected to Redis and both ends are handed to `serve`. Returns the port.
pub async fn tcp_proxy<F, Fut>(upstream: u16, mut serve: F) -> u16
where
    F: FnMut(TcpStream, TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                continue;
            };
            tokio::spawn(serve(client, server));
        }
    });
    port
}

/// The `redis://` URL of a [`tcp_proxy`].
pub fn proxy_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

/// A TCP proxy in front of Redis that can wedge the reader's connections: a connection that
/// has sent the reader's round (`EXISTS` of its keys, then its reads) when it is wedged (or
/// that sends one later) gets no reply or push again, while it stays open; everything else
/// (the publisher's connection, the reader's calls before its first round) passes. Or it
/// can deafen them: every reply still arrives, no push (the reader's doorbell) does.
pub struct WedgingProxy {
    pub port: u16,
    /// Connections numbered below this are wedged (if they are readers).
    wedge_below: Arc<AtomicU64>,
    /// Connections numbered below this get no pushes.
    deaf_below: Arc<AtomicU64>,
    /// Connections accepted so far.
    opened: Arc<AtomicU64>,
}

impl WedgingProxy {
    pub async fn start(upstream: u16) -> WedgingProxy {
        let wedge_below = Arc::new(AtomicU64::new(0));
        let deaf_below = Arc::new(AtomicU64::new(0));
        let (wedge, deaf) = (wedge_below.clone(), deaf_below.clone());
        let opened = Arc::new(AtomicU64::new(0));
        let counted = opened.clone();
        let port = tcp_proxy(upstream, move |client, server| {
            let id = counted.fetch_add(1, Ordering::SeqCst);
            forward(client, server, id, wedge.clone(), deaf.clone())
        })
        .await;
        WedgingProxy {
            port,
            wedge_below,
            deaf_below,
            opened,
        }
    }

    pub fn url(&self) -> String {
        proxy_url(self.port)
    }

    /// The connections open now get no pushes from now on (their replies still arrive):
    /// the reader's connection looks healthy and its wait never ends. Later ones work.
    pub fn deafen_open_readers(&self) {
        let opened = self.opened.load(Ordering::SeqCst);
        self.deaf_below.store(opened, Ordering::SeqCst);
    }

    /// Wedges every reader connection, those opened later too, until [`Self::release`].
    pub fn wedge_all_readers(&self) {
        self.wedge_below.store(u64::MAX, Ordering::SeqCst);
    }

    /// Connections opened from now on work again (wedged ones stay wedged).
    pub fn release(&self) {
        let opened = self.opened.load(Ordering::SeqCst);
        self.wedge_below.store(opened, Ordering::SeqCst);
    }
}

/// Node A behind a [`WedgingProxy`], node B straight on Redis, and a browser on A that has
/// received B's message "before": the reader of A has made progress before the test wedges
/// or deafens it.
pub struct ProxiedPair {
    pub proxy: WedgingProxy,
    pub a: Server,
    pub b: Server,
    pub on_a: Ws,
}

impl ProxiedPair {
    pub async fn start(redis_port: u16, redis_url: &str) -> ProxiedPair {
        let proxy = WedgingProxy::start(redis_port).await;
        let a = node(&proxy.url()).await;
        let b = node(redis_url).await;
        let mut on_a = subscribed(&a).await;
        post(&b, "before").await;
        assert_eq!(keys(&mut on_a, 1).await, ["before"]);
        ProxiedPair { proxy, a, b, on_a }
    }
}

async fn forward(
    client: TcpStream,
    server: TcpStream,
    id: u64,
    wedge_below: Arc<AtomicU64>,
    deaf_below: Arc<AtomicU64>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Whether the connection sent the reader's round (it waits for entries from then on).
    // Sticky: a round of several KiB can reach the proxy in more than one read.
    let in_round = Arc::new(AtomicBool::new(false));
    let sent_round = in_round.clone();
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = client_read.read(&mut buf).await {
            if buf[..n].windows(6).any(|w| w == b"EXISTS") {
                sent_round.store(true, Ordering::SeqCst);
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut wedged = false;
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n @ 1..) = server_read.read(&mut buf).await {
        wedged =
            wedged || (in_round.load(Ordering::SeqCst) && id < wedge_below.load(Ordering::SeqCst));
        // A push (RESP3 `>`) to an idle reader comes alone, at the start of a read.
        let push = buf[0] == b'>';
        if wedged || (push && id < deaf_below.load(Ordering::SeqCst)) {
            continue;
        }
        if client_write.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    upstream.abort();
}
