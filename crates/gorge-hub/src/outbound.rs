//! One socket's bounded outbound queue: the hub pushes shared frames, the socket's writer
//! takes them in batches.
//!
//! A plain mutex around a `VecDeque` plus a `Notify` keeps an idle socket's cost to a few dozen
//! bytes (no channel buffers are preallocated), and pushing never waits: a full queue closes the
//! socket instead of slowing the publisher.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::Notify;

/// Why the hub wants a socket closed; the writer maps it to its protocol's close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The outbound queue overflowed: queued frames are dropped.
    SlowConsumer,
    /// The server is draining: send what is queued, then close.
    GoingAway,
}

/// What the writer should do next: write `frames` in order, then close if `close` is set.
#[derive(Debug, Default)]
pub struct Batch {
    pub frames: VecDeque<Bytes>,
    pub close: Option<CloseReason>,
}

/// Result of pushing one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    Queued,
    /// This push overflowed the queue; the socket is now closing as a slow consumer and
    /// `dropped` frames (including this one) were discarded.
    Overflowed {
        dropped: usize,
    },
    /// The socket is already closing; the frame was not queued.
    Closing,
}

#[derive(Debug, Default)]
struct QueueState {
    frames: VecDeque<Bytes>,
    bytes: usize,
    close: Option<CloseReason>,
}

/// Bounds of one queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueCaps {
    pub frames: usize,
    pub bytes: usize,
}

/// A socket's outbound queue, shared between the hub (producer) and the writer (consumer).
#[derive(Debug, Default)]
pub struct Outbound {
    state: Mutex<QueueState>,
    notify: Notify,
}

impl Outbound {
    /// Queues `frame` unless that would exceed `caps`; overflow marks the socket as a slow
    /// consumer.
    pub(crate) fn push(&self, frame: Bytes, caps: QueueCaps) -> Push {
        let outcome = {
            let mut state = self.state.lock().expect("outbound lock poisoned");
            if state.close.is_some() {
                return Push::Closing;
            }
            if state.frames.len() + 1 > caps.frames || state.bytes + frame.len() > caps.bytes {
                let dropped = state.frames.len() + 1;
                state.frames = VecDeque::new();
                state.bytes = 0;
                state.close = Some(CloseReason::SlowConsumer);
                Push::Overflowed { dropped }
            } else {
                state.bytes += frame.len();
                state.frames.push_back(frame);
                Push::Queued
            }
        };
        self.notify.notify_one();
        outcome
    }

    /// Queues `frame` only if it fits; never closes the socket. Used by replay, which a
    /// client asks for and which must not turn a healthy socket into a "slow consumer".
    pub(crate) fn push_if_room(&self, frame: Bytes, caps: QueueCaps) -> bool {
        let queued = {
            let mut state = self.state.lock().expect("outbound lock poisoned");
            let fits = state.frames.len() < caps.frames && state.bytes + frame.len() <= caps.bytes;
            if state.close.is_none() && fits {
                state.bytes += frame.len();
                state.frames.push_back(frame);
                true
            } else {
                false
            }
        };
        if queued {
            self.notify.notify_one();
        }
        queued
    }

    /// Free room in frames, given `caps`.
    pub(crate) fn room(&self, caps: QueueCaps) -> usize {
        let state = self.state.lock().expect("outbound lock poisoned");
        caps.frames.saturating_sub(state.frames.len())
    }

    /// Asks the writer to close the socket. The first reason wins; returns whether this call
    /// set it.
    pub fn close(&self, reason: CloseReason) -> bool {
        let set = {
            let mut state = self.state.lock().expect("outbound lock poisoned");
            if state.close.is_some() {
                false
            } else {
                state.close = Some(reason);
                true
            }
        };
        if set {
            self.notify.notify_one();
        }
        set
    }

    /// Whether a close has been requested.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.state.lock().expect("outbound lock poisoned").close
    }

    /// Takes everything queued (and the close request, if any).
    pub fn take(&self) -> Batch {
        let mut state = self.state.lock().expect("outbound lock poisoned");
        state.bytes = 0;
        Batch {
            frames: std::mem::take(&mut state.frames),
            close: state.close,
        }
    }

    /// Waits until something was pushed or a close was requested since the last wait.
    ///
    /// A push that happens between [`Outbound::take`] and this call is not lost: `Notify`
    /// keeps one permit for the next waiter.
    pub async fn changed(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: QueueCaps = QueueCaps {
        frames: 3,
        bytes: 10,
    };

    #[test]
    fn frames_come_out_in_order() {
        let q = Outbound::default();
        assert_eq!(q.push(Bytes::from_static(b"a"), CAPS), Push::Queued);
        assert_eq!(q.push(Bytes::from_static(b"b"), CAPS), Push::Queued);
        let batch = q.take();
        assert_eq!(
            batch.frames,
            [Bytes::from_static(b"a"), Bytes::from_static(b"b")]
        );
        assert_eq!(batch.close, None);
        assert!(q.take().frames.is_empty());
    }

    #[test]
    fn frame_cap_overflow_closes_as_slow_consumer_and_drops_the_queue() {
        let q = Outbound::default();
        for _ in 0..3 {
            assert_eq!(q.push(Bytes::from_static(b"x"), CAPS), Push::Queued);
        }
        assert_eq!(
            q.push(Bytes::from_static(b"x"), CAPS),
            Push::Overflowed { dropped: 4 }
        );
        assert_eq!(q.push(Bytes::from_static(b"x"), CAPS), Push::Closing);
        let batch = q.take();
        assert!(batch.frames.is_empty());
        assert_eq!(batch.close, Some(CloseReason::SlowConsumer));
    }

    #[test]
    fn byte_cap_overflow_closes_as_slow_consumer() {
        let q = Outbound::default();
        assert_eq!(q.push(Bytes::from_static(b"123456"), CAPS), Push::Queued);
        assert_eq!(
            q.push(Bytes::from_static(b"12345"), CAPS),
            Push::Overflowed { dropped: 2 }
        );
    }

    #[test]
    fn taking_frees_room() {
        let q = Outbound::default();
        for _ in 0..3 {
            q.push(Bytes::from_static(b"12"), CAPS);
        }
        q.take();
        for _ in 0..3 {
            assert_eq!(q.push(Bytes::from_static(b"123"), CAPS), Push::Queued);
        }
    }

    #[test]
    fn push_if_room_never_closes() {
        let q = Outbound::default();
        for _ in 0..3 {
            assert!(q.push_if_room(Bytes::from_static(b"x"), CAPS));
        }
        assert_eq!(q.room(CAPS), 0);
        assert!(!q.push_if_room(Bytes::from_static(b"x"), CAPS));
        assert_eq!(q.close_reason(), None);
        assert_eq!(q.take().frames.len(), 3);
    }

    #[test]
    fn going_away_keeps_queued_frames_and_first_reason_wins() {
        let q = Outbound::default();
        q.push(Bytes::from_static(b"a"), CAPS);
        assert!(q.close(CloseReason::GoingAway));
        assert!(!q.close(CloseReason::SlowConsumer));
        let batch = q.take();
        assert_eq!(batch.frames.len(), 1);
        assert_eq!(batch.close, Some(CloseReason::GoingAway));
    }

    #[tokio::test]
    async fn a_push_before_waiting_is_not_lost() {
        let q = Outbound::default();
        q.push(Bytes::from_static(b"a"), CAPS);
        // Returns at once thanks to the stored permit.
        q.changed().await;
        assert_eq!(q.take().frames.len(), 1);
    }
}
