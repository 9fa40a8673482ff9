//! Logging on slog: JSON lines (the default when stdout is not a terminal) or human-readable
//! text (the default on a terminal), the level from `GORGE_LOG_LEVEL` with optional
//! per-component overrides (`info,peers=debug`), and an asynchronous drain so a slow stdout
//! never stalls a request.
//!
//! Logging never panics and never stops for good: a line that cannot be written (stdout is a
//! pipe whose reader went away, journald is restarting) is dropped and counted in
//! [`dropped_log_lines`], and the next line is tried afresh. slog's usual `Fuse` would panic the
//! log thread on the first `BrokenPipe`, and every record after it would be lost while the
//! service went on serving.
//!
//! slog's compile-time cap is lifted in the workspace manifest (`max_level_trace`,
//! `release_max_level_trace`): without it a release build drops every debug record before
//! the runtime level is even consulted.

use std::fmt;
use std::io::{self, IsTerminal};

use slog::{o, Drain, Level, Logger, OwnedKVList, Record, KV};

use crate::config::{did_you_mean, env_value, CheckLine, ConfigError};
use crate::events::{level_name, Event, COMPONENT_KEY};
use crate::log_text::{timestamp, TextLines};
use crate::metrics::dropped_log_lines;
use crate::settings::{Kind, Layered, Optional, Shape};

/// Environment variable with the log level and per-component overrides.
pub const LEVEL_VAR: &str = "GORGE_LOG_LEVEL";
/// Environment variable with the log format (`json` or `text`).
pub const FORMAT_VAR: &str = "GORGE_LOG_FORMAT";

/// How many records the async drain buffers before it drops (and counts) new ones.
const ASYNC_CHANNEL_SIZE: usize = 4096;

/// A record longer than this is written out in pieces rather than held whole (records are
/// a few hundred bytes; this only bounds the buffer).
const MAX_RECORD_BYTES: usize = 64 * 1024;

/// What `GORGE_LOG_LEVEL` may be, in plain words.
pub const LEVEL_VALID: &str = "one of trace, debug, info, warn, error, critical, \
     optionally followed by component overrides such as info,peers=debug";

/// The words a level may be written as (any case), as `level_word` reads them; the chart's
/// settings catalog checks `GORGE_LOG_LEVEL` against them at template time.
pub const LEVEL_WORDS: &[&str] = &[
    "trace", "debug", "info", "warn", "warning", "error", "critical",
];

/// How records are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line (the default, for log collectors).
    Json,
    /// One human-readable line per record ([`crate::log_text`]).
    Text,
}

/// The runtime level: a default and per-component overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelSpec {
    /// The level of records whose component has no override.
    pub default: Level,
    /// `(component, level)` overrides, matched against the [`COMPONENT_KEY`] of a logger.
    pub components: Vec<(String, Level)>,
}

impl LevelSpec {
    /// Every component at `default`.
    pub fn new(default: Level) -> LevelSpec {
        LevelSpec {
            default,
            components: Vec::new(),
        }
    }

    fn for_component(&self, component: Option<&str>) -> Level {
        component
            .and_then(|c| self.components.iter().find(|(name, _)| name == c))
            .map_or(self.default, |(_, level)| *level)
    }
}

/// `GORGE_LOG_LEVEL`: a level, optionally followed by per-component levels.
#[derive(Debug)]
pub struct LogLevel;

impl Kind for LogLevel {
    type Value = LevelSpec;
    const VALID: &'static str = LEVEL_VALID;
    const SHAPE: Shape = Shape::LogLevels;
    fn parse(text: &str) -> Option<LevelSpec> {
        parse_level_spec(Some(text)).ok()
    }
    fn show(value: &LevelSpec) -> String {
        let mut text = level_name(value.default).to_string();
        for (component, level) in &value.components {
            text.push_str(&format!(",{component}={}", level_name(*level)));
        }
        text
    }
}

/// `GORGE_LOG_FORMAT`: `json` or `text`.
#[derive(Debug)]
pub struct LogFormatKind;

impl Kind for LogFormatKind {
    type Value = LogFormat;
    const VALID: &'static str = "json or text";
    const SHAPE: Shape = Shape::OneOf(&["json", "text"]);
    fn parse(text: &str) -> Option<LogFormat> {
        parse_format(Some(text)).ok()
    }
    fn show(value: &LogFormat) -> String {
        format!("{value:?}").to_lowercase()
    }
}

