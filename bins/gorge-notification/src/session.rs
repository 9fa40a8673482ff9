//! One browser socket after the upgrade: read commands in order, finish the writes the
//! fan-out could not complete, ping, reap, and close with the code the situation asks for.
//!
//! The fan-out writes a frame straight to the socket when the socket's queue is empty; this
//! task only takes over what did not fit, waiting for the socket to become writable. The
//! writer is level-triggered: it writes until the queue is empty or the socket is full, and
//! only then waits (for more frames, writability, a command, a close request, or the timer),
//! so a queued frame is always written and a close request is never swallowed by a write.
//! Everything the socket makes the server hold (frames, pongs, our pings) is in one bounded
//! queue; over the bound the socket is closed with 1008 and counted.
//!
//! On a TLS port the same socket is written through rustls: frames are encrypted as they are
//! written, and what the kernel did not take yet is finished like a queued frame.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gorge_hub::{CloseReason, Flush, Hub, Push, SendQueue, Sink, SocketHandle};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use phorge_wire::aphlict::{self, ClientCommand};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;

use crate::budget::{Budget, Over};
use crate::events;
use crate::frames::{self, Inbound, Violation};
use crate::state::ServerState;
use gorge_service::http10::Http10AsHttp11;
use gorge_service::{emit, ConnectionSlot};

/// How long a closing socket may take to take its last frames and answer our close (a
/// socket the drain closes may take what is left of the drain, if that is longer).
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// The kernel's send buffer per socket (Linux doubles it). Left to autotuning it grows to
/// megabytes: a backlog there is outside the queue's bound, and a ping behind it could not
/// be answered within the idle timeout by a slow but live client.
const SEND_BUFFER_BYTES: usize = 128 * 1024;

/// Bytes read from the socket at a time (on the stack; an idle socket keeps no buffer).
const READ_CHUNK: usize = 4096;

/// A socket's place in the hub, released (and counted) when the session ends however it ends.
pub struct Registration {
    state: Arc<ServerState>,
    handle: SocketHandle,
    class: &'static str,
    /// The connection's place under the client port's descriptor cap, freed with the socket.
    _slot: Option<ConnectionSlot>,
}

impl Registration {
    pub fn new(
        state: Arc<ServerState>,
        handle: SocketHandle,
        class: &'static str,
        slot: Option<ConnectionSlot>,
    ) -> Self {
        Registration {
            state,
            handle,
            class,
            _slot: slot,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.handle.send_queue().detach();
        self.state.hub.disconnect(&self.handle);
        self.state.metrics.sockets_open.with([self.class]).dec();
        self.state.session_ended.notify_waiters();
    }
}

/// The socket, shared by this task (reads, waits) and the fan-out (non-blocking writes):
/// plain TCP, or TLS over TCP (a TLS port).
enum Stream {
    Plain(TcpStream),
    /// Boxed: a plaintext socket's `Stream` stays the size of its `TcpStream`.
    Tls(Box<TlsSocket>),
}

/// A TLS socket after its handshake. The rustls state is behind a per-socket lock because
/// the fan-out and this task both write; it is held only around non-blocking socket calls
/// and never across an await. Records encrypted but not yet taken by the kernel stay in
/// rustls: new frames wait behind them (the write answers `WouldBlock`), and `leftover`
/// wakes this task to finish them when the fan-out's write left some.
struct TlsSocket {
    tcp: TcpStream,
    conn: std::sync::Mutex<rustls::ServerConnection>,
    leftover: Notify,
}

/// `std::io` over a non-blocking tokio socket, for rustls's `read_tls` / `write_tls`.
struct Nonblocking<'a>(&'a TcpStream);

impl io::Read for Nonblocking<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl io::Write for Nonblocking<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl TlsSocket {
    fn lock(&self) -> std::sync::MutexGuard<'_, rustls::ServerConnection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the records already encrypted; `Err(WouldBlock)` while some are left.
    fn flush_records(&self, conn: &mut rustls::ServerConnection) -> io::Result<()> {
        while conn.wants_write() {
            if conn.write_tls(&mut Nonblocking(&self.tcp))? == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(tcp) => tcp,
            Stream::Tls(tls) => &tls.tcp,
        }
    }

