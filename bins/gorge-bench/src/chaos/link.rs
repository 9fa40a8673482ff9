//! The link between the webhook processes and MariaDB, which the run controls: a loopback
//! TCP proxy that can cut every connection (and close new ones at once) or delay every
//! chunk it forwards.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the link does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    Up,
    /// Every connection closed; new ones closed as soon as accepted.
    Cut,
    /// Every chunk held this long before it is forwarded.
    Delayed(Duration),
}

pub struct Link {
    pub port: u16,
    state: watch::Sender<LinkState>,
    accept: JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Link {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (state, watching) = watch::channel(LinkState::Up);
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if *watching.borrow() == LinkState::Cut {
                    drop(client);
                    continue;
                }
                tokio::spawn(forward(client, upstream, watching.clone()));
            }
        });
        Ok(Link {
            port,
            state,
            accept,
        })
    }

    pub fn set(&self, state: LinkState) {
        self.state.send_replace(state);
    }
}

async fn forward(client: TcpStream, upstream: SocketAddr, state: watch::Receiver<LinkState>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Either direction ending (or the cut) ends both: dropping the halves closes the sockets.
    tokio::select! {
        () = pump(client_read, server_write, state.clone()) => {}
        () = pump(server_read, client_write, state) => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<LinkState>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = state.wait_for(|s| *s == LinkState::Cut) => return,
        };
        let current = *state.borrow();
        match current {
            LinkState::Cut => return,
            LinkState::Delayed(by) => tokio::time::sleep(by).await,
            LinkState::Up => {}
        }
        if *state.borrow() == LinkState::Cut || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
