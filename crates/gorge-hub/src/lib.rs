//! The notification hub: which sockets of which instance want which PHIDs, each socket's
//! bounded outbound queue, the retained history, and the counters `/status/` reports.
//!
//! It knows nothing of HTTP or WebSocket framing so it tests in microseconds: the binary
//! parses messages (with `phorge-wire`), calls [`Hub::publish`], and runs one writer per socket
//! that drains that socket's [`Outbound`] queue. Publishing only pushes shared [`bytes::Bytes`]
//! into queues under a short lock; it never waits on a socket.

#![warn(missing_docs)]

mod clock;
mod history;
mod hub;
mod outbound;
mod subscriptions;

pub use clock::{ManualMillisClock, MillisClock, MonotonicClock};
pub use hub::{
    ConnectError, Hub, HubStatus, HubUsage, InstanceNameTooLong, Limits, Publication,
    PublishCounts, ReplayCounts, Retained, SocketHandle, SocketId, SubscribeCounts, WarmCounts,
    Warmed,
};
pub use outbound::{CloseReason, Flush, Outbound, Push, QueueCaps, Sink, MAX_BATCH};
pub use subscriptions::{subscription_cost, SUBSCRIPTION_OVERHEAD_BYTES};
