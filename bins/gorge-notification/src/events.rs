//! Every log event of gorge-notification, each declared once (see `gorge_service::events`)
//! and emitted only through that declaration; docs/notification.md's table is generated from
//! this list (and the shared runtime's) and checked by `tests/docs.rs`.

gorge_service::events! {
    /// Every event of the service, in the docs' order.
    pub const ALL = [
        NOTIFY_STARTED: Info ["fingerprint", "listeners", "peers", "stop_within_sec"]
            "Serving: the fingerprint, every listener address, the number of static peers, \
             then every derived fact (see Derived facts)";
        NOTIFY_CONFIG_IGNORED_KEY: Warning ["key", "reason"]
            "An Aphlict-file key with no effect here (once per key at startup)";
        NOTIFY_CONFIG_WARNING: Warning ["warning"]
            "A configuration warning, e.g. an unknown `GORGE_NOTIFICATION_*` variable, or \
             `--config` read instead of another `GORGE_NOTIFICATION_CONFIG_FILE`";
        NOTIFY_ADMIN_NOT_LOOPBACK: Warning ["addr", "hint"]
            "An admin listener on a non-loopback address that was not chosen for it (from \
             `LISTEN_ADDR`, or a file entry without `listen`): the port has no authentication";
        NOTIFY_FILE_LIMIT: Info ["soft_before", "soft", "hard"]
            "The open-file limit before and after raising the soft limit to the hard one";
        NOTIFY_FILE_LIMIT_NOT_RAISED: Warning ["error"] "Raising the open-file limit failed";
        NOTIFY_BIND_FAILED: Error ["addr", "error"]
            "A listener could not be bound: nothing serves, exit 1";
        NOTIFY_TLS_RELOADED: Info ["port", "expires_in_seconds"]
            "A TLS port's files changed (renewal, SIGHUP) and the new pair is served to new \
             handshakes; open sockets keep theirs";
        NOTIFY_TLS_RELOAD_FAILED: Warning ["port", "setting", "file", "reason"]
            "A TLS port's files changed into a pair that cannot be served (unreadable, not PEM, \
             key not matching): the old pair serves on; once per distinct failure";
        NOTIFY_STOPPED: Error ["error"] "A runtime failure stopped the server (exit 1)";
        NOTIFY_CLIENT_CONNECTED: Debug @ "clients" ["instance"] "A browser's WebSocket was accepted";
        NOTIFY_CLIENT_DISCONNECTED: Debug @ "clients" ["instance", "reason"]
            "A socket ended; `reason` is a `sockets_closed_total` reason";
        NOTIFY_MESSAGE_ACCEPTED: Debug @ "admin" ["instance", "subscribers", "bytes"]
            "The admin port accepted a message (before fan-out)";
        NOTIFY_MESSAGE_DELIVERED: Debug @ "fanout"
            ["instance", "subscribers", "queued", "slow_consumers", "batch"]
            "The fan-out thread delivered a message; `batch`: messages in the same pass";
        NOTIFY_SLOW_CONSUMER: Info @ "clients" ["instance"]
            "A socket overflowed its queue and is closed with 1008";
        NOTIFY_UPGRADE_UNSUPPORTED: Warning ["reason"]
            "An upgraded connection that is not a plain TCP stream was dropped";
        NOTIFY_DRAIN_STARTED: Info ["sockets", "window_ms"]
            "SIGTERM: close frames are spread over the drain window";
        NOTIFY_DRAIN_DONE: Info ["open_sockets", "elapsed_ms"] "The drain finished";
        NOTIFY_PEERS_CHANGED: Info @ "peers"
            ["peers", "added", "removed", "dns", "refused", "announced"]
            "The peer set changed: at startup (with `dns`, the discovery name), after a DNS \
             refresh (with `refused`, addresses over the peer limit), and when a sibling \
             announced itself (with `announced`, its address)";
        NOTIFY_PEER_UP: Info @ "peers" ["peer", "fingerprint"]
            "A relay to the peer succeeded while it was down or not yet reached, or with a new \
             fingerprint (the peer restarted)";
        NOTIFY_PEER_DOWN: Warning @ "peers" ["peer", "reason"]
            "A relay to the peer failed while it was not already down (once per outage; the \
             message is kept and retried)";
        NOTIFY_PEER_RELAYED: Debug @ "peers" ["peer", "instance", "bytes", "elapsed_ms"]
            "A message was relayed to the peer (every one; `NOTIFY_PEER_UP` logs only changes)";
        NOTIFY_PEER_RELAY_FAILED: Debug @ "peers" ["peer", "reason"]
            "A relay to the peer failed (every one; `NOTIFY_PEER_DOWN` logs only the first of \
             an outage)";
        NOTIFY_PEER_IS_SELF: Info @ "peers" ["peer"]
            "A listed or discovered peer answered with our own fingerprint: it is this server, \
             and is not relayed to";
        NOTIFY_PEER_LISTED_TWICE: Warning @ "peers" ["peer", "same_as", "fingerprint"]
            "Two peer addresses answered with one fingerprint: one server would get every \
             message twice; list it once";
        NOTIFY_PEER_REFUSED: Warning @ "peers" ["peer", "max_peers"]
            "A peer was not added: the peer limit is reached";
        NOTIFY_PEER_WORKER_FAILED: Error @ "peers" ["peer", "reason"]
            "The relay thread for a peer could not be started; the peer is not relayed to";
        NOTIFY_PEER_DNS_FAILED: Warning @ "peers" ["host", "reason"]
            "A peer DNS lookup failed or timed out; the previous peer set is kept (once per \
             outage)";
        NOTIFY_PEER_DNS_RECOVERED: Info @ "peers" ["host"]
            "Peer DNS lookups succeed again";
        NOTIFY_PEER_ANNOUNCED: Info @ "peers" ["siblings", "told"]
            "After the first DNS answer, this server announced itself to the resolved \
             siblings (`told`: how many took it), so they relay to it at once";
        NOTIFY_HISTORY_WARMED: Info ["peer", "entries", "duplicates", "invalid", "elapsed_ms"]
            "Startup: history was filled from this peer's (`entries` added, `duplicates` \
             already here by relay); `/readyz` turns 200 and replays are answered";
        NOTIFY_HISTORY_COLD: Warning ["reasons", "elapsed_ms"]
            "Startup: no peer could give its history (all down, not warm themselves, or slow; \
             `reasons` per peer); serving with what arrives from now on";
        NOTIFY_PEER_QUEUES_FLUSHED: Info @ "peers" []
            "At shutdown, every peer queue was sent within the drain window";
        NOTIFY_PEER_QUEUES_DROPPED: Warning @ "peers" ["pending", "deadline_ms"]
            "At shutdown, `pending` relayed messages were still queued at the deadline and are \
             dropped";
        NOTIFY_BROKER_UP: Info @ "broker" ["connection"]
            "The publisher's or the reader's connection to the broker works, at start or again \
             after a failure";
        NOTIFY_BROKER_DOWN: Warning @ "broker" ["connection", "error"]
            "A broker call failed or timed out (once per outage of that connection; it \
             reconnects with backoff, local delivery goes on)";
        NOTIFY_BROKER_HYDRATED: Info @ "broker" ["entries", "elapsed_ms"]
            "At start, the last history age of the stream was loaded into history; `/readyz` \
             and `replay` go ahead";
        NOTIFY_BROKER_NOT_HYDRATED: Warning @ "broker" ["waited_ms"]
            "The broker could not be read within the start-up wait: ready without history, \
             loaded when the broker answers";
        NOTIFY_BROKER_EPOCH_CHANGED: Warning @ "broker" ["before", "now"]
            "Redis restarted empty or was flushed (its epoch key changed): the history it held \
             is gone; reading starts from the new stream";
        NOTIFY_BROKER_PROBE_TIMEOUT: Warning @ "broker" ["seq", "timeout_ms", "count"]
            "Our own entry `seq` was not read back in time: the reader is reported down (and \
             gives up the connection it waits on) until it reads one; at most once a minute, \
             `count` times since the last line";
        NOTIFY_BROKER_NOT_FLUSHED: Warning @ "broker" ["pending", "deadline_ms"]
            "At shutdown, `pending` messages were still waiting for the broker at the drain \
             deadline: other servers' browsers will not get them";
        NOTIFY_BROKER_BAD_ENTRY: Warning @ "broker" ["id", "reason", "detail", "count"]
            "A stream entry that is no message this server can take was skipped (`reason` as \
             in `broker_skipped_total`, an oversized one by its id); at most once a minute per \
             reason, with the `count` skipped since the last line (`id` the latest)";
    ];
}
