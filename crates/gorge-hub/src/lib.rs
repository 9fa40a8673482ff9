//! The notification hub: which sockets of which instance want which PHIDs, each socket's
//! bounded send queue, the retained history, and the counters `/status/` reports.
//!
//! It knows nothing of HTTP or WebSocket framing so it tests in microseconds: the binary
//! parses messages (with `phorge-wire`), publishes them through the hub's one [`Publisher`]
//! (held by its fan-out thread), and runs one writer per socket that drains that socket's
//! [`SendQueue`]. Publishing numbers a batch and lists its targets under a short lock,
//! then pushes shared [`bytes::Bytes`] into the queues after letting go of it; it never waits
//! on a socket. Frames reach every socket in publish order because [`Publisher`] is the only
//! way to publish, cannot be cloned, and publishes through `&mut self`.

#![warn(missing_docs)]

mod clock;
mod history;
mod hub;
mod send_queue;
mod subscriptions;

pub use clock::{ManualMillisClock, MillisClock, MonotonicClock};
pub use hub::{
    ConnectError, Hub, HubStatus, HubUsage, InstanceNameTooLong, Limits, Publication,
    PublishCounts, Publisher, Released, ReplayCounts, Retained, SocketHandle, SocketId,
    SubscribeCounts, WarmCounts, Warmed,
};
pub use send_queue::{CloseReason, Flush, Push, QueueCaps, SendQueue, Sink, MAX_BATCH};
pub use subscriptions::{subscription_cost, SUBSCRIPTION_OVERHEAD_BYTES};
