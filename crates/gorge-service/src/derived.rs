//! What follows from a service's settings — how long it may take to stop after SIGTERM, the
//! effective value of a setting another one limits, the database it reads — declared once per
//! fact, as a service's [`Derives::DERIVED`] list next to its settings. From that list come:
//!
//! - the `--check-config` lines ([`check_lines`]): a setting a fact adjusts shows its
//!   effective value (and, where it differs, what was configured and why); every other fact
//!   has a line of its own, `name = value  # derived…`;
//! - the comment block `--print-config` ends with ([`print_comments`]);
//! - the adjustments logged at startup ([`adjustments`]) and the fields of the started event
//!   ([`started`], [`started_fields`]);
//! - the docs table ([`docs_table`]) and, for a fact given as a [`Formula`] of settings, the
//!   formula the Helm chart evaluates ([`chart_catalog`]), so that no deploy file restates the
//!   arithmetic.
//!
//! A fact is either a [`Formula`] over settings (whole numbers, evaluated on the values as
//! layered; what deploy files need) or computed from the service's validated configuration.
//! Names follow the internal unit convention: a number of seconds ends in `_sec`, of
//! milliseconds in `_ms`.

use std::fmt;

use serde_json::Value;

use crate::config::{CheckLine, Source};
use crate::settings::{Declared, Layered, SettingInfo};

/// Whole-number arithmetic over settings, for a fact that deploy files must know without the
/// binary (the Helm chart evaluates the same formula from its catalog). Settings are named by
/// key and must be numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Formula {
    /// A setting's value, by key.
    Setting(&'static str),
    /// A number.
    Constant(u64),
    /// The sum of the terms.
    Sum(&'static [Formula]),
    /// The largest of the terms.
    Max(&'static [Formula]),
    /// A multiple of a formula.
    Times(u64, &'static Formula),
}

impl Formula {
    /// The value, with `setting` giving each setting's value by key.
    pub fn eval(&self, setting: &dyn Fn(&str) -> u64) -> u64 {
        match self {
            Formula::Setting(key) => setting(key),
            Formula::Constant(n) => *n,
            Formula::Sum(terms) => terms
                .iter()
                .fold(0, |sum, term| sum.saturating_add(term.eval(setting))),
            Formula::Max(terms) => terms.iter().map(|t| t.eval(setting)).max().unwrap_or(0),
            Formula::Times(k, term) => term.eval(setting).saturating_mul(*k),
        }
    }

    /// The formula in words, each setting as `name` calls it:
    /// `max(CLAIM_LEASE_SEC, DELIVERY_TIMEOUT + 5) + 2 × MYSQL_QUERY_TIMEOUT_SEC + 5`.
    pub fn text(&self, name: &dyn Fn(&str) -> String) -> String {
        let joined = |terms: &[Formula], between: &str| {
            let parts: Vec<String> = terms.iter().map(|t| t.text(name)).collect();
            parts.join(between)
        };
        match self {
            Formula::Setting(key) => name(key),
            Formula::Constant(n) => n.to_string(),
            Formula::Sum(terms) => joined(terms, " + "),
            Formula::Max(terms) => format!("max({})", joined(terms, ", ")),
            Formula::Times(k, term) => match term {
                Formula::Sum(_) => format!("{k} × ({})", term.text(name)),
                _ => format!("{k} × {}", term.text(name)),
            },
        }
    }

    /// The formula as the chart's catalog holds it, each setting by `var` (its variable):
    /// `{"setting": VAR}`, `{"constant": n}`, `{"sum": […]}`, `{"max": […]}`,
    /// `{"times": k, "of": …}`.
    pub fn json(&self, var: &dyn Fn(&str) -> String) -> Value {
        let all =
            |terms: &[Formula]| Value::from(terms.iter().map(|t| t.json(var)).collect::<Vec<_>>());
        match self {
            Formula::Setting(key) => serde_json::json!({ "setting": var(key) }),
            Formula::Constant(n) => serde_json::json!({ "constant": n }),
            Formula::Sum(terms) => serde_json::json!({ "sum": all(terms) }),
            Formula::Max(terms) => serde_json::json!({ "max": all(terms) }),
            Formula::Times(k, term) => serde_json::json!({ "times": k, "of": term.json(var) }),
        }
    }

    /// The formula evaluated on `values`: each setting it names is a number there.
    pub fn of<S: Declared>(&self, values: &S) -> u64 {
        let numbers = values.file_values();
        self.eval(&|key| {
            S::SETTINGS
                .iter()
                .position(|info| info.key == key)
                .and_then(|i| numbers[i].as_u64())
                .unwrap_or_else(|| panic!("a formula names {key}, which is not a number setting"))
        })
    }
}

/// A fact's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact {
    /// A whole number (seconds, milliseconds or a count: the fact's name says which).
    Number(u64),
    /// Anything else.
    Text(String),
}

impl fmt::Display for Fact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fact::Number(n) => write!(f, "{n}"),
            Fact::Text(text) => f.write_str(text),
        }
    }
}

