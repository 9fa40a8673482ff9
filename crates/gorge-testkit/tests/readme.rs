//! README.md tells a new machine what the test suite needs: every prerequisite of
//! `gorge_testkit::prerequisites::ALL`, with its install line, in the section that gives the
//! test command, so `cargo test --workspace --locked` never needs something README keeps quiet
//! about.

use std::path::Path;

use gorge_testkit::prerequisites::ALL;

/// The text of README.md's section headed `heading`, up to the next heading of any level.
fn section(readme: &str, heading: &str) -> String {
    let start = readme
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README.md has no heading `{heading}`"));
    let rest = &readme[start + heading.len() + 2..];
    let end = rest.find("\n#").unwrap_or(rest.len());
    rest[..end].to_string()
}

#[test]
fn readme_names_every_test_prerequisite_with_its_install_line() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let tests = section(&readme, "### Run the whole test suite");
    assert!(
        tests.contains("\ncargo test --workspace --locked\n"),
        "README's test section lost the test command:\n{tests}"
    );
    for prerequisite in ALL {
        assert!(
            tests.contains(&format!("| {} |", prerequisite.name))
                && tests.contains(&format!("`{}`", prerequisite.install)),
            "README's test section does not name {} with `{}` (needed by {}):\n{tests}",
            prerequisite.name,
            prerequisite.install,
            prerequisite.needed_by
        );
    }
}

/// The build command README gives, and the only one README and docs/operations.md give: two
/// different package sets make cargo build the shared dependencies twice.
const BUILD: &str = "cargo build --release --locked -p gorge-notification -p gorge-webhook";

#[test]
fn readme_and_operations_give_one_build_command() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let build = section(&readme, "### Build and run");
    assert!(
        build.contains(&format!("\n{BUILD}\n")),
        "README's build section does not give `{BUILD}`:\n{build}"
    );
    for page in ["README.md", "docs/operations.md"] {
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        for verb in ["cargo build ", "cargo run "] {
            for (at, _) in text.match_indices(verb) {
                let command: String = text[at..]
                    .chars()
                    .take_while(|c| *c != '`' && *c != '\n')
                    .collect();
                assert_eq!(command.trim_end(), BUILD, "{page}: another build command");
            }
        }
    }
}
