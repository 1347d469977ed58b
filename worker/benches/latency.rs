//! Exactly-once latency: the time from produce to visible for an independent reader, per sink, at a fixed input
//! rate, at 100 ms and at 1 s checkpoints; and each sink's throughput at both intervals.
//!
//! For each sink kind, one `ratchet run` process (one subtask, exactly-once) reads a new one-partition topic into
//! the sink while this process produces JSON values carrying their produce time at a fixed rate
//! (`RATCHET_BENCH_RATE`, default 50 000 records/s, for `RATCHET_BENCH_SECONDS`, default 10), and a reader of the
//! sink's own system sees them become visible:
//!
//! - Kafka: a read_committed consumer of the output topic;
//! - files: listing the output directory every 5 ms (in-progress and pending files have dot names) and reading
//!   each new Parquet file;
//! - PostgreSQL: a `SELECT` of the rows past the last offset seen, every 5 ms, on a session of its own;
//! - Iceberg (SQLite catalog, local warehouse; `commit_every = 5` at 100 ms, so a snapshot every 500 ms, and 1 at
//!   1 s): loading the table every 20 ms and, on a new snapshot, scanning the rows past the last offset seen.
//!
//! A record's latency is when its reader saw it minus when it was produced (the producer's 5 ms linger
//! included). Records produced before the reader saw the pipeline live (warm-up) are left out. Throughput: the
//! same job on a pre-filled topic of `RATCHET_BENCH_RECORDS` (default 1 000 000) records, one process, until idle,
//! as `run.rs` measures it.
//!
//! Run: `scripts/services.sh up && cargo bench -p worker --bench latency` (see docs/benchmarks.md).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod limits;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use futures_util::TryStreamExt;
use iceberg::expr::Reference;
use iceberg::spec::Datum;
use limits::jobs::{JobFile, iceberg_catalog_uri, iceberg_warehouse, run_workers, spawn_worker};
use limits::runs::Rate;
use limits::{create_topic, fill_input, plain_consumer, producer};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rdkafka::Message;
use rdkafka::producer::{BaseRecord, Producer};
use test_support::Services;

/// The sink kinds, as the job file names them, and how the table shows them.
const SINKS: &[(&str, &str)] = &[
    ("kafka", "Kafka topic (read_committed consumer)"),
    ("file", "Parquet files, local (directory listing)"),
    ("jdbc", "PostgreSQL table, xa (SELECT)"),
    ("iceberg", "Iceberg table, SQLite catalog (scan)"),
];

/// Checkpoint intervals, and the Iceberg sink's `commit_every` at each.
const INTERVALS: &[(&str, u32)] = &[("100ms", 5), ("1s", 1)];

fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

fn main() {
    let services = Services::get();
    let rate = env_u64("RATCHET_BENCH_RATE", 50_000);
    let seconds = env_u64("RATCHET_BENCH_SECONDS", 10);
    let records = env_u64("RATCHET_BENCH_RECORDS", 1_000_000);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let filled = test_support::unique_name("bench-latency-filled");
    runtime.block_on(fill_input(&filled, records, 1));

    let mut rows = Vec::new();
    for (kind, title) in SINKS {
        let mut throughput_at_1s = None;
        let mut measured = Vec::new();
        for (interval, commit_every) in INTERVALS {
            let job = JobFile {
                subtasks: 1,
                checkpoint_interval: interval,
                commit_every: *commit_every,
                ..JobFile::new("", kind)
            };
            let dir = tempfile::tempdir().unwrap();
            let latencies = latency_run(&runtime, services, dir.path(), job, rate, seconds);
            let dir = tempfile::tempdir().unwrap();
            let written = JobFile {
                topic: &filled,
                ..job
            }
            .write(dir.path(), services);
            if *kind == "kafka" {
                runtime.block_on(create_topic(&format!("{}-out", written.name), 1));
            }
            let throughput = Rate::of(&run_workers(&written.path, 1));
            eprintln!("{kind} at {interval}: {throughput:?}");
            if *interval == "1s" {
                throughput_at_1s = Some(throughput.records_per_second);
            }
            measured.push((*interval, latencies, throughput));
        }
        for (interval, latencies, throughput) in measured {
            rows.push((
                *title,
                interval,
                latencies,
                throughput.records_per_second,
                throughput.records_per_second / throughput_at_1s.unwrap(),
            ));
        }
    }
    println!(
        "\nproduce-to-visible at {rate} records/s for {seconds} s (1 partition, 1 subtask, exactly-once); \
         throughput on {records} pre-filled records:\n"
    );
    println!(
        "| sink | checkpoint interval | records | p50 ms | p99 ms | max ms | throughput records/s | vs 1 s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (title, interval, mut latencies, throughput, ratio) in rows {
        latencies.sort_by(f64::total_cmp);
        let q = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
        println!(
            "| {title} | {interval} | {} | {:.0} | {:.0} | {:.0} | {throughput:.0} | {:.0}% |",
            latencies.len(),
            q(0.5),
            q(0.99),
            q(1.0),
            100.0 * ratio
        );
    }
}

