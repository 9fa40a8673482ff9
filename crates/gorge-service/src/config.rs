//! Configuration helpers both services share: errors reduced to one line naming the key and
//! the bad value in plain words, exit code 2, did-you-mean suggestions, Kubernetes service
//! links, the one `--check-config` format (value and source of each setting), and a
//! [`Secret`] string that never prints itself. The settings themselves are declared with
//! [`crate::settings`].

use std::fmt;

/// Exit code for an invalid configuration (distinct from 1, a runtime failure).
pub const CONFIG_EXIT_CODE: i32 = 2;

/// Reads one environment variable, treating unset and empty the same way.
pub fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// An invalid setting: which key, what value, and why. Displays as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The setting as the operator knows it (an environment variable, a file key, an option).
    pub key: String,
    /// The value as given (masked for secrets by the caller).
    pub value: String,
    /// What was expected instead, in plain words.
    pub reason: String,
}

impl ConfigError {
    /// An error for `key` set to `value`, refused because of `reason`.
    pub fn new(key: impl Into<String>, value: impl ToString, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The value is printed escaped so that a stray newline cannot split the line.
        write!(
            f,
            "invalid configuration: {}={:?}: {}",
            self.key, self.value, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

/// Where an effective value came from, as `--check-config` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// No file, variable or option set it.
    Default,
    /// The configuration file (its path).
    File(String),
    /// An environment variable (its name).
    Env(String),
    /// A command-line option (its name, e.g. `--config`).
    Option(String),
    /// Derived from settings (`crate::derived`): how, when that fits on the line (a formula).
    Derived(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(path) => write!(f, "file {path}"),
            Source::Env(var) => write!(f, "env {var}"),
            Source::Option(name) => write!(f, "option {name}"),
            Source::Derived(how) if how.is_empty() => f.write_str("derived"),
            Source::Derived(how) => write!(f, "derived: {how}"),
        }
    }
}

/// One line of `--check-config`: the setting's name, its effective value, its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckLine {
    /// The setting's name (an environment variable name, or a file key where there is none).
    pub name: String,
    /// The effective value as printed (secrets masked).
    pub value: String,
    /// Where the value came from.
    pub source: Source,
}

/// The `--check-config` text both services print: `NAME = VALUE  # SOURCE` per setting,
/// names aligned, then one `warning: …` line per warning.
pub fn check_config_text(lines: &[CheckLine], warnings: &[String]) -> String {
    let width = lines.iter().map(|l| l.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for line in lines {
        out.push_str(&format!(
            "{:width$} = {}  # {}\n",
            line.name, line.value, line.source
        ));
    }
    for warning in warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}

/// A known name within a few edits of `name` (a typo), if any; else the longest known name
/// `name` ends with after an underscore: the variable's spelling in a file
/// (`gorge_listen_addr`, `GORGE_NOTIFICATION_CLIENT_PORT`) names the file key at its end.
pub fn did_you_mean<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    let known: Vec<&str> = known.into_iter().collect();
    let typo = known
        .iter()
        .map(|k| (strsim::levenshtein(&name, &k.to_ascii_lowercase()), *k))
        .filter(|(distance, k)| *distance <= 2.max(k.len() / 5))
        .min()
        .map(|(_, k)| k);
    typo.or_else(|| {
        known
            .iter()
            .filter(|k| name.ends_with(&format!("_{}", k.to_ascii_lowercase())))
            .max_by_key(|k| k.len())
            .copied()
    })
}

/// `unknown key (did you mean `x`?)` or `unknown key`.
pub fn unknown_key_reason<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    match did_you_mean(name, known) {
        Some(near) => format!("unknown key (did you mean `{near}`?)"),
        None => "unknown key".to_string(),
    }
}