impl From<u64> for Fact {
    fn from(n: u64) -> Fact {
        Fact::Number(n)
    }
}

impl From<usize> for Fact {
    fn from(n: usize) -> Fact {
        Fact::Number(n as u64)
    }
}

impl From<String> for Fact {
    fn from(text: String) -> Fact {
        Fact::Text(text)
    }
}

impl From<&str> for Fact {
    fn from(text: &str) -> Fact {
        Fact::Text(text.to_string())
    }
}

impl slog::Value for Fact {
    fn serialize(
        &self,
        _record: &slog::Record<'_>,
        key: slog::Key,
        serializer: &mut dyn slog::Serializer,
    ) -> slog::Result {
        match self {
            Fact::Number(n) => serializer.emit_u64(key, *n),
            Fact::Text(text) => serializer.emit_str(key, text),
        }
    }
}

/// How a fact's value is found.
pub enum Rule<C> {
    /// A formula over the settings as layered (deploy files evaluate it too).
    Formula(Formula),
    /// Computed from the service's validated configuration.
    Computed(fn(&C) -> Fact),
}

/// One derived fact of a service whose validated configuration is `C`.
pub struct Derived<C> {
    /// Its name in `--check-config`, the started event and the docs (a setting's key for a
    /// fact that adjusts it).
    pub name: &'static str,
    /// What it is and how it follows, for the docs.
    pub meaning: &'static str,
    /// The setting (key) this fact is the effective value of, and why it may differ.
    pub adjusts: Option<(&'static str, &'static str)>,
    /// How its value is found.
    pub rule: Rule<C>,
}

impl<C> Derived<C> {
    /// A fact given by a formula over settings.
    pub const fn formula(name: &'static str, formula: Formula, meaning: &'static str) -> Self {
        Derived {
            name,
            meaning,
            adjusts: None,
            rule: Rule::Formula(formula),
        }
    }

    /// A fact computed from the validated configuration.
    pub const fn computed(
        name: &'static str,
        value: fn(&C) -> Fact,
        meaning: &'static str,
    ) -> Self {
        Derived {
            name,
            meaning,
            adjusts: None,
            rule: Rule::Computed(value),
        }
    }

    /// The effective value of the setting `key` (whose name it takes), which may differ from
    /// what was configured for the reason `why`.
    pub const fn adjusting(self, key: &'static str, why: &'static str) -> Self {
        Derived {
            name: key,
            adjusts: Some((key, why)),
            ..self
        }
    }

    /// Its value for `config`, built from `layered`.
    pub fn value<S: Declared>(&self, config: &C, layered: &Layered<S>) -> Fact {
        match &self.rule {
            Rule::Formula(formula) => Fact::Number(formula.of(&layered.values)),
            Rule::Computed(value) => value(config),
        }
    }
}

