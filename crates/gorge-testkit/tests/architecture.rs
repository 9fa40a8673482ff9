//! The crate graph drawn in docs/architecture.md is the one Cargo builds: `cargo test` alone
//! guards the map, not only `.ci/run`. The check itself is `scripts/check-architecture.py`
//! (one implementation, also run by CI), which reads `cargo metadata`; its `--self-test`
//! proves the comparison fails on a wrong drawing.

use std::path::Path;
use std::process::Command;

fn check(args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("python3")
        .arg(root.join("scripts/check-architecture.py"))
        .args(args)
        .current_dir(&root)
        // The cargo running this test, whatever PATH says.
        .env("CARGO", env!("CARGO"))
        .output()
        .expect("python3 runs scripts/check-architecture.py (install python3)");
    assert!(
        out.status.success(),
        "check-architecture.py {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_crate_graph_in_docs_is_the_one_cargo_builds() {
    check(&[]);
}

#[test]
fn the_check_fails_on_a_wrong_drawing() {
    check(&["--self-test"]);
}