/// One latency run: a worker running `job` on a new topic, this process producing at `rate` for `seconds`, the
/// sink's reader timing each record; returns the latencies (ms) of the timed records.
fn latency_run(
    runtime: &tokio::runtime::Runtime,
    services: &Services,
    dir: &Path,
    job: JobFile<'_>,
    rate: u64,
    seconds: u64,
) -> Vec<f64> {
    let topic = test_support::unique_name("bench-latency");
    runtime.block_on(create_topic(&topic, 1));
    let spec = JobFile {
        topic: &topic,
        ..job
    };
    let written = spec.write(dir, services);
    let reader = match spec.kind {
        "kafka" => {
            let out = format!("{}-out", written.name);
            runtime.block_on(create_topic(&out, 1));
            Reader::Kafka(Box::new(plain_consumer(&out)))
        }
        "file" => Reader::Files(dir.join("out"), HashSet::new()),
        "jdbc" => Reader::Postgres {
            url: services.pg_url().to_string(),
            table: written.name.clone(),
            client: None,
            offset: -1,
        },
        "iceberg" => Reader::Iceberg {
            uri: iceberg_catalog_uri(dir),
            warehouse: iceberg_warehouse(dir),
            table: written.name.clone(),
            catalog: None,
            snapshot: None,
            offset: -1,
        },
        other => panic!("unknown sink kind {other}"),
    };
    let worker = spawn_worker(&written.path, None);
    let expected = rate * seconds;
    let live = Arc::new(AtomicBool::new(false));
    let reading = {
        let live = live.clone();
        std::thread::spawn(move || read_until(reader, expected, &live))
    };
    produce(&topic, rate, seconds, &live);
    let latencies = reading.join().unwrap();
    kill(Pid::from_raw(worker.id() as i32), Signal::SIGTERM).unwrap();
    limits::jobs::wait_stopped(worker);
    latencies
}

