//! The upsert mode's semantics against the real servers, read back with the databases' own clients: within a
//! checkpoint the last row of a key wins, existing rows are updated, and on PostgreSQL a key inserted by a
//! concurrent writer while the sink merges (which makes the `MERGE` fast path fail) is still upserted; the append
//! mode forgets message ids older than its retention.

use crate::common;

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use common::{Db, cli, config, create_keyed_table, short_name};
use connector_api::{CheckpointId, SinkId, TwoPhaseCommit};
use jdbc_sink::{JdbcSink, WriteMode};
use ratchet_conformance::conformance_schema;

fn rows(rows: &[(i64, &str)]) -> RecordBatch {
    RecordBatch::try_new(
        conformance_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
        ],
    )
    .unwrap()
}

async fn upsert_sink(db: Db, what: &str) -> (JdbcSink, String) {
    let unique = test_support::unique_name(what);
    let table = short_name("upsert_", &[&unique]);
    create_keyed_table(db, &table);
    cli(
        db,
        &format!("INSERT INTO {table} VALUES (1, 'old'), (9, 'untouched')"),
    );
    let mode = WriteMode::Upsert {
        key: vec!["id".into()],
    };
    let scope = short_name("u", &[&unique]);
    let mut config = config(
        db,
        &SinkId::new("upserts").unwrap(),
        0,
        &table,
        &scope,
        mode,
    );
    // Long enough for the concurrent-writer test to commit while the sink waits.
    config.lock_timeout = std::time::Duration::from_secs(30);
    let mut sink = JdbcSink::new(config).await.unwrap();
    sink.recover(None).await.unwrap();
    (sink, table)
}

fn table_rows(db: Db, table: &str) -> String {
    cli(db, &format!("SELECT id, payload FROM {table} ORDER BY id")).replace('|', "\t")
}

async fn last_write_wins(db: Db) {
    let (mut sink, table) = upsert_sink(db, "last").await;
    sink.begin(CheckpointId(2)).await.unwrap();
    sink.write(&rows(&[(1, "a"), (2, "b")])).await.unwrap();
    sink.write(&rows(&[(1, "c"), (3, "d"), (3, "e")]))
        .await
        .unwrap();
    sink.pre_commit(CheckpointId(2)).await.unwrap();
    assert_eq!(
        table_rows(db, &table),
        "1\tc\n2\tb\n3\te\n9\tuntouched",
        "{db:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_row_of_a_key_wins_on_both_databases() {
    last_write_wins(Db::Postgres).await;
    last_write_wins(Db::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_inserted_concurrently_is_still_upserted_on_postgres() {
    let (mut sink, table) = upsert_sink(Db::Postgres, "concurrent").await;
    sink.begin(CheckpointId(2)).await.unwrap();

    // Another writer inserts key 5 and holds its transaction open: the sink's MERGE (no match yet) waits on it,
    // then fails with a unique violation once it commits, and the ON CONFLICT statement takes over.
    let (other, connection) = tokio_postgres::connect(&Db::Postgres.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    other.batch_execute("BEGIN").await.unwrap();
    other
        .execute(&format!("INSERT INTO {table} VALUES (5, 'other')"), &[])
        .await
        .unwrap();
    let merging = tokio::spawn(async move {
        sink.write(&rows(&[(5, "sink")])).await.unwrap();
        sink.pre_commit(CheckpointId(2)).await.unwrap();
    });
    // Commit once the sink's MERGE waits for the other writer's row lock.
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'MERGE INTO \"{table}\"%'"
    );
    // Watched from a connection of its own: pg_stat_activity is a snapshot for the rest of a transaction, and
    // `other` is inside one.
    let (watcher, connection) = tokio_postgres::connect(&Db::Postgres.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while watcher
        .query_one(&waiting, &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the sink's MERGE never waited for the other writer"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    other.batch_execute("COMMIT").await.unwrap();
    merging.await.unwrap();
    assert_eq!(
        table_rows(Db::Postgres, &table),
        "1\told\n5\tsink\n9\tuntouched"
    );
}

/// The append mode forgets message ids older than the retention: a new instance's first checkpoint deletes them
/// from the dedup table (read back with the database's own client), and keeps the fresh ones.
async fn expired_dedup_ids_are_forgotten(db: Db) {
    let unique = test_support::unique_name("retention");
    let table = short_name("append_", &[&unique]);
    let scope = short_name("r", &[&unique]);
    let mode = WriteMode::Append {
        dedup: jdbc_sink::DedupConfig {
            message_id: "id".into(),
            table: None,
            retention: std::time::Duration::from_secs(1),
        },
    };
    let sink_id = SinkId::new("appends").unwrap();
    let open = || async {
        let mut sink = JdbcSink::new(config(db, &sink_id, 0, &table, &scope, mode.clone()))
            .await
            .unwrap();
        sink.recover(None).await.unwrap();
        sink
    };
    let mut first = open().await;
    first.begin(CheckpointId(2)).await.unwrap();
    first.write(&rows(&[(1, "a"), (2, "b")])).await.unwrap();
    first.pre_commit(CheckpointId(2)).await.unwrap();
    drop(first);
    // The ids were seen at least this long ago once the wait is over: past the 1 s retention.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let mut second = open().await;
    second.begin(CheckpointId(3)).await.unwrap();
    second.write(&rows(&[(3, "c")])).await.unwrap();
    second.pre_commit(CheckpointId(3)).await.unwrap();
    assert_eq!(
        cli(
            db,
            &format!("SELECT message_id FROM {table}_ratchet_dedup ORDER BY message_id")
        ),
        "3",
        "{db:?}"
    );
    assert_eq!(
        table_rows(db, &table),
        "1\ta\n2\tb\n3\tc",
        "{db:?}: the rows stay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_dedup_ids_are_forgotten_on_both_databases() {
    expired_dedup_ids_are_forgotten(Db::Postgres).await;
    expired_dedup_ids_are_forgotten(Db::MariaDb).await;
}
