//! The cost of a schema change at the sinks: for each sink kind, against the real servers, a driver writes rows and
//! checkpoints, then takes a schema with one more nullable column ([`Driver::evolve`]: the last checkpoint's
//! commit waited for, the column added in the external system, the sink reopened on the new schema), then writes
//! and checkpoints again. Prints, per sink, the median and the longest `evolve` over the changes, and the median
//! checkpoint before and after (the pause a schema change adds is `evolve` plus whatever the next checkpoint costs
//! more). The source's share (the registry lookup, the reader widened) is `kafka-source`'s `decoding` bench.
//!
//! Run: `scripts/services.sh up && cargo bench -p worker --bench schema_change` (see docs/benchmarks.md).
//! `RATCHET_BENCH_CHANGES` sets the changes per sink (default 5).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, Int64Array, RecordBatch, new_null_array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::{
    Driver, DriverConfig, LocalCheckpointStore, SinkHandle, SinkRegistry, SinkSpec, SourceOffset,
    SubtaskId,
};
use ratchet_conformance::{conformance_batch, conformance_schema};
use test_support::Services;

/// Rows per checkpoint.
const ROWS: i64 = 10_000;

/// `base` with nullable Int64 columns `c1..=cn`.
fn schema(n: usize) -> SchemaRef {
    let mut fields: Vec<Field> = conformance_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.extend((1..=n).map(|i| Field::new(format!("c{i}"), DataType::Int64, true)));
    Arc::new(Schema::new(fields))
}

/// Rows `ids` of `schema`: the conformance columns, then the added ones (the last filled, the others null).
fn rows(schema: &SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
    let base = conformance_batch(ids.clone());
    let mut columns: Vec<ArrayRef> = base.columns().to_vec();
    let added = schema.fields().len() - columns.len();
    for i in 0..added {
        columns.push(match i + 1 == added {
            true => Arc::new(Int64Array::from_iter_values(ids.clone())),
            false => new_null_array(&DataType::Int64, base.num_rows()),
        });
    }
    RecordBatch::try_new(schema.clone(), columns).unwrap()
}

fn registry() -> SinkRegistry {
    let mut registry = SinkRegistry::new();
    registry
        .register(kafka_sink::KafkaSinkFactory)
        .register(file_sink::FileSinkFactory)
        .register(jdbc_sink::JdbcSinkFactory)
        .register(iceberg_sink::IcebergSinkFactory);
    registry
}

/// The `[[sinks]]` entry of each sink kind, with `evolution = "add-columns"`.
fn specs(dir: &std::path::Path, unique: &str) -> Vec<(&'static str, String)> {
    let services = Services::get();
    let pg = services.pg_url();
    vec![
        (
            "PostgreSQL (jdbc, xa)",
            format!(
                "type = \"jdbc\"\nid = \"pg\"\nurl = \"{pg}\"\ntable = \"{unique}_pg\"\ncreate_table = true"
            ),
        ),
        (
            "MariaDB (jdbc, xa)",
            format!(
                "type = \"jdbc\"\nid = \"my\"\nurl = \"{}\"\ntable = \"{unique}_my\"\ncreate_table = true\nscope = \"{}\"",
                services.mysql_url(),
                &unique[unique.len().saturating_sub(20)..]
            ),
        ),
        (
            "Iceberg (SQL catalog, local warehouse)",
            format!(
                "type = \"iceberg\"\nid = \"lake\"\ncatalog = {{ kind = \"sql\", uri = \"{pg}\", warehouse = \"file://{}\" }}\ntable = \"{unique}.t\"\ncreate_table = true",
                dir.join("warehouse").display()
            ),
        ),
        (
            "Parquet files (local)",
            format!(
                "type = \"file\"\nid = \"files\"\nstorage = {{ kind = \"local\", path = \"{}\" }}",
                dir.join("files").display()
            ),
        ),
        (
            "Kafka (JSON values)",
            format!(
                "type = \"kafka\"\nid = \"copy\"\nbootstrap_servers = \"{}\"\ntopic = \"{unique}\"\ntransactional_id_prefix = \"{unique}\"",
                services.kafka_bootstrap()
            ),
        ),
    ]
}

/// Writes the next [`ROWS`] rows of the schema with `columns` added columns and checkpoints: how long the
/// checkpoint took.
async fn checkpoint(
    driver: &mut Driver<LocalCheckpointStore>,
    handle: SinkHandle,
    next: &mut i64,
    columns: usize,
) -> Duration {
    let batch = rows(&schema(columns), *next..*next + ROWS);
    *next += ROWS;
    driver.write(handle, &batch).await.unwrap();
    let started = Instant::now();
    driver
        .checkpoint(vec![SourceOffset::new("bench", 0, *next)])
        .await
        .unwrap();
    started.elapsed()
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let changes: usize = std::env::var("RATCHET_BENCH_CHANGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let registry = registry();
    println!("| sink | changes | evolve median / max | checkpoint before / after (median) |");
    println!("|---|---|---|---|");
    for (name, spec) in specs(
        tempfile::tempdir().unwrap().keep().as_path(),
        &test_support::unique_name("evolve").replace('-', "_"),
    ) {
        let spec: SinkSpec =
            toml::from_str(&format!("{spec}\nevolution = \"add-columns\"")).unwrap();
        let state = tempfile::tempdir().unwrap();
        let mut driver = Driver::new(
            LocalCheckpointStore::open(state.path(), 3).unwrap(),
            DriverConfig::default(),
        );
        let sink = registry
            .build(&spec, None, SubtaskId(0), schema(0))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let handle = driver.add_dyn_sink(sink).unwrap();
        driver.start().await.unwrap();
        let mut next = 0;
        let (mut evolves, mut before, mut after) = (Vec::new(), Vec::new(), Vec::new());
        for change in 1..=changes {
            before.push(checkpoint(&mut driver, handle, &mut next, change - 1).await);
            let started = Instant::now();
            driver.evolve(&[handle], schema(change)).await.unwrap();
            evolves.push(started.elapsed());
            after.push(checkpoint(&mut driver, handle, &mut next, change).await);
        }
        driver.close().await.unwrap();
        let longest = *evolves.iter().max().unwrap();
        println!(
            "| {name} | {changes} | {} / {} ms | {} / {} ms |",
            ms(median(&mut evolves)),
            ms(longest),
            ms(median(&mut before)),
            ms(median(&mut after)),
        );
    }
}
