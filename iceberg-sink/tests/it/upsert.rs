//! The upsert mode (`upsert_key`): a change stream applied by key as row deltas (data files and delete files in
//! one snapshot, committed by Ratchet's own catalog commit). With position deletes (the default) it is read back
//! by pyiceberg, DuckDB and Apache Iceberg's Java library (IcebergGenerics); with equality deletes by Java and the
//! verifier's own reading of the manifests (pyiceberg 0.12 refuses equality deletes; DuckDB 1.4.4's iceberg
//! extension, the newest on PyPI, misreads them: docs/services.md):
//!
//! - two subtasks apply inserts, updates and deletes of their keys over three runs (keys change several times
//!   within a checkpoint), on a SQLite catalog (a run with equality deletes, then two by position on the same
//!   table: the key index is rebuilt from a table holding both) and on SeaweedFS's REST catalog with manifest
//!   merging at 2 and snapshot expiry: after every run every reader sees exactly the last state of every key;
//! - a real `kill -9` after the delete manifest and list are written (nothing committed) and after the row delta
//!   landed (nothing deleted), for both kinds of deletes: the restarted job (its key index rebuilt from the table)
//!   ends in the same state as an uninterrupted run, no checkpoint in two snapshots, no file of the sink
//!   unreferenced;
//! - a table partitioned by a column other than the key (keys move between partitions), two subtasks over three
//!   runs, position deletes filed under the replaced rows' partitions;
//! - pyiceberg's copy-on-write delete (another writer) rewriting the file between a checkpoint's pre-commit and its
//!   commit, unpartitioned and partitioned: the commit deletes by key instead, the next pre-commit rebuilds the
//!   index and deletes by position again, every key once;
//! - every run writes a checkpoint as three batches with a 1-byte target file size, so a checkpoint's rows span
//!   several data files and positions count per file;
//! - the settings it cannot honour are refused at start: `commit_every` > 1, a key column the rows lack, a key
//!   column the table lacks (naming the table).

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use common::Lake;
use connector_api::{
    CHANGE_COLUMN, Driver, DriverConfig, ErrorKind, LocalCheckpointStore, OP_COLUMN, SinkId,
};
use iceberg_sink::{IcebergSink, IcebergSinkConfig, UpsertDeletes};
use ratchet_conformance::conformance_positions;

const CHILD_DIR: &str = "RATCHET_ICEBERG_UPSERT_CHILD";
const CHILD_TABLE: &str = "RATCHET_ICEBERG_UPSERT_TABLE";
const CHILD_DELETES: &str = "RATCHET_ICEBERG_UPSERT_DELETES";
/// Changes per checkpoint.
pub(crate) const CHANGES: i64 = 30;
/// Keys per subtask: each key changes 2-3 times per checkpoint.
const KEYS: i64 = 12;

/// A Debezium-like change stream: the row (`id`, `v`) and the operation column marked as a change column.
pub(crate) fn change_schema() -> SchemaRef {
    let op = Field::new(OP_COLUMN, DataType::Utf8, false).with_metadata(HashMap::from([(
        CHANGE_COLUMN.to_string(),
        "op".to_string(),
    )]));
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
        op,
    ]))
}

/// The change at offset `n` of `subtask`: key `subtask * 1000 + n % KEYS`; every fifth change a delete, the
/// others an insert (first change of the key, or after its delete) or an update; the value names the offset.
pub(crate) fn change(subtask: u32, n: i64) -> (i64, &'static str, String) {
    let key = i64::from(subtask) * 1000 + n % KEYS;
    let op = if n % 5 == 4 {
        "d"
    } else if n < KEYS || (n - KEYS) % 5 == 4 {
        "c"
    } else {
        "u"
    };
    (key, op, format!("{subtask}:{n}"))
}

/// The changes at `offsets` of `subtask`.
pub(crate) fn changes(subtask: u32, offsets: std::ops::Range<i64>) -> RecordBatch {
    let rows: Vec<_> = offsets.map(|n| change(subtask, n)).collect();
    RecordBatch::try_new(
        change_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.2.clone()),
            )),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
        ],
    )
    .unwrap()
}

/// The table a run of `subtask` up to offset `upto` must leave: each key's last change, unless a delete.
pub(crate) fn expected(subtasks: &[(u32, i64)]) -> BTreeMap<i64, String> {
    let mut state = BTreeMap::new();
    for &(subtask, upto) in subtasks {
        for n in 0..upto {
            let (key, op, value) = change(subtask, n);
            if op == "d" {
                state.remove(&key);
            } else {
                state.insert(key, value);
            }
        }
    }
    state
}

