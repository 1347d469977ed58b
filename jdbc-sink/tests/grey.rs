//! Grey failures between the JDBC sink (xa mode) and the real databases, through Toxiproxy: the database goes
//! silent (bytes vanish, nothing is closed) right after a checkpoint is decided, while its prepared transaction is
//! being committed. The commit is abandoned within the budget's commit term instead of hanging; once the link
//! heals, the next start's recovery commits the decided checkpoint (on MariaDB, the silent session still holds the
//! XA transaction: recovery must get it detached), and the independent verifier (psycopg / pymysql) sees every
//! row once and no prepared transaction left.

mod common;

use std::time::Duration;

use common::{Db, config, read, short_name};
use connector_api::{
    Driver, DriverConfig, ErrorKind, LocalCheckpointStore, Report, RetryPolicy, SinkId,
    SourceOffset, Step,
};
use jdbc_sink::{ConnectionConfig, JdbcSink, WriteMode};
use ratchet_conformance::conformance_batch;
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
    let sink = SinkId::new("jdbc").unwrap();
    let mut sink_config = config(db, &sink, 0, table, scope, WriteMode::Xa);
    sink_config.connection = ConnectionConfig::new(url.to_string());
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