/// A service configuration with derived facts: `C` is validated from `Settings`.
pub trait Derives: Sized + 'static {
    /// The settings declaration the configuration is built from.
    type Settings: Declared;
    /// Every derived fact, in the order outputs list them.
    const DERIVED: &'static [Derived<Self>];
}

/// The value of the fact `name` of `config` (which must be declared).
pub fn fact<C: Derives>(config: &C, layered: &Layered<C::Settings>, name: &str) -> Fact {
    C::DERIVED
        .iter()
        .find(|fact| fact.name == name)
        .unwrap_or_else(|| panic!("no derived fact {name}"))
        .value(config, layered)
}

/// What a fact's `--check-config` line names as its source: the formula, for one given by
/// a formula.
fn source_of<C: Derives>(fact: &Derived<C>) -> Source {
    match &fact.rule {
        Rule::Formula(formula) => {
            Source::Derived(formula.text(&|key| short_var::<C::Settings>(key)))
        }
        Rule::Computed(_) => Source::Derived(String::new()),
    }
}

/// A setting's variable without the service's prefix (`CLAIM_LEASE_SEC`), as formulas show it.
fn short_var<S: Declared>(key: &str) -> String {
    let var = S::env_var(key);
    var.strip_prefix(S::PREFIX)
        .map(str::to_string)
        .unwrap_or(var)
}

/// The `--check-config` lines of `config`: one per setting (an adjusted one shows its
/// effective value, and what was configured and why when they differ), then one per fact
/// that adjusts no setting.
pub fn check_lines<C: Derives>(config: &C, layered: &Layered<C::Settings>) -> Vec<CheckLine> {
    let adjusted = adjustments(config, layered);
    let mut lines = layered.check_lines(|key| {
        let fact = C::DERIVED
            .iter()
            .find(|f| f.adjusts.is_some_and(|(k, _)| k == key))?;
        let effective = fact.value(config, layered);
        Some(match adjusted.iter().find(|a| a.key == key) {
            Some(a) => format!("{effective} (configured {}, {})", a.configured, a.why),
            None => effective.to_string(),
        })
    });
    lines.extend(fact_lines(config, layered));
    lines
}

/// The `--check-config` lines of the facts that adjust no setting, `name = value  # derived…`
/// (for a service that prints its settings' lines itself).
pub fn fact_lines<C: Derives>(config: &C, layered: &Layered<C::Settings>) -> Vec<CheckLine> {
    C::DERIVED
        .iter()
        .filter(|f| f.adjusts.is_none())
        .map(|fact| CheckLine {
            name: fact.name.to_string(),
            value: fact.value(config, layered).to_string(),
            source: source_of(fact),
        })
        .collect()
}

/// An effective value that differs from the configured one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjustment {
    /// The setting's key.
    pub key: &'static str,
    /// The setting's variable.
    pub var: String,
    /// As configured (as `--check-config` shows it).
    pub configured: Fact,
    /// In effect.
    pub effective: Fact,
    /// Why.
    pub why: &'static str,
}

/// The settings whose effective value differs from the configured one.
pub fn adjustments<C: Derives>(config: &C, layered: &Layered<C::Settings>) -> Vec<Adjustment> {
    let configured = configured_values(layered);
    C::DERIVED
        .iter()
        .filter_map(|fact| {
            let (key, why) = fact.adjusts?;
            let configured = configured.iter().find(|(k, _)| *k == key)?.1.clone();
            let effective = fact.value(config, layered);
            (effective != configured).then(|| Adjustment {
                key,
                var: C::Settings::env_var(key),
                configured,
                effective,
                why,
            })
        })
        .collect()
}

/// Every setting's value as layered (numbers as numbers, secrets masked, absent as
/// `(unset)`), by key.
fn configured_values<S: Declared>(layered: &Layered<S>) -> Vec<(&'static str, Fact)> {
    S::SETTINGS
        .iter()
        .zip(layered.values.file_values())
        .zip(layered.values.shown())
        .map(|((info, value), shown)| {
            let fact = match value.as_u64() {
                Some(n) if !info.secret => Fact::Number(n),
                _ => Fact::Text(shown),
            };
            (info.key, fact)
        })
        .collect()
}

