//! What a transform costs (docs/worker.md, "Transforms"): `ratchet run` into each sink kind with no transform
//! and with a projection + filter + cast transform, on the same input. Records/s, CPU seconds per million records
//! and peak RSS per sink, and the CPU per record the transform adds.
//!
//! Run: `scripts/services.sh up && cargo bench -p worker --bench transforms` (see docs/benchmarks.md,
//! "Transforms"). `RATCHET_BENCH_RECORDS` sets the input size (default 100000). The input: ~100-byte JSON values
//! `{"order", "customer", "amount", "note"}` decoded with declared fields; every job: 3 subtasks over a
//! 3-partition topic, 1 s checkpoints, exactly-once, local checkpoint store, one sink with its defaults
//! (`create_table`), `--exit-when-idle 3s`. Both jobs write the same rows with the same columns: without the
//! transform the decoding declares `amount` as `decimal(12, 2)`; with it the decoding reads a long and the
//! transform casts it, and its filter is true for every record. The difference is the transform's work (and the
//! hidden partition and offset columns the worker adds to name a failing row's record).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod limits;

use std::path::Path;

use limits::jobs::{iceberg_catalog_uri, iceberg_warehouse, run_workers};
use limits::runs::Rate;
use limits::{bootstrap, create_topic, fill_input};
use test_support::Services;

const PARTITIONS: i32 = 3;

/// The transform measured: a projection with a cast, and a filter (true for every record).
const TRANSFORM: &str = "SELECT \\\"order\\\", customer, CAST(amount AS DECIMAL(12, 2)) AS amount, note \
                         FROM input WHERE customer >= 0 AND \\\"order\\\" >= 0";

/// The sinks measured: (kind, title).
const SINKS: &[(&str, &str)] = &[
    ("parquet", "Parquet files (local)"),
    ("iceberg", "Iceberg table (SQLite catalog, local)"),
    ("pg", "PostgreSQL table (xa)"),
    ("kafka", "Kafka topic, JSON values"),
];

fn main() {
    let records: u64 = std::env::var("RATCHET_BENCH_RECORDS")
        .map(|r| r.parse().expect("RATCHET_BENCH_RECORDS: a record count"))
        .unwrap_or(100_000);
    let services = Services::get();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let topic = test_support::unique_name("bench-transforms");
    runtime.block_on(fill_input(&topic, records, PARTITIONS));
    eprintln!("produced {records} records into {topic}");
    let mut rows = Vec::new();
    for (kind, title) in SINKS {
        let mut pair = Vec::new();
        for transform in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let (job, name) = write_job(dir.path(), &topic, kind, transform, services);
            if *kind == "kafka" {
                runtime.block_on(create_topic(&format!("{name}-out"), PARTITIONS));
            }
            let rate = Rate::of(&run_workers(&job, 1));
            eprintln!("{kind} transform={transform}: {rate:?}");
            pair.push(rate);
        }
        rows.push((title, pair[0], pair[1]));
    }
    println!(
        "\n{records} records, 3 partitions, 3 subtasks, 1 s checkpoints, exactly-once, one `ratchet run` process:\n"
    );
    println!(
        "| sink | no transform records/s | projection + filter + cast records/s | transformed vs none | no transform CPU s per M records | transformed CPU s per M records | CPU per record added (µs) | transformed peak RSS MB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (title, none, shaped) in &rows {
        println!(
            "| {title} | {:.0} | {:.0} | {:.0}% | {:.2} | {:.2} | {:.2} | {:.0} |",
            none.records_per_second,
            shaped.records_per_second,
            100.0 * shaped.records_per_second / none.records_per_second,
            none.cpu_per_million,
            shaped.cpu_per_million,
            shaped.cpu_per_million - none.cpu_per_million,
            shaped.peak_rss_mb
        );
    }
}

/// A job reading `topic` (JSON with declared fields) into one sink of `kind`, with the transform or without: the
/// job file and the job's name.
fn write_job(
    dir: &Path,
    topic: &str,
    kind: &str,
    transform: bool,
    services: &Services,
) -> (std::path::PathBuf, String) {
    let name = test_support::unique_name("bench_transforms").replace('-', "_");
    let sink = match kind {
        "parquet" => format!(
            "type = \"file\"\nstorage = {{ kind = \"local\", path = \"{}\" }}\nformat = {{ kind = \"parquet\", compression = \"zstd\" }}",
            dir.join("out").display()
        ),
        "iceberg" => format!(
            "type = \"iceberg\"\ncatalog = {{ kind = \"sql\", uri = \"{}\", warehouse = \"{}\" }}\ntable = \"bench.{name}\"\ncreate_table = true",
            iceberg_catalog_uri(dir),
            iceberg_warehouse(dir)
        ),
        "pg" => format!(
            "type = \"jdbc\"\nurl = \"{}\"\ntable = \"{name}\"\ncreate_table = true",
            services.pg_url()
        ),
        "kafka" => format!(
            "type = \"kafka\"\nbootstrap_servers = \"{}\"\ntopic = \"{name}-out\"",
            bootstrap()
        ),
        other => panic!("unknown sink {other}"),
    };
    let (transforms, amount) = match transform {
        true => (
            format!("\n[[transforms]]\nsql = \"{TRANSFORM}\"\n"),
            "int64",
        ),
        false => (String::new(), "decimal(12, 2)"),
    };
    let text = format!(
        "[job]\nname = \"{name}\"\nsubtasks = {PARTITIONS}\ncheckpoint_interval = \"1s\"\n\n\
         [source]\nbootstrap_servers = \"{bootstrap}\"\ntopic = \"{topic}\"\n\
         decoding = {{ kind = \"json\", fields = [ {{ name = \"order\", type = \"int64\" }}, \
         {{ name = \"customer\", type = \"int64\" }}, {{ name = \"amount\", type = \"{amount}\" }}, \
         {{ name = \"note\", type = \"string\" }} ] }}\n\n\
         [store]\nkind = \"local\"\npath = \"{state}\"\n\n\
         [[sinks]]\nid = \"out\"\n{sink}\n{transforms}",
        bootstrap = bootstrap(),
        state = dir.join("state").display(),
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    (path, name)
}
