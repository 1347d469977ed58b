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
