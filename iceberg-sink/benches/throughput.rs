//! Iceberg sink throughput and commit latency (SQLite catalog, local warehouse), at 1 s and 10 s checkpoint
//! intervals, against two references on the same rows:
//!
//! - **limit**: the same Parquet data files written by the same writer (zstd, same target size), closed every
//!   interval, with no catalog commit at all;
//! - **peer**: pyiceberg 0.12 `table.append` of Arrow tables of the same rows (one snapshot per append), the
//!   usual way to load a table from Python; it appends 100 000 rows per call.
//!
//! The sink runs the way the driver runs it: the commit of checkpoint N runs on its own task while N+1 is
//! written; the next pre-commit waits for it. (The checkpoint store's save, a local fsync of about a
//! millisecond, is not part of this loop.) Prints a table and the ratios (median of the runs).
//!
//! With `RATCHET_BENCH_SMALL_FILES=1` it instead simulates an hour of a 1 000 rows/s stream committed at 1 s and
//! at 60 s checkpoints (3 600 and 60 commits of the same rows, run back to back) and prints the files and bytes of
//! data and metadata the table holds afterwards, the manifests its current snapshot names and how long pyiceberg
//! takes to plan a scan of it: at 1 s without maintenance, with `expire_snapshots` on a table that keeps 100
//! snapshots, and with expiry and manifest merging (the sink's default for tables it creates). With
//! `RATCHET_BENCH_DAY=1` it simulates a day at 1 s (86 400 commits of 10 rows) with expiry and merging. With
//! `RATCHET_BENCH_UPSERT_HOUR=1` it simulates an hour of upserts at 1 s (3 600 commits of 1 000 rows whose ids
//! cycle through 100 000 keys, position deletes, expiry and merging), then has Spark 4.1.4 time a full scan of
//! the table, compact it (rewrite_data_files, rewrite_position_delete_files) and time the scan again
//! (`test-support/verifiers/spark_iceberg.py scan`); then the same hour with the sink's compaction (`compact`,
//! default policy), whose table Spark scans as the sink left it. With `RATCHET_BENCH_COMPACT=1` it runs the hour at 1 s and
//! `RATCHET_BENCH_COMPACT_COMMITS` (default 86 400: the day) commits of 10 rows with expiry, merging and the
//! sink's compaction (`compact`, default policy); the data-files column then says how many are live.
//!
//! At 1 s it also runs the sink in the upsert mode (`upsert_key = ["id"]`: each checkpoint a row delta of data
//! files and deletes of the rows they replace; a checkpoint ends at 1 s or 1M rows, ids distinct within a
//! checkpoint and cycling through 2M, so each checkpoint from the third replaces the rows of the one two before), once by position deletes (the key index), once by equality
//! deletes, and once into a format-version 3 table by deletion vectors (the key index; each commit merges a data
//! file's new vector with its earlier one). (The key index's memory and rebuild time: `benches/key_index.rs`.)
//!
//! Run: `scripts/services.sh up venv && cargo bench -p iceberg-sink --bench throughput` (see docs/benchmarks.md).
//! `RATCHET_BENCH_UPSERTS_ONLY=1` runs the 1 s modes only (upserts, then the append and limit), without pyiceberg.
//! `RATCHET_BENCH_SECONDS` sets the length of each run (default 30: three 10 s checkpoints), `RATCHET_BENCH_RUNS`
//! the runs per mode (default 3).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod lake;

use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use connector_api::{CheckpointId, Committer, TwoPhaseCommit};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg_sink::{
    CheckpointWriter, DEFAULT_TARGET_FILE_SIZE, IcebergSink, IcebergSinkConfig,
    MANIFEST_MERGE_ENABLED, S3Settings, UpsertDeletes,
};
use lake::{config, lake};
use ratchet_conformance::conformance_batch_with;
use test_support::Services;

const BATCH_ROWS: i64 = 8192;
/// Distinct batches cycled through (about 1M rows, 100 MB): enough that repeats do not flatter the encoders.
const DISTINCT_BATCHES: i64 = 128;
const PEER_ROWS_PER_APPEND: i64 = 100_000;

