//! Faults and bad input against the real servers, checked with the databases' own clients and the Python
//! verifier: a connection lost mid-transaction, a prepared transaction's row locks blocking another writer
//! (measured), a table that does not fit the batches, a batch the table refuses.
//!
//! The checks of one database run one after another in one test (they find the sink's sessions by state on the
//! server); the two databases run side by side.
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod common;

use std::time::{Duration, Instant};

use common::{Db, cli, config, create_keyed_table, read, short_name, xa_driver};
use connector_api::{CheckpointId, Committer, ErrorKind, SinkId, TwoPhaseCommit};
use jdbc_sink::{JdbcSink, WriteMode};
use ratchet_conformance::{conformance_batch as batch, conformance_positions};

fn sink_id() -> SinkId {
    SinkId::new("faulty").unwrap()
}

fn names(what: &str, db: Db) -> (String, String) {
    let unique = test_support::unique_name(what);
    (
        short_name("fault_", &[&unique, &format!("{db:?}")]),
        short_name("f", &[&unique, &format!("{db:?}")]),
    )
}

/// Kills the server session holding the sink's open (unprepared) transaction.
fn kill_writer_session(db: Db) {
    let killed = match db {
        Db::Postgres => cli(
            db,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND state = 'idle in transaction' AND pid <> pg_backend_pid()",
        ),
        Db::MariaDb => {
            let ids = cli(
                db,
                "SELECT trx_mysql_thread_id FROM information_schema.innodb_trx \
                 WHERE trx_mysql_thread_id <> 0 AND trx_mysql_thread_id <> CONNECTION_ID()",
            );
            for id in ids.lines() {
                cli(db, &format!("KILL CONNECTION {id}"));
            }
            ids.lines().count().to_string()
        }
    };
    assert_eq!(killed, "1", "{db:?}: expected one writer session to kill");
}

/// The writer's connection dies mid-transaction: the checkpoint fails (retryable), a restart replays it, and
/// every record is visible once.
async fn lost_connection(db: Db) {
    let (table, scope) = names("lost", db);
    let state = tempfile::tempdir().unwrap();
    let (mut job, sink) = xa_driver(db, &sink_id(), 0, &table, &scope, state.path()).await;
    job.start().await.unwrap();
    job.write(sink, &batch(0..100)).await.unwrap();
    job.checkpoint(conformance_positions(100)).await.unwrap();
    job.finish_commit().await.unwrap();
    job.write(sink, &batch(100..200)).await.unwrap();
    kill_writer_session(db);
    let err = job
        .checkpoint(conformance_positions(200))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Retryable, "{db:?}: {err}");
    drop(job);

    let (mut job, sink) = xa_driver(db, &sink_id(), 0, &table, &scope, state.path()).await;
    let restored = job.start().await.unwrap();
    assert_eq!(
        restored.positions[0].next_offset, 100,
        "{db:?}: restored position"
    );
    job.write(sink, &batch(100..200)).await.unwrap();
    job.checkpoint(conformance_positions(200)).await.unwrap();
    job.close().await.unwrap();

    let (mut ids, prepared) = read(db, &table, &[&scope]);
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..200).collect::<Vec<_>>(),
        "{db:?}: rows after the lost connection"
    );
    assert!(prepared.is_empty(), "{db:?}: prepared left: {prepared:?}");
}