/// `config` creating its table partitioned by `partition_by` (Spark's terms).
fn partitioned(config: IcebergSinkConfig, partition_by: &[&str]) -> IcebergSinkConfig {
    IcebergSinkConfig {
        layout: iceberg_sink::TableLayout {
            partition_by: partition_by.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        },
        ..config
    }
}

/// The upsert sink of `subtask`, rolling to a new data file before every batch (a 1-byte target), so a
/// checkpoint's rows span several files and each row's position counts from its own file's start.
pub(crate) fn config(lake: &Lake, table: &str, subtask: u32) -> IcebergSinkConfig {
    IcebergSinkConfig {
        upsert_key: vec!["id".into()],
        target_file_size: 1,
        ..lake.config(
            "upserting",
            &SinkId::new("lake").unwrap(),
            subtask,
            table,
            change_schema(),
        )
    }
}

/// Runs `checkpoints` checkpoints of [`CHANGES`] changes of `subtask` from the store in `state`, each committed
/// before the next; returns the next offset.
pub(crate) async fn run(
    lake: &Lake,
    table: &str,
    (subtask, deletes): (u32, UpsertDeletes),
    state: &Path,
    checkpoints: i64,
) -> i64 {
    let config = IcebergSinkConfig {
        expire_snapshots: true,
        upsert_deletes: deletes,
        ..config(lake, table, subtask)
    };
    run_config(config, subtask, state, checkpoints).await
}

/// [`run`] with the sink of `config`.
pub(crate) async fn run_config(
    config: IcebergSinkConfig,
    subtask: u32,
    state: &Path,
    checkpoints: i64,
) -> i64 {
    // Three batches: a checkpoint's applied rows come per batch, each into a file of its own (`config`).
    run_checkpoints(config, (subtask, state), checkpoints, (CHANGES, 3)).await
}

/// Runs `checkpoints` checkpoints of `changes` changes of `subtask` written as `batches` batches, from the store in
/// `state`, each committed before the next; returns the next offset.
pub(crate) async fn run_checkpoints(
    config: IcebergSinkConfig,
    (subtask, state): (u32, &Path),
    checkpoints: i64,
    (changes_each, batches): (i64, i64),
) -> i64 {
    let (mut job, sink, restored) = common::started(state, &config).await;
    let mut next = restored.positions.first().map_or(0, |p| p.next_offset);
    for _ in 0..checkpoints {
        for batch in 0..batches {
            let from = next + batch * changes_each / batches;
            job.write(sink, &changes(subtask, from..from + changes_each / batches))
                .await
                .unwrap();
        }
        next += changes_each;
        job.checkpoint(conformance_positions(next)).await.unwrap();
        job.finish_commit().await.unwrap();
    }
    job.close().await.unwrap();
    next
}

