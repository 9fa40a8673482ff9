//! Startup configuration as an operator meets it: exit code 2 with one line naming the key
//! and value for every invalid setting, empty variables meaning "default", the Aphlict file,
//! `--check-config` (value and source of every setting), `--print-config`, warnings for
//! unknown variables, `--version` and the `healthcheck` subcommand.

mod common;

use std::io::Write;
use std::process::{Command, Output};

use common::{Server, BIN};
use gorge_testkit::check_config;

/// One environment variable.
type Var<'a> = (&'a str, &'a str);

fn run(args: &[&str], env: &[Var]) -> Output {
    let mut command = Command::new(BIN);
    command.env_clear().args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

fn config_file(json: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    file.write_all(json.as_bytes()).unwrap();
    file
}

/// The value `--check-config` printed for `name`, and its source.
fn checked(stdout: &[u8], name: &str) -> (String, String) {
    check_config::checked(&String::from_utf8_lossy(stdout), name)
}

/// The `warning: …` lines of `--check-config`.
fn warnings(stdout: &[u8]) -> Vec<String> {
    check_config::warnings(&String::from_utf8_lossy(stdout))
}

/// The warnings other than the admin-off-loopback one, which the default listen address
/// alone brings (its own test checks it).
fn other_warnings(stdout: &[u8]) -> Vec<String> {
    warnings(stdout)
        .into_iter()
        .filter(|w| !w.starts_with("warning: the admin server listens on "))
        .collect()
}

fn value_of(stdout: &[u8], name: &str) -> String {
    checked(stdout, name).0
}

fn assert_ok(output: &Output) {
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Exit code 2 and exactly one stderr line mentioning `key` and `value`.
fn assert_config_error(output: &Output, key: &str, value: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(key), "{key} not in {stderr}");
    assert!(stderr.contains(value), "{value} not in {stderr}");
}

#[test]
fn a_client_and_an_admin_server_sharing_a_port_are_refused() {
    // Both would bind (SO_REUSEPORT) and the kernel would pick one per connection.
    let file = config_file(
        r#"{"servers":[{"type":"client","port":22280,"listen":"0.0.0.0"},{"type":"admin","port":22280,"listen":"127.0.0.1"}]}"#,
    );
    // --check-config refuses what startup refuses, and never serves.
    let output = run(
        &["--check-config", "--config", file.path().to_str().unwrap()],
        &[],
    );
    assert_config_error(&output, "servers[1]", "127.0.0.1:22280");
    assert!(String::from_utf8_lossy(&output.stderr).contains("shares port 22280"));
}

/// `ssl.*` turn TLS on (tests/tls.rs serves it); files that cannot be read stop startup,
/// naming the key and the file.
#[test]
fn unreadable_ssl_files_in_the_aphlict_file_are_refused() {
    let file = config_file(
        r#"{"servers":[{"type":"client","port":22280,"listen":"0.0.0.0","ssl.key":"/etc/ssl/k.pem","ssl.cert":"/etc/ssl/c.pem"},{"type":"admin","port":22281}]}"#,
    );
    let output = run(&["--config", file.path().to_str().unwrap()], &[]);
    assert_config_error(&output, "servers[0].ssl.cert", "/etc/ssl/c.pem");
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot be read"));
}

#[test]
fn ports_out_of_range_are_refused() {
    let output = run(&[], &[("GORGE_NOTIFICATION_CLIENT_PORT", "70000")]);
    assert_config_error(&output, "GORGE_NOTIFICATION_CLIENT_PORT", "70000");
    let output = run(&[], &[("GORGE_NOTIFICATION_ADMIN_PORT", "0")]);
    assert_config_error(&output, "GORGE_NOTIFICATION_ADMIN_PORT", "0");
    let file = config_file(
        r#"{"servers":[{"type":"client","port":70000},{"type":"admin","port":22281}]}"#,
    );
    let output = run(&["--config", file.path().to_str().unwrap()], &[]);
    assert_config_error(&output, "servers[0].port", "70000");
}

#[test]
fn other_invalid_values_are_refused() {
    // One variable each; the error must name the variable and its value.
    let cases: &[Var] = &[
        ("GORGE_NOTIFICATION_PEERS", "ftp://peer:22281"),
        ("GORGE_NOTIFICATION_PEER_DNS", "headless"),
        ("GORGE_NOTIFICATION_LISTEN_ADDR", "somewhere"),
        ("GORGE_NOTIFICATION_DRAIN_SECONDS", "soon"),
        ("GORGE_NOTIFICATION_QUEUE_FRAMES", "0"),
        ("GORGE_NOTIFICATION_INBOUND_FRAMES_PER_SECOND", "0"),
        // Below the largest frame (64 KiB): such a frame could never be read.
        ("GORGE_NOTIFICATION_INBOUND_BYTES_BURST", "65535"),
        // Over the burst's default (1 MiB): the frame size is what the operator set.
        ("GORGE_NOTIFICATION_MAX_FRAME_BYTES", "4294967297"),
        // Not below the idle timeout's default (75 s).
        ("GORGE_NOTIFICATION_PING_INTERVAL_SECONDS", "100"),
        ("GORGE_LOG_LEVEL", "loud"),
    ];
    for &(key, value) in cases {
        assert_config_error(&run(&[], &[(key, value)]), key, value);
    }
    let file = config_file(r#"{"servers":[{"type":"client","port":1}]}"#);
    assert_config_error(
        &run(&["--config", file.path().to_str().unwrap()], &[]),
        "servers",
        "admin",
    );
    let output = run(&["--config", "/nonexistent/aphlict.json"], &[]);
    assert_config_error(&output, "--config", "/nonexistent/aphlict.json");
}

#[test]
fn empty_variables_mean_default_and_check_config_prints_the_result() {
    let output = run(
        &["--check-config"],
        &[
            ("GORGE_NOTIFICATION_CLIENT_PORT", ""),
            ("GORGE_NOTIFICATION_ADMIN_PORT", ""),
            ("GORGE_NOTIFICATION_PEERS", ""),
            ("GORGE_NOTIFICATION_DRAIN_SECONDS", ""),
        ],
    );
    assert_ok(&output);
    let out = &output.stdout;
    assert_eq!(value_of(out, "servers[0]"), "client 0.0.0.0:22280");
    assert_eq!(value_of(out, "servers[1]"), "admin 127.0.0.1:22281");
    assert_eq!(
        checked(out, "GORGE_NOTIFICATION_DRAIN_SECONDS"),
        ("10".to_string(), "default".to_string())
    );
    assert_eq!(value_of(out, "GORGE_NOTIFICATION_MAX_FRAME_BYTES"), "65536");
    assert_eq!(value_of(out, "peers (cluster[] and PEERS)"), "(none)");
    // The ports and addresses in force, not `(unset)`.
    for (name, value) in [
        ("GORGE_NOTIFICATION_CLIENT_PORT", "22280"),
        ("GORGE_NOTIFICATION_ADMIN_PORT", "22281"),
        ("GORGE_NOTIFICATION_CLIENT_LISTEN_ADDR", "0.0.0.0"),
        ("GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR", "127.0.0.1"),
    ] {
        assert_eq!(checked(out, name), (value.into(), "default".into()));
    }
}

#[test]
fn the_aphlict_file_is_layered_under_the_environment() {
    let file = config_file(
        r#"{"servers":[{"type":"client","port":3000,"listen":"127.0.0.1","ssl.key":null,"ssl.cert":null,"ssl.chain":null},{"type":"admin","port":3001,"listen":"127.0.0.1"}],
            "logs":[{"path":"/var/log/aphlict.log"}],"pidfile":"/run/aphlict.pid","memory.hint":256,
            "cluster":[{"host":"peer-a","port":22281,"protocol":"http"}]}"#,
    );
    let path = file.path().to_str().unwrap();
    let output = run(
        &["--check-config"],
        &[
            ("GORGE_NOTIFICATION_CONFIG_FILE", path),
            ("GORGE_NOTIFICATION_ADMIN_PORT", "4001"),
        ],
    );
    assert_ok(&output);
    let out = &output.stdout;
    assert_eq!(
        checked(out, "servers[0]"),
        ("client 127.0.0.1:3000".to_string(), format!("file {path}"))
    );
    assert_eq!(
        checked(out, "servers[1]"),
        (
            "admin 127.0.0.1:4001".to_string(),
            "env GORGE_NOTIFICATION_ADMIN_PORT".to_string()
        )
    );
    assert_eq!(
        value_of(out, "peers (cluster[] and PEERS)"),
        "http://peer-a:22281"
    );
    // Ignored Aphlict keys are warnings, not settings.
    let text = String::from_utf8_lossy(out);
    assert_eq!(
        warnings(out),
        [
            format!("warning: logs (in {path}) is ignored: logs go to stdout"),
            format!("warning: pidfile (in {path}) is ignored: no pidfile is written; the supervisor tracks the process"),
            format!("warning: memory.hint (in {path}) is ignored: memory is bounded by the configured limits"),
        ],
        "{text}"
    );
    assert!(!text.contains("(file key)"), "{text}");
    // The logging variables are shown too.
    assert_eq!(
        checked(out, "GORGE_LOG_LEVEL"),
        ("info".to_string(), "default".to_string())
    );
    assert_eq!(
        value_of(out, "GORGE_LOG_FORMAT"),
        "json (stdout is not a terminal)"
    );

    // Started with that file, each ignored key is one warning.
    let server = Server::start(&[
        ("GORGE_NOTIFICATION_CONFIG_FILE", path),
        ("GORGE_NOTIFICATION_PEERS", ""),
    ]);
    let warnings = server.log_events("NOTIFY_CONFIG_IGNORED_KEY");
    let keys: Vec<&str> = warnings
        .iter()
        .map(|w| w["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["logs", "pidfile", "memory.hint"]);
}

#[test]
fn help_and_version() {
    let output = run(&["--version"], &[]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        concat!("gorge-notification ", env!("CARGO_PKG_VERSION"))
    );
    let output = run(&["--help"], &[]);
    assert_eq!(output.status.code(), Some(0));
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        help.contains("--check-config") && help.contains("healthcheck"),
        "{help}"
    );
}

#[test]
fn a_port_already_in_use_fails_startup_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let output = run(
        &[],
        &[
            ("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1"),
            ("GORGE_NOTIFICATION_ADMIN_PORT", &port),
            ("GORGE_NOTIFICATION_CLIENT_PORT", &port),
        ],
    );
    // Same port for both kinds is a duplicate address: refused as configuration.
    assert_config_error(&output, "servers[1]", &format!("127.0.0.1:{port}"));
    let free = gorge_testkit::free_port().to_string();
    let output = run(
        &[],
        &[
            ("GORGE_NOTIFICATION_LISTEN_ADDR", "127.0.0.1"),
            ("GORGE_NOTIFICATION_CLIENT_PORT", &free),
            ("GORGE_NOTIFICATION_ADMIN_PORT", &port),
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains(&format!("127.0.0.1:{port}")));
}

#[test]
fn healthcheck_subcommand() {
    let server = Server::start(&[]);
    let port = server.admin_port.to_string();
    assert_eq!(
        run(&["healthcheck", "--port", &port], &[]).status.code(),
        Some(0)
    );
    drop(server);
    assert_eq!(
        run(&["healthcheck", "--port", &port], &[]).status.code(),
        Some(1)
    );
}

#[test]
fn peer_settings_from_the_environment() {
    let output = run(
        &["--check-config"],
        &[
            (
                "GORGE_NOTIFICATION_PEERS",
                "http://peer-a:22281, https://10.0.0.2:22281/",
            ),
            (
                "GORGE_NOTIFICATION_PEER_DNS",
                "gorge-notification-peers:22281",
            ),
            ("GORGE_NOTIFICATION_LISTEN_ADDR", "::"),
            // Kubernetes service links inject variables like these; they must not matter.
            ("GORGE_NOTIFICATION_ADMIN_SERVICE_HOST", "10.96.0.10"),
            ("GORGE_NOTIFICATION_PEERS_PORT", "tcp://10.96.0.11:22281"),
        ],
    );
    assert_ok(&output);
    let out = &output.stdout;
    assert_eq!(
        value_of(out, "peers (cluster[] and PEERS)"),
        "http://peer-a:22281, https://10.0.0.2:22281"
    );
    assert_eq!(
        checked(out, "GORGE_NOTIFICATION_PEER_DNS"),
        (
            "gorge-notification-peers:22281".to_string(),
            "env GORGE_NOTIFICATION_PEER_DNS".to_string()
        )
    );
    assert_eq!(value_of(out, "servers[0]"), "client [::]:22280");
    // Service-link variables are not reported as unknown settings.
    assert_eq!(other_warnings(out), Vec::<String>::new());
}

#[test]
fn check_config_validates_what_startup_validates() {
    // Logging variables, digit-only and huge numbers, plain-word reasons.
    let cases: &[(&str, &str, &str)] = &[
        (
            "GORGE_LOG_LEVEL",
            "loud",
            "expected one of trace, debug, info",
        ),
        ("GORGE_LOG_FORMAT", "xml", "expected json or text"),
        (
            "GORGE_NOTIFICATION_DRAIN_SECONDS",
            "18446744073709551615",
            "a whole number of seconds from 0 to 86400",
        ),
        (
            "GORGE_NOTIFICATION_PEER_TIMEOUT_MS",
            "5s",
            "a whole number of milliseconds from 1 to 86400000, e.g. 250",
        ),
        (
            "GORGE_NOTIFICATION_CLIENT_PORT",
            "0",
            "expected a port number 1-65535",
        ),
        (
            "GORGE_NOTIFICATION_ADMIN_PORT",
            "tcp://10.0.0.1:22281",
            "Kubernetes service link",
        ),
        (
            "GORGE_NOTIFICATION_CONFIG_FILE",
            "/nope.json",
            "cannot read the file",
        ),
        (
            "GORGE_NOTIFICATION_CONFIG_FILE",
            "/etc/aphlict.yaml",
            "JSON with a .json extension",
        ),
    ];
    for &(key, value, reason) in cases {
        let output = run(&["--check-config"], &[(key, value)]);
        assert_config_error(&output, key, value);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(reason), "{key}={value}: {stderr}");
        assert!(
            !stderr.contains("u64") && !stderr.contains("u16"),
            "{stderr}"
        );
    }
    let output = run(
        &["--check-config"],
        &[("GORGE_NOTIFICATION_ADMIN_PORT", "tcp://10.0.0.1:22281")],
    );
    assert!(String::from_utf8_lossy(&output.stderr)
        .contains("a Service named gorge-notification-admin"));
    // A started server exits 2 too, not 101.
    let output = run(
        &[],
        &[("GORGE_NOTIFICATION_DRAIN_SECONDS", "18446744073709551615")],
    );
    assert_config_error(
        &output,
        "GORGE_NOTIFICATION_DRAIN_SECONDS",
        "18446744073709551615",
    );
}

#[test]
fn file_values_are_described_in_plain_words_and_unknown_entry_keys_refused() {
    let cases = [
        (
            r#"{"servers":[{"type":"client","port":"22280"},{"type":"admin","port":22281}]}"#,
            "servers[0].port",
            "expected a port number 1-65535: a number, not a string",
        ),
        (
            r#"{"servers":[{"type":"client","port":22280},{"type":"admin","port":22281,"lisen":"127.0.0.1"}]}"#,
            "servers[1].lisen",
            "unknown key (did you mean `listen`?)",
        ),
        (
            r#"{"cluster":[{"host":"peer-a","port":22281,"protocl":"https"}]}"#,
            "cluster[0].protocl",
            "unknown key (did you mean `protocol`?)",
        ),
        (
            r#"{"max_sockets":"100"}"#,
            "max_sockets",
            "a number, not a string",
        ),
        // Named by the file key the operator wrote, not by its variable.
        (
            r#"{"peer_dns":"headless"}"#,
            "peer_dns (in ",
            "expected host:port",
        ),
    ];
    for (json, key, reason) in cases {
        let file = config_file(json);
        let output = run(
            &["--check-config", "--config", file.path().to_str().unwrap()],
            &[],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{json}: {stderr}");
        assert!(
            stderr.contains(key) && stderr.contains(reason),
            "{json}: {stderr}"
        );
    }
    let output = run(&["--config", "/etc/aphlict.yaml"], &[]);
    assert_config_error(&output, "--config", "/etc/aphlict.yaml");
}

#[test]
fn unknown_variables_with_our_prefix_are_warned_about_with_a_suggestion() {
    let output = run(
        &["--check-config"],
        &[
            ("GORGE_NOTIFICATION_CLIENT_PROT", "22280"),
            ("GORGE_NOTIFICATION_PORT", "tcp://10.96.0.10:22280"),
        ],
    );
    assert_ok(&output);
    assert_eq!(
        other_warnings(&output.stdout),
        ["warning: GORGE_NOTIFICATION_CLIENT_PROT is not a setting (did you mean GORGE_NOTIFICATION_CLIENT_PORT?); ignored"]
    );
    let server = Server::start(&[("GORGE_NOTIFICATION_CLIENT_PROT", "22280")]);
    let logged = server.log_events("NOTIFY_CONFIG_WARNING");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0]["warning"]
        .as_str()
        .unwrap()
        .contains("CLIENT_PROT"));
}