crate::settings! {
    /// `GORGE_LOG_LEVEL` and `GORGE_LOG_FORMAT`, which both services read from the environment.
    pub struct LogVars, prefix "GORGE_LOG_" {
        #[env_only]
        #[env(LEVEL_VAR)]
        level: LogLevel = LevelSpec::new(slog::Level::Info),
            "`trace`, `debug`, `info`, `warn`, `error`, `critical`, optionally followed by \
             per-component levels, `info,<component>=debug` (components: the Component column of \
             the Log events table; another name is refused)";
        #[env_only]
        #[env(FORMAT_VAR)]
        #[doc_default("`text` on a terminal, else `json`")]
        format: Optional<LogFormatKind> = None, "`json` or `text`";
    }
}

impl Layered<LogVars> {
    /// The `--check-config` lines of the logging variables; an unset format says what it is
    /// here (text on a terminal, else JSON).
    pub fn log_check_lines(&self) -> Vec<CheckLine> {
        self.check_lines(|key| match (key, self.values.format) {
            ("format", None) if std::io::IsTerminal::is_terminal(&std::io::stdout()) => {
                Some("text (stdout is a terminal)".to_string())
            }
            ("format", None) => Some("json (stdout is not a terminal)".to_string()),
            _ => None,
        })
    }
}

/// The root logger plus the guard that flushes buffered records when dropped. Keep it alive
/// until the process exits.
pub struct Logging {
    /// The root logger; child loggers add `component` and other keys.
    pub logger: Logger,
    _guard: slog_async::AsyncGuard,
}

/// What `GORGE_LOG_LEVEL` and `GORGE_LOG_FORMAT` say, validated (also by `--check-config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// Levels from `GORGE_LOG_LEVEL`.
    pub level: LevelSpec,
    /// Format from `GORGE_LOG_FORMAT`.
    pub format: LogFormat,
}

impl LogSettings {
    /// Reads both variables; an unknown value is a configuration error naming the variable.
    /// Without `GORGE_LOG_FORMAT`, text on a terminal and JSON otherwise.
    pub fn from_env() -> Result<LogSettings, ConfigError> {
        let vars = Layered::<LogVars>::from_env()?.values;
        let format = match vars.format {
            Some(format) => format,
            None if io::stdout().is_terminal() => LogFormat::Text,
            None => LogFormat::Json,
        };
        Ok(LogSettings {
            level: vars.level,
            format,
        })
    }

    /// The two variables' values, and whether stdout is a terminal.
    pub fn parse(
        level: Option<&str>,
        format: Option<&str>,
        terminal: bool,
    ) -> Result<LogSettings, ConfigError> {
        let level = parse_level_spec(level)?;
        let format = match format {
            Some(value) => parse_format(Some(value))?,
            None if terminal => LogFormat::Text,
            None => LogFormat::Json,
        };
        Ok(LogSettings { level, format })
    }
}

/// The logging variables from the environment, for `--check-config` and startup alike. A
/// `GORGE_LOG_LEVEL` component that none of `events` logs under is refused with a
/// did-you-mean: `peer=debug` would otherwise change nothing, silently.
pub fn log_vars(events: &[Event]) -> Result<Layered<LogVars>, ConfigError> {
    let vars = Layered::<LogVars>::from_env()?;
    let known = crate::events::components(events);
    if let Some((unknown, _)) = vars
        .values
        .level
        .components
        .iter()
        .find(|(name, _)| !known.contains(&name.as_str()))
    {
        let near = did_you_mean(unknown, known.iter().copied())
            .map(|near| format!(" (did you mean `{near}`?)"))
            .unwrap_or_default();
        return Err(ConfigError::new(
            LEVEL_VAR,
            env_value(LEVEL_VAR).unwrap_or_default(),
            format!(
                "unknown component `{unknown}`{near}; this service's components: {}",
                known.join(", ")
            ),
        ));
    }
    Ok(vars)
}