/// What both readers see of `table`: the rows (`id` -> `v`) by the verifier's merge-on-read, every row Iceberg's
/// Java library reads, and the rest of the verifier's answer.
async fn read(
    lake: &Lake,
    table: &str,
) -> (BTreeMap<i64, String>, Vec<(i64, String)>, serde_json::Value) {
    let (lake, table) = (lake.clone(), table.to_string());
    let seen = tokio::task::spawn_blocking(move || lake.read_with(&table, "--rows"))
        .await
        .unwrap();
    assert_eq!(seen["column_names"], serde_json::json!(["id", "v"]));
    let rows: Vec<(i64, String)> = seen["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_i64().unwrap(), r[1].as_str().unwrap().to_string()))
        .collect();
    let state: BTreeMap<i64, String> = rows.iter().cloned().collect();
    assert_eq!(state.len(), rows.len(), "a key shows twice: {rows:?}");
    assert_eq!(seen["second_column_names"], serde_json::json!(["id", "v"]));
    let java: Vec<(i64, String)> = seen["second_rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_i64().unwrap(), r[1].as_str().unwrap().to_string()))
        .collect();
    (state, java, seen)
}

/// Every reader sees exactly `expected` in `table`: pyiceberg (the verifier's merge-on-read of the manifests while
/// equality deletes are live), Iceberg's Java library, and DuckDB when no equality delete is live (it misreads
/// them). Returns the verifier's answer.
pub(crate) async fn readers_see(
    lake: &Lake,
    table: &str,
    expected: &BTreeMap<i64, String>,
    context: &str,
) -> serde_json::Value {
    let (state, mut java, seen) = read(lake, table).await;
    let equality = seen["equality_deletes"] == serde_json::json!(true);
    let first_reader = match equality {
        false => "pyiceberg",
        true => "merge-on-read of the manifests",
    };
    assert_eq!(&state, expected, "{context}: {first_reader}");
    // DuckDB 1.4.4 crashes on a table holding position-delete files beside deletion vectors (the verifier says so
    // instead of running it: docs/services.md).
    if !equality && seen["duckdb_skipped"].is_null() {
        assert_eq!(
            seen["duckdb_ids"],
            serde_json::json!(expected.keys().collect::<Vec<_>>()),
            "{context}: DuckDB"
        );
    }
    java.sort();
    assert_eq!(
        java,
        expected.clone().into_iter().collect::<Vec<_>>(),
        "{context}: Iceberg's Java library (IcebergGenerics)"
    );
    seen
}

/// Every reader sees exactly `expected` ([`readers_see`]); the retained snapshots deleted the keys' older rows the way `deletes`
/// says: by position only (and some did), or by equality with every snapshot that added rows.
async fn assert_reads(
    lake: &Lake,
    table: &str,
    expected: &BTreeMap<i64, String>,
    deletes: UpsertDeletes,
    context: &str,
) {
    let seen = readers_see(lake, table, expected, context).await;
    if deletes == UpsertDeletes::Equality {
        assert_eq!(
            seen["equality_deletes"],
            serde_json::json!(true),
            "{context}"
        );
    }
    let summaries = seen["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["summary"]);
    let added =
        |summary: &serde_json::Value, key: &str| summary[key].as_str().is_some_and(|n| n != "0");
    match deletes {
        UpsertDeletes::Equality => {
            for summary in summaries.filter(|s| added(s, "added-data-files")) {
                assert!(
                    added(summary, "added-equality-delete-files")
                        && !added(summary, "added-position-delete-files"),
                    "{context}: a snapshot adding rows without their keys' equality deletes: {summary}"
                );
            }
        }
        UpsertDeletes::Position => {
            // The first rows of a key replace nothing: not every snapshot deletes, but some must.
            let summaries: Vec<_> = summaries.collect();
            assert!(
                summaries
                    .iter()
                    .all(|s| !added(s, "added-equality-delete-files")),
                "{context}: equality deletes although no rewrite moved rows: {summaries:?}"
            );
            assert!(
                summaries
                    .iter()
                    .any(|s| added(s, "added-position-delete-files")),
                "{context}: no snapshot deleted by position: {summaries:?}"
            );
            let files = |s: &serde_json::Value| {
                s["added-data-files"]
                    .as_str()
                    .map_or(0, |n| n.parse::<u32>().unwrap())
            };
            assert!(
                summaries.iter().any(|s| files(s) > 1),
                "{context}: no checkpoint's rows span two data files (the test's 1-byte target): {summaries:?}"
            );
        }
    }
    let snapshots = seen["snapshots"].as_array().unwrap();
    assert_eq!(
        common::checkpoints_in_two_snapshots(snapshots),
        Vec::<String>::new(),
        "{context}: checkpoints in two snapshots"
    );
    assert_eq!(
        seen["unreferenced"],
        serde_json::json!([]),
        "{context}: files of the sink no snapshot references"
    );
}

/// Two subtasks, three runs of 4 checkpoints each, deleting by `rounds[i]` in run `i`: every reader sees each key's
/// last change after every run. The table is created partitioned by `partition_by`.
async fn applies_changes_by_key(
    lake: Lake,
    merge_at: Option<usize>,
    rounds: [UpsertDeletes; 3],
    partition_by: &[&str],
) {
    let table = lake.table(&["upserted"]);
    let states = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    IcebergSink::new(partitioned(config(&lake, &table, 0), partition_by))
        .await
        .unwrap();
    lake.set_retention(&table, 4).await;
    if let Some(min_count) = merge_at {
        lake.set_merge(&table, min_count).await;
    }
    let mut upto = [0, 0];
    for (round, deletes) in rounds.into_iter().enumerate() {
        for subtask in 0..2u32 {
            let state = states[subtask as usize].path();
            upto[subtask as usize] = run(&lake, &table, (subtask, deletes), state, 4).await;
        }
        // Each run's first checkpoint compacts (`compact`, on for the tables the sink creates); a compaction's
        // inputs stay on storage until the subtask's own expiry retires the snapshots before it, or its next
        // recovery finds that the other subtask's expiry did: a recovery of each (no checkpoint) deletes them.
        for subtask in 0..2u32 {
            let state = states[subtask as usize].path();
            run(&lake, &table, (subtask, deletes), state, 0).await;
        }
        let expected = expected(&[(0, upto[0]), (1, upto[1])]);
        assert!(expected.len() > KEYS as usize, "both subtasks' keys");
        let context = format!("round {round} ({deletes:?})");
        assert_reads(&lake, &table, &expected, deletes, &context).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_stream_is_applied_by_key_on_a_sql_catalog() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let rounds = [
        UpsertDeletes::Equality,
        UpsertDeletes::Position,
        UpsertDeletes::Position,
    ];
    applies_changes_by_key(Lake::sqlite_local(dir.path(), "upsert"), None, rounds, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_stream_is_applied_by_key_on_a_rest_catalog_merging_manifests() {
    test_support::Services::get();
    applies_changes_by_key(
        Lake::rest("upsert"),
        Some(2),
        [UpsertDeletes::Position; 3],
        &[],
    )
    .await;
}

/// Partitioned by a column that is not the key: a key's new row often lands in another partition than its old
/// one, whose position delete is filed under the old row's partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_stream_is_applied_by_key_to_a_table_partitioned_by_another_column() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    applies_changes_by_key(
        Lake::sqlite_local(dir.path(), "partitioned"),
        None,
        [UpsertDeletes::Position; 3],
        &["bucket(3, v)"],
    )
    .await;
}

/// The child of the kill test: runs 4 checkpoints of subtask 0 on the table in `CHILD_TABLE` from the store
/// under `CHILD_DIR`; the drill in its environment kills it at the first row delta. Returns at once in a normal
/// test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let (Ok(dir), Ok(table)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_TABLE)) else {
        return;
    };
    let deletes = match std::env::var(CHILD_DELETES).as_deref() {
        Ok("equality") => UpsertDeletes::Equality,
        _ => UpsertDeletes::Position,
    };
    let lake = Lake::sqlite_local(Path::new(&dir), "child");
    run(
        &lake,
        &table,
        (0, deletes),
        &Path::new(&dir).join("state"),
        4,
    )
    .await;
}

/// Runs [`child`] (subtask 0 of the SQLite lake in `dir`, its store in `dir/state`) until it kills itself with
/// SIGKILL at `step`.
pub(crate) fn killed_at(dir: &Path, table: &str, step: &str, deletes: UpsertDeletes) {
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "upsert::child", "--nocapture"])
        .env(CHILD_DIR, dir)
        .env(CHILD_TABLE, table)
        .env(iceberg_sink::KILL_VARIABLE, step)
        .env(
            CHILD_DELETES,
            match deletes {
                UpsertDeletes::Position => "position",
                UpsertDeletes::Equality => "equality",
            },
        )
        .status()
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "{step}: the child should have killed itself at the step ({status})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_at_each_step_of_a_row_delta_loses_nothing_and_doubles_nothing() {
    test_support::Services::get();
    for (step, deletes) in [
        ("after-row-delta", UpsertDeletes::Position),
        ("after-own-commit", UpsertDeletes::Position),
        ("after-own-commit", UpsertDeletes::Equality),
    ] {
        let step_name = format!("{step} ({deletes:?})");
        let step_name = step_name.as_str();
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::sqlite_local(dir.path(), "killed");
        let table = lake.table(&["upserted"]);
        IcebergSink::new(config(&lake, &table, 0)).await.unwrap();
        killed_at(dir.path(), &table, step, deletes);
        let state = dir.path().join("state");
        let next = run(&lake, &table, (0, deletes), &state, 2).await;
        let decided = common::decided_offset(&state).await;
        assert_eq!(next, decided, "{step}: the last checkpoint is decided");
        assert!(
            next > 2 * CHANGES,
            "{step}: the killed run's first checkpoint counts"
        );
        assert_reads(&lake, &table, &expected(&[(0, next)]), deletes, step_name).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_the_upsert_mode_cannot_honour_are_refused_at_start() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "refused");
    let table = lake.table(&["upserted"]);
    let every_third = IcebergSinkConfig {
        commit_every: 3,
        ..config(&lake, &table, 0)
    };
    let refused = IcebergSink::new(every_third).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Config);
    assert!(
        refused.to_string().contains("commit_every = 3"),
        "{refused}"
    );
    let unknown_key = IcebergSinkConfig {
        upsert_key: vec!["order_id".into()],
        ..config(&lake, &table, 0)
    };
    let refused = IcebergSink::new(unknown_key).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Config);
    let said = connector_api::Report(&refused).to_string();
    assert!(
        said.contains("upsert_key") && said.contains("order_id"),
        "{said}"
    );
    // A key column the rows have but the (existing) table lacks: refused naming the table.
    IcebergSink::new(config(&lake, &table, 0)).await.unwrap();
    let wider = Arc::new(Schema::new(
        change_schema()
            .fields()
            .iter()
            .cloned()
            .chain([Arc::new(Field::new("region", DataType::Utf8, true))])
            .collect::<Vec<_>>(),
    ));
    let not_in_table = IcebergSinkConfig {
        upsert_key: vec!["region".into()],
        schema: wider,
        ..config(&lake, &table, 0)
    };
    let refused = IcebergSink::new(not_in_table).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Config);
    let said = connector_api::Report(&refused).to_string();
    assert!(said.contains("region") && said.contains(&table), "{said}");
}

