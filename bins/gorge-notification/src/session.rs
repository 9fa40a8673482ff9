//! One browser socket after the upgrade: read commands in order, write the socket's queued
//! frames, ping, reap, and close with the code the hub asked for.
//!
//! A single task does all of it, so a command's effects (a replay's frames, a `pong`) are
//! written in the order the commands arrived: a `pong` proves every earlier command of the
//! socket has taken effect. The hub only ever pushes into this socket's queue; every write
//! happens here, outside any lock.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use gorge_hub::{CloseReason, Outbound, SocketHandle};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use phorge_wire::aphlict::{self, ClientCommand};
use slog::{debug, info};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_tungstenite::WebSocketStream;

use crate::app::App;
use crate::metrics::{ClassLabel, ReasonLabel};

/// Read buffer per socket. Browsers send a handful of tiny commands; tungstenite's 128 KiB
/// default would cost more than everything else an idle socket holds.
const READ_BUFFER_BYTES: usize = 1024;

/// Outgoing frames are gathered up to this size before a write (one syscall per batch).
const WRITE_BUFFER_BYTES: usize = 4096;

/// How long we wait for the peer's close reply after sending a close frame.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

type Socket = WebSocketStream<TokioIo<Upgraded>>;

/// A socket's place in the hub, released (and counted) when the session ends however it ends.
pub struct Registration {
    app: Arc<App>,
    handle: SocketHandle,
    class: ClassLabel,
}

impl Registration {
    pub fn new(app: Arc<App>, handle: SocketHandle, class: ClassLabel) -> Self {
        Registration { app, handle, class }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.app.hub.disconnect(&self.handle);
        self.app
            .metrics
            .sockets_open
            .get_or_create(&self.class)
            .dec();
        self.app.session_ended.notify_waiters();
    }
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The client closed or the connection failed; nothing more to send.
    Gone,
    /// The hub asked for a close (slow consumer or drain).
    Hub(CloseReason),
    /// The client sent a frame over the limit.
    Oversized,
    /// No inbound traffic (not even a pong) within the idle timeout, or a write stalled that
    /// long.
    Idle,
}

impl End {
    fn label(self) -> &'static str {
        match self {
            End::Gone => "client",
            End::Hub(CloseReason::SlowConsumer) => "slow_consumer",
            End::Hub(CloseReason::GoingAway) => "drain",
            End::Oversized => "oversized_frame",
            End::Idle => "idle",
        }
    }

    fn close_frame(self) -> Option<CloseFrame> {
        let (code, reason) = match self {
            End::Gone => return None,
            End::Hub(CloseReason::SlowConsumer) => (1008, "slow consumer"),
            End::Hub(CloseReason::GoingAway) => (1001, "server going away"),
            End::Oversized => (1009, "frame too large"),
            End::Idle => (1001, "idle timeout"),
        };
        Some(CloseFrame {
            code: CloseCode::from(code),
            reason: reason.into(),
        })
    }
}

fn config(max_frame_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        .max_message_size(Some(max_frame_bytes))
        .max_frame_size(Some(max_frame_bytes))
}

/// Runs the session until the socket closes; the registration is released on return.
pub async fn run(registration: Registration, io: TokioIo<Upgraded>) {
    let app = registration.app.clone();
    let mut ws = WebSocketStream::from_raw_socket(
        io,
        Role::Server,
        Some(config(app.limits.max_frame_bytes)),
    )
    .await;
    let end = serve(&app, &registration.handle, &mut ws).await;
    // Counted when the decision is made, not after the close handshake below.
    app.metrics
        .sockets_closed
        .get_or_create(&ReasonLabel {
            reason: end.label(),
        })
        .inc();
    if end == End::Hub(CloseReason::SlowConsumer) {
        info!(app.log, "NOTIFY_SLOW_CONSUMER"; "instance" => registration.handle.instance());
    }
    debug!(app.log, "NOTIFY_CLIENT_DISCONNECTED";
        "instance" => registration.handle.instance(), "reason" => end.label());
    if let Some(frame) = end.close_frame() {
        // Bounded: a slow consumer may never read its close frame.
        let _ = tokio::time::timeout(CLOSE_LINGER, async {
            if ws.close(Some(frame)).await.is_ok() {
                // Wait for the peer's close reply so closing does not reset unread data.
                while let Some(Ok(_)) = ws.next().await {}
            }
        })
        .await;
    }
}

