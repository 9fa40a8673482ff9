//! The crate graph drawn in docs/architecture.md is the one Cargo builds, and no crate's
//! modules import each other in a cycle: `cargo test` alone guards both, not only `.ci/run`.
//! The checks themselves are `scripts/check-architecture.py` (which reads `cargo metadata`)
//! and `scripts/check-module-cycles.py` (one implementation each, also run by CI); each
//! `--self-test` proves its check fails on a wrong input.

use std::path::Path;
use std::process::Command;

fn run(script: &str, args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("python3")
        .arg(root.join(script))
        .args(args)
        .current_dir(&root)
        // The cargo running this test, whatever PATH says.
        .env("CARGO", env!("CARGO"))
        .output()
        .unwrap_or_else(|e| panic!("python3 runs {script} (install python3): {e}"));
    assert!(
        out.status.success(),
        "{script} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_crate_graph_in_docs_is_the_one_cargo_builds() {
    run("scripts/check-architecture.py", &[]);
}

#[test]
fn the_check_fails_on_a_wrong_drawing() {
    run("scripts/check-architecture.py", &["--self-test"]);
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    run("scripts/check-module-cycles.py", &[]);
}

#[test]
fn the_cycle_check_finds_cycles() {
    run("scripts/check-module-cycles.py", &["--self-test"]);
}