#[test]
fn print_config_writes_an_aphlict_file_that_loads_back() {
    let output = run(&["--print-config"], &[]);
    assert_ok(&output);
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(printed["servers"][0]["type"], "client");
    assert_eq!(printed["servers"][0]["port"], 22280);
    assert_eq!(printed["servers"][1]["port"], 22281);
    assert_eq!(printed["servers"][1]["ssl.key"], serde_json::Value::Null);
    assert_eq!(printed["drain_seconds"], 10);
    assert_eq!(printed["max_sockets"], 100000);
    let defaults = run(&["--check-config"], &[]);
    let file = config_file(&String::from_utf8_lossy(&output.stdout));
    let path = file.path();
    let loaded = run(&["--check-config", "--config", path.to_str().unwrap()], &[]);
    assert_ok(&loaded);
    // Every value is the same; every flat setting the file holds now comes from it.
    let values = |out: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(out)
            .lines()
            .filter(|l| !l.starts_with("GORGE_NOTIFICATION_CONFIG_FILE "))
            .map(|l| l.rsplit_once("  # ").map_or(l, |(v, _)| v).to_string())
            .collect()
    };
    assert_eq!(
        checked(&loaded.stdout, "GORGE_NOTIFICATION_CONFIG_FILE"),
        (path.display().to_string(), "option --config".to_string())
    );
    assert_eq!(values(&loaded.stdout), values(&defaults.stdout));
    assert_eq!(
        checked(&loaded.stdout, "GORGE_NOTIFICATION_DRAIN_SECONDS").1,
        format!("file {}", path.display())
    );
}

