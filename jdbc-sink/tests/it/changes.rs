//! Change streams (a CDC source's rows: an `__op` column marked as a change column) against the real servers: the
//! keyed modes apply them by key inside the checkpoint's transaction (`xa_upsert`: inside the prepared
//! transaction, visible only at commit), the last change of a key in a batch wins, deletes delete, the change
//! columns never reach the table; a process killed after the prepare ends, on recovery, exactly as the restored
//! checkpoint says (committed when it is in the record, rolled back and replayed with the same result when it is
//! not). Read back with the databases' own clients.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use common::{Db, cli, config, short_name};
use connector_api::{CHANGE_COLUMN, CheckpointId, Committer, OP_COLUMN, SinkId, TwoPhaseCommit};
use jdbc_sink::{JdbcSink, WriteMode};

fn change_schema() -> SchemaRef {
    let marked = |name: &str, ty: DataType, what: &str| {
        Field::new(name, ty, true).with_metadata(HashMap::from([(
            CHANGE_COLUMN.to_string(),
            what.to_string(),
        )]))
    };
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("payload", DataType::Utf8, true),
        marked(OP_COLUMN, DataType::Utf8, "op"),
        marked("__source_lsn", DataType::Int64, "source"),
    ]))
}

/// Changes `(op, id, payload)`.
fn changes(rows: &[(&str, i64, Option<&str>)]) -> RecordBatch {
    RecordBatch::try_new(
        change_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter_values(0..rows.len() as i64)),
        ],
    )
    .unwrap()
}

async fn change_sink(db: Db, mode: &WriteMode, table: &str, scope: &str) -> JdbcSink {
    let mut config = config(
        db,
        &SinkId::new("changes").unwrap(),
        0,
        table,
        scope,
        mode.clone(),
    );
    config.schema = change_schema();
    JdbcSink::new(config).await.unwrap()
}

fn table_rows(db: Db, table: &str) -> String {
    cli(db, &format!("SELECT id, payload FROM {table} ORDER BY id")).replace('|', "\t")
}

fn modes() -> [WriteMode; 2] {
    let key = vec!["id".to_string()];
    [
        WriteMode::Upsert { key: key.clone() },
        WriteMode::XaUpsert { key },
    ]
}

fn first_checkpoint() -> [RecordBatch; 2] {
    [
        changes(&[
            ("r", 1, Some("a")),
            ("r", 2, Some("b")),
            ("c", 3, Some("c")),
        ]),
        changes(&[
            ("u", 1, Some("a2")),
            ("d", 2, None),
            ("c", 4, Some("d")),
            ("d", 4, None),
            ("d", 3, None),
            ("c", 3, Some("c2")),
        ]),
    ]
}

const AFTER_FIRST: &str = "1\ta2\n3\tc2";

async fn changes_are_applied_by_key(db: Db, mode: &WriteMode) {
    let unique = test_support::unique_name("changes");
    let table = short_name("chg_", &[&unique]);
    let scope = short_name("c", &[&unique]);
    let mut sink = change_sink(db, mode, &table, &scope).await;
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(1)).await.unwrap();
    for batch in first_checkpoint() {
        sink.write(&batch).await.unwrap();
    }
    let committable = sink.pre_commit(CheckpointId(1)).await.unwrap();
    if mode.prepares() {
        assert_eq!(
            table_rows(db, &table),
            "",
            "{db:?} {mode:?}: visible before commit"
        );
        sink.committer().commit(vec![committable]).await.unwrap();
    }
    assert_eq!(table_rows(db, &table), AFTER_FIRST, "{db:?} {mode:?}");
    let columns = match db {
        Db::Postgres => cli(
            db,
            &format!(
                "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM information_schema.columns \
                 WHERE table_name = '{table}'"
            ),
        ),
        Db::MariaDb => cli(
            db,
            &format!(
                "SELECT group_concat(column_name ORDER BY ordinal_position) FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            ),
        ),
    };
    assert_eq!(
        columns, "id,payload",
        "{db:?}: the change columns are not table columns"
    );

    // An operation the sink does not know is a bad record; nothing of its batch is applied.
    sink.begin(CheckpointId(2)).await.unwrap();
    let err = sink
        .write(&changes(&[("d", 1, None), ("x", 5, None)]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), connector_api::ErrorKind::BadRecord, "{err}");
    assert!(err.to_string().contains("\"x\""), "{err}");
    sink.write(&changes(&[("u", 3, Some("c3"))])).await.unwrap();
    let committable = sink.pre_commit(CheckpointId(2)).await.unwrap();
    if mode.prepares() {
        sink.committer().commit(vec![committable]).await.unwrap();
    }
    assert_eq!(table_rows(db, &table), "1\ta2\n3\tc3", "{db:?} {mode:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_applied_by_key_on_both_databases_in_both_keyed_modes() {
    for db in [Db::Postgres, Db::MariaDb] {
        for mode in modes() {
            changes_are_applied_by_key(db, &mode).await;
        }
    }
}

/// `xa_upsert`: a process killed after its checkpoint's transaction was prepared (the instance is dropped
/// without commit or abort, its connections closed like a killed process's) leaves it prepared; the next
/// instance commits it when the restored record holds it, and rolls it back when it does not (the record never
/// became durable), after which the replay applies the same changes once.
async fn a_prepared_change_checkpoint_ends_as_the_record_says(db: Db, in_record: bool) {
    let unique = test_support::unique_name("chgkill");
    let table = short_name("chk_", &[&unique]);
    let scope = short_name("k", &[&unique]);
    let mode = WriteMode::XaUpsert {
        key: vec!["id".into()],
    };
    let mut sink = change_sink(db, &mode, &table, &scope).await;
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(1)).await.unwrap();
    for batch in first_checkpoint() {
        sink.write(&batch).await.unwrap();
    }
    let committable = sink.pre_commit(CheckpointId(1)).await.unwrap();
    drop(sink);
    assert_eq!(table_rows(db, &table), "", "{db:?}: prepared, not visible");

    let mut next = change_sink(db, &mode, &table, &scope).await;
    if in_record {
        next.recover(Some((CheckpointId(1), vec![committable])))
            .await
            .unwrap();
    } else {
        next.recover(None).await.unwrap();
        assert_eq!(table_rows(db, &table), "", "{db:?}: rolled back");
        next.begin(CheckpointId(1)).await.unwrap();
        for batch in first_checkpoint() {
            next.write(&batch).await.unwrap();
        }
        let replayed = next.pre_commit(CheckpointId(1)).await.unwrap();
        next.committer().commit(vec![replayed]).await.unwrap();
    }
    assert_eq!(
        table_rows(db, &table),
        AFTER_FIRST,
        "{db:?}: in the record: {in_record}"
    );
    let (_, prepared) = common::read(db, &table, &[&scope]);
    assert!(prepared.is_empty(), "{db:?}: left prepared: {prepared:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_xa_upsert_checkpoint_ends_as_the_record_says_on_both_databases() {
    for db in [Db::Postgres, Db::MariaDb] {
        for in_record in [true, false] {
            a_prepared_change_checkpoint_ends_as_the_record_says(db, in_record).await;
        }
    }
}
