//! Compaction of upsert tables inside the sink's commits (`compact` with `upsert_deletes = "position"`): small
//! data files rewritten without their deleted rows, files whose rows are all deleted removed, position-delete
//! files that name nothing live any more removed with them, the key index following the moved rows. Read back by
//! pyiceberg, DuckDB, Iceberg's Java library and Spark with Iceberg's runtime (1.12):
//!
//! - long runs of small checkpoints (rows of a file replaced over several checkpoints) and of checkpoints that
//!   replace every key (whole files dead), across restarts: each key's last state, fewer live files than
//!   checkpoints, delete files removed;
//! - a real `kill -9` after the rewrite (before the checkpoint is decided), after the compacting snapshot was
//!   written (before the swap) and after it landed: the restarted job ends with each key's last state, no
//!   checkpoint in two snapshots, no file of the sink unreferenced; the same three kills in a compaction that
//!   rewrites the file the checkpoint being pre-committed deletes from (its deleted rows dropped from the outputs);
//! - Spark deleting rows of the files a pre-committed compaction rewrote, before its commit: the commit drops the
//!   compaction (its outputs would bring the rows back), and later compactions apply Spark's deletes;
//! - a checkpoint pre-committed before the previous one's compaction landed (its deletes reach the copies too);
//! - Spark's maintenance procedures in a loop beside kills;
//! - a zombie's compacting commit after a take-over, fenced;
//! - files of any size with many replaced rows rewritten without them (`delete_ratio_threshold`), or that many
//!   delete files name (`delete_file_threshold`), also a file every checkpoint deletes from;
//! - a catalog that stops answering (Toxiproxy's blackhole) at a compacting commit.

use std::collections::BTreeMap;
use std::path::Path;

use iceberg::spec::{DataContentType, FormatVersion};
use iceberg_sink::{Compact, CompactPolicy, IcebergSink, IcebergSinkConfig, UpsertDeletes};

use crate::common::{self, Lake};
use crate::upsert::{CHANGES, config, expected, pre_commit_changes, readers_see, run_checkpoints};
use crate::vectors::spark_state;

/// Changes per checkpoint of the small runs: fewer than the 12 keys, so a data file's rows are replaced over
/// several checkpoints and compactions rewrite files with live rows.
const SMALL: i64 = 5;

const CHILD_DIR: &str = "RATCHET_ICEBERG_UPSERT_COMPACTION_CHILD";
const CHILD_TABLE: &str = "RATCHET_ICEBERG_UPSERT_COMPACTION_TABLE";
/// Set (to anything) when the child's table is one of format version 3 (deletion vectors).
const CHILD_V3: &str = "RATCHET_ICEBERG_UPSERT_COMPACTION_V3";

/// The upsert sink of subtask 0 on `table` (a data file per batch), compacting when `min_input_files` small files
/// of a tier are live, expiring snapshots by the table's retention.
fn compacting(lake: &Lake, table: &str, min_input_files: usize) -> IcebergSinkConfig {
    IcebergSinkConfig {
        upsert_deletes: UpsertDeletes::Position,
        expire_snapshots: true,
        compact: Compact::On(CompactPolicy {
            target_file_size: 1 << 20,
            min_input_files,
            ..Default::default()
        }),
        ..config(lake, table, 0)
    }
}

/// Checkpoint `checkpoint` of `batch` through `sink` (recovered), committed at once: begin, write, pre-commit and
/// the committer's commit, each unwrapped (a failing step fails the test there).
async fn commit_batch(sink: &mut IcebergSink, checkpoint: u64, batch: &arrow_array::RecordBatch) {
    use connector_api::{CheckpointId, Committer, TwoPhaseCommit};
    sink.begin(CheckpointId(checkpoint)).await.unwrap();
    sink.write(batch).await.unwrap();
    let committable = sink.pre_commit(CheckpointId(checkpoint)).await.unwrap();
    sink.committer().commit(vec![committable]).await.unwrap();
}

/// Upserts (operation `u`) of the rows (`id`, `v`) of `rows`, in the change schema of the upsert tests.
fn upsert_batch(rows: &[(i64, String)]) -> arrow_array::RecordBatch {
    use arrow_array::{Int64Array, StringArray};
    use std::sync::Arc;
    arrow_array::RecordBatch::try_new(
        crate::upsert::change_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.1.as_str()),
            )),
            Arc::new(StringArray::from(vec!["u"; rows.len()])),
        ],
    )
    .unwrap()
}

/// Subtask 0's changes at each range of `offsets` (`crate::upsert::changes`), a checkpoint each from 1, committed
/// through [`commit_batch`]; returns each key's last state after them.
async fn commit_changes(
    sink: &mut IcebergSink,
    offsets: &[std::ops::Range<i64>],
) -> BTreeMap<i64, String> {
    let mut expected = BTreeMap::new();
    for (checkpoint, range) in (1..).zip(offsets) {
        commit_batch(sink, checkpoint, &crate::upsert::changes(0, range.clone())).await;
        for n in range.clone() {
            let (key, op, value) = crate::upsert::change(0, n);
            match op {
                "d" => expected.remove(&key),
                _ => expected.insert(key, value),
            };
        }
    }
    expected
}

