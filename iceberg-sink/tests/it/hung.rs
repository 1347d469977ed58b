//! A catalog that stops answering in the middle of a job (Toxiproxy's blackhole: bytes vanish, nothing is closed),
//! on both paths of Ratchet's own catalog commit: the SQL catalog's compare-and-swap on PostgreSQL and SeaweedFS's
//! REST catalog, each reached only through the proxy (the readers go around it). While it hangs, every commit ends
//! within the sink's `commit_timeout` (times the driver's retries) instead of hanging the job; once it answers
//! again, a restarted job lands every record exactly once, as pyiceberg and DuckDB read it, and nothing of the
//! sink is left unreferenced. The sink compacts (every second checkpoint with data): the hung checkpoint's
//! compaction is skipped within `commit_timeout`, and the restarted job compacts. Also: the catalog database ending the sessions of a running job between commits; and
//! a catalog that does not answer when a job starts (the start fails within `commit_timeout`, it does not hang); and
//! a catalog that stops answering right before a schema change (the new column's catalog commit is abandoned
//! within the driver's bound; the restart on the new schema adds it when it opens).

use crate::common;

use std::time::{Duration, Instant};

use common::Lake;
use connector_api::{Driver, DriverConfig, ErrorKind, LocalCheckpointStore, RetryPolicy, SinkId};
use iceberg_sink::{CatalogConfig, Compact, CompactPolicy, IcebergSink, IcebergSinkConfig};
use ratchet_conformance::{conformance_batch as batch, conformance_positions, conformance_schema};
use test_support::Services;

const ROWS: i64 = 20;
const COMMIT_TIMEOUT: Duration = Duration::from_secs(2);

fn config(lake: &Lake, table: &str) -> IcebergSinkConfig {
    IcebergSinkConfig {
        commit_timeout: COMMIT_TIMEOUT,
        // Compaction looks at every second checkpoint with data: the checkpoint whose catalog hangs mid-job looks
        // too (its table load is bounded by commit_timeout and the compaction skipped), and the restarted job's
        // first checkpoint compacts the files committed before.
        compact: Compact::On(CompactPolicy {
            min_input_files: 2,
            ..CompactPolicy::default()
        }),
        ..lake.config(
            "hung",
            &SinkId::new("lake").unwrap(),
            0,
            table,
            conformance_schema(),
        )
    }
}

/// The driver's settings: three attempts per commit.
fn driver_config() -> DriverConfig {
    DriverConfig {
        retry: RetryPolicy {
            max_attempts: 3,
            ..RetryPolicy::default()
        },
        ..DriverConfig::default()
    }
}

/// A job over the store in `state`; returns it with the next offset its recovery restored.
async fn job(
    lake: &Lake,
    table: &str,
    state: &std::path::Path,
) -> (Driver<LocalCheckpointStore>, connector_api::SinkHandle, i64) {
    let mut job = Driver::new(
        LocalCheckpointStore::open(state, 3).unwrap(),
        driver_config(),
    );
    let sink = job
        .add_sink(IcebergSink::new(config(lake, table)).await.unwrap())
        .unwrap();
    let restored = job.start().await.unwrap();
    let next = restored.positions.first().map_or(0, |p| p.next_offset);
    (job, sink, next)
}

/// Writes [`ROWS`] records from offset `next` and checkpoints them, waiting for the commit; returns the next
/// offset.
async fn committed_step(
    job: &mut Driver<LocalCheckpointStore>,
    sink: connector_api::SinkHandle,
    next: i64,
) -> i64 {
    job.write(sink, &batch(next..next + ROWS)).await.unwrap();
    let next = next + ROWS;
    job.checkpoint(conformance_positions(next)).await.unwrap();
    job.finish_commit().await.unwrap();
    next
}

