//! The command line every service binary shares — `--config PATH`, `--env-file PATH`,
//! `--check-config` and the `healthcheck` subcommand — and the last step of `main`: run the service on a tokio runtime,
//! flush the logs, exit with the service's code.
//!
//! Exit codes (docs/operations.md, "Exit codes", is the one table): 0 success; 1 a runtime
//! failure; 2 an invalid configuration or command line ([`crate::config::CONFIG_EXIT_CODE`],
//! clap's usage error); except `healthcheck`, which exits 0 when healthy and
//! [`EXIT_FAILED`](crate::healthcheck::EXIT_FAILED) for everything else, its own usage errors included, each as one
//! line `healthcheck: …` ([`crate::healthcheck::exit_failed`]): Docker reserves exit code 2 of a
//! HEALTHCHECK command.

use std::ffi::OsString;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use slog::Logger;

use crate::config::ConfigError;
use crate::healthcheck::{
    exit_failed as exit_healthcheck_failed, HealthTarget, SUBCOMMAND as HEALTHCHECK,
};
use crate::logging::Logging;

/// Flatten into a binary's `clap::Parser` with `#[command(flatten)]`.
#[derive(Debug, clap::Args)]
pub struct CommonArgs {
    /// Configuration file, layered between the built-in defaults and the environment.
    /// Global so that `healthcheck --config PATH` reads the same file as the service.
    #[arg(long, value_name = "PATH", global = true)]
    pub config: Option<PathBuf>,
    /// Read NAME=value lines into the environment first, exactly as systemd's
    /// EnvironmentFile= reads the file (its values replace inherited ones): check what the
    /// unit's service sees with `--env-file FILE --check-config`.
    #[arg(long, value_name = "PATH", global = true)]
    pub env_file: Option<PathBuf>,
    /// Validate the configuration, print the effective values (secrets masked) and exit.
    #[arg(long)]
    pub check_config: bool,
    /// Print a configuration file holding every setting with its effective value (the
    /// defaults when nothing is set) and exit.
    #[arg(long, conflicts_with = "check_config")]
    pub print_config: bool,
}

impl CommonArgs {
    /// Sets the variables of `--env-file`, if given, in this process's environment. Call
    /// first in `main`, before any thread starts and before the configuration is read.
    pub fn apply_env_file(&self) -> Result<(), ConfigError> {
        match &self.env_file {
            Some(path) => crate::envfile::apply(path),
            None => Ok(()),
        }
    }
}

/// The options of [`CommonArgs`] that take a value (the next argument, unless given as
/// `--name=value`), so that [`parse`] can find the subcommand among the arguments.
const VALUE_OPTIONS: [&str; 2] = ["--config", "--env-file"];

/// Use as the binary's `#[command(subcommand)] command: Option<Command>`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Probe GET /healthz on the configured health address (defaults, --config, environment,
    /// as the service reads them) and exit 0 when healthy, 1 with the reason on stderr if not
    /// (an invalid configuration or argument included; never 2, which Docker reserves).
    Healthcheck {
        /// Probe 127.0.0.1:PORT (1-65535) instead of the configured health address.
        // Text, checked by `exit_healthcheck`: clap's own error for `--port 70000` would
        // exit 2 in its own words.
        #[arg(long, value_name = "PORT")]
        port: Option<String>,
    },
}

/// Parses the command line as `P::parse()` does, except for the `healthcheck` subcommand: an
/// unknown or malformed argument of it exits [`EXIT_FAILED`](crate::healthcheck::EXIT_FAILED) with one line
/// `healthcheck: …` instead of clap's usage text and exit code 2. `--help` and `--version`
/// print and exit 0 as usual; any other usage error exits 2 with clap's message.
pub fn parse<P: clap::Parser>() -> P {
    parse_from(std::env::args_os())
}

/// [`parse`] of the given arguments (the first is the program).
pub fn parse_from<P: clap::Parser>(args: impl IntoIterator<Item = OsString>) -> P {
    let args: Vec<OsString> = args.into_iter().collect();
    match P::try_parse_from(&args) {
        Ok(parsed) => parsed,
        Err(err) => {
            use clap::error::ErrorKind;
            let shown = matches!(
                err.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            );
            if shown || subcommand(&args).as_deref() != Some(HEALTHCHECK) {
                err.exit()
            }
            exit_healthcheck_failed(usage_error_line(&err))
        }
    }
}

/// The subcommand named on a command line: its first argument that is neither an option nor
/// the value of one of [`VALUE_OPTIONS`].
fn subcommand(args: &[OsString]) -> Option<String> {
    let mut args = args.iter().skip(1).map(|a| a.to_string_lossy());
    while let Some(arg) = args.next() {
        if VALUE_OPTIONS.contains(&arg.as_ref()) {
            args.next();
        } else if !arg.starts_with('-') {
            return Some(arg.into_owned());
        }
    }
    None
}

/// clap's message in one line, without its `error: ` prefix and usage text, and where to
/// look instead.
fn usage_error_line(err: &clap::Error) -> String {
    let text = err.render().to_string();
    let first = text.lines().next().unwrap_or_default();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    format!("{first} (see {HEALTHCHECK} --help)")
}

/// The `healthcheck` subcommand: probes `127.0.0.1:port` when `--port` was given, else the
/// health address `configured` returns (loaded exactly as the service loads it; a wildcard
/// address is probed on loopback). Exits 0 when healthy; otherwise prints one line on stderr
/// and exits [`EXIT_FAILED`](crate::healthcheck::EXIT_FAILED) — also for an invalid `--port` or configuration.
/// A health port that serves TLS is probed over TLS.
pub fn exit_healthcheck(
    port: Option<String>,
    configured: impl FnOnce() -> Result<HealthTarget, ConfigError>,
) -> ! {
    let target = match port {
        Some(text) => match text.parse::<u16>() {
            // The port given, over TLS when the configured health port serves TLS.
            Ok(port) if port != 0 => HealthTarget {
                addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                tls: configured().is_ok_and(|target| target.tls),
            },
            _ => exit_healthcheck_failed(format!("--port {text} is not a port: expected 1-65535")),
        },
        None => match configured() {
            Ok(target) => HealthTarget {
                addr: crate::healthcheck::probe_target(target.addr),
                tls: target.tls,
            },
            Err(err) => exit_healthcheck_failed(err),
        },
    };
    std::process::exit(crate::healthcheck::healthcheck(target))
}

/// Runs `service` on a multi-threaded runtime and exits with the code it returns, after the
/// runtime has stopped and every buffered log line has been written.
pub fn run_to_exit<F>(logging: Logging, service: impl FnOnce(Logger) -> F) -> !
where
    F: Future<Output = i32>,
{
    let code = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => {
            let code = runtime.block_on(service(logging.logger.clone()));
            drop(runtime);
            code
        }
        Err(err) => {
            eprintln!("cannot start the async runtime: {err}");
            1
        }
    };
    drop(logging);
    std::process::exit(code)
}