/// The live entries (data and delete files) of `table`'s current snapshot, read from its manifests.
async fn live_entries(lake: &Lake, table: &str) -> Vec<iceberg::spec::DataFile> {
    let catalog = lake.catalog.open("ratchet", &lake.s3).await.unwrap();
    let ident = iceberg::TableIdent::from_strs(table.split('.')).unwrap();
    let loaded = catalog.load_table(&ident).await.unwrap();
    let snapshot = loaded.metadata().current_snapshot().unwrap();
    let list = loaded.manifest_list_reader(snapshot).load().await.unwrap();
    let mut live = Vec::new();
    for manifest in list.entries() {
        let manifest = manifest.load_manifest(loaded.file_io()).await.unwrap();
        live.extend(
            manifest
                .entries()
                .iter()
                .filter(|e| e.is_alive())
                .map(|e| e.data_file().clone()),
        );
    }
    live
}

/// The live data files and delete files of `table`'s current snapshot, counted from its manifests.
async fn live_files(lake: &Lake, table: &str) -> (usize, usize) {
    let live = live_entries(lake, table).await;
    let data = live
        .iter()
        .filter(|f| f.content_type() == DataContentType::Data)
        .count();
    (data, live.len() - data)
}

/// The data files the live deletion vectors of `table`'s current snapshot name that the snapshot does not hold
/// live (a vector committed for a file the same or an earlier snapshot removed).
async fn vectors_of_removed_files(lake: &Lake, table: &str) -> Vec<String> {
    let live = live_entries(lake, table).await;
    let (data, deletes): (Vec<_>, Vec<_>) = live
        .iter()
        .partition(|f| f.content_type() == DataContentType::Data);
    let data: std::collections::BTreeSet<&str> = data.iter().map(|f| f.file_path()).collect();
    deletes
        .iter()
        .filter(|f| f.file_format() == iceberg::spec::DataFileFormat::Puffin)
        .filter_map(|f| f.referenced_data_file())
        .filter(|path| !data.contains(path.as_str()))
        .collect()
}

/// The summaries of the sink's snapshots of `seen` (the verifier's) that replaced data files.
fn compacting_summaries(seen: &serde_json::Value) -> Vec<&serde_json::Value> {
    seen["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["summary"])
        .filter(|s| {
            s.get(iceberg_sink::CHECKPOINT_PROPERTY).is_some()
                && s["deleted-data-files"].as_str().is_some_and(|n| n != "0")
        })
        .collect()
}

/// Every reader sees exactly `expected` (pyiceberg, DuckDB, Iceberg's Java library; Spark when `spark`), no
/// snapshot holds equality deletes, no checkpoint is in two snapshots and no file of the sink is unreferenced.
/// Returns the verifier's answer.
async fn assert_reads(
    lake: &Lake,
    table: &str,
    expected: &BTreeMap<i64, String>,
    spark: bool,
    context: &str,
) -> serde_json::Value {
    let seen = readers_see(lake, table, expected, context).await;
    if spark {
        assert_eq!(
            &spark_state(lake, table).await,
            expected,
            "{context}: Spark (Iceberg 1.12)"
        );
    }
    let snapshots = seen["snapshots"].as_array().unwrap();
    assert!(
        snapshots
            .iter()
            .all(|s| s["summary"]["added-equality-delete-files"]
                .as_str()
                .is_none_or(|n| n == "0")),
        "{context}: equality deletes: {snapshots:?}"
    );
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
    seen
}

/// Fifteen small checkpoints (rows of a file replaced over several of them), then, after a restart (the key index
/// rebuilt), fifteen that replace every key (whole files dead): compactions rewrite the files with live rows,
/// remove the dead ones and the delete files naming only them, and every reader sees each key's last state.
/// Without compaction the table would hold a data file and a delete file per checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upsert_tables_small_files_compact_inside_the_commits_and_each_keys_last_state_reads_back()
 {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "compacted");
    let table = lake.table(&["upserted"]);
    let state = dir.path().join("state");
    let config = compacting(&lake, &table, 3);
    let next = run_checkpoints(config.clone(), (0, &state), 15, (SMALL, 1)).await;
    let seen = assert_reads(
        &lake,
        &table,
        &expected(&[(0, next)]),
        true,
        "small checkpoints",
    )
    .await;
    let compactions = compacting_summaries(&seen);
    assert!(
        compactions
            .iter()
            .any(|s| s["added-data-files"].as_str().is_some_and(|n| n != "0")
                && s["deleted-records"].as_str().is_some_and(|n| n != "0")),
        "no compaction rewrote live rows: {compactions:?}"
    );
    assert!(
        compactions
            .iter()
            .any(|s| s["removed-position-delete-files"]
                .as_str()
                .is_some_and(|n| n != "0")),
        "no compaction removed a delete file: {compactions:?}"
    );
    let (data, deletes) = live_files(&lake, &table).await;
    assert!(
        data < 8 && deletes < 8,
        "after 15 checkpoints of a data file each (half of them at most may stay): {data} data files, {deletes} delete files live"
    );

    // Every key replaced in every checkpoint, three batches (data files) each.
    let before = next;
    let next = run_checkpoints(config, (0, &state), 15, (CHANGES, 3)).await;
    assert_eq!(next, before + 15 * CHANGES);
    assert_reads(
        &lake,
        &table,
        &expected(&[(0, next)]),
        true,
        "whole files replaced",
    )
    .await;
    let (data, deletes) = live_files(&lake, &table).await;
    assert!(
        data < 15 && deletes < 15,
        "after 15 more checkpoints of three data files each: {data} data files, {deletes} delete files live"
    );
}