    /// Writes what TLS holds encrypted; `Ok(true)` while some is left (wait until writable).
    fn flush_pending(&self) -> io::Result<bool> {
        match self {
            Stream::Plain(_) => Ok(false),
            Stream::Tls(tls) => match tls.flush_records(&mut tls.lock()) {
                Ok(()) => Ok(false),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
                Err(e) => Err(e),
            },
        }
    }

    /// Completes when the fan-out left encrypted records unwritten (never for plain TCP).
    async fn leftover(&self) {
        match self {
            Stream::Plain(_) => std::future::pending().await,
            Stream::Tls(tls) => tls.leftover.notified().await,
        }
    }
}

impl Sink for Stream {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            // sendmsg rather than tokio's writev: a socket call skips the file layer (its
            // position lock and checks), a measurable share of the fan-out's CPU per frame.
            Stream::Plain(tcp) => tcp.try_io(Interest::WRITABLE, || {
                socket2::SockRef::from(tcp).send_vectored(bufs)
            }),
            Stream::Tls(tls) => {
                let mut conn = tls.lock();
                // New frames go behind the records already encrypted, never beside them.
                tls.flush_records(&mut conn)?;
                let taken = io::Write::write_vectored(&mut conn.writer(), bufs)?;
                if taken == 0 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                match tls.flush_records(&mut conn) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => tls.leftover.notify_one(),
                    Err(e) => return Err(e),
                }
                Ok(taken)
            }
        }
    }
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// The connection failed or the client went away without a close frame.
    Gone,
    /// The client sent a close frame (payload kept to echo its code).
    ClientClosed(Bytes),
    /// The hub asked for a close (slow consumer or drain).
    Hub(CloseReason),
    /// The client broke the protocol or a limit.
    Violation(Violation),
    /// The client sent more than its inbound budget.
    Inbound(Over),
    /// No inbound traffic (not even a pong) within the idle timeout.
    Idle,
}

impl End {
    fn label(&self) -> &'static str {
        match self {
            End::Gone | End::ClientClosed(_) => "client",
            End::Hub(CloseReason::SlowConsumer) => "slow_consumer",
            End::Hub(CloseReason::GoingAway) => "drain",
            End::Hub(CloseReason::TooManySubscriptions) => "subscriptions",
            End::Violation(Violation::TooLarge) => "oversized_frame",
            End::Violation(Violation::Protocol) => "protocol_error",
            End::Violation(Violation::InvalidUtf8) => "invalid_utf8",
            End::Inbound(Over::Frames) => "inbound_frames",
            End::Inbound(Over::Bytes) => "inbound_bytes",
            End::Idle => "idle",
        }
    }

    fn close_frame(&self) -> Option<Bytes> {
        Some(match self {
            End::Gone => return None,
            // RFC 6455 §5.5.1: echo the status code.
            End::ClientClosed(payload) if payload.len() >= 2 => {
                frames::close(u16::from_be_bytes([payload[0], payload[1]]), "")
            }
            End::ClientClosed(_) => frames::close_empty(),
            End::Hub(CloseReason::SlowConsumer) => frames::close(1008, "slow consumer"),
            End::Hub(CloseReason::GoingAway) => frames::close(1001, "server going away"),
            End::Hub(CloseReason::TooManySubscriptions) => {
                frames::close(1008, "too many subscriptions")
            }
            End::Violation(v) => frames::close(
                v.code(),
                match v {
                    Violation::TooLarge => "frame too large",
                    Violation::Protocol => "protocol error",
                    Violation::InvalidUtf8 => "invalid UTF-8",
                },
            ),
            End::Inbound(Over::Frames) => frames::close(1008, "too many frames"),
            End::Inbound(Over::Bytes) => frames::close(1008, "too many bytes"),
            End::Idle => frames::close(1001, "idle timeout"),
        })
    }

    /// Whether we started the closing handshake (and so wait for the client's reply).
    fn ours(&self) -> bool {
        !matches!(self, End::Gone | End::ClientClosed(_))
    }
}

