//! The limits the benchmarks compare Ratchet's jobs with: the same work with no commit protocol (a plain
//! Kafka-to-Kafka copy, consume + `ArrowWriter`), the shared input, and the process's own CPU time and peak RSS.
//! Included by `pipelines.rs`, `run.rs` and `latency.rs` (`mod limits;`).
#![allow(dead_code)]

pub mod jobs;
pub mod runs;

use std::fs::File;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_array::builder::{ArrayBuilder, Int32Builder, Int64Builder, StringBuilder};
use kafka_source::{KafkaConnection, text_schema};
use nix::sys::resource::{UsageWho, getrusage};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use test_support::Services;

/// Producer settings of every job, so they all send the same way.
pub const PRODUCER: &[(&str, &str)] = &[
    ("linger.ms", "5"),
    ("batch.size", "1000000"),
    ("compression.type", "lz4"),
];

pub const CHECKPOINT: Duration = Duration::from_secs(1);

pub fn bootstrap() -> String {
    Services::get().kafka_bootstrap().to_string()
}

pub async fn create_topic(topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
        .into_iter()
        .for_each(|r| {
            r.unwrap();
        });
}

pub fn producer() -> ThreadedProducer<DefaultProducerContext> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true");
    for (k, v) in PRODUCER {
        config.set(*k, *v);
    }
    config.create().unwrap()
}

/// `records` ~100-byte JSON values with keys, into a new topic of `partitions` partitions.
pub async fn fill_input(topic: &str, records: u64, partitions: i32) {
    create_topic(topic, partitions).await;
    let producer = producer();
    let filler = "x".repeat(40);
    for i in 0..records {
        let key = i.to_string();
        let value = format!(
            r#"{{"order":{i},"customer":{},"amount":{},"note":"{filler}"}}"#,
            i % 99_991,
            i % 100_000
        );
        let mut record = BaseRecord::to(topic).key(&key).payload(&value);
        while let Err((_, returned)) = producer.send(record) {
            record = returned;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    producer.flush(Duration::from_secs(120)).unwrap();
}

/// CPU seconds (user + system) and peak RSS (MB) of this process so far.
pub fn usage() -> (f64, f64) {
    let usage = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    (
        seconds(usage.user_time()) + seconds(usage.system_time()),
        usage.max_rss() as f64 / 1024.0,
    )
}

/// The limits' consumer: the same librdkafka settings as Ratchet's consumers, every partition assigned (no group
/// protocol), from the beginning.
pub fn plain_consumer(topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = KafkaConnection::plaintext(bootstrap())
        .consumer_config()
        .set("group.id", test_support::unique_name("bench-plain"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
        assignment
            .add_partition_offset(topic, partition.id(), Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    consumer
}

/// The Kafka -> Kafka limit: poll, send, no transaction, no offsets.
pub fn plain_copy(topic: &str, out: &str, records: u64) -> (u64, Duration) {
    let consumer = plain_consumer(topic);
    let producer = producer();
    let mut copied = 0;
    let mut first = None;
    while copied < records {
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        first.get_or_insert_with(Instant::now);
        let message = message.unwrap();
        let mut record = BaseRecord::<[u8], [u8]>::to(out);
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if let Some(payload) = message.payload() {
            record = record.payload(payload);
        }
        // The same work as KafkaToKafka: headers are copied too.
        if let Some(headers) = message.headers() {
            record = record.headers(headers.detach());
        }
        while let Err((_, returned)) = producer.send(record) {
            record = returned;
            std::thread::sleep(Duration::from_millis(1));
        }
        copied += 1;
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    (copied, first.unwrap().elapsed())
}

pub fn writer_properties() -> WriterProperties {
    // The file sink's defaults: zstd, 128 Ki-row row groups.
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(128 * 1024))
        .build()
}

/// The Kafka -> Parquet limit: poll, build the same Arrow columns, `ArrowWriter` into one file per second.
pub fn plain_parquet(topic: &str, dir: &std::path::Path, records: u64) -> (u64, Duration) {
    let consumer = plain_consumer(topic);
    let schema = text_schema();
    let mut copied = 0u64;
    let mut first = None;
    let mut file_number = 0;
    while copied < records {
        file_number += 1;
        let file = File::create(dir.join(format!("part-{file_number}.parquet"))).unwrap();
        let mut writer =
            ArrowWriter::try_new(file, schema.clone(), Some(writer_properties())).unwrap();
        let opened = Instant::now();
        while copied < records && opened.elapsed() < CHECKPOINT {
            let mut topics = StringBuilder::new();
            let mut partitions = Int32Builder::new();
            let mut offsets = Int64Builder::new();
            let mut keys = StringBuilder::new();
            let mut values = StringBuilder::new();
            while offsets.len() < 8192 && copied < records {
                let Some(message) = consumer.poll(Duration::from_millis(100)) else {
                    break;
                };
                first.get_or_insert_with(Instant::now);
                let message = message.unwrap();
                topics.append_value(message.topic());
                partitions.append_value(message.partition());
                offsets.append_value(message.offset());
                keys.append_option(message.key().map(|k| std::str::from_utf8(k).unwrap()));
                values.append_option(message.payload().map(|v| std::str::from_utf8(v).unwrap()));
                copied += 1;
            }
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(topics.finish()),
                    Arc::new(partitions.finish()),
                    Arc::new(offsets.finish()),
                    Arc::new(keys.finish()),
                    Arc::new(values.finish()),
                ],
            )
            .unwrap();
            writer.write(&batch).unwrap();
        }
        writer.into_inner().unwrap().sync_all().unwrap();
    }
    (copied, first.unwrap().elapsed())
}

/// Runs this benchmark binary again with `variable=job` (its child mode, so the job's CPU time and RSS are its
/// own) on `records` of `topic`, and returns the numbers of the `RESULT` line it prints.
pub fn run_child(variable: &str, job: &str, topic: &str, records: u64) -> Vec<f64> {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(variable, job)
        .env("RATCHET_BENCH_TOPIC", topic)
        .env("RATCHET_BENCH_N", records.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| {
            panic!(
                "job {job} failed ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    line.split(' ').map(|x| x.parse().unwrap()).collect()
}
