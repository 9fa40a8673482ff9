//! Configuration as an operator meets it: exit code 2 with one line naming the variable and
//! saying in plain words what is valid, the file's unknown keys, `--check-config` (value and
//! source of every setting), warnings, and `--print-config` output that loads back.

mod common;

use common::run_binary;
use gorge_testkit::check_config::{checked, warnings};

#[test]
fn invalid_configuration_exits_2_with_one_line_naming_the_variable() {
    for (key, value, needle) in [
        (
            "GORGE_WEBHOOK_POLL_INTERVAL_MS",
            "0",
            "GORGE_WEBHOOK_POLL_INTERVAL_MS=\"0\"",
        ),
        (
            "GORGE_WEBHOOK_POLL_INTERVAL_MS",
            "-5",
            "GORGE_WEBHOOK_POLL_INTERVAL_MS=\"-5\"",
        ),
        (
            "GORGE_WEBHOOK_MAX_CONCURRENT",
            "0",
            "GORGE_WEBHOOK_MAX_CONCURRENT=\"0\"",
        ),
        (
            "GORGE_WEBHOOK_MAX_CONCURRENT",
            "lots",
            "GORGE_WEBHOOK_MAX_CONCURRENT=\"lots\"",
        ),
        (
            "GORGE_WEBHOOK_ERROR_THRESHOLD",
            "0",
            "GORGE_WEBHOOK_ERROR_THRESHOLD=\"0\"",
        ),
        (
            "GORGE_WEBHOOK_MYSQL_PORT",
            "99999",
            "GORGE_WEBHOOK_MYSQL_PORT=\"99999\"",
        ),
        (
            "GORGE_WEBHOOK_OUTBOUND_BLACKLIST",
            "10.0.0.0/8, nonsense",
            "GORGE_WEBHOOK_OUTBOUND_BLACKLIST=\"nonsense\"",
        ),
        ("GORGE_LISTEN_ADDR", "8160", "GORGE_LISTEN_ADDR=\"8160\""),
        // Off loopback, an empty token would open /api/webhook/* to the network.
        (
            "GORGE_LISTEN_ADDR",
            "0.0.0.0:8160",
            "GORGE_SERVICE_TOKEN=\"\": empty while GORGE_LISTEN_ADDR=0.0.0.0:8160",
        ),
    ] {
        let (code, _, stderr) = run_binary(&[], &[(key, value)]);
        assert_eq!(code, Some(2), "{key}={value}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("invalid configuration: ") && stderr.contains(needle),
            "{key}={value}: {stderr}"
        );
    }
}

#[test]
fn check_config_prints_effective_values_with_secrets_masked() {
    let (code, stdout, stderr) = run_binary(
        &["--check-config"],
        &[
            ("GORGE_WEBHOOK_MYSQL_PASS", "hunter2"),
            ("GORGE_WEBHOOK_CLAIM_LEASE_SEC", "10"),
            ("GORGE_WEBHOOK_DELIVERY_TIMEOUT", "20"),
            // Empty means default.
            ("GORGE_WEBHOOK_POLL_INTERVAL_MS", ""),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stdout.contains("hunter2"), "{stdout}");
    for (name, value, source) in [
        (
            "GORGE_WEBHOOK_MYSQL_PASS",
            "********",
            "env GORGE_WEBHOOK_MYSQL_PASS",
        ),
        (
            "GORGE_WEBHOOK_CLAIM_LEASE_SEC",
            "25 (configured 10, raised to cover the delivery timeout)",
            "env GORGE_WEBHOOK_CLAIM_LEASE_SEC",
        ),
        ("GORGE_WEBHOOK_POLL_INTERVAL_MS", "1000", "default"),
        ("GORGE_WEBHOOK_NAMESPACE", "phabricator", "default"),
        ("GORGE_LISTEN_ADDR", "127.0.0.1:8160", "default"),
        // What follows from the settings, each fact on its line.
        ("database", "phabricator_herald", "derived"),
        ("outbound_networks", "29", "derived"),
        (
            "stop_within_sec",
            "50",
            "derived: max(CLAIM_LEASE_SEC, DELIVERY_TIMEOUT + 5) + 2 × MYSQL_QUERY_TIMEOUT_SEC + 5",
        ),
        ("GORGE_LOG_LEVEL", "info", "default"),
        (
            "GORGE_LOG_FORMAT",
            "json (stdout is not a terminal)",
            "default",
        ),
    ] {
        assert_eq!(
            checked(&stdout, name),
            (value.to_string(), source.to_string()),
            "{stdout}"
        );
    }
}

#[test]
fn config_file_is_layered_under_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("webhook.toml");
    std::fs::write(&path, "poll_interval_ms = 250\nmax_concurrent = 3\n").unwrap();
    let (code, stdout, stderr) = run_binary(
        &["--config", path.to_str().unwrap(), "--check-config"],
        &[("GORGE_WEBHOOK_MAX_CONCURRENT", "5")],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        checked(&stdout, "GORGE_WEBHOOK_POLL_INTERVAL_MS"),
        ("250".to_string(), format!("file {}", path.display()))
    );
    assert_eq!(
        checked(&stdout, "GORGE_WEBHOOK_MAX_CONCURRENT"),
        (
            "5".to_string(),
            "env GORGE_WEBHOOK_MAX_CONCURRENT".to_string()
        )
    );
}