/// Runs the session until the socket closes; the registration is released on return.
pub async fn run(registration: Registration, upgraded: Upgraded) {
    let state = registration.state.clone();
    let (stream, read_buf) = match upgraded.downcast::<TokioIo<Http10AsHttp11<TcpStream>>>() {
        Ok(parts) => (
            Stream::Plain(parts.io.into_inner().into_inner()),
            parts.read_buf,
        ),
        Err(upgraded) => match upgraded.downcast::<TokioIo<Http10AsHttp11<TlsStream<TcpStream>>>>()
        {
            Ok(parts) => {
                let (tcp, conn) = parts.io.into_inner().into_inner().into_inner();
                let tls = TlsSocket {
                    tcp,
                    conn: std::sync::Mutex::new(conn),
                    leftover: Notify::new(),
                };
                (Stream::Tls(Box::new(tls)), parts.read_buf)
            }
            Err(_) => {
                emit!(state.log, events::NOTIFY_UPGRADE_UNSUPPORTED; "reason" => "not a TCP or TLS stream");
                return;
            }
        },
    };
    let _ = socket2::SockRef::from(stream.tcp()).set_send_buffer_size(SEND_BUFFER_BYTES);
    let stream = Arc::new(stream);
    let send_queue = registration.handle.send_queue().clone();
    send_queue.attach(stream.clone());
    let mut reader = frames::Reader::new(read_buf, state.limits.max_frame_bytes);
    if let Stream::Tls(tls) = &*stream {
        // Frames sent right behind the upgrade request may wait inside rustls, where no
        // readiness of the socket would announce them.
        let taken = take_plaintext(tls, &mut tls.lock(), &mut reader);
        if !matches!(taken, Ok(Plaintext::Taken)) {
            state.metrics.sockets_closed.with(["client"]).inc();
            return;
        }
    }
    let end = serve(&state, &registration.handle, &stream, &mut reader).await;
    // Counted when the decision is made, not after the close handshake below.
    state.metrics.sockets_closed.with([end.label()]).inc();
    match &end {
        End::Hub(CloseReason::SlowConsumer) => {
            emit!(state.log, events::NOTIFY_SLOW_CONSUMER; "instance" => registration.handle.instance());
        }
        End::Violation(Violation::TooLarge) => {
            state.metrics.oversized_frames.inc();
        }
        _ => {}
    }
    emit!(state.log, events::NOTIFY_CLIENT_DISCONNECTED;
        "instance" => registration.handle.instance(), "reason" => end.label());
    if let Some(frame) = end.close_frame() {
        // Bounded: a client that reads nothing never takes its close frame. A socket the
        // drain closes may use what is left of the drain for its backlog (the drain waits
        // that long anyway), so a slow reader still gets every queued frame, then the 1001.
        let linger = match (&end, state.drain_ends.get()) {
            (End::Hub(CloseReason::GoingAway), Some(ends)) => ends
                .saturating_duration_since(Instant::now())
                .max(CLOSE_LINGER),
            _ => CLOSE_LINGER,
        };
        let _ = tokio::time::timeout(
            linger,
            finish(&stream, &send_queue, &mut reader, frame, end.ours()),
        )
        .await;
    }
    // Dropping the registration detaches the queue and leaves the hub.
}