/// Reads the logging variables and builds the stdout logger.
pub fn init_logging(service: &'static str, version: &'static str) -> Result<Logging, ConfigError> {
    let settings = LogSettings::from_env()?;
    let terminal = io::stdout().is_terminal();
    Ok(match (settings.format, terminal) {
        (LogFormat::Text, true) => {
            // Line-buffered, flushed per line: on a terminal each line shows as it comes.
            let text = DropFailed(TextLines::new(io::stdout()));
            finish(text, settings.level, service, version)
        }
        _ => build(
            io::stdout(),
            settings.format,
            settings.level,
            service,
            version,
        ),
    })
}

fn level_word(word: &str) -> Option<Level> {
    Some(match word.to_ascii_lowercase().as_str() {
        "trace" => Level::Trace,
        "debug" => Level::Debug,
        "info" => Level::Info,
        "warn" | "warning" => Level::Warning,
        "error" => Level::Error,
        "critical" => Level::Critical,
        _ => return None,
    })
}

/// `LEVEL[,COMPONENT=LEVEL...]`, e.g. `info,peers=debug`.
pub fn parse_level_spec(value: Option<&str>) -> Result<LevelSpec, ConfigError> {
    let Some(text) = value else {
        return Ok(LevelSpec::new(Level::Info));
    };
    let bad = || ConfigError::new(LEVEL_VAR, text, format!("expected {LEVEL_VALID}"));
    let mut spec = LevelSpec::new(Level::Info);
    for (i, part) in text.split(',').map(str::trim).enumerate() {
        match part.split_once('=') {
            None if i == 0 => spec.default = level_word(part).ok_or_else(bad)?,
            Some((component, level)) if !component.trim().is_empty() => spec.components.push((
                component.trim().to_string(),
                level_word(level.trim()).ok_or_else(bad)?,
            )),
            _ => return Err(bad()),
        }
    }
    Ok(spec)
}

/// `json` (also when absent) or `text`, any case; anything else is a configuration error
/// naming [`FORMAT_VAR`].
pub fn parse_format(value: Option<&str>) -> Result<LogFormat, ConfigError> {
    match value.map(str::to_ascii_lowercase).as_deref() {
        None | Some("json") => Ok(LogFormat::Json),
        Some("text") => Ok(LogFormat::Text),
        Some(_) => Err(ConfigError::new(
            FORMAT_VAR,
            value.unwrap_or_default(),
            "expected json or text",
        )),
    }
}

/// Builds a logger writing to `out` without terminal colours; exposed so tests can capture
/// output.
pub fn build<W: io::Write + Send + 'static>(
    out: W,
    format: LogFormat,
    level: impl Into<LevelSpec>,
    service: &'static str,
    version: &'static str,
) -> Logging {
    let level = level.into();
    match format {
        LogFormat::Json => {
            let json = slog_json::Json::new(WholeLines::new(out))
                .set_newlines(true)
                .add_key_value(o!(
                    "ts" => slog::PushFnValue(|_, ser| ser.emit(timestamp())),
                    "level" => slog::FnValue(|record| level_name(record.level())),
                    "event" => slog::PushFnValue(|record, ser| ser.emit(record.msg())),
                ))
                .build();
            finish(DropFailed(json), level, service, version)
        }
        LogFormat::Text => {
            let text = DropFailed(TextLines::new(WholeLines::new(out)));
            finish(text, level, service, version)
        }
    }
}

impl From<Level> for LevelSpec {
    fn from(level: Level) -> LevelSpec {
        LevelSpec::new(level)
    }
}

fn finish<D>(drain: D, level: LevelSpec, service: &'static str, version: &'static str) -> Logging
where
    D: Drain<Ok = (), Err = slog::Never> + Send + 'static,
{
    let (drain, guard) = slog_async::Async::new(drain)
        .chan_size(ASYNC_CHANNEL_SIZE)
        .overflow_strategy(slog_async::OverflowStrategy::DropAndReport)
        .build_with_guard();
    // Filtering happens before the channel, so dropped records cost no allocation. Only a
    // dead log thread makes the channel fail; a record is then dropped, never a panic in the
    // request that logged it.
    let drain = LevelFilter { spec: level, drain }.ignore_res();
    Logging {
        logger: Logger::root(drain, o!("service" => service, "version" => version)),
        _guard: guard,
    }
}

/// Drops, and counts in [`dropped_log_lines`], a record its drain could not write, instead of
/// failing (which `Fuse` would turn into a panic of the log thread).
struct DropFailed<D>(D);

