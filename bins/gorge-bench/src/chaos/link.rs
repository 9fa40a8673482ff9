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

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream) -> std::io::Result<()> {
        stream.write_all(b"ping").await?;
        let mut back = [0u8; 4];
        stream.read_exact(&mut back).await?;
        assert_eq!(&back, b"ping");
        Ok(())
    }

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_cut_closes_every_connection_and_refuses_new_ones_until_it_is_up() {
        let link = Link::start(echo().await).await.unwrap();
        let mut open = TcpStream::connect(("127.0.0.1", link.port)).await.unwrap();
        round_trip(&mut open).await.unwrap();
        link.set(LinkState::Cut);
        let mut rest = Vec::new();
        let read = tokio::time::timeout(LIMIT, open.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        let mut new = TcpStream::connect(("127.0.0.1", link.port)).await.unwrap();
        let answer = tokio::time::timeout(LIMIT, round_trip(&mut new)).await;
        assert!(matches!(answer, Ok(Err(_))), "{answer:?}");
        link.set(LinkState::Up);
        let mut again = TcpStream::connect(("127.0.0.1", link.port)).await.unwrap();
        tokio::time::timeout(LIMIT, round_trip(&mut again))
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_delay_holds_each_chunk() {
        let link = Link::start(echo().await).await.unwrap();
        let mut stream = TcpStream::connect(("127.0.0.1", link.port)).await.unwrap();
        let started = std::time::Instant::now();
        round_trip(&mut stream).await.unwrap();
        let quick = started.elapsed();
        link.set(LinkState::Delayed(Duration::from_millis(300)));
        let started = std::time::Instant::now();
        round_trip(&mut stream).await.unwrap();
        // Both directions were held: at least twice the delay.
        let slow = started.elapsed();
        assert!(slow >= Duration::from_millis(600), "{slow:?}");
        assert!(slow > quick * 2, "{quick:?} then {slow:?}");
    }
}
