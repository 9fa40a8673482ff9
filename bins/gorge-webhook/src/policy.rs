//! The outbound policy: which webhook URIs may be connected to, and to which addresses.
//!
//! Mirrors Phorge's `security.outbound-blacklist` check (`requireValidRemoteURIForFetch`):
//! only `http`/`https`, the host is resolved once, and *every* resolved address must be outside
//! the blacklist. The checked addresses are then pinned into the HTTP client (see
//! [`PinnedResolver`]) so no second DNS lookup can swap in a private address (DNS rebinding).

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::Duration;

use ipnet::IpNet;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// Phorge's default `security.outbound-blacklist`, verbatim.
pub const PHORGE_DEFAULT_BLACKLIST: &str = "0.0.0.0/8 10.0.0.0/8 100.64.0.0/10 127.0.0.0/8 \
169.254.0.0/16 172.16.0.0/12 192.0.0.0/24 192.0.2.0/24 192.88.99.0/24 192.168.0.0/16 \
198.18.0.0/15 198.51.100.0/24 203.0.113.0/24 224.0.0.0/4 240.0.0.0/4 255.255.255.255/32 ::/128 \
::1/128 ::ffff:0:0/96 100::/64 64:ff9b::/96 2001::/32 2001:10::/28 2001:20::/28 2001:db8::/32 \
2002::/16 fc00::/7 fe80::/10 ff00::/8";

/// The value that configures an empty blacklist.
pub const NO_BLACKLIST: &str = "none";

/// ureq keeps at most this many addresses from a resolver.
const MAX_PINNED_ADDRS: usize = 16;

/// A list of networks never to connect to.
#[derive(Debug, Clone)]
pub struct OutboundPolicy {
    blacklist: Vec<IpNet>,
}

/// Why a URI may not be fetched. Every variant except [`PolicyError::Unresolvable`] maps to
/// Phorge's `hook`/`uri` error; an unresolvable host is a transport failure (`dns`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// Not an absolute `http`/`https` URI with a host.
    InvalidUri,
    /// A resolved address is in the blacklist.
    Blocked(IpAddr),
    /// The host did not resolve (or not within the time left).
    Unresolvable,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::InvalidUri => f.write_str("not an http/https URI with a host"),
            PolicyError::Blocked(ip) => write!(f, "address {ip} is in the outbound blacklist"),
            PolicyError::Unresolvable => f.write_str("host did not resolve"),
        }
    }
}

/// A URI that passed the policy, with the exact addresses that were checked.
#[derive(Debug, Clone)]
pub struct CheckedTarget {
    pub uri: Uri,
    pub addrs: Vec<SocketAddr>,
}

impl OutboundPolicy {
    /// Parses CIDRs separated by commas and/or whitespace. A bare address is a single host;
    /// the word `none` is the empty list (an empty variable means "Phorge's default").
    /// Returns the first entry that does not parse.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut blacklist = Vec::new();
        if list.trim().eq_ignore_ascii_case(NO_BLACKLIST) {
            return Ok(Self { blacklist });
        }
        for entry in list
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
        {
            let net = entry
                .parse::<IpNet>()
                .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| entry.to_string())?;
            blacklist.push(net);
        }
        Ok(Self { blacklist })
    }

    /// Phorge's default blacklist.
    pub fn phorge_default() -> Self {
        Self::parse(PHORGE_DEFAULT_BLACKLIST).expect("the built-in blacklist parses")
    }

    /// Number of networks in the list (for `--check-config`).
    pub fn len(&self) -> usize {
        self.blacklist.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blacklist.is_empty()
    }

    /// Whether `ip` may not be connected to. IPv4-mapped IPv6 addresses are judged as the
    /// IPv4 address they carry, so `::ffff:10.0.0.1` is caught by `10.0.0.0/8`.
    pub fn is_blocked(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        self.blacklist.iter().any(|net| net.contains(&ip))
    }

    /// Checks a URI: scheme, then resolves the host once (bounded by `timeout`) and checks
    /// every address. Blocking: call it off the async runtime.
    pub fn check(&self, uri: &str, timeout: Duration) -> Result<CheckedTarget, PolicyError> {
        let uri: Uri = uri.trim().parse().map_err(|_| PolicyError::InvalidUri)?;
        let (host, port) = host_and_port(&uri).ok_or(PolicyError::InvalidUri)?;
        let addrs = resolve(&host, port, timeout)?;
        if let Some(bad) = addrs.iter().find(|a| self.is_blocked(a.ip())) {
            return Err(PolicyError::Blocked(bad.ip()));
        }
        Ok(CheckedTarget { uri, addrs })
    }
}

/// `(host, port)` of an absolute `http`/`https` URI; the host keeps IPv6 brackets.
fn host_and_port(uri: &Uri) -> Option<(String, u16)> {
    let default_port = match uri.scheme_str()? {
        s if s.eq_ignore_ascii_case("http") => 80,
        s if s.eq_ignore_ascii_case("https") => 443,
        _ => return None,
    };
    let authority = uri.authority()?;
    let host = authority.host();
    if host.is_empty() {
        return None;
    }
    Some((
        host.to_string(),
        authority.port_u16().unwrap_or(default_port),
    ))
}