/// With a 1 KiB target every file the sink writes is at or above the small size, so the only rewrites are of files
/// at least 30% of whose rows were replaced (`delete_ratio_threshold`'s default), one per look, and the removal of
/// files whose rows all were. The first checkpoint writes 10 keys (two of its 12 changes are deletes) into one file;
/// the later ones change only keys 0-4, so that file keeps 6 live rows of 10 (40% replaced) that no later checkpoint
/// deletes from: a look rewrites it into a file of those 6 rows. Each key's last state reads back, in Spark too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upsert_tables_files_with_many_replaced_rows_are_rewritten_whatever_their_size() {
    use connector_api::TwoPhaseCommit;
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "heavy");
    let table = lake.table(&["upserted"]);
    let config = IcebergSinkConfig {
        compact: Compact::On(CompactPolicy {
            target_file_size: 1024,
            min_input_files: 2,
            ..Default::default()
        }),
        ..compacting(&lake, &table, 2)
    };
    let mut sink = IcebergSink::new(config).await.unwrap();
    sink.recover(None).await.unwrap();
    let offsets: Vec<std::ops::Range<i64>> = std::iter::once(0..12)
        .chain((1..8).map(|c| 12 * c..12 * c + 5))
        .collect();
    let expected = commit_changes(&mut sink, &offsets).await;
    let seen = assert_reads(
        &lake,
        &table,
        &expected,
        true,
        "a file with many replaced rows",
    )
    .await;
    // A compacting snapshot adds the checkpoint's one file; more is a rewritten file's output, here the first
    // checkpoint's file without its replaced rows.
    let compactions = compacting_summaries(&seen);
    assert!(
        compactions.iter().any(|s| s["added-data-files"]
            .as_str()
            .is_some_and(|n| n.parse::<u32>().unwrap() >= 2)
            && s["deleted-records"]
                .as_str()
                .is_some_and(|n| n.parse::<u32>().unwrap() >= 10)),
        "the file with 4 of 10 rows replaced was not rewritten: {compactions:?}"
    );
    let (data, _) = live_files(&lake, &table).await;
    // Without compaction all 8 would stay live (a file whose rows are all deleted stays until a rewrite).
    assert!(
        data * 2 <= offsets.len(),
        "{} checkpoints of a data file each: {data} data files live",
        offsets.len()
    );
}

/// A small file that `delete_file_threshold` delete files name is rewritten without its replaced rows, before
/// its size tier fills and whatever their share: the pile-up a simulated day of 1 s upserts showed (position-delete
/// files naming the older, compacted files grew by one per checkpoint, 800 after three hours). The first checkpoint
/// writes 10 keys into one file; the next two each replace one of its rows (a delete file naming it each); with
/// the threshold at 2, the look at the fifth checkpoint (one every 4) rewrites that file and removes the two delete
/// files. Neither other rule could: the ratio threshold is 1 and four files fill no tier of 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_file_that_many_delete_files_name_is_rewritten_before_its_tier_fills() {
    use connector_api::TwoPhaseCommit;
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "named");
    let table = lake.table(&["upserted"]);
    let config = IcebergSinkConfig {
        compact: Compact::On(CompactPolicy {
            min_input_files: 4,
            delete_ratio_threshold: 1.0,
            delete_file_threshold: 2,
            ..Default::default()
        }),
        ..compacting(&lake, &table, 4)
    };
    let mut sink = IcebergSink::new(config).await.unwrap();
    sink.recover(None).await.unwrap();
    // Keys 0 and 1 replaced one per checkpoint, then both again (their rows are no longer in the first file, which
    // the look may therefore rewrite: not a file the checkpoint deletes from), then key 2 (its row moved by the
    // rewrite).
    let offsets = [0..12, 12..13, 13..14, 36..37, 37..38, 26..27];
    let expected = commit_changes(&mut sink, &offsets).await;
    let seen = assert_reads(
        &lake,
        &table,
        &expected,
        false,
        "a small file two delete files name",
    )
    .await;
    let compactions = compacting_summaries(&seen);
    let count =
        |s: &serde_json::Value, key: &str| s[key].as_str().map_or(0, |n| n.parse::<u32>().unwrap());
    assert!(
        // Only that file has 10 rows (the others 1, and a file whose row was replaced goes with it).
        compactions
            .iter()
            .any(|s| count(s, "removed-position-delete-files") >= 2
                && count(s, "deleted-records") >= 10),
        "the first checkpoint's file (10 rows, two delete files naming it) was not rewritten: {compactions:?}"
    );
}

