//! Command-line interface.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Ratchet: exactly-once sinks for Kafka pipelines.
#[derive(Debug, Parser)]
#[command(name = "ratchet", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a job file: read the Kafka source, write every record to every sink exactly once (or as each sink's
    /// `delivery` says), checkpoint every `checkpoint_interval`. Start more processes on the same job file (with
    /// the PostgreSQL store) to share the subtasks. SIGTERM/SIGINT finishes the checkpoint and exits 0.
    Run(RunArgs),
    /// Check a job file without running it: every key, the sinks' settings (each sink is built for subtask 0,
    /// which connects to its server), the transaction-timeout budget, the Kafka cluster, the source topic and the
    /// checkpoint store.
    CheckConfig(CheckArgs),
    /// Demo pipeline: produce records to Kafka, then consume them and write them exactly once to local Parquet
    /// files through checkpoints; print what was written. Re-running with the same --topic and --state resumes
    /// from the last durable checkpoint without writing anything twice.
    Demo(DemoArgs),
}

/// Arguments of `ratchet demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Kafka bootstrap servers.
    #[arg(
        long,
        env = "RATCHET_KAFKA_BOOTSTRAP",
        default_value = "127.0.0.1:19092"
    )]
    pub bootstrap: String,
    /// Topic to use; a new one named ratchet-demo-<time> when absent.
    #[arg(long)]
    pub topic: Option<String>,
    /// Records to produce before consuming (0: produce none, only consume what the topic holds).
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Partitions of a newly created topic.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Records per checkpoint.
    #[arg(long, default_value_t = 2_500)]
    pub checkpoint_every: usize,
    /// Directory for the Parquet output.
    #[arg(long, default_value = ".ratchet/demo/out")]
    pub out: PathBuf,
    /// Directory for checkpoint records.
    #[arg(long, default_value = ".ratchet/demo/checkpoints")]
    pub state: PathBuf,
}

/// Arguments of `ratchet run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The job file (TOML; see docs/worker.md). `RATCHET__<SECTION>__<KEY>` variables override its values.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Stop gracefully (as on SIGTERM) once every subtask of this process has read nothing for this long, e.g.
    /// `5s`: for batch-like runs, demos and benchmarks.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub exit_when_idle: Option<std::time::Duration>,
}

/// Arguments of `ratchet check-config`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The job file.
    #[arg(long, short)]
    pub config: PathBuf,
}
