//! Helpers the hub's unit tests share.

use std::sync::Arc;

use bytes::Bytes;

use super::{Hub, Limits, PublishCounts, Publisher, SocketHandle};
use crate::clock::ManualMillisClock;

/// A hub's [`Publisher`] (which derefs to the hub) and the hub's clock.
pub(super) fn hub_with(limits: Limits) -> (Publisher, Arc<ManualMillisClock>) {
    let clock = ManualMillisClock::new();
    (Hub::new(limits, clock.clone()).1, clock)
}

pub(super) fn hub() -> (Publisher, Arc<ManualMillisClock>) {
    hub_with(Limits::default())
}

pub(super) fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

pub(super) fn frames(handle: &SocketHandle) -> Vec<Bytes> {
    handle.send_queue().take_frames()
}

/// A socket of the default instance subscribed to `phids`.
pub(super) fn subscribed(hub: &Hub, phids: &[&str]) -> SocketHandle {
    let socket = hub.connect("default").unwrap();
    hub.subscribe(&socket, strings(phids));
    socket
}

pub(super) fn publish(
    hub: &mut Publisher,
    instance: &str,
    subscribers: &[&str],
    body: &'static str,
) -> PublishCounts {
    hub.publish(
        instance,
        &strings(subscribers),
        Bytes::from_static(body.as_bytes()),
    )
    .unwrap()
}