/// Produces warm-up records (`"seq":-1`) every 50 ms until `live`, then `rate` records/s for `seconds`, each
/// carrying its produce time.
fn produce(topic: &str, rate: u64, seconds: u64, live: &AtomicBool) {
    let producer = producer();
    let filler = "x".repeat(40);
    let send = |seq: i64| {
        let value = format!(r#"{{"seq":{seq},"ts_us":{},"note":"{filler}"}}"#, now_us());
        let key = seq.to_string();
        let mut record = BaseRecord::to(topic).key(&key).payload(&value);
        while let Err((_, returned)) = producer.send(record) {
            record = returned;
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let warming = Instant::now();
    while !live.load(Ordering::SeqCst) {
        assert!(
            warming.elapsed() < Duration::from_secs(120),
            "the pipeline did not show a record within 120 s"
        );
        send(-1);
        std::thread::sleep(Duration::from_millis(50));
    }
    const TICK: Duration = Duration::from_millis(10);
    let per_tick = (rate / 100) as i64;
    let started = Instant::now();
    let mut seq = 0;
    for tick in 0..(seconds * 100) {
        for _ in 0..per_tick {
            send(seq);
            seq += 1;
        }
        let next = started + TICK * (tick as u32 + 1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    producer.flush(Duration::from_secs(60)).unwrap();
}

/// Polls `reader` until it saw `expected` timed records (within 120 s); sets `live` at the first record seen.
fn read_until(mut reader: Reader, expected: u64, live: &AtomicBool) -> Vec<f64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut seen = HashSet::new();
    let mut latencies = Vec::with_capacity(expected as usize);
    let mut last_progress = Instant::now();
    while (seen.len() as u64) < expected {
        let values = runtime.block_on(reader.poll());
        let at = now_us();
        if !values.is_empty() {
            live.store(true, Ordering::SeqCst);
            last_progress = Instant::now();
        }
        for value in values {
            let v: serde_json::Value = serde_json::from_str(&value).unwrap();
            let seq = v["seq"].as_i64().unwrap();
            if seq >= 0 && seen.insert(seq) {
                latencies.push((at - v["ts_us"].as_i64().unwrap()) as f64 / 1000.0);
            }
        }
        assert!(
            last_progress.elapsed() < Duration::from_secs(120),
            "{} of {expected} records visible, none more for 120 s",
            seen.len()
        );
    }
    latencies
}

/// The independent reader of one sink's system.
enum Reader {
    Kafka(Box<rdkafka::consumer::BaseConsumer>),
    /// The output directory and the files read so far.
    Files(PathBuf, HashSet<PathBuf>),
    Postgres {
        url: String,
        table: String,
        /// Connected at the first poll.
        client: Option<tokio_postgres::Client>,
        offset: i64,
    },
    Iceberg {
        uri: String,
        warehouse: String,
        table: String,
        /// Opened at the first poll.
        catalog: Option<Arc<dyn iceberg::Catalog>>,
        snapshot: Option<i64>,
        offset: i64,
    },
}

impl Reader {
    /// The values that became visible since the last poll (waits a few ms when nothing did).
    async fn poll(&mut self) -> Vec<String> {
        match self {
            Reader::Kafka(consumer) => {
                let mut values = Vec::new();
                let mut wait = Duration::from_millis(5);
                while let Some(message) = consumer.poll(wait) {
                    let message = message.unwrap();
                    values.push(String::from_utf8(message.payload().unwrap().to_vec()).unwrap());
                    wait = Duration::ZERO;
                }
                values
            }
            Reader::Files(dir, read) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let mut values = Vec::new();
                for path in visible_files(dir) {
                    if read.insert(path.clone()) {
                        values.extend(parquet_values(&path));
                    }
                }
                values
            }
            Reader::Postgres {
                url,
                table,
                client,
                offset,
            } => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                if client.is_none() {
                    let (connected, connection) =
                        tokio_postgres::connect(url, tokio_postgres::NoTls)
                            .await
                            .unwrap();
                    tokio::spawn(connection);
                    *client = Some(connected);
                }
                let rows = postgres_rows(client.as_ref().unwrap(), table, *offset).await;
                if let Some(last) = rows.iter().map(|(o, _)| *o).max() {
                    *offset = last;
                }
                rows.into_iter().map(|(_, v)| v).collect()
            }
            Reader::Iceberg {
                uri,
                warehouse,
                table,
                catalog,
                snapshot,
                offset,
            } => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if catalog.is_none() {
                    let config = iceberg_sink::CatalogConfig::Sql {
                        uri: uri.clone(),
                        warehouse: warehouse.clone(),
                    };
                    *catalog = Some(
                        config
                            .open("ratchet", &iceberg_sink::S3Settings::default())
                            .await
                            .unwrap(),
                    );
                }
                let Some((current, batches)) =
                    iceberg_rows(catalog.as_deref().unwrap(), table, *snapshot, *offset).await
                else {
                    return Vec::new();
                };
                *snapshot = Some(current);
                // The scan's batches come in no particular order: filter against the offset seen before it.
                let before = *offset;
                let mut values = Vec::new();
                for batch in batches {
                    let offsets = column::<Int64Array>(&batch, "offset");
                    let texts = column::<StringArray>(&batch, "value");
                    for i in 0..batch.num_rows() {
                        if offsets.value(i) > before {
                            values.push(texts.value(i).to_string());
                            *offset = (*offset).max(offsets.value(i));
                        }
                    }
                }
                values
            }
        }
    }
}

fn column<'b, T: 'static>(batch: &'b RecordBatch, name: &str) -> &'b T {
    batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_any()
        .downcast_ref::<T>()
        .unwrap_or_else(|| panic!("column {name} of an unexpected type"))
}

/// Visible Parquet files under `dir` (recursively; dot names are in progress or pending).
fn visible_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            found.extend(visible_files(&path));
        } else if name.ends_with(".parquet") {
            found.push(path);
        }
    }
    found
}

fn parquet_values(path: &Path) -> Vec<String> {
    let file = std::fs::File::open(path).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut values = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let texts = column::<StringArray>(&batch, "value");
        values.extend((0..batch.num_rows()).map(|i| texts.value(i).to_string()));
    }
    values
}

/// The rows of `table` past `offset` (none while the table does not exist yet).
async fn postgres_rows(
    client: &tokio_postgres::Client,
    table: &str,
    offset: i64,
) -> Vec<(i64, String)> {
    client
        .query(
            &format!(
                "SELECT \"offset\", value FROM \"{table}\" WHERE \"offset\" > $1 ORDER BY \"offset\""
            ),
            &[&offset],
        )
        .await
        .map(|rows| rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        .unwrap_or_default()
}

/// The current snapshot of `bench.<table>` and its rows past `offset`, when the snapshot is not `seen`.
async fn iceberg_rows(
    catalog: &dyn iceberg::Catalog,
    table: &str,
    seen: Option<i64>,
    offset: i64,
) -> Option<(i64, Vec<RecordBatch>)> {
    let ident = iceberg::TableIdent::from_strs(["bench", table]).unwrap();
    let loaded = catalog.load_table(&ident).await.ok()?;
    let current = loaded.metadata().current_snapshot_id()?;
    if Some(current) == seen {
        return None;
    }
    let batches = loaded
        .scan()
        .snapshot_id(current)
        .select(["offset", "value"])
        .with_filter(Reference::new("offset").greater_than(Datum::long(offset)))
        .build()
        .unwrap()
        .to_arrow()
        .await
        .unwrap()
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    Some((current, batches))
}
