//! Tombstones against the real servers: the upsert mode deletes their keys inside the checkpoint's transaction, in
//! order with the rows (a key deleted then upserted again stays; one upserted then deleted goes), across
//! checkpoints, read back with the independent verifier (psycopg / pymysql); a key that does not fit the key
//! column is a bad record that deletes nothing of its call, and the transaction goes on; the xa and append modes
//! cannot express a deletion and write nothing.

use crate::common;

use common::{Db, config, read, short_name, sink_driver};
use connector_api::{CheckpointId, ErrorKind, SinkId, TwoPhaseCommit};
use jdbc_sink::{DedupConfig, JdbcSink, WriteMode};
use ratchet_conformance::{conformance_batch as batch, conformance_positions};

fn sink_id() -> SinkId {
    SinkId::new("tombstones").unwrap()
}

fn upsert() -> WriteMode {
    WriteMode::Upsert {
        key: vec!["id".into()],
    }
}

fn keys(keys: &[&str]) -> Vec<Option<Vec<u8>>> {
    keys.iter().map(|k| Some(k.as_bytes().to_vec())).collect()
}

/// The committed ids, sorted, as the verifier reads them.
fn committed(db: Db, table: &str, scope: &str) -> Vec<i64> {
    let (mut ids, prepared) = read(db, table, &[scope]);
    assert!(prepared.is_empty(), "{db:?}: prepared left: {prepared:?}");
    ids.sort_unstable();
    ids
}

fn ids_except(except: &[i64]) -> Vec<i64> {
    (0..10).filter(|id| !except.contains(id)).collect()
}

async fn tombstones_delete_in_order_with_the_rows(db: Db) {
    let unique = test_support::unique_name("tombstones");
    let table = short_name("tomb_", &[&unique]);
    let scope = short_name("t", &[&unique]);
    let state = tempfile::tempdir().unwrap();
    let (mut job, sink) =
        sink_driver(db, &sink_id(), 0, &table, &scope, state.path(), upsert()).await;
    job.start().await.unwrap();

    // One checkpoint: ids 0..10, then tombstones for 3 and 4 (and one without a key), then 4 again.
    job.write(sink, &batch(0..10)).await.unwrap();
    let mut with_none = keys(&["3", "4"]);
    with_none.push(None);
    assert!(
        job.write_tombstones(sink, &with_none).await.unwrap(),
        "{db:?}"
    );
    job.write(sink, &batch(4..5)).await.unwrap();
    job.checkpoint(conformance_positions(13)).await.unwrap();
    assert_eq!(
        committed(db, &table, &scope),
        ids_except(&[3]),
        "{db:?}: 3 deleted, 4 upserted again after its tombstone"
    );

    // The next checkpoint: a tombstone for 7.
    assert!(
        job.write_tombstones(sink, &keys(&["7"])).await.unwrap(),
        "{db:?}"
    );
    job.checkpoint(conformance_positions(14)).await.unwrap();
    assert_eq!(
        committed(db, &table, &scope),
        ids_except(&[3, 7]),
        "{db:?}: after the second checkpoint"
    );

    // A key that does not parse as the int64 key column: a bad record naming it, and nothing of the call is
    // deleted (not even the key before it that fits); the transaction goes on, and a JSON key deletes 9.
    let err = job
        .write_tombstones(sink, &keys(&["1", "abc"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRecord, "{db:?}: {err}");
    let message = err.to_string();
    assert!(
        message.contains("\"abc\"") && message.contains("\"id\"") && message.contains("Int64"),
        "{db:?}: {message}"
    );
    assert!(
        job.write_tombstones(sink, &keys(&[r#"{"id": 9}"#]))
            .await
            .unwrap(),
        "{db:?}"
    );
    job.checkpoint(conformance_positions(17)).await.unwrap();
    job.close().await.unwrap();
    assert_eq!(
        committed(db, &table, &scope),
        ids_except(&[3, 7, 9]),
        "{db:?}: the refused call deleted nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_tombstones_delete_their_keys_on_both_databases() {
    tombstones_delete_in_order_with_the_rows(Db::Postgres).await;
    tombstones_delete_in_order_with_the_rows(Db::MariaDb).await;
}

/// The xa and append modes return `false` and write nothing: the rows of the checkpoint are all there.
async fn other_modes_cannot_delete(db: Db) {
    let modes = [
        ("xa", WriteMode::Xa),
        (
            "append",
            WriteMode::Append {
                dedup: DedupConfig {
                    message_id: "id".into(),
                    table: None,
                    retention: std::time::Duration::from_secs(3600),
                },
            },
        ),
    ];
    for (name, mode) in modes {
        let unique = test_support::unique_name(name);
        let table = short_name("tomb_", &[&unique, name]);
        let scope = short_name("t", &[&unique, name]);
        let mut sink = JdbcSink::new(config(db, &sink_id(), 0, &table, &scope, mode))
            .await
            .unwrap();
        sink.recover(None).await.unwrap();
        sink.begin(CheckpointId(1)).await.unwrap();
        sink.write(&batch(0..10)).await.unwrap();
        let written = sink.write_tombstones(&keys(&["3", "abc"])).await.unwrap();
        assert!(!written, "{db:?} {name}: no deletion in this mode");
        let committable = sink.pre_commit(CheckpointId(1)).await.unwrap();
        sink.commit(vec![committable]).await.unwrap();
        assert_eq!(
            committed(db, &table, &scope),
            ids_except(&[]),
            "{db:?} {name}: nothing deleted"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xa_and_append_modes_write_no_tombstones_on_both_databases() {
    other_modes_cannot_delete(Db::Postgres).await;
    other_modes_cannot_delete(Db::MariaDb).await;
}
