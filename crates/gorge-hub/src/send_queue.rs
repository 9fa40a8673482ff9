//! One socket's bounded send queue and the rule for who writes to the socket.
//!
//! Frames are shared, already-encoded `Bytes` (the same buffer for every recipient). Whoever
//! holds the socket's write turn writes from the front of the queue without blocking: the
//! fan-out when the queue is empty (the common case: one vectored write, no task wake-up),
//! otherwise the socket's own task, which waits for the socket to become writable. Pushing
//! never waits: a queue over its bound closes the socket instead of slowing the publisher. No
//! lock is held while writing; the write turn is a flag, not a lock.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Buf, Bytes};
use tokio::sync::Notify;

/// Why the hub wants a socket closed; the writer maps it to its protocol's close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The send queue overflowed: queued frames are dropped.
    SlowConsumer,
    /// The server is draining: send what is queued, then close.
    GoingAway,
    /// All sockets together hold the total subscription bytes and this one holds the most:
    /// closed (its subscriptions already released) so a newcomer is not refused.
    TooManySubscriptions,
}

/// Where a queue's frames go: a non-blocking socket.
pub trait Sink: Send + Sync {
    /// Writes as much as the socket takes now; `Err(WouldBlock)` when it takes nothing.
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
}

/// Result of pushing one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// Written to the socket at once, nothing queued.
    Written,
    /// Queued (possibly partly written); the socket's task finishes it.
    Queued,
    /// This push overflowed the queue; the socket is now closing as a slow consumer and
    /// `dropped` frames (including this one) were discarded.
    Overflowed {
        /// Frames discarded, this one included.
        dropped: usize,
    },
    /// The socket is already closing; the frame was not queued.
    Closing,
    /// A replay already queued this live frame; not queued twice.
    Replayed,
}

/// What one [`SendQueue::flush`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Nothing to write.
    Empty,
    /// Some bytes went out: call again.
    More,
    /// The socket takes nothing now: wait until it is writable, then call again.
    WouldBlock,
    /// Someone else holds the write turn; they signal [`SendQueue::ready`] when they are done
    /// and frames are left.
    Busy,
    /// No socket attached (not yet, or not any more).
    Detached,
    /// The socket failed.
    Failed,
}

/// Bounds of one queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueCaps {
    /// Frames the queue may hold.
    pub frames: usize,
    /// Bytes the queue may hold.
    pub bytes: usize,
}

/// Frames handed to one vectored write (a few large ones, or many pongs).
const WRITE_BATCH: usize = 16;

#[derive(Default)]
struct QueueState {
    frames: VecDeque<Bytes>,
    bytes: usize,
    /// The front frame is partly written: it must be finished before anything else, even a
    /// close frame, or the stream is corrupt.
    front_started: bool,
    close: Option<CloseReason>,
    /// Someone is writing to the socket right now (outside the lock).
    writing: bool,
    /// How many front frames that writer holds: they stay where they are until it is done.
    in_flight: usize,
    sink: Option<Arc<dyn Sink>>,
    /// The session ended: nothing is queued or written any more.
    detached: bool,
    /// The close frame is queued: it must be the last thing written.
    sealed: bool,
    /// Live frames numbered up to this went out through a replay already.
    replayed_through: u64,
}

impl QueueState {
    /// Whether new frames are refused (closing, closed, or the close frame is queued).
    fn refuses(&self) -> bool {
        self.close.is_some() || self.detached || self.sealed
    }

    /// Frames at the front that must stay first: a started one, and those being written.
    fn pinned(&self) -> usize {
        self.in_flight
            .max(usize::from(self.front_started))
            .min(self.frames.len())
    }

    /// Drops every queued frame except the pinned ones.
    fn drop_unstarted(&mut self) -> usize {
        let keep = self.pinned();
        let dropped = self.frames.len() - keep;
        self.frames.truncate(keep);
        if self.frames.is_empty() {
            self.frames = VecDeque::new();
        }
        self.bytes = self.frames.iter().map(Bytes::len).sum();
        dropped
    }

