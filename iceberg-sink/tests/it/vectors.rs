//! The upsert mode on format-version 3 tables: deletion vectors (Puffin `deletion-vector-v1` blobs) instead of
//! position-delete files, at most one live vector per data file. Read back by Spark with Iceberg's runtime (1.12),
//! Iceberg's Java library (IcebergGenerics), pyiceberg and DuckDB:
//!
//! - small checkpoints (5 changes over 12 keys) delete rows of one data file in several checkpoints: each new
//!   vector holds the file's earlier positions and supersedes the earlier vector in the same snapshot;
//! - Spark's own `DELETE` (a deletion vector of Spark's, merge-on-read) on a data file the sink deletes from next:
//!   the sink's vector merges Spark's, whose deleted row stays deleted;
//! - Spark's `DELETE` committed between a checkpoint's pre-commit and its commit, on data files the checkpoint
//!   deletes from: the commit merges Spark's vectors;
//! - a zombie after a take-over is fenced (as on version 2 tables);
//! - a table written with position-delete files and upgraded to version 3 by Spark: the vectors hold the
//!   position-delete files' positions (a reader ignores those files for a data file with a vector);
//! - a real `kill -9` after a merging row delta was written (nothing committed) and after it landed (its own
//!   Puffin file, merged away, not yet deleted), on a table the sink created (`format_version = 3`): the
//!   restarted job ends with each key's last state, no checkpoint in two snapshots, no file of the sink
//!   unreferenced.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use arrow_schema::{DataType, Field, Schema};
use iceberg::spec::FormatVersion;
use iceberg_sink::{IcebergSink, IcebergSinkConfig, TableLayout, UpsertDeletes};

use crate::common::{self, Lake};
use crate::upsert::{
    CHANGES, config, expected, killed_at, pre_commit_changes, readers_see, run, run_checkpoints,
};

/// Changes per checkpoint of the small runs: fewer than the 12 keys, so a data file's rows are replaced over
/// several checkpoints.
const SMALL: i64 = 5;

/// The upsert table as a format-version 3 table another writer created (the sink creates version 2 tables), with
/// Spark's deletes merge-on-read (so Spark writes deletion vectors too).
async fn version_3_table(lake: &Lake) -> String {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
    ]);
    let (_, table) = lake
        .create_foreign_table_of(
            "upserted",
            FormatVersion::V3,
            &[
                ("write.delete.mode", "merge-on-read"),
                ("write.update.mode", "merge-on-read"),
                ("write.merge.mode", "merge-on-read"),
            ],
            &schema,
        )
        .await;
    table
}

/// Runs `checkpoints` checkpoints of [`SMALL`] changes of subtask 0 (one batch each, one data file each: the
/// config's 1-byte target) from the store in `state`, each committed before the next, expiring snapshots by the
/// table's retention; returns the next offset.
async fn run_small(lake: &Lake, table: &str, state: &Path, checkpoints: i64) -> i64 {
    let config = IcebergSinkConfig {
        upsert_deletes: UpsertDeletes::Position,
        expire_snapshots: true,
        ..config(lake, table, 0)
    };
    run_checkpoints(config, (0, state), checkpoints, (SMALL, 1)).await
}

