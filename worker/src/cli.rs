//! Command-line interface.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Ratchet: exactly-once sinks for Kafka pipelines.
#[derive(Debug, Parser)]
#[command(name = "ratchet", version, about)]
pub struct Cli {
    /// Log format on stderr: `text`, or `json` (one object per line, for log collectors). The level comes from
    /// `RUST_LOG` (default `info`).
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
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
    /// List, per subtask, the checkpoint store's view and every transaction each sink holds open in its external
    /// system (Kafka transactions, prepared transactions, staged files and uploads, the Iceberg table's ledger),
    /// with its age against its timeout and what recovery will do with it. Read-only; works with the job down.
    Inspect(OperateArgs),
    /// Do what `inspect` says recovery will do, without starting the job: claim and recover every subtask
    /// (commit decided checkpoints, abort everything else), then stop. Refused while the job runs.
    Resolve(OperateArgs),
    /// Change the subtask count of a job that is down: resolve every old subtask, deal its positions to the new
    /// subtasks by partition, and switch the job to the new layout in one atomic step (see docs/worker.md,
    /// "Rescaling"). Refused while the job runs. Set `subtasks` in the job file to the same number.
    Rescale(RescaleArgs),
    /// Retire a topic the job no longer reads (removed from its selection): resolve every subtask (the topic's
    /// decided work committed, its routed instances included), then drop the topic's positions, so no sink
    /// instance is built for it any more and a topic created under its name is read as new. Refused while the job
    /// runs. See docs/worker.md, "Retiring a topic".
    ForgetTopic(ForgetTopicArgs),
    /// Demo: a generator produces orders to Kafka while `ratchet run` writes them to Parquet files, an Iceberg
    /// table, PostgreSQL and a Kafka topic at once; the worker is killed with SIGKILL mid-run and restarted; then
    /// every sink is read back and compared with the input. Needs `scripts/services.sh up kafka postgres`.
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
    /// The PostgreSQL database of the database sink (libpq URL).
    #[arg(
        long,
        env = "RATCHET_PG_URL",
        default_value = "postgres://ratchet:ratchet@127.0.0.1:15432/ratchet"
    )]
    pub pg_url: String,
    /// Orders the generator produces.
    #[arg(long, default_value_t = 20_000)]
    pub records: u64,
    /// Where the job file, logs, checkpoints, files and warehouse go (default `.ratchet/demo/<time>`).
    #[arg(long)]
    pub dir: Option<PathBuf>,
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
    /// Serve Prometheus metrics on this address (`GET /metrics`), e.g. `127.0.0.1:9898`; see docs/worker.md.
    #[arg(long)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Static membership: this process is member N of `--of` and runs the subtasks `s % of == N`, with no lease
    /// tables. A number, or a name ending in one: a StatefulSet pod name (`ratchet-2`), a systemd instance name
    /// (`ratchet@2`). Needs the PostgreSQL store. See docs/worker.md, "Static membership". With `[job] membership
    /// = "kafka-group"` (and no `--of`): this process's `group.instance.id`, a static member of the job's group.
    #[arg(long, env = "RATCHET_MEMBER")]
    pub member: Option<String>,
    /// How many members share the job (with `--member`).
    #[arg(long, env = "RATCHET_MEMBERS", requires = "member")]
    pub of: Option<u32>,
}

/// Arguments of `ratchet check-config`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The job file.
    #[arg(long, short)]
    pub config: PathBuf,
}

/// Arguments of `ratchet inspect` and `ratchet resolve`.
#[derive(Debug, Args)]
pub struct OperateArgs {
    /// The job file.
    #[arg(long, short)]
    pub config: PathBuf,
}

/// Arguments of `ratchet rescale`.
#[derive(Debug, Args)]
pub struct RescaleArgs {
    /// The job file.
    #[arg(long, short)]
    pub config: PathBuf,
    /// The new subtask count.
    #[arg(long)]
    pub to: u32,
}

/// Arguments of `ratchet forget-topic`.
#[derive(Debug, Args)]
pub struct ForgetTopicArgs {
    /// The job file.
    #[arg(long, short)]
    pub config: PathBuf,
    /// The topic to forget (no longer selected by the job file).
    #[arg(long)]
    pub topic: String,
}
