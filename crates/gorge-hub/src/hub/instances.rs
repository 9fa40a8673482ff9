//! The two tables of instance slots, *confirmed* and *anonymous* (see the [`super`] module
//! comment): finding room for one more, and confirming an instance the admin port publishes to.

use std::sync::Arc;

use super::{Hub, State};
use crate::subscriptions::SubscriptionIndex;

#[derive(Debug, Default)]
pub(super) struct Instance {
    pub(super) clients_active: u64,
    pub(super) clients_total: u64,
    /// Published to by the admin port (see the module comment); `default` is neither kind.
    pub(super) confirmed: bool,
    pub(super) subscriptions: SubscriptionIndex,
}

/// The instance every single-instance Phorge uses; it takes no slot.
pub(super) const DEFAULT_INSTANCE: &str = "default";

impl State {
    pub(super) fn anonymous_instances(&self) -> usize {
        let default = usize::from(self.instances.contains_key(DEFAULT_INSTANCE));
        self.instances.len() - self.confirmed_instances - default
    }
}

impl Hub {
    /// Makes room for one more instance of the given kind: true when its table has a free
    /// slot, or an idle instance of that kind (no open socket) could be forgotten.
    pub(super) fn make_room(&self, state: &mut State, confirmed: bool) -> bool {
        let used = if confirmed {
            state.confirmed_instances
        } else {
            state.anonymous_instances()
        };
        if used < self.limits.instances {
            return true;
        }
        let idle = state
            .instances
            .iter()
            .find(|(k, i)| {
                i.confirmed == confirmed && i.clients_active == 0 && &***k != DEFAULT_INSTANCE
            })
            .map(|(k, _)| k.clone());
        match idle {
            Some(idle) => {
                state.instances.remove(&idle);
                if confirmed {
                    state.confirmed_instances -= 1;
                }
                true
            }
            None => false,
        }
    }

    /// Marks `instance` confirmed (the admin port published to it), creating its state if
    /// its table has room.
    pub(super) fn confirm(&self, state: &mut State, instance: &str) {
        if instance == DEFAULT_INSTANCE {
            return;
        }
        match state.instances.get(instance).map(|i| i.confirmed) {
            Some(true) => {}
            Some(false) => {
                if self.make_room(state, true) {
                    if let Some(i) = state.instances.get_mut(instance) {
                        i.confirmed = true;
                        state.confirmed_instances += 1;
                    }
                }
            }
            None => {
                if self.make_room(state, true) {
                    state.instances.insert(
                        Arc::from(instance),
                        Instance {
                            confirmed: true,
                            ..Instance::default()
                        },
                    );
                    state.confirmed_instances += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::hub::testing::*;
    use crate::*;
    use bytes::Bytes;

    #[test]
    fn instances_are_isolated() {
        let (mut hub, _) = hub();
        let a = hub.connect("a").unwrap();
        let b = hub.connect("b").unwrap();
        hub.subscribe(&a, strings(&["PHID-A"]));
        hub.subscribe(&b, strings(&["PHID-A"]));
        publish(&mut hub, "b", &["PHID-A"], "for-b");
        assert!(frames(&a).is_empty());
        assert_eq!(frames(&b), [Bytes::from_static(b"for-b")]);
        // Replay of a's history never includes b's messages.
        assert_eq!(hub.replay(&a, 60_000).queued, 0);
    }

    #[test]
    fn socket_and_instance_limits() {
        let (mut hub, _) = hub_with(Limits {
            sockets: 2,
            instances: 1,
            instance_name_bytes: 3,
            ..Limits::default()
        });
        let a = hub.connect("a").unwrap();
        assert_eq!(
            hub.connect("b").unwrap_err(),
            ConnectError::TooManyInstances
        );
        assert_eq!(
            hub.connect("long").unwrap_err(),
            ConnectError::InstanceNameTooLong
        );
        let _a2 = hub.connect("a").unwrap();
        assert_eq!(hub.connect("a").unwrap_err(), ConnectError::TooManySockets);
        assert_eq!(
            hub.publish("long", &[], Bytes::new()),
            Err(InstanceNameTooLong)
        );
        hub.disconnect(&a);
        hub.disconnect(&_a2);
        // Once "a" is idle it can be forgotten to make room for "b".
        let b = hub.connect("b").unwrap();
        assert_eq!(b.instance(), "b");
        assert_eq!(hub.status("a").clients_total, 0);
    }

    #[test]
    fn anonymous_names_cannot_keep_real_instances_out() {
        let (mut hub, _) = hub();
        let squatters: Vec<_> = (0..1024)
            .map(|i| hub.connect(&format!("squat{i}")).unwrap())
            .collect();
        assert_eq!(
            hub.connect("squat-extra").unwrap_err(),
            ConnectError::TooManyInstances
        );
        // `default` is always a real instance.
        let _d = hub.connect("default").unwrap();
        // Once PHP has posted to an instance, its browsers get in whatever the squatters do.
        assert_eq!(
            hub.connect("acme").unwrap_err(),
            ConnectError::TooManyInstances
        );
        publish(&mut hub, "acme", &["P"], "hello");
        let acme = hub.connect("acme").unwrap();
        hub.subscribe(&acme, strings(&["P"]));
        assert_eq!(hub.replay(&acme, 60_000).queued, 1);
        assert_eq!(publish(&mut hub, "acme", &["P"], "live").queued, 1);
        let usage = hub.usage();
        assert_eq!(
            (usage.confirmed_instances, usage.anonymous_instances),
            (1, 1024)
        );
        // The squatters' own table still reclaims idle slots.
        hub.disconnect(&squatters[0]);
        hub.connect("squat-extra").unwrap();
    }

    #[test]
    fn confirmed_instances_have_their_own_bounded_table() {
        let (mut hub, _) = hub_with(Limits {
            instances: 2,
            ..Limits::default()
        });
        let _d = hub.connect("default").unwrap();
        let a = hub.connect("a").unwrap();
        publish(&mut hub, "a", &[], "promotes a");
        publish(&mut hub, "z", &[], "confirms z, idle");
        publish(&mut hub, "default", &[], "default takes no slot");
        let _z = hub.connect("z").unwrap();
        publish(&mut hub, "b", &[], "no room: a and z are busy");
        assert_eq!(hub.usage().confirmed_instances, 2);
        // "b" was not confirmed, but a browser can still open it as an anonymous instance.
        let _b = hub.connect("b").unwrap();
        hub.disconnect(&a);
        publish(&mut hub, "c", &[], "takes idle a's slot");
        assert_eq!(hub.status("a").clients_total, 0);
        let usage = hub.usage();
        assert_eq!(
            (usage.confirmed_instances, usage.anonymous_instances),
            (2, 1)
        );
    }
}
