//! File sink throughput: exactly-once and at-least-once through the checkpoint driver, against writing the same
//! Parquet files straight with the parquet crate (the limit), on local disk and on SeaweedFS S3, checkpointing
//! every second. Prints a table (MB/s of Arrow input, records/s) and the ratios the targets are about.
//!
//! Run: `scripts/services.sh up && cargo bench -p file-sink --bench throughput` (see docs/benchmarks.md).
//! `RATCHET_BENCH_RECORDS` sets records per run on local disk (default 50 million; S3 runs use 40% of it); the
//! runs cycle through a pool of 128 batches of 8192 rows, so memory stays small whatever the count.
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use aws_sdk_s3::primitives::ByteStream;
use connector_api::{
    DeliveryGuarantee, Driver, DriverConfig, GuaranteedSink, LocalCheckpointStore, SinkId,
    SourceOffset, SubtaskId,
};
use file_sink::{FileSink, FileSinkConfig, S3Config, StorageConfig};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use ratchet_conformance::{conformance_batch_with, conformance_schema};
use test_support::Services;

const BATCH_ROWS: i64 = 8192;
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

fn batch(start: i64) -> RecordBatch {
    conformance_batch_with(start..start + BATCH_ROWS, |i| {
        format!(
            "order-{i:012}-customer-{:08}-amount-{:06}-padding-{}",
            i % 99_991,
            i % 100_000,
            "x".repeat(40)
        )
    })
}

#[derive(Clone, Copy)]
enum Mode {
    ExactlyOnce,
    AtLeastOnce,
    Limit,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::ExactlyOnce => "exactly-once (driver + FileSink)",
            Mode::AtLeastOnce => "at-least-once (driver + FileSink)",
            Mode::Limit => "limit (parquet crate straight)",
        }
    }
}

struct Outcome {
    seconds: f64,
    records: i64,
    bytes: usize,
}

fn s3_storage(prefix: &str) -> StorageConfig {
    let s3 = Services::get().s3();
    StorageConfig::S3(S3Config {
        bucket: s3.bucket,
        prefix: prefix.to_string(),
        endpoint: Some(s3.endpoint),
        region: Some(s3.region),
        access_key_id: Some(s3.access_key),
        secret_access_key: Some(s3.secret_key.into()),
        force_path_style: true,
        part_size: file_sink::MIN_PART_SIZE,
        spill_dir: None,
    })
}

/// The same Parquet settings the sink uses by default (zstd, 128 Ki rows per row group): the limit writes the same
/// files.
fn props() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(128 * 1024))
        .build()
}

/// Source positions after `next` records.
fn at(next: i64) -> Vec<SourceOffset> {
    vec![SourceOffset::new("bench", 0, next)]
}

/// The batches of one run: `rounds` passes over the pool.
fn stream(pool: &[RecordBatch], rounds: usize) -> impl Iterator<Item = &RecordBatch> {
    (0..rounds).flat_map(move |_| pool.iter())
}

async fn run_driver(
    mode: Mode,
    storage: StorageConfig,
    pool: &[RecordBatch],
    rounds: usize,
) -> f64 {
    let state = tempfile::tempdir().unwrap();
    let sink = FileSink::new(FileSinkConfig::new(
        SinkId::new("bench").unwrap(),
        SubtaskId(0),
        conformance_schema(),
        storage,
    ))
    .await
    .unwrap();
    let guarantee = match mode {
        Mode::ExactlyOnce => DeliveryGuarantee::ExactlyOnce,
        _ => DeliveryGuarantee::AtLeastOnce,
    };
    let mut driver = Driver::new(
        LocalCheckpointStore::open(state.path(), 3).unwrap(),
        DriverConfig::default(),
    );
    let handle = driver
        .add_sink(GuaranteedSink::new(sink, guarantee))
        .unwrap();
    let started = Instant::now();
    driver.start().await.unwrap();
    let mut last = Instant::now();
    let mut next = 0;
    for batch in stream(pool, rounds) {
        driver.write(handle, batch).await.unwrap();
        next += batch.num_rows() as i64;
        if last.elapsed() >= CHECKPOINT_INTERVAL {
            driver.checkpoint(at(next)).await.unwrap();
            last = Instant::now();
        }
    }
    driver.checkpoint(at(next)).await.unwrap();
    driver.close().await.unwrap();
    started.elapsed().as_secs_f64()
}