/// Keys replaced in the order they were written, two per checkpoint: every checkpoint deletes from the first
/// checkpoint's file, so no look finds it free of the checkpoint being pre-committed. The look takes it anyway
/// and drops the rows that checkpoint deletes as well (its delete file, committed by the same snapshot, then names
/// only removed rows). Before, the file was never rewritten while the replacements went on, and its delete files
/// piled up by one per checkpoint (a simulated day: 800 after three hours, on one compacted file). Each key's last
/// state reads back in every reader, Spark's too, and the table holds a bounded number of delete files: those
/// born naming only removed rows go too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_every_checkpoint_deletes_from_is_still_rewritten_and_its_delete_files_go() {
    use connector_api::TwoPhaseCommit;
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "sequential");
    let table = lake.table(&["upserted"]);
    let config = IcebergSinkConfig {
        compact: Compact::On(CompactPolicy {
            min_input_files: 4,
            delete_file_threshold: 4,
            ..Default::default()
        }),
        ..compacting(&lake, &table, 4)
    };
    let mut sink = IcebergSink::new(config).await.unwrap();
    sink.recover(None).await.unwrap();
    let mut expected = BTreeMap::new();
    let checkpoints: Vec<std::ops::Range<i64>> = std::iter::once(0..100)
        .chain((0..48).map(|c| 2 * c..2 * c + 2))
        .collect();
    for (checkpoint, ids) in (1..).zip(checkpoints) {
        let rows: Vec<(i64, String)> = ids.map(|id| (id, format!("{id}@{checkpoint}"))).collect();
        commit_batch(&mut sink, checkpoint, &upsert_batch(&rows)).await;
        expected.extend(rows);
    }
    let seen = assert_reads(
        &lake,
        &table,
        &expected,
        true,
        "keys replaced in the order they were written",
    )
    .await;
    let compactions = compacting_summaries(&seen);
    assert!(
        compactions.iter().any(|s| s["deleted-records"]
            .as_str()
            .is_some_and(|n| n.parse::<u32>().unwrap() >= 100)),
        "the first checkpoint's file (100 rows, deleted from by every checkpoint) was never rewritten: \
         {compactions:?}"
    );
    // A rewrite every few looks, and the delete file of the checkpoint whose snapshot rewrote the file (it names
    // only removed rows from birth) removed by a later compaction, unread, by its bounds.
    let (_, deletes) = live_files(&lake, &table).await;
    assert!(
        deletes <= 8,
        "48 checkpoints deleting from one file: {deletes} delete files live"
    );
}

/// Keys of the sequential stream: its first checkpoint writes them all.
const SEQUENTIAL_KEYS: i64 = 40;

/// The upsert at offset `n` of the sequential stream: key `n % 40`, the value naming the offset. Offsets 0..40
/// (the first checkpoint) write keys 0..40; each later checkpoint replaces the next two keys in the order they were
/// written, so until key 39 is replaced every checkpoint deletes from the rows of the first one.
fn sequential_upsert(n: i64) -> (i64, String) {
    (n % SEQUENTIAL_KEYS, n.to_string())
}

/// Each key's last state after the sequential stream's offsets `0..upto`.
fn sequential_expected(upto: i64) -> BTreeMap<i64, String> {
    (0..upto).map(sequential_upsert).collect()
}

/// [`compacting`] at 4 files, rewriting a file once 2 delete files name it (`delete_file_threshold`): the first
/// look that finds the first checkpoint's file deleted from (the fifth checkpoint's) rewrites it.
/// On a table of format version 3 (deletion vectors) when `v3`.
fn sequential_config(lake: &Lake, table: &str, v3: bool) -> IcebergSinkConfig {
    let config = IcebergSinkConfig {
        compact: Compact::On(CompactPolicy {
            target_file_size: 1 << 20,
            min_input_files: 4,
            delete_file_threshold: 2,
            ..Default::default()
        }),
        ..compacting(lake, table, 4)
    };
    with_version(config, v3)
}

/// Runs `checkpoints` checkpoints of the sequential stream ([`sequential_upsert`]) with the sink of `config` from
/// the store in `state`, each committed before the next (the first at offset 0 of all the keys, each later one of
/// two); returns the next offset.
async fn run_sequential(config: IcebergSinkConfig, state: &Path, checkpoints: usize) -> i64 {
    let (mut job, sink, restored) = common::started(state, &config).await;
    let mut next = restored.positions.first().map_or(0, |p| p.next_offset);
    for _ in 0..checkpoints {
        let upto = SEQUENTIAL_KEYS.max(next + 2);
        let rows: Vec<(i64, String)> = (next..upto).map(sequential_upsert).collect();
        job.write(sink, &upsert_batch(&rows)).await.unwrap();
        next = upto;
        job.checkpoint(ratchet_conformance::conformance_positions(next))
            .await
            .unwrap();
        job.finish_commit().await.unwrap();
    }
    job.close().await.unwrap();
    next
}

/// The lake, table and checkpoint store of a kill test's child (from `CHILD_DIR` and `CHILD_TABLE`), or `None`
/// in a normal test run (the variables unset).
fn child_setup() -> Option<(Lake, String, std::path::PathBuf)> {
    let (Ok(dir), Ok(table)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_TABLE)) else {
        return None;
    };
    let dir = Path::new(&dir);
    Some((Lake::sqlite_local(dir, "child"), table, dir.join("state")))
}

/// Runs the kill test's child `child` on the store under `dir` and its `table` (format version 3 when `v3`) with
/// the drill at `step`, and asserts that it died there ([`common::killed_child`]).
fn kill_child_at(child: &str, (dir, table, v3): (&Path, &str, bool), step: &str) {
    let path = dir.to_str().unwrap();
    let mut env = vec![(CHILD_DIR, path), (CHILD_TABLE, table)];
    if v3 {
        env.push((CHILD_V3, "1"));
    }
    common::killed_child(child, &env, step);
}

/// `step` named with the table's format version when it is 3, for assertion messages.
fn with_version_label(step: &str, v3: bool) -> String {
    format!("{step}{}", if v3 { " (format version 3)" } else { "" })
}

/// The child of the sequential kill test: 12 checkpoints of the sequential stream (compacting at 4 files) of the
/// table in `CHILD_TABLE` (format version 3 with `CHILD_V3`) from the store under `CHILD_DIR`; the drill in its
/// environment kills it at its step. Returns at once in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_child() {
    let Some((lake, table, state)) = child_setup() else {
        return;
    };
    let v3 = std::env::var(CHILD_V3).is_ok();
    run_sequential(sequential_config(&lake, &table, v3), &state, 12).await;
}

