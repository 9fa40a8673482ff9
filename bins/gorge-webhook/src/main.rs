//! The `gorge-webhook` binary: command line, configuration, logging, runtime, exit codes.
//!
//! Startup order: configuration (exit 2 on any invalid value), logging, no other copy
//! serving on the status port (exit 1 if one does), the status port bound (exit 1 if it
//! cannot be), then serve until SIGTERM and drain (exit 0; 1 when a listener failed, 3 when
//! the poll loop stopped outside a shutdown). See docs/webhook.md for the operator's view.

use gorge_service::cli::{exit_healthcheck, run_to_exit, Command, CommonArgs};
use gorge_service::config::exit_config_error;
use gorge_service::emit;
use gorge_service::healthcheck::HealthTarget;
use gorge_service::logging::init_logging;
use gorge_service::Shutdown;
use gorge_webhook::config::Loaded;
use gorge_webhook::events;
use gorge_webhook::service::{Error, Server};

/// Exit code when the poll loop died (distinct from a listener failure's 1).
const POLL_LOOP_DIED_EXIT: i32 = 3;

#[derive(Debug, clap::Parser)]
#[command(
    name = "gorge-webhook",
    version,
    about = "Delivers Phorge's Herald webhook requests from the herald_webhookrequest table",
    after_help = "--config takes a TOML or JSON file (by extension). \
                  Settings and defaults: docs/webhook.md"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

fn main() {
    let cli: Cli = gorge_service::cli::parse();
    if let Err(e) = cli.common.apply_env_file() {
        // Docker reserves exit code 2 of a HEALTHCHECK command.
        if let Some(Command::Healthcheck { .. }) = cli.command {
            gorge_service::healthcheck::exit_failed(e)
        }
        exit_config_error(&e)
    }
    let config_path = cli.common.config.as_deref();
    if let Some(Command::Healthcheck { port }) = cli.command {
        exit_healthcheck(port, || {
            Loaded::load(config_path, events::ALL)
                .map(|loaded| HealthTarget::plain(loaded.config.listen_addr))
        });
    }
    let loaded = Loaded::load(config_path, events::ALL).unwrap_or_else(|e| exit_config_error(&e));
    if cli.common.check_config {
        print!("{}", loaded.describe());
        return;
    }
    if cli.common.print_config {
        print!("{}", loaded.print_config());
        return;
    }
    let logging = init_logging("gorge-webhook", env!("CARGO_PKG_VERSION"))
        .unwrap_or_else(|e| exit_config_error(&e));
    run_to_exit(logging, |log| async move { serve(loaded, &log).await });
}

async fn serve(loaded: Loaded, log: &slog::Logger) -> i32 {
    // SO_REUSEPORT would let this copy bind beside one that serves, splitting the status
    // port's traffic; take over only from a copy that drains.
    let status = [loaded.config.listen_addr];
    if let Err(copy) = gorge_service::takeover::refuse_if_serving(status, log).await {
        eprintln!("gorge-webhook: {copy}");
        return 1;
    }
    let server = match Server::bind(loaded, log).await {
        Ok(server) => server,
        Err(e) => {
            emit!(log, events::WEBHOOK_BIND_FAILED; "addr" => %e.addr, "error" => %e);
            eprintln!("gorge-webhook: {e}");
            return 1;
        }
    };
    match server.run(Shutdown::new()).await {
        Ok(()) => 0,
        Err(Error::PollLoopDied) => POLL_LOOP_DIED_EXIT,
        Err(Error::Run(e)) => {
            emit!(log, events::WEBHOOK_FAILED; "error" => %e);
            1
        }
    }
}
