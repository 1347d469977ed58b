//! JDBC sink throughput and commit latency against the real PostgreSQL and MariaDB servers, at a 1 s checkpoint
//! interval through the checkpoint driver: xa (exactly once), upsert, dedup append, xa run at-least-once, and a
//! CDC change stream (inserts, updates and deletes by key) applied in xa_upsert and upsert modes, each against the same rows written into the same kind of table by the plain bulk path with no
//! commit protocol (the limit): binary COPY on PostgreSQL, multi-row INSERTs of the same size on MariaDB, one
//! ordinary transaction per second. Prints a table and the ratios (median of the runs).
//!
//! Run: `scripts/services.sh up && cargo bench -p jdbc-sink --bench throughput` (see docs/benchmarks.md).
//! `RATCHET_BENCH_SECONDS` sets the length of each run (default 10), `RATCHET_BENCH_RUNS` the runs per mode
//! (default 3).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::{
    CHANGE_COLUMN, DeliveryGuarantee, Driver, DriverConfig, GuaranteedSink, LocalCheckpointStore,
    OP_COLUMN, SinkId, SourceOffset, SubtaskId,
};
use futures_util::pin_mut;
use jdbc_sink::{ConnectionConfig, DedupConfig, JdbcSink, JdbcSinkConfig, WriteMode};
use mysql_async::prelude::Queryable;
use ratchet_conformance::{conformance_batch_with, conformance_schema};
use test_support::Services;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};

const BATCH_ROWS: i64 = 8192;
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// Rows per multi-row INSERT of the MariaDB limit (the sink's own statement size).
const MYSQL_ROWS_PER_STATEMENT: usize = 2000;

fn batch(start: i64) -> RecordBatch {
    conformance_batch_with(start..start + BATCH_ROWS, |i| {
        format!("order {i} customer {} {}", i % 99_991, "x".repeat(60))
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Db {
    Postgres,
    MariaDb,
}

/// What a CDC run's change stream holds besides inserts of new keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mix {
    /// 80% inserts of new keys, 20% updates of earlier keys.
    Upserts,
    /// 60% inserts, 20% updates, 20% deletes of earlier keys.
    WithDeletes,
}

#[derive(Debug, Clone)]
enum Mode {
    Limit,
    Sink(WriteMode, DeliveryGuarantee),
    /// A change stream (rows with a marked `__op` column) applied by key.
    Changes(WriteMode, Mix),
}

impl Mode {
    fn name(&self) -> String {
        match self {
            Mode::Limit => "limit (bulk, no protocol)".into(),
            Mode::Sink(WriteMode::Xa, DeliveryGuarantee::ExactlyOnce) => "xa, exactly-once".into(),
            Mode::Sink(WriteMode::Xa, _) => "xa, at-least-once".into(),
            Mode::Sink(WriteMode::Upsert { .. }, _) => "upsert".into(),
            Mode::Sink(WriteMode::XaUpsert { .. }, _) => "xa upsert".into(),
            Mode::Sink(WriteMode::Append { .. }, _) => "append + dedup table".into(),
            Mode::Changes(mode, mix) => format!(
                "CDC apply, {}, {}",
                if mode.prepares() {
                    "xa_upsert"
                } else {
                    "upsert"
                },
                match mix {
                    Mix::Upserts => "inserts + updates",
                    Mix::WithDeletes => "with 20% deletes",
                }
            ),
        }
    }
}

struct Run {
    rows_per_second: f64,
    /// Per checkpoint: pre-commit + durable record + commit, and the commit alone.
    checkpoint: Vec<Duration>,
    commit: Vec<Duration>,
}

fn change_schema() -> SchemaRef {
    let op = Field::new(OP_COLUMN, DataType::Utf8, false).with_metadata(
        [(CHANGE_COLUMN.to_string(), "op".to_string())]
            .into_iter()
            .collect(),
    );
    let mut fields: Vec<Field> = conformance_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(op);
    Arc::new(Schema::new(fields))
}

/// The changes `start..start + BATCH_ROWS` of `mix`: change `n` inserts key `n`, or updates or deletes an earlier
/// key that was inserted (keys ending in 0 are updated, those ending in 1 deleted), with payloads like [`batch`]'s.
fn changes(start: i64, mix: Mix) -> RecordBatch {
    let rows = batch(start);
    let mut ids = Vec::with_capacity(rows.num_rows());
    let mut ops = Vec::with_capacity(rows.num_rows());
    for n in start..start + BATCH_ROWS {
        let earlier = |back: i64, last_digit: i64| {
            let m = n - back;
            (m >= 0).then(|| m - m % 10 + last_digit)
        };
        let (op, id) = match (mix, n % 10) {
            (_, 6..=7) => ("u", earlier(2000, 0)),
            (Mix::WithDeletes, 8..=9) => ("d", earlier(4000, 1)),
            _ => ("c", Some(n)),
        };
        let (op, id) = id.map_or(("c", n), |id| (op, id));
        ids.push(id);
        ops.push(op);
    }
    RecordBatch::try_new(
        change_schema(),
        vec![
            Arc::new(Int64Array::from(ids)),
            rows.column(1).clone(),
            Arc::new(StringArray::from(ops)),
        ],
    )
    .unwrap()
}

fn url(db: Db) -> String {
    let services = Services::get();
    match db {
        // Both the limit and the sink without TLS: the comparison is about the commit protocol.
        Db::Postgres => format!("{}?sslmode=disable", services.pg_url()),
        Db::MariaDb => services.mysql_url().to_string(),
    }
}

fn ddl(db: Db, table: &str) -> String {
    match db {
        Db::Postgres => {
            format!("CREATE TABLE {table} (id bigint PRIMARY KEY, payload text NOT NULL)")
        }
        Db::MariaDb => format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, payload LONGTEXT NOT NULL) ENGINE=InnoDB"
        ),
    }
}

