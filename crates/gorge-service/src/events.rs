//! Log events, each declared once — name, level, component, fields, meaning — in
//! [`events!`](crate::events!), and emitted only through that declaration with
//! [`emit!`](crate::emit!): the level and component come from it, and a field the declaration
//! does not list is a compile error. The docs event tables are rendered from the declarations
//! ([`docs_table`]) and checked by each service's tests.
//!
//! This module also declares the events of the shared runtime ([`RUNTIME`]), which both
//! services' tables list.

pub use slog::Level;

/// The logger key whose value a per-component level matches.
pub const COMPONENT_KEY: &str = "component";

/// The lower-case level name written in JSON records and the docs tables.
pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::Critical => "critical",
        Level::Error => "error",
        Level::Warning => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// One declared log event.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    /// The record's message: the `event` key of a JSON line.
    pub name: &'static str,
    /// Its level.
    pub level: Level,
    /// The `component` key (which a per-component `GORGE_LOG_LEVEL` matches), if any.
    pub component: Option<&'static str>,
    /// The keys it carries.
    pub fields: &'static [&'static str],
    /// What it means, for the docs table.
    pub meaning: &'static str,
}

/// Whether `event` declares the field `key` (for [`emit!`](crate::emit!)'s compile-time check).
pub const fn declares(event: &Event, key: &str) -> bool {
    let mut i = 0;
    while i < event.fields.len() {
        if str_eq(event.fields[i], key) {
            return true;
        }
        i += 1;
    }
    false
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The `component` key of an event's record, when it has one.
#[derive(Debug, Clone, Copy)]
pub struct Component(pub Option<&'static str>);

impl slog::KV for Component {
    fn serialize(
        &self,
        _record: &slog::Record<'_>,
        serializer: &mut dyn slog::Serializer,
    ) -> slog::Result {
        match self.0 {
            Some(component) => serializer.emit_str(COMPONENT_KEY, component),
            None => Ok(()),
        }
    }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __event_component {
    () => {
        None
    };
    ($component:literal) => {
        Some($component)
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __event_field_list {
    (.. $list:path) => {
        &$list
    };
    ($($field:literal),* $(,)?) => {
        &[$($field),*]
    };
}

/// Declares log events: one `pub const NAME: Event` each, and `ALL`, the list of them. The
/// fields are a list of names, or `[..LIST]`, a constant array made elsewhere (a started
/// event's fields generated from the settings and derived facts: `crate::derived`).
///
/// ```
/// gorge_service::events! {
///     /// The example's events.
///     pub const ALL = [
///         EXAMPLE_STARTED: Info ["addr"] "The service serves on `addr`";
///         EXAMPLE_PEER_DOWN: Warning @ "peers" ["peer", "reason"] "A relay to `peer` failed";
///     ];
/// }
/// ```
#[macro_export]
macro_rules! events {
    (
        $(#[$meta:meta])*
        $vis:vis const $all:ident = [
            $(
                $name:ident : $level:ident $(@ $component:literal)? [$($fields:tt)*]
                    $meaning:literal;
            )*
        ];
    ) => {
        $(
            #[doc = $meaning]
            $vis const $name: $crate::events::Event = $crate::events::Event {
                name: stringify!($name),
                level: $crate::events::Level::$level,
                component: $crate::__event_component!($($component)?),
                fields: $crate::__event_field_list!($($fields)*),
                meaning: $meaning,
            };
        )*
        $(#[$meta])*
        $vis const $all: &[$crate::events::Event] = &[$($name),*];
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __event_fields {
    ($event:path; $( $key:literal => $(%)? $(?)? $value:expr ),* $(,)?) => {
        $(
            const _: () = assert!(
                $crate::events::declares(&$event, $key),
                concat!("this event does not declare the field \"", $key, "\"")
            );
        )*
    };
}

/// Logs the declared `event` on `log` with its level and component, and the fields given as
/// slog key-values (`"key" => value`, `%value` for `Display`, `?value` for `Debug`); each key
/// must be one of the event's declared fields.
#[macro_export]
macro_rules! emit {
    ($log:expr, $event:path) => {
        $crate::emit!($log, $event;)
    };
    ($log:expr, $event:path; $($kv:tt)*) => {{
        $crate::__event_fields!($event; $($kv)*);
        $crate::__slog::log!($log, $event.level, "", "{}", $event.name;
            $crate::events::Component($event.component), $($kv)*)
    }};
}

/// [`emit!`](crate::emit!) with `generated` fields too: a `slog::KV` whose keys are declared
/// by the event's generated field list (a started event's settings and derived facts,
/// [`crate::derived::started`]); the literal fields after `;` are checked as by `emit!`.
#[macro_export]
macro_rules! emit_with {
    ($log:expr, $event:path, $generated:expr) => {
        $crate::emit_with!($log, $event, $generated;)
    };
    ($log:expr, $event:path, $generated:expr; $($kv:tt)*) => {{
        $crate::__event_fields!($event; $($kv)*);
        $crate::__slog::log!($log, $event.level, "", "{}", $event.name;
            $crate::events::Component($event.component), $generated, $($kv)*)
    }};
}

crate::events! {
    /// The shared runtime's events ([`crate::shutdown::run`], [`crate::server`],
    /// [`crate::takeover`]).
    pub const RUNTIME = [
        ANOTHER_COPY_SERVING: Error ["addr", "pid", "answer"]
            "Before binding, another process answered on `addr`, one of the addresses this one \
             binds, and did not start draining within 2 s: nothing is bound, exit 1 (a second \
             copy sharing even one port would split its traffic; restart in place with SIGTERM \
             and start at once instead)";
        LISTENING: Info ["listener", "addr"] "A listener is bound and serving";
        ACCEPT_FAILED: Warning ["listener", "error", "failures"]
            "Accepting a connection failed (out of file descriptors…): retried every 50 ms, \
             logged at most every 10 s per listener with the number of failures since the last \
             line";
        LISTENER_FAILED: Error ["error"]
            "A listener stopped serving outside a shutdown: the whole process shuts down and \
             exits 1";
        SHUTDOWN_STARTED: Info ["reason"]
            "The graceful stop began: `reason` is the signal (`SIGTERM`, `SIGINT`) or \
             `requested` (the service asked, e.g. after a fatal failure)";
        LISTENERS_CLOSED: Info ["listeners"]
            "At the start of the drain, the listeners that close then (so a new process on the \
             same port takes every new connection) are closed";
        DRAIN_DEADLINE_EXCEEDED: Warning ["deadline_ms"]
            "The service's drain did not finish within its deadline; the stop continues \
             without it";
        REQUESTS_ABANDONED: Warning ["open_connections"]
            "Connections still open after the grace period for in-flight requests were \
             dropped";
        SHUTDOWN_COMPLETE: Info [] "The graceful stop finished; the process exits 0";
    ];
}

/// The components `events` and the shared runtime's events log under, sorted: the names a
/// per-component `GORGE_LOG_LEVEL` (`info,peers=debug`) may use.
pub fn components(events: &[Event]) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = events
        .iter()
        .chain(RUNTIME)
        .filter_map(|event| event.component)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// A service's events table in docs/: `events` (the service's own), then [`RUNTIME`].
pub fn docs_table(events: &[Event]) -> String {
    let rows: Vec<Vec<String>> = events
        .iter()
        .chain(RUNTIME)
        .map(|event| {
            let fields: Vec<String> = event.fields.iter().map(|f| format!("`{f}`")).collect();
            vec![
                format!("`{}`", event.name),
                level_name(event.level).to_string(),
                event
                    .component
                    .map(|c| format!("`{c}`"))
                    .unwrap_or_default(),
                fields.join(", "),
                event.meaning.to_string(),
            ]
        })
        .collect();
    crate::docs::table(&["Event", "Level", "Component", "Fields", "Meaning"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::tests::Capture;
    use crate::logging::{build, LogFormat};

    crate::events! {
        const DEMO = [
            DEMO_STARTED: Info ["addr", "n"] "Started";
            DEMO_PEER_CHATTY: Debug @ "peers" ["peer"] "Chatty";
        ];
    }

    #[test]
    fn events_carry_their_declared_level_component_and_fields() {
        let capture = Capture::default();
        let spec = crate::logging::parse_level_spec(Some("info,peers=debug")).unwrap();
        let logging = build(capture.clone(), LogFormat::Json, spec, "svc", "1.0");
        let addr = "127.0.0.1:1";
        crate::emit!(logging.logger, DEMO_STARTED; "addr" => %addr, "n" => 3);
        crate::emit!(&logging.logger, DEMO_PEER_CHATTY; "peer" => ?"a");
        crate::emit!(logging.logger, SHUTDOWN_COMPLETE);
        drop(logging);
        let out = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        let records: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(records.len(), 3, "{out}");
        assert_eq!(
            (
                &records[0]["event"],
                &records[0]["level"],
                &records[0]["addr"],
                &records[0]["n"]
            ),
            (
                &"DEMO_STARTED".into(),
                &"info".into(),
                &"127.0.0.1:1".into(),
                &3.into()
            )
        );
        assert!(records[0].get("component").is_none(), "{out}");
        assert_eq!(
            records[1]["level"], "debug",
            "the peers component is at debug"
        );
        assert_eq!(records[1]["component"], "peers");
        assert_eq!(records[2]["event"], "SHUTDOWN_COMPLETE");
        assert_eq!(DEMO.len(), 2);
    }

    #[test]
    fn declared_fields_are_checked() {
        assert!(declares(&DEMO_STARTED, "addr"));
        assert!(!declares(&DEMO_STARTED, "add"));
        assert!(!declares(&SHUTDOWN_COMPLETE, "reason"));
    }

    #[test]
    fn the_docs_table_lists_the_service_events_then_the_runtime_ones() {
        let table = docs_table(DEMO);
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows[0], "| Event | Level | Component | Fields | Meaning |");
        assert_eq!(
            rows[2],
            "| `DEMO_STARTED` | info |  | `addr`, `n` | Started |"
        );
        assert_eq!(
            rows[3],
            "| `DEMO_PEER_CHATTY` | debug | `peers` | `peer` | Chatty |"
        );
        assert_eq!(rows.len(), 2 + DEMO.len() + RUNTIME.len());
    }
}
