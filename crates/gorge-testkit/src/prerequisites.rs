//! What `cargo test --workspace` needs besides Rust, declared once. README.md's "Run the whole
//! test suite" names each with its install line (`tests/readme.rs` holds it to this list), and
//! a test that needs one calls [`require`] before using it, so a machine without it fails
//! naming the line to run instead of "No such file or directory".

use std::process::{Command, Stdio};

/// One thing the test suite needs from the machine.
#[derive(Debug)]
pub struct Prerequisite {
    /// The name README uses for it (a program, or what the tests talk to).
    pub name: &'static str,
    /// Which tests need it.
    pub needed_by: &'static str,
    /// The command that installs it on Debian 12 (as root), as README writes it.
    pub install: &'static str,
    check: Check,
}

#[derive(Debug)]
enum Check {
    /// An executable of this name on `PATH`.
    Program(&'static str),
    /// `python3` on `PATH` imports this module.
    PythonModule(&'static str),
    /// A server the tests connect to; its own client says what is wrong.
    Server,
}

/// Everything, in README's order.
pub const ALL: &[Prerequisite] = &[
    Prerequisite {
        name: "MariaDB",
        needed_by: "the database tests (gorge-claim, gorge-webhook): 127.0.0.1:3306 as root \
                    with an empty password, or GORGE_TEST_MYSQL_URL",
        // Debian's root@localhost logs in through the unix socket only; the tests connect
        // over TCP.
        install: "apt-get install mariadb-server && service mariadb start && mariadb -e \
                  'CREATE USER IF NOT EXISTS root@127.0.0.1; \
                  GRANT ALL ON *.* TO root@127.0.0.1 WITH GRANT OPTION'",
        check: Check::Server,
    },
    Prerequisite {
        name: "redis-server",
        needed_by: "gorge-notification's broker tests, which start their own",
        install: "apt-get install redis-server",
        check: Check::Program("redis-server"),
    },
    Prerequisite {
        name: "promtool",
        needed_by: "the monitoring tests (alerting rules and dashboards against /metrics)",
        install: "apt-get install --no-install-recommends prometheus",
        check: Check::Program("promtool"),
    },
    Prerequisite {
        name: "chromium",
        needed_by: "gorge-notification's browser test (a real headless browser over wss://)",
        install: "apt-get install chromium",
        check: Check::Program("chromium"),
    },
    Prerequisite {
        name: "PyYAML",
        needed_by: "the monitoring tests' scripts/check-monitoring.py, for the python3 on PATH",
        install: "apt-get install python3-yaml",
        check: Check::PythonModule("yaml"),
    },
];

/// Panics, naming the install line, unless the prerequisite called `name` is present.
pub fn require(name: &str) {
    let prerequisite = ALL
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("{name} is not in gorge_testkit::prerequisites::ALL"));
    let present = match prerequisite.check {
        Check::Program(program) => on_path(program),
        Check::PythonModule(module) => Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success()),
        Check::Server => true,
    };
    assert!(
        present,
        "{name} is missing; {} need it. Install it with `{}` (README.md, \"Run the whole test \
         suite\", lists everything the tests need)",
        prerequisite.needed_by, prerequisite.install
    );
}

fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_on_path_only() {
        assert!(on_path("sh"));
        assert!(!on_path("gorge-no-such-program"));
    }

    #[test]
    fn an_unknown_name_is_a_mistake_in_the_test() {
        let err = std::panic::catch_unwind(|| require("gorge-no-such-prerequisite")).unwrap_err();
        let message = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            message.contains("not in gorge_testkit::prerequisites::ALL"),
            "{message}"
        );
    }
}
