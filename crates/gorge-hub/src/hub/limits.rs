//! Every bound the hub enforces, and the errors of going beyond the ones a caller sees.

/// Every bound the hub enforces.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Frames one socket's send queue may hold before the socket is closed as a slow
    /// consumer.
    pub queue_frames: usize,
    /// Bytes one socket's send queue may hold, likewise.
    pub queue_bytes: usize,
    /// History entries kept for replay, all instances together (the oldest go first).
    pub history_entries: usize,
    /// Entries older than this are dropped from history.
    pub history_age_ms: u64,
    /// Bytes of history kept, all instances together.
    pub history_bytes: usize,
    /// PHIDs one socket may subscribe to.
    pub subscriptions_per_socket: usize,
    /// Bytes of subscriptions per socket (see [`crate::SUBSCRIPTION_OVERHEAD_BYTES`]).
    pub subscription_bytes_per_socket: usize,
    /// Bytes of subscriptions of all sockets together.
    pub subscription_bytes_total: usize,
    /// Longest PHID accepted in a subscription; longer ones are ignored.
    pub phid_bytes: usize,
    /// Slots per kind of instance (confirmed, anonymous).
    pub instances: usize,
    /// Longest instance name a socket or a POST may use.
    pub instance_name_bytes: usize,
    /// Open sockets, all instances together.
    pub sockets: usize,
    /// Replays a socket may ask for at once...
    pub replay_burst: u32,
    /// ...and one more per this many milliseconds.
    pub replay_refill_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            queue_frames: 256,
            queue_bytes: 4 << 20,
            history_entries: 4096,
            history_age_ms: 60_000,
            history_bytes: 16 << 20,
            subscriptions_per_socket: 4096,
            subscription_bytes_per_socket: 512 << 10,
            subscription_bytes_total: 256 << 20,
            phid_bytes: 512,
            instances: 1024,
            instance_name_bytes: 512,
            sockets: 100_000,
            replay_burst: 4,
            replay_refill_ms: 5_000,
        }
    }
}

/// Why a socket could not join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectError {
    /// [`Limits::sockets`] sockets are already open.
    TooManySockets,
    /// The instance is new and every slot of its kind ([`Limits::instances`]) is taken.
    TooManyInstances,
    /// The instance name is longer than [`Limits::instance_name_bytes`].
    InstanceNameTooLong,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConnectError::TooManySockets => "too many open sockets",
            ConnectError::TooManyInstances => "too many instances",
            ConnectError::InstanceNameTooLong => "instance name too long",
        })
    }
}

impl std::error::Error for ConnectError {}

/// A publish to an instance whose name exceeds the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceNameTooLong;

impl std::fmt::Display for InstanceNameTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("instance name too long")
    }
}

impl std::error::Error for InstanceNameTooLong {}