/// Writes what is queued (a drain keeps queued frames) and then the close frame; if we
/// started the close, waits for the client's reply so closing does not reset unread data.
async fn finish(
    stream: &Stream,
    send_queue: &SendQueue,
    reader: &mut frames::Reader,
    frame: Bytes,
    ours: bool,
) {
    send_queue.push_final(frame);
    loop {
        match send_queue.flush() {
            Flush::Empty => break,
            Flush::More => {}
            Flush::WouldBlock => {
                if stream.tcp().writable().await.is_err() {
                    return;
                }
            }
            Flush::Busy => send_queue.ready().await,
            Flush::Detached | Flush::Failed => return,
        }
    }
    // What TLS still holds encrypted, the close frame included.
    loop {
        match stream.flush_pending() {
            Ok(false) => break,
            Ok(true) => {
                if stream.tcp().writable().await.is_err() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
    if !ours {
        return;
    }
    loop {
        if stream.tcp().readable().await.is_err() {
            return;
        }
        match read_some(stream, reader) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
        loop {
            match reader.next_frame() {
                Ok(Some(Inbound::Close(_))) | Err(_) => return,
                Ok(Some(_)) => {}
                Ok(None) => break,
            }
        }
        // A client that floods while we close must not keep the worker either.
        tokio::task::consume_budget().await;
    }
}

/// Reads what the socket has into the reader (through TLS on a TLS port); `Ok(0)` is the
/// end of the stream. Returns the bytes read from the socket.
fn read_some(stream: &Stream, reader: &mut frames::Reader) -> io::Result<usize> {
    let mut chunk = [0u8; READ_CHUNK];
    let tls = match stream {
        Stream::Plain(tcp) => {
            let n = tcp.try_read(&mut chunk)?;
            reader.extend(&chunk[..n]);
            return Ok(n);
        }
        Stream::Tls(tls) => tls,
    };
    let mut conn = tls.lock();
    let n = conn.read_tls(&mut Nonblocking(&tls.tcp))?;
    if n == 0 {
        return Ok(0);
    }
    match take_plaintext(tls, &mut conn, reader)? {
        Plaintext::Ended => Ok(0),
        Plaintext::Taken => Ok(n),
    }
}

/// What [`take_plaintext`] found.
enum Plaintext {
    /// Every record received so far is decrypted into the reader.
    Taken,
    /// The client sent close_notify.
    Ended,
}

/// Processes the TLS records rustls holds and moves their plaintext into `reader`: after a
/// read from the socket, and once at the start of a session for what arrived with the upgrade
/// request (hyper may have left some of it inside rustls).
fn take_plaintext(
    tls: &TlsSocket,
    conn: &mut rustls::ServerConnection,
    reader: &mut frames::Reader,
) -> io::Result<Plaintext> {
    let processed = conn.process_new_packets();
    // An alert or a handshake answer rustls wrote goes out now when it can; what is left is
    // finished by the session's writer.
    match tls.flush_records(conn) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => tls.leftover.notify_one(),
        _ => {}
    }
    processed.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut chunk = [0u8; READ_CHUNK];
    loop {
        match io::Read::read(&mut conn.reader(), &mut chunk) {
            // close_notify: the client ended the stream.
            Ok(0) => return Ok(Plaintext::Ended),
            Ok(m) => reader.extend(&chunk[..m]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Plaintext::Taken),
            Err(e) => return Err(e),
        }
    }
}

/// What one round of writing found.
struct Written {
    /// The socket is full: wait until it is writable.
    blocked: bool,
    /// The client took bytes (a dead peer stops acknowledging, and its buffers fill).
    progress: bool,
}

/// Writes until the queue is empty or the socket is full.
fn write_some(send_queue: &SendQueue) -> Result<Written, ()> {
    let mut progress = false;
    loop {
        let blocked = match send_queue.flush() {
            Flush::Empty | Flush::Busy | Flush::Detached => false,
            Flush::More => {
                progress = true;
                continue;
            }
            Flush::WouldBlock => true,
            Flush::Failed => return Err(()),
        };
        return Ok(Written { blocked, progress });
    }
}

async fn serve(
    state: &ServerState,
    handle: &SocketHandle,
    stream: &Stream,
    reader: &mut frames::Reader,
) -> End {
    let send_queue = handle.send_queue();
    let limits = &state.limits;
    let mut budget = Budget::new(limits.inbound, Instant::now());
    let mut last_heard = Instant::now();
    let mut next_ping = last_heard + limits.ping_interval;
    // Whether the socket's buffers were full (and the queue not empty) since it last took
    // everything.
    let mut backlogged = false;
    let timer = tokio::time::sleep_until(next_ping);
    tokio::pin!(timer);
    loop {
        if let Some(reason) = send_queue.close_reason() {
            return End::Hub(reason);
        }
        let Ok(Written { blocked, progress }) = write_some(send_queue) else {
            return End::Gone;
        };
        // On a TLS port, encrypted records the kernel did not take yet wait for writability
        // like queued frames.
        let blocked = match stream.flush_pending() {
            Ok(pending) => blocked || pending,
            Err(_) => return End::Gone,
        };
        if progress && backlogged {
            // A backlogged client that still takes bytes is alive, even when the backlog in
            // the kernel's buffers delays its answer to our ping past the idle timeout. (A
            // socket with no backlog is judged by its answers alone: its kernel may ack for
            // an application that is gone.)
            last_heard = Instant::now();
        }
        backlogged = blocked || (backlogged && progress);
        tokio::select! {
            // Writes happen at the top of every turn whichever branch woke it; the order
            // only makes sure a socket that is always writable still gets its reads (the
            // client's pongs) and its timer.
            biased;
            () = send_queue.closing() => {}
            () = &mut timer => {
                let now = Instant::now();
                if now >= last_heard + limits.idle_timeout {
                    return End::Idle;
                }
                if now >= next_ping {
                    urgent(state, send_queue, frames::PING.clone());
                    next_ping = now + limits.ping_interval;
                }
            }
            // One readiness wait for both directions, writability only while blocked:
            // a second wait would be part of every idle socket's task (152 B each).
            ready = stream.tcp().ready(if blocked {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            }) => {
                let Ok(ready) = ready else {
                    return End::Gone;
                };
                // Writable alone: the top of the loop writes.
                if ready.is_readable() {
                    let read = match read_some(stream, reader) {
                        Ok(0) => return End::Gone,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(_) => return End::Gone,
                    };
                    if let Err(over) = budget.charge(0, read as u64, Instant::now()) {
                        return End::Inbound(over);
                    }
                    loop {
                        let next = reader.next_frame();
                        // Charged before the frame is acted on: over the budget, it is not.
                        let now = Instant::now();
                        if let Err(over) = budget.charge(reader.take_frames(), 0, now) {
                            return End::Inbound(over);
                        }
                        match next {
                            Ok(None) => break,
                            Ok(Some(inbound)) => {
                                last_heard = now;
                                if let Some(end) = inbound_frame(state, handle, inbound).await {
                                    return end;
                                }
                            }
                            Err(violation) => return End::Violation(violation),
                        }
                        // Bounded work per wake-up: readiness alone never makes this task give
                        // its worker back while bytes keep arriving, and the other sockets (and,
                        // on one worker, the client port's accepts) would wait for it.
                        tokio::task::consume_budget().await;
                    }
                    tokio::task::consume_budget().await;
                }
            }
            () = send_queue.ready(), if !blocked => {}
            () = stream.leftover(), if !blocked => {}
        }
        timer
            .as_mut()
            .reset(next_ping.min(last_heard + limits.idle_timeout));
    }
}

/// Handles one client frame; returns how the session ends, if it does.
async fn inbound_frame(
    state: &ServerState,
    handle: &SocketHandle,
    inbound: Inbound,
) -> Option<End> {
    match inbound {
        Inbound::Text(text) => {
            // Messages whose POST was answered before this command was read are delivered
            // (or not) as if publishing were synchronous: before a `pong`, into the history a
            // `replay` reads, and not to a socket that subscribes only now.
            let command = aphlict::parse_client_command(&text);
            if matches!(command, ClientCommand::Replay { .. }) {
                // A replay answered before history is warm would miss what the browser came
                // back for; the gate opens within the warm-up's deadline, or once the broker's
                // history is handed to the fan-out. First, so that the settling below covers
                // those messages too. Other commands go ahead: what a socket subscribed
                // meanwhile gets live, its replay leaves out (the hub's `live_from`).
                state.history_gate.opened().await;
            }
            let hub = state.fanout.settled().await;
            if apply(state, hub, handle, command) {
                // Behind everything queued so far: a pong proves those frames went first.
                control(state, handle.send_queue(), frames::APHLICT_PONG.clone());
            }
        }
        Inbound::Ping(payload) => urgent(state, handle.send_queue(), frames::pong(&payload)),
        Inbound::Close(payload) => return Some(End::ClientClosed(payload)),
        // Pongs only prove liveness; binary frames mean nothing to Aphlict.
        Inbound::Pong | Inbound::Binary => {}
    }
    None
}

/// Queues a frame of our own behind everything queued; over the queue's bound the socket
/// becomes a slow consumer.
fn control(state: &ServerState, send_queue: &SendQueue, frame: Bytes) {
    counted(state, send_queue.push_control(frame, state.hub.caps()));
}

/// Queues a control frame ahead of the backlog (a ping must be answerable however much
/// is queued), within the same bound.
fn urgent(state: &ServerState, send_queue: &SendQueue, frame: Bytes) {
    counted(state, send_queue.push_urgent(frame, state.hub.caps()));
}

fn counted(state: &ServerState, push: Push) {
    if let Push::Overflowed { dropped } = push {
        state.metrics.slow_consumer_disconnects.inc();
        state.metrics.queue_dropped_frames.inc_by(dropped as u64);
    }
}

/// Applies one client command; returns whether it was a `ping` that needs a `pong`.
/// `hub` comes from [`crate::fanout::Fanout::settled`].
fn apply(state: &ServerState, hub: &Hub, handle: &SocketHandle, command: ClientCommand) -> bool {
    let m = &state.metrics;
    match command {
        ClientCommand::Subscribe(phids) => {
            let outcome = hub.subscribe(handle, phids);
            m.subscriptions_ignored.inc_by(outcome.ignored as u64);
            m.subscriptions_over_limit.inc_by(outcome.over_total as u64);
            m.subscription_evictions
                .inc_by(outcome.evicted as u64 + u64::from(outcome.closed));
        }
        ClientCommand::Unsubscribe(phids) => hub.unsubscribe(handle, &phids),
        ClientCommand::Replay { age_ms } => {
            let outcome = hub.replay(handle, age_ms);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every plain socket holds one `Stream` (in the `Arc` the fan-out shares): it must
    /// stay the size of a TCP socket and a tag, whatever the TLS variant needs.
    #[test]
    fn a_plain_socket_pays_nothing_for_tls() {
        let size = std::mem::size_of::<Stream>();
        assert!(
            size <= std::mem::size_of::<TcpStream>() + 8,
            "Stream is {size} bytes"
        );
    }

    /// The size of a function's future, from its type alone.
    fn future_size<A, B, F>(_: fn(A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A session's future is the bulk of what an idle socket costs (the task holds it
    /// whole, sized for its largest wait): every wait `serve` adds, even one that a plain
    /// socket never uses, is paid by each of them. Its size for this build profile is
    /// printed, and bounded.
    #[test]
    fn an_idle_sockets_task_stays_small() {
        let size = future_size::<Registration, Upgraded, _>(run);
        eprintln!("session future: {size} B");
        assert!(
            size <= SESSION_FUTURE_BOUND,
            "session future is {size} bytes"
        );
    }

    /// 1 144 B in a release build, 1 152 B in a debug one; 1 304 B and 1 312 B with a
    /// readiness wait per direction.
    const SESSION_FUTURE_BOUND: usize = 1_200;
}
