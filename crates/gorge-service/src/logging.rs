//! Logging on slog: JSON lines (default) or human-readable text, the level from
//! `GORGE_LOG_LEVEL`, and an asynchronous drain so a slow stdout never stalls a request.

use std::io;

use slog::{o, Drain, Level, Logger};

use crate::config::{env_value, ConfigError};

pub const LEVEL_VAR: &str = "GORGE_LOG_LEVEL";
pub const FORMAT_VAR: &str = "GORGE_LOG_FORMAT";

/// How many records the async drain buffers before it drops (and counts) new ones.
const ASYNC_CHANNEL_SIZE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// The root logger plus the guard that flushes buffered records when dropped. Keep it alive
/// until the process exits.
pub struct Logging {
    pub logger: Logger,
    _guard: slog_async::AsyncGuard,
}

/// Reads `GORGE_LOG_LEVEL` (default `info`) and `GORGE_LOG_FORMAT` (default `json`); an
/// unknown value is a configuration error naming the variable.
pub fn init_logging(service: &'static str, version: &'static str) -> Result<Logging, ConfigError> {
    let level = parse_level(env_value(LEVEL_VAR).as_deref())?;
    let format = parse_format(env_value(FORMAT_VAR).as_deref())?;
    Ok(build(io::stdout(), format, level, service, version))
}

pub fn parse_level(value: Option<&str>) -> Result<Level, ConfigError> {
    match value.map(str::to_ascii_lowercase).as_deref() {
        None | Some("info") => Ok(Level::Info),
        Some("trace") => Ok(Level::Trace),
        Some("debug") => Ok(Level::Debug),
        Some("warn" | "warning") => Ok(Level::Warning),
        Some("error") => Ok(Level::Error),
        Some("critical") => Ok(Level::Critical),
        Some(_) => Err(ConfigError::new(
            LEVEL_VAR,
            value.unwrap_or_default(),
            "expected one of trace, debug, info, warn, error, critical",
        )),
    }
}

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

/// Builds a logger writing to `out`; exposed so tests can capture output.
pub fn build<W: io::Write + Send + 'static>(
    out: W,
    format: LogFormat,
    level: Level,
    service: &'static str,
    version: &'static str,
) -> Logging {
    match format {
        LogFormat::Json => {
            let json = slog_json::Json::new(out)
                .set_newlines(true)
                .add_key_value(o!(
                    "ts" => slog::PushFnValue(|_, ser| ser.emit(timestamp())),
                    "level" => slog::FnValue(|record| record.level().as_short_str()),
                    "event" => slog::PushFnValue(|record, ser| ser.emit(record.msg())),
                ))
                .build()
                .fuse();
            finish(json, level, service, version)
        }
        LogFormat::Text => {
            let decorator = slog_term::PlainDecorator::new(out);
            let text = slog_term::FullFormat::new(decorator).build().fuse();
            finish(text, level, service, version)
        }
    }
}

fn finish<D>(drain: D, level: Level, service: &'static str, version: &'static str) -> Logging
where
    D: Drain<Ok = (), Err = slog::Never> + Send + 'static,
{
    let (drain, guard) = slog_async::Async::new(drain)
        .chan_size(ASYNC_CHANNEL_SIZE)
        .overflow_strategy(slog_async::OverflowStrategy::DropAndReport)
        .build_with_guard();
    let drain = drain.filter_level(level).fuse();
    Logging {
        logger: Logger::root(drain, o!("service" => service, "version" => version)),
        _guard: guard,
    }
}

/// RFC 3339 UTC timestamp with milliseconds.
fn timestamp() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

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
        assert_eq!(record["level"], "INFO");
        assert_eq!(record["service"], "svc");
        assert_eq!(record["password"], "********");
        assert!(!out.contains("hunter2"));
    }

    #[test]
    fn level_and_format_parse_or_name_the_variable() {
        assert_eq!(parse_level(None).unwrap(), Level::Info);
        assert_eq!(parse_level(Some("DEBUG")).unwrap(), Level::Debug);
        assert_eq!(parse_level(Some("loud")).unwrap_err().key, LEVEL_VAR);
        assert_eq!(parse_format(Some("text")).unwrap(), LogFormat::Text);
        assert_eq!(parse_format(Some("xml")).unwrap_err().key, FORMAT_VAR);
    }
}