async fn serve(app: &App, handle: &SocketHandle, ws: &mut Socket) -> End {
    let outbound = handle.outbound().clone();
    let limits = &app.limits;
    let mut last_heard = Instant::now();
    let mut next_ping = last_heard + limits.ping_interval;
    let timer = tokio::time::sleep_until(next_ping);
    tokio::pin!(timer);
    loop {
        let batch = outbound.take();
        if !batch.frames.is_empty() {
            if let Err(end) = write(ws, batch.frames, None, &outbound, limits.idle_timeout).await {
                return end;
            }
        }
        if let Some(reason) = batch.close {
            return End::Hub(reason);
        }
        tokio::select! {
            _ = outbound.changed() => {}
            inbound = ws.next() => {
                let message = match inbound {
                    None => return End::Gone,
                    Some(Err(WsError::Capacity(CapacityError::MessageTooLong { .. }))) => {
                        app.metrics.oversized_frames.inc();
                        return End::Oversized;
                    }
                    Some(Err(_)) => return End::Gone,
                    Some(Ok(message)) => message,
                };
                last_heard = Instant::now();
                match message {
                    Message::Text(text) => {
                        let wants_pong = command(app, handle, &text);
                        if wants_pong {
                            // Everything queued so far goes out before the pong.
                            let batch = outbound.take();
                            let pong = Message::Text(Utf8Bytes::from_static(aphlict::PONG_TEXT));
                            let stall = limits.idle_timeout;
                            if let Err(end) = write(ws, batch.frames, Some(pong), &outbound, stall).await {
                                return end;
                            }
                            if let Some(reason) = batch.close {
                                return End::Hub(reason);
                            }
                        }
                    }
                    Message::Close(_) => {
                        // tungstenite queued the close reply; send it and stop.
                        let _ = tokio::time::timeout(CLOSE_LINGER, ws.flush()).await;
                        return End::Gone;
                    }
                    // Pongs and pings only prove liveness (tungstenite answers pings itself);
                    // binary frames mean nothing to Aphlict.
                    _ => {}
                }
            }
            _ = &mut timer => {
                let now = Instant::now();
                if now >= last_heard + limits.idle_timeout {
                    return End::Idle;
                }
                if now >= next_ping {
                    let ping = Some(Message::Ping(Bytes::new()));
                    let stall = limits.idle_timeout;
                    if let Err(end) = write(ws, VecDeque::new(), ping, &outbound, stall).await {
                        return end;
                    }
                    next_ping = now + limits.ping_interval;
                }
            }
        }
        timer
            .as_mut()
            .reset(next_ping.min(last_heard + limits.idle_timeout));
    }
}

/// Applies one client command; returns whether it was a `ping` that needs a `pong`.
fn command(app: &App, handle: &SocketHandle, text: &str) -> bool {
    let m = &app.metrics;
    match aphlict::parse_client_command(text) {
        ClientCommand::Subscribe(phids) => {
            let outcome = app.hub.subscribe(handle, phids);
            m.subscriptions_ignored.inc_by(outcome.ignored as u64);
            m.subscriptions_over_total.inc_by(outcome.over_total as u64);
        }
        ClientCommand::Unsubscribe(phids) => app.hub.unsubscribe(handle, &phids),
        ClientCommand::Replay { age_ms } => {
            let outcome = app.hub.replay(handle, age_ms);
            if outcome.refused {
                m.replays_refused.inc();
            }
            m.replayed_frames.inc_by(outcome.queued as u64);
            m.queue_dropped_frames.inc_by(outcome.dropped_frames as u64);
        }
        ClientCommand::Ping => return true,
        ClientCommand::Ignored => {
            m.commands_ignored.inc();
        }
    }
    false
}

/// Writes `frames` (then `tail`) and flushes. Gives up when the hub marks the socket a slow
/// consumer meanwhile, or when the write makes no progress for `stall` (a dead peer).
async fn write(
    ws: &mut Socket,
    frames: VecDeque<Bytes>,
    tail: Option<Message>,
    outbound: &Outbound,
    stall: Duration,
) -> Result<(), End> {
    let send_all = async {
        for frame in frames {
            // The hub only carries serde_json output, which is always UTF-8.
            if let Ok(text) = Utf8Bytes::try_from(frame) {
                ws.feed(Message::Text(text)).await?;
            }
        }
        if let Some(message) = tail {
            ws.feed(message).await?;
        }
        ws.flush().await
    };
    tokio::select! {
        result = send_all => result.map_err(|_| End::Gone),
        () = slow_consumer(outbound) => Err(End::Hub(CloseReason::SlowConsumer)),
        () = tokio::time::sleep(stall) => Err(End::Idle),
    }
}

/// Completes once the hub has marked this socket a slow consumer.
async fn slow_consumer(outbound: &Outbound) {
    loop {
        if outbound.close_reason() == Some(CloseReason::SlowConsumer) {
            return;
        }
        outbound.changed().await;
    }
}