/// Begins `checkpoint` on `sink`, writes the next [`CHANGES`] changes of subtask 0 from `next` (advanced), and
/// pre-commits it.
async fn pre_commit(
    sink: &mut IcebergSink,
    checkpoint: u64,
    next: &mut i64,
) -> iceberg_sink::IcebergCommittable {
    pre_commit_changes(sink, checkpoint, next, CHANGES).await
}

/// [`pre_commit`] of `count` changes.
pub(crate) async fn pre_commit_changes(
    sink: &mut IcebergSink,
    checkpoint: u64,
    next: &mut i64,
    count: i64,
) -> iceberg_sink::IcebergCommittable {
    use connector_api::{CheckpointId, TwoPhaseCommit};
    sink.begin(CheckpointId(checkpoint)).await.unwrap();
    sink.write(&changes(0, *next..*next + count)).await.unwrap();
    *next += count;
    sink.pre_commit(CheckpointId(checkpoint)).await.unwrap()
}

/// pyiceberg's copy-on-write delete of key `id` from `table` (another writer): every data file holding it is
/// rewritten into a new file without it, so the file's other rows move. Returns the snapshot's summary.
fn foreign_delete(lake: &Lake, table: &str, id: i64) -> serde_json::Value {
    let id = id.to_string();
    let args = [
        "ratchet",
        &lake.python_uri,
        &lake.warehouse,
        table,
        "id",
        &id,
    ];
    test_support::Services::get().produce("iceberg_foreign_delete.py", &args)["summary"].clone()
}