/// The fields of a started event: every setting by its key with its effective value (secrets
/// masked), then every fact that adjusts no setting. A `slog::KV`.
pub struct Started {
    fields: Vec<(&'static str, Fact)>,
}

/// The started event's fields for `config` (see [`Started`]).
pub fn started<C: Derives>(config: &C, layered: &Layered<C::Settings>) -> Started {
    let adjusted = |key: &str| {
        C::DERIVED
            .iter()
            .find(|f| f.adjusts.is_some_and(|(k, _)| k == key))
            .map(|f| f.value(config, layered))
    };
    let mut fields: Vec<(&'static str, Fact)> = configured_values(layered)
        .into_iter()
        .map(|(key, configured)| (key, adjusted(key).unwrap_or(configured)))
        .collect();
    fields.extend(
        C::DERIVED
            .iter()
            .filter(|f| f.adjusts.is_none())
            .map(|f| (f.name, f.value(config, layered))),
    );
    Started { fields }
}

/// Only the facts of `config` that adjust no setting, as started-event fields (for a service
/// whose started event names its settings otherwise).
pub fn facts<C: Derives>(config: &C, layered: &Layered<C::Settings>) -> Started {
    let fields = C::DERIVED
        .iter()
        .filter(|f| f.adjusts.is_none())
        .map(|f| (f.name, f.value(config, layered)))
        .collect();
    Started { fields }
}

impl Started {
    /// The fields, in order.
    pub fn fields(&self) -> &[(&'static str, Fact)] {
        &self.fields
    }
}

impl slog::KV for Started {
    fn serialize(
        &self,
        record: &slog::Record<'_>,
        serializer: &mut dyn slog::Serializer,
    ) -> slog::Result {
        for (key, value) in &self.fields {
            slog::Value::serialize(value, record, key, serializer)?;
        }
        Ok(())
    }
}

/// How many fields [`started_fields`] lists.
pub const fn started_field_count<C>(settings: &[SettingInfo], facts: &[Derived<C>]) -> usize {
    let mut count = settings.len();
    let mut i = 0;
    while i < facts.len() {
        if facts[i].adjusts.is_none() {
            count += 1;
        }
        i += 1;
    }
    count
}

/// The declared fields of a started event logged with [`started`]: `first` (the event's
/// own), every setting's key, every fact that adjusts no setting; `N` is their number.
pub const fn started_fields<C, const N: usize>(
    first: &[&'static str],
    settings: &[SettingInfo],
    facts: &[Derived<C>],
) -> [&'static str; N] {
    let mut out = [""; N];
    let mut n = 0;
    let mut i = 0;
    while i < first.len() {
        out[n] = first[i];
        n += 1;
        i += 1;
    }
    i = 0;
    while i < settings.len() {
        out[n] = settings[i].key;
        n += 1;
        i += 1;
    }
    i = 0;
    while i < facts.len() {
        if facts[i].adjusts.is_none() {
            out[n] = facts[i].name;
            n += 1;
        }
        i += 1;
    }
    assert!(n == N, "started_fields: N is not the number of fields");
    out
}

/// How many facts of `facts` adjust no setting (the fields [`facts`] logs).
pub const fn fact_count<C>(facts: &[Derived<C>]) -> usize {
    started_field_count(&[], facts)
}

/// The comment block `--print-config` ends with: each fact that adjusts no setting, as a
/// TOML comment (a derived value is not a setting, and is not read back).
pub fn print_comments<C: Derives>(config: &C, layered: &Layered<C::Settings>) -> String {
    let mut out = String::from(
        "# Derived from the settings above (not settings; --config does not read them):\n",
    );
    for (name, value) in facts(config, layered).fields {
        let value = match value {
            Fact::Number(n) => n.to_string(),
            Fact::Text(text) => Value::from(text).to_string(),
        };
        out.push_str(&format!("# {name} = {value}\n"));
    }
    out
}

/// The facts that adjust no setting as a JSON object (for a service whose `--print-config`
/// writes JSON).
pub fn json<C: Derives>(config: &C, layered: &Layered<C::Settings>) -> Value {
    let mut out = serde_json::Map::new();
    for (name, value) in facts(config, layered).fields {
        let value = match value {
            Fact::Number(n) => Value::from(n),
            Fact::Text(text) => Value::from(text),
        };
        out.insert(name.to_string(), value);
    }
    Value::Object(out)
}

/// The docs table of the facts (`| Fact | Default | How it follows |`), with the values they
/// take with every setting at its default (`defaults`, the configuration built from the
/// defaults).
pub fn docs_table<C: Derives>(defaults: &C, layered: &Layered<C::Settings>) -> String {
    let rows: Vec<Vec<String>> = C::DERIVED
        .iter()
        .map(|fact| {
            let name = match fact.adjusts {
                Some((key, _)) => format!("`{}` (effective)", C::Settings::env_var(key)),
                None => format!("`{}`", fact.name),
            };
            let how = match &fact.rule {
                Rule::Formula(formula) => format!(
                    "{}: `{}`",
                    fact.meaning,
                    formula.text(&|key| short_var::<C::Settings>(key))
                ),
                Rule::Computed(_) => fact.meaning.to_string(),
            };
            vec![name, format!("`{}`", fact.value(defaults, layered)), how]
        })
        .collect();
    crate::docs::table(&["Fact", "Default", "How it follows"], &rows)
}

/// The `derived` section of the chart's settings catalog: each fact given by a formula, as
/// [`Formula::json`] writes it (the chart evaluates it on the pod's environment, each setting
/// it does not set at the catalog's `default`).
pub fn chart_formulas<C: Derives>() -> Value {
    let mut out = serde_json::Map::new();
    for fact in C::DERIVED {
        if let Rule::Formula(formula) = &fact.rule {
            out.insert(
                fact.name.to_string(),
                formula.json(&|key| C::Settings::env_var(key)),
            );
        }
    }
    Value::Object(out)
}

/// The chart's settings catalog of `C`'s settings ([`crate::variables::chart_catalog`]; the
/// log level's components from `events`) with its formulas ([`chart_formulas`]).
pub fn chart_catalog<C: Derives>(events: &[crate::events::Event]) -> String {
    let text = crate::variables::chart_catalog::<C::Settings>(events);
    let mut catalog: Value = serde_json::from_str(&text).expect("the catalog is JSON");
    catalog["derived"] = chart_formulas::<C>();
    serde_json::to_string_pretty(&catalog).expect("a catalog serializes") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{Seconds, Text};

    crate::settings! {
        struct Demo, prefix "DEMO_" {
            lease_sec: Seconds = 30, "a lease";
            timeout: Seconds = 15, "a timeout";
            name: Text = "x".into(), "a name";
        }
    }

    /// The demo's validated configuration.
    struct DemoConfig {
        lease: u64,
        name: String,
    }

    const LEASE: Formula = Formula::Max(&[
        Formula::Setting("lease_sec"),
        Formula::Sum(&[Formula::Setting("timeout"), Formula::Constant(5)]),
    ]);

    impl Derives for DemoConfig {
        type Settings = Demo;
        const DERIVED: &'static [Derived<Self>] = &[
            Derived::computed("lease_sec", |c: &DemoConfig| c.lease.into(), "the lease")
                .adjusting("lease_sec", "raised to the timeout + 5"),
            Derived::formula(
                "stop_within_sec",
                Formula::Sum(&[
                    LEASE,
                    Formula::Times(2, &Formula::Setting("timeout")),
                    Formula::Constant(5),
                ]),
                "stops within",
            ),
            Derived::computed(
                "label",
                |c: &DemoConfig| format!("<{}>", c.name).into(),
                "the name, bracketed",
            ),
        ];
    }

    fn build(vars: &'static [(&'static str, &'static str)]) -> (DemoConfig, Layered<Demo>) {
        let mut layered = Layered::<Demo>::default();
        layered
            .apply_env(
                &|var| {
                    vars.iter()
                        .find(|(k, _)| *k == var)
                        .map(|(_, v)| v.to_string())
                },
                &[],
            )
            .unwrap();
        let config = DemoConfig {
            lease: LEASE.of(&layered.values),
            name: layered.values.name.clone(),
        };
        (config, layered)
    }

    #[test]
    fn formulas_evaluate_print_and_serialize() {
        let (_, layered) = build(&[("DEMO_TIMEOUT", "40")]);
        let stop = match &DemoConfig::DERIVED[1].rule {
            Rule::Formula(formula) => *formula,
            Rule::Computed(_) => unreachable!(),
        };
        assert_eq!(stop.of(&layered.values), 45 + 80 + 5);
        assert_eq!(
            stop.text(&|key| key.to_uppercase()),
            "max(LEASE_SEC, TIMEOUT + 5) + 2 × TIMEOUT + 5"
        );
        assert_eq!(
            chart_formulas::<DemoConfig>()["stop_within_sec"]["sum"][1],
            serde_json::json!({"times": 2, "of": {"setting": "DEMO_TIMEOUT"}})
        );
    }

    #[test]
    fn adjusted_settings_and_facts_reach_every_output() {
        let (config, layered) = build(&[("DEMO_LEASE_SEC", "10")]);
        let lines: Vec<String> = check_lines(&config, &layered)
            .iter()
            .map(|l| format!("{} = {}  # {}", l.name, l.value, l.source))
            .collect();
        assert_eq!(
            lines,
            [
                "DEMO_LEASE_SEC = 20 (configured 10, raised to the timeout + 5)  # env DEMO_LEASE_SEC",
                "DEMO_TIMEOUT = 15  # default",
                "DEMO_NAME = x  # default",
                "stop_within_sec = 55  # derived: max(LEASE_SEC, TIMEOUT + 5) + 2 × TIMEOUT + 5",
                "label = <x>  # derived",
            ]
        );
        assert_eq!(
            adjustments(&config, &layered),
            [Adjustment {
                key: "lease_sec",
                var: "DEMO_LEASE_SEC".into(),
                configured: Fact::Number(10),
                effective: Fact::Number(20),
                why: "raised to the timeout + 5",
            }]
        );
        let started = started(&config, &layered);
        let fields: Vec<String> = started
            .fields()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            fields,
            [
                "lease_sec=20",
                "timeout=15",
                "name=x",
                "stop_within_sec=55",
                "label=<x>"
            ]
        );
        const N: usize = started_field_count(Demo::SETTINGS, DemoConfig::DERIVED) + 1;
        const FIELDS: [&str; N] = started_fields(&["first"], Demo::SETTINGS, DemoConfig::DERIVED);
        assert_eq!(
            FIELDS,
            [
                "first",
                "lease_sec",
                "timeout",
                "name",
                "stop_within_sec",
                "label"
            ]
        );
        assert_eq!(
            print_comments(&config, &layered),
            "# Derived from the settings above (not settings; --config does not read them):\n\
             # stop_within_sec = 55\n# label = \"<x>\"\n"
        );
        assert_eq!(
            json(&config, &layered),
            serde_json::json!({"stop_within_sec": 55, "label": "<x>"})
        );
    }

    #[test]
    fn the_docs_table_shows_the_defaults_and_the_formulas() {
        let (config, layered) = build(&[]);
        let table = docs_table(&config, &layered);
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows[0], "| Fact | Default | How it follows |");
        assert_eq!(
            rows[2],
            "| `DEMO_LEASE_SEC` (effective) | `30` | the lease |"
        );
        assert_eq!(
            rows[3],
            "| `stop_within_sec` | `65` | stops within: `max(LEASE_SEC, TIMEOUT + 5) + 2 × TIMEOUT + 5` |"
        );
    }
}
