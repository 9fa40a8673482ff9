//! Publishing: the one [`Publisher`], and a batch planned under the hub lock (numbered, stored
//! in history, each target socket listed with its frames) then delivered without it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::{Hub, InstanceNameTooLong, State};
use crate::history::{Entry, Subscribers};
use crate::send_queue::{Push, QueueCaps, SendQueue};
use crate::subscriptions::SubscriptionIndex;

/// A batch ready to be written: every target socket with its frames, in order.
struct BatchPlan {
    sockets: Vec<Arc<SendQueue>>,
    /// Socket `i`'s frames are `frames[starts[i]..starts[i + 1]]`.
    starts: Vec<usize>,
    frames: Vec<(Bytes, u64)>,
    /// For each frame, its message's index in the batch.
    messages: Vec<usize>,
    outcomes: Vec<Result<PublishCounts, InstanceNameTooLong>>,
    caps: QueueCaps,
}

impl BatchPlan {
    /// Writes (or queues) every socket's frames; one outcome per message, in order.
    fn deliver(self, hub: &Hub) -> Vec<Result<PublishCounts, InstanceNameTooLong>> {
        let mut outcomes = self.outcomes;
        for (socket, send_queue) in self.sockets.iter().enumerate() {
            let range = self.starts[socket]..self.starts[socket + 1];
            let messages = &self.messages[range.clone()];
            // Counted before the write so `messages.out` never lags a frame a client holds.
            hub.messages_out
                .fetch_add(range.len() as u64, Ordering::Relaxed);
            send_queue.push_batch(&self.frames[range], self.caps, |i, push| {
                let Some(Ok(outcome)) = outcomes.get_mut(messages[i]) else {
                    return;
                };
                match push {
                    Push::Written | Push::Queued => {
                        outcome.queued += 1;
                        return;
                    }
                    Push::Overflowed { dropped } => {
                        outcome.slow_consumers += 1;
                        outcome.dropped_frames += dropped;
                    }
                    Push::Closing | Push::Replayed => {}
                }
                hub.messages_out.fetch_sub(1, Ordering::Relaxed);
            });
        }
        outcomes
    }
}

/// One message for [`Publisher::publish_batch`].
#[derive(Debug, Clone)]
pub struct Publication<'a> {
    /// The instance it was posted to.
    pub instance: &'a str,
    /// The PHIDs it is for: sockets subscribed to any of them get it.
    pub subscribers: &'a [String],
    /// The encoded frame, shared by every recipient and the history.
    pub frame: Bytes,
    /// When the message was accepted, by the hub's clock.
    pub at_ms: u64,
}

/// What one publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishCounts {
    /// Frames queued for live delivery.
    pub queued: usize,
    /// Sockets whose queue overflowed on this publish (now closing with 1008).
    pub slow_consumers: usize,
    /// Frames discarded by those overflows.
    pub dropped_frames: usize,
    /// History size after the publish.
    pub history_entries: usize,
    /// History bytes after the publish.
    pub history_bytes: usize,
}

/// The one handle that can publish to a hub. [`Hub::new`] makes exactly one, and it cannot be
/// cloned: whoever holds it (in gorge-notification, the fan-out thread) is the only
/// publisher, and `&mut self` lets one publish run at a time.
///
/// That is what keeps every socket's frames in publish order. The hub lock is held only to
/// number a batch and list its targets; the frames are pushed to the sockets after it is let
/// go, so that no socket write ever waits on the lock. Two publishes running at once could
/// therefore push their frames in either order; one publisher cannot.
///
/// It derefs to the [`Hub`] for everything else.
///
/// ```
/// use std::sync::Arc;
/// use gorge_hub::{Hub, Limits, MonotonicClock};
///
/// let (mut hub, mut publisher) = Hub::new(Limits::default(), MonotonicClock::new());
/// let socket = hub.connect("default").unwrap();
/// hub.subscribe(&socket, vec!["PHID-A".into()]);
/// let counts = publisher.publish("default", &["PHID-A".into()], "m".into()).unwrap();
/// assert_eq!(counts.queued, 1);
/// # let _: Arc<Hub> = hub;
/// ```
///
/// The hub itself cannot publish...
///
/// ```compile_fail,E0599
/// use gorge_hub::{Hub, Limits, MonotonicClock};
///
/// let (mut hub, _publisher) = Hub::new(Limits::default(), MonotonicClock::new());
/// hub.publish("default", &["PHID-A".into()], "m".into()).unwrap();
/// ```
///
/// ...and there is no second publisher.
///
/// ```compile_fail,E0599
/// use gorge_hub::{Hub, Limits, MonotonicClock};
///
/// let (_hub, publisher) = Hub::new(Limits::default(), MonotonicClock::new());
/// let mut second = publisher.clone();
/// second.publish("default", &["PHID-A".into()], "m".into()).unwrap();
/// ```
pub struct Publisher {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl std::ops::Deref for Publisher {
    type Target = Hub;

