//! The `gorge-webhook` binary: command line, configuration, logging, runtime.

use gorge_service::cli::{exit_healthcheck, run_to_exit, Command, CommonArgs};
use gorge_service::config::exit_config_error;
use gorge_service::logging::init_logging;
use gorge_webhook::config::Settings;

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
    if let Some(Command::Healthcheck { port }) = cli.command {
        exit_healthcheck(port, || {
            Settings::load(cli.common.config.as_deref()).map(|s| s.listen_addr)
        });
    }
    let settings =
        Settings::load(cli.common.config.as_deref()).unwrap_or_else(|e| exit_config_error(&e));
    if cli.common.check_config {
        print!("{}", settings.describe());
        return;
    }
    if cli.common.print_config {
        print!("{}", settings.print_config());
        return;
    }
    let logging = init_logging("gorge-webhook", env!("CARGO_PKG_VERSION"))
        .unwrap_or_else(|e| exit_config_error(&e));
    run_to_exit(logging, |log| async move {
        match gorge_webhook::service::run(settings, log).await {
            Ok(()) => 0,
            Err(code) => code,
        }
    });
}