/// Resolves on a helper thread so a hanging resolver cannot outlive the delivery timeout.
fn resolve(host: &str, port: u16, timeout: Duration) -> Result<Vec<SocketAddr>, PolicyError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let target = format!("{host}:{port}");
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("webhook-resolve".into())
        .spawn(move || {
            let _ = tx.send(target.to_socket_addrs().map(|it| it.collect::<Vec<_>>()));
        })
        .map_err(|_| PolicyError::Unresolvable)?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(addrs)) if !addrs.is_empty() => Ok(addrs),
        _ => Err(PolicyError::Unresolvable),
    }
}

/// A ureq resolver that answers only for the one authority it was built for, with the
/// addresses the policy already checked. Any other host is refused, so the client can never
/// connect anywhere the policy has not seen.
#[derive(Debug)]
pub struct PinnedResolver {
    host: String,
    port: u16,
    addrs: Vec<SocketAddr>,
}

impl PinnedResolver {
    pub fn new(target: &CheckedTarget) -> Option<Self> {
        let (host, port) = host_and_port(&target.uri)?;
        Some(Self {
            host,
            port,
            addrs: target.addrs.clone(),
        })
    }
}

impl Resolver for PinnedResolver {
    fn resolve(
        &self,
        uri: &Uri,
        _config: &ureq::config::Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        match host_and_port(uri) {
            Some((host, port)) if host.eq_ignore_ascii_case(&self.host) && port == self.port => {}
            _ => return Err(ureq::Error::HostNotFound),
        }
        let mut out = self.empty();
        for addr in self.addrs.iter().take(MAX_PINNED_ADDRS) {
            out.push(*addr);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn default_list_has_every_phorge_entry() {
        let policy = OutboundPolicy::phorge_default();
        assert_eq!(policy.len(), 29);
        for blocked in [
            "0.1.2.3",
            "10.1.1.1",
            "100.64.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "172.31.255.255",
            "192.0.0.5",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.19.0.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "250.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "100::1",
            "64:ff9b::1",
            "2001::1",
            "2001:10::1",
            "2001:20::1",
            "2001:db8::1",
            "2002::1",
            "fd00::1",
            "fe80::1",
            "ff02::1",
        ] {
            assert!(policy.is_blocked(ip(blocked)), "{blocked} must be blocked");
        }
        for allowed in ["8.8.8.8", "172.32.0.1", "2606:4700::1111", "100.128.0.1"] {
            assert!(!policy.is_blocked(ip(allowed)), "{allowed} must be allowed");
        }
    }

    #[test]
    fn ipv4_mapped_ipv6_is_judged_as_ipv4() {
        let policy = OutboundPolicy::parse("10.0.0.0/8").unwrap();
        assert!(policy.is_blocked(ip("::ffff:10.0.0.1")));
        assert!(!policy.is_blocked(ip("::ffff:8.8.8.8")));
    }

    #[test]
    fn parse_accepts_commas_and_whitespace_and_names_the_bad_entry() {
        let policy = OutboundPolicy::parse(" 10.0.0.0/8,\n192.168.0.0/16 ,  ::1 ").unwrap();
        assert_eq!(policy.len(), 3);
        assert!(policy.is_blocked(ip("::1")));
        assert!(OutboundPolicy::parse("").unwrap().is_empty());
        assert!(OutboundPolicy::parse(" None ").unwrap().is_empty());
        assert_eq!(
            OutboundPolicy::parse("10.0.0.0/8, 300.0.0.0/8").unwrap_err(),
            "300.0.0.0/8"
        );
    }

    #[test]
    fn check_rejects_other_schemes_and_blocked_addresses() {
        let policy = OutboundPolicy::phorge_default();
        let t = Duration::from_secs(2);
        assert_eq!(
            policy.check("ftp://example.com/", t).unwrap_err(),
            PolicyError::InvalidUri
        );
        assert_eq!(
            policy.check("not a uri", t).unwrap_err(),
            PolicyError::InvalidUri
        );
        assert_eq!(
            policy.check("http://127.0.0.1:9/hook", t).unwrap_err(),
            PolicyError::Blocked(ip("127.0.0.1"))
        );
        assert_eq!(
            policy.check("http://[::ffff:192.168.0.1]/", t).unwrap_err(),
            PolicyError::Blocked(ip("::ffff:192.168.0.1"))
        );
        // `localhost` resolves (possibly to several addresses); every one is loopback.
        assert!(matches!(
            policy.check("https://localhost/", t).unwrap_err(),
            PolicyError::Blocked(_)
        ));
    }

    #[test]
    fn check_pins_the_checked_addresses() {
        let policy = OutboundPolicy::parse("").unwrap();
        let target = policy
            .check("http://127.0.0.1:8080/x", Duration::from_secs(2))
            .unwrap();
        assert_eq!(target.addrs, vec!["127.0.0.1:8080".parse().unwrap()]);
        let resolver = PinnedResolver::new(&target).unwrap();
        let config = ureq::config::Config::default();
        let got = resolver
            .resolve(&target.uri, &config, NextTimeout::default())
            .unwrap();
        assert_eq!(got.to_vec(), target.addrs);
        let elsewhere: Uri = "http://127.0.0.2:8080/x".parse().unwrap();
        assert!(resolver
            .resolve(&elsewhere, &config, NextTimeout::default())
            .is_err());
    }
}