impl<D: Drain<Ok = ()>> Drain for DropFailed<D> {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        if self.0.log(record, values).is_err() {
            dropped_log_lines().inc();
        }
        Ok(())
    }
}

/// Holds what a formatter writes until its line is complete, then writes the line with one
/// `write_all`. A record that fails is dropped whole: none of its bytes stays behind in a
/// buffer to be glued to the front of the next line once writing works again.
struct WholeLines<W> {
    out: W,
    pending: Vec<u8>,
}

impl<W: io::Write> WholeLines<W> {
    fn new(out: W) -> Self {
        WholeLines {
            out,
            pending: Vec::new(),
        }
    }

    fn write_pending(&mut self) -> io::Result<()> {
        let written = self
            .out
            .write_all(&self.pending)
            .and_then(|()| self.out.flush());
        self.pending.clear();
        if self.pending.capacity() > MAX_RECORD_BYTES {
            self.pending.shrink_to(MAX_RECORD_BYTES);
        }
        written
    }
}

impl<W: io::Write> io::Write for WholeLines<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if self.pending.ends_with(b"\n") || self.pending.len() > MAX_RECORD_BYTES {
            self.write_pending()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            self.out.flush()
        } else {
            self.write_pending()
        }
    }
}

/// Passes records at or above the level of their component (or the default level).
struct LevelFilter<D> {
    spec: LevelSpec,
    drain: D,
}

