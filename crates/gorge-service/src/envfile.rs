//! `--env-file PATH`: reads a `NAME=value` file exactly as systemd's `EnvironmentFile=` reads
//! it, so that a check run by hand (`gorge-webhook --env-file /etc/gorge/gorge-webhook.env
//! --check-config`) sees the values the unit's service sees — without a shell, so a `'` in a
//! password or spaces in a list cannot break it, and without the password in argv.
//!
//! The rules are systemd's (systemd.exec(5), "EnvironmentFile=", and its parser in
//! `src/basic/env-file.c`, v254 and later):
//!
//! - blank lines, and lines whose first non-blank character is `#` or `;`, are comments; a
//!   comment ends at its line even when it ends with `\`;
//! - a line without `=` is skipped; blanks around the name are dropped;
//! - an unquoted value loses its leading and trailing blanks, keeps interior ones, takes `\x`
//!   as `x`, and a `\` at the end of a line joins the next line; quotes after the first
//!   character are kept as they are;
//! - `'…'` keeps everything verbatim (newlines too) up to the next `'`;
//! - `"…"` may span lines; `\"`, `\\`, `` \` `` and `\$` lose their backslash, `\` before a
//!   newline joins lines, any other `\x` is kept as both characters;
//! - quoted and unquoted pieces after `=` are joined (`A='x'"y"z` is `xyz`); blanks between
//!   them are dropped;
//! - a later assignment of a name replaces an earlier one.
//!
//! Where systemd *ignores* a line (a name that is not letters, digits and `_` — such as
//! `export NAME=…` — or one starting with a digit), this module refuses the file instead,
//! naming the line: the service would silently run without that value, which is what a
//! check must say. A NUL or invalid UTF-8 is refused too (systemd rejects the file, or stops
//! reading at the NUL).
//!
//! Only a regular file of at most [`MAX_BYTES`] is read (`/dev/zero` or a FIFO would be read
//! until memory runs out, or forever), and parsing is linear in the file's length.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use crate::config::ConfigError;

/// The command-line option, as errors name it.
pub const OPTION: &str = "--env-file";

/// The largest file read. An environment file holds a few dozen settings (a few KiB); a
/// larger one is a mistake (the wrong path), refused before it is read.
pub const MAX_BYTES: u64 = 1 << 20;

/// The assignments of `text` in file order (later duplicates replace earlier ones), or the
/// reason the file is refused, with its line number.
pub fn parse(text: &str) -> Result<Vec<(String, String)>, String> {
    if text.contains('\0') {
        return Err("contains a NUL byte".to_string());
    }
    let mut parser = Parser::default();
    for c in text.chars() {
        parser.step(c)?;
    }
    parser.finish()?;
    Ok(parser.assignments.into_iter().flatten().collect())
}

/// Reads the file at `path` and sets its assignments in this process's environment,
/// replacing inherited values (as `EnvironmentFile=` replaces `Environment=`). Call before
/// any thread starts.
pub fn apply(path: &Path) -> Result<(), ConfigError> {
    let shown = path.display().to_string();
    let bad = |reason: String| ConfigError::new(OPTION, &shown, reason);
    let bytes = read_bounded(path).map_err(bad)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| bad("not UTF-8 (systemd refuses such a file too)".to_string()))?;
    for (name, value) in parse(&text).map_err(bad)? {
        // Single-threaded here: `main` calls this before logging or the runtime start.
        std::env::set_var(name, value);
    }
    Ok(())
}

