//! The demo's job file: one source, four sinks, a local checkpoint directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::cli::DemoArgs;

/// Partitions of the demo topics (and subtasks of the job).
pub const PARTITIONS: i32 = 3;

/// What the demo creates, named after its start time.
pub struct Names {
    /// The input topic.
    pub topic: String,
    /// The Kafka sink's topic.
    pub copy_topic: String,
    /// The PostgreSQL table.
    pub pg_table: String,
    /// The Iceberg table, `namespace.table`.
    pub iceberg_table: String,
    /// The job (and the Kafka sink's transactional-id prefix).
    pub job: String,
}

impl Names {
    /// Names for a demo started at `stamp` (seconds since the epoch).
    pub fn new(stamp: u64) -> Self {
        Self {
            topic: format!("ratchet-demo-{stamp}"),
            copy_topic: format!("ratchet-demo-{stamp}-copy"),
            pg_table: format!("ratchet_demo_{stamp}"),
            iceberg_table: format!("demo.orders_{stamp}"),
            job: format!("demo-{stamp}"),
        }
    }
}

/// Writes `<dir>/job.toml` and returns its path.
///
/// # Errors
/// The file cannot be written.
pub fn write(dir: &Path, args: &DemoArgs, names: &Names) -> Result<PathBuf> {
    let path = dir.join("job.toml");
    let text = format!(
        r#"# Written by `ratchet demo`; run it again with `ratchet run --config {path}`.
[job]
name = "{job}"
subtasks = {PARTITIONS}
checkpoint_interval = "1s"

[source]
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
decoding = {{ kind = "json", fields = [
    {{ name = "id", type = "int64", nullable = false }},
    {{ name = "customer", type = "string" }},
    {{ name = "amount_cents", type = "int64" }},
] }}

[store]
kind = "local"
path = "{dir}/checkpoints"

[[sinks]]
type = "file"
id = "files"
storage = {{ kind = "local", path = "{dir}/files" }}
format = {{ kind = "parquet", compression = "zstd" }}

[[sinks]]
type = "iceberg"
id = "lake"
catalog = {{ kind = "sql", uri = "sqlite://{dir}/catalog.db?mode=rwc", warehouse = "file://{dir}/warehouse" }}
table = "{iceberg_table}"
create_table = true
# `compact` left out: a table the sink creates compacts its small files (one per checkpoint) inside its own
# commits once 8 are live (docs/worker.md); this short demo makes fewer.

[[sinks]]
type = "jdbc"
id = "db"
url = "{pg_url}"
table = "{pg_table}"
scope = "{job}"
create_table = true

[[sinks]]
type = "kafka"
id = "copy"
bootstrap_servers = "{bootstrap}"
topic = "{copy_topic}"
transactional_id_prefix = "{job}"
"#,
        path = path.display(),
        job = names.job,
        bootstrap = args.bootstrap,
        topic = names.topic,
        dir = dir.display(),
        iceberg_table = names.iceberg_table,
        pg_url = args.pg_url,
        pg_table = names.pg_table,
        copy_topic = names.copy_topic,
    );
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}
