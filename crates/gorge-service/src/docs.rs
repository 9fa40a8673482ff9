//! The tables in docs/ that are generated from a declaration (settings, metric families, log
//! events), and the chart's settings catalog: rendering them, and the check each service's
//! tests run, which fails when the file disagrees with the code. `GORGE_BLESS_DOCS=1 cargo test …` rewrites the
//! table in place instead, so a change to a declaration is one edit plus one command.

use std::path::Path;
use std::sync::Mutex;

/// The variable that makes [`check_table`] rewrite the docs instead of failing.
pub const BLESS_VAR: &str = "GORGE_BLESS_DOCS";

/// A Markdown table: the header, the separator, one line per row (`|` in cells escaped).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let line = |cells: &mut dyn Iterator<Item = String>| {
        let cells: Vec<String> = cells.collect();
        format!("| {} |\n", cells.join(" | "))
    };
    let mut out = line(&mut header.iter().map(|h| h.to_string()));
    out.push_str(&format!("|{}\n", "---|".repeat(header.len())));
    for row in rows {
        out.push_str(&line(&mut row.iter().map(|cell| cell.replace('|', "\\|"))));
    }
    out
}

/// Checks that the Markdown file at `path` holds `table`, found by its first line (the
/// header, which must occur once); panics naming the first row that differs. With
/// [`BLESS_VAR`] set, writes `table` in place of the old one instead.
pub fn check_table(path: &Path, table: &str) {
    // Tests of one binary check (and bless) several tables of one file in parallel.
    static FILES: Mutex<()> = Mutex::new(());
    let _guard = FILES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header = table.lines().next().unwrap_or_default();
    let starts: Vec<usize> = text
        .match_indices(&format!("\n{header}\n"))
        .map(|(i, _)| i + 1)
        .collect();
    let [start] = starts[..] else {
        panic!(
            "{}: expected the table header `{header}` exactly once, found it {} times",
            path.display(),
            starts.len()
        );
    };
    let len: usize = text[start..]
        .split_inclusive('\n')
        .take_while(|line| line.starts_with('|'))
        .map(str::len)
        .sum();
    let found = &text[start..start + len];
    if found == table {
        return;
    }
    if std::env::var_os(BLESS_VAR).is_some() {
        let updated = format!("{}{table}{}", &text[..start], &text[start + len..]);
        std::fs::write(path, updated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    disagrees(path, table, found)
}

/// Panics naming the first line where `found` (in the file at `path`) differs from `want`.
fn disagrees(path: &Path, want: &str, found: &str) -> ! {
    let differs = want
        .lines()
        .zip(found.lines().chain(std::iter::repeat("(it ends here)")))
        .find(|(want, have)| want != have)
        .map(|(want, have)| format!("the code says\n  {want}\nthe file says\n  {have}"))
        .unwrap_or_else(|| "the file has lines the code does not declare".to_string());
    panic!(
        "{} disagrees with the declaration: {differs}\n\
         (rerun with {BLESS_VAR}=1 to rewrite it from the code)",
        path.display()
    );
}

/// Checks that the file at `path` is `content`, a whole file generated from a declaration
/// (the chart's settings catalog); panics naming the first line that differs. With
/// [`BLESS_VAR`] set, writes `content` instead.
pub fn check_file(path: &Path, content: &str) {
    let found = std::fs::read_to_string(path).unwrap_or_default();
    if found == content {
        return;
    }
    if std::env::var_os(BLESS_VAR).is_some() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        std::fs::write(path, content).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    disagrees(path, content, &found)
}

/// Checks that the page at `path` names, in its prose, the components a per-component
/// `GORGE_LOG_LEVEL` accepts (`crate::events::components` of the service's events), exactly
/// as declared: "Components of this service: `a`, `b`." (line breaks in the page count as
/// spaces).
pub fn check_components(path: &Path, components: &[&str]) {
    let names: Vec<String> = components.iter().map(|c| format!("`{c}`")).collect();
    let sentence = format!("Components of this service: {}.", names.join(", "));
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace('\n', " ");
    assert!(
        text.contains(&sentence),
        "{} does not say: {sentence}",
        path.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_render_escape_and_are_checked_and_blessed() {
        let t = table(&["A", "B"], &[vec!["`x`".into(), "a | b".into()]]);
        assert_eq!(t, "| A | B |\n|---|---|\n| `x` | a \\| b |\n");
        let dir = std::env::temp_dir().join(format!("gorge-docs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("page.md");
        std::fs::write(&path, format!("# Page\n\n{t}\nafter\n")).unwrap();
        check_table(&path, &t);
        let changed = table(&["A", "B"], &[vec!["`y`".into(), "c".into()]]);
        let err = std::panic::catch_unwind(|| check_table(&path, &changed)).unwrap_err();
        let message = err.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("| `y` | c |") && message.contains("| `x` | a \\| b |"),
            "{message}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