/// The same batches written with the parquet crate straight into files, a new file every second.
async fn run_limit(storage: StorageConfig, pool: &[RecordBatch], rounds: usize) -> f64 {
    let started = Instant::now();
    let mut last = Instant::now();
    let mut file_no = 0;
    let mut writer = ArrowWriter::try_new(Vec::new(), conformance_schema(), Some(props())).unwrap();
    let client = match &storage {
        StorageConfig::S3(s3) => {
            let config = aws_sdk_s3::config::Builder::new()
                .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
                .endpoint_url(s3.endpoint.clone().unwrap())
                .region(aws_sdk_s3::config::Region::new(s3.region.clone().unwrap()))
                .credentials_provider(aws_sdk_s3::config::Credentials::new(
                    s3.access_key_id.clone().unwrap(),
                    s3.secret_access_key.as_ref().unwrap().expose(),
                    None,
                    None,
                    "bench",
                ))
                .force_path_style(true)
                .build();
            Some((
                aws_sdk_s3::Client::from_conf(config),
                s3.bucket.clone(),
                s3.prefix.clone(),
            ))
        }
        StorageConfig::Local { .. } => None,
    };
    let flush = |writer: ArrowWriter<Vec<u8>>, file_no: usize| {
        let bytes = writer.into_inner().unwrap();
        let storage = storage.clone();
        let client = client.clone();
        async move {
            match (&storage, client) {
                (StorageConfig::Local { path }, _) => {
                    std::fs::create_dir_all(path).unwrap();
                    let target = path.join(format!("limit-{file_no:05}.parquet"));
                    let mut file = std::fs::File::create(target).unwrap();
                    std::io::Write::write_all(&mut file, &bytes).unwrap();
                    file.sync_all().unwrap();
                }
                (_, Some((client, bucket, prefix))) => {
                    client
                        .put_object()
                        .bucket(bucket)
                        .key(format!("{prefix}/limit-{file_no:05}.parquet"))
                        .body(ByteStream::from(bytes))
                        .send()
                        .await
                        .unwrap();
                }
                _ => unreachable!(),
            }
        }
    };
    for batch in stream(pool, rounds) {
        writer.write(batch).unwrap();
        if last.elapsed() >= CHECKPOINT_INTERVAL {
            let full = std::mem::replace(
                &mut writer,
                ArrowWriter::try_new(Vec::new(), conformance_schema(), Some(props())).unwrap(),
            );
            flush(full, file_no).await;
            file_no += 1;
            last = Instant::now();
        }
    }
    flush(writer, file_no).await;
    started.elapsed().as_secs_f64()
}

async fn run(mode: Mode, storage: StorageConfig, pool: &[RecordBatch], rounds: usize) -> Outcome {
    let seconds = match mode {
        Mode::Limit => run_limit(storage, pool, rounds).await,
        _ => run_driver(mode, storage, pool, rounds).await,
    };
    Outcome {
        seconds,
        records: stream(pool, rounds).map(|b| b.num_rows() as i64).sum(),
        bytes: stream(pool, rounds)
            .map(|b| b.get_array_memory_size())
            .sum(),
    }
}

#[tokio::main]
async fn main() {
    let records: i64 = std::env::var("RATCHET_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000_000);
    let pool: Vec<RecordBatch> = (0..128).map(|i| batch(i * BATCH_ROWS)).collect();
    let pool_records = 128 * BATCH_ROWS;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    println!("| backend | mode | records | seconds | MB/s (Arrow input) | records/s |");
    println!("|---|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for backend in ["local", "s3"] {
        let count = if backend == "local" {
            records
        } else {
            records * 2 / 5
        };
        let rounds = (count / pool_records).max(1) as usize;
        let mut rates = Vec::new();
        for mode in [Mode::Limit, Mode::AtLeastOnce, Mode::ExactlyOnce] {
            let dir = tempfile::tempdir().unwrap();
            let tag = match mode {
                Mode::ExactlyOnce => "eo",
                Mode::AtLeastOnce => "alo",
                Mode::Limit => "limit",
            };
            let storage = match backend {
                "local" => StorageConfig::Local {
                    path: dir.path().join(tag),
                },
                _ => s3_storage(&format!("bench/{nanos}/{tag}")),
            };
            let outcome = run(mode, storage, &pool, rounds).await;
            let mbps = outcome.bytes as f64 / 1e6 / outcome.seconds;
            let rps = outcome.records as f64 / outcome.seconds;
            println!(
                "| {backend} | {} | {} | {:.2} | {mbps:.1} | {rps:.0} |",
                mode.name(),
                outcome.records,
                outcome.seconds
            );
            rates.push(rps);
        }
        ratios.push((backend, rates[2] / rates[1], rates[2] / rates[0]));
    }
    println!();
    for (backend, vs_alo, vs_limit) in ratios {
        println!(
            "{backend}: exactly-once = {:.0}% of at-least-once (target >= 90%), {:.0}% of the limit (target >= 80%)",
            vs_alo * 100.0,
            vs_limit * 100.0
        );
    }
}