/// The newest snapshot's summary as the verifier reads it.
fn newest_summary(seen: &serde_json::Value) -> &serde_json::Value {
    &seen["snapshots"].as_array().unwrap().last().unwrap()["summary"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_another_writer_moved_are_deleted_by_key_and_the_index_rebuilds() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "moved");
    moved_rows(&lake, "unpartitioned", &[]).await;
    moved_rows(&lake, "partitioned", &["bucket(3, v)"]).await;
}

/// Four checkpoints of subtask 0 on table `name` (created partitioned by `partition_by`); between the third's
/// pre-commit and its commit, another writer rewrites the file holding the rows it replaces.
async fn moved_rows(lake: &Lake, name: &str, partition_by: &[&str]) {
    use connector_api::{Committer, TwoPhaseCommit};
    let table = lake.table(&[name]);
    let config = partitioned(config(lake, &table, 0), partition_by);
    let mut sink = IcebergSink::new(config).await.unwrap();
    sink.recover(None).await.unwrap();
    let committer = sink.committer();
    let mut next = 0;
    for checkpoint in 1..=2 {
        let committable = pre_commit(&mut sink, checkpoint, &mut next).await;
        committer.commit(vec![committable]).await.unwrap();
    }
    // Checkpoint 3 located the rows it replaces; then another writer rewrites the file holding them.
    let committable = pre_commit(&mut sink, 3, &mut next).await;
    assert!(committable.deletes_based_on.is_some());
    let rewrite = foreign_delete(lake, &table, 4);
    assert_ne!(
        rewrite["deleted-data-files"],
        serde_json::json!("0"),
        "{rewrite}"
    );
    committer.commit(vec![committable]).await.unwrap();
    let seen = readers_see(lake, &table, &expected(&[(0, next)]), "after the fallback").await;
    let summary = newest_summary(&seen);
    assert!(
        summary["added-equality-delete-files"].as_str() > Some("0")
            && summary.get("added-position-delete-files").is_none(),
        "the commit after the rewrite deletes by key: {summary}"
    );
    // The next pre-commit sees the rewrite in the history and rebuilds the index: positions again, exact.
    let committable = pre_commit(&mut sink, 4, &mut next).await;
    committer.commit(vec![committable]).await.unwrap();
    let seen = readers_see(lake, &table, &expected(&[(0, next)]), "after the rebuild").await;
    let summary = newest_summary(&seen);
    assert!(
        summary["added-position-delete-files"].as_str() > Some("0")
            && summary.get("added-equality-delete-files").is_none(),
        "the commit after a rebuild deletes by position: {summary}"
    );
    assert_eq!(
        seen["unreferenced"],
        serde_json::json!([]),
        "the unused delete files are gone"
    );
}

