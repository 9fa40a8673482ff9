//! The outbound policy: which webhook URIs may be connected to, and to which addresses.
//!
//! Mirrors Phorge's `security.outbound-blacklist` check (`requireValidRemoteURIForFetch`):
//! only `http`/`https`, the host is resolved once, and *every* resolved address must be outside
//! the blacklist. The checked addresses travel with the URI in a [`CheckedTarget`]; the
//! connector (`connector.rs`) dials only those and refuses any blacklisted address itself, so no
//! second DNS lookup (DNS rebinding) and no pooled connection can get past the policy.
//!
//! One resolver serves the hook URI and every redirect hop: [`Resolver`], the system's
//! (getaddrinfo on tokio's bounded blocking pool, abandoned after the time left).

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use url::{Host, Url};

/// Phorge's default `security.outbound-blacklist`, verbatim.
pub const PHORGE_DEFAULT_BLACKLIST: &str = "0.0.0.0/8 10.0.0.0/8 100.64.0.0/10 127.0.0.0/8 \
169.254.0.0/16 172.16.0.0/12 192.0.0.0/24 192.0.2.0/24 192.88.99.0/24 192.168.0.0/16 \
198.18.0.0/15 198.51.100.0/24 203.0.113.0/24 224.0.0.0/4 240.0.0.0/4 255.255.255.255/32 ::/128 \
::1/128 ::ffff:0:0/96 100::/64 64:ff9b::/96 2001::/32 2001:10::/28 2001:20::/28 2001:db8::/32 \
2002::/16 fc00::/7 fe80::/10 ff00::/8";

/// The value that configures an empty blacklist.
pub const NO_BLACKLIST: &str = "none";

/// Addresses of one lookup that are dialled, in order, until one connects (cURL tries them
/// all). Every resolved address is checked against the blacklist whatever their number;
/// beyond this many the rest are not dialled ([`CheckedTarget::not_dialled`], counted).
/// The bound keeps what one hook's DNS answer can make a delivery do finite: a UDP answer
/// of 4 096 bytes (the largest EDNS size in common use) holds at most ~250 A records of 16
/// bytes, so only an answer that came over TCP can reach it.
pub const MAX_DIALLED_ADDRS: usize = 256;

/// A list of networks never to connect to, and the resolver that finds the addresses to
/// check.
#[derive(Debug, Clone)]
pub struct OutboundPolicy {
    blacklist: Vec<IpNet>,
    resolver: Resolver,
}

/// Where host names are looked up.
#[derive(Debug, Clone, Default)]
pub enum Resolver {
    /// The system resolver (getaddrinfo: `/etc/hosts`, DNS).
    #[default]
    System,
    /// A fixed table of names and their addresses, in order (cURL's `--resolve`); a name not
    /// in it does not resolve. Lets tests give a name more addresses than loopback DNS can.
    Fixed(Arc<HashMap<String, Vec<IpAddr>>>),
}

impl Resolver {
    /// The addresses of `host`, within `timeout`.
    async fn lookup(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<Vec<SocketAddr>, PolicyError> {
        let addrs: Vec<SocketAddr> = match self {
            Resolver::System => {
                let lookup = tokio::net::lookup_host((host, port));
                match tokio::time::timeout(timeout, lookup).await {
                    Ok(Ok(addrs)) => addrs.collect(),
                    _ => return Err(PolicyError::Unresolvable),
                }
            }
            Resolver::Fixed(table) => table
                .get(host)
                .into_iter()
                .flatten()
                .map(|ip| SocketAddr::new(*ip, port))
                .collect(),
        };
        if addrs.is_empty() {
            return Err(PolicyError::Unresolvable);
        }
        Ok(addrs)
    }
}

/// Why a URI may not be fetched. Every variant except [`PolicyError::Unresolvable`] maps to
/// Phorge's `hook`/`uri` error; an unresolvable host is a transport failure (`dns`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// Not an absolute `http`/`https` URI with a host and a valid port (1–65535).
    InvalidUri,
    /// A resolved address is in the blacklist.
    Blocked(IpAddr),
    /// The host did not resolve (or not within the time left).
    Unresolvable,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::InvalidUri => {
                f.write_str("not an http/https URI with a host and a valid port")
            }
            // Names the setting: the operator's fix is there (or in the hook's URI).
            PolicyError::Blocked(ip) => write!(
                f,
                "address {ip} is in the outbound blacklist (GORGE_WEBHOOK_OUTBOUND_BLACKLIST, \
                 Phorge's security.outbound-blacklist)"
            ),
            PolicyError::Unresolvable => f.write_str("host did not resolve"),
        }
    }
}

