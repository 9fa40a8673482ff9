//! docs/notification.md's tables of settings, metrics and log events are the declarations in
//! the code: each test fails naming the first row that differs (rerun with
//! `GORGE_BLESS_DOCS=1` to rewrite the table from the code).

mod common;

use std::path::PathBuf;

use gorge_notification::broker::BrokerMetrics;
use gorge_notification::config::{Config, Settings};
use gorge_notification::metrics::{Metrics, PREFIX};
use gorge_notification::peers::PeerMetrics;
use gorge_service::{derived, docs, events, metrics, variables};

fn page() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/notification.md")
}

#[test]
fn the_settings_table_is_the_declaration() {
    docs::check_table(&page(), &variables::docs_table::<Settings>());
}

/// What follows from the settings, with the values the defaults give.
#[test]
fn the_derived_facts_table_is_the_declaration() {
    docs::check_table(&page(), &gorge_notification::config::derived::docs_table());
}

#[test]
fn the_metrics_table_is_the_declaration() {
    let mut families = Metrics::families();
    families.extend(PeerMetrics::families());
    families.extend(BrokerMetrics::families());
    docs::check_table(&page(), &metrics::docs_table(PREFIX, &families));
}

/// The prose names the components a per-component `GORGE_LOG_LEVEL` accepts, as declared.
#[test]
fn the_log_components_are_the_declared_ones() {
    docs::check_components(
        &page(),
        &events::components(gorge_notification::events::ALL),
    );
}

#[test]
fn the_events_table_is_the_declaration() {
    docs::check_table(
        &page(),
        &events::docs_table(gorge_notification::events::ALL),
    );
}

/// docs/benchmarks.md's command for the `--pid` of the server measured finds that server,
/// also with a second one running (`pidof` lists both).
#[test]
fn the_benchmark_pid_command_finds_the_server_on_its_admin_port() {
    let page = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks.md"),
    )
    .unwrap();
    let (notify, _) = page
        .split_once("\ngorge-bench notify --client")
        .expect("the notify command in benchmarks.md");
    let pid_line = notify
        .lines()
        .last()
        .filter(|line| line.starts_with("pid=\"$("))
        .unwrap_or_else(|| panic!("no pid=\"$(…)\" line before the notify command"));
    let measured = common::Server::start(&[]);
    let _other = common::Server::start(&[]);
    let script = format!(
        "{}\nprintf %s \"$pid\"",
        pid_line.replace(":22281", &format!(":{}", measured.admin_port))
    );
    let output = std::process::Command::new("/bin/sh")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        measured.process.id().to_string(),
        "{pid_line}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The Helm chart refuses bad `notification.env` values at template time from this catalog,
/// and evaluates the formulas of its `derived` section (the grace period from
/// `stop_within_sec`).
#[test]
fn the_chart_settings_catalog_is_the_declaration() {
    docs::check_file(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/helm/gorge/files/settings/gorge-notification.json"),
        &derived::chart_catalog::<Config>(gorge_notification::events::ALL),
    );
}