/// Every reader sees exactly `expected` in `table` (pyiceberg, DuckDB, Iceberg's Java library: [`readers_see`];
/// and Spark), its deletes are deletion vectors only, one per data file, no checkpoint is in two snapshots and no
/// file of the sink is unreferenced. Returns the live delete files as Spark lists them.
async fn assert_vectors(
    lake: &Lake,
    table: &str,
    expected: &BTreeMap<i64, String>,
    context: &str,
) -> Vec<serde_json::Value> {
    let seen = readers_see(lake, table, expected, context).await;
    assert_eq!(
        &spark_state(lake, table).await,
        expected,
        "{context}: Spark (Iceberg 1.12)"
    );
    let summaries: Vec<&serde_json::Value> = seen["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["summary"])
        .collect();
    let added = |s: &serde_json::Value, key: &str| s[key].as_str().is_some_and(|n| n != "0");
    assert!(
        summaries.iter().any(|s| added(s, "added-dvs")),
        "{context}: no snapshot added a deletion vector: {summaries:?}"
    );
    assert!(
        summaries
            .iter()
            .all(|s| !added(s, "added-position-delete-files")
                && !added(s, "added-equality-delete-files")),
        "{context}: a position-delete or equality-delete file in a format-version 3 table: {summaries:?}"
    );
    assert_eq!(
        common::checkpoints_in_two_snapshots(seen["snapshots"].as_array().unwrap()),
        Vec::<String>::new(),
        "{context}: checkpoints in two snapshots"
    );
    assert_eq!(
        seen["unreferenced"],
        serde_json::json!([]),
        "{context}: files of the sink no snapshot references"
    );
    let deletes = lake.spark_delete_files(table).await;
    let mut referenced = BTreeSet::new();
    for file in &deletes {
        assert_eq!(file["file_format"], "PUFFIN", "{context}: {file}");
        let data_file = file["referenced_data_file"].as_str().unwrap().to_string();
        assert!(
            referenced.insert(data_file.clone()),
            "{context}: two live deletion vectors for {data_file}: {deletes:?}"
        );
    }
    deletes
}

/// What Spark (Iceberg 1.12's runtime) reads of `table`: `id` -> `v`.
pub(crate) async fn spark_state(lake: &Lake, table: &str) -> BTreeMap<i64, String> {
    lake.spark_rows(table)
        .await
        .into_iter()
        .map(|row| {
            (
                row["id"].as_i64().unwrap(),
                row["v"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The sink's Puffin files in `table`'s data directory (a local warehouse) that no retained snapshot reads and
/// none of them superseded: a superseded vector's file is deleted once expiry retired every snapshot before the
/// superseding one, so only the files a retained snapshot superseded may stay unread.
async fn puffins_kept_past_their_last_reader(lake: &Lake, table: &str) -> Vec<String> {
    let catalog = lake.catalog.open("ratchet", &lake.s3).await.unwrap();
    let ident = iceberg::TableIdent::from_strs(table.split('.')).unwrap();
    let loaded = catalog.load_table(&ident).await.unwrap();
    let retained: BTreeSet<i64> = loaded
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    let mut named = BTreeSet::new();
    for snapshot in loaded.metadata().snapshots() {
        let list = loaded.manifest_list_reader(snapshot).load().await.unwrap();
        for manifest in list.entries() {
            let manifest = manifest.load_manifest(loaded.file_io()).await.unwrap();
            named.extend(
                manifest
                    .entries()
                    .iter()
                    .filter(|e| {
                        e.is_alive() || e.snapshot_id().is_some_and(|id| retained.contains(&id))
                    })
                    .map(|e| e.file_path().rsplit('/').next().unwrap().to_string()),
            );
        }
    }
    let data = format!("{}/data", loaded.metadata().location());
    let mut unread: Vec<String> = std::fs::read_dir(data.strip_prefix("file://").unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("ratchet.") && name.ends_with(".puffin"))
        .filter(|name| !named.contains(name))
        .collect();
    unread.sort();
    unread
}

/// The name of a delete file's path.
fn name(file: &serde_json::Value) -> &str {
    file["file_path"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_vectors_merge_per_data_file_across_checkpoints_and_with_sparks_own() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "vectors");
    let table = version_3_table(&lake).await;
    // Two snapshots kept: superseded vectors' files must go once the snapshots naming them are expired (the
    // readers' check that no file of the sink is unreferenced).
    lake.set_retention(&table, 2).await;
    let state = dir.path().join("state");

    // Keys 0-4, 5-9, 10,11,0-2, 3-7, ...: the rows of the first checkpoint's file go in the third and fourth.
    let next = run_small(&lake, &table, &state, 6).await;
    let deletes = assert_vectors(&lake, &table, &expected(&[(0, next)]), "own checkpoints").await;
    assert!(
        deletes.iter().any(|f| name(f).contains("-dv-s")),
        "no vector was merged with an earlier one: {deletes:?}"
    );

    // Spark deletes a key (a vector of its own on the key's data file); the next checkpoints replace keys there.
    let mut now = expected(&[(0, next)]);
    let victim = *now.keys().next().unwrap();
    let after = lake.spark_delete(&table, &format!("id = {victim}")).await;
    let sparks: Vec<&serde_json::Value> = after
        .iter()
        .filter(|f| !name(f).starts_with("ratchet."))
        .collect();
    assert_eq!(
        sparks.len(),
        1,
        "Spark's delete wrote one vector: {after:?}"
    );
    now.remove(&victim);
    assert_eq!(
        lake.spark_rows(&table).await.len(),
        now.len(),
        "Spark's delete"
    );
    let next = run_small(&lake, &table, &state, 4).await;
    let deletes = assert_vectors(
        &lake,
        &table,
        &expected(&[(0, next)]),
        "after Spark's delete",
    )
    .await;
    // Superseded before the two retained snapshots: deleted (without the retirement, each one stays).
    assert_eq!(
        puffins_kept_past_their_last_reader(&lake, &table).await,
        Vec::<String>::new(),
        "superseded vectors' files that no retained snapshot reads or superseded"
    );
    assert!(
        deletes.iter().all(|f| name(f).starts_with("ratchet.")),
        "Spark's vector was not merged into the sink's: {deletes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_at_each_step_of_a_merging_row_delta_loses_nothing_and_doubles_nothing() {
    test_support::Services::get();
    for step in ["after-row-delta", "after-own-commit"] {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::sqlite_local(dir.path(), "killed");
        // Created by the sink, as the job file's `format_version = 3` asks.
        let table = lake.table(&["upserted"]);
        let creating = IcebergSinkConfig {
            layout: TableLayout {
                format_version: Some(3),
                ..TableLayout::default()
            },
            ..config(&lake, &table, 0)
        };
        IcebergSink::new(creating).await.unwrap();
        assert_eq!(
            lake.format_version(&table).await,
            FormatVersion::V3,
            "format_version = 3"
        );
        // Not compacted (a table the sink created would be by default): the merged vector this test looks for
        // would go with its data file (compaction of version 3 tables: tests/it/upsert_compaction.rs).
        lake.forget_creator(&table).await;
        let state = dir.path().join("state");
        // Rows spread over files that already have vectors: the child's first checkpoint (every key) merges.
        let before = run_small(&lake, &table, &state, 4).await;
        killed_at(dir.path(), &table, step, UpsertDeletes::Position);
        let next = run(&lake, &table, (0, UpsertDeletes::Position), &state, 2).await;
        let decided = common::decided_offset(&state).await;
        assert_eq!(next, decided, "{step}: the last checkpoint is decided");
        assert!(
            next > before + 2 * CHANGES,
            "{step}: the killed run's first checkpoint counts"
        );
        let deletes = assert_vectors(&lake, &table, &expected(&[(0, next)]), step).await;
        assert!(
            deletes.iter().any(|f| name(f).contains("-dv-s")),
            "{step}: no vector was merged: {deletes:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_after_a_take_over_is_fenced_on_a_version_3_table() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "zombie");
    let table = version_3_table(&lake).await;
    crate::upsert::a_zombie_is_fenced(&lake, &table).await;
    let deletes = lake.spark_delete_files(&table).await;
    assert!(
        !deletes.is_empty() && deletes.iter().all(|f| f["file_format"] == "PUFFIN"),
        "{deletes:?}"
    );
}

/// Spark deletes keys by vectors of its own between a checkpoint's pre-commit and its commit, in data files the
/// checkpoint deletes from too (one already holding the sink's vector): the commit merges Spark's vectors into
/// its own, so Spark's deleted row stays deleted and each data file keeps one vector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vector_another_writer_commits_between_a_pre_commit_and_its_commit_is_merged() {
    use connector_api::{Committer, TwoPhaseCommit};
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "raced");
    let table = version_3_table(&lake).await;
    let mut sink = IcebergSink::new(config(&lake, &table, 0)).await.unwrap();
    sink.recover(None).await.unwrap();
    let mut next = 0;
    // Files A (keys 0-4), B (5-9), C (10, 11, 0-2; A gets the sink's vector).
    for checkpoint in 1..=3 {
        let committable = pre_commit_changes(&mut sink, checkpoint, &mut next, SMALL).await;
        sink.committer().commit(vec![committable]).await.unwrap();
    }
    // Keys 3-7: deletes from A (which has a vector) and B (which has none yet).
    let decided = pre_commit_changes(&mut sink, 4, &mut next, SMALL).await;
    let sparks = lake.spark_delete(&table, "id IN (3, 8)").await;
    assert!(
        sparks.iter().any(|f| !name(f).starts_with("ratchet.")),
        "Spark wrote vectors: {sparks:?}"
    );
    sink.committer().commit(vec![decided]).await.unwrap();
    let mut now = expected(&[(0, next)]);
    // Key 8 (not in checkpoint 4) stays deleted; key 3, deleted by Spark first, has checkpoint 4's row.
    now.remove(&8);
    let deletes = assert_vectors(&lake, &table, &now, "Spark's delete in between").await;
    assert!(
        deletes.iter().all(|f| name(f).starts_with("ratchet.")),
        "Spark's vectors were not merged into the checkpoint's: {deletes:?}"
    );
}

/// A table the sink wrote with position-delete files (format version 2) and Spark then upgraded to version 3: a
/// reader ignores a data file's position-delete files once it has a vector, so the sink's first vector for a data
/// file holds the positions those files deleted from it; no row they deleted comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_upgraded_from_version_2_keeps_its_position_deletes_inside_the_vectors() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "upgraded");
    let table = lake.table(&["upserted"]);
    IcebergSink::new(config(&lake, &table, 0)).await.unwrap();
    let state = dir.path().join("state");
    // Position-delete files naming rows of the first two checkpoints' files (keys 0-4 and 5-9).
    run_small(&lake, &table, &state, 4).await;
    let before = lake.spark_upgrade_to_version_3(&table).await;
    assert!(
        !before.is_empty() && before.iter().all(|f| f["file_format"] == "PARQUET"),
        "position-delete files before the upgrade: {before:?}"
    );
    assert_eq!(lake.format_version(&table).await, FormatVersion::V3);
    // Keys 8-11, 0-2, ...: vectors for files the position-delete files also name.
    let next = run_small(&lake, &table, &state, 3).await;
    let now = expected(&[(0, next)]);
    readers_see(&lake, &table, &now, "after the upgrade").await;
    assert_eq!(
        spark_state(&lake, &table).await,
        now,
        "Spark after the upgrade"
    );
    let deletes = lake.spark_delete_files(&table).await;
    assert!(
        deletes.iter().any(|f| f["file_format"] == "PUFFIN"),
        "vectors after the upgrade: {deletes:?}"
    );
}
