//! The flat settings, each declared once (see `gorge_service::settings`): its key, its kind
//! (which decides how it parses, what the error says is valid and how it prints), its
//! default and its help, which is the docs table's "Meaning" (checked by a test). From this
//! list come the environment variable names, the Aphlict-file keys, the unknown-variable
//! warnings, `--check-config` and `--print-config`.

use gorge_hub::Limits;
use gorge_service::settings::{
    Bytes, Count, CountOrZero, Millis, Optional, Port, Seconds, SecondsOrZero, SecretUrl, Text,
};

gorge_service::number_kind!(
    /// A nice value to add to a thread's own (Linux's range tops at 19).
    Nice: i32, 0..=19, "a whole number from 0 to 19, e.g. 10"
);

gorge_service::settings! {
    /// The flat settings' values.
    pub struct Settings, prefix "GORGE_NOTIFICATION_", keys SettingKeys {
        #[env_only]
        config_file: Optional<Text> = None,
            "Aphlict-format JSON file (same as `--config`, which wins when both are given)";
        #[doc_default("`22280`")]
        client_port: Optional<Port> = None,
            "WebSocket port; overrides the port of every `client` server of the file";
        #[doc_default("`22281`")]
        admin_port: Optional<Port> = None,
            "Admin/health port; overrides every `admin` server of the file";
        listen_addr: Optional<Text> = None,
            "IP address (host only) for every server, overriding each one's `listen`; \
             `CLIENT_LISTEN_ADDR` / `ADMIN_LISTEN_ADDR` win over it for their kind";
        #[doc_default("`0.0.0.0`")]
        client_listen_addr: Optional<Text> = None,
            "IP address (host only) of every `client` server, overriding its `listen`";
        #[doc_default("`127.0.0.1`")]
        admin_listen_addr: Optional<Text> = None,
            "IP address (host only) of every `admin` server, overriding its `listen`; the \
             admin port has no authentication, so its default is loopback (as Aphlict's)";
        #[env_only]
        client_tls_cert_file: Optional<Text> = None,
            "PEM certificate file: the `client` servers serve `wss://` (TLS), as the file's \
             `ssl.cert`; needs `CLIENT_TLS_KEY_FILE`. Re-read every 60 s and on SIGHUP";
        #[env_only]
        client_tls_key_file: Optional<Text> = None,
            "PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC) of `CLIENT_TLS_CERT_FILE`, as \
             `ssl.key`";
        #[env_only]
        client_tls_chain_file: Optional<Text> = None,
            "PEM intermediate certificates sent after `CLIENT_TLS_CERT_FILE`'s, as `ssl.chain`";
        #[env_only]
        admin_tls_cert_file: Optional<Text> = None,
            "PEM certificate file: the `admin` servers serve `https://`, as the file's \
             `ssl.cert`; needs `ADMIN_TLS_KEY_FILE` (Phorge's `notification.servers` entry \
             of type `admin` then says `\"protocol\": \"https\"`)";
        #[env_only]
        admin_tls_key_file: Optional<Text> = None,
            "PEM private key of `ADMIN_TLS_CERT_FILE`, as `ssl.key`";
        #[env_only]
        admin_tls_chain_file: Optional<Text> = None,
            "PEM intermediate certificates sent after `ADMIN_TLS_CERT_FILE`'s, as `ssl.chain`";
        peers: Optional<Text> = None,
            "Comma list of peer admin URLs `http://host:port` (or `https://`)";
        peer_dns: Optional<Text> = None,
            "`host:port`; `host` resolves to every peer pod (e.g. a Kubernetes headless Service)";
        peer_dns_refresh_seconds: Seconds = 10, "How often `PEER_DNS` is re-resolved";
        peer_ca_file: Optional<Text> = None,
            "PEM file of the CA certificate(s) that `https://` peers' certificates must chain \
             to, instead of the system's roots";
        peer_queue_capacity: Count = 1024,
            "Messages queued per peer before new ones are dropped (counted)";
        peer_timeout_ms: Millis = 5000, "Timeout of one relay POST";
        broker_url: Optional<SecretUrl> = None,
            "Broker mode (instead of peers): `redis://[user:pass@]host:port/db` or `rediss://` \
             (TLS) of a Redis ≥ 6.2 or Valkey; its password is masked by `--check-config` and \
             left out by `--print-config`";
        broker_password_file: Optional<Text> = None,
            "File holding the broker password (one line; wins over a password in the URL)";
        broker_ca_file: Optional<Text> = None,
            "PEM file of the CA certificate(s) that signed the broker's TLS certificate \
             (`rediss://` only); trusted instead of the system's roots";
        broker_prefix: Text = "gorge:notification".to_string(),
            "Prefix of the broker's keys (`<prefix>:stream`, `<prefix>:epoch`); one per Phorge \
             install sharing a Redis";
        broker_queue_capacity: Count = 4096,
            "Messages waiting to be published to the broker before new ones are dropped (counted)";
        max_frame_bytes: Bytes = 64 * 1024,
            "Largest inbound WebSocket frame/message; larger → close 1009";
        max_admin_body_bytes: Bytes = 1 << 20, "Largest admin POST body; larger → 413";
        inbound_frames_per_second: Count = 20,
            "Frames a socket may send per second on average (a browser sends a few per page); \
             over its budget → close 1008, counted";
        inbound_frames_burst: Count = 200,
            "Frames a socket may send at once before the per-second rate applies";
        inbound_bytes_per_second: Bytes = 64 * 1024,
            "Bytes a socket may send per second on average; over its budget → close 1008, \
             counted";
        inbound_bytes_burst: Bytes = 1 << 20,
            "Bytes a socket may send at once before the per-second rate applies; at least \
             `MAX_FRAME_BYTES`";
        client_worker_nice: Nice = 10,
            "Nice value added to the threads that serve browsers' sockets (0 to 19; 0: as \
             the process): under a flood of client sockets, PHP's admin port and the fan-out \
             thread get the CPU first. Needs no privilege";
        max_sockets: Count = hub().sockets as u64,
            "Open sockets per process; beyond → upgrade answered 503";
        max_subscriptions: Count = hub().subscriptions_per_socket as u64,
            "Subscriptions per socket; extra PHIDs ignored and counted";
        max_phid_bytes: Count = hub().phid_bytes as u64,
            "Longest PHID accepted in a subscription; longer ignored and counted";
        max_instances: Count = hub().instances as u64,
            "Slots per kind of instance (confirmed / anonymous, see *Instances* below); an \
             idle one of the same kind is forgotten to make room, else 503";
        max_instance_name_bytes: Count = hub().instance_name_bytes as u64,
            "Longest instance name (admin 400, client 400)";
        queue_frames: Count = hub().queue_frames as u64, "Per-socket send queue, frames";
        queue_bytes: Bytes = hub().queue_bytes as u64, "Per-socket send queue, bytes";
        history_entries: CountOrZero = hub().history_entries as u64,
            "Retained messages (all instances) for `replay`; `0` disables history";
        history_age_ms: Millis = hub().history_age_ms, "Retention age";
        history_bytes: Bytes = hub().history_bytes as u64, "Retained message bytes";
        ping_interval_seconds: Seconds = 30, "Server WebSocket ping interval";
        idle_timeout_seconds: Seconds = 75,
            "Close a socket with no inbound traffic (not even a pong) for this long; must \
             exceed the ping interval";
        drain_seconds: SecondsOrZero = 10,
            "Drain window on SIGTERM (the whole stop's bound: `stop_within_sec`, see Derived \
             facts)";
    }
}

/// The hub's own defaults, which the hub settings take.
fn hub() -> Limits {
    Limits::default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gorge_service::settings::Declared;

    #[test]
    fn every_setting_round_trips_through_text() {
        let defaults = Settings::default();
        let mut copy = Settings::default();
        for (info, text) in Settings::SETTINGS.iter().zip(defaults.shown()) {
            if text != gorge_service::settings::UNSET {
                copy.set_text(info.key, &text).unwrap();
            }
        }
        assert_eq!(copy, defaults);
    }
}