/// A real `kill -9` at each step of a compaction that rewrites a file the checkpoint being pre-committed deletes
/// from: that checkpoint's deleted rows are dropped from the outputs and its delete file, committed in the same
/// snapshot, names only removed rows (format version 2), or its deletion vectors of the removed files are left out
/// (version 3: none may name a file no longer live). In the sequential stream every checkpoint deletes from the first one's file
/// (40 rows, then its rewrites), so the first compaction of the run (the look at the fifth checkpoint, 2 delete files naming that file:
/// [`sequential_config`]) is such a rewrite, where the child dies: after the rewrite (before the checkpoint is decided),
/// after the compacting snapshot was written (before the swap), and after it landed. The restarted job ends with
/// each key's last state in every reader (Spark after the last step), the file rewritten, no checkpoint in two
/// snapshots, no file of the sink unreferenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_at_each_step_of_rewriting_the_file_the_checkpoint_deletes_from_keeps_each_key_once()
 {
    test_support::Services::get();
    let steps = [
        "after-compacting",
        "after-replacing",
        "after-compacted-commit",
    ];
    let runs = [false, true]
        .into_iter()
        .flat_map(|v3| steps.into_iter().map(move |step| (step, v3)));
    for (step, v3) in runs {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::sqlite_local(dir.path(), "killed");
        let table = lake.table(&["sequential"]);
        IcebergSink::new(sequential_config(&lake, &table, v3))
            .await
            .unwrap();
        kill_child_at(
            "upsert_compaction::sequential_child",
            (dir.path(), &table, v3),
            step,
        );
        let state = dir.path().join("state");
        let next = run_sequential(sequential_config(&lake, &table, v3), &state, 8).await;
        let step = with_version_label(step, v3);
        let step = step.as_str();
        assert_eq!(next, common::decided_offset(&state).await, "{step}");
        assert!(
            next < 2 * SEQUENTIAL_KEYS,
            "{step}: the run went past the first file's keys ({next})"
        );
        // Spark at the last step of each format version.
        let spark = step.starts_with("after-compacted-commit");
        let seen = assert_reads(&lake, &table, &sequential_expected(next), spark, step).await;
        let compactions = compacting_summaries(&seen);
        assert!(
            compactions.iter().any(|s| s["deleted-records"]
                .as_str()
                .is_some_and(|n| n.parse::<i64>().unwrap() >= SEQUENTIAL_KEYS - 4)),
            "{step}: the first checkpoint's file was never rewritten: {compactions:?}"
        );
        assert_eq!(
            vectors_of_removed_files(&lake, &table).await,
            Vec::<String>::new(),
            "{step}: deletion vectors naming data files no longer live"
        );
    }
}

/// `config` creating its table as format version 3 (deletion vectors) when `v3`.
fn with_version(config: IcebergSinkConfig, v3: bool) -> IcebergSinkConfig {
    IcebergSinkConfig {
        layout: iceberg_sink::TableLayout {
            format_version: v3.then_some(3),
            ..config.layout.clone()
        },
        ..config
    }
}

/// [`compacting`] at 2 files, on a table the sink creates as format version 3 (deletion vectors) when `v3`.
fn compacting_as(lake: &Lake, table: &str, v3: bool) -> IcebergSinkConfig {
    with_version(compacting(lake, table, 2), v3)
}

