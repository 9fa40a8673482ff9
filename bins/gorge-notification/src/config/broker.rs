//! Broker mode's settings (docs/notification.md, "Broker mode"): the Redis URL, parsed and
//! validated here at startup with the password and CA files, so that a URL the client would
//! refuse stops startup with one line instead of failing in the background later. The broker
//! itself ([`crate::broker`]) builds its client from a validated [`BrokerConfig`].

use gorge_service::config::Secret;
use gorge_service::ConfigError;
use redis::io::tcp::TcpSettings;
use redis::{Client, ConnectionInfo, IntoConnectionInfo, ProtocolVersion, TlsCertificates};

use gorge_service::settings::{Declared, Layered};

use super::{usize_of, Settings};

/// Broker mode (spec §8b): the Redis that carries messages between nodes and keeps history.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The URL as given (it may hold a password: printed masked).
    pub url: Secret,
    /// From `BROKER_PASSWORD_FILE`; wins over a password in the URL.
    pub password: Option<Secret>,
    /// From `BROKER_CA_FILE`: the PEM of the CA(s) a `rediss://` broker's certificate must
    /// chain to, instead of the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Keys are `<prefix>:stream` and `<prefix>:epoch`.
    pub prefix: String,
    /// Messages waiting to be published, at most.
    pub queue_capacity: usize,
}

impl BrokerConfig {
    /// The Redis client settings: the URL, with the password file's password.
    pub fn connection_info(&self) -> Result<ConnectionInfo, String> {
        let url = self.url.expose();
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err("must be a redis:// or rediss:// (TLS) URL".into());
        }
        let info = url
            .into_connection_info()
            .map_err(|e| format!("is not a valid Redis URL: {e}"))?;
        // Every call is one small request waiting for its answer: Nagle's algorithm would hold
        // a write back for the previous one's ACK, which the other side may delay (40 ms).
        let info = info.set_tcp_settings(TcpSettings::default().set_nodelay(true));
        Ok(match &self.password {
            Some(password) => {
                let redis = info
                    .redis_settings()
                    .clone()
                    .set_password(password.expose());
                info.set_redis_settings(redis)
            }
            None => info,
        })
    }

    /// The Redis client: with `BROKER_CA_FILE`, a `rediss://` connection verifies
    /// the server's certificate against that CA instead of the system's roots (a private CA
    /// is what most self-hosted and several managed Redis use).
    pub fn client(&self) -> Result<Client, String> {
        self.client_speaking(ProtocolVersion::RESP2)
    }

    /// [`Self::client`], speaking `protocol` (the reader's RESP3, for invalidation pushes).
    pub fn client_speaking(&self, protocol: ProtocolVersion) -> Result<Client, String> {
        let info = self.connection_info()?;
        let redis = info.redis_settings().clone().set_protocol(protocol);
        let info = info.set_redis_settings(redis);
        match &self.ca_pem {
            None => Client::open(info).map_err(|e| format!("is not a usable Redis URL: {e}")),
            Some(pem) => {
                if !pem
                    .windows(b"-----BEGIN CERTIFICATE-----".len())
                    .any(|w| w == b"-----BEGIN CERTIFICATE-----")
                {
                    return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
                }
                let certificates = TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                };
                Client::build_with_tls(info, certificates)
                    .map_err(|e| format!("is not a usable CA for the broker: {e}"))
            }
        }
    }
}

/// Broker mode's settings, validated: a `redis://` or `rediss://` URL the client accepts, a
/// readable password file, a usable prefix, and no peers (both would deliver every message).
/// Each error names the setting as the operator wrote it.
pub(super) fn broker_config(
    layered: &Layered<Settings>,
    has_peers: bool,
) -> Result<Option<BrokerConfig>, ConfigError> {
    let (settings, k) = (&layered.values, Settings::KEYS);
    let Some(url) = settings.broker_url.clone().filter(|url| !url.is_empty()) else {
        return Ok(None);
    };
    if has_peers {
        return Err(layered.refuse(
            k.broker_url,
            format!(
                "cannot be combined with peers ({}, {} or the file's cluster[]): both would \
                 deliver every message; use one",
                Settings::env_var(k.peers),
                Settings::env_var(k.peer_dns)
            ),
        ));
    }
    let password = match &settings.broker_password_file {
        Some(path) => {
            let refuse = |reason: String| layered.refuse(k.broker_password_file, reason);
            let text = std::fs::read_to_string(path)
                .map_err(|e| refuse(format!("cannot be read: {e}")))?;
            let line = text.trim_end_matches(['\r', '\n']);
            if line.is_empty() || line.contains('\n') {
                return Err(refuse("must hold one non-empty line".into()));
            }
            Some(Secret::new(line))
        }
        None => None,
    };
    let ca_pem = match &settings.broker_ca_file {
        Some(path) => {
            let refuse = |reason: String| layered.refuse(k.broker_ca_file, reason);
            let pem = std::fs::read(path).map_err(|e| refuse(format!("cannot be read: {e}")))?;
            if !url.expose().starts_with("rediss://") {
                return Err(refuse(format!(
                    "is only for a rediss:// (TLS) {}",
                    layered.name(k.broker_url)
                )));
            }
            Some(pem)
        }
        None => None,
    };
    let broker = BrokerConfig {
        url,
        password,
        ca_pem,
        prefix: settings.broker_prefix.trim().to_string(),
        queue_capacity: usize_of(settings.broker_queue_capacity),
    };
    if let Err(why) = broker.connection_info() {
        return Err(layered.refuse(k.broker_url, why));
    }
    // Only a CA can make the client unusable once the URL is valid: build it now with the
    // CA, so that a file that is no usable CA stops startup here.
    if settings.broker_ca_file.is_some() {
        if let Err(why) = broker.client() {
            return Err(layered.refuse(k.broker_ca_file, why));
        }
    }
    if broker.prefix.is_empty() || broker.prefix.contains(char::is_whitespace) {
        return Err(layered.refuse(
            k.broker_prefix,
            "must be non-empty, without spaces (e.g. gorge:notification)",
        ));
    }
    Ok(Some(broker))
}
