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

/// What `healthcheck` must do with arguments it cannot use (`--port 0`, `--port 70000`, an
/// unknown option…): refuse them instead of probing anything, exit 1 (never 2, which Docker
/// reserves for a HEALTHCHECK command) with nothing on stdout and one line `healthcheck: …`
/// on stderr; while a usage error of the service itself still exits 2. `run` runs the
/// binary with the given arguments (`process::run_to_end`).
pub fn assert_bad_arguments_are_refused(run: impl Fn(&[&str]) -> (Option<i32>, String, String)) {
    for port in ["0", "70000", "abc", ""] {
        assert_eq!(
            run(&["healthcheck", "--port", port]),
            (
                Some(1),
                String::new(),
                format!("healthcheck: --port {port} is not a port: expected 1-65535\n")
            ),
            "--port {port:?}"
        );
    }
    let usage = [
        (
            &["healthcheck", "--bogus"][..],
            "healthcheck: unexpected argument '--bogus' found (see healthcheck --help)\n",
        ),
        (
            &["--config", "x.json", "healthcheck", "--port"][..],
            "healthcheck: a value is required for '--port <PORT>' but none was supplied (see \
             healthcheck --help)\n",
        ),
    ];
    for (args, line) in usage {
        assert_eq!(
            run(args),
            (Some(1), String::new(), line.to_string()),
            "{args:?}"
        );
    }
    let (code, help, _) = run(&["healthcheck", "--help"]);
    assert_eq!(code, Some(0), "{help}");
    assert!(help.contains("--port <PORT>"), "{help}");
    let (code, _, stderr) = run(&["--bogus"]);
    assert_eq!(code, Some(2), "{stderr}");
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
