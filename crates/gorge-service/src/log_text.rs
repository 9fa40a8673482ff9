//! The text log format (`GORGE_LOG_FORMAT=text`): one line per record,
//! `<RFC 3339 UTC time> <LEVEL> <EVENT>, key: value, …`, for a person reading a terminal or
//! a journal.
//!
//! Written here rather than with slog-term, whose lines carry a local time without year or
//! zone (`Dec 07 17:50:37.880`: which day of which year, in which zone, is a guess once the
//! line is copied into a ticket) and print an absent optional value as `dns: None`. Here the
//! time is the JSON format's (`ts`), and a key whose value is absent is left out (JSON writes
//! it as `null`).

use std::fmt::{self, Write as _};
use std::io;
use std::sync::Mutex;

use slog::{Drain, Key, OwnedKVList, Record, KV};

/// Writes each record as one text line to `out`, whole (one `write_all`).
pub struct TextLines<W> {
    out: Mutex<W>,
}

impl<W: io::Write> TextLines<W> {
    /// Lines go to `out`.
    pub fn new(out: W) -> Self {
        TextLines {
            out: Mutex::new(out),
        }
    }
}

impl<W: io::Write> Drain for TextLines<W> {
    type Ok = ();
    type Err = io::Error;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> io::Result<()> {
        let line = format_line(&timestamp(), record, values);
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        out.write_all(line.as_bytes())?;
        out.flush()
    }
}

/// RFC 3339 UTC timestamp with milliseconds: the `ts` of JSON lines, the start of text lines.
pub(crate) fn timestamp() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// The line of `record` at `time`: the record's own keys, then its logger's.
fn format_line(time: &str, record: &Record<'_>, values: &OwnedKVList) -> String {
    let mut line = Line(String::with_capacity(256));
    let _ = write!(
        line.0,
        "{time} {} {}",
        record.level().as_short_str(),
        record.msg()
    );
    let _ = record.kv().serialize(record, &mut line);
    let _ = values.serialize(record, &mut line);
    line.0.push('\n');
    line.0
}

/// Appends `, key: value` for every key but those without a value.
struct Line(String);

impl slog::Serializer for Line {
    fn emit_arguments(&mut self, key: Key, val: &fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, ", {key}: {val}");
        Ok(())
    }

    fn emit_none(&mut self, _key: Key) -> slog::Result {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slog::Level;

    #[test]
    fn a_line_has_the_full_time_the_event_and_no_absent_values() {
        // The year, milliseconds and the zone (UTC), as the JSON format's `ts`.
        let now = timestamp();
        assert!(
            now.len() == "2025-01-02T03:04:05.678Z".len() && now.ends_with('Z'),
            "{now}"
        );
        humantime::parse_rfc3339(&now).unwrap();

        let none: Option<String> = None;
        let args = format_args!("PEERS_CHANGED");
        let logger_kv = OwnedKVList::from(slog::o!("service" => "svc", "version" => "1.0"));
        let line = format_line(
            "2025-01-02T03:04:05.678Z",
            &slog::record!(
                Level::Warning,
                "",
                &args,
                slog::b!("dns" => none, "peers" => Some(2), "error" => %"timed out")
            ),
            &logger_kv,
        );
        assert_eq!(
            line,
            "2025-01-02T03:04:05.678Z WARN PEERS_CHANGED, error: timed out, peers: 2, \
             version: 1.0, service: svc\n"
        );
    }
}
