//! docs/notification.md's tables of settings, metrics and log events are the declarations in
//! the code: each test fails naming the first row that differs (rerun with
//! `GORGE_BLESS_DOCS=1` to rewrite the table from the code).

use std::path::PathBuf;

use gorge_notification::config::Settings;
use gorge_notification::metrics::{Metrics, PREFIX};
use gorge_notification::peers::PeerMetrics;
use gorge_service::{docs, events, metrics, settings};

fn page() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/notification.md")
}

#[test]
fn the_settings_table_is_the_declaration() {
    docs::check_table(&page(), &settings::docs_table::<Settings>());
}

#[test]
fn the_metrics_table_is_the_declaration() {
    let mut families = Metrics::families();
    families.extend(PeerMetrics::families());
    docs::check_table(&page(), &metrics::docs_table(PREFIX, &families));
}

#[test]
fn the_events_table_is_the_declaration() {
    docs::check_table(
        &page(),
        &events::docs_table(gorge_notification::events::ALL),
    );
}