async fn catalog_hangs_mid_job(lake: Lake) {
    let toxiproxy = Services::get().toxiproxy();
    let server = lake.catalog_server().unwrap();
    let proxy = toxiproxy.proxy("hung-catalog", &server).await;
    let proxied = lake.through(proxy.address());
    let table = lake.table(&["events"]);
    let state = tempfile::tempdir().unwrap();

    let (mut running, sink, mut next) = job(&proxied, &table, state.path()).await;
    for _ in 0..2 {
        next = committed_step(&mut running, sink, next).await;
    }

    proxy.blackhole().await;
    running
        .write(sink, &batch(next..next + ROWS))
        .await
        .unwrap();
    next += ROWS;
    // The checkpoint record is local: the checkpoint is decided, its commit is what hangs.
    let started = Instant::now();
    let decided = running.checkpoint(conformance_positions(next)).await;
    let committed = match decided {
        Ok(_) => running.finish_commit().await,
        Err(e) => Err(e),
    };
    let took = started.elapsed();
    eprintln!("hung: the commit failed after {took:?}: {committed:?}");
    assert!(
        committed.is_err(),
        "a commit through a blackholed catalog cannot succeed"
    );
    // The driver retries a retryable commit; each attempt (a table load, then the commit) is bounded by
    // commit_timeout per catalog call.
    let bound = driver_config().retry.worst_case(COMMIT_TIMEOUT * 2) + Duration::from_secs(3);
    assert!(
        took < bound,
        "the hung commit took {took:?}, more than {bound:?} (commit_timeout {COMMIT_TIMEOUT:?})"
    );
    drop(running);
    proxy.heal().await;

    // Restarted after the catalog answers again: recovery commits the decided checkpoint once, and the job goes on.
    let (mut restarted, sink, restored) = job(&proxied, &table, state.path()).await;
    assert_eq!(restored, next, "the checkpoint decided before the hang");
    next = committed_step(&mut restarted, sink, next).await;
    restarted.close().await.unwrap();
    proxy.delete().await;

    let decided = common::decided_offset(state.path()).await;
    assert_eq!(decided, next);
    let seen = every_id_once(lake, table, next).await;
    assert!(seen.unreferenced.is_empty(), "{:?}", seen.unreferenced);
    assert_eq!(
        common::checkpoints_in_two_snapshots(&seen.snapshots),
        Vec::<String>::new()
    );
    assert!(
        seen.snapshots
            .iter()
            .any(|s| s["summary"]["deleted-data-files"]
                .as_str()
                .is_some_and(|n| n != "0")),
        "the restarted job's first checkpoint compacts the files of the hung job: {:#?}",
        seen.snapshots
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_catalog_that_stops_answering_bounds_the_commit_and_loses_nothing() {
    Services::get();
    let dir = tempfile::tempdir().unwrap();
    // A PostgreSQL catalog with a local warehouse: only the catalog's connections cross the proxy.
    catalog_hangs_mid_job(Lake::postgres_local(dir.path(), "hung")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_catalog_that_stops_answering_bounds_the_commit_and_loses_nothing() {
    Services::get();
    catalog_hangs_mid_job(Lake::rest("hung")).await;
}

/// A catalog that does not answer when a job starts: the sink's start (opening the catalog, looking the table up)
/// fails within `commit_timeout` as retryable, naming what it waited for, instead of hanging the start; once the
/// catalog answers again, the next start creates the table and the job lands every row once.
async fn catalog_hangs_at_start(lake: Lake, proxy_name: &str) {
    let toxiproxy = Services::get().toxiproxy();
    let proxy = toxiproxy
        .proxy(proxy_name, &lake.catalog_server().unwrap())
        .await;
    let proxied = lake.through(proxy.address());
    let table = lake.table(&["events"]);

    proxy.blackhole().await;
    let started = Instant::now();
    let refused = IcebergSink::new(config(&proxied, &table))
        .await
        .map(drop)
        .unwrap_err();
    let took = started.elapsed();
    eprintln!("hung at start: refused after {took:?}: {refused}");
    assert_eq!(refused.kind(), ErrorKind::Retryable, "{refused}");
    assert!(
        refused.to_string().contains("did not answer"),
        "the error names the call that hung: {refused}"
    );
    let bound = COMMIT_TIMEOUT + Duration::from_secs(3);
    assert!(
        took < bound,
        "the hung start took {took:?}, more than {bound:?}"
    );
    proxy.heal().await;

    let state = tempfile::tempdir().unwrap();
    let (mut running, sink, restored) = job(&proxied, &table, state.path()).await;
    assert_eq!(restored, 0, "nothing was decided before");
    let next = committed_step(&mut running, sink, 0).await;
    running.close().await.unwrap();
    proxy.delete().await;
    every_id_once(lake, table, next).await;
}

/// Reads `table` with pyiceberg and DuckDB, asserts that each holds the ids `0..next` once, and returns the read.
async fn every_id_once(lake: Lake, table: String, next: i64) -> common::Seen {
    let seen = tokio::task::spawn_blocking(move || lake.read(&table))
        .await
        .unwrap();
    let expected: Vec<i64> = (0..next).collect();
    assert_eq!(seen.ids, expected, "pyiceberg");
    assert_eq!(seen.duckdb_ids, expected, "DuckDB");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_catalog_that_does_not_answer_at_the_start_fails_it_within_commit_timeout() {
    Services::get();
    let dir = tempfile::tempdir().unwrap();
    catalog_hangs_at_start(
        Lake::postgres_local(dir.path(), "hungstart"),
        "hung-start-sql",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_catalog_that_does_not_answer_at_the_start_fails_it_within_commit_timeout() {
    Services::get();
    catalog_hangs_at_start(Lake::rest("hungstart"), "hung-start-rest").await;
}

/// The catalog database ends the sessions of Ratchet's own commit between two commits (`pg_terminate_backend`, as
/// a failover or an idle-session timeout does): the next commit reconnects and lands, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_sessions_the_server_killed_are_replaced_at_the_next_commit() {
    let services = Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::postgres_local(dir.path(), "killed");
    // Ratchet's own commit connects under its own application name, so the test ends only its sessions.
    let application = format!("ratchet-killed-{}", std::process::id());
    let mut marked = lake.clone();
    if let CatalogConfig::Sql { uri, .. } = &mut marked.catalog {
        uri.push_str(&format!("?application_name={application}"));
    }
    let table = lake.table(&["events"]);
    let state = tempfile::tempdir().unwrap();
    let (mut running, sink, mut next) = job(&marked, &table, state.path()).await;
    let admin = sqlx::PgPool::connect(services.pg_url()).await.unwrap();
    for round in 0..3 {
        next = committed_step(&mut running, sink, next).await;
        let (ended,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1) AS ended",
        )
        .bind(&application)
        .fetch_one(&admin)
        .await
        .unwrap();
        assert!(
            ended > 0,
            "round {round}: no session of {application} to end"
        );
    }
    running.close().await.unwrap();
    let seen = tokio::task::spawn_blocking(move || lake.read(&table))
        .await
        .unwrap();
    assert_eq!(seen.ids, (0..next).collect::<Vec<_>>(), "pyiceberg");
    assert_eq!(
        common::checkpoints_in_two_snapshots(&seen.snapshots),
        Vec::<String>::new()
    );
}

/// The conformance schema with a nullable `qty`, and rows `ids` of it (`qty` = id).
fn with_qty(ids: std::ops::Range<i64>) -> (arrow_schema::SchemaRef, arrow_array::RecordBatch) {
    let mut fields: Vec<arrow_schema::Field> = conformance_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(arrow_schema::Field::new(
        "qty",
        arrow_schema::DataType::Int64,
        true,
    ));
    let schema = std::sync::Arc::new(arrow_schema::Schema::new(fields));
    let mut columns = batch(ids.clone()).columns().to_vec();
    columns.push(std::sync::Arc::new(
        arrow_array::Int64Array::from_iter_values(ids),
    ));
    (
        schema.clone(),
        arrow_array::RecordBatch::try_new(schema, columns).unwrap(),
    )
}

/// A job of `schema` taking new columns (`add-columns`), over the store in `state`.
async fn evolving_job(
    lake: &Lake,
    table: &str,
    state: &std::path::Path,
    schema: arrow_schema::SchemaRef,
) -> (Driver<LocalCheckpointStore>, connector_api::SinkHandle) {
    let mut job = Driver::new(
        LocalCheckpointStore::open(state, 3).unwrap(),
        driver_config(),
    );
    let config = IcebergSinkConfig {
        schema,
        evolution: connector_api::Evolution::AddColumns,
        ..config(lake, table)
    };
    let sink = job
        .add_sink(IcebergSink::new(config).await.unwrap())
        .unwrap();
    job.start().await.unwrap();
    (job, sink)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_that_stops_answering_at_a_schema_change_bounds_it_and_loses_nothing() {
    let services = Services::get();
    let lake = Lake::rest("hungevolve");
    let proxy = services
        .toxiproxy()
        .proxy("hung-evolve", &lake.catalog_server().unwrap())
        .await;
    let proxied = lake.through(proxy.address());
    let table = lake.table(&["events"]);
    let state = tempfile::tempdir().unwrap();
    let (wide, wide_rows) = with_qty(ROWS..2 * ROWS);

    let (mut running, sink) =
        evolving_job(&proxied, &table, state.path(), conformance_schema()).await;
    let next = committed_step(&mut running, sink, 0).await;
    proxy.blackhole().await;
    let started = Instant::now();
    let evolved = running.evolve(&[sink], wide.clone()).await;
    let took = started.elapsed();
    assert!(
        evolved.is_err(),
        "a schema change through a blackholed catalog cannot succeed"
    );
    let bound = driver_config()
        .retry
        .worst_case(DriverConfig::default().max_call_time)
        + Duration::from_secs(3);
    assert!(
        took < bound,
        "the hung schema change took {took:?}, more than {bound:?}"
    );
    drop(running);
    proxy.heal().await;

    // Restarted on the new schema after the catalog answers again: the sink adds the column as it opens.
    let (mut restarted, sink) = evolving_job(&proxied, &table, state.path(), wide).await;
    restarted.write(sink, &wide_rows).await.unwrap();
    let next = next + ROWS;
    restarted
        .checkpoint(conformance_positions(next))
        .await
        .unwrap();
    restarted.close().await.unwrap();
    proxy.delete().await;

    let seen = tokio::task::spawn_blocking({
        let (lake, table) = (lake.clone(), table.clone());
        move || (lake.read(&table), lake.non_null_ids(&table))
    })
    .await
    .unwrap();
    let (seen, columns) = seen;
    assert_eq!(seen.ids, (0..next).collect::<Vec<_>>(), "pyiceberg");
    assert!(seen.unreferenced.is_empty(), "{:?}", seen.unreferenced);
    assert_eq!(
        columns["qty"],
        serde_json::Value::from((ROWS..next).collect::<Vec<_>>())
    );
}
