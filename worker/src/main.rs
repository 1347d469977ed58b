//! `ratchet`: the standalone Kafka-to-sink worker.
#![deny(missing_docs)]

mod cli;
mod cmd;
mod config;
mod job;
mod jobstore;
mod membership;
mod ops;
mod subtask;

use std::process::ExitCode;

use clap::Parser;

/// Runs the command; a failure is printed as its message chain (`error: what: why: ...`, each cause once:
/// [`connector_api::Report`]), never as a backtrace
/// (whatever `RUST_BACKTRACE` says: those are for panics), with exit status 1.
#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", connector_api::Report(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only on a terminal: journald, `kubectl logs` and log files get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let json = cli.log_format == "json";
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
    match cli.command {
        cli::Command::Demo(args) => cmd::demo::run(args).await,
        cli::Command::Run(args) => cmd::run::run(args, !json).await,
        cli::Command::CheckConfig(args) => cmd::check::run(args).await,
        cli::Command::Inspect(args) => cmd::operate::inspect(args).await,
        cli::Command::Resolve(args) => cmd::operate::resolve(args).await,
        cli::Command::Rescale(args) => cmd::rescale::command(args).await,
        cli::Command::ForgetTopic(args) => cmd::forget::command(args).await,
    }
}
