//! The operator's checks of a running server, as subcommands of the binary (the VM and
//! Compose counterparts of `bin/aphlict status` and of Phorge's notification-servers page):
//!
//! - [`selftest`]: a WebSocket subscribes on the client port, a message is posted to the
//!   admin port as PHP posts it, the frame must arrive; then `/status/`;
//! - [`status`]: listeners, readiness, sockets, instances and peers, read from the admin
//!   port (`/status/`, `/readyz`, `/metrics`: `/status/` itself stays exactly Aphlict's).
//!
//! This file holds what both share: where the server is (the configuration the service
//! reads, or `--admin`/`--client` URLs) and one blocking HTTP client with a timeout.

pub mod selftest;
pub mod status;

use std::time::Duration;

use gorge_service::healthcheck::probe_target;
use gorge_service::ConfigError;

use crate::config::{Config, ServerKind};

/// Bound on every connection, request and wait of a check.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Longest answer body read (a `/metrics` of 64 peers fits many times over).
const BODY_LIMIT: u64 = 4 * 1024 * 1024;

/// Where the checks reach the server, and the instance they look at.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// The admin port's base URL (default: the configured admin server, wildcard addresses
    /// on loopback), e.g. http://127.0.0.1:22281.
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
    /// The client port's WebSocket URL (default: the configured client server), e.g.
    /// ws://127.0.0.1:22280/ or, through a proxy, ws://phorge.example.com/ws/.
    #[arg(long, value_name = "URL")]
    pub client: Option<String>,
    /// The instance, as Phorge's cluster.instance (default: none, i.e. `default`).
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub instance: String,
}

/// The resolved targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Targets {
    /// `http://host:port`, no trailing slash.
    pub admin: String,
    /// `ws://host:port/path/` (ending in `/`), before the instance is added.
    pub client: String,
    pub instance: String,
    /// Verify `https://` and `wss://` certificates: only when both URLs were given. A
    /// configured target is this host's own server on a loopback address, which its
    /// certificate (for the public name) does not name.
    pub verify_tls: bool,
}

impl Targets {
    /// From the arguments, falling back to the first configured admin and client servers.
    pub fn resolve(args: &TargetArgs, config: &Config) -> Result<Targets, ConfigError> {
        let configured = |kind: ServerKind| {
            config
                .servers
                .iter()
                .find(|s| s.kind == kind)
                .map(|s| (probe_target(s.addr), s.tls.files().is_some()))
        };
        let admin = match &args.admin {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => configured(ServerKind::Admin)
                .map(|(addr, tls)| format!("{}://{addr}", if tls { "https" } else { "http" }))
                .ok_or_else(|| {
                    ConfigError::new("servers", "", "no admin server: pass --admin URL")
                })?,
        };
        let client = match &args.client {
            Some(url) if url.ends_with('/') => url.clone(),
            Some(url) => format!("{url}/"),
            None => configured(ServerKind::Client)
                .map(|(addr, tls)| format!("{}://{addr}/", if tls { "wss" } else { "ws" }))
                .ok_or_else(|| {
                    ConfigError::new("servers", "", "no client server: pass --client URL")
                })?,
        };
        Ok(Targets {
            admin,
            client,
            instance: args.instance.clone(),
            verify_tls: args.admin.is_some() && args.client.is_some(),
        })
    }

    /// `path` on the admin port with the `instance` query Phorge adds for a named instance.
    pub fn admin_url(&self, path: &str) -> String {
        if self.instance == "default" {
            format!("{}{path}", self.admin)
        } else {
            let query: String = form_urlencoded::Serializer::new(String::new())
                .append_pair("instance", &self.instance)
                .finish();
            format!("{}{path}?{query}", self.admin)
        }
    }

    /// The WebSocket URL browsers of the instance use (`…/~name/` for a named one).
    pub fn websocket_url(&self) -> String {
        if self.instance == "default" {
            self.client.clone()
        } else {
            format!("{}~{}/", self.client, self.instance)
        }
    }
}

/// One blocking HTTP client: a timeout on everything, no redirects, no proxy (the server is
/// an internal address), every status returned as an answer.
pub fn agent(targets: &Targets) -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .disable_verification(!targets.verify_tls)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_global(Some(TIMEOUT))
        .max_redirects(0)
        .http_status_as_error(false)
        .proxy(None)
        .user_agent(concat!("gorge-notification/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// An answer: status and body text.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// `GET url` (with `accept`), or why it failed.
pub fn get(agent: &ureq::Agent, url: &str, accept: &str) -> Result<Answer, String> {
    let response = agent.get(url).header("Accept", accept).call();
    answer(url, response)
}

/// `POST url` with `body` labelled as PHP's cURL labels it, or why it failed.
pub fn post_as_php(agent: &ureq::Agent, url: &str, body: &[u8]) -> Result<Answer, String> {
    let response = agent
        .post(url)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .send(body);
    answer(url, response)
}

fn answer(
    url: &str,
    response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<Answer, String> {
    let mut response = response.map_err(|err| format!("{url}: {err}"))?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(BODY_LIMIT)
        .read_to_string()
        .map_err(|err| format!("{url}: reading the answer: {err}"))?;
    Ok(Answer { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_carry_the_instance_as_phorge_builds_them() {
        let targets = Targets {
            admin: "http://127.0.0.1:22281".into(),
            client: "ws://127.0.0.1:22280/ws/".into(),
            instance: "default".into(),
            verify_tls: false,
        };
        assert_eq!(
            targets.admin_url("/status/"),
            "http://127.0.0.1:22281/status/"
        );
        assert_eq!(targets.websocket_url(), "ws://127.0.0.1:22280/ws/");
        let named = Targets {
            instance: "acme".into(),
            ..targets.clone()
        };
        assert_eq!(
            named.admin_url("/status/"),
            "http://127.0.0.1:22281/status/?instance=acme"
        );
        assert_eq!(named.websocket_url(), "ws://127.0.0.1:22280/ws/~acme/");
        // http_build_query's encoding, which the admin port decodes.
        let spaced = Targets {
            instance: "a b&c".into(),
            ..targets
        };
        assert_eq!(
            spaced.admin_url("/"),
            "http://127.0.0.1:22281/?instance=a+b%26c"
        );
    }
}