#[test]
fn an_unknown_key_in_the_config_file_exits_2_naming_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("webhook.toml");
    std::fs::write(&typo, "max_concurrent = 3\npoll_intervall_ms = 50\n").unwrap();
    let (code, stdout, stderr) = run_binary(&["--config", typo.to_str().unwrap()], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!(
            "invalid configuration: poll_intervall_ms (in {})=\"50\": unknown key (did you mean `poll_interval_ms`?)\n",
            typo.display()
        )
    );
    // JSON files too, and a file that does not parse is one line as well.
    let json = dir.path().join("webhook.json");
    std::fs::write(&json, r#"{"mysql": {"host": "db"}}"#).unwrap();
    let (code, _, stderr) = run_binary(&["--config", json.to_str().unwrap()], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            concat!(
                r#"invalid configuration: mysql (in {})="{{\"host\":\"db\"}}": settings are flat keys, not tables: write `mysql_host`, `mysql_port`, `mysql_user`, `mysql_pass`, `mysql_socket`, `mysql_max_connections`, `mysql_max_lock_connections`, `mysql_query_timeout_sec` at the top level"#,
                "\n"
            ),
            json.display()
        )
    );
    std::fs::write(&typo, "poll_interval_ms = = 5\n").unwrap();
    let (code, _, stderr) = run_binary(&["--config", typo.to_str().unwrap()], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "invalid configuration: --config=\"{}\": TOML parse error at line 1",
            typo.display()
        )),
        "{stderr}"
    );
}

#[test]
fn kubernetes_service_link_variables_are_ignored_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("webhook.toml");
    std::fs::write(&path, "poll_interval_ms = 50\n").unwrap();
    // What Kubernetes service links inject for a Service named `gorge-webhook`.
    let (code, stdout, stderr) = run_binary(
        &["--config", path.to_str().unwrap(), "--check-config"],
        &[
            ("GORGE_WEBHOOK_SERVICE_HOST", "10.96.0.12"),
            ("GORGE_WEBHOOK_SERVICE_PORT", "8160"),
            ("GORGE_WEBHOOK_SERVICE_PORT_STATUS", "8160"),
            ("GORGE_WEBHOOK_PORT", "tcp://10.96.0.12:8160"),
            ("GORGE_WEBHOOK_PORT_8160_TCP", "tcp://10.96.0.12:8160"),
            ("GORGE_WEBHOOK_PORT_8160_TCP_PROTO", "tcp"),
            ("GORGE_WEBHOOK_PORT_8160_TCP_PORT", "8160"),
            ("GORGE_WEBHOOK_PORT_8160_TCP_ADDR", "10.96.0.12"),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        checked(&stdout, "GORGE_WEBHOOK_POLL_INTERVAL_MS").0,
        "50",
        "{stdout}"
    );
    assert!(!stdout.contains("warning:"), "{stdout}");
}