/// About 90 bytes of text per row that compresses like real order data (a 64-hex-digit digest per row), not like
/// repeated filler.
fn payload(i: i64) -> String {
    let digest = |seed: u64| {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^ (x >> 29)
    };
    let i = i as u64;
    format!(
        "order {i} customer {} {:016x}{:016x}{:016x}{:016x}",
        i % 99_991,
        digest(i),
        digest(i + 1),
        digest(i + 2),
        digest(i + 3)
    )
}

fn batch(start: i64) -> RecordBatch {
    conformance_batch_with(start..start + BATCH_ROWS, payload)
}

fn distinct_batches() -> Vec<RecordBatch> {
    (0..DISTINCT_BATCHES)
        .map(|i| batch(i * BATCH_ROWS))
        .collect()
}

struct Measured {
    rows: i64,
    elapsed: Duration,
    commits_ms: Vec<f64>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64()
    }

    fn quantile(&self, q: f64) -> String {
        let mut sorted = self.commits_ms.clone();
        sorted.sort_by(f64::total_cmp);
        sorted
            .get(((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1)))
            .map_or_else(|| "-".into(), |ms| format!("{ms:.1}"))
    }
}

/// The most rows an upsert checkpoint takes (`RATCHET_BENCH_UPSERT_CHECKPOINT_ROWS`, default 1M): its writes only
/// queue batches (the rows are applied at pre-commit), so 1 s of writes would queue tens of millions of rows and
/// tens of GB, far past what a checkpoint applies in a second; a checkpoint ends at 1 s or at this many rows.
/// The ids of an upsert run cycle through twice this many: distinct within a checkpoint (so it writes every row
/// it reads, as the append does), and from the third checkpoint on each one replaces the rows of the checkpoint
/// two before (so its deletes find rows in the files of earlier checkpoints).
const UPSERT_CHECKPOINT_ROWS: u64 = 1_000_000;

/// `batch` with the ids `first..` (the payloads stay).
fn with_ids(batch: &RecordBatch, first: i64) -> RecordBatch {
    let ids = arrow_array::Int64Array::from_iter_values(first..first + batch.num_rows() as i64);
    let mut columns = batch.columns().to_vec();
    columns[0] = std::sync::Arc::new(ids);
    RecordBatch::try_new(batch.schema(), columns).unwrap()
}

/// Which table an upsert run writes and how it deletes.
#[derive(Debug, Clone, Copy)]
enum Upsert {
    /// A format-version 2 table, position deletes or equality deletes.
    Version2(UpsertDeletes),
    /// A format-version 3 table: deletion vectors (`upsert_deletes = "position"`).
    Vectors,
}

impl Upsert {
    fn deletes(self) -> UpsertDeletes {
        match self {
            Self::Version2(deletes) => deletes,
            Self::Vectors => UpsertDeletes::Position,
        }
    }
}

/// The sink, exactly once, checkpointing every `interval`; with `upsert`, by key `id` (row deltas deleting the
/// way it says), at most [`UPSERT_CHECKPOINT_ROWS`] rows per checkpoint, the ids cycling through twice that.
async fn run_sink(interval: Duration, seconds: Duration, upsert: Option<Upsert>) -> Measured {
    let lake = lake();
    if let Some(Upsert::Vectors) = upsert {
        lake::create_version_3_table(&lake).await;
    }
    let config = IcebergSinkConfig {
        upsert_key: match upsert {
            Some(_) => vec!["id".into()],
            None => Vec::new(),
        },
        upsert_deletes: upsert.map(Upsert::deletes).unwrap_or_default(),
        ..config(&lake)
    };
    let mut sink = IcebergSink::new(config).await.unwrap();
    sink.recover(None).await.unwrap();
    let committer = sink.committer();
    let batches = distinct_batches();
    let upsert_rows = env_u64(
        "RATCHET_BENCH_UPSERT_CHECKPOINT_ROWS",
        UPSERT_CHECKPOINT_ROWS,
    ) as i64;
    let mut rows = 0;
    let mut commits_ms = Vec::new();
    let mut pending: Option<tokio::task::JoinHandle<f64>> = None;
    let start = Instant::now();
    let mut checkpoint = 1;
    while start.elapsed() < seconds {
        sink.begin(CheckpointId(checkpoint)).await.unwrap();
        let opened = Instant::now();
        let first = rows;
        while opened.elapsed() < interval && (upsert.is_none() || rows - first < upsert_rows) {
            let batch = &batches[((rows / BATCH_ROWS) % DISTINCT_BATCHES) as usize];
            if upsert.is_some() {
                sink.write(&with_ids(batch, rows % (2 * upsert_rows)))
                    .await
                    .unwrap();
            } else {
                sink.write(batch).await.unwrap();
            }
            rows += BATCH_ROWS;
        }
        let committable = sink.pre_commit(CheckpointId(checkpoint)).await.unwrap();
        if let Some(previous) = pending.take() {
            commits_ms.push(previous.await.unwrap());
        }
        let committer = committer.clone();
        pending = Some(tokio::spawn(async move {
            let t0 = Instant::now();
            committer.commit(vec![committable]).await.unwrap();
            t0.elapsed().as_secs_f64() * 1000.0
        }));
        checkpoint += 1;
    }
    if let Some(previous) = pending.take() {
        commits_ms.push(previous.await.unwrap());
    }
    Measured {
        rows,
        elapsed: start.elapsed(),
        commits_ms,
    }
}

