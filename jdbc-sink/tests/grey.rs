//! Grey failures between the JDBC sink (xa mode) and the real databases, through Toxiproxy: the database goes
//! silent (bytes vanish, nothing is closed) right after a checkpoint is decided, while its prepared transaction is
//! being committed. The commit is abandoned within the budget's commit term instead of hanging; once the link
//! heals, the next start's recovery commits the decided checkpoint (on MariaDB, the silent session still holds the
//! XA transaction: recovery must get it detached), and the independent verifier (psycopg / pymysql) sees every
//! row once and no prepared transaction left. The database also goes silent right before a schema change: the
//! sink's `ALTER TABLE` is abandoned within the driver's bound instead of hanging, and the restart, on the new
//! schema, adds the column when it opens.

mod common;

use std::time::Duration;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use common::{Db, config, read, short_name};
use connector_api::{
    Driver, DriverConfig, ErrorKind, Evolution, LocalCheckpointStore, Report, RetryPolicy, SinkId,
    SourceOffset, Step,
};
use jdbc_sink::{ConnectionConfig, JdbcSink, WriteMode};
use ratchet_conformance::{conformance_batch, conformance_schema};
use test_support::Services;
use test_support::pause::PauseAt;

/// `host:port` of a database URL.
fn host_port(url: &str) -> String {
    let parsed = url::Url::parse(url).expect("database url");
    format!("{}:{}", parsed.host_str().unwrap(), parsed.port().unwrap())
}

async fn driver(
    db: Db,
    url: &str,
    table: &str,
    scope: &str,
    state: &std::path::Path,
) -> Driver<LocalCheckpointStore> {
    evolving_driver(
        db,
        url,
        table,
        scope,
        state,
        conformance_schema(),
        Evolution::None,
    )
    .await
}

/// [`driver`] for batches of `schema`, the sink taking schema changes as `evolution` says.
async fn evolving_driver(
    db: Db,
    url: &str,
    table: &str,
    scope: &str,
    state: &std::path::Path,
    schema: SchemaRef,
    evolution: Evolution,
) -> Driver<LocalCheckpointStore> {
    let sink = SinkId::new("jdbc").unwrap();
    let mut sink_config = config(db, &sink, 0, table, scope, WriteMode::Xa);
    sink_config.connection = ConnectionConfig::new(url.to_string());
    sink_config.schema = schema;
    sink_config.evolution = evolution;
    let config = DriverConfig {
        max_call_time: Duration::from_secs(2),
        retry: RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(200),
            max_total_backoff: Duration::from_secs(1),
        },
        ..DriverConfig::default()
    };
    let mut driver = Driver::new(LocalCheckpointStore::open(state, 3).unwrap(), config);
    driver
        .add_sink(JdbcSink::new(sink_config).await.unwrap())
        .unwrap();
    driver
}