/// The child of the kill test: runs 8 small checkpoints (compacting at 2 files) of the table in `CHILD_TABLE`
/// (format version 3 with `CHILD_V3`) from the store under `CHILD_DIR`; the drill in its environment kills it at
/// its step. Returns at once in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let Some((lake, table, state)) = child_setup() else {
        return;
    };
    let config = compacting_as(&lake, &table, std::env::var(CHILD_V3).is_ok());
    run_checkpoints(config, (0, &state), 8, (SMALL, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_at_each_step_of_a_compacting_upsert_commit_loses_nothing_and_doubles_nothing() {
    test_support::Services::get();
    // Each step on a version 2 table (position deletes) and on a version 3 table (deletion vectors: the rewrite
    // carries row lineage, the delete manifests a vector commit rewrote hold the vectors removed with the inputs).
    let steps = [
        ("after-compacting", false),
        ("after-replacing", false),
        ("after-compacted-commit", false),
        ("after-compacting", true),
        ("after-replacing", true),
        ("after-compacted-commit", true),
    ];
    for (i, (step, v3)) in steps.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::sqlite_local(dir.path(), "killed");
        let table = lake.table(&["upserted"]);
        IcebergSink::new(compacting_as(&lake, &table, v3))
            .await
            .unwrap();
        kill_child_at("upsert_compaction::child", (dir.path(), &table, v3), step);
        let state = dir.path().join("state");
        let config = compacting_as(&lake, &table, v3);
        let next = run_checkpoints(config, (0, &state), 4, (SMALL, 1)).await;
        let step = with_version_label(step, v3);
        let step = step.as_str();
        assert_eq!(next, common::decided_offset(&state).await, "{step}");
        // Spark once (it takes a while to start); the other readers after every step.
        let spark = i + 1 == steps.len();
        let seen = assert_reads(&lake, &table, &expected(&[(0, next)]), spark, step).await;
        assert!(
            !compacting_summaries(&seen).is_empty(),
            "{step}: no compaction landed"
        );
    }
}

/// Commits checkpoints of [`SMALL`] changes through `sink` (recovered) until a pre-commit carries a compaction that
/// copies live rows; returns that committable (not committed), the number of rows it copies, its checkpoint and the
/// next offset.
async fn pre_commit_until_compacting(
    sink: &mut IcebergSink,
) -> (iceberg_sink::IcebergCommittable, u64, u64, i64) {
    use connector_api::{Committer, TwoPhaseCommit};
    let mut next = 0;
    for checkpoint in 1..12 {
        let committable = pre_commit_changes(sink, checkpoint, &mut next, SMALL).await;
        let rows = committable.compaction.as_ref().map_or(0, |c| {
            c.outputs
                .iter()
                .map(|f| {
                    let file: serde_json::Value = serde_json::from_str(&f.data_file).unwrap();
                    file["record_count"].as_u64().unwrap()
                })
                .sum::<u64>()
        });
        if rows > 0 {
            return (committable, rows, checkpoint, next);
        }
        // No compaction, or one of dead files only: it lands; look again.
        sink.committer().commit(vec![committable]).await.unwrap();
    }
    panic!("no pre-commit compacted files with live rows in 11 checkpoints");
}

/// The driver pre-commits a checkpoint before the previous one's commit has landed. Here the previous one carries a
/// compaction: the next checkpoint finds its keys' rows in the compaction's inputs (the index moves them only once
/// the table shows the compaction) and deletes both those rows and their copies, so once both commits land no
/// key shows twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_pre_committed_before_a_compaction_lands_deletes_the_copied_rows_too() {
    use connector_api::{Committer, TwoPhaseCommit};
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "pipelined");
    let table = lake.table(&["upserted"]);
    let mut sink = IcebergSink::new(compacting(&lake, &table, 2))
        .await
        .unwrap();
    sink.recover(None).await.unwrap();
    let (compacting, _, checkpoint, mut next) = pre_commit_until_compacting(&mut sink).await;
    // The next checkpoint changes the five keys the compacting one did not: rows the compaction copies.
    let following = pre_commit_changes(&mut sink, checkpoint + 1, &mut next, SMALL).await;
    sink.committer().commit(vec![compacting]).await.unwrap();
    sink.committer().commit(vec![following]).await.unwrap();
    let seen = assert_reads(&lake, &table, &expected(&[(0, next)]), false, "pipelined").await;
    assert!(
        !compacting_summaries(&seen).is_empty(),
        "the compaction landed"
    );
    // The index follows the copies: more checkpoints (and compactions) keep each key once.
    for checkpoint in checkpoint + 2..checkpoint + 8 {
        let committable = pre_commit_changes(&mut sink, checkpoint, &mut next, SMALL).await;
        sink.committer().commit(vec![committable]).await.unwrap();
    }
    assert_reads(
        &lake,
        &table,
        &expected(&[(0, next)]),
        true,
        "after the pipelined compaction",
    )
    .await;
}

/// Spark deletes (merge-on-read: position-delete files) every row of the files a pre-committed compaction
/// rewrote, before the compaction's commit: the commit drops the compaction (its outputs would bring those rows
/// back) and commits the checkpoint's own changes. The sink goes on compacting; the later compactions apply
/// Spark's deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_another_writer_adds_to_a_compactions_inputs_before_its_commit_drops_it() {
    use connector_api::{Committer, TwoPhaseCommit};
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "raced");
    let schema = arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("id", arrow_schema::DataType::Int64, true),
        arrow_schema::Field::new("v", arrow_schema::DataType::Utf8, true),
    ]);
    let (_, table) = lake
        .create_foreign_table_of(
            "upserted",
            FormatVersion::V2,
            &[("write.delete.mode", "merge-on-read")],
            &schema,
        )
        .await;
    let mut sink = IcebergSink::new(compacting(&lake, &table, 2))
        .await
        .unwrap();
    sink.recover(None).await.unwrap();
    let (decided, rewritten_rows, mut checkpoint, mut next) =
        pre_commit_until_compacting(&mut sink).await;
    // The compaction's outputs hold live rows of keys the pending checkpoint does not change (it would delete
    // from their files, which a compaction leaves alone): Spark deletes every such key.
    let changed: Vec<i64> = (next - SMALL..next).map(|n| n % 12).collect();
    let deleted: Vec<i64> = (0..12).filter(|k| !changed.contains(k)).collect();
    let list = deleted
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let sparks = lake.spark_delete(&table, &format!("id IN ({list})")).await;
    assert!(
        sparks.iter().any(|f| f["content"] == 1),
        "Spark wrote position deletes: {sparks:?}"
    );
    sink.committer().commit(vec![decided]).await.unwrap();
    let mut now = expected(&[(0, next)]);
    for key in &deleted {
        now.remove(key);
    }
    let seen = assert_reads(&lake, &table, &now, false, "Spark's delete in between").await;
    assert!(
        compacting_summaries(&seen).is_empty(),
        "the compaction of {rewritten_rows} rows Spark deleted from landed"
    );
    // The sink goes on (its index did not follow the dropped compaction); later compactions take Spark's deletes.
    for _ in 0..6 {
        checkpoint += 1;
        let committable = pre_commit_changes(&mut sink, checkpoint, &mut next, SMALL).await;
        sink.committer().commit(vec![committable]).await.unwrap();
    }
    let mut now = expected(&[(0, next)]);
    let changed_since: Vec<i64> = (next - 6 * SMALL..next).map(|n| n % 12).collect();
    for key in deleted.iter().filter(|k| !changed_since.contains(k)) {
        now.remove(key);
    }
    let seen = assert_reads(&lake, &table, &now, true, "compacting after Spark's delete").await;
    assert!(
        !compacting_summaries(&seen).is_empty(),
        "no compaction after Spark's delete"
    );
}

