//! docs/webhook.md's tables of settings, metrics and log events are the declarations in the
//! code: each test fails naming the first row that differs (rerun with `GORGE_BLESS_DOCS=1`
//! to rewrite the table from the code).

use std::path::PathBuf;

use gorge_service::{derived, docs, events, metrics, variables};
use gorge_webhook::config::{Config, Loaded, RawSettings};
use gorge_webhook::metrics::{Metrics, PREFIX};

fn page() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/webhook.md")
}

#[test]
fn the_settings_table_is_the_declaration() {
    docs::check_table(&page(), &variables::docs_table::<RawSettings>());
}

/// What follows from the settings, with the values the defaults give.
#[test]
fn the_derived_facts_table_is_the_declaration() {
    docs::check_table(&page(), &Loaded::defaults().derived_table());
}

#[test]
fn the_metrics_table_is_the_declaration() {
    docs::check_table(&page(), &metrics::docs_table(PREFIX, &Metrics::families()));
}

/// The prose names the components a per-component `GORGE_LOG_LEVEL` accepts, as declared.
#[test]
fn the_log_components_are_the_declared_ones() {
    docs::check_components(&page(), &events::components(gorge_webhook::events::ALL));
}

#[test]
fn the_events_table_is_the_declaration() {
    docs::check_table(&page(), &events::docs_table(gorge_webhook::events::ALL));
}

/// README's opening, which says what gorge replaces, also says that gorge-webhook needs the
/// Phorge-side kit: without it every receiver gets every POST twice.
#[test]
fn the_readme_opening_names_the_phorge_side_kit() {
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let opening = readme.split("\n## ").next().unwrap();
    assert!(
        opening.contains("(compat/phorge/README.md)"),
        "README's opening does not link compat/phorge:\n{opening}"
    );
}

/// The Helm chart refuses bad `webhook.env` values at template time from this catalog, and
/// evaluates the formulas of its `derived` section (the grace period from `stop_within_sec`).
#[test]
fn the_chart_settings_catalog_is_the_declaration() {
    docs::check_file(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/helm/gorge/files/settings/gorge-webhook.json"),
        &derived::chart_catalog::<Config>(gorge_webhook::events::ALL),
    );
}