/// The same files by the same writer, closed every `interval`, never committed.
async fn run_limit(interval: Duration, seconds: Duration) -> Measured {
    let lake = lake();
    let mut sink = IcebergSink::new(config(&lake)).await.unwrap();
    sink.recover(None).await.unwrap();
    let catalog = config(&lake)
        .catalog
        .open("ratchet", &S3Settings::default())
        .await
        .unwrap();
    let table = catalog
        .load_table(&iceberg::TableIdent::from_strs(["bench", "events"]).unwrap())
        .await
        .unwrap();
    let batches = distinct_batches();
    let mut rows = 0;
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < seconds {
        let mut writer =
            CheckpointWriter::open(&table, format!("limit-{n}"), DEFAULT_TARGET_FILE_SIZE)
                .await
                .unwrap();
        let opened = Instant::now();
        while opened.elapsed() < interval {
            writer
                .write(&batches[((rows / BATCH_ROWS) % DISTINCT_BATCHES) as usize])
                .await
                .unwrap();
            rows += BATCH_ROWS;
        }
        writer.close().await.unwrap();
        n += 1;
    }
    Measured {
        rows,
        elapsed: start.elapsed(),
        commits_ms: Vec::new(),
    }
}

fn run_peer(seconds: Duration) -> Measured {
    let lake = lake();
    let out = Services::get().python_script(
        &test_support::repo_root().join("iceberg-sink/benches/pyiceberg_append.py"),
        &[
            &lake.python_uri,
            &lake.warehouse,
            "bench.events",
            &PEER_ROWS_PER_APPEND.to_string(),
            &seconds.as_secs_f64().to_string(),
        ],
    );
    Measured {
        rows: out["rows"].as_i64().unwrap(),
        elapsed: Duration::from_secs_f64(out["seconds"].as_f64().unwrap()),
        commits_ms: vec![
            out["append_p50_ms"].as_f64().unwrap(),
            out["append_p99_ms"].as_f64().unwrap(),
        ],
    }
}

fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut runs: Vec<Measured>) -> Measured {
    runs.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    runs.swap_remove(runs.len() / 2)
}

/// (files, bytes) under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> (u64, u64) {
    let mut total = (0, 0);
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                let (n, b) = files_under(&entry.path());
                total = (total.0 + n, total.1 + b);
            } else {
                total = (total.0 + 1, total.1 + meta.len());
            }
        }
    }
    total
}

/// One small-files run: `commits` commits of `rows_per_commit` rows each. With `keep`, the sink expires snapshots
/// in its commits (`expire_snapshots`) and the table keeps `keep` of them; `merge` leaves manifest merging on (the
/// tables the sink creates ask for it, merging at 100 manifests) or turns it off.
struct SmallFiles {
    label: String,
    commits: u64,
    rows_per_commit: i64,
    keep: Option<usize>,
    merge: bool,
    /// Upserts by `id` (position deletes), the ids cycling through this many keys (a multiple of
    /// `rows_per_commit`); appends of new ids without it.
    upsert_keys: Option<i64>,
    /// Compaction inside the commits (`compact`, the default policy: 128 MiB, 8 files).
    compact: bool,
}

