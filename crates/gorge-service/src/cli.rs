//! The command line every service binary shares — `--config PATH`, `--env-file PATH`,
//! `--check-config` and the `healthcheck` subcommand — and the last step of `main`: run the service on a tokio runtime,
//! flush the logs, exit with the service's code.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use slog::Logger;

use crate::config::ConfigError;
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

/// Use as the binary's `#[command(subcommand)] command: Option<Command>`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Probe GET /healthz on the configured health address (defaults, --config, environment,
    /// as the service reads them) and exit 0 when healthy, 1 with the reason on stderr if not.
    Healthcheck {
        /// Probe 127.0.0.1:PORT instead of the configured health address.
        #[arg(long)]
        port: Option<u16>,
    },
}

/// The `healthcheck` subcommand: probes `127.0.0.1:port` when `--port` was given, else the
/// health address `configured` returns (loaded exactly as the service loads it; a wildcard
/// address is probed on loopback). Exits 0 when healthy; otherwise prints one line on stderr
/// and exits 1 — also for an invalid configuration, because Docker reserves exit code 2 of a
/// HEALTHCHECK command.
pub fn exit_healthcheck(
    port: Option<u16>,
    configured: impl FnOnce() -> Result<SocketAddr, ConfigError>,
) -> ! {
    let addr = match port {
        Some(0) => {
            eprintln!("healthcheck: --port 0 is not a port: expected 1-65535");
            std::process::exit(1)
        }
        Some(port) => SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        None => match configured() {
            Ok(listen) => crate::healthcheck::probe_target(listen),
            Err(err) => {
                eprintln!("healthcheck: {err}");
                std::process::exit(1)
            }
        },
    };
    std::process::exit(crate::healthcheck::healthcheck(addr))
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