    /// Removes `written` bytes from the front; an emptied queue gives its capacity back, so
    /// a burst leaves nothing behind.
    fn consume(&mut self, written: usize) {
        self.consume_bytes(written);
        if self.frames.is_empty() && self.frames.capacity() > 0 {
            self.frames = VecDeque::new();
        }
    }

    fn consume_bytes(&mut self, mut written: usize) {
        self.bytes = self.bytes.saturating_sub(written);
        while written > 0 {
            let Some(front) = self.frames.front_mut() else {
                break;
            };
            if written >= front.len() {
                written -= front.len();
                self.frames.pop_front();
                self.front_started = false;
            } else {
                front.advance(written);
                self.front_started = true;
                written = 0;
            }
        }
    }
}

/// Most frames handed to one write by [`SendQueue::push_batch`]; the rest queue.
pub const MAX_BATCH: usize = 64;

/// Whether one more frame of `len` bytes would exceed `caps`.
fn over_caps(state: &QueueState, len: usize, caps: QueueCaps) -> bool {
    state.frames.len() + 1 > caps.frames || state.bytes + len > caps.bytes
}

/// Closes the socket as a slow consumer because a frame did not fit; the frame and every
/// unstarted queued one are dropped.
fn overflow_locked(state: &mut QueueState) -> Push {
    let dropped = state.drop_unstarted() + 1;
    state.close = Some(CloseReason::SlowConsumer);
    Push::Overflowed { dropped }
}

/// Queues `frame` at the back within `caps`; a refused queue takes nothing.
fn enqueue_locked(state: &mut QueueState, frame: Bytes, caps: QueueCaps) -> Push {
    if state.refuses() {
        return Push::Closing;
    }
    if over_caps(state, frame.len(), caps) {
        return overflow_locked(state);
    }
    state.bytes += frame.len();
    state.frames.push_back(frame);
    Push::Queued
}

/// Which of the socket task's signals a change to the queue calls for.
#[derive(Default)]
struct Signals {
    /// Frames are queued.
    ready: bool,
    /// A close was requested.
    closing: bool,
}

impl Signals {
    fn after(pushes: impl IntoIterator<Item = Push>) -> Signals {
        let mut signals = Signals::default();
        for push in pushes {
            match push {
                Push::Queued => signals.ready = true,
                Push::Overflowed { .. } => signals.closing = true,
                Push::Written | Push::Closing | Push::Replayed => {}
            }
        }
        signals
    }
}

/// A socket's send queue, shared between the hub (producer) and the socket's task.
#[derive(Default)]
pub struct SendQueue {
    state: Mutex<QueueState>,
    /// Frames are queued for the socket's task to write.
    ready: Notify,
    /// A close was requested (its own signal, so no write can swallow it).
    closing: Notify,
}

impl std::fmt::Debug for SendQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendQueue").finish_non_exhaustive()
    }
}