/// The bytes of the regular file at `path`, if it holds at most [`MAX_BYTES`]; the reason
/// otherwise. The checks are made on the opened file, so the file read is the file checked.
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read the file: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read the file: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "is not a regular file ({}): give the path of a NAME=value file",
            file_kind(&meta.file_type())
        ));
    }
    let too_big = |size: u64| {
        format!(
            "the file holds {size} bytes, over the {MAX_BYTES} an environment file may hold \
             (it holds NAME=value settings)"
        )
    };
    if meta.len() > MAX_BYTES {
        return Err(too_big(meta.len()));
    }
    // Bounded again while reading: the file may grow between the check and the read.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the file: {e}"))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// What a file that is not a regular one is, in a word or two.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a name: blanks skipped, `#`/`;` start a comment.
    PreKey,
    Key,
    /// After `=` or a closing quote: blanks skipped.
    PreValue,
    Value,
    ValueEscape,
    SingleQuoted,
    DoubleQuoted,
    DoubleQuotedEscape,
    Comment,
    CommentEscape,
}

#[derive(Debug)]
struct Parser {
    state: State,
    /// 1-based line of the current character; `start_line` is where the assignment began.
    line: usize,
    start_line: usize,
    key: String,
    value: String,
    /// Length of `value` before its trailing blanks (unquoted values lose them).
    value_end: Option<usize>,
    /// In file order; an assignment replaced by a later one of the same name is `None`.
    assignments: Vec<Option<(String, String)>>,
    /// Where each name's assignment is in `assignments`, so replacing one is O(1) and the
    /// whole parse linear (a scan per line made 50 000 lines take 16 s).
    index: HashMap<String, usize>,
}

impl Default for Parser {
    fn default() -> Self {
        Parser {
            state: State::PreKey,
            line: 1,
            start_line: 1,
            key: String::new(),
            value: String::new(),
            value_end: None,
            assignments: Vec::new(),
            index: HashMap::new(),
        }
    }
}

fn is_newline(c: char) -> bool {
    matches!(c, '\n' | '\r')
}

fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