/// What the current snapshot of a table names, by content: its manifests and their live (added or existing)
/// files, from the manifest list alone (one read).
struct Census {
    data_manifests: usize,
    delete_manifests: usize,
    data_files: u64,
    delete_files: u64,
}

impl Census {
    async fn of(table: &iceberg::table::Table) -> Self {
        let mut census = Census {
            data_manifests: 0,
            delete_manifests: 0,
            data_files: 0,
            delete_files: 0,
        };
        let Some(snapshot) = table.metadata().current_snapshot() else {
            return census;
        };
        let bytes = table
            .file_io()
            .new_input(snapshot.manifest_list())
            .unwrap()
            .read()
            .await
            .unwrap();
        let list = iceberg::spec::ManifestList::parse_with_version(
            &bytes,
            table.metadata().format_version(),
        )
        .unwrap();
        for manifest in list.entries() {
            let live = u64::from(manifest.added_files_count.unwrap_or(0))
                + u64::from(manifest.existing_files_count.unwrap_or(0));
            match manifest.content {
                iceberg::spec::ManifestContentType::Data => {
                    census.data_manifests += 1;
                    census.data_files += live;
                }
                iceberg::spec::ManifestContentType::Deletes => {
                    census.delete_manifests += 1;
                    census.delete_files += live;
                }
            }
        }
        census
    }
}

impl std::fmt::Display for Census {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "manifests {} data + {} delete, live files {} data + {} delete",
            self.data_manifests, self.delete_manifests, self.data_files, self.delete_files
        )
    }
}