/// Spark's maintenance (rewrite_data_files, rewrite_manifests, expire_snapshots, remove_orphan_files with a short
/// cut-off) in a loop beside a compacting upsert sink killed at its compaction's steps: Spark's rewrites and the
/// sink's compactions race for the same files, and whichever loses drops its work. Every reader, Spark included,
/// then sees each key's last state once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_maintenance_beside_compacting_upserts_and_kills_leaves_each_key_once() {
    use std::time::{Duration, Instant};
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "maintained");
    let table = lake.table(&["upserted"]);
    let state = dir.path().join("state");
    let config = compacting(&lake, &table, 2);
    run_checkpoints(config.clone(), (0, &state), 4, (SMALL, 1)).await;
    let mut spark = common::SparkMaintainer::start(&lake, &table, Duration::from_secs(20));
    let deadline = Instant::now() + Duration::from_secs(300);
    let path = dir.path().to_str().unwrap();
    let mut rounds = 0;
    while rounds < 2
        || spark.count("rewrite_data_files", "committed")
            + spark.count("rewrite_data_files", "lost")
            < 2
        || spark.count("expire_snapshots", "committed") < 2
    {
        assert!(
            Instant::now() < deadline,
            "Spark committed too little beside {rounds} rounds of the sink: {:?}\n{}",
            spark.progress(),
            spark.last_exceptions()
        );
        for step in ["after-compacting", "after-compacted-commit"] {
            common::killed_child(
                "upsert_compaction::child",
                &[(CHILD_DIR, path), (CHILD_TABLE, &table)],
                step,
            );
            run_checkpoints(config.clone(), (0, &state), 4, (SMALL, 1)).await;
        }
        rounds += 1;
    }
    // Beside commits every few hundred milliseconds Spark's rewrites mostly lose (its validation sees the sink's
    // new deletes): one lands while the sink is down, and the sink goes on over it (the key index rebuilt after a
    // foreign rewrite, compactions beside Spark's files).
    let waited = Instant::now();
    while spark.count("rewrite_data_files", "committed") == 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(180),
            "no rewrite of Spark's landed in 180 s while the sink was down: {:?}\n{}",
            spark.progress(),
            spark.last_exceptions()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let done = spark.stop();
    eprintln!("Spark's maintenance beside {rounds} rounds of a compacting upsert sink: {done}");
    // After Spark's last procedure (a rewrite of Spark's committed meanwhile drops a compaction of the sink's, and
    // its expiry may retire the compacting snapshots): the sink's compactions land over Spark's files.
    run_checkpoints(config.clone(), (0, &state), 6, (SMALL, 1)).await;
    assert!(done["rewritten_data_files"].as_u64().unwrap() > 0, "{done}");
    let next = common::decided_offset(&state).await;
    let seen = assert_reads(
        &lake,
        &table,
        &expected(&[(0, next)]),
        true,
        "after Spark's maintenance",
    )
    .await;
    assert!(
        !compacting_summaries(&seen).is_empty(),
        "no compaction of the sink's landed"
    );
}

/// Two instances of one subtask. The first pre-commits a checkpoint carrying a compaction and stalls before its
/// commit (a zombie: paused, partitioned away); a second takes over from the previous checkpoint's record, replays
/// the stalled checkpoint's changes and goes on, compacting the same small files. The zombie resumes: its
/// compacting commit is fenced. After the next instance's recovery (which deletes what the zombie wrote), every
/// reader sees each key's last state once and no file of the sink is left unreferenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombies_upsert_compaction_after_a_take_over_is_fenced_and_each_key_stays_once() {
    use connector_api::{CheckpointId, Committer, ErrorKind, TwoPhaseCommit};
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "zombie");
    let table = lake.table(&["upserted"]);
    let config = compacting(&lake, &table, 2);
    let mut zombie = IcebergSink::new(config.clone()).await.unwrap();
    zombie.recover(None).await.unwrap();
    let (stalled, _, stalled_at, stalled_next) = pre_commit_until_compacting(&mut zombie).await;

    let mut second = IcebergSink::new(config.clone()).await.unwrap();
    second
        .recover(Some((CheckpointId(stalled_at - 1), Vec::new())))
        .await
        .unwrap();
    let mut next = stalled_next - SMALL;
    let mut second_compacted = false;
    for checkpoint in stalled_at..stalled_at + 4 {
        let committable = pre_commit_changes(&mut second, checkpoint, &mut next, SMALL).await;
        second_compacted |= committable.compaction.is_some();
        second.committer().commit(vec![committable]).await.unwrap();
    }
    assert!(second_compacted, "the second instance should compact too");

    let refused = zombie.committer().commit(vec![stalled]).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Fenced, "{refused}");

    let mut third = IcebergSink::new(config).await.unwrap();
    third
        .recover(Some((CheckpointId(stalled_at + 3), Vec::new())))
        .await
        .unwrap();
    let seen = assert_reads(
        &lake,
        &table,
        &expected(&[(0, next)]),
        false,
        "after the zombie",
    )
    .await;
    assert!(
        !compacting_summaries(&seen).is_empty(),
        "the second instance's compaction landed"
    );
}