#[test]
fn plain_words_digit_only_strings_and_bounds() {
    for (key, value, reason) in [
        (
            "GORGE_WEBHOOK_MYSQL_PORT",
            "0",
            "expected a port number 1-65535",
        ),
        (
            "GORGE_WEBHOOK_MYSQL_PORT",
            "99999",
            "expected a port number 1-65535",
        ),
        (
            "GORGE_WEBHOOK_POLL_INTERVAL_MS",
            "soon",
            "expected a whole number of milliseconds from 1 to 86400000, e.g. 250",
        ),
        (
            "GORGE_WEBHOOK_RETRY_BACKOFF_SEC",
            "18446744073709551615",
            "expected a whole number of seconds from 0 to 86400",
        ),
        (
            "GORGE_WEBHOOK_MYSQL_PORT",
            "tcp://10.96.0.5:3306",
            "a Service named gorge-webhook-mysql",
        ),
        ("GORGE_LOG_LEVEL", "loud", "expected one of trace, debug"),
    ] {
        let (code, _, stderr) = run_binary(&["--check-config"], &[(key, value)]);
        assert_eq!(code, Some(2), "{key}={value}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("{key}={value:?}")) && stderr.contains(reason),
            "{key}={value}: {stderr}"
        );
        for rust_type in ["u16", "u64", "i64", "usize"] {
            assert!(!stderr.contains(rust_type), "{stderr}");
        }
    }
    // Digit-only values of string settings are strings.
    let (code, stdout, stderr) = run_binary(
        &["--check-config"],
        &[
            ("GORGE_WEBHOOK_MYSQL_USER", "1234"),
            ("GORGE_WEBHOOK_NAMESPACE", "123"),
            ("GORGE_WEBHOOK_MYSQL_HOST", "10"),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(checked(&stdout, "GORGE_WEBHOOK_MYSQL_USER").0, "1234");
    assert_eq!(checked(&stdout, "GORGE_WEBHOOK_NAMESPACE").0, "123");
    assert_eq!(checked(&stdout, "database").0, "123_herald");
}

#[test]
fn file_errors_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("webhook.toml");
    std::fs::write(&toml, "mysql_port = \"3306\"\n").unwrap();
    let (code, _, stderr) = run_binary(&["--config", toml.to_str().unwrap()], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "invalid configuration: mysql_port (in {})=\"3306\": expected a port number 1-65535: a number, not a string\n",
            toml.display()
        )
    );
    let yaml = dir.path().join("webhook.yaml");
    std::fs::write(&yaml, "mysql_port: 3306\n").unwrap();
    let (code, _, stderr) = run_binary(&["--config", yaml.to_str().unwrap()], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains(".toml or .json"), "{stderr}");
}

