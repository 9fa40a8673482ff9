//! How this server reaches the other servers of its cluster — alone, a mesh of peers, or a
//! broker — as one value chosen at startup from [`ClusterConfig`] and carried in the state.
//! Whatever depends on the mode (passing an accepted message on, a peer's announce, the
//! drain's flush, filling history at start) matches on [`Cluster`]; nothing works the mode
//! out from other facts.
//!
//! [`ClusterConfig`]: crate::config::ClusterConfig

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::broker::Broker;
use crate::peers::PeerRelay;

/// This server's way to the others.
pub enum Cluster {
    /// No peers and no broker.
    Alone,
    /// Relaying to peers ([`crate::peers`]).
    Mesh(Arc<PeerRelay>),
    /// A Redis stream ([`crate::broker`]); the state holds its publishing handle, and the
    /// reader runs on its own.
    Broker(Broker),
}

impl Cluster {
    /// Passes a stamped message on to the other servers if it entered the cluster here
    /// (nobody but us in `touched`). Never waits: a full queue drops it and counts.
    pub fn pass_on(&self, instance: &str, stamped_body: Bytes, touched: &[String]) {
        match self {
            Cluster::Alone => {}
            Cluster::Mesh(relay) => relay.relay(instance, stamped_body, touched),
            Cluster::Broker(broker) => broker.publish(instance, stamped_body, touched),
        }
    }

    /// A sibling at `ip` announced itself; false when this server does not discover peers
    /// through DNS (an announce then means nothing here).
    pub fn announced(&self, ip: IpAddr) -> bool {
        match self {
            Cluster::Mesh(relay) => relay.announced(ip),
            Cluster::Alone | Cluster::Broker(_) => false,
        }
    }

    /// At SIGTERM: waits up to `deadline` until what was accepted here has reached the other
    /// servers (the peers' queues, or the broker's publish queue, are empty).
    pub async fn flush(&self, deadline: Duration) {
        match self {
            Cluster::Alone => {}
            Cluster::Mesh(relay) => relay.shutdown(deadline).await,
            Cluster::Broker(broker) => broker.flush(deadline).await,
        }
    }
}
