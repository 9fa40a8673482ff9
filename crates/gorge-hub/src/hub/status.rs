//! What the hub reports: `/status/` counters per instance, gauges for metrics, and the sockets
//! drain closes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Hub;
use crate::send_queue::SendQueue;

/// An instance's counters for `/status/` (uptime and version are the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubStatus {
    /// Sockets of the instance open now.
    pub clients_active: u64,
    /// Sockets the instance has had since the hub started.
    pub clients_total: u64,
    /// Messages accepted, all instances (Aphlict's `messages.in`).
    pub messages_in: u64,
    /// Frames queued or written for live delivery, all instances; replays excluded.
    pub messages_out: u64,
    /// Retained history entries of the instance.
    pub history_size: u64,
    /// Milliseconds since the instance's oldest retained entry; `None` when it has none.
    pub history_age_ms: Option<u64>,
}

/// Global gauges of the hub, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HubUsage {
    /// Instances Phorge has published to (each holds a slot of its kind).
    pub confirmed_instances: usize,
    /// Instances named only by browsers' URLs (each holds a slot of its kind).
    pub anonymous_instances: usize,
    /// Bytes of subscriptions held by all sockets (see [`crate::subscription_cost`]).
    pub subscription_bytes: usize,
}

/// What the hub has let go of since it started (monotonic counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Released {
    /// Subscription bytes released: unsubscribed, or held by sockets that closed.
    pub subscription_bytes: u64,
    /// Sockets that left the hub.
    pub sockets: u64,
}

impl Hub {
    /// What the hub has let go of since it started.
    pub fn released(&self) -> Released {
        Released {
            subscription_bytes: self.released_bytes.load(Ordering::Relaxed),
            sockets: self.released_sockets.load(Ordering::Relaxed),
        }
    }

    /// Counts one message in `messages.in` (every POST that parsed, duplicates included, as
    /// Aphlict counts). The admin port counts when it accepts, before the fan-out runs.
    pub fn count_message_in(&self) {
        self.messages_in.fetch_add(1, Ordering::Relaxed);
    }

    /// `/status/` counters of `instance`; an unknown instance answers zeros and creates no
    /// state.
    pub fn status(&self, instance: &str) -> HubStatus {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        let (clients_active, clients_total) = state
            .instances
            .get(instance)
            .map_or((0, 0), |i| (i.clients_active, i.clients_total));
        let (history_size, history_age_ms) = state.history.instance_summary(instance, now);
        HubStatus {
            clients_active,
            clients_total,
            messages_in: self.messages_in.load(Ordering::Relaxed),
            messages_out: self.messages_out.load(Ordering::Relaxed),
            history_size,
            history_age_ms,
        }
    }

    /// Open sockets, all instances.
    pub fn open_sockets(&self) -> usize {
        self.lock().sockets.len()
    }

    /// `(entries, bytes)` of the history after expiry.
    pub fn history_totals(&self) -> (usize, usize) {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        state.history.expire(now);
        state.history.totals()
    }

    /// Instance and subscription gauges.
    pub fn usage(&self) -> HubUsage {
        let state = self.lock();
        HubUsage {
            confirmed_instances: state.confirmed_instances,
            anonymous_instances: state.anonymous_instances(),
            subscription_bytes: state.subscription_bytes,
        }
    }

    /// The queues of every open socket (drain closes them one by one, outside the lock).
    pub fn send_queues(&self) -> Vec<Arc<SendQueue>> {
        self.lock()
            .sockets
            .values()
            .map(|s| s.send_queue.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::testing::*;
    use crate::*;

    #[test]
    fn counters_follow_the_spec() {
        let (mut hub, _) = hub();
        let a = hub.connect("a").unwrap();
        let b = hub.connect("b").unwrap();
        hub.subscribe(&a, strings(&["P"]));
        hub.subscribe(&b, strings(&["P"]));
        publish(&mut hub, "a", &["P"], "1");
        publish(&mut hub, "b", &["P"], "2");
        publish(&mut hub, "b", &["nobody"], "3");
        // The admin port counts what it accepts; publish itself does not.
        assert_eq!(hub.status("a").messages_in, 0);
        for _ in 0..3 {
            hub.count_message_in();
        }
        hub.replay(&a, 60_000);
        let sa = hub.status("a");
        assert_eq!(sa.messages_in, 3);
        // Live frames only, all instances; the replay above does not count.
        assert_eq!(sa.messages_out, 2);
        assert_eq!((sa.clients_active, sa.clients_total), (1, 1));
        assert_eq!(sa.history_size, 1);
        assert_eq!(hub.status("b").history_size, 2);
    }

    #[test]
    fn status_of_unknown_instance_is_zero_and_creates_nothing() {
        let (hub, _) = hub_with(Limits {
            instances: 1,
            ..Limits::default()
        });
        let _a = hub.connect("a").unwrap();
        let s = hub.status("ghost");
        assert_eq!(
            s,
            HubStatus {
                clients_active: 0,
                clients_total: 0,
                messages_in: 0,
                messages_out: 0,
                history_size: 0,
                history_age_ms: None,
            }
        );
        // "ghost" took no instance slot: "a" is still the only one, and it is busy.
        assert_eq!(
            hub.connect("other").unwrap_err(),
            ConnectError::TooManyInstances
        );
    }

    #[test]
    fn history_age_is_null_when_empty_and_expires_on_read() {
        let (mut hub, clock) = hub();
        assert_eq!(hub.status("default").history_age_ms, None);
        publish(&mut hub, "default", &["P"], "m");
        clock.advance_ms(250);
        assert_eq!(hub.status("default").history_age_ms, Some(250));
        clock.advance_ms(60_000);
        let s = hub.status("default");
        assert_eq!((s.history_size, s.history_age_ms), (0, None));
    }

    #[test]
    fn outbounds_lists_open_sockets() {
        let (hub, _) = hub();
        let a = hub.connect("a").unwrap();
        let _b = hub.connect("b").unwrap();
        assert_eq!(hub.send_queues().len(), 2);
        hub.disconnect(&a);
        assert_eq!(hub.send_queues().len(), 1);
    }
}
