//! What follows from the settings, declared once (see `gorge_service::derived`):
//! `--check-config` prints each fact on a line of its own, `--print-config` under `derived`,
//! `NOTIFY_STARTED` logs them, docs/notification.md tables them, and the Helm chart
//! evaluates the formulas from its catalog (the grace period from `stop_within_sec`).

use gorge_service::derived::{self, Derived, Derives, Formula};

use super::{Config, Settings};

/// How much longer than the drain window a stop may take: the drain hook is bounded by the
/// window + 3 s (the last sockets' close grace, `drain.rs`), then in-flight admin requests
/// get the rest (`service.rs`).
pub const STOP_MARGIN_SEC: u64 = 5;

/// The longest a stop takes after SIGTERM: the drain window and the margin.
const STOP_WITHIN: Formula = Formula::Sum(&[
    Formula::Setting(Settings::KEYS.drain_seconds),
    Formula::Constant(STOP_MARGIN_SEC),
]);

impl Derives for Config {
    type Settings = Settings;
    const DERIVED: &'static [Derived<Config>] = &[Derived::formula(
        "stop_within_sec",
        STOP_WITHIN,
        "the longest a stop takes after SIGTERM (the drain's hard deadline): close frames \
         spread over the drain window, the last close handshakes, then in-flight admin \
         requests. The systemd unit's `TimeoutStopSec` and the chart's grace period leave the \
         process at least this",
    )];
}

impl Config {
    /// Hard bound of the whole stop: [`STOP_WITHIN`].
    pub fn drain_deadline(&self) -> std::time::Duration {
        std::time::Duration::from_secs(STOP_WITHIN.of(&self.layered.values))
    }
}

/// The fields of `NOTIFY_STARTED`: its own three, then every derived fact (the event's
/// declaration lists them; a test holds the two together, since `events` may not depend on
/// `config`, which reads the events' components).
pub const STARTED_FIELDS: [&str; 3 + derived::fact_count(<Config as Derives>::DERIVED)] =
    derived::started_fields(
        &["fingerprint", "listeners", "peers"],
        &[],
        <Config as Derives>::DERIVED,
    );

/// The derived facts of `config`, as `NOTIFY_STARTED` logs them.
pub fn started(config: &Config) -> derived::Started {
    derived::facts(config, &config.layered)
}

/// docs/notification.md's table of derived facts, with every setting at its default.
pub fn docs_table() -> String {
    let defaults = super::load_from(None, &|_| None).expect("the defaults are valid");
    derived::docs_table(&defaults, &defaults.layered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gorge_service::settings::Declared;

    #[test]
    fn the_started_event_declares_every_derived_fact() {
        assert_eq!(crate::events::NOTIFY_STARTED.fields, STARTED_FIELDS);
    }

    #[test]
    fn the_stop_bound_is_the_window_and_the_margin() {
        let config = super::super::load_from(None, &|var| {
            (var == Settings::env_var(Settings::KEYS.drain_seconds)).then(|| "30".to_string())
        })
        .unwrap();
        assert_eq!(config.drain_deadline(), std::time::Duration::from_secs(35));
        assert_eq!(
            derived::fact(&config, &config.layered, "stop_within_sec"),
            derived::Fact::Number(35)
        );
    }
}
