//! End-to-end pipelines against their limits, in one run: each exactly-once job next to the plain job that does
//! the same work with no commit protocol, on the same input topic, each in a process of its own so that CPU time
//! and peak RSS are its own.
//!
//! | exactly-once job | its limit |
//! |---|---|
//! | Kafka -> Kafka, `KafkaToKafka` (offsets in the transaction) | plain copy: consumer + idempotent producer |
//! | Kafka -> Parquet files, `KafkaSource` + `Driver` + `FileSink` | consume + the same Parquet with `ArrowWriter` |
//! | Kafka -> Kafka, `KafkaSource` + `Driver` + `KafkaSink` | plain copy |
//!
//! Run: `scripts/services.sh up && cargo bench -p worker --bench pipelines` (see docs/benchmarks.md).
//! `RATCHET_BENCH_RECORDS` lists the input sizes (default `1000000,5000000`), `RATCHET_BENCH_REPEAT` how often each
//! job runs (default 3; the median run is reported). Input: one partition of ~100-byte JSON values with keys,
//! produced once per size. Checkpoints and transactions every 1 s. "In the job" counts from the first record read
//! to the last one written and committed; "wall" adds start-up (claims, `init_transactions`, metadata).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod limits;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use connector_api::{Driver, DriverConfig, LocalCheckpointStore, SinkId, SubtaskId};
use file_sink::{FileSink, FileSinkConfig, StorageConfig};
use kafka_sink::{KafkaSink, KafkaSinkConfig, KafkaToKafka, RecordMapping};
use kafka_source::{KafkaConnection, KafkaSource, KafkaSourceOptions, text_schema};
use limits::{
    CHECKPOINT, PRODUCER, bootstrap, fill_input, plain_copy, plain_parquet, run_child, usage,
};

const JOB: &str = "RATCHET_BENCH_JOB";

/// The jobs, each paired with its limit.
const JOBS: &[(&str, &str, &str)] = &[
    (
        "k2k-plain",
        "Kafka -> Kafka, plain copy (limit)",
        "k2k-plain",
    ),
    (
        "k2k-eo",
        "Kafka -> Kafka, KafkaToKafka exactly-once",
        "k2k-plain",
    ),
    (
        "parquet-plain",
        "Kafka -> Parquet, consume + ArrowWriter (limit)",
        "parquet-plain",
    ),
    (
        "parquet-eo",
        "Kafka -> Parquet, source + driver + FileSink exactly-once",
        "parquet-plain",
    ),
    (
        "driver-kafka-eo",
        "Kafka -> Kafka, source + driver + KafkaSink exactly-once",
        "k2k-plain",
    ),
];

/// What one job measured in its own process.
#[derive(Debug, Clone, Copy)]
struct Measured {
    records: u64,
    /// Wall time of the whole job, start-up included.
    seconds: f64,
    /// From the first record read to the end (everything written and committed): the job's own rate.
    in_job_seconds: f64,
    cpu_seconds: f64,
    peak_rss_mb: f64,
}

fn main() {
    if let Ok(job) = std::env::var(JOB) {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let measured = runtime.block_on(child(&job));
        println!(
            "RESULT {} {} {} {} {}",
            measured.records,
            measured.seconds,
            measured.in_job_seconds,
            measured.cpu_seconds,
            measured.peak_rss_mb
        );
        return;
    }
    let sizes: Vec<u64> = std::env::var("RATCHET_BENCH_RECORDS")
        .unwrap_or_else(|_| "1000000,5000000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("RATCHET_BENCH_RECORDS: record counts")
        })
        .collect();
    let repeat: usize = std::env::var("RATCHET_BENCH_REPEAT")
        .map(|r| r.parse().expect("RATCHET_BENCH_REPEAT: a count"))
        .unwrap_or(3);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut rows = Vec::new();
    for records in sizes {
        let topic = test_support::unique_name(&format!("bench-input-{records}"));
        runtime.block_on(fill_input(&topic, records, 1));
        // Jobs interleaved, each run `repeat` times; the run with the median in-job rate is reported (this
        // 2-core machine shares its cores with the broker: single runs vary by up to ±20%).
        let mut runs: BTreeMap<&str, Vec<Measured>> = BTreeMap::new();
        for round in 0..repeat {
            for (job, _, _) in JOBS {
                let measured = spawn(job, &topic, records);
                eprintln!("{records} records, round {round}, {job}: {measured:?}");
                runs.entry(job).or_default().push(measured);
            }
        }
        let results: BTreeMap<&str, Measured> = runs
            .into_iter()
            .map(|(job, mut runs)| {
                runs.sort_by(|a, b| a.in_job_seconds.total_cmp(&b.in_job_seconds));
                (job, runs[runs.len() / 2])
            })
            .collect();
        rows.push((records, results));
    }
    println!(
        "\n| records | job | records/s in the job | in the job vs limit | CPU s per M records | CPU vs limit | \
         peak RSS MB | wall s | records/s wall | wall vs limit |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (records, results) in &rows {
        for (job, title, limit) in JOBS {
            let m = results[job];
            let l = results[limit];
            let in_job = m.records as f64 / m.in_job_seconds;
            let wall = m.records as f64 / m.seconds;
            let cpu = m.cpu_seconds / (m.records as f64 / 1e6);
            let limit_in_job = l.records as f64 / l.in_job_seconds;
            let limit_wall = l.records as f64 / l.seconds;
            let limit_cpu = l.cpu_seconds / (l.records as f64 / 1e6);
            println!(
                "| {records} | {title} | {in_job:.0} | {:.0}% | {cpu:.2} | {:.2}x | {:.0} | {:.2} | {wall:.0} | {:.0}% |",
                100.0 * in_job / limit_in_job,
                cpu / limit_cpu,
                m.peak_rss_mb,
                m.seconds,
                100.0 * wall / limit_wall,
            );
        }
    }
}

