//! The type contract's cost (docs/types.md): `ratchet run` into each sink kind with the type-matrix schema (every
//! type of the contract, nested two levels, produced by confluent-kafka's AvroSerializer through the registry:
//! `test-support/verifiers/type_matrix.py`) beside the same number of records of an id-only schema, read the same
//! way (Avro through the registry). Records/s, CPU seconds per million records and peak RSS per sink and schema.
//!
//! Run: `scripts/services.sh up && cargo bench -p worker --bench types` (see docs/benchmarks.md, "The type
//! matrix"). `RATCHET_BENCH_RECORDS` sets the input size (default 100000). Every job: 3 subtasks over a
//! 3-partition topic, 1 s checkpoints, exactly-once, local checkpoint store, one sink, `--exit-when-idle 3s`; the
//! rate counts from the first record read to the last (the worker's final log line), CPU time and peak RSS are the
//! worker process's own (`getrusage`, start-up and the idle wait included).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod limits;

use std::path::Path;

use limits::jobs::{iceberg_catalog_uri, iceberg_warehouse, run_workers};
use limits::runs::Rate;
use limits::{bootstrap, create_topic};
use test_support::Services;

const PARTITIONS: i32 = 3;

/// The sinks measured: (kind in the job file, title).
const SINKS: &[(&str, &str)] = &[
    ("parquet", "Parquet files (local)"),
    ("iceberg", "Iceberg table (SQLite catalog, local)"),
    ("pg", "PostgreSQL table (xa)"),
    ("mysql", "MariaDB table (xa)"),
    ("kafka-json", "Kafka topic, JSON values"),
    ("kafka-avro", "Kafka topic, Avro values (registry)"),
];

fn main() {
    let records: u64 = std::env::var("RATCHET_BENCH_RECORDS")
        .map(|r| r.parse().expect("RATCHET_BENCH_RECORDS: a record count"))
        .unwrap_or(100_000);
    let services = Services::get();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut inputs = Vec::new();
    for form in ["ids", "avro"] {
        let topic = test_support::unique_name(&format!("bench-types-{form}"));
        runtime.block_on(create_topic(&topic, PARTITIONS));
        let count = records.to_string();
        services.verify(
            "type_matrix.py",
            &["produce", form, &bootstrap(), &topic, &count],
        );
        eprintln!("produced {records} {form} records into {topic}");
        inputs.push(topic);
    }
    let mut rows = Vec::new();
    for (kind, title) in SINKS {
        let mut pair = Vec::new();
        for topic in &inputs {
            let dir = tempfile::tempdir().unwrap();
            let job = write_job(dir.path(), topic, kind, services);
            if kind.starts_with("kafka") {
                runtime.block_on(create_topic(&format!("{}-out", job.1), PARTITIONS));
            }
            let rate = Rate::of(&run_workers(&job.0, 1));
            eprintln!("{kind} {topic}: {rate:?}");
            pair.push(rate);
        }
        rows.push((title, pair[0], pair[1]));
    }
    println!(
        "\n{records} records per schema, 3 partitions, 3 subtasks, 1 s checkpoints, exactly-once, one `ratchet run` process:\n"
    );
    println!(
        "| sink | id-only records/s | type matrix records/s | matrix vs id-only | id-only CPU s per M records | matrix CPU s per M records | matrix peak RSS MB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (title, ids, matrix) in &rows {
        println!(
            "| {title} | {:.0} | {:.0} | {:.0}% | {:.2} | {:.2} | {:.0} |",
            ids.records_per_second,
            matrix.records_per_second,
            100.0 * matrix.records_per_second / ids.records_per_second,
            ids.cpu_per_million,
            matrix.cpu_per_million,
            matrix.peak_rss_mb
        );
    }
}

/// A job reading `topic` (Avro through the registry) into one sink of `kind`: the job file and the job's name.
fn write_job(
    dir: &Path,
    topic: &str,
    kind: &str,
    services: &Services,
) -> (std::path::PathBuf, String) {
    let name = test_support::unique_name("bench_types").replace('-', "_");
    let registry = services.registry();
    let registry_keys = format!(
        "url = \"{}/\"\nusername = \"{}\"\npassword = \"{}\"",
        registry.url, registry.user, registry.password
    );
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
        "mysql" => format!(
            "type = \"jdbc\"\nurl = \"{}\"\ntable = \"{name}\"\ncreate_table = true",
            services.mysql_url()
        ),
        "kafka-json" => format!(
            "type = \"kafka\"\nbootstrap_servers = \"{}\"\ntopic = \"{name}-out\"",
            bootstrap()
        ),
        "kafka-avro" => format!(
            "type = \"kafka\"\nbootstrap_servers = \"{}\"\ntopic = \"{name}-out\"\nrecords = {{ value_format = \"avro\" }}\n\
             registry = {{ {} }}",
            bootstrap(),
            registry_keys.replace('\n', ", ")
        ),
        other => panic!("unknown sink {other}"),
    };
    let text = format!(
        "[job]\nname = \"{name}\"\nsubtasks = {PARTITIONS}\ncheckpoint_interval = \"1s\"\n\n\
         [source]\nbootstrap_servers = \"{bootstrap}\"\ntopic = \"{topic}\"\ndecoding = {{ kind = \"avro\" }}\n\n\
         [source.registry]\n{registry_keys}\n\n\
         [store]\nkind = \"local\"\npath = \"{state}\"\n\n\
         [[sinks]]\nid = \"out\"\n{sink}\n",
        bootstrap = bootstrap(),
        state = dir.join("state").display(),
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    (path, name)
}