/// Sets the modification time of every file under `dir` to `at`.
fn age_files(dir: &Path, at: std::time::SystemTime) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            age_files(&path, at);
        } else {
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(at)
                .unwrap();
        }
    }
}

/// The files under `dir` (recursively) whose name starts with `prefix`.
fn files_named(dir: &Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_named(&path, prefix));
        } else if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(prefix)
        {
            found.push(path);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orphan_sweep_deletes_only_old_files_nothing_references() {
    use std::time::SystemTime;
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "swept");
    let table = lake.table(&["upserted"]);
    let state = dir.path().join("state");
    let next = run(&lake, &table, (0, UpsertDeletes::Position), &state, 3).await;
    // Everything the table holds is two hours old: only the references keep it.
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    let warehouse = dir.path().join("warehouse");
    age_files(&warehouse, two_hours_ago);
    let data_dir = files_named(&warehouse, "ratchet.upserting.lake.0.")[0]
        .parent()
        .unwrap()
        .to_path_buf();
    let metadata_dir = files_named(&warehouse, "00000-")[0]
        .parent()
        .unwrap()
        .to_path_buf();
    let plant = |path: std::path::PathBuf, at: SystemTime| {
        std::fs::write(&path, b"orphan").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(at)
            .unwrap();
        path
    };
    let old_orphans = [
        plant(
            data_dir.join("00000-0-killed-writer.parquet"),
            two_hours_ago,
        ),
        plant(metadata_dir.join("snap-1-1-killed.avro"), two_hours_ago),
        plant(
            metadata_dir.join("00077-lost-swap.metadata.json"),
            two_hours_ago,
        ),
    ];
    let kept = [
        // Too young: a commit in flight may still name it.
        plant(
            data_dir.join("00000-0-in-flight.parquet"),
            SystemTime::now(),
        ),
        // Another subtask's file of this sink: its own recovery decides (a decided checkpoint may carry it).
        plant(
            data_dir.join("ratchet.upserting.lake.1.e1.c9-00000-0.parquet"),
            two_hours_ago,
        ),
    ];
    let too_short = IcebergSinkConfig {
        sweep_orphans_after: Some(Duration::from_secs(60)),
        ..config(&lake, &table, 0)
    };
    let refused = IcebergSink::new(too_short).await.unwrap_err();
    assert!(
        refused.to_string().contains("sweep_orphans_after"),
        "{refused}"
    );
    let sweeping = IcebergSinkConfig {
        expire_snapshots: true,
        sweep_orphans_after: Some(Duration::from_secs(3600)),
        ..config(&lake, &table, 0)
    };
    let next = run_config(sweeping, 0, &state, 1).await.max(next);
    for orphan in &old_orphans {
        assert!(!orphan.exists(), "{} should be swept", orphan.display());
    }
    for file in &kept {
        assert!(file.exists(), "{} should stay", file.display());
    }
    // Every file the table references stayed: every reader reads each key's last state.
    let seen = readers_see(&lake, &table, &expected(&[(0, next)]), "after the sweep").await;
    assert_eq!(
        seen["equality_deletes"],
        serde_json::json!(false),
        "DuckDB read it too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_whose_index_missed_the_take_over_is_fenced_and_every_key_stays_once() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "zombie");
    let table = lake.table(&["upserted"]);
    a_zombie_is_fenced(&lake, &table).await;
}

/// A first instance of subtask 0 commits two checkpoints into `table` and pre-commits a third; a second instance
/// takes over from the second checkpoint's record and commits two; the first one's commit and its next checkpoint
/// are refused as fenced, and every reader sees each key's last state once.
pub(crate) async fn a_zombie_is_fenced(lake: &Lake, table: &str) {
    use connector_api::{CheckpointId, Committer, TwoPhaseCommit};
    let (lake, table) = (lake.clone(), table.to_string());
    let mut zombie = IcebergSink::new(config(&lake, &table, 0)).await.unwrap();
    zombie.recover(None).await.unwrap();
    let mut next = 0;
    for checkpoint in 1..=2 {
        let committable = pre_commit(&mut zombie, checkpoint, &mut next).await;
        zombie.committer().commit(vec![committable]).await.unwrap();
    }
    // The first instance pre-commits checkpoint 3 on its index, then stalls before its commit.
    let mut stalled_next = next;
    let stalled = pre_commit(&mut zombie, 3, &mut stalled_next).await;
    // A second instance takes over from checkpoint 2's record, rebuilds its index from the table, replays the
    // changes after checkpoint 2 and goes on.
    let mut second = IcebergSink::new(config(&lake, &table, 0)).await.unwrap();
    second
        .recover(Some((CheckpointId(2), Vec::new())))
        .await
        .unwrap();
    assert_eq!(second.indexed_keys(), Some(expected(&[(0, next)]).len()));
    for checkpoint in 3..=4 {
        let committable = pre_commit(&mut second, checkpoint, &mut next).await;
        second.committer().commit(vec![committable]).await.unwrap();
    }
    // The zombie resumes: its commit, and its next checkpoint on an index that never saw the second's rows, are
    // refused.
    let refused = zombie.committer().commit(vec![stalled]).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Fenced, "{refused}");
    let mut zombie_next = stalled_next;
    let later = pre_commit(&mut zombie, 4, &mut zombie_next).await;
    let refused = zombie.committer().commit(vec![later]).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Fenced, "{refused}");
    let seen = readers_see(&lake, &table, &expected(&[(0, next)]), "after the zombie").await;
    assert_eq!(
        seen["equality_deletes"],
        serde_json::json!(false),
        "DuckDB read it too"
    );
}