async fn a_database_silent_mid_commit_is_committed_by_recovery(db: Db) {
    let services = Services::get();
    let upstream = host_port(&db.url());
    let proxy = services.toxiproxy().proxy("jdbc-silent", &upstream).await;
    let proxied = db.url().replace(&upstream, proxy.address());
    let table = short_name(
        "silent",
        &[&format!("{db:?}"), &test_support::unique_name("t")],
    );
    let scope = table.clone();
    let state = tempfile::tempdir().unwrap();

    let pause = PauseAt::new(Step::AfterRecordDurable);
    let mut first = driver(db, &proxied, &table, &scope, state.path())
        .await
        .with_fault_injector(pause.clone());
    let handle = first.handle_of(&SinkId::new("jdbc").unwrap()).unwrap();
    first.start().await.unwrap();
    first
        .write(handle, &conformance_batch(0..50))
        .await
        .unwrap();
    let deciding = tokio::spawn(async move {
        // Decided; opening the next checkpoint's transaction then fails against the silent database too.
        let next = first
            .checkpoint(vec![SourceOffset::new("source", 0, 50)])
            .await;
        let outcome = tokio::time::timeout(Duration::from_secs(120), first.finish_commit()).await;
        (first, next, outcome)
    });
    pause.reached().await;
    proxy.blackhole().await;
    pause.resume();
    let (first, next, outcome) = deciding.await.unwrap();
    if let Err(e) = next {
        assert_eq!(e.kind(), ErrorKind::Retryable, "{}", Report(&e));
    }
    let err = outcome
        .expect("a commit against a silent database is abandoned within its term")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{}", Report(&err));
    drop(first);

    proxy.heal().await;
    let mut second = driver(db, &db.url(), &table, &scope, state.path()).await;
    let restored = second
        .start()
        .await
        .unwrap_or_else(|e| panic!("{db:?}: recovery after the silent commit: {}", Report(&e)));
    assert!(restored.checkpoint.is_some());
    second.close().await.unwrap();
    let (ids, prepared) = read(db, &table, &[&scope]);
    assert_eq!(ids, (0..50).collect::<Vec<_>>(), "{db:?}: every row once");
    assert!(
        prepared.is_empty(),
        "{db:?}: prepared transactions left: {prepared:?}"
    );
    proxy.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_silent_mid_commit_is_committed_by_recovery() {
    a_database_silent_mid_commit_is_committed_by_recovery(Db::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_silent_mid_commit_is_committed_by_recovery() {
    a_database_silent_mid_commit_is_committed_by_recovery(Db::MariaDb).await;
}

/// The conformance schema with a nullable `qty`, and `ids` of it (`qty` = id).
fn with_qty(ids: std::ops::Range<i64>) -> (SchemaRef, arrow_array::RecordBatch) {
    let mut fields: Vec<Field> = conformance_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("qty", DataType::Int64, true));
    let schema = std::sync::Arc::new(Schema::new(fields));
    let mut columns = conformance_batch(ids.clone()).columns().to_vec();
    columns.push(std::sync::Arc::new(
        arrow_array::Int64Array::from_iter_values(ids),
    ));
    let batch = arrow_array::RecordBatch::try_new(schema.clone(), columns).unwrap();
    (schema, batch)
}

async fn a_database_silent_at_the_schema_change_is_bounded_and_recovered(db: Db) {
    let services = Services::get();
    let upstream = host_port(&db.url());
    let proxy = services
        .toxiproxy()
        .proxy("jdbc-silent-evolve", &upstream)
        .await;
    let proxied = db.url().replace(&upstream, proxy.address());
    let table = short_name(
        "silentev",
        &[&format!("{db:?}"), &test_support::unique_name("t")],
    );
    let scope = table.clone();
    let state = tempfile::tempdir().unwrap();
    let narrow = conformance_schema();
    let (wide, wide_rows) = with_qty(20..30);

    let mut first = evolving_driver(
        db,
        &proxied,
        &table,
        &scope,
        state.path(),
        narrow,
        Evolution::AddColumns,
    )
    .await;
    let handle = first.handle_of(&SinkId::new("jdbc").unwrap()).unwrap();
    first.start().await.unwrap();
    first
        .write(handle, &conformance_batch(0..20))
        .await
        .unwrap();
    first
        .checkpoint(vec![SourceOffset::new("source", 0, 20)])
        .await
        .unwrap();
    first.finish_commit().await.unwrap();
    // Silent before the change: the `ALTER TABLE` goes out and nothing comes back.
    proxy.blackhole().await;
    let err = tokio::time::timeout(
        Duration::from_secs(120),
        first.evolve(&[handle], wide.clone()),
    )
    .await
    .expect("a schema change against a silent database is abandoned within the driver's bound")
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Retryable, "{}", Report(&err));
    drop(first);

    proxy.heal().await;
    let mut second = evolving_driver(
        db,
        &db.url(),
        &table,
        &scope,
        state.path(),
        wide,
        Evolution::AddColumns,
    )
    .await;
    let handle = second.handle_of(&SinkId::new("jdbc").unwrap()).unwrap();
    second
        .start()
        .await
        .unwrap_or_else(|e| panic!("{db:?}: recovery after the silent change: {}", Report(&e)));
    second.write(handle, &wide_rows).await.unwrap();
    second
        .checkpoint(vec![SourceOffset::new("source", 0, 30)])
        .await
        .unwrap();
    second.close().await.unwrap();
    let (ids, prepared) = read(db, &table, &[&scope]);
    assert_eq!(ids, (0..30).collect::<Vec<_>>(), "{db:?}: every row once");
    assert!(
        prepared.is_empty(),
        "{db:?}: prepared transactions left: {prepared:?}"
    );
    let filled = common::cli(
        db,
        &format!("SELECT COUNT(*) FROM {table} WHERE qty = id AND id >= 20"),
    );
    let empty = common::cli(
        db,
        &format!("SELECT COUNT(*) FROM {table} WHERE qty IS NULL AND id < 20"),
    );
    assert_eq!((filled.trim(), empty.trim()), ("10", "20"), "{db:?}");
    proxy.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_silent_at_the_schema_change_is_bounded_and_recovered() {
    a_database_silent_at_the_schema_change_is_bounded_and_recovered(Db::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_silent_at_the_schema_change_is_bounded_and_recovered() {
    a_database_silent_at_the_schema_change_is_bounded_and_recovered(Db::MariaDb).await;
}