#[test]
fn unknown_variables_and_no_blacklist_are_warned_about() {
    let (code, stdout, stderr) = run_binary(
        &["--check-config"],
        &[
            ("GORGE_WEBHOOK_MYSQL_PASSWORD", "x"),
            ("GORGE_WEBHOOK_OUTBOUND_BLACKLIST", "none"),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let warnings = warnings(&stdout);
    assert_eq!(warnings.len(), 2, "{stdout}");
    assert!(
        warnings[0].contains(
            "GORGE_WEBHOOK_MYSQL_PASSWORD is not a setting (did you mean GORGE_WEBHOOK_MYSQL_PASS?)"
        ),
        "{stdout}"
    );
    assert!(
        warnings[1].contains("GORGE_WEBHOOK_OUTBOUND_BLACKLIST=none")
            && warnings[1].contains("SSRF"),
        "{stdout}"
    );
}

#[test]
fn print_config_writes_a_toml_file_that_loads_back() {
    let (code, printed, stderr) = run_binary(&["--print-config"], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    for line in [
        "mysql_host = \"127.0.0.1\"",
        "mysql_port = 3306",
        "poll_interval_ms = 1000",
        "listen_addr = \"127.0.0.1:8160\"",
        "mysql_pass = \"\"",
    ] {
        assert!(
            printed.lines().any(|l| l == line),
            "{line} not in\n{printed}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("webhook.toml");
    std::fs::write(&path, &printed).unwrap();
    let (code, loaded, stderr) =
        run_binary(&["--check-config", "--config", path.to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let (_, defaults, _) = run_binary(&["--check-config"], &[]);
    let values = |out: &str| -> Vec<String> {
        out.lines()
            .map(|l| l.rsplit_once("  # ").map_or(l, |(v, _)| v).to_string())
            .collect()
    };
    assert_eq!(values(&loaded), values(&defaults));
    assert_eq!(
        checked(&loaded, "GORGE_WEBHOOK_MYSQL_PORT").1,
        format!("file {}", path.display())
    );
    // Secrets are never printed, even when set.
    let (_, printed, _) = run_binary(
        &["--print-config"],
        &[("GORGE_WEBHOOK_MYSQL_PASS", "hunter2")],
    );
    assert!(!printed.contains("hunter2"), "{printed}");
}

#[test]
fn env_file_is_read_as_systemd_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gorge-webhook.env");
    // What broke `env $(grep … | xargs)`: a `'` in the password, a list with spaces.
    std::fs::write(
        &path,
        "# /etc/gorge/gorge-webhook.env\n\
         GORGE_WEBHOOK_MYSQL_PASS=it's \"secret\"\n\
         GORGE_WEBHOOK_OUTBOUND_BLACKLIST=10.0.0.0/8, 192.168.0.0/16\n\
         GORGE_WEBHOOK_MAX_CONCURRENT='3'\n",
    )
    .unwrap();
    let (code, stdout, stderr) = run_binary(
        &["--env-file", path.to_str().unwrap(), "--check-config"],
        // The file replaces an inherited value, as EnvironmentFile= replaces Environment=.
        &[("GORGE_WEBHOOK_MAX_CONCURRENT", "5")],
    );
    assert_eq!(code, Some(0), "{stderr}");
    for (name, value) in [
        ("GORGE_WEBHOOK_MYSQL_PASS", "********"),
        (
            "GORGE_WEBHOOK_OUTBOUND_BLACKLIST",
            "10.0.0.0/8, 192.168.0.0/16",
        ),
        ("GORGE_WEBHOOK_MAX_CONCURRENT", "3"),
    ] {
        assert_eq!(
            checked(&stdout, name),
            (value.to_string(), format!("env {name}")),
            "{stdout}"
        );
    }
    assert_eq!(checked(&stdout, "outbound_networks").0, "2");

    // A line systemd would skip is refused, naming the file and the line.
    std::fs::write(
        &path,
        "GORGE_WEBHOOK_MYSQL_PASS=x\nexport GORGE_LOG_LEVEL=debug\n",
    )
    .unwrap();
    let (code, _, stderr) = run_binary(&["--env-file", path.to_str().unwrap()], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "invalid configuration: --env-file={:?}: line 2: \"export GORGE_LOG_LEVEL\" is not \
             a variable name (letters, digits and _, not starting with a digit; no `export`): \
             systemd's EnvironmentFile= ignores this line, so the service would run without it\n",
            path.display().to_string()
        )
    );
    // healthcheck keeps exit code 1 (Docker reserves 2).
    let (code, _, stderr) = run_binary(&["healthcheck", "--env-file", "/nonexistent.env"], &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with("healthcheck: invalid configuration: --env-file=\"/nonexistent.env\": cannot read the file: "),
        "{stderr}"
    );
}

#[test]
fn an_unknown_log_component_is_refused_with_a_suggestion() {
    let (code, _, stderr) = run_binary(&[], &[("GORGE_LOG_LEVEL", "info,pol=debug")]);
    assert_eq!(code, Some(2));
    assert_eq!(
        stderr,
        "invalid configuration: GORGE_LOG_LEVEL=\"info,pol=debug\": unknown component `pol` \
         (did you mean `poll`?); this service's components: claim, delivery, poll\n"
    );
    let (code, _, stderr) = run_binary(
        &["--check-config"],
        &[("GORGE_LOG_LEVEL", "debug,delivery=info")],
    );
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn toml_shapes_an_operator_reaches_for() {
    let dir = tempfile::tempdir().unwrap();
    // A list for the blacklist, as TOML and the chart's value make natural: accepted.
    let path = dir.path().join("list.toml");
    std::fs::write(
        &path,
        "outbound_blacklist = [\"10.0.0.0/8\", \"192.168.0.0/16\", \"fd00::/8\"]\n",
    )
    .unwrap();
    let (code, stdout, stderr) =
        run_binary(&["--config", path.to_str().unwrap(), "--check-config"], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        checked(&stdout, "GORGE_WEBHOOK_OUTBOUND_BLACKLIST"),
        (
            "10.0.0.0/8, 192.168.0.0/16, fd00::/8".to_string(),
            format!("file {}", path.display())
        )
    );
    assert_eq!(checked(&stdout, "outbound_networks").0, "3");
    // A [mysql] table: the flat keys to write instead.
    let path = dir.path().join("table.toml");
    std::fs::write(&path, "[mysql]\nhost = \"db\"\n").unwrap();
    let (code, _, stderr) = run_binary(&["--config", path.to_str().unwrap()], &[]);
    assert_eq!(code, Some(2));
    assert_eq!(
        stderr,
        format!(
            "invalid configuration: mysql (in {})=\"{{\\\"host\\\":\\\"db\\\"}}\": settings are \
             flat keys, not tables: write `mysql_host`, `mysql_port`, `mysql_user`, `mysql_pass`, \
             `mysql_socket`, `mysql_max_connections`, `mysql_max_lock_connections`, \
             `mysql_query_timeout_sec` at the top level\n",
            path.display()
        )
    );
}