/// Spark (4.1 with Iceberg 1.12's runtime) maintaining the table while the sink applies changes and is killed:
/// rewrite_data_files (every file, deletes applied, in small groups committed one by one), rewrite_manifests,
/// expire_snapshots and the removal of orphan files older than 20 s, in a loop.
///
/// 1. Beside it, rounds of a `kill -9` after the row delta is written and after it landed, each followed by a
///    restarted run, until Spark has run two rounds and committed expiries in between (a rewrite group holding a
///    file the sink deleted from since the rewrite began is refused by Iceberg's validation: the loop counts it;
///    with every key changing in every checkpoint, that is most of them).
/// 2. Then the dangerous moment, Spark winning: checkpoints pre-committed (their deletes located by position),
///    held until Spark's next rewrite has replaced the files, then committed: the sink deletes by key instead.
///
/// Spark, pyiceberg (or the verifier's merge-on-read while equality deletes are live) and Iceberg's Java library
/// then read each key's last state, once. The orphan cut-off is shorter than the sink's own sweep bound on
/// purpose, as operators set it: it holds because every killed run restarts within it (docs/worker.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_maintenance_beside_the_upserts_and_kills_leaves_each_key_once() {
    use connector_api::{Committer, TwoPhaseCommit};
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "spark");
    let table = lake.table(&["upserted"]);
    let state = dir.path().join("state");
    run(&lake, &table, (0, UpsertDeletes::Position), &state, 2).await;
    let orphan_cut_off = Duration::from_secs(20);
    let mut spark = common::SparkMaintainer::start(&lake, &table, orphan_cut_off);
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let mut rounds = 0;
    // Every key changes in every checkpoint, so a rewrite racing these commits mostly loses: two of Spark's
    // rounds, whatever their outcome, with expiries committed.
    while rounds < 2
        || spark.count("rewrite_data_files", "committed")
            + spark.count("rewrite_data_files", "lost")
            < 2
        || spark.count("expire_snapshots", "committed") < 2
    {
        assert!(
            std::time::Instant::now() < deadline,
            "Spark committed too little beside {rounds} rounds of the sink: {:?}\n{}",
            spark.progress(),
            spark.last_exceptions()
        );
        for step in ["after-row-delta", "after-own-commit"] {
            killed_at(dir.path(), &table, step, UpsertDeletes::Position);
            run(&lake, &table, (0, UpsertDeletes::Position), &state, 2).await;
        }
        rounds += 1;
    }
    // Subtask 0 goes on without its store: checkpoint ids above every one its runs used.
    let mut next = common::decided_offset(&state).await;
    let mut sink = IcebergSink::new(config(&lake, &table, 0)).await.unwrap();
    sink.recover(None).await.unwrap();
    let committer = sink.committer();
    // Each held checkpoint is pre-committed right after an orphan removal finished and committed as soon as the
    // next rewrite landed, within the orphan cut-off: its files, not yet referenced while held, never meet an
    // orphan removal that may delete them (the rule docs/worker.md gives operators, kept by the test itself).
    let removals = |spark: &mut common::SparkMaintainer| {
        spark.count("remove_orphan_files", "committed") + spark.count("remove_orphan_files", "lost")
    };
    // A rewrite that lands while the pre-commit is still reading the table is not a race with the held checkpoint:
    // counted only when the table moved past the snapshot the checkpoint's deletes were located on.
    let mut raced = 0;
    for checkpoint in 1_000_000..1_000_003 {
        let (before, waited) = (removals(&mut spark), std::time::Instant::now());
        while removals(&mut spark) == before {
            assert!(
                waited.elapsed() < Duration::from_secs(180),
                "no orphan removal of Spark's finished in 180 s before checkpoint {checkpoint}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let before = spark.count("rewrite_data_files", "committed");
        let held = std::time::Instant::now();
        let committable = pre_commit(&mut sink, checkpoint, &mut next).await;
        assert!(
            committable.deletes_based_on.is_some(),
            "located by position"
        );
        while spark.count("rewrite_data_files", "committed") == before {
            assert!(
                held.elapsed() < orphan_cut_off,
                "no rewrite of Spark's landed within the orphan cut-off ({orphan_cut_off:?}) while checkpoint \
                 {checkpoint} was held: {:?}",
                spark.progress()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let moved = lake.current_snapshot(&table).await != committable.deletes_based_on;
        raced += usize::from(moved);
        eprintln!(
            "checkpoint {checkpoint} held {:?} until a rewrite landed (after its deletes were located: {moved})",
            held.elapsed()
        );
        committer.commit(vec![committable]).await.unwrap();
    }
    assert!(
        raced > 0,
        "no rewrite of Spark's landed between a held checkpoint's pre-commit and its commit"
    );
    let done = spark.stop();
    eprintln!("Spark's maintenance beside {rounds} rounds and 3 held checkpoints: {done}");
    assert!(done["rewritten_data_files"].as_u64().unwrap() > 0, "{done}");
    assert!(done["orphans_removed"].as_u64().unwrap() > 0, "{done}");

    let expected = expected(&[(0, next)]);
    let rows = lake.spark_rows(&table).await;
    for row in &rows {
        assert_eq!(
            row.keys().collect::<Vec<_>>(),
            ["id", "v"],
            "Spark's columns"
        );
    }
    let spark_rows: Vec<(i64, String)> = rows
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["v"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        spark_rows,
        expected.clone().into_iter().collect::<Vec<_>>(),
        "Spark reads each key's last state once"
    );
    readers_see(&lake, &table, &expected, "after Spark's maintenance").await;
}

/// A `kill -9` after the row delta was written leaves a decided checkpoint whose files no snapshot references;
/// one of them is deleted while the subtask is down (as a foreign orphan removal with a short cut-off would):
/// the restart refuses to commit, naming the file and the cause, and the table stays readable as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decided_checkpoint_whose_file_was_deleted_meanwhile_is_refused_naming_it() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "gone");
    let table = lake.table(&["upserted"]);
    IcebergSink::new(config(&lake, &table, 0)).await.unwrap();
    killed_at(
        dir.path(),
        &table,
        "after-row-delta",
        UpsertDeletes::Position,
    );
    let (reader, name) = (lake.clone(), table.clone());
    let rows = move || reader.read_with(&name, "--rows");
    let seen = tokio::task::spawn_blocking(rows.clone()).await.unwrap();
    // A data file of the killed commit (not one of its delete files).
    let gone = seen["unreferenced"]
        .as_array()
        .unwrap()
        .iter()
        .map(|path| path.as_str().unwrap().to_string())
        .find(|path| !path.ends_with("del.parquet"))
        .unwrap_or_else(|| panic!("the killed commit's data files: {seen}"));
    std::fs::remove_file(gone.strip_prefix("file://").unwrap()).unwrap();

    let mut job = Driver::new(
        LocalCheckpointStore::open(dir.path().join("state"), 3).unwrap(),
        DriverConfig::default(),
    );
    job.add_sink(IcebergSink::new(config(&lake, &table, 0)).await.unwrap())
        .unwrap();
    let refused = job.start().await.unwrap_err();
    let said = connector_api::Report(&refused).to_string();
    assert_eq!(refused.kind(), ErrorKind::Fatal, "{said}");
    let name = gone.rsplit('/').next().unwrap();
    assert!(
        said.contains(name) && said.contains("remove_orphan_files"),
        "{said}"
    );
    let after = tokio::task::spawn_blocking(rows).await.unwrap();
    assert_eq!(after["rows"], seen["rows"], "nothing was committed");
    assert_eq!(
        after["snapshots"], seen["snapshots"],
        "nothing was committed"
    );
}