/// A catalog (PostgreSQL, reached only through Toxiproxy) that stops answering right after a pre-commit that
/// carries a compaction of an upsert table: the commit fails within `commit_timeout` (its table load and catalog
/// swap are each bounded) instead of hanging. Once the catalog answers again, a restarted instance recovers the
/// decided checkpoint (committing it and its compaction once, or the checkpoint alone if the compaction no longer
/// fits) and goes on compacting; every reader sees each key's last state once and nothing of the sink is left
/// unreferenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_that_stops_answering_at_a_compacting_upsert_commit_bounds_it_and_each_key_stays_once()
 {
    use connector_api::{CheckpointId, Committer, TwoPhaseCommit};
    let toxiproxy = test_support::Services::get().toxiproxy();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::postgres_local(dir.path(), "hungcompact");
    let proxy = toxiproxy
        .proxy("hung-upsert-compaction", &lake.catalog_server().unwrap())
        .await;
    let proxied = lake.through(proxy.address());
    let table = lake.table(&["upserted"]);
    let commit_timeout = std::time::Duration::from_secs(2);
    let config = IcebergSinkConfig {
        commit_timeout,
        ..compacting(&proxied, &table, 2)
    };
    let mut sink = IcebergSink::new(config.clone()).await.unwrap();
    sink.recover(None).await.unwrap();
    let (decided, _, checkpoint, mut next) = pre_commit_until_compacting(&mut sink).await;

    proxy.blackhole().await;
    let started = std::time::Instant::now();
    let hung = sink.committer().commit(vec![decided.clone()]).await;
    let took = started.elapsed();
    assert!(
        hung.is_err(),
        "a commit through a blackholed catalog cannot succeed"
    );
    // One attempt: a bounded table load, then a bounded swap.
    let bound = commit_timeout * 2 + std::time::Duration::from_secs(3);
    assert!(
        took < bound,
        "the hung commit took {took:?}, more than {bound:?}"
    );
    drop(sink);
    proxy.heal().await;

    let mut restarted = IcebergSink::new(config).await.unwrap();
    restarted
        .recover(Some((CheckpointId(checkpoint), vec![decided])))
        .await
        .unwrap();
    for checkpoint in checkpoint + 1..checkpoint + 5 {
        let committable = pre_commit_changes(&mut restarted, checkpoint, &mut next, SMALL).await;
        restarted
            .committer()
            .commit(vec![committable])
            .await
            .unwrap();
    }
    drop(restarted);
    proxy.delete().await;
    let seen = assert_reads(
        &lake,
        &table,
        &expected(&[(0, next)]),
        false,
        "after the hung compacting commit",
    )
    .await;
    assert!(
        !compacting_summaries(&seen).is_empty(),
        "no compaction landed after the hang"
    );
}

/// A format-version 3 table the sink creates (`format_version = 3`: deletion vectors) compacts like a version 2 one,
/// and a row a compaction moves keeps its `_row_id` and `_last_updated_sequence_number` (the rewrite writes both
/// into the new file): between a compacting snapshot and its parent, only the keys its checkpoint changed show new
/// lineage in Spark (Iceberg 1.12), however many rows the compaction moved. Every reader sees each key's last
/// state, each `_row_id` once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_upsert_tables_compactions_keep_each_moved_rows_lineage() {
    use iceberg_sink::TableLayout;
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "lineage");
    let table = lake.table(&["upserted"]);
    let config = IcebergSinkConfig {
        // Every snapshot kept: the lineage of each compacting snapshot's parent is compared.
        expire_snapshots: false,
        layout: TableLayout {
            format_version: Some(3),
            ..TableLayout::default()
        },
        ..compacting(&lake, &table, 2)
    };
    let state = dir.path().join("state");
    let next = run_checkpoints(config, (0, &state), 16, (SMALL, 1)).await;
    assert_eq!(lake.format_version(&table).await, FormatVersion::V3);
    let seen = assert_reads(&lake, &table, &expected(&[(0, next)]), true, "version 3").await;
    let lineage = lake.spark_lineage(&table).await;
    let current = crate::lineage::by_id(&lineage["current"]);
    let row_ids: std::collections::BTreeSet<i64> = current.values().map(|(id, _)| *id).collect();
    assert_eq!(
        row_ids.len(),
        current.len(),
        "every _row_id once: {current:?}"
    );
    let mut moved_live_rows = false;
    for snapshot in seen["snapshots"].as_array().unwrap() {
        let summary = &snapshot["summary"];
        let compacting = summary.get(iceberg_sink::CHECKPOINT_PROPERTY).is_some()
            && summary["deleted-data-files"]
                .as_str()
                .is_some_and(|n| n != "0");
        let Some(parent) = snapshot["parent_id"].as_i64().filter(|_| compacting) else {
            continue;
        };
        let of = |id: i64| crate::lineage::by_id(&lineage["snapshots"][id.to_string()]);
        let (before, after) = (of(parent), of(snapshot["snapshot_id"].as_i64().unwrap()));
        let renewed: Vec<_> = after
            .iter()
            .filter(|(id, row)| before.get(id) != Some(row))
            .collect();
        assert!(
            renewed.len() <= SMALL as usize,
            "compacting snapshot {}: {} keys have new lineage, its checkpoint changed at most {SMALL}: \
             {renewed:?}\nbefore: {before:?}",
            snapshot["snapshot_id"],
            renewed.len()
        );
        moved_live_rows |= summary["added-data-files"]
            .as_str()
            .is_some_and(|n| n.parse::<u32>().unwrap() >= 2);
    }
    assert!(
        moved_live_rows,
        "no compaction moved live rows: {:#}",
        seen["snapshots"]
    );
}