/// Whether `var` (with `value`) is one Kubernetes injects for a Service (service links):
/// `X_SERVICE_HOST`, `X_SERVICE_PORT[_NAME]`, `X_PORT=tcp://…`, `X_PORT_<n>_<PROTO>[_…]`.
pub fn is_service_link(var: &str, value: &str) -> bool {
    if var.ends_with("_SERVICE_HOST") || var.contains("_SERVICE_PORT") {
        return true;
    }
    if service_link_target(value).is_some() {
        return true;
    }
    var.split("_PORT_").nth(1).is_some_and(|rest| {
        let mut parts = rest.split('_');
        parts.next().is_some_and(|p| p.parse::<u16>().is_ok())
            && parts
                .next()
                .is_some_and(|p| matches!(p, "TCP" | "UDP" | "SCTP"))
    })
}

/// `tcp://10.0.0.1:22281` → `Some("10.0.0.1:22281")`: what a service link's value looks like.
pub fn service_link_target(value: &str) -> Option<&str> {
    ["tcp://", "udp://", "sctp://"]
        .iter()
        .find_map(|scheme| value.strip_prefix(scheme))
}

/// The reason for a setting whose value is a Kubernetes service link: Kubernetes injects
/// `<SERVICE>_PORT=tcp://ip:port` for every Service in the namespace, so a Service named
/// like the setting (`gorge-notification-admin` → `GORGE_NOTIFICATION_ADMIN_PORT`) sets it.
pub fn service_link_reason(var: &str) -> String {
    let service = var
        .strip_suffix("_PORT")
        .map(|name| {
            format!(
                " for a Service named {}",
                name.to_lowercase().replace('_', "-")
            )
        })
        .unwrap_or_default();
    format!(
        "a Kubernetes service link, not a value set here: Kubernetes injects this variable{service}; \
         set enableServiceLinks: false on the pod or set {var} explicitly"
    )
}

/// Refuses `value` of the setting variable `var` when it is a Kubernetes service link
/// (`tcp://…`), with [`service_link_reason`].
pub fn refuse_service_link(var: &str, value: &str) -> Result<(), ConfigError> {
    match service_link_target(value) {
        Some(_) => Err(ConfigError::new(var, value, service_link_reason(var))),
        None => Ok(()),
    }
}

/// Prints the error as one line on stderr and exits with [`CONFIG_EXIT_CODE`].
pub fn exit_config_error(err: &ConfigError) -> ! {
    eprintln!("{err}");
    std::process::exit(CONFIG_EXIT_CODE)
}

/// Where the password of `url` is (`scheme://user:PASSWORD@host…`), if it has one; `None`
/// also when `url` is not shaped like a URL.
fn url_password(url: &str) -> Option<std::ops::Range<usize>> {
    let start = url.find("://")? + 3;
    let authority = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |end| start + end);
    let at = start + url[start..authority].rfind('@')?;
    let colon = start + url[start..at].find(':')?;
    Some(colon + 1..at).filter(|password| !password.is_empty())
}

/// `url` with its password masked (`redis://user:********@host:6379/0`) and the rest as it
/// is. Text with an `@` that is not shaped like a URL is masked whole: it may be a password.
pub fn mask_url_password(url: &str) -> String {
    match url_password(url) {
        Some(password) => format!("{}********{}", &url[..password.start], &url[password.end..]),
        None if url.contains('@') && !url.contains("://") => mask_secret(url).to_string(),
        None => url.to_string(),
    }
}

/// `url` without its password (`redis://user@host:6379/0`; `redis://host` when no user is
/// left either), for a file that must not hold it.
pub fn without_url_password(url: &str) -> String {
    match url_password(url) {
        Some(password) => {
            let user_start = url.find("://").map_or(0, |i| i + 3);
            // The colon before the password goes too, and the `@` when no user is left.
            let (cut_start, cut_end) = match password.start - 1 == user_start {
                true => (user_start, password.end + 1),
                false => (password.start - 1, password.end),
            };
            format!("{}{}", &url[..cut_start], &url[cut_end..])
        }
        None if url.contains('@') && !url.contains("://") => String::new(),
        None => url.to_string(),
    }
}

/// What to print in place of a secret: whether it is set, never what it is.
pub fn mask_secret(secret: &str) -> &'static str {
    if secret.is_empty() {
        "(empty)"
    } else {
        "********"
    }
}

/// A string setting that must never appear in logs or printed configuration. `Debug`,
/// `Display` and slog serialization all print the mask; only [`Secret::expose`] reveals it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value read from configuration.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for the one place that needs it (a password sent to MySQL, a token
    /// compared in constant time).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no secret is set (for a token: authentication is off).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(mask_secret(&self.0))
    }
}

