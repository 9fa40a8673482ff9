//! Applying one planned fault to the running system and undoing it: signals and restarts
//! of a slot's process, Redis paused or killed and restarted empty, the database link cut
//! or slowed, the receiver flapping or hanging, hostile sockets held against a node.
//! Each fault holds its target's lock from start to end, so faults on one target follow
//! each other even when a restart takes longer than the schedule assumed.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::history::History;
use super::hooks::Trouble;
use super::link::LinkState;
use super::schedule::{Fault, Kind, Target};
use super::sut::Sut;
use crate::sys;

/// Longest a SIGTERMed process is given to exit before SIGKILL (a webhook process's
/// `stop_within_sec` with the run's settings is 12 + 2 × 5 + 5 = 27 s).
const TERM_GRACE: Duration = Duration::from_secs(30);

/// Applies `fault`, waits out its duration, undoes it. Returns a problem to report (a
/// process that did not come back ready), if any.
pub async fn apply(fault: &Fault, sut: &Sut, history: &History) -> Option<String> {
    let down = Duration::from_millis(fault.down_ms);
    let problem = match (fault.kind, fault.target) {
        (Kind::Kill | Kind::Stop | Kind::Term, target) => {
            let slot = sut.slot(target)?;
            let mut slot = slot.lock().await;
            history.fault_started(fault.id, fault.kind, target);
            let pid = slot.pid();
            match fault.kind {
                Kind::Stop => {
                    if let Some(pid) = pid {
                        let _ = sys::send_signal(pid, sys::Signal::STOP);
                        tokio::time::sleep(down).await;
                        let _ = sys::send_signal(pid, sys::Signal::CONT);
                    }
                    None
                }
                _ => {
                    if let Some(mut service) = slot.service.take() {
                        if fault.kind == Kind::Kill {
                            service.kill9().await;
                            tokio::time::sleep(down).await;
                        } else {
                            service.stop(TERM_GRACE).await;
                        }
                    }
                    slot.start(history)
                        .await
                        .err()
                        .map(|e| format!("fault #{}: restart of {target}: {e}", fault.id))
                }
            }
        }
        (Kind::RedisPause | Kind::RedisKill, _) => {
            let mut redis = sut.redis.as_ref()?.lock().await;
            history.fault_started(fault.id, fault.kind, Target::Redis);
            if fault.kind == Kind::RedisPause {
                if let Some(pid) = redis.pid() {
                    let _ = sys::send_signal(pid, sys::Signal::STOP);
                    tokio::time::sleep(down).await;
                    let _ = sys::send_signal(pid, sys::Signal::CONT);
                }
                None
            } else {
                redis.kill().await;
                tokio::time::sleep(down).await;
                redis
                    .restart()
                    .await
                    .err()
                    .map(|e| format!("fault #{}: {e}", fault.id))
            }
        }
        (Kind::DbCut | Kind::DbDelay, _) => {
            let link = sut.link.as_ref()?;
            history.fault_started(fault.id, fault.kind, Target::Database);
            link.set(match fault.kind {
                Kind::DbCut => LinkState::Cut,
                _ => LinkState::Delayed(Duration::from_millis(fault.amount)),
            });
            tokio::time::sleep(down).await;
            link.set(LinkState::Up);
            None
        }
        (Kind::ReceiverFlap | Kind::ReceiverHang, _) => {
            let receiver = sut.receiver.as_ref()?;
            history.fault_started(fault.id, fault.kind, Target::Receiver);
            receiver.set(match fault.kind {
                Kind::ReceiverFlap => Trouble::Flapping,
                _ => Trouble::Hanging,
            });
            tokio::time::sleep(down).await;
            receiver.set(Trouble::None);
            None
        }
        (Kind::HostileBurst, Target::Node(i)) => {
            let &(client, admin) = sut.node_ports.get(i)?;
            history.fault_started(fault.id, fault.kind, fault.target);
            let held = hostile_sockets(client, admin, fault.amount as usize).await;
            tokio::time::sleep(down).await;
            drop(held);
            None
        }
        (Kind::HostileBurst, _) => None,
    };
    history.fault_ended(fault.id);
    problem
}

/// Opens `n` sockets against a node and leaves them hanging: a third send half a
/// WebSocket handshake, a third half an admin request, a third nothing at all.
async fn hostile_sockets(client: u16, admin: u16, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for k in 0..n {
        let (port, opening): (u16, &[u8]) = match k % 3 {
            0 => (
                client,
                b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n",
            ),
            1 => (
                admin,
                b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"ke",
            ),
            _ => (client, b""),
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await
        else {
            continue;
        };
        let _ = stream.write_all(opening).await;
        held.push(stream);
    }
    held
}
