//! `ratchet run` end to end: Kafka into each sink kind through the worker binary, exactly-once next to
//! at-least-once, the two Ratchet-free limits of the same work, and 1 vs 3 worker processes sharing a job.
//!
//! Run: `scripts/services.sh up && cargo bench -p worker --bench run` (see docs/benchmarks.md, "ratchet run").
//! `RATCHET_BENCH_RECORDS` sets the input size (default 1000000). Input: ~100-byte JSON values with keys in a new
//! 3-partition topic, read as text (`topic`, `partition`, `offset`, `key`, `value`). Every job: 3 subtasks, 1 s
//! checkpoints, `--exit-when-idle 3s`; the rate counts from the first record read to the last (the worker's final
//! log line), CPU time and peak RSS are the worker process's own (`getrusage`, start-up and the idle wait
//! included).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod limits;

use limits::jobs::{JobFile, Store, run_workers};
use limits::runs::Rate;
use limits::{fill_input, plain_copy, plain_parquet, run_child, usage};
use test_support::Services;

const JOB: &str = "RATCHET_BENCH_JOB";
const PARTITIONS: i32 = 3;

fn main() {
    if let Ok(job) = std::env::var(JOB) {
        limit_child(&job);
        return;
    }
    let records: u64 = std::env::var("RATCHET_BENCH_RECORDS")
        .map(|r| r.parse().expect("RATCHET_BENCH_RECORDS: a record count"))
        .unwrap_or(1_000_000);
    let services = Services::get();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let topic = test_support::unique_name("bench-run-input");
    runtime.block_on(fill_input(&topic, records, PARTITIONS));

    let mut rows = Vec::new();
    for (kind, title) in [
        ("file", "Parquet files (local)"),
        ("kafka", "Kafka topic"),
        ("jdbc", "PostgreSQL table (xa)"),
        ("iceberg", "Iceberg table (SQLite catalog, local)"),
    ] {
        let mut pair = Vec::new();
        for delivery in ["exactly-once", "at-least-once"] {
            let dir = tempfile::tempdir().unwrap();
            let job = JobFile {
                delivery,
                store: Store::Local,
                ..JobFile::new(&topic, kind)
            }
            .write(dir.path(), services);
            let rate = Rate::of(&run_workers(&job.path, 1));
            eprintln!("{kind} {delivery}: {rate:?}");
            pair.push(rate);
        }
        rows.push((title, pair[0], pair[1]));
    }
    let mut scaling = Vec::new();
    for processes in [1, 3] {
        let dir = tempfile::tempdir().unwrap();
        let job = JobFile {
            store: Store::Postgres,
            ..JobFile::new(&topic, "file")
        }
        .write(dir.path(), services);
        let rate = Rate::of(&run_workers(&job.path, processes));
        eprintln!("{processes} process(es): {rate:?}");
        scaling.push((processes, rate));
    }
    let k2k_limit = limit("k2k-plain", &topic, records);
    let parquet_limit = limit("parquet-plain", &topic, records);

    println!(
        "\n{records} records, 3 partitions, 3 subtasks, 1 s checkpoints, one `ratchet run` process:\n"
    );
    println!(
        "| sink | exactly-once records/s | at-least-once records/s | EO vs ALO | EO CPU s per M records | ALO CPU s per M records | EO peak RSS MB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (title, eo, alo) in &rows {
        println!(
            "| {title} | {:.0} | {:.0} | {:.0}% | {:.2} | {:.2} | {:.0} |",
            eo.records_per_second,
            alo.records_per_second,
            100.0 * eo.records_per_second / alo.records_per_second,
            eo.cpu_per_million,
            alo.cpu_per_million,
            eo.peak_rss_mb
        );
    }
    println!("\n| job | records/s | vs its limit | CPU s per M records |");
    println!("|---|---|---|---|");
    let files_eo = rows[0].1;
    let kafka_eo = rows[1].1;
    for (title, rate, limit) in [
        (
            "Kafka -> Parquet, plain consume + ArrowWriter (limit)",
            parquet_limit,
            parquet_limit,
        ),
        (
            "Kafka -> Parquet, `ratchet run` exactly-once",
            files_eo,
            parquet_limit,
        ),
        ("Kafka -> Kafka, plain copy (limit)", k2k_limit, k2k_limit),
        (
            "Kafka -> Kafka, `ratchet run` exactly-once",
            kafka_eo,
            k2k_limit,
        ),
    ] {
        println!(
            "| {title} | {:.0} | {:.0}% | {:.2} |",
            rate.records_per_second,
            100.0 * rate.records_per_second / limit.records_per_second,
            rate.cpu_per_million
        );
    }
    println!(
        "\n| processes (PostgreSQL store, Parquet files, exactly-once) | records/s | vs 1 process | CPU s per M records | peak RSS MB (largest) |"
    );
    println!("|---|---|---|---|---|");
    let one = scaling[0].1.records_per_second;
    for (processes, rate) in &scaling {
        println!(
            "| {processes} | {:.0} | {:.0}% | {:.2} | {:.0} |",
            rate.records_per_second,
            100.0 * rate.records_per_second / one,
            rate.cpu_per_million,
            rate.peak_rss_mb
        );
    }
}

/// Runs a limit in a child process (this binary again) for its own CPU time and RSS.
fn limit(job: &str, topic: &str, records: u64) -> Rate {
    let v = run_child(JOB, job, topic, records);
    Rate {
        records_per_second: v[0] / v[1],
        cpu_per_million: v[2] / (v[0] / 1e6),
        peak_rss_mb: v[3],
    }
}

fn limit_child(job: &str) {
    let topic = std::env::var("RATCHET_BENCH_TOPIC").unwrap();
    let records: u64 = std::env::var("RATCHET_BENCH_N").unwrap().parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cpu_before, _) = usage();
    let (copied, in_job) = match job {
        "k2k-plain" => plain_copy(
            &topic,
            &test_support::unique_name("bench-run-plain"),
            records,
        ),
        "parquet-plain" => plain_parquet(&topic, dir.path(), records),
        other => panic!("unknown limit {other}"),
    };
    let (cpu_after, rss) = usage();
    assert_eq!(copied, records);
    println!(
        "RESULT {copied} {} {} {rss}",
        in_job.as_secs_f64(),
        cpu_after - cpu_before
    );
}