async fn execute(db: Db, statement: &str) {
    match db {
        Db::Postgres => {
            let (client, connection) = tokio_postgres::connect(&url(db), tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client.batch_execute(statement).await.unwrap();
        }
        Db::MariaDb => {
            let mut conn = mysql_async::Conn::from_url(url(db)).await.unwrap();
            conn.query_drop(statement).await.unwrap();
            conn.disconnect().await.unwrap();
        }
    }
}

/// The limit on PostgreSQL: binary COPY of the same rows, one transaction per second.
async fn pg_limit(table: &str, seconds: f64) -> Run {
    let (client, connection) = tokio_postgres::connect(&url(Db::Postgres), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let started = Instant::now();
    let mut next = 0;
    let mut checkpoint = Vec::new();
    while started.elapsed().as_secs_f64() < seconds {
        client.batch_execute("BEGIN").await.unwrap();
        let interval = Instant::now();
        while interval.elapsed() < CHECKPOINT_INTERVAL {
            let rows = batch(next);
            let ids = rows
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .unwrap();
            let payloads = rows
                .column(1)
                .as_any()
                .downcast_ref::<arrow_array::StringArray>()
                .unwrap();
            let sink = client
                .copy_in(&format!(
                    "COPY {table} (id, payload) FROM STDIN (FORMAT binary)"
                ))
                .await
                .unwrap();
            let writer = BinaryCopyInWriter::new(sink, &[Type::INT8, Type::TEXT]);
            pin_mut!(writer);
            for row in 0..rows.num_rows() {
                let values: [&(dyn ToSql + Sync); 2] = [&ids.value(row), &payloads.value(row)];
                writer.as_mut().write(&values).await.unwrap();
            }
            writer.as_mut().finish().await.unwrap();
            next += BATCH_ROWS;
        }
        let commit = Instant::now();
        client.batch_execute("COMMIT").await.unwrap();
        checkpoint.push(commit.elapsed());
    }
    Run {
        rows_per_second: next as f64 / started.elapsed().as_secs_f64(),
        commit: checkpoint.clone(),
        checkpoint,
    }
}

/// The limit on MariaDB: the same multi-row INSERTs, one ordinary transaction per second.
async fn mysql_limit(table: &str, seconds: f64) -> Run {
    let mut conn = mysql_async::Conn::from_url(url(Db::MariaDb)).await.unwrap();
    let row = "(?, ?)";
    let statement = |rows: usize| {
        format!(
            "INSERT INTO {table} (id, payload) VALUES {}",
            vec![row; rows].join(", ")
        )
    };
    let started = Instant::now();
    let mut next = 0;
    let mut checkpoint = Vec::new();
    while started.elapsed().as_secs_f64() < seconds {
        conn.query_drop("START TRANSACTION").await.unwrap();
        let interval = Instant::now();
        while interval.elapsed() < CHECKPOINT_INTERVAL {
            let rows = batch(next);
            let ids = rows
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .unwrap();
            let payloads = rows
                .column(1)
                .as_any()
                .downcast_ref::<arrow_array::StringArray>()
                .unwrap();
            for chunk in (0..rows.num_rows())
                .collect::<Vec<_>>()
                .chunks(MYSQL_ROWS_PER_STATEMENT)
            {
                let mut params = Vec::with_capacity(chunk.len() * 2);
                for &i in chunk {
                    params.push(mysql_async::Value::Int(ids.value(i)));
                    params.push(mysql_async::Value::Bytes(
                        payloads.value(i).as_bytes().to_vec(),
                    ));
                }
                conn.exec_drop(statement(chunk.len()), params)
                    .await
                    .unwrap();
            }
            next += BATCH_ROWS;
        }
        let commit = Instant::now();
        conn.query_drop("COMMIT").await.unwrap();
        checkpoint.push(commit.elapsed());
    }
    conn.disconnect().await.unwrap();
    Run {
        rows_per_second: next as f64 / started.elapsed().as_secs_f64(),
        commit: checkpoint.clone(),
        checkpoint,
    }
}

/// The sink through the driver, one checkpoint per second; each checkpoint waits for its commit, to time it.
async fn sink_run(
    db: Db,
    table: &str,
    mode: WriteMode,
    guarantee: DeliveryGuarantee,
    mix: Option<Mix>,
    seconds: f64,
) -> Run {
    let sink_id = SinkId::new("bench").unwrap();
    let config = JdbcSinkConfig {
        sink: sink_id.clone(),
        scope: SinkId::new(table).unwrap().into(),
        subtask: SubtaskId(0),
        schema: match mix {
            Some(_) => change_schema(),
            None => conformance_schema(),
        },
        connection: ConnectionConfig::new(url(db)),
        table: table.to_string(),
        mode,
        create_table: false,
        evolution: connector_api::Evolution::None,
        lock_timeout: Duration::from_secs(5),
    };
    let state = tempfile::tempdir().unwrap();
    let mut driver = Driver::new(
        LocalCheckpointStore::open(state.path(), 3).unwrap(),
        DriverConfig::default(),
    );
    let sink = driver
        .add_sink(GuaranteedSink::new(
            JdbcSink::new(config).await.unwrap(),
            guarantee,
        ))
        .unwrap();
    driver.start().await.unwrap();
    let started = Instant::now();
    let mut next = 0;
    let (mut checkpoint, mut commit) = (Vec::new(), Vec::new());
    while started.elapsed().as_secs_f64() < seconds {
        let interval = Instant::now();
        while interval.elapsed() < CHECKPOINT_INTERVAL {
            let rows = match mix {
                Some(mix) => changes(next, mix),
                None => batch(next),
            };
            driver.write(sink, &rows).await.unwrap();
            next += BATCH_ROWS;
        }
        let at = vec![SourceOffset::new("bench", 0, next)];
        let begun = Instant::now();
        driver.checkpoint(at).await.unwrap();
        let durable = Instant::now();
        driver.finish_commit().await.unwrap();
        commit.push(durable.elapsed());
        checkpoint.push(begun.elapsed());
    }
    let rows_per_second = next as f64 / started.elapsed().as_secs_f64();
    driver.close().await.unwrap();
    Run {
        rows_per_second,
        checkpoint,
        commit,
    }
}

fn percentile(values: &mut [Duration], p: f64) -> Duration {
    values.sort_unstable();
    values[((values.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds: f64 = std::env::var("RATCHET_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let runs: usize = std::env::var("RATCHET_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let upsert = WriteMode::Upsert {
        key: vec!["id".into()],
    };
    let xa_upsert = WriteMode::XaUpsert {
        key: vec!["id".into()],
    };
    let dedup = WriteMode::Append {
        dedup: DedupConfig {
            message_id: "id".into(),
            table: None,
            retention: Duration::from_secs(3600),
        },
    };
    println!(
        "| database | mode | rows/s (median of {runs}) | % of limit | checkpoint p50 / p99 | commit p50 / p99 |"
    );
    println!("|---|---|---|---|---|---|");
    for db in [Db::Postgres, Db::MariaDb] {
        let modes = [
            Mode::Limit,
            Mode::Sink(WriteMode::Xa, DeliveryGuarantee::ExactlyOnce),
            Mode::Sink(WriteMode::Xa, DeliveryGuarantee::AtLeastOnce),
            Mode::Sink(upsert.clone(), DeliveryGuarantee::ExactlyOnce),
            Mode::Sink(dedup.clone(), DeliveryGuarantee::ExactlyOnce),
            Mode::Changes(xa_upsert.clone(), Mix::Upserts),
            Mode::Changes(xa_upsert.clone(), Mix::WithDeletes),
            Mode::Changes(upsert.clone(), Mix::WithDeletes),
        ];
        let mut limit = None;
        for (index, mode) in modes.into_iter().enumerate() {
            let mut results = Vec::new();
            for run in 0..runs {
                // A table (and so a sink scope) of its own per mode and run: no run meets another's owner row.
                let table = format!("bench_{}_{index}_{run}", std::process::id());
                execute(db, &format!("DROP TABLE IF EXISTS {table}")).await;
                execute(db, &ddl(db, &table)).await;
                let result = match (&mode, db) {
                    (Mode::Limit, Db::Postgres) => pg_limit(&table, seconds).await,
                    (Mode::Limit, Db::MariaDb) => mysql_limit(&table, seconds).await,
                    (Mode::Sink(write, guarantee), _) => {
                        sink_run(db, &table, write.clone(), *guarantee, None, seconds).await
                    }
                    (Mode::Changes(write, mix), _) => {
                        let guarantee = DeliveryGuarantee::ExactlyOnce;
                        sink_run(db, &table, write.clone(), guarantee, Some(*mix), seconds).await
                    }
                };
                execute(db, &format!("DROP TABLE IF EXISTS {table}")).await;
                execute(db, &format!("DROP TABLE IF EXISTS {table}_ratchet_dedup")).await;
                if db == Db::MariaDb {
                    // Each run writes about a gigabyte of binary log; the test server keeps it 15 minutes.
                    execute(db, "PURGE BINARY LOGS BEFORE NOW()").await;
                }
                results.push(result);
            }
            results.sort_by(|a, b| a.rows_per_second.total_cmp(&b.rows_per_second));
            let median = &mut results[runs / 2];
            let rate = median.rows_per_second;
            let limit_rate = *limit.get_or_insert(rate);
            let (c50, c99) = (
                percentile(&mut median.checkpoint, 0.5),
                percentile(&mut median.checkpoint, 0.99),
            );
            let (m50, m99) = (
                percentile(&mut median.commit, 0.5),
                percentile(&mut median.commit, 0.99),
            );
            println!(
                "| {db:?} | {} | {:.0} | {:.0}% | {:.1} / {:.1} ms | {:.1} / {:.1} ms |",
                mode.name(),
                rate,
                100.0 * rate / limit_rate,
                c50.as_secs_f64() * 1e3,
                c99.as_secs_f64() * 1e3,
                m50.as_secs_f64() * 1e3,
                m99.as_secs_f64() * 1e3,
            );
        }
    }
}
