//! Peer admin URLs: `http://host:port` from `GORGE_NOTIFICATION_PEERS`, `{host, port,
//! protocol}` from the file's `cluster[]`, and `host:port` splitting shared with peer DNS.

use std::fmt;

use gorge_service::ConfigError;

/// How a peer's admin port is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerProtocol {
    Http,
    Https,
}

impl PeerProtocol {
    pub fn parse(text: &str) -> Option<PeerProtocol> {
        match text {
            "http" => Some(PeerProtocol::Http),
            "https" => Some(PeerProtocol::Https),
            _ => None,
        }
    }
}

impl fmt::Display for PeerProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerProtocol::Http => "http",
            PeerProtocol::Https => "https",
        })
    }
}

/// A peer's admin port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerUrl {
    pub protocol: PeerProtocol,
    pub host: String,
    pub port: u16,
}

impl fmt::Display for PeerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}://[{}]:{}", self.protocol, self.host, self.port)
        } else {
            write!(f, "{}://{}:{}", self.protocol, self.host, self.port)
        }
    }
}

/// Parses `http://host:port` (a trailing `/` is allowed; nothing else after the port).
pub fn parse_peer_url(key: &str, text: &str) -> Result<PeerUrl, ConfigError> {
    let bad = |reason: &str| ConfigError::new(key, text, reason.to_string());
    let (protocol, rest) = if let Some(rest) = text.strip_prefix("http://") {
        (PeerProtocol::Http, rest)
    } else if let Some(rest) = text.strip_prefix("https://") {
        (PeerProtocol::Https, rest)
    } else {
        return Err(bad("expected a peer URL starting with http:// or https://"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    // A path would otherwise be blamed on the port (`22281/path` is no number).
    if let Some(at) = rest.find(['/', '?', '#']) {
        if split_host_port(&rest[..at]).is_some() {
            return Err(bad(&format!(
                "a peer URL has no path or query: expected http://host:port (gorge posts to \
                 the peer's admin port at /, as Aphlict does); remove {:?}",
                &rest[at..]
            )));
        }
    }
    let (host, port) =
        split_host_port(rest).ok_or_else(|| bad("expected a peer URL http://host:port"))?;
    let port = parse_port_text(port).ok_or_else(|| bad("expected a port number 1-65535"))?;
    Ok(PeerUrl {
        protocol,
        host,
        port,
    })
}

pub fn parse_port_text(text: &str) -> Option<u16> {
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

/// Splits `host:port` or `[v6]:port`; the host must be non-empty and free of `/`, `@`, `?`.
pub fn split_host_port(text: &str) -> Option<(String, &str)> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':')?)
    } else {
        text.rsplit_once(':')?
    };
    let bad_char =
        |c: char| matches!(c, '/' | '@' | '?' | '#' | ' ') || (c == ':' && !text.starts_with('['));
    if host.is_empty() || host.contains(bad_char) {
        return None;
    }
    Some((host.to_string(), port))
}