#[test]
fn a_broker_url_is_shown_and_printed_with_only_its_password_kept_out() {
    let var = "GORGE_NOTIFICATION_BROKER_URL";
    let output = run(
        &["--check-config"],
        &[(var, "redis://user:hunter2@redis.example:6379/0")],
    );
    assert_ok(&output);
    assert_eq!(
        value_of(&output.stdout, var),
        "redis://user:********@redis.example:6379/0"
    );
    assert!(!String::from_utf8_lossy(&output.stdout).contains("hunter2"));
    let output = run(
        &["--print-config"],
        &[(var, "redis://user:hunter2@redis.example:6379/0")],
    );
    assert_ok(&output);
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(printed["broker_url"], "redis://user@redis.example:6379/0");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "note: the password of GORGE_NOTIFICATION_BROKER_URL is not printed: put it in \
         GORGE_NOTIFICATION_BROKER_PASSWORD_FILE, or into the printed URL yourself\n"
    );
    // Without a password, the URL prints and loads back as it is: broker mode stays on.
    let url = "redis://redis.example:6379/0";
    let output = run(&["--print-config"], &[(var, url)]);
    assert_ok(&output);
    assert!(
        output.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let file = config_file(&String::from_utf8_lossy(&output.stdout));
    let path = file.path().to_str().unwrap();
    let loaded = run(&["--check-config", "--config", path], &[]);
    assert_ok(&loaded);
    assert_eq!(
        checked(&loaded.stdout, var),
        (url.to_string(), format!("file {path}"))
    );
}