/// A prepared transaction keeps the locks of what it wrote until it is committed: another writer upserting one of
/// its keys waits for the commit. Measured and printed.
async fn prepared_rows_block_other_writers(db: Db) {
    const HOLD: Duration = Duration::from_millis(800);
    let (table, scope) = names("locks", db);
    create_keyed_table(db, &table);
    let mut sink = JdbcSink::new(config(db, &sink_id(), 0, &table, &scope, WriteMode::Xa))
        .await
        .unwrap();
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(2)).await.unwrap();
    sink.write(&batch(0..10)).await.unwrap();
    let committable = sink.pre_commit(CheckpointId(2)).await.unwrap();

    let update = match db {
        Db::Postgres => format!(
            "SET lock_timeout = '30s'; INSERT INTO {table} VALUES (5, 'other') \
             ON CONFLICT (id) DO UPDATE SET payload = EXCLUDED.payload"
        ),
        Db::MariaDb => format!(
            "SET SESSION innodb_lock_wait_timeout = 30; INSERT INTO {table} VALUES (5, 'other') \
             ON DUPLICATE KEY UPDATE payload = VALUES(payload)"
        ),
    };
    let started = Instant::now();
    let other = tokio::task::spawn_blocking(move || {
        cli(db, &update);
        started.elapsed()
    });
    tokio::time::sleep(HOLD).await;
    assert!(
        !other.is_finished(),
        "{db:?}: the other writer should wait while the transaction is prepared"
    );
    let committed_at = started.elapsed();
    sink.committer().commit(vec![committable]).await.unwrap();
    let waited = other.await.unwrap();
    println!(
        "{db:?}: another writer's upsert of a key in a prepared transaction waited {waited:?}; the transaction was \
         committed {committed_at:?} after the upsert started"
    );
    assert!(waited >= committed_at, "{db:?}: waited {waited:?}");
    assert_eq!(
        cli(db, &format!("SELECT payload FROM {table} WHERE id = 5")),
        "other"
    );
}

/// A table that does not fit the batches is refused at start naming the column; a batch the table refuses is
/// refused whole (naming the key) and the transaction goes on without it.
async fn bad_input(db: Db) {
    let (table, scope) = names("bad", db);
    let without_payload = format!("{table}_narrow");
    cli(db, &format!("CREATE TABLE {without_payload} (id BIGINT)"));
    let mut narrow = config(db, &sink_id(), 0, &without_payload, &scope, WriteMode::Xa);
    narrow.create_table = false;
    let err = JdbcSink::new(narrow).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{db:?}: {err}");
    assert!(err.to_string().contains("payload"), "{db:?}: {err}");
    // The whole chain, as the worker prints it, says each thing once.
    let chain = connector_api::Report(&err).to_string();
    let server_says =
        chain.matches("does not exist").count() + chain.matches("Unknown column").count();
    assert_eq!(
        server_says, 1,
        "{db:?}: the server's message repeated: {chain}"
    );
    assert_eq!(chain.matches("setup failed").count(), 1, "{db:?}: {chain}");

    if db == Db::Postgres {
        let wrong_type = format!("{table}_types");
        cli(
            db,
            &format!("CREATE TABLE {wrong_type} (id boolean, payload text)"),
        );
        let err = JdbcSink::new(config(
            db,
            &sink_id(),
            0,
            &wrong_type,
            &scope,
            WriteMode::Xa,
        ))
        .await
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(
            err.to_string().contains("field `id`") && err.to_string().contains("bool"),
            "{err}"
        );
    }

    create_keyed_table(db, &table);
    let mut sink = JdbcSink::new(config(db, &sink_id(), 0, &table, &scope, WriteMode::Xa))
        .await
        .unwrap();
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(2)).await.unwrap();
    sink.write(&batch(0..5)).await.unwrap();
    let err = sink.write(&batch(3..8)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRecord, "{db:?}: {err}");
    let message = err.to_string();
    assert!(
        message.contains("id = 3") && message.contains(&table),
        "{db:?}: {message}"
    );
    sink.write(&batch(5..10)).await.unwrap();
    let committable = sink.pre_commit(CheckpointId(2)).await.unwrap();
    sink.committer().commit(vec![committable]).await.unwrap();
    let (mut ids, prepared) = read(db, &table, &[&scope]);
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..10).collect::<Vec<_>>(),
        "{db:?}: the refused batch left nothing"
    );
    assert!(prepared.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_faults() {
    lost_connection(Db::Postgres).await;
    prepared_rows_block_other_writers(Db::Postgres).await;
    bad_input(Db::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_faults() {
    lost_connection(Db::MariaDb).await;
    prepared_rows_block_other_writers(Db::MariaDb).await;
    bad_input(Db::MariaDb).await;
}
