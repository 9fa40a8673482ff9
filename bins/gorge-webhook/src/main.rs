//! The `gorge-webhook` binary: command line, configuration, logging, runtime.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gorge_service::config::exit_config_error;
use gorge_service::logging::init_logging;
use gorge_webhook::config::{Settings, DEFAULT_HEALTH_PORT, LISTEN_ADDR_VAR};

#[derive(Debug, Parser)]
#[command(
    name = "gorge-webhook",
    version,
    about = "Delivers Phorge's Herald webhook requests from the herald_webhookrequest table"
)]
struct Cli {
    /// Optional TOML or JSON file (by extension) layered between defaults and environment.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Print the effective configuration (secrets masked) and exit.
    #[arg(long)]
    check_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Probe this service's /healthz on localhost; exit 0 when healthy.
    Healthcheck {
        /// Port of the status listener (default: the port of GORGE_LISTEN_ADDR, else 8160).
        #[arg(long)]
        port: Option<u16>,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Some(Command::Healthcheck { port }) = cli.command {
        let port = port.unwrap_or_else(|| {
            gorge_service::config::env_value(LISTEN_ADDR_VAR)
                .and_then(|addr| addr.parse::<SocketAddr>().ok())
                .map(|addr| addr.port())
                .unwrap_or(DEFAULT_HEALTH_PORT)
        });
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        std::process::exit(gorge_service::healthcheck::healthcheck(addr));
    }
    let settings = Settings::load(cli.config.as_deref()).unwrap_or_else(|e| exit_config_error(&e));
    if cli.check_config {
        print!("{}", settings.describe());
        return;
    }
    let logging = init_logging("gorge-webhook", env!("CARGO_PKG_VERSION"))
        .unwrap_or_else(|e| exit_config_error(&e));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("gorge-webhook: cannot start the async runtime: {err}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(gorge_webhook::app::run(settings, logging.logger.clone()));
    drop(runtime);
    // Flush buffered log lines before exiting.
    drop(logging);
    if let Err(code) = result {
        std::process::exit(code);
    }
}
