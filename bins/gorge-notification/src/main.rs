//! gorge-notification: a drop-in replacement for Phorge's Aphlict notification server.
//!
//! Startup order: configuration (exit 2 on any invalid value), logging, no other copy
//! serving on any of its ports (exit 1 if one does), the fingerprint, the hub and metrics, every
//! listener bound (exit 1 if any bind fails), then serve until SIGTERM and drain. See
//! docs/notification.md for the operator's view.

use gorge_hub::MonotonicClock;
use gorge_notification::config;
use gorge_notification::events;
use gorge_notification::inspect::{self, TargetArgs, Targets};
use gorge_notification::service::Server;
use gorge_service::cli::{exit_healthcheck, run_to_exit, Command, CommonArgs};
use gorge_service::config::{check_config_text, exit_config_error};
use gorge_service::emit;
use gorge_service::healthcheck::HealthTarget;
use gorge_service::logging::init_logging;
use gorge_service::{ConfigError, Shutdown};

const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(clap::Parser)]
#[command(
    name = "gorge-notification",
    version,
    about = "Aphlict-compatible realtime notification server for Phorge",
    after_help = "--config takes an Aphlict-format JSON file (or set GORGE_NOTIFICATION_CONFIG_FILE). \
                  Settings and defaults: docs/notification.md"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    command: Option<Subcommand>,
}

#[derive(clap::Subcommand)]
enum Subcommand {
    #[command(flatten)]
    Common(Command),
    /// Check a running server end to end: a WebSocket subscribes on the client port, a
    /// message is posted to the admin port as Phorge posts it, the frame must arrive, then
    /// /status/. Exit 0 when it passed; 1 with one line saying why not; 2 for an invalid
    /// configuration.
    Selftest(TargetArgs),
    /// Show a running server like `bin/aphlict status`, and more: listeners, readiness,
    /// sockets, the instance's counters, peers up or down. Exit 0 when it runs and both ports
    /// answer, 1 otherwise.
    Status(TargetArgs),
}

fn main() {
    // Before any thread exists: how freed memory goes back to the system (memory.rs).
    gorge_notification::memory::configure_allocator();
    let cli: Cli = gorge_service::cli::parse();
    if let Err(e) = cli.common.apply_env_file() {
        exit_env_file_error(&e, cli.command.as_ref());
    }
    let config_path = cli.common.config.as_deref();
    let targets = |args: &TargetArgs| {
        config::load(config_path)
            .and_then(|config| Targets::resolve(args, &config))
            .unwrap_or_else(|e| exit_config_error(&e))
    };
    match &cli.command {
        Some(Subcommand::Selftest(args)) => match inspect::selftest::run(&targets(args)) {
            Ok(passed) => {
                println!(
                    "selftest: ok: the frame arrived {} ms after the POST was answered (server {})",
                    passed.frame_after.as_millis(),
                    passed.fingerprint
                );
                println!("/status/: {}", passed.status);
                std::process::exit(0)
            }
            Err(why) => {
                eprintln!("selftest: FAIL: {why}");
                std::process::exit(1)
            }
        },
        Some(Subcommand::Status(args)) => {
            let report = inspect::status::run(&targets(args));
            print!("{}", report.text);
            if let Some(why) = report.why_not {
                eprintln!("{why}");
            }
            std::process::exit(if report.running { 0 } else { 1 })
        }
        _ => {}
    }
    if let Some(Subcommand::Common(Command::Healthcheck { port })) = cli.command {
        exit_healthcheck(port, || {
            let config = config::load(config_path)?;
            let admin = config
                .servers
                .iter()
                .find(|s| s.kind == config::ServerKind::Admin)
                .ok_or_else(|| {
                    ConfigError::new("servers", "", "no admin server: pass healthcheck --port")
                })?;
            Ok(HealthTarget {
                addr: admin.addr,
                tls: admin.tls.files().is_some(),
            })
        });
    }
    let config = config::load(config_path).unwrap_or_else(|e| exit_config_error(&e));
    if cli.common.check_config {
        let lines = config::check_lines(&config);
        print!(
            "{}",
            check_config_text(&lines, &config::check_warnings(&config))
        );
        return;
    }
    if cli.common.print_config {
        let text = serde_json::to_string_pretty(&config::print_config(&config))
            .expect("configuration serializes");
        println!("{text}");
        for note in config::print_config_notes(&config) {
            eprintln!("note: {note}");
        }
        return;
    }
    let logging =
        init_logging("gorge-notification", VERSION).unwrap_or_else(|e| exit_config_error(&e));
    run_to_exit(logging, |log| async move { serve(config, &log).await });
}

/// An unreadable or refused `--env-file`: exit 1 for `healthcheck` (Docker reserves 2 of a
/// HEALTHCHECK command), else 2 like any invalid configuration.
fn exit_env_file_error(err: &ConfigError, command: Option<&Subcommand>) -> ! {
    if let Some(Subcommand::Common(Command::Healthcheck { .. })) = command {
        gorge_service::healthcheck::exit_failed(err)
    }
    exit_config_error(err)
}

async fn serve(config: config::Config, log: &slog::Logger) -> i32 {
    let (limit, raise_error) = gorge_service::fdlimit::raise_to_hard();
    let show = |n: Option<u64>| n.map_or("unlimited".to_string(), |n| n.to_string());
    emit!(log, events::NOTIFY_FILE_LIMIT;
        "soft_before" => show(limit.soft_before), "soft" => show(limit.soft),
        "hard" => show(limit.hard));
    if let Some(err) = raise_error {
        emit!(log, events::NOTIFY_FILE_LIMIT_NOT_RAISED; "error" => %err);
    }
    // Every port this process binds: a copy serving on any one of them would share it
    // (SO_REUSEPORT) and the kernel would split its connections between the two. The admin
    // ports first: they answer with the other copy's pid.
    let addrs = |kind| {
        config
            .servers
            .iter()
            .filter(move |s| s.kind == kind)
            .map(|s| s.addr)
    };
    let every_port = addrs(config::ServerKind::Admin).chain(addrs(config::ServerKind::Client));
    if let Err(copy) = gorge_service::takeover::refuse_if_serving(every_port, log).await {
        eprintln!("gorge-notification: {copy}");
        return 1;
    }
    // History loaded at start (broker mode) keeps its age: the clock must reach that far back.
    let clock = MonotonicClock::starting_at(config.hub.history_age_ms);
    let server = match Server::bind(config, clock, log).await {
        Ok(server) => server,
        Err(e) => {
            emit!(log, events::NOTIFY_BIND_FAILED; "addr" => %e.addr, "error" => %e);
            eprintln!("{e}");
            return 1;
        }
    };
    match server.run(Shutdown::new()).await {
        Ok(()) => 0,
        Err(e) => {
            emit!(log, events::NOTIFY_STOPPED; "error" => %e);
            1
        }
    }
}
