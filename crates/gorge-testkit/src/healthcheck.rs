//! The failure messages of the `healthcheck` subcommand both services share (it lives in
//! gorge-service): each binary's tests check them through their own way of naming the port.

use crate::{Receiver, RefusedPort};

/// What `healthcheck` must do with a configuration it cannot use instead of probing a
/// default port: exit 1 with one line `healthcheck: invalid configuration: …` that names
/// `culprit` (a setting or a value). `ran` is `process::run_to_end`'s result.
pub fn assert_invalid_configuration(ran: (Option<i32>, String, String), culprit: &str) {
    let (code, _, text) = ran;
    assert_eq!((code, text.lines().count()), (Some(1), 1), "{text}");
    assert!(
        text.starts_with("healthcheck: invalid configuration: ") && text.contains(culprit),
        "{text}"
    );
}

/// What `healthcheck --port 0` must do: refuse the value (exit 1, nothing on stdout, one
/// line naming the valid range) instead of probing a port the kernel would pick. `ran` is
/// `process::run_to_end`'s result for that command.
pub fn assert_port_0_is_refused(ran: (Option<i32>, String, String)) {
    let (code, stdout, stderr) = ran;
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (
            Some(1),
            "",
            "healthcheck: --port 0 is not a port: expected 1-65535\n"
        )
    );
}

/// Runs `probe` (the binary's `healthcheck` aimed at 127.0.0.1:`port`, returning its exit
/// code and stderr) against a closed port and a server answering 503: both fail with one
/// line that names the URL and says why.
pub fn assert_failed_probes_say_why(probe: impl Fn(u16) -> (Option<i32>, String)) {
    let refused = RefusedPort::new();
    let closed = refused.port();
    let (code, text) = probe(closed);
    assert_eq!((code, text.lines().count()), (Some(1), 1), "{text}");
    let url = format!("http://127.0.0.1:{closed}/healthz");
    assert!(
        text.starts_with(&format!("healthcheck: {url}: cannot connect")),
        "{text}"
    );

    let unready = Receiver::start(503).port();
    let (code, text) = probe(unready);
    assert_eq!(code, Some(1), "{text}");
    let url = format!("http://127.0.0.1:{unready}/healthz");
    let answered = r#"GET /healthz answered "HTTP/1.1 503 Service Unavailable""#;
    assert_eq!(text.trim_end(), format!("healthcheck: {url}: {answered}"));
}
