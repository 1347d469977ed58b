//! Kafka sink throughput and commit latency against the real broker: exactly-once (one transaction per 1 s
//! checkpoint, commits overlapping writes) and at-least-once through the checkpoint driver, against plain
//! non-transactional rdkafka produce of the same records (the limit). Prints a table and the ratios.
//!
//! Run: `scripts/services.sh up && cargo bench -p kafka-sink --bench throughput` (see docs/benchmarks.md).
//! `RATCHET_BENCH_SECONDS` sets the length of each run (default 20).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

use std::time::{Duration, Instant};

use arrow_array::{RecordBatch, StringArray};
use connector_api::{
    DeliveryGuarantee, Driver, DriverConfig, GuaranteedSink, LocalCheckpointStore, SinkId,
    SourceOffset, SubtaskId,
};
use kafka_sink::{KafkaSink, KafkaSinkConfig, RecordMapping};
use ratchet_conformance::conformance_batch_with;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use test_support::Services;

const BATCH_ROWS: i64 = 4096;
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// Producer settings shared by every mode, so they send the same way.
const CLIENT: &[(&str, &str)] = &[
    ("linger.ms", "5"),
    ("batch.size", "1000000"),
    ("compression.type", "lz4"),
];

fn batch(start: i64) -> RecordBatch {
    conformance_batch_with(start..start + BATCH_ROWS, |i| {
        format!(
            r#"{{"order":{i},"customer":{},"amount":{},"note":"{}"}}"#,
            i % 99_991,
            i % 100_000,
            "x".repeat(40)
        )
    })
}

async fn create_topic(bootstrap: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    admin
        .create_topics(
            &[NewTopic::new(topic, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
}

fn sink(bootstrap: &str, topic: &str) -> KafkaSink {
    let mut config = KafkaSinkConfig::new(bootstrap, topic, topic);
    for (k, v) in CLIENT {
        config.client.insert(k.to_string(), v.to_string());
    }
    config.records = RecordMapping {
        value_column: Some("payload".into()),
        ..RecordMapping::default()
    };
    KafkaSink::new(config, SinkId::new("bench").unwrap(), SubtaskId(0)).unwrap()
}

fn at(next: i64) -> Vec<SourceOffset> {
    vec![SourceOffset::new("bench", 0, next)]
}

/// Runs the driver for `run` seconds; returns (records, seconds, commit latencies). With `wait_for_commit`, each
/// checkpoint waits until its transaction is committed (to time it); otherwise commits overlap writes.
async fn run_driver(
    guarantee: DeliveryGuarantee,
    pool: &[RecordBatch],
    run: Duration,
    wait_for_commit: bool,
) -> (i64, f64, Vec<Duration>) {
    let bootstrap = Services::get().kafka_bootstrap().to_string();
    let topic = test_support::unique_name("bench-kafka");
    create_topic(&bootstrap, &topic).await;
    let state = tempfile::tempdir().unwrap();
    let mut driver = Driver::new(
        LocalCheckpointStore::open(state.path(), 3).unwrap(),
        DriverConfig::default(),
    );
    let handle = driver
        .add_sink(GuaranteedSink::new(sink(&bootstrap, &topic), guarantee))
        .unwrap();
    driver.start().await.unwrap();
    let started = Instant::now();
    let mut last = Instant::now();
    let mut next = 0;
    let mut latencies = Vec::new();
    for batch in pool.iter().cycle() {
        driver.write(handle, batch).await.unwrap();
        next += batch.num_rows() as i64;
        if last.elapsed() >= CHECKPOINT_INTERVAL {
            let begun = Instant::now();
            driver.checkpoint(at(next)).await.unwrap();
            if wait_for_commit {
                driver.finish_commit().await.unwrap();
                latencies.push(begun.elapsed());
            }
            last = Instant::now();
            if started.elapsed() >= run {
                break;
            }
        }
    }
    driver.close().await.unwrap();
    (next, started.elapsed().as_secs_f64(), latencies)
}

/// Plain idempotent, non-transactional produce of the same values for `run` seconds (delivery failures are not
/// checked: the limit only sends).
async fn run_limit(pool: &[RecordBatch], run: Duration) -> (i64, f64) {
    let bootstrap = Services::get().kafka_bootstrap().to_string();
    let topic = test_support::unique_name("bench-kafka-limit");
    create_topic(&bootstrap, &topic).await;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true");
    for (k, v) in CLIENT {
        config.set(*k, *v);
    }
    // The same way the sinks send: librdkafka's own delivery thread, no future per record.
    let producer: ThreadedProducer<DefaultProducerContext> = config.create().unwrap();
    let started = Instant::now();
    let mut sent = 0;
    'outer: for batch in pool.iter().cycle() {
        let payloads = batch
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        for value in payloads.iter().flatten() {
            let mut record = BaseRecord::<(), str>::to(&topic).payload(value);
            while let Err((_, returned)) = producer.send(record) {
                record = returned;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            sent += 1;
        }
        if started.elapsed() >= run {
            break 'outer;
        }
    }
    while producer.in_flight_count() > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (sent, started.elapsed().as_secs_f64())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let seconds: u64 = std::env::var("RATCHET_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let run = Duration::from_secs(seconds);
    let pool: Vec<RecordBatch> = (0..64).map(|i| batch(i * BATCH_ROWS)).collect();

    let (limit_records, limit_secs) = run_limit(&pool, run).await;
    let (alo_records, alo_secs, _) =
        run_driver(DeliveryGuarantee::AtLeastOnce, &pool, run, false).await;
    let (eo_records, eo_secs, _) =
        run_driver(DeliveryGuarantee::ExactlyOnce, &pool, run, false).await;
    let (_, _, mut latencies) = run_driver(DeliveryGuarantee::ExactlyOnce, &pool, run, true).await;
    latencies.sort();

    let rate = |records: i64, secs: f64| records as f64 / secs;
    let (limit, alo, eo) = (
        rate(limit_records, limit_secs),
        rate(alo_records, alo_secs),
        rate(eo_records, eo_secs),
    );
    println!("| mode | records | seconds | records/s |");
    println!("|---|---|---|---|");
    println!(
        "| limit (plain idempotent produce, no transactions) | {limit_records} | {limit_secs:.1} | {limit:.0} |"
    );
    println!("| at-least-once (driver + KafkaSink) | {alo_records} | {alo_secs:.1} | {alo:.0} |");
    println!(
        "| exactly-once (driver + KafkaSink, 1 s checkpoints) | {eo_records} | {eo_secs:.1} | {eo:.0} |"
    );
    println!();
    println!(
        "commit latency (checkpoint call until the transaction is committed), {} checkpoints: p50 {:?}, p99 {:?}",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99)
    );
    println!(
        "exactly-once = {:.0}% of the limit (target >= 80%), {:.0}% of at-least-once",
        eo / limit * 100.0,
        eo / alo * 100.0
    );
}