impl Parser {
    fn step(&mut self, c: char) -> Result<(), String> {
        use State::*;
        self.state = match (self.state, c) {
            (PreKey, '#' | ';') => Comment,
            (PreKey, c) if is_blank(c) => PreKey,
            (PreKey, c) => {
                self.start_line = self.line;
                self.key.push(c);
                Key
            }
            (Key, c) if is_newline(c) => {
                // A line without `=`: skipped, as systemd skips it.
                self.key.clear();
                PreKey
            }
            (Key, '=') => PreValue,
            (Key, c) => {
                self.key.push(c);
                Key
            }
            (PreValue | Value, c) if is_newline(c) => {
                self.push()?;
                PreKey
            }
            (PreValue, '\'') => SingleQuoted,
            (PreValue, '"') => DoubleQuoted,
            (PreValue | Value, '\\') => {
                self.value_end = None;
                ValueEscape
            }
            (PreValue, c) if is_blank(c) => PreValue,
            (PreValue | Value, c) => {
                if is_blank(c) {
                    self.value_end.get_or_insert(self.value.len());
                } else {
                    self.value_end = None;
                }
                self.value.push(c);
                Value
            }
            (ValueEscape, c) => {
                // An escaped newline joins the lines; any other escaped character is itself.
                if !is_newline(c) {
                    self.value.push(c);
                }
                Value
            }
            (SingleQuoted, '\'') => PreValue,
            (SingleQuoted, c) => {
                self.value.push(c);
                SingleQuoted
            }
            (DoubleQuoted, '"') => PreValue,
            (DoubleQuoted, '\\') => DoubleQuotedEscape,
            (DoubleQuoted, c) => {
                self.value.push(c);
                DoubleQuoted
            }
            (DoubleQuotedEscape, c) => {
                match c {
                    '"' | '\\' | '`' | '$' => self.value.push(c),
                    '\n' => {}
                    c => {
                        self.value.push('\\');
                        self.value.push(c);
                    }
                }
                DoubleQuoted
            }
            (Comment, '\\') => CommentEscape,
            (Comment | CommentEscape, c) if is_newline(c) => PreKey,
            (Comment | CommentEscape, _) => Comment,
        };
        if c == '\n' {
            self.line += 1;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), String> {
        use State::*;
        match self.state {
            PreValue | Value | ValueEscape | SingleQuoted | DoubleQuoted | DoubleQuotedEscape => {
                self.push()
            }
            PreKey | Key | Comment | CommentEscape => Ok(()),
        }
    }

    fn push(&mut self) -> Result<(), String> {
        if self.state == State::Value {
            if let Some(end) = self.value_end {
                self.value.truncate(end);
            }
        }
        let key = std::mem::take(&mut self.key)
            .trim_end_matches(is_blank)
            .to_string();
        let value = std::mem::take(&mut self.value);
        self.value_end = None;
        if !is_variable_name(&key) {
            return Err(format!(
                "line {}: {key:?} is not a variable name (letters, digits and _, not starting \
                 with a digit; no `export`): systemd's EnvironmentFile= ignores this line, so \
                 the service would run without it",
                self.start_line
            ));
        }
        if let Some(earlier) = self.index.insert(key.clone(), self.assignments.len()) {
            self.assignments[earlier] = None;
        }
        self.assignments.push(Some((key, value)));
        Ok(())
    }
}

/// A name systemd accepts: letters, digits and `_`, not empty, not starting with a digit.
fn is_variable_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(text: &str) -> Vec<(String, String)> {
        parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn one(text: &str) -> String {
        let all = pairs(text);
        assert_eq!(all.len(), 1, "{text:?}: {all:?}");
        all[0].1.clone()
    }

    #[test]
    fn unquoted_values_keep_interior_blanks_and_quotes_after_the_first_character() {
        assert_eq!(one("A=  a b\t c  \n"), "a b\t c");
        assert_eq!(one("A=it's"), "it's");
        assert_eq!(one("A=x\"y\""), "x\"y\"");
        assert_eq!(one("  A  =v"), "v");
        assert_eq!(one("A=a\\ b\\\\c\\#"), "a b\\c#");
        // A trailing escaped blank is kept: only unescaped trailing blanks go.
        assert_eq!(one("A=a\\ \n"), "a ");
        assert_eq!(one("A=v # not a comment"), "v # not a comment");
        assert_eq!(one("A="), "");
        assert_eq!(one("A=\n"), "");
    }

    #[test]
    fn backslash_newline_joins_lines() {
        assert_eq!(one("A=one \\\ntwo\n"), "one two");
        assert_eq!(one("A=\"one \\\ntwo\"\n"), "one two");
        assert_eq!(one("A=x\\\r\n"), "x");
    }

    #[test]
    fn single_quotes_are_verbatim_and_may_span_lines() {
        assert_eq!(one("A='p\\a\"s$s'"), "p\\a\"s$s");
        assert_eq!(one("A='line1\nline2'"), "line1\nline2");
        assert_eq!(one("A=  'x y'  \n"), "x y");
    }

    #[test]
    fn double_quotes_unescape_only_what_the_shell_does() {
        assert_eq!(one(r#"A="a\"b\\c\`d\$e\nf""#), "a\"b\\c`d$e\\nf");
        assert_eq!(one("A=\"it's\""), "it's");
        assert_eq!(one("A=\"x\ny\""), "x\ny");
    }

    #[test]
    fn pieces_after_the_equals_sign_are_joined() {
        assert_eq!(one("A='x'\"y\"z"), "xyz");
        assert_eq!(one("A='x' 'y'"), "xy");
        // Unquoted text then a quote: the quote is literal (only the first character counts).
        assert_eq!(one("A=x'y'"), "x'y'");
    }

    #[test]
    fn comments_blank_lines_and_lines_without_equals() {
        let text = "# comment\n; also\n\n   # indented\nnot an assignment\nA=1\n#B=2\n";
        assert_eq!(pairs(text), vec![("A".to_string(), "1".to_string())]);
        // Since systemd v254 a comment ending in `\` does not swallow the next line.
        assert_eq!(
            pairs("# x \\\nA=1"),
            vec![("A".to_string(), "1".to_string())]
        );
    }

    #[test]
    fn later_assignments_replace_earlier_ones() {
        assert_eq!(
            pairs("A=1\nB=2\nA=3\n"),
            vec![
                ("B".to_string(), "2".to_string()),
                ("A".to_string(), "3".to_string())
            ]
        );
    }

    #[test]
    fn a_line_systemd_would_ignore_is_refused_with_its_number() {
        let err = parse("A=1\nexport B=2\n").unwrap_err();
        assert!(
            err.starts_with("line 2: \"export B\" is not a variable name"),
            "{err}"
        );
        assert!(parse("1A=x").unwrap_err().starts_with("line 1: \"1A\""));
        assert!(parse("A-B=x").is_err());
        assert_eq!(parse("A=\0").unwrap_err(), "contains a NUL byte");
    }

    #[test]
    fn parsing_is_linear_in_the_number_of_lines() {
        let text = |n: usize| {
            (0..n)
                .map(|i| format!("GORGE_SETTING_{i}=value {i}\n"))
                .collect::<String>()
        };
        // The fastest of three runs: the machine's other work adds time, never removes it.
        let time = |text: &str| {
            (0..3)
                .map(|_| {
                    let started = std::time::Instant::now();
                    assert!(!parse(text).unwrap().is_empty());
                    started.elapsed()
                })
                .min()
                .unwrap()
        };
        let (small, large) = (text(2_000), text(20_000));
        let (small, large) = (time(&small), time(&large));
        // Ten times the lines: about ten times the time when linear, a hundred times when
        // every assignment scanned the ones before it.
        assert!(
            large < small * 30,
            "2 000 lines: {small:?}, 20 000 lines: {large:?}"
        );
    }

    #[test]
    fn only_a_regular_file_of_bounded_size_is_read() {
        let refused = |path: &Path| apply(path).unwrap_err().to_string();
        let zero = refused(Path::new("/dev/zero"));
        assert_eq!(
            zero,
            "invalid configuration: --env-file=\"/dev/zero\": is not a regular file (a \
             character device): give the path of a NAME=value file"
        );
        let dir = tempfile::tempdir().unwrap();
        assert!(refused(dir.path()).contains(": is not a regular file (a directory)"));
        // Over the bound: refused by its size, before a byte is read (a sparse file).
        let big = tempfile::NamedTempFile::new().unwrap();
        big.as_file().set_len(MAX_BYTES + 1).unwrap();
        assert_eq!(
            refused(big.path()),
            format!(
                "invalid configuration: --env-file={:?}: the file holds 1048577 bytes, over the \
                 1048576 an environment file may hold (it holds NAME=value settings)",
                big.path().display().to_string()
            )
        );
        // At the bound: read.
        let full = tempfile::NamedTempFile::new().unwrap();
        let line = "GORGE_ENVFILE_TEST_BOUND=x\n";
        let mut text = "#".repeat(MAX_BYTES as usize - line.len() - 1);
        text.push('\n');
        text.push_str(line);
        std::fs::write(full.path(), &text).unwrap();
        apply(full.path()).unwrap();
        assert_eq!(std::env::var("GORGE_ENVFILE_TEST_BOUND").unwrap(), "x");
    }

    #[test]
    fn the_cases_that_broke_a_shell_check() {
        // A `'` in a password and a blacklist with spaces (`env $(grep … | xargs)` broke on both).
        let text = "GORGE_WEBHOOK_MYSQL_PASS=pa'ss\"w rd\n\
                    GORGE_WEBHOOK_OUTBOUND_BLACKLIST=10.0.0.0/8, 192.168.0.0/16\n";
        assert_eq!(
            pairs(text),
            vec![
                (
                    "GORGE_WEBHOOK_MYSQL_PASS".to_string(),
                    "pa'ss\"w rd".to_string()
                ),
                (
                    "GORGE_WEBHOOK_OUTBOUND_BLACKLIST".to_string(),
                    "10.0.0.0/8, 192.168.0.0/16".to_string()
                )
            ]
        );
    }
}