impl SendQueue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().expect("send queue lock poisoned")
    }

    /// Connects the queue to its socket; frames queued so far are the task's to write.
    pub fn attach(&self, sink: Arc<dyn Sink>) {
        let mut state = self.lock();
        if !state.detached {
            state.sink = Some(sink);
        }
    }

    /// Ends the queue: drops frames and the socket; later pushes are refused.
    pub fn detach(&self) {
        let mut state = self.lock();
        state.detached = true;
        state.sink = None;
        state.frames = VecDeque::new();
        state.bytes = 0;
    }

    /// Delivers a live frame numbered `seq`: written at once when the socket is idle and
    /// takes it whole, otherwise queued within `caps` (overflow marks a slow consumer).
    pub fn push(&self, frame: Bytes, seq: u64, caps: QueueCaps) -> Push {
        let mut result = Push::Closing;
        self.push_batch(&[(frame, seq)], caps, |_, push| result = push);
        result
    }

    /// Delivers live frames numbered in increasing order, as [`SendQueue::push`] of each in
    /// turn would, except that an idle socket gets them all in one vectored write: when messages
    /// arrive faster than one fan-out pass, frames share a system call instead of paying
    /// one each. `each(i, push)` reports what became of `frames[i]`.
    pub fn push_batch(
        &self,
        frames: &[(Bytes, u64)],
        caps: QueueCaps,
        mut each: impl FnMut(usize, Push),
    ) {
        let mut state = self.lock();
        // Sequence numbers increase, so the frames a replay covered are a prefix.
        let fresh = frames
            .iter()
            .position(|(_, seq)| *seq > state.replayed_through)
            .unwrap_or(frames.len());
        let refused = state.refuses();
        for i in 0..fresh {
            each(
                i,
                if refused {
                    Push::Closing
                } else {
                    Push::Replayed
                },
            );
        }
        let direct = state.frames.is_empty() && !state.writing;
        let sink = match (&state.sink, direct) {
            (Some(sink), true) if !refused && fresh < frames.len() => sink.clone(),
            _ => {
                let signals =
                    Signals::after(frames[fresh..].iter().enumerate().map(|(i, frame)| {
                        let push = enqueue_locked(&mut state, frame.0.clone(), caps);
                        each(fresh + i, push);
                        push
                    }));
                drop(state);
                self.signal(signals);
                return;
            }
        };
        state.writing = true;
        drop(state);
        let pending = &frames[fresh..];
        let mut slices = [IoSlice::new(&[]); MAX_BATCH];
        let count = pending.len().min(MAX_BATCH);
        for (slice, (frame, _)) in slices.iter_mut().zip(pending) {
            *slice = IoSlice::new(frame);
        }
        // A failed socket is its task's to notice (its read fails too).
        let mut written: usize = sink
            .try_write_vectored(&slices[..count])
            .unwrap_or_default();
        let mut state = self.lock();
        state.writing = false;
        let mut next = 0;
        while next < pending.len() && written >= pending[next].0.len() {
            written -= pending[next].0.len();
            each(fresh + next, Push::Written);
            next += 1;
        }
        let mut signals = Signals::default();
        // What did not fit goes ahead of anything pushed meanwhile: it was first. The first
        // frame left is queued whatever the bounds, as a single push would be; a started one
        // must be finished even on a slow consumer, or the stream is corrupt.
        let mut at = 0;
        for (i, (frame, _)) in pending.iter().enumerate().skip(next) {
            let first = i == next;
            let started = first && written > 0;
            let slow = state.close == Some(CloseReason::SlowConsumer);
            let push = if state.detached || (slow && !started) {
                // Marked slow while we wrote; these frames never started, so they can go.
                Push::Closing
            } else if !first && over_caps(&state, frame.len(), caps) {
                signals.closing = true;
                overflow_locked(&mut state)
            } else {
                let rest = if started {
                    frame.slice(written..)
                } else {
                    frame.clone()
                };
                state.front_started |= started;
                state.bytes += rest.len();
                state.frames.insert(at, rest);
                at += 1;
                signals.ready = true;
                Push::Queued
            };
            each(fresh + i, push);
        }
        signals.ready |= !state.frames.is_empty();
        drop(state);
        self.signal(signals);
    }

    fn enqueue(
        &self,
        mut state: MutexGuard<'_, QueueState>,
        frame: Bytes,
        caps: QueueCaps,
    ) -> Push {
        let push = enqueue_locked(&mut state, frame, caps);
        drop(state);
        self.signal(Signals::after([push]));
        push
    }

    fn signal(&self, signals: Signals) {
        if signals.closing {
            self.closing.notify_one();
        }
        if signals.ready {
            self.ready.notify_one();
        }
    }

    /// Queues a frame the socket itself produced (a pong, a ping). It counts against the
    /// same bounds as everything else: a client that pings and never reads overflows them.
    pub fn push_control(&self, frame: Bytes, caps: QueueCaps) -> Push {
        self.enqueue(self.lock(), frame, caps)
    }

    /// Queues a control frame (a ping, a pong to a client's ping) ahead of every frame not
    /// yet started, within the same bounds: a ping that waited behind a long backlog could
    /// not be answered in time, and a live but slow client would look dead.
    pub fn push_urgent(&self, frame: Bytes, caps: QueueCaps) -> Push {
        let mut state = self.lock();
        if state.refuses() {
            return Push::Closing;
        }
        if over_caps(&state, frame.len(), caps) {
            return self.enqueue(state, frame, caps);
        }
        let at = state.pinned();
        state.bytes += frame.len();
        state.frames.insert(at, frame);
        drop(state);
        self.ready.notify_one();
        Push::Queued
    }

    /// Queues the final (close) frame: ignores bounds and the close request; nothing is
    /// queued after it.
    pub fn push_final(&self, frame: Bytes) {
        let mut state = self.lock();
        if !state.detached && !state.sealed {
            state.sealed = true;
            state.bytes += frame.len();
            state.frames.push_back(frame);
        }
    }

    /// Queues a replayed frame only if it fits; never closes the socket. Used by replay,
    /// which a client asks for and which must not turn a healthy socket into a "slow
    /// consumer".
    pub(crate) fn push_if_room(&self, frame: Bytes, caps: QueueCaps) -> bool {
        let queued = {
            let mut state = self.lock();
            if !state.refuses() && !over_caps(&state, frame.len(), caps) {
                state.bytes += frame.len();
                state.frames.push_back(frame);
                true
            } else {
                false
            }
        };
        if queued {
            self.ready.notify_one();
        }
        queued
    }

    /// Records that a replay covered every live frame numbered up to `seq`, so those still
    /// on their way are not queued a second time.
    pub(crate) fn mark_replayed(&self, seq: u64) {
        let mut state = self.lock();
        state.replayed_through = state.replayed_through.max(seq);
    }

    /// Free room in frames, given `caps`.
    pub(crate) fn room(&self, caps: QueueCaps) -> usize {
        caps.frames.saturating_sub(self.lock().frames.len())
    }

    /// Asks the socket's task to close the socket. The first reason wins; returns whether
    /// this call set it. A slow consumer's queued frames are dropped; going away keeps them.
    pub fn close(&self, reason: CloseReason) -> bool {
        let set = {
            let mut state = self.lock();
            if state.close.is_some() {
                false
            } else {
                state.close = Some(reason);
                if reason == CloseReason::SlowConsumer {
                    state.drop_unstarted();
                }
                true
            }
        };
        if set {
            self.closing.notify_one();
        }
        set
    }

    /// Whether a close has been requested.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.lock().close
    }

    /// Bytes queued and not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Takes every queued frame (tests of the hub read queues with it).
    #[cfg(test)]
    pub(crate) fn take_frames(&self) -> Vec<Bytes> {
        let mut state = self.lock();
        state.bytes = 0;
        std::mem::take(&mut state.frames).into_iter().collect()
    }

    /// Writes from the front of the queue without blocking, if the write turn is free.
    pub fn flush(&self) -> Flush {
        let mut held: [Bytes; WRITE_BATCH] = Default::default();
        let (sink, count) = {
            let mut state = self.lock();
            if state.writing {
                return Flush::Busy;
            }
            if state.frames.is_empty() {
                return Flush::Empty;
            }
            let Some(sink) = state.sink.clone() else {
                return Flush::Detached;
            };
            state.writing = true;
            let mut count = 0;
            for (slot, frame) in held.iter_mut().zip(state.frames.iter()) {
                *slot = frame.clone();
                count += 1;
            }
            state.in_flight = count;
            (sink, count)
        };
        let slices: [IoSlice<'_>; WRITE_BATCH] = std::array::from_fn(|i| IoSlice::new(&held[i]));
        let result = sink.try_write_vectored(&slices[..count]);
        let mut state = self.lock();
        state.writing = false;
        state.in_flight = 0;
        match result {
            Ok(0) => Flush::Failed,
            Ok(written) => {
                state.consume(written);
                Flush::More
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Flush::WouldBlock,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Flush::More,
            Err(_) => Flush::Failed,
        }
    }

    /// Waits until frames were queued for the socket's task (level-triggered use: call
    /// [`SendQueue::flush`] until it answers `Empty`, `Busy` or `WouldBlock` before waiting).
    /// A signal sent before the wait is kept (`Notify` stores one permit).
    pub async fn ready(&self) {
        self.ready.notified().await;
    }

    /// Waits until a close was requested (check [`SendQueue::close_reason`] after).
    pub async fn closing(&self) {
        self.closing.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: QueueCaps = QueueCaps {
        frames: 3,
        bytes: 10,
    };

    /// A socket that takes at most `room` bytes, then blocks.
    #[derive(Default)]
    struct FakeSocket {
        room: Mutex<usize>,
        got: Mutex<Vec<u8>>,
        writes: Mutex<usize>,
    }

    impl Sink for FakeSocket {
        fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            let mut room = self.room.lock().unwrap();
            *self.writes.lock().unwrap() += 1;
            if *room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let mut written = 0;
            for buf in bufs {
                let n = buf.len().min(*room);
                self.got.lock().unwrap().extend_from_slice(&buf[..n]);
                *room -= n;
                written += n;
            }
            Ok(written)
        }
    }

    fn attached(room: usize) -> (SendQueue, Arc<FakeSocket>) {
        let q = SendQueue::default();
        let socket = Arc::new(FakeSocket::default());
        *socket.room.lock().unwrap() = room;
        q.attach(socket.clone());
        (q, socket)
    }

    fn take_all(q: &SendQueue) -> Vec<Bytes> {
        q.take_frames()
    }

    #[test]
    fn unattached_frames_queue_in_order() {
        let q = SendQueue::default();
        assert_eq!(q.push(Bytes::from_static(b"a"), 1, CAPS), Push::Queued);
        assert_eq!(q.push(Bytes::from_static(b"b"), 2, CAPS), Push::Queued);
        assert_eq!(q.flush(), Flush::Detached);
        assert_eq!(
            take_all(&q),
            [Bytes::from_static(b"a"), Bytes::from_static(b"b")]
        );
    }

    fn batch(q: &SendQueue, frames: &[(&'static str, u64)], caps: QueueCaps) -> Vec<Push> {
        let frames: Vec<(Bytes, u64)> = frames
            .iter()
            .map(|(body, seq)| (Bytes::from_static(body.as_bytes()), *seq))
            .collect();
        let mut pushes = vec![None; frames.len()];
        q.push_batch(&frames, caps, |i, push| pushes[i] = Some(push));
        pushes.into_iter().map(Option::unwrap).collect()
    }

    #[test]
    fn a_batch_goes_to_an_idle_socket_in_one_write() {
        let (q, socket) = attached(100);
        let pushes = batch(&q, &[("ab", 1), ("cd", 2), ("ef", 3)], CAPS);
        assert_eq!(pushes, [Push::Written; 3]);
        assert_eq!(*socket.got.lock().unwrap(), b"abcdef");
        assert_eq!(*socket.writes.lock().unwrap(), 1);
        assert_eq!(q.queued_bytes(), 0);
    }

    #[test]
    fn what_a_batch_cannot_write_queues_in_order_within_the_bounds() {
        let (q, socket) = attached(4);
        q.push_control(Bytes::from_static(b"P"), CAPS);
        assert_eq!(q.flush(), Flush::More);
        assert_eq!(*socket.got.lock().unwrap(), b"P");
        let pushes = batch(
            &q,
            &[
                ("ab", 1),
                ("cd", 2),
                ("ef", 3),
                ("gh", 4),
                ("ij", 5),
                ("kl", 6),
            ],
            CAPS,
        );
        // "ab" fits whole, "c" of "cd" goes out; the rest of "cd" and two more frames fill
        // the three-frame bound, and the next one makes the socket a slow consumer.
        assert_eq!(
            pushes,
            [
                Push::Written,
                Push::Queued,
                Push::Queued,
                Push::Queued,
                Push::Overflowed { dropped: 3 },
                Push::Closing
            ]
        );
        assert_eq!(*socket.got.lock().unwrap(), b"Pabc");
        assert_eq!(q.close_reason(), Some(CloseReason::SlowConsumer));
        // Only the started frame survives the overflow: it must be finished.
        assert_eq!(take_all(&q), [Bytes::from_static(b"d")]);
    }

    #[test]
    fn a_batch_skips_the_frames_a_replay_already_queued() {
        let (q, socket) = attached(100);
        q.mark_replayed(2);
        let pushes = batch(&q, &[("a", 1), ("b", 2), ("c", 3)], CAPS);
        assert_eq!(pushes, [Push::Replayed, Push::Replayed, Push::Written]);
        assert_eq!(*socket.got.lock().unwrap(), b"c");
    }

    #[test]
    fn a_batch_to_a_busy_socket_queues_behind_what_is_there() {
        let (q, socket) = attached(0);
        assert_eq!(q.push(Bytes::from_static(b"a"), 1, CAPS), Push::Queued);
        let pushes = batch(&q, &[("b", 2), ("c", 3)], CAPS);
        assert_eq!(pushes, [Push::Queued, Push::Queued]);
        assert_eq!(*socket.writes.lock().unwrap(), 1);
        assert_eq!(
            take_all(&q),
            [
                Bytes::from_static(b"a"),
                Bytes::from_static(b"b"),
                Bytes::from_static(b"c")
            ]
        );
    }

    #[test]
    fn an_idle_socket_is_written_directly() {
        let (q, socket) = attached(100);
        assert_eq!(q.push(Bytes::from_static(b"abc"), 1, CAPS), Push::Written);
        assert_eq!(q.queued_bytes(), 0);
        assert_eq!(&*socket.got.lock().unwrap(), b"abc");
    }

    #[test]
    fn a_short_write_queues_the_rest_first() {
        let (q, socket) = attached(2);
        assert_eq!(q.push(Bytes::from_static(b"abc"), 1, CAPS), Push::Queued);
        assert_eq!(q.push(Bytes::from_static(b"de"), 2, CAPS), Push::Queued);
        assert_eq!(q.flush(), Flush::WouldBlock);
        *socket.room.lock().unwrap() = 100;
        assert_eq!(q.flush(), Flush::More);
        assert_eq!(q.flush(), Flush::Empty);
        assert_eq!(&*socket.got.lock().unwrap(), b"abcde");
    }

    #[test]
    fn overflow_keeps_a_started_frame_and_closes_as_slow_consumer() {
        let (q, _socket) = attached(1);
        assert_eq!(q.push(Bytes::from_static(b"abc"), 1, CAPS), Push::Queued);
        assert_eq!(q.push(Bytes::from_static(b"de"), 2, CAPS), Push::Queued);
        assert_eq!(q.push(Bytes::from_static(b"fg"), 3, CAPS), Push::Queued);
        assert_eq!(
            q.push(Bytes::from_static(b"h"), 4, CAPS),
            Push::Overflowed { dropped: 3 }
        );
        assert_eq!(q.push(Bytes::from_static(b"x"), 5, CAPS), Push::Closing);
        assert_eq!(q.close_reason(), Some(CloseReason::SlowConsumer));
        // "bc" (the rest of the started frame) must still go out before a close frame.
        assert_eq!(take_all(&q), [Bytes::from_static(b"bc")]);
    }

    #[test]
    fn byte_cap_overflow_closes_as_slow_consumer() {
        let q = SendQueue::default();
        assert_eq!(q.push(Bytes::from_static(b"123456"), 1, CAPS), Push::Queued);
        assert_eq!(
            q.push(Bytes::from_static(b"12345"), 2, CAPS),
            Push::Overflowed { dropped: 2 }
        );
    }

    #[test]
    fn control_frames_count_against_the_bound() {
        let q = SendQueue::default();
        for _ in 0..3 {
            assert_eq!(q.push_control(Bytes::from_static(b"p"), CAPS), Push::Queued);
        }
        assert_eq!(
            q.push_control(Bytes::from_static(b"p"), CAPS),
            Push::Overflowed { dropped: 4 }
        );
        assert_eq!(q.close_reason(), Some(CloseReason::SlowConsumer));
    }

    #[test]
    fn urgent_frames_go_ahead_of_unstarted_ones_only() {
        let (q, socket) = attached(1);
        q.push(Bytes::from_static(b"ab"), 1, CAPS);
        q.push(Bytes::from_static(b"cd"), 2, CAPS);
        assert_eq!(q.push_urgent(Bytes::from_static(b"P"), CAPS), Push::Queued);
        *socket.room.lock().unwrap() = 100;
        assert_eq!(q.flush(), Flush::More);
        assert_eq!(q.flush(), Flush::Empty);
        assert_eq!(&*socket.got.lock().unwrap(), b"abPcd");
        let q = SendQueue::default();
        q.push(Bytes::from_static(b"ab"), 1, CAPS);
        q.push_urgent(Bytes::from_static(b"P"), CAPS);
        assert_eq!(
            take_all(&q),
            [Bytes::from_static(b"P"), Bytes::from_static(b"ab")]
        );
    }

    #[test]
    fn push_if_room_never_closes() {
        let q = SendQueue::default();
        for _ in 0..3 {
            assert!(q.push_if_room(Bytes::from_static(b"x"), CAPS));
        }
        assert_eq!(q.room(CAPS), 0);
        assert!(!q.push_if_room(Bytes::from_static(b"x"), CAPS));
        assert_eq!(q.close_reason(), None);
        assert_eq!(take_all(&q).len(), 3);
    }

    #[test]
    fn a_replayed_live_frame_is_not_queued_twice() {
        let q = SendQueue::default();
        q.mark_replayed(5);
        assert_eq!(q.push(Bytes::from_static(b"a"), 5, CAPS), Push::Replayed);
        assert_eq!(q.push(Bytes::from_static(b"b"), 6, CAPS), Push::Queued);
    }

    #[test]
    fn going_away_keeps_queued_frames_and_first_reason_wins() {
        let q = SendQueue::default();
        q.push(Bytes::from_static(b"a"), 1, CAPS);
        assert!(q.close(CloseReason::GoingAway));
        assert!(!q.close(CloseReason::SlowConsumer));
        assert_eq!(take_all(&q).len(), 1);
        assert_eq!(q.close_reason(), Some(CloseReason::GoingAway));
    }

    #[test]
    fn detached_queues_refuse_everything() {
        let (q, _socket) = attached(0);
        q.push(Bytes::from_static(b"a"), 1, CAPS);
        q.detach();
        assert_eq!(q.queued_bytes(), 0);
        assert_eq!(q.push(Bytes::from_static(b"b"), 2, CAPS), Push::Closing);
        assert_eq!(q.flush(), Flush::Empty);
    }

    /// Waits for `wait`; a lost signal fails the test instead of hanging it (the bound is
    /// reached only then).
    async fn within_bound(what: &str, wait: impl std::future::Future<Output = ()>) {
        tokio::time::timeout(std::time::Duration::from_secs(5), wait)
            .await
            .unwrap_or_else(|_| panic!("the {what} signal sent before the wait was lost"))
    }

    #[tokio::test]
    async fn signals_sent_before_waiting_are_not_lost() {
        let q = SendQueue::default();
        q.push(Bytes::from_static(b"a"), 1, CAPS);
        within_bound("ready", q.ready()).await;
        q.close(CloseReason::GoingAway);
        within_bound("closing", q.closing()).await;
    }
}