/// Runs `job` in a child process (this binary again) and reads its measurement.
fn spawn(job: &str, topic: &str, records: u64) -> Measured {
    let v = run_child(JOB, job, topic, records);
    Measured {
        records: v[0] as u64,
        seconds: v[1],
        in_job_seconds: v[2],
        cpu_seconds: v[3],
        peak_rss_mb: v[4],
    }
}

async fn child(job: &str) -> Measured {
    let topic = std::env::var("RATCHET_BENCH_TOPIC").unwrap();
    let records: u64 = std::env::var("RATCHET_BENCH_N").unwrap().parse().unwrap();
    let out = test_support::unique_name(&format!("{topic}-{job}"));
    let dir = tempfile::tempdir().unwrap();
    let (cpu_before, _) = usage();
    let started = Instant::now();
    let (copied, in_job) = match job {
        "k2k-plain" => plain_copy(&topic, &out, records),
        "k2k-eo" => kafka_to_kafka(&topic, &out, records).await,
        "parquet-plain" => plain_parquet(&topic, dir.path(), records),
        "parquet-eo" => driver_parquet(&topic, dir.path(), records).await,
        "driver-kafka-eo" => driver_kafka(&topic, &out, dir.path(), records).await,
        other => panic!("unknown job {other}"),
    };
    let seconds = started.elapsed().as_secs_f64();
    let (cpu_after, peak_rss_mb) = usage();
    assert_eq!(copied, records, "{job} copied {copied} of {records}");
    Measured {
        records,
        seconds,
        in_job_seconds: in_job.as_secs_f64(),
        cpu_seconds: cpu_after - cpu_before,
        peak_rss_mb,
    }
}

async fn kafka_to_kafka(topic: &str, out: &str, records: u64) -> (u64, Duration) {
    let mut sink = KafkaSinkConfig::new(bootstrap(), out, out);
    for (k, v) in PRODUCER {
        sink.client.insert(k.to_string(), v.to_string());
    }
    let pipeline = KafkaToKafka {
        source_topic: topic.to_string(),
        group_id: format!("{out}-group"),
        sink,
        commit_interval: CHECKPOINT,
        max_records_per_transaction: u64::MAX,
        stop_when_idle: None,
        stop_after_records: Some(records),
        hook: None,
        observer: None,
        stop: None,
    };
    let stats = pipeline.run().await.unwrap();
    (stats.records, stats.copying)
}

/// Reads `records` from `topic` through the source into the driver's sinks, checkpointing every second.
async fn drive(
    topic: &str,
    records: u64,
    mut driver: Driver<LocalCheckpointStore>,
    sink: connector_api::SinkHandle,
) -> (u64, Duration) {
    let restored = driver.start().await.unwrap();
    let kafka = KafkaConnection::plaintext(bootstrap());
    let mut source = KafkaSource::open_with(
        &kafka,
        topic,
        &restored.positions,
        KafkaSourceOptions::default(),
    )
    .await
    .unwrap();
    let mut copied = 0u64;
    let mut last = Instant::now();
    let mut first = None;
    while copied < records {
        if let Some(batch) = source.next_batch(Duration::from_millis(100)).await.unwrap() {
            first.get_or_insert_with(Instant::now);
            copied += batch.num_rows() as u64;
            driver.write(sink, &batch).await.unwrap();
        }
        if last.elapsed() >= CHECKPOINT {
            driver.checkpoint(source.positions()).await.unwrap();
            last = Instant::now();
        }
    }
    driver.checkpoint(source.positions()).await.unwrap();
    driver.close().await.unwrap();
    (copied, first.unwrap().elapsed())
}

async fn driver_parquet(topic: &str, dir: &std::path::Path, records: u64) -> (u64, Duration) {
    let store = LocalCheckpointStore::open(dir.join("state"), 3).unwrap();
    let sink = FileSink::new(FileSinkConfig::new(
        SinkId::new("parquet").unwrap(),
        SubtaskId(0),
        text_schema(),
        StorageConfig::Local {
            path: dir.join("out"),
        },
    ))
    .await
    .unwrap();
    let mut driver = Driver::new(store, DriverConfig::default());
    let handle = driver.add_sink(sink).unwrap();
    drive(topic, records, driver, handle).await
}

async fn driver_kafka(
    topic: &str,
    out: &str,
    dir: &std::path::Path,
    records: u64,
) -> (u64, Duration) {
    let store = LocalCheckpointStore::open(dir.join("state"), 3).unwrap();
    let mut config = KafkaSinkConfig::new(bootstrap(), out, out);
    for (k, v) in PRODUCER {
        config.client.insert(k.to_string(), v.to_string());
    }
    config.records = RecordMapping {
        key_column: Some("key".into()),
        value_column: Some("value".into()),
        ..RecordMapping::default()
    };
    let sink = KafkaSink::new(config, SinkId::new("kafka").unwrap(), SubtaskId(0)).unwrap();
    let mut driver = Driver::new(store, DriverConfig::default());
    let handle = driver.add_sink(sink).unwrap();
    drive(topic, records, driver, handle).await
}