impl<D: Drain> Drain for LevelFilter<D> {
    type Ok = Option<D::Ok>;
    type Err = D::Err;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<Self::Ok, Self::Err> {
        let level = if self.spec.components.is_empty() {
            self.spec.default
        } else {
            let mut finder = ComponentFinder(None);
            let _ = record.kv().serialize(record, &mut finder);
            if finder.0.is_none() {
                let _ = values.serialize(record, &mut finder);
            }
            self.spec.for_component(finder.0.as_deref())
        };
        if record.level().is_at_least(level) {
            self.drain.log(record, values).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Captures the first `component` value it is shown.
struct ComponentFinder(Option<String>);

impl slog::Serializer for ComponentFinder {
    fn emit_arguments(&mut self, key: slog::Key, val: &fmt::Arguments<'_>) -> slog::Result {
        if self.0.is_none() && key == COMPONENT_KEY {
            self.0 = Some(val.to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::Secret;
    use std::sync::{Arc, Mutex};

    /// A writer the tests read back (also used by the events tests).
    #[derive(Clone, Default)]
    pub(crate) struct Capture(pub(crate) Arc<Mutex<Vec<u8>>>);

    impl io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_level_words_are_the_ones_read() {
        for word in LEVEL_WORDS {
            assert!(level_word(word).is_some(), "{word}");
            assert!(level_word(&word.to_uppercase()).is_some(), "{word}");
        }
        for level in (1..=6).filter_map(slog::Level::from_usize) {
            assert!(LEVEL_WORDS.contains(&level_name(level)), "{level:?}");
        }
        assert_eq!(level_word("loud"), None);
    }

    #[test]
    fn json_lines_carry_event_and_mask_secrets() {
        let capture = Capture::default();
        let logging = build(capture.clone(), LogFormat::Json, Level::Info, "svc", "1.0");
        slog::info!(logging.logger, "THING_HAPPENED"; "password" => Secret::new("hunter2"), "n" => 3);
        slog::debug!(logging.logger, "TOO_CHATTY");
        drop(logging);
        let out = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let record: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(record["event"], "THING_HAPPENED");
        assert_eq!(record["level"], "info");
        assert_eq!(record["service"], "svc");
        assert_eq!(record["password"], "********");
        assert!(!out.contains("hunter2"));
    }

    /// Accepts writes only while `open` is set; records every accepted byte.
    #[derive(Clone, Default)]
    struct Flaky {
        open: Arc<std::sync::atomic::AtomicBool>,
        written: Capture,
    }

    impl io::Write for Flaky {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.open.load(std::sync::atomic::Ordering::SeqCst) {
                self.written.write(buf)
            } else {
                Err(io::ErrorKind::BrokenPipe.into())
            }
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn unwritable_lines_are_dropped_whole_and_counted_and_writing_resumes() {
        use std::sync::atomic::Ordering::SeqCst;
        let out = Flaky::default();
        out.open.store(true, SeqCst);
        // Behind a LineWriter, as stdout is: what it failed to write, it would keep.
        let json = slog_json::Json::new(WholeLines::new(io::LineWriter::new(out.clone())))
            .set_newlines(true)
            .add_key_value(o!("event" => slog::PushFnValue(|r, ser| ser.emit(r.msg()))))
            .build();
        // Synchronous, so each record's fate is known when `log` returns.
        let logger = Logger::root(Mutex::new(DropFailed(json)).fuse(), o!());
        let dropped = || dropped_log_lines().get();
        slog::info!(logger, "BEFORE"; "n" => 1);
        out.open.store(false, SeqCst);
        let before = dropped();
        slog::info!(logger, "LOST"; "n" => 2);
        slog::info!(logger, "LOST"; "n" => 3);
        // Other tests may drop lines meanwhile (the counter is the process's): at least ours.
        assert!(dropped() >= before + 2);
        out.open.store(true, SeqCst);
        slog::info!(logger, "AFTER"; "n" => 4);
        let written = String::from_utf8(out.written.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            written,
            "{\"event\":\"BEFORE\",\"n\":1}\n{\"event\":\"AFTER\",\"n\":4}\n"
        );
    }

    #[test]
    fn component_levels_override_the_default() {
        let capture = Capture::default();
        let spec = parse_level_spec(Some("warn, peers=debug")).unwrap();
        let logging = build(capture.clone(), LogFormat::Json, spec, "svc", "1.0");
        let peers = logging.logger.new(o!("component" => "peers"));
        slog::debug!(peers, "PEER_CHATTY");
        slog::info!(logging.logger, "ROOT_INFO");
        slog::error!(logging.logger, "ROOT_ERROR");
        drop((peers, logging));
        let out = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        let events: Vec<String> = out
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .map(|r| format!("{} {}", r["level"].as_str().unwrap(), r["event"]))
            .collect();
        assert_eq!(events, ["debug \"PEER_CHATTY\"", "error \"ROOT_ERROR\""]);
    }

    #[test]
    fn text_on_a_terminal_json_otherwise_unless_set() {
        let format = |f, terminal| LogSettings::parse(None, f, terminal).unwrap().format;
        assert_eq!(format(None, true), LogFormat::Text);
        assert_eq!(format(None, false), LogFormat::Json);
        assert_eq!(format(Some("json"), true), LogFormat::Json);
        assert_eq!(format(Some("text"), false), LogFormat::Text);
    }

    #[test]
    fn the_compile_time_cap_lets_trace_through() {
        // slog's default cap is debug in debug builds and info in release builds.
        assert_eq!(slog::__slog_static_max_level(), slog::FilterLevel::Trace);
    }

    #[test]
    fn level_and_format_parse_or_name_the_variable() {
        for bad in ["loud", "info,peers", "info,=debug", "info,peers=loud", ""] {
            assert_eq!(
                parse_level_spec(Some(bad)).unwrap_err().key,
                LEVEL_VAR,
                "{bad}"
            );
        }
        assert_eq!(
            parse_level_spec(Some("DEBUG")).unwrap(),
            LevelSpec::new(Level::Debug)
        );
        assert_eq!(parse_level_spec(None).unwrap(), LevelSpec::new(Level::Info));
        assert_eq!(parse_level_spec(Some("loud")).unwrap_err().key, LEVEL_VAR);
        assert_eq!(parse_format(Some("text")).unwrap(), LogFormat::Text);
        assert_eq!(parse_format(Some("xml")).unwrap_err().key, FORMAT_VAR);
    }

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |var| {
            vars.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn log_variables_parse_and_print() {
        let l = Layered::<LogVars>::default();
        assert_eq!(l.values.level, LevelSpec::new(slog::Level::Info));
        let mut l = Layered::<LogVars>::default();
        l.apply_env(&env(&[("GORGE_LOG_LEVEL", "warn,peers=debug")]), &[])
            .unwrap();
        assert_eq!(LogLevel::show(&l.values.level), "warn,peers=debug");
        let err = Layered::<LogVars>::default()
            .apply_env(&env(&[("GORGE_LOG_FORMAT", "xml")]), &[])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: GORGE_LOG_FORMAT=\"xml\": expected json or text"
        );
    }
}