/// The `q` quantile (0 to 1) of `values`, nearest rank.
fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Runs `run`, prints its row of the table; for an upsert run, returns what Spark measured of the table
/// (`spark_iceberg.py scan`: scan time before and after Spark's own compaction).
async fn small_files(run: SmallFiles) -> Option<serde_json::Value> {
    let lake = lake();
    let config = IcebergSinkConfig {
        expire_snapshots: run.keep.is_some(),
        compact: match run.compact {
            true => iceberg_sink::Compact::On(Default::default()),
            false => iceberg_sink::Compact::Off,
        },
        upsert_key: match run.upsert_keys {
            Some(_) => vec!["id".into()],
            None => Vec::new(),
        },
        ..config(&lake)
    };
    let mut sink = IcebergSink::new(config.clone()).await.unwrap();
    let catalog = config
        .catalog
        .open("ratchet", &S3Settings::default())
        .await
        .unwrap();
    let ident = iceberg::TableIdent::from_strs(["bench", "events"]).unwrap();
    let table = catalog.load_table(&ident).await.unwrap();
    let tx = Transaction::new(&table);
    let mut properties = tx
        .update_table_properties()
        .set(MANIFEST_MERGE_ENABLED.into(), run.merge.to_string());
    if let Some(keep) = run.keep {
        properties = properties
            .set(
                "history.expire.min-snapshots-to-keep".into(),
                keep.to_string(),
            )
            .set("history.expire.max-snapshot-age-ms".into(), "1".into());
    }
    let tx = properties.apply(tx).unwrap();
    tx.commit(catalog.as_ref()).await.unwrap();
    sink.recover(None).await.unwrap();
    let committer = sink.committer();
    let rows = run.rows_per_commit;
    let started = Instant::now();
    let mut commits_ms = Vec::new();
    for checkpoint in 1..=run.commits {
        sink.begin(CheckpointId(checkpoint)).await.unwrap();
        let start = (checkpoint as i64 - 1) * rows;
        let start = run.upsert_keys.map_or(start, |keys| start % keys);
        sink.write(&conformance_batch_with(start..start + rows, payload))
            .await
            .unwrap();
        let committable = sink.pre_commit(CheckpointId(checkpoint)).await.unwrap();
        let t0 = Instant::now();
        committer.commit(vec![committable]).await.unwrap();
        commits_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        if checkpoint % 3600 == 0 && run.commits > 3600 {
            let hour = &commits_ms[commits_ms.len() - 3600..];
            let census = Census::of(&catalog.load_table(&ident).await.unwrap()).await;
            eprintln!(
                "[bench] {}: {checkpoint} commits, this simulated hour's commit p50 {:.0} ms, p99 {:.0} ms, {:.0} s so far; {census}",
                run.label,
                percentile(hour, 0.5),
                percentile(hour, 0.99),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let simulated = started.elapsed();
    let snapshots = catalog
        .load_table(&ident)
        .await
        .unwrap()
        .metadata()
        .snapshots()
        .count();
    let window = commits_ms.len().min(100);
    let (first, last) = (
        percentile(&commits_ms[..window], 0.99),
        percentile(&commits_ms[commits_ms.len() - window..], 0.99),
    );
    let table_dir = std::path::Path::new(lake.warehouse.strip_prefix("file://").unwrap())
        .join("bench")
        .join("events");
    let (data_files, data_bytes) = files_under(&table_dir.join("data"));
    let metadata_dir = table_dir.join("metadata");
    let (metadata_files, metadata_bytes) = files_under(&metadata_dir);
    let newest_json = std::fs::read_dir(&metadata_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".metadata.json"))
        .map(|e| e.metadata().unwrap().len())
        .max()
        .unwrap_or(0);
    let plan = Services::get().python_script(
        &test_support::repo_root().join("iceberg-sink/benches/pyiceberg_plan.py"),
        &[&lake.python_uri, &lake.warehouse, "bench.events"],
    );
    let mode = &run.label;
    println!(
        "| {mode} | {snapshots} | {data_files} ({} live) | {:.1} | {metadata_files} | {:.1} | {:.0} | {} | {first:.0} / {last:.0} | {:.2} | {:.0} | {:.0} |",
        plan["data_files"],
        data_bytes as f64 / 1e6,
        metadata_bytes as f64 / 1e6,
        newest_json as f64 / 1e3,
        plan["manifests"],
        plan["plan_seconds"].as_f64().unwrap(),
        simulated.as_secs_f64(),
        (run.commits as i64 * rows) as f64 / simulated.as_secs_f64(),
    );
    run.upsert_keys.map(|_| {
        let db = lake.python_uri.strip_prefix("sqlite:///").unwrap();
        Services::get().python_script(
            &test_support::repo_root().join("test-support/verifiers/spark_iceberg.py"),
            &["scan", db, &lake.warehouse, "bench.events"],
        )
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let small = std::env::var("RATCHET_BENCH_SMALL_FILES").is_ok();
    let day = std::env::var("RATCHET_BENCH_DAY").is_ok();
    let upsert_hour = std::env::var("RATCHET_BENCH_UPSERT_HOUR").is_ok();
    let upsert_day = std::env::var("RATCHET_BENCH_UPSERT_DAY").is_ok();
    let compacting = std::env::var("RATCHET_BENCH_COMPACT").is_ok();
    if small || day || upsert_hour || upsert_day || compacting {
        println!(
            "| run | snapshots | data files | data MB | metadata files | metadata MB | newest metadata.json KB | manifests in the current snapshot | commit p99, first / last 100 commits, ms | pyiceberg scan plan, s | simulated in s | rows/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        let hour = |label: &str, seconds: i64, keep, merge| SmallFiles {
            label: label.to_string(),
            commits: (3600 / seconds) as u64,
            rows_per_commit: 1_000 * seconds,
            keep,
            merge,
            upsert_keys: None,
            compact: false,
        };
        if small {
            small_files(hour("1 h at 60 s", 60, None, true)).await;
            small_files(hour("1 h at 1 s, no maintenance", 1, None, false)).await;
            small_files(hour("1 h at 1 s, expiry (keep 100)", 1, Some(100), false)).await;
            small_files(hour(
                "1 h at 1 s, expiry (keep 100) + merging (at 100)",
                1,
                Some(100),
                true,
            ))
            .await;
        }
        if day {
            small_files(SmallFiles {
                label: "24 h at 1 s (10 rows per commit), expiry (keep 100) + merging (at 100)"
                    .into(),
                commits: 86_400,
                rows_per_commit: 10,
                keep: Some(100),
                merge: true,
                upsert_keys: None,
                compact: false,
            })
            .await;
        }
        if compacting {
            small_files(SmallFiles {
                compact: true,
                ..hour(
                    "1 h at 1 s, expiry (keep 100) + merging (at 100) + compaction (128 MiB, 8 files)",
                    1,
                    Some(100),
                    true,
                )
            })
            .await;
            let commits = env_u64("RATCHET_BENCH_COMPACT_COMMITS", 86_400);
            small_files(SmallFiles {
                label: format!(
                    "{commits} commits at 1 s (10 rows per commit), expiry (keep 100) + merging (at 100) + \
                     compaction (128 MiB, 8 files)"
                ),
                commits,
                rows_per_commit: 10,
                keep: Some(100),
                merge: true,
                upsert_keys: None,
                compact: true,
            })
            .await;
        }
        if upsert_day {
            let commits = env_u64("RATCHET_BENCH_UPSERT_DAY_COMMITS", 86_400);
            let spark = small_files(SmallFiles {
                label: format!(
                    "{commits} commits at 1 s (10 upserts per commit, ids over 100 000 keys, position deletes), \
                     expiry (keep 100) + merging (at 100) + compaction (128 MiB, 8 files)"
                ),
                commits,
                rows_per_commit: 10,
                keep: Some(100),
                merge: true,
                upsert_keys: Some(100_000),
                compact: true,
            })
            .await
            .unwrap();
            let m = &spark["before"];
            println!(
                "\n| Spark 4.1.4 full scan of the upsert table after {commits} commits | rows | data files | position-delete files | scan s |\n|---|---|---|---|---|\n| as the sink left it | {} | {} | {} | {:.2} |",
                m["rows"],
                m["data_files"],
                m["position_delete_files"],
                m["scan_seconds"].as_f64().unwrap()
            );
        }
        if upsert_hour {
            let upserts = |compact| SmallFiles {
                upsert_keys: Some(100_000),
                compact,
                ..hour(
                    match compact {
                        false => {
                            "1 h at 1 s, upserts by id over 100 000 keys (position deletes), expiry (keep 100) + merging (at 100)"
                        }
                        true => {
                            "1 h at 1 s, upserts by id over 100 000 keys (position deletes), expiry (keep 100) + merging (at 100) + compaction (128 MiB, 8 files)"
                        }
                    },
                    1,
                    Some(100),
                    true,
                )
            };
            let spark = small_files(upserts(false)).await.unwrap();
            let compacted = small_files(upserts(true)).await.unwrap();
            let (before, after) = (&spark["before"], &spark["after"]);
            println!(
                "\n| Spark 4.1.4 full scan of the upsert table | rows | data files | position-delete files | scan s |\n|---|---|---|---|---|"
            );
            for (label, m) in [
                (
                    "after the hour, as the sink left it (no compaction)",
                    before,
                ),
                (
                    "after Spark's rewrite_data_files + rewrite_position_delete_files",
                    after,
                ),
                (
                    "after the hour with the sink's compaction (`compact`, default policy)",
                    &compacted["before"],
                ),
            ] {
                println!(
                    "| {label} | {} | {} | {} | {:.2} |",
                    m["rows"],
                    m["data_files"],
                    m["position_delete_files"],
                    m["scan_seconds"].as_f64().unwrap()
                );
            }
            println!(
                "\nSpark's compaction took {:.1} s; the scan before it took {:.0}x as long as after",
                spark["compaction_seconds"].as_f64().unwrap(),
                before["scan_seconds"].as_f64().unwrap() / after["scan_seconds"].as_f64().unwrap()
            );
        }
        return;
    }
    let seconds = Duration::from_secs(env_u64("RATCHET_BENCH_SECONDS", 30));
    let runs = env_u64("RATCHET_BENCH_RUNS", 3);
    // The upsert modes hold gigabytes per checkpoint here: one process running every mode can run out of memory
    // on this 24 GiB machine (seen once), so they can be measured alone, at 1 s, before the append they compare to.
    let upserts_only = std::env::var("RATCHET_BENCH_UPSERTS_ONLY").is_ok();
    let intervals: &[u64] = if upserts_only { &[1] } else { &[1, 10] };
    println!("| mode | interval | rows/s | commit p50 ms | commit p99 ms |\n|---|---|---|---|---|");
    let mut rates = std::collections::HashMap::new();
    let mut upserts = Vec::new();
    for interval in intervals.iter().map(|s| Duration::from_secs(*s)) {
        let mut limit = Vec::new();
        let mut sink = Vec::new();
        let mut by_position = Vec::new();
        let mut by_equality = Vec::new();
        let mut by_vectors = Vec::new();
        for _ in 0..runs {
            // The upsert mode holds a checkpoint's rows until its pre-commit: at 1 s only (10 s is ~1 GB here).
            if interval.as_secs() == 1 {
                let upsert = |deletes| Some(Upsert::Version2(deletes));
                by_vectors.push(run_sink(interval, seconds, Some(Upsert::Vectors)).await);
                by_equality
                    .push(run_sink(interval, seconds, upsert(UpsertDeletes::Equality)).await);
                by_position
                    .push(run_sink(interval, seconds, upsert(UpsertDeletes::Position)).await);
            }
            limit.push(run_limit(interval, seconds).await);
            sink.push(run_sink(interval, seconds, None).await);
        }
        let (limit, sink) = (median(limit), median(sink));
        let by_position = (!by_position.is_empty()).then(|| median(by_position));
        let by_equality = (!by_equality.is_empty()).then(|| median(by_equality));
        let by_vectors = (!by_vectors.is_empty()).then(|| median(by_vectors));
        for (name, m) in [
            ("limit (files, no commit)", Some(&limit)),
            ("sink, exactly-once", Some(&sink)),
            (
                "sink, exactly-once, upsert by id, position deletes",
                by_position.as_ref(),
            ),
            (
                "sink, exactly-once, upsert by id, equality deletes",
                by_equality.as_ref(),
            ),
            (
                "sink, exactly-once, upsert by id, deletion vectors (format-version 3)",
                by_vectors.as_ref(),
            ),
        ] {
            let Some(m) = m else { continue };
            println!(
                "| {name} | {} s | {:.0} | {} | {} |",
                interval.as_secs(),
                m.rate(),
                m.quantile(0.5),
                m.quantile(0.99)
            );
        }
        if let (Some(position), Some(equality), Some(vectors)) =
            (&by_position, &by_equality, &by_vectors)
        {
            upserts.push((
                interval.as_secs(),
                [position, equality, vectors].map(|m| m.rate() / sink.rate()),
                vectors.rate() / equality.rate(),
            ));
        }
        rates.insert(interval.as_secs(), (limit.rate(), sink.rate()));
    }
    if upserts_only {
        report_upserts(upserts);
        return;
    }
    let peer = median((0..runs).map(|_| run_peer(seconds)).collect());
    println!(
        "| pyiceberg append ({PEER_ROWS_PER_APPEND} rows per call) | - | {:.0} | {:.1} | {:.1} |",
        peer.rate(),
        peer.commits_ms[0],
        peer.commits_ms[1]
    );
    for (interval, (limit, sink)) in {
        let mut sorted: Vec<_> = rates.into_iter().collect();
        sorted.sort_by_key(|(k, _)| *k);
        sorted
    } {
        println!(
            "at {interval} s: sink / limit = {:.0}%, sink / pyiceberg = {:.1}x",
            100.0 * sink / limit,
            sink / peer.rate()
        );
    }
    report_upserts(upserts);
}

/// The upsert modes' ratios: per interval, (position, equality, vectors) / append and vectors / equality.
fn report_upserts(upserts: Vec<(u64, [f64; 3], f64)>) {
    for (interval, [position, equality, vectors], between) in upserts {
        println!(
            "at {interval} s: upsert by position deletes / append = {:.0}%, by equality deletes / append = {:.0}%, \
             by deletion vectors / append = {:.0}%, deletion vectors / equality deletes = {:.0}%",
            100.0 * position,
            100.0 * equality,
            100.0 * vectors,
            100.0 * between
        );
    }
}