#[test]
fn a_variable_spelt_as_a_file_key_is_warned_about_with_the_key() {
    let file = config_file(r#"{"gorge_listen_addr": "127.0.0.1"}"#);
    let path = file.path().to_str().unwrap();
    let output = run(&["--check-config", "--config", path], &[]);
    assert_ok(&output);
    assert_eq!(
        other_warnings(&output.stdout),
        [format!(
            "warning: gorge_listen_addr (in {path}) is ignored: unknown key (did you mean \
             `listen_addr`?)"
        )]
    );
}

#[test]
fn config_option_wins_over_the_variable_and_says_so() {
    let option = config_file(r#"{"drain_seconds": 3}"#);
    let variable = config_file(r#"{"drain_seconds": 4}"#);
    let (option, variable) = (
        option.path().to_str().unwrap(),
        variable.path().to_str().unwrap(),
    );
    let output = run(
        &["--check-config", "--config", option],
        &[("GORGE_NOTIFICATION_CONFIG_FILE", variable)],
    );
    assert_ok(&output);
    let out = &output.stdout;
    assert_eq!(
        checked(out, "GORGE_NOTIFICATION_CONFIG_FILE"),
        (option.to_string(), "option --config".to_string())
    );
    assert_eq!(value_of(out, "GORGE_NOTIFICATION_DRAIN_SECONDS"), "3");
    assert_eq!(
        other_warnings(out),
        [format!(
            "warning: --config {option} is read, not GORGE_NOTIFICATION_CONFIG_FILE={variable}"
        )]
    );
    // The same file twice is no conflict.
    let output = run(
        &["--check-config", "--config", option],
        &[("GORGE_NOTIFICATION_CONFIG_FILE", option)],
    );
    assert_eq!(other_warnings(&output.stdout), Vec::<String>::new());
}

#[test]
fn env_file_is_read_as_systemd_reads_it() {
    let mut file = tempfile::Builder::new().suffix(".env").tempfile().unwrap();
    file.write_all(
        b"; comment\n  GORGE_NOTIFICATION_MAX_SOCKETS = 5000  \n\
          GORGE_LOG_LEVEL=\"info,\\\nfanout=debug\"\n",
    )
    .unwrap();
    let path = file.path().to_str().unwrap();
    let output = run(
        &["--env-file", path, "--check-config"],
        &[("GORGE_NOTIFICATION_MAX_SOCKETS", "7")],
    );
    assert_ok(&output);
    assert_eq!(
        checked(&output.stdout, "GORGE_NOTIFICATION_MAX_SOCKETS"),
        ("5000".into(), "env GORGE_NOTIFICATION_MAX_SOCKETS".into())
    );
    assert_eq!(
        value_of(&output.stdout, "GORGE_LOG_LEVEL"),
        "info,fanout=debug"
    );
}

#[test]
fn an_unknown_log_component_is_refused_with_a_suggestion() {
    let output = run(
        &["--check-config"],
        &[("GORGE_LOG_LEVEL", "info,peer=debug")],
    );
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "invalid configuration: GORGE_LOG_LEVEL=\"info,peer=debug\": unknown component `peer` \
         (did you mean `peers`?); this service's components: admin, broker, clients, fanout, \
         peers\n"
    );
    let output = run(
        &["--check-config"],
        &[("GORGE_LOG_LEVEL", "info,peers=debug")],
    );
    assert_ok(&output);
}

#[test]
fn check_config_warns_of_an_admin_server_off_loopback() {
    // An admin entry without `listen` listens everywhere, as Aphlict's; one whose `listen`
    // says so is a decision and not warned about (safe's rule, NOTIFY_ADMIN_NOT_LOOPBACK).
    let file = config_file(
        r#"{"servers":[{"type":"client","port":22280,"listen":"0.0.0.0"},
                       {"type":"admin","port":22281}]}"#,
    );
    let output = run(
        &["--config", file.path().to_str().unwrap(), "--check-config"],
        &[],
    );
    assert_ok(&output);
    assert_eq!(
        warnings(&output.stdout),
        [
            "warning: the admin server listens on 0.0.0.0:22281, not loopback: it has no \
          authentication; keep it off public networks"
        ]
    );
}

#[test]
fn peer_mistakes_get_the_fix() {
    let output = run(
        &["--check-config"],
        &[("GORGE_NOTIFICATION_PEERS", "https://a:22281/path")],
    );
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "invalid configuration: GORGE_NOTIFICATION_PEERS=\"https://a:22281/path\": a peer URL \
         has no path or query: expected http://host:port (gorge posts to the peer's admin port \
         at /, as Aphlict does); remove \"/path\"\n"
    );
    let file = config_file(r#"{"cluster": ["http://a:22281"]}"#);
    let output = run(&["--config", file.path().to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "invalid configuration: cluster[0]=\"http://a:22281\": expected an object like \
         {\"host\": \"a\", \"port\": 22281, \"protocol\": \"http\"} (Aphlict's format); a list \
         of URLs goes in GORGE_NOTIFICATION_PEERS\n"
    );
}