/// A URI that passed the policy, with the exact addresses that were checked and may be
/// dialled.
#[derive(Debug, Clone)]
pub struct CheckedTarget {
    pub uri: Url,
    pub addrs: Vec<SocketAddr>,
    /// Resolved (and checked) addresses beyond [`MAX_DIALLED_ADDRS`], not kept.
    pub not_dialled: usize,
}

impl OutboundPolicy {
    /// Parses CIDRs separated by commas and/or whitespace. A bare address is a single host;
    /// the word `none` is the empty list (an empty variable means "Phorge's default").
    /// Returns the first entry that does not parse.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut blacklist = Vec::new();
        if list.trim().eq_ignore_ascii_case(NO_BLACKLIST) {
            return Ok(Self {
                blacklist,
                resolver: Resolver::default(),
            });
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
        Ok(Self {
            blacklist,
            resolver: Resolver::default(),
        })
    }

    /// The same list, looking names up with `resolver`.
    pub fn with_resolver(self, resolver: Resolver) -> Self {
        Self { resolver, ..self }
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

    /// Checks a URI: scheme and port, then resolves the host once (bounded by `timeout`) and
    /// checks every address.
    pub async fn check(&self, uri: &str, timeout: Duration) -> Result<CheckedTarget, PolicyError> {
        self.check_url(parse_uri(uri)?, timeout).await
    }

    /// [`OutboundPolicy::check`] for an already parsed URI (a redirect hop).
    pub async fn check_url(
        &self,
        uri: Url,
        timeout: Duration,
    ) -> Result<CheckedTarget, PolicyError> {
        let (host, port) = host_and_port(&uri).ok_or(PolicyError::InvalidUri)?;
        let mut addrs = match literal_addr(&uri, port) {
            Some(addr) => vec![addr],
            None => self.resolver.lookup(&host, port, timeout).await?,
        };
        if let Some(bad) = addrs.iter().find(|a| self.is_blocked(a.ip())) {
            return Err(PolicyError::Blocked(bad.ip()));
        }
        let not_dialled = addrs.len().saturating_sub(MAX_DIALLED_ADDRS);
        addrs.truncate(MAX_DIALLED_ADDRS);
        Ok(CheckedTarget {
            uri,
            addrs,
            not_dialled,
        })
    }
}

/// Parses a hook URI. `url` refuses ports above 65535 (`http` would quietly use port 80 for
/// `:65536`); port 0 cannot be connected to either.
fn parse_uri(uri: &str) -> Result<Url, PolicyError> {
    let uri = Url::parse(uri.trim()).map_err(|_| PolicyError::InvalidUri)?;
    if !matches!(uri.scheme(), "http" | "https") || uri.port() == Some(0) {
        return Err(PolicyError::InvalidUri);
    }
    Ok(uri)
}

/// `(host, port)` of an absolute `http`/`https` URI; the host without IPv6 brackets.
fn host_and_port(uri: &Url) -> Option<(String, u16)> {
    if !matches!(uri.scheme(), "http" | "https") {
        return None;
    }
    let host = match uri.host()? {
        Host::Domain(name) if !name.is_empty() => name.to_string(),
        Host::Domain(_) => return None,
        Host::Ipv4(ip) => ip.to_string(),
        Host::Ipv6(ip) => ip.to_string(),
    };
    Some((host, uri.port_or_known_default()?))
}

/// The address of a URI whose host is an IP literal: nothing to resolve.
fn literal_addr(uri: &Url, port: u16) -> Option<SocketAddr> {
    match uri.host()? {
        Host::Ipv4(ip) => Some(SocketAddr::new(IpAddr::V4(ip), port)),
        Host::Ipv6(ip) => Some(SocketAddr::new(IpAddr::V6(ip), port)),
        Host::Domain(_) => None,
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

    #[tokio::test]
    async fn check_rejects_other_schemes_and_blocked_addresses() {
        let policy = OutboundPolicy::phorge_default();
        let t = Duration::from_secs(2);
        assert_eq!(
            policy.check("ftp://example.com/", t).await.unwrap_err(),
            PolicyError::InvalidUri
        );
        assert_eq!(
            policy.check("not a uri", t).await.unwrap_err(),
            PolicyError::InvalidUri
        );
        assert_eq!(
            policy
                .check("http://127.0.0.1:9/hook", t)
                .await
                .unwrap_err(),
            PolicyError::Blocked(ip("127.0.0.1"))
        );
        assert_eq!(
            policy
                .check("http://[::ffff:192.168.0.1]/", t)
                .await
                .unwrap_err(),
            PolicyError::Blocked(ip("::ffff:192.168.0.1"))
        );
        // `localhost` resolves (possibly to several addresses); every one is loopback.
        assert!(matches!(
            policy.check("https://localhost/", t).await.unwrap_err(),
            PolicyError::Blocked(_)
        ));
        // WEBHOOK_POLICY_BLOCKED's reason names the setting that decides.
        assert_eq!(
            PolicyError::Blocked(ip("10.1.2.3")).to_string(),
            "address 10.1.2.3 is in the outbound blacklist (GORGE_WEBHOOK_OUTBOUND_BLACKLIST, \
             Phorge's security.outbound-blacklist)"
        );
    }

    #[tokio::test]
    async fn check_pins_the_checked_addresses() {
        let policy = OutboundPolicy::parse("").unwrap();
        let target = policy
            .check("http://127.0.0.1:8080/x", Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(target.addrs, vec!["127.0.0.1:8080".parse().unwrap()]);
        let target = policy
            .check("https://[::1]/x", Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(target.addrs, vec!["[::1]:443".parse().unwrap()]);
    }

    #[tokio::test]
    async fn invalid_ports_are_invalid_uris() {
        // Out-of-range ports are invalid URIs, not "no port" (which would deliver to port 80).
        let policy = OutboundPolicy::parse("").unwrap();
        let t = Duration::from_secs(2);
        for uri in [
            "http://127.0.0.1:65536/",
            "http://127.0.0.1:99999/",
            "http://127.0.0.1:0/",
            "http://127.0.0.1:-1/",
            "http://127.0.0.1:8o/",
        ] {
            assert_eq!(
                policy.check(uri, t).await.unwrap_err(),
                PolicyError::InvalidUri,
                "{uri}"
            );
        }
        assert_eq!(
            policy
                .check("http://127.0.0.1:65535/", t)
                .await
                .unwrap()
                .addrs,
            vec!["127.0.0.1:65535".parse().unwrap()]
        );
    }

    #[tokio::test]
    async fn the_system_resolver_finds_localhost() {
        let t = Duration::from_secs(2);
        let target = OutboundPolicy::parse("")
            .unwrap()
            .check("http://localhost:9/", t)
            .await
            .unwrap();
        assert!(target
            .addrs
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 9));
        assert_eq!(
            OutboundPolicy::parse("")
                .unwrap()
                .check("http://no-such-host.invalid/", t)
                .await
                .unwrap_err(),
            PolicyError::Unresolvable
        );
    }

    fn fixed(name: &str, ips: Vec<IpAddr>) -> Resolver {
        Resolver::Fixed(Arc::new(HashMap::from([(name.to_string(), ips)])))
    }

    #[tokio::test]
    async fn every_address_is_checked_and_at_most_the_bound_kept() {
        let t = Duration::from_secs(2);
        let many: Vec<IpAddr> = (0..MAX_DIALLED_ADDRS + 44)
            .map(|i| IpAddr::from([8, 8, (i / 256) as u8, (i % 256) as u8]))
            .collect();
        let policy = OutboundPolicy::parse("10.0.0.0/8").unwrap();
        let target = policy
            .clone()
            .with_resolver(fixed("many.test", many.clone()))
            .check("http://many.test/", t)
            .await
            .unwrap();
        assert_eq!(target.addrs.len(), MAX_DIALLED_ADDRS);
        assert_eq!(target.addrs[0], SocketAddr::new(many[0], 80));
        assert_eq!(target.not_dialled, 44);
        // A blocked address past the bound still blocks the URI.
        let mut last_blocked = many;
        last_blocked.push(ip("10.1.2.3"));
        assert_eq!(
            policy
                .with_resolver(fixed("many.test", last_blocked))
                .check("http://many.test/", t)
                .await
                .unwrap_err(),
            PolicyError::Blocked(ip("10.1.2.3"))
        );
    }
}