impl slog::Value for Secret {
    fn serialize(
        &self,
        _record: &slog::Record<'_>,
        key: slog::Key,
        serializer: &mut dyn slog::Serializer,
    ) -> slog::Result {
        serializer.emit_str(key, mask_secret(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_one_line_with_the_value_escaped() {
        let err = ConfigError::new("X_PORT", "1\n2", "expected a port number 1-65535");
        assert_eq!(
            err.to_string(),
            "invalid configuration: X_PORT=\"1\\n2\": expected a port number 1-65535"
        );
    }

    #[test]
    fn service_links_and_typos() {
        assert!(is_service_link("X_PORT", "tcp://10.0.0.1:80"));
        assert!(is_service_link("X_PORT_80_TCP_ADDR", "10.0.0.1"));
        assert!(is_service_link("X_ADMIN_SERVICE_PORT_HTTP", "80"));
        assert!(!is_service_link("X_CLIENT_PROT", "22280"));
        assert_eq!(
            did_you_mean(
                "GORGE_X_CLIENT_PROT",
                ["GORGE_X_CLIENT_PORT", "GORGE_X_PEERS"]
            ),
            Some("GORGE_X_CLIENT_PORT")
        );
        assert_eq!(did_you_mean("port", ["mysql_port_number"]), None);
    }

    #[test]
    fn check_config_lines_show_value_and_source() {
        let text = check_config_text(
            &[
                CheckLine {
                    name: "A_PORT".into(),
                    value: "1".into(),
                    source: Source::Default,
                },
                CheckLine {
                    name: "A_LONGER".into(),
                    value: "x".into(),
                    source: Source::Env("A_LONGER".into()),
                },
            ],
            &["careful".into()],
        );
        assert_eq!(
            text,
            "A_PORT   = 1  # default\nA_LONGER = x  # env A_LONGER\nwarning: careful\n"
        );
    }

    #[test]
    fn a_variable_spelt_in_a_file_suggests_the_file_key() {
        let keys = ["listen_addr", "client_listen_addr", "client_port", "peers"];
        assert_eq!(did_you_mean("gorge_listen_addr", keys), Some("listen_addr"));
        assert_eq!(
            did_you_mean("GORGE_NOTIFICATION_CLIENT_PORT", keys),
            Some("client_port")
        );
        assert_eq!(
            did_you_mean("gorge_notification_client_listen_addr", keys),
            Some("client_listen_addr")
        );
        assert_eq!(did_you_mean("listen", keys), None);
        assert_eq!(did_you_mean("xpeers", keys), Some("peers"));
        assert_eq!(
            unknown_key_reason("gorge_listen_addr", keys),
            "unknown key (did you mean `listen_addr`?)"
        );
    }

    #[test]
    fn only_the_password_of_a_url_is_masked() {
        let cases = [
            // (URL, shown, in a file)
            (
                "redis://redis:6379/0",
                "redis://redis:6379/0",
                "redis://redis:6379/0",
            ),
            (
                "rediss://user:hunter2@redis:6380/2",
                "rediss://user:********@redis:6380/2",
                "rediss://user@redis:6380/2",
            ),
            (
                "redis://:hunter2@redis",
                "redis://:********@redis",
                "redis://redis",
            ),
            (
                "redis://user@redis/0",
                "redis://user@redis/0",
                "redis://user@redis/0",
            ),
            (
                "redis://u:p@ss@redis/0?x=a@b",
                "redis://u:********@redis/0?x=a@b",
                "redis://u@redis/0?x=a@b",
            ),
            ("user:hunter2@redis", "********", ""),
            ("", "", ""),
        ];
        for (url, shown, file) in cases {
            assert_eq!(mask_url_password(url), shown, "{url}");
            assert_eq!(without_url_password(url), file, "{url}");
        }
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret} {secret:?}"), "******** ********");
        assert_eq!(Secret::default().to_string(), "(empty)");
        assert_eq!(secret.expose(), "hunter2");
    }
}