    fn deref(&self) -> &Hub {
        &self.hub
    }
}

impl Publisher {
    /// The publisher of a hub just made (only [`Hub::new`] calls this).
    pub(super) fn new(hub: Arc<Hub>) -> Self {
        Publisher { hub }
    }

    /// The hub this publishes to.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Stores `frame` (an encoded message) in history and delivers the same bytes to every
    /// socket of `instance` subscribed to any of `subscribers`. The lock is held only to
    /// append and to list the targets; delivery happens after it, and never waits on a
    /// socket (an idle socket is written at once, a busy one queues, a full one closes).
    pub fn publish(
        &mut self,
        instance: &str,
        subscribers: &[String],
        frame: Bytes,
    ) -> Result<PublishCounts, InstanceNameTooLong> {
        let message = Publication {
            instance,
            subscribers,
            frame,
            at_ms: self.hub.clock.now_ms(),
        };
        self.publish_batch(std::slice::from_ref(&message))
            .pop()
            .expect("one outcome per message")
    }

    /// Publishes messages in order, exactly as [`Publisher::publish`] of each in turn would,
    /// except that each socket gets all of its frames of the batch in one write (the
    /// fan-out batches the messages that arrived while it was busy). One outcome per
    /// message, in order.
    pub fn publish_batch(
        &mut self,
        batch: &[Publication<'_>],
    ) -> Vec<Result<PublishCounts, InstanceNameTooLong>> {
        self.hub.plan_batch(batch).deliver(&self.hub)
    }
}

impl Hub {
    /// The first half of [`Publisher::publish_batch`], under the hub lock: numbers the messages,
    /// stores them in history and lists each target socket with its frames. Delivering
    /// the plan writes to the sockets, without the lock.
    fn plan_batch(&self, batch: &[Publication<'_>]) -> BatchPlan {
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut sockets: Vec<Arc<SendQueue>> = Vec::new();
        // (socket, message, seq) for every frame, in message order.
        let mut hits: Vec<(usize, usize, u64)> = Vec::new();
        let mut socket_of: HashMap<*const SendQueue, usize> = HashMap::new();
        {
            let mut state = self.lock();
            for (index, message) in batch.iter().enumerate() {
                if !self.instance_name_ok(message.instance) {
                    outcomes.push(Err(InstanceNameTooLong));
                    continue;
                }
                let (seq, targets, (history_entries, history_bytes)) =
                    self.append_locked(&mut state, message);
                outcomes.push(Ok(PublishCounts {
                    history_entries,
                    history_bytes,
                    ..PublishCounts::default()
                }));
                hits.reserve(targets.len());
                for send_queue in targets {
                    // One message's targets are distinct already; only a batch can repeat one.
                    let socket = if batch.len() == 1 {
                        sockets.len()
                    } else {
                        *socket_of
                            .entry(Arc::as_ptr(&send_queue))
                            .or_insert(sockets.len())
                    };
                    if socket == sockets.len() {
                        sockets.push(send_queue);
                    }
                    hits.push((socket, index, seq));
                }
            }
        }
        // Each socket's frames side by side, in message order (a counting sort: no
        // allocation per socket).
        let mut starts = vec![0usize; sockets.len() + 1];
        for &(socket, _, _) in &hits {
            starts[socket + 1] += 1;
        }
        for socket in 0..sockets.len() {
            starts[socket + 1] += starts[socket];
        }
        let mut next = starts.clone();
        let mut frames = vec![(Bytes::new(), 0); hits.len()];
        let mut messages = vec![0; hits.len()];
        for (socket, index, seq) in hits {
            let at = next[socket];
            next[socket] += 1;
            frames[at] = (batch[index].frame.clone(), seq);
            messages[at] = index;
        }
        BatchPlan {
            sockets,
            starts,
            frames,
            messages,
            outcomes,
            caps: self.caps(),
        }
    }

    /// Numbers one message, stores it in history and lists its target sockets, under the
    /// hub lock. Returns the number, the targets and the history's totals after it.
    fn append_locked(
        &self,
        state: &mut State,
        message: &Publication<'_>,
    ) -> (u64, Vec<Arc<SendQueue>>, (usize, usize)) {
        state.published += 1;
        let seq = state.published;
        self.confirm(state, message.instance);
        let State {
            instances, history, ..
        } = state;
        let instance_entry = instances.get_key_value(message.instance);
        let history_instance = match instance_entry {
            Some((key, _)) => key.clone(),
            None => Arc::from(message.instance),
        };
        let targets = instance_entry.map_or_else(Vec::new, |(_, target)| {
            targets(&target.subscriptions, message.subscribers)
        });
        history.append(
            Entry {
                instance: history_instance,
                at_ms: message.at_ms,
                published: seq,
                subscribers: Subscribers::new(message.subscribers),
                body: message.frame.clone(),
            },
            message.at_ms,
        );
        (seq, targets, history.totals())
    }
}

/// The queues of the sockets subscribed to any of `subscribers`, each once.
fn targets(index: &SubscriptionIndex, subscribers: &[String]) -> Vec<Arc<SendQueue>> {
    if let [only] = subscribers {
        return index
            .sockets_for(only)
            .map(|(_, send_queue)| send_queue.clone())
            .collect();
    }
    let mut seen = HashSet::new();
    let mut targets = Vec::new();
    for phid in subscribers {
        for (id, send_queue) in index.sockets_for(phid) {
            if seen.insert(id) {
                targets.push(send_queue.clone());
            }
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::testing::*;
    use crate::send_queue::CloseReason;
    use crate::*;
    use bytes::Bytes;

    #[test]
    fn delivers_to_matching_subscribers_only() {
        let (mut hub, _) = hub();
        let a = hub.connect("default").unwrap();
        let b = hub.connect("default").unwrap();
        hub.subscribe(&a, strings(&["PHID-A"]));
        hub.subscribe(&b, strings(&["PHID-B"]));
        let out = publish(&mut hub, "default", &["PHID-A", "PHID-X"], "m1");
        assert_eq!(out.queued, 1);
        assert_eq!(frames(&a), [Bytes::from_static(b"m1")]);
        assert!(frames(&b).is_empty());
    }

    #[test]
    fn a_batch_publishes_like_one_message_after_another() {
        let (mut hub, _) = hub();
        let a = hub.connect("default").unwrap();
        let b = hub.connect("default").unwrap();
        hub.subscribe(&a, strings(&["PHID-A"]));
        hub.subscribe(&b, strings(&["PHID-B"]));
        let (to_a, to_b) = (strings(&["PHID-A"]), strings(&["PHID-B", "PHID-A"]));
        let long = "i".repeat(1000);
        let message = |instance, subscribers, body: &'static str| Publication {
            instance,
            subscribers,
            frame: Bytes::from_static(body.as_bytes()),
            at_ms: 0,
        };
        let outcomes = hub.publish_batch(&[
            message("default", &to_a, "m1"),
            message(&long, &to_a, "refused"),
            message("default", &to_b, "m2"),
            message("default", &to_a, "m3"),
        ]);
        let queued: Vec<Option<usize>> = outcomes
            .iter()
            .map(|o| o.as_ref().ok().map(|o| o.queued))
            .collect();
        assert_eq!(queued, [Some(1), None, Some(2), Some(1)]);
        assert_eq!(outcomes[3].as_ref().unwrap().history_entries, 3);
        assert_eq!(
            frames(&a),
            [
                Bytes::from_static(b"m1"),
                Bytes::from_static(b"m2"),
                Bytes::from_static(b"m3")
            ]
        );
        assert_eq!(frames(&b), [Bytes::from_static(b"m2")]);
        assert_eq!(hub.status("default").messages_out, 4);
    }

    #[test]
    fn a_socket_matching_several_subscribers_gets_one_frame() {
        let (mut hub, _) = hub();
        let a = subscribed(&hub, &["PHID-A", "PHID-B"]);
        assert_eq!(
            publish(&mut hub, "default", &["PHID-A", "PHID-B", "PHID-A"], "m").queued,
            1
        );
        assert_eq!(frames(&a).len(), 1);
    }

    #[test]
    fn fan_out_shares_one_buffer() {
        let (mut hub, _) = hub();
        let sockets: Vec<_> = (0..3).map(|_| hub.connect("default").unwrap()).collect();
        for s in &sockets {
            hub.subscribe(s, strings(&["PHID-A"]));
        }
        let body = Bytes::from(b"shared".to_vec());
        let ptr = body.as_ptr();
        hub.publish("default", &strings(&["PHID-A"]), body).unwrap();
        for s in &sockets {
            assert_eq!(frames(s)[0].as_ptr(), ptr);
        }
    }

    #[test]
    fn empty_or_missing_subscribers_reach_nobody() {
        let (mut hub, _) = hub();
        let a = subscribed(&hub, &["PHID-A"]);
        assert_eq!(publish(&mut hub, "default", &[], "m").queued, 0);
        assert!(frames(&a).is_empty());
    }

    #[test]
    fn overflow_marks_only_the_slow_socket() {
        let (mut hub, _) = hub_with(Limits {
            queue_frames: 2,
            ..Limits::default()
        });
        let slow = hub.connect("default").unwrap();
        let fast = hub.connect("default").unwrap();
        hub.subscribe(&slow, strings(&["A"]));
        hub.subscribe(&fast, strings(&["A"]));
        let mut slow_consumers = 0;
        let mut dropped = 0;
        for _ in 0..5 {
            let out = publish(&mut hub, "default", &["A"], "m");
            slow_consumers += out.slow_consumers;
            dropped += out.dropped_frames;
            assert!(!frames(&fast).is_empty());
        }
        assert_eq!((slow_consumers, dropped), (1, 3));
        assert!(slow.send_queue().take_frames().is_empty());
        assert_eq!(
            slow.send_queue().close_reason(),
            Some(CloseReason::SlowConsumer)
        );
    }
}
