//! Compaction inside the sink's commits (`compact`), on a SQLite catalog with a local warehouse, read back by
//! pyiceberg, DuckDB, Iceberg's Java library and Spark 4.1 with Iceberg 1.12's runtime:
//!
//! - two subtasks over three runs each compact their own small files: the current snapshot's data files stay
//!   bounded, every retained snapshot reads back its `total-records`, every row is there once;
//! - a real `kill -9` after a pre-commit's rewritten files are written, after the replacing manifests are written
//!   (before the swap), and after the compacting commit landed: the restarted job lands every row once, and what
//!   the killed process wrote and no snapshot took is deleted by the restart's cleanup;
//! - a checkpoint carrying a compaction whose inputs Spark's rewrite_data_files replaced before the checkpoint's
//!   commit: the commit drops the compaction (its files deleted), Spark and pyiceberg read every row once;
//! - a zombie whose compacting checkpoint stalled while a second instance took over and compacted the same files:
//!   its commits are fenced, its files deleted by the next recovery;
//! - Spark's maintenance loop beside compacting commits and kills;
//! - Spark's merge-on-read `DELETE`s of the sink's files: applied by the compactions that read them, dropping the
//!   compaction whose inputs they reach after it read them, and making a large file with many deleted rows due.

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::Lake;
use common::appends::{
    ROWS, assert_every_snapshot_reads_back, ids, java_ids, metadata_files, read, run, spark_ids,
};
use connector_api::SinkId;
use iceberg_sink::{Compact, CompactPolicy, IcebergSink, IcebergSinkConfig};
use ratchet_conformance::{conformance_batch as batch, conformance_schema};

const CHILD_DIR: &str = "RATCHET_ICEBERG_COMPACTION_CHILD";
const CHILD_TABLE: &str = "RATCHET_ICEBERG_COMPACTION_TABLE";
/// Set (to anything) when the child's sink expires snapshots in its commits.
const CHILD_EXPIRES: &str = "RATCHET_ICEBERG_COMPACTION_EXPIRES";

/// Subtask `subtask` compacting at `min_input_files`, expiring snapshots inside its commits when `expire` (not
/// beside Spark's own expiry, which fails on files the sink expired under it).
fn config(
    lake: &Lake,
    table: &str,
    subtask: u32,
    min_input_files: usize,
    expire: bool,
) -> IcebergSinkConfig {
    IcebergSinkConfig {
        expire_snapshots: expire,
        compact: Compact::On(CompactPolicy {
            target_file_size: 1 << 20,
            min_input_files,
            ..Default::default()
        }),
        ..lake.config(
            "compacted",
            &SinkId::new("lake").unwrap(),
            subtask,
            table,
            conformance_schema(),
        )
    }
}

/// The snapshots of `seen` (the verifier's) that Ratchet committed (its ledger keys in the summary) and whose
/// summary counts replaced data files.
fn compacting_snapshots(seen: &serde_json::Value) -> usize {
    seen["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            let summary = s["summary"].as_object().unwrap();
            summary.contains_key("deleted-data-files")
                && summary.contains_key(iceberg_sink::CHECKPOINT_PROPERTY)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_compact_inside_the_commits_and_every_snapshot_reads_back() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "compact");
    let table = lake.table(&["events"]);
    // Expiry keeps 3 snapshots and merges at 3 manifests: compacted inputs soon have no reader left.
    IcebergSink::new(config(&lake, &table, 0, 4, true))
        .await
        .unwrap();
    lake.set_retention(&table, 3).await;
    lake.set_merge(&table, 3).await;
    let checkpoints = 12;
    for round in 0..3 {
        for subtask in 0..2u32 {
            let state = dir.path().join(format!("state-{subtask}"));
            let config = config(&lake, &table, subtask, 4, true);
            run(&config, &state, i64::from(subtask) * 1_000_000, checkpoints).await;
        }
        let seen = metadata_files(&lake, &table).await;
        let written = (round + 1) * checkpoints * ROWS;
        let expected: Vec<i64> = (0..written).chain(1_000_000..1_000_000 + written).collect();
        let context = format!("after round {round}");
        assert_eq!(ids(&seen["ids"]), expected, "{context}: pyiceberg");
        assert_eq!(ids(&seen["duckdb_ids"]), expected, "{context}: DuckDB");
        assert_every_snapshot_reads_back(&seen, &context);
        // Without compaction each subtask would show one file per checkpoint; with it, a few per size tier.
        let files = seen["planned_data_files"].as_array().unwrap();
        let uncompacted = (round + 1) * checkpoints * 2;
        assert!(
            (files.len() as i64) * 2 <= uncompacted,
            "{context}: {} data files of {uncompacted} checkpoints: {files:#?}",
            files.len()
        );
        assert!(
            files
                .iter()
                .any(|f| f.as_str().unwrap().contains("-compacted")),
            "{context}: {files:#?}"
        );
        assert!(compacting_snapshots(&seen) > 0, "{context}");
    }
    // Inputs whose last reader another subtask's expiry removed are deleted by their own subtask's next recovery.
    let mut sinks = Vec::new();
    for subtask in 0..2 {
        let mut sink = IcebergSink::new(config(&lake, &table, subtask, 4, true))
            .await
            .unwrap();
        connector_api::TwoPhaseCommit::recover(&mut sink, None)
            .await
            .unwrap();
        sinks.push(sink);
    }
    for sink in &sinks {
        sink.delete_unreferenced_files().await.unwrap();
    }
    let seen = metadata_files(&lake, &table).await;
    assert_eq!(
        seen["unread_data_files"],
        serde_json::json!([]),
        "compacted files no snapshot reads stay on storage"
    );
    let read = read(&lake, &table).await;
    assert!(read.unreferenced.is_empty(), "{:?}", read.unreferenced);
}

/// The child of the kill test: runs 8 checkpoints (compacting at 2 files) of the table in `CHILD_TABLE` from the
/// store under `CHILD_DIR`; the drill in its environment kills it at the first compacting step. Returns at once in
/// a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let (Ok(dir), Ok(table)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_TABLE)) else {
        return;
    };
    let lake = Lake::sqlite_local(Path::new(&dir), "child");
    let expire = std::env::var(CHILD_EXPIRES).is_ok();
    let config = config(&lake, &table, 0, 2, expire);
    run(&config, &Path::new(&dir).join("state"), 0, 8).await;
}

/// Runs [`child`] with the drill at `step`; whether it killed itself with SIGKILL there (otherwise it ended its
/// 8 checkpoints without reaching the step, and must have succeeded).
fn run_child(dir: &Path, table: &str, step: &str, expire: bool) -> bool {
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args(["--exact", "compaction::child", "--nocapture"])
        .env(CHILD_DIR, dir)
        .env(CHILD_TABLE, table)
        .env(iceberg_sink::KILL_VARIABLE, step);
    if expire {
        child.env(CHILD_EXPIRES, "1");
    }
    let status = child.status().unwrap();
    assert!(
        status.signal() == Some(9) || status.success(),
        "{step}: the child failed ({status})"
    );
    status.signal() == Some(9)
}

/// Runs [`child`] (expiring snapshots) until it kills itself with SIGKILL at `step`.
fn killed_at(dir: &Path, table: &str, step: &str) {
    assert!(
        run_child(dir, table, step, true),
        "{step}: the child should have killed itself at the step"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_at_each_step_of_a_compacting_commit_loses_nothing() {
    test_support::Services::get();
    for step in ["after-compacting", "after-replacing", "after-own-commit"] {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::sqlite_local(dir.path(), "killed");
        let table = lake.table(&["events"]);
        let config = config(&lake, &table, 0, 2, true);
        IcebergSink::new(config.clone()).await.unwrap();
        killed_at(dir.path(), &table, step);

        let state = dir.path().join("state");
        run(&config, &state, 0, 4).await;
        let seen = metadata_files(&lake, &table).await;
        let next = common::decided_offset(&state).await;
        let expected: Vec<i64> = (0..next).collect();
        assert_eq!(ids(&seen["ids"]), expected, "{step}: pyiceberg");
        assert_eq!(ids(&seen["duckdb_ids"]), expected, "{step}: DuckDB");
        assert_every_snapshot_reads_back(&seen, step);
        assert!(compacting_snapshots(&seen) > 0, "{step}");
        let snapshots = seen["snapshots"].as_array().unwrap();
        assert_eq!(
            common::checkpoints_in_two_snapshots(snapshots),
            Vec::<String>::new(),
            "{step}: checkpoints in two snapshots"
        );
        // The killed pre-commit's rewritten files (no checkpoint took them) are deleted by the restart.
        let read = read(&lake, &table).await;
        assert!(
            read.unreferenced.is_empty(),
            "{step}: {:?}",
            read.unreferenced
        );
        if step == "after-replacing" {
            assert_eq!(
                java_ids(&lake, &table).await,
                expected,
                "{step}: Iceberg's Java library"
            );
        }
    }
}

/// Commits checkpoints of [`ROWS`] records (ids from 0) through `sink`, recovered on a new table, until a
/// pre-commit carries a compaction of the small files committed so far; returns that committable (not committed),
/// its checkpoint and the next id.
async fn commit_until_compacting(
    sink: &mut IcebergSink,
) -> (iceberg_sink::IcebergCommittable, u64, i64) {
    use connector_api::{CheckpointId, Committer, TwoPhaseCommit};
    let committer = sink.committer();
    let mut next = 0;
    for checkpoint in 1..=12 {
        sink.begin(CheckpointId(checkpoint)).await.unwrap();
        sink.write(&batch(next..next + ROWS)).await.unwrap();
        next += ROWS;
        let committable = sink.pre_commit(CheckpointId(checkpoint)).await.unwrap();
        if committable.compaction.is_some() {
            return (committable, checkpoint, next);
        }
        committer.commit(vec![committable]).await.unwrap();
    }
    panic!("no pre-commit compacted in 12 checkpoints");
}

/// Two instances of one subtask. The first pre-commits a checkpoint carrying a compaction of its small files and
/// stalls before its commit (a zombie: paused, partitioned away); a second takes over from the previous
/// checkpoint's record, replays the stalled checkpoint's records and goes on, compacting the same small files in
/// its own first commit. The zombie resumes: its compacting commit is fenced (neither its rows nor its rewritten
/// files become visible, no row is doubled or lost), and so is its next checkpoint. The next instance's recovery
/// deletes the zombie's files no snapshot took; pyiceberg, DuckDB and Iceberg's Java library read every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombies_compaction_after_a_take_over_is_fenced_and_every_row_stays_once() {
    use connector_api::{CheckpointId, Committer, ErrorKind, TwoPhaseCommit};
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "zombie");
    let table = lake.table(&["events"]);
    let config = config(&lake, &table, 0, 2, false);
    let mut zombie = IcebergSink::new(config.clone()).await.unwrap();
    zombie.recover(None).await.unwrap();
    let (stalled, stalled_at, stalled_next) = commit_until_compacting(&mut zombie).await;
    let zombie_outputs: Vec<String> = stalled
        .compaction
        .as_ref()
        .unwrap()
        .outputs
        .iter()
        .map(|f| f.path.clone())
        .collect();

    let mut second = IcebergSink::new(config.clone()).await.unwrap();
    second
        .recover(Some((CheckpointId(stalled_at - 1), Vec::new())))
        .await
        .unwrap();
    let mut next = stalled_next - ROWS;
    let mut second_compacted = false;
    for checkpoint in stalled_at..stalled_at + 2 {
        second.begin(CheckpointId(checkpoint)).await.unwrap();
        second.write(&batch(next..next + ROWS)).await.unwrap();
        next += ROWS;
        let committable = second.pre_commit(CheckpointId(checkpoint)).await.unwrap();
        second_compacted |= committable.compaction.is_some();
        second.committer().commit(vec![committable]).await.unwrap();
    }
    assert!(
        second_compacted,
        "the second instance should compact the same small files"
    );

    let refused = zombie.committer().commit(vec![stalled]).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Fenced, "{refused}");
    // Its next checkpoint: refused at the latest by its commit.
    let later = CheckpointId(stalled_at + 1);
    let refused = match zombie.begin(later).await {
        Err(e) => e,
        Ok(()) => {
            zombie
                .write(&batch(stalled_next..stalled_next + ROWS))
                .await
                .unwrap();
            match zombie.pre_commit(later).await {
                Err(e) => e,
                Ok(committable) => zombie
                    .committer()
                    .commit(vec![committable])
                    .await
                    .unwrap_err(),
            }
        }
    };
    assert_eq!(refused.kind(), ErrorKind::Fenced, "{refused}");

    let expected: Vec<i64> = (0..next).collect();
    let seen = metadata_files(&lake, &table).await;
    assert_eq!(ids(&seen["ids"]), expected, "pyiceberg");
    assert_eq!(ids(&seen["duckdb_ids"]), expected, "DuckDB");
    assert_every_snapshot_reads_back(&seen, "after the zombie");
    assert_eq!(
        compacting_snapshots(&seen),
        1,
        "only the second instance's compaction: {:#}",
        seen["snapshots"]
    );
    let live = seen["planned_data_files"].to_string();
    for output in &zombie_outputs {
        assert!(
            !live.contains(output.as_str()),
            "the zombie's {output} is live"
        );
    }
    assert_eq!(
        java_ids(&lake, &table).await,
        expected,
        "Iceberg's Java library"
    );

    // The next instance's recovery deletes what the zombie wrote and no snapshot took.
    let mut third = IcebergSink::new(config).await.unwrap();
    third
        .recover(Some((CheckpointId(stalled_at + 1), Vec::new())))
        .await
        .unwrap();
    let read = read(&lake, &table).await;
    assert_eq!(read.ids, expected, "pyiceberg after the third recovery");
    assert!(
        read.unreferenced.is_empty(),
        "the zombie's files stayed: {:?}",
        read.unreferenced
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_whose_files_spark_rewrote_meanwhile_is_dropped_and_no_row_is_lost() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "foreign");
    let table = lake.table(&["events"]);
    use connector_api::{Committer, TwoPhaseCommit};
    let mut sink = IcebergSink::new(config(&lake, &table, 0, 2, false))
        .await
        .unwrap();
    sink.recover(None).await.unwrap();
    let committer = sink.committer();
    let (committable, _, next) = commit_until_compacting(&mut sink).await;
    let inputs = committable.compaction.as_ref().unwrap().inputs.len();
    assert!(inputs >= 2, "{committable:?}");
    // Spark rewrites every live file first; the checkpoint's commit then finds its inputs gone.
    let rewritten = lake.spark_rewrite(&table).await;
    assert!(rewritten >= inputs as u64, "{rewritten}");
    committer.commit(vec![committable]).await.unwrap();

    let expected: Vec<i64> = (0..next).collect();
    let seen = metadata_files(&lake, &table).await;
    assert_eq!(ids(&seen["ids"]), expected, "pyiceberg");
    assert_every_snapshot_reads_back(&seen, "after the dropped compaction");
    assert_eq!(
        compacting_snapshots(&seen),
        0,
        "Ratchet's compaction should have been dropped: {:#}",
        seen["snapshots"]
    );
    let read = read(&lake, &table).await;
    assert!(
        read.unreferenced.is_empty(),
        "the dropped compaction's files: {:?}",
        read.unreferenced
    );
    assert_eq!(spark_ids(&lake, &table).await, expected, "Spark");
}

/// Spark (4.1 with Iceberg 1.12's runtime) maintaining the table (rewrite_data_files in small groups,
/// rewrite_manifests, expire_snapshots, orphan removal older than 120 s, in a loop) while the sink compacts inside
/// its commits and is killed with SIGKILL after its replacing manifests are written and after a compacting commit
/// landed, each followed by a restarted run: until Spark committed rewrites and expiries in between and both
/// drills fired. Spark, pyiceberg and DuckDB then read every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_maintenance_beside_compacting_commits_and_kills_leaves_every_row_once() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "spark");
    let table = lake.table(&["events"]);
    let config = config(&lake, &table, 0, 2, false);
    IcebergSink::new(config.clone()).await.unwrap();
    let state = dir.path().join("state");
    run(&config, &state, 0, 4).await;
    let mut spark =
        // A cut-off above the longest wait of a killed child's decided files (see the maintenance test).
        common::SparkMaintainer::start(&lake, &table, std::time::Duration::from_secs(120));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let mut kills = std::collections::BTreeMap::new();
    let steps = ["after-replacing", "after-own-commit"];
    while kills.len() < steps.len()
        || spark.count("rewrite_data_files", "committed") < 2
        || spark.count("expire_snapshots", "committed") < 2
    {
        assert!(
            std::time::Instant::now() < deadline,
            "too little happened: kills {kills:?}, Spark {:?}\n{}",
            spark.progress(),
            spark.last_exceptions()
        );
        for step in steps {
            if run_child(dir.path(), &table, step, false) {
                *kills.entry(step).or_insert(0) += 1;
            }
            run(&config, &state, 0, 2).await;
        }
    }
    let done = spark.stop();
    eprintln!("Spark's maintenance beside the compacting sink, kills {kills:?}: {done}");

    let next = common::decided_offset(&state).await;
    let expected: Vec<i64> = (0..next).collect();
    assert_eq!(spark_ids(&lake, &table).await, expected, "Spark");
    let read = read(&lake, &table).await;
    assert_eq!(read.ids, expected, "pyiceberg");
    assert_eq!(read.duckdb_ids, expected, "DuckDB");
}

/// Commits checkpoints `from..` of [`ROWS`] records (ids from `next`) until a pre-commit carries a compaction;
/// returns it (not committed) and its checkpoint.
async fn commit_until_compacting_from(
    sink: &mut IcebergSink,
    from: u64,
    next: &mut i64,
) -> (iceberg_sink::IcebergCommittable, u64) {
    use connector_api::{CheckpointId, Committer, TwoPhaseCommit};
    let committer = sink.committer();
    for checkpoint in from..from + 12 {
        sink.begin(CheckpointId(checkpoint)).await.unwrap();
        sink.write(&batch(*next..*next + ROWS)).await.unwrap();
        *next += ROWS;
        let committable = sink.pre_commit(CheckpointId(checkpoint)).await.unwrap();
        if committable.compaction.is_some() {
            return (committable, checkpoint);
        }
        committer.commit(vec![committable]).await.unwrap();
    }
    panic!("no pre-commit compacted in 12 checkpoints from {from}");
}

/// The position-delete files a compacting snapshot of `seen` (the verifier's) removed, summed.
fn removed_delete_files(seen: &serde_json::Value) -> u64 {
    seen["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["summary"]["removed-position-delete-files"].as_str())
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// Spark's merge-on-read `DELETE` of `ids` from `table`, added to `gone`.
async fn spark_deletes(lake: &Lake, table: &str, gone: &mut BTreeSet<i64>, ids: Vec<i64>) {
    gone.extend(ids.iter().copied());
    let list = ids
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let files = lake.spark_delete(table, &format!("id IN ({list})")).await;
    assert!(
        files.iter().any(|f| f["content"] == 1),
        "Spark wrote no position deletes: {files:?}"
    );
}

/// Spark deletes rows of an append table merge-on-read (position-delete files naming the sink's small files), as
/// any other writer may: (1) before a compaction reads its inputs: the compaction applies the deletes (copying the
/// inputs whole would bring the rows back); (2) after a compaction read its inputs, before its commit: the commit
/// drops it. Spark and pyiceberg read exactly the rows not deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_merge_on_read_deletes_stay_deleted_through_an_append_tables_compactions() {
    use connector_api::{Committer, TwoPhaseCommit};
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "deleted");
    let table = lake.table(&["events"]);
    let mut sink = IcebergSink::new(config(&lake, &table, 0, 2, false))
        .await
        .unwrap();
    lake.set_properties(&table, &[("write.delete.mode", "merge-on-read".into())])
        .await;
    sink.recover(None).await.unwrap();
    let committer = sink.committer();
    let mut next = 0;
    let mut gone = BTreeSet::new();
    let expected = |next: i64, gone: &BTreeSet<i64>| -> Vec<i64> {
        (0..next).filter(|id| !gone.contains(id)).collect()
    };

    // (1) Spark deletes three rows of the last checkpoint's file before the compaction that reads it.
    let (first, checkpoint) = commit_until_compacting_from(&mut sink, 1, &mut next).await;
    committer.commit(vec![first]).await.unwrap();
    let written = next - ROWS;
    spark_deletes(
        &lake,
        &table,
        &mut gone,
        vec![written + 1, written + 2, written + 3],
    )
    .await;
    let (applying, checkpoint) =
        commit_until_compacting_from(&mut sink, checkpoint + 1, &mut next).await;
    committer.commit(vec![applying]).await.unwrap();
    let seen = metadata_files(&lake, &table).await;
    assert_eq!(ids(&seen["ids"]), expected(next, &gone), "(1) pyiceberg");
    let compactions = compacting_snapshots(&seen);
    assert_eq!(
        compactions, 2,
        "(1) both compactions landed: {:#}",
        seen["snapshots"]
    );
    assert!(
        removed_delete_files(&seen) > 0,
        "(1) Spark's delete file naming only a compacted file stayed: {:#}",
        seen["snapshots"]
    );

    // (2) A compaction reads its inputs; Spark deletes a row of each committed checkpoint's file before its commit.
    let (raced, _) = commit_until_compacting_from(&mut sink, checkpoint + 1, &mut next).await;
    let each_file: Vec<i64> = (0..next / ROWS - 1).map(|c| c * ROWS + 7).collect();
    spark_deletes(&lake, &table, &mut gone, each_file).await;
    committer.commit(vec![raced]).await.unwrap();
    let seen = metadata_files(&lake, &table).await;
    assert_eq!(ids(&seen["ids"]), expected(next, &gone), "(2) pyiceberg");
    assert_eq!(
        compacting_snapshots(&seen),
        compactions,
        "(2) the compaction Spark's delete raced landed: {:#}",
        seen["snapshots"]
    );
    assert_eq!(
        spark_ids(&lake, &table).await,
        expected(next, &gone),
        "Spark"
    );
}

/// A file at or above the small size (every file, at a 1 KiB target) of which Spark deleted 40% of the rows
/// merge-on-read is rewritten without them by a later look, and Spark's delete file, naming only it, is removed
/// with it; pyiceberg and DuckDB read exactly the rows not deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_tables_file_with_many_rows_spark_deleted_is_rewritten_without_them() {
    use connector_api::{Committer, TwoPhaseCommit};
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "heavy");
    let table = lake.table(&["events"]);
    let config = IcebergSinkConfig {
        compact: Compact::On(CompactPolicy {
            target_file_size: 1024,
            min_input_files: 2,
            ..Default::default()
        }),
        ..config(&lake, &table, 0, 2, false)
    };
    let mut sink = IcebergSink::new(config).await.unwrap();
    lake.set_properties(&table, &[("write.delete.mode", "merge-on-read".into())])
        .await;
    sink.recover(None).await.unwrap();
    let committer = sink.committer();
    let mut next = 0;
    let mut checkpoint = 0;
    let mut commit_one = async |next: &mut i64, checkpoint: &mut u64| {
        *checkpoint += 1;
        sink.begin(connector_api::CheckpointId(*checkpoint))
            .await
            .unwrap();
        sink.write(&batch(*next..*next + ROWS)).await.unwrap();
        *next += ROWS;
        let committable = sink
            .pre_commit(connector_api::CheckpointId(*checkpoint))
            .await
            .unwrap();
        let compacted = committable.compaction.is_some();
        committer.commit(vec![committable]).await.unwrap();
        compacted
    };
    for _ in 0..2 {
        assert!(
            !commit_one(&mut next, &mut checkpoint).await,
            "no file has deletes yet"
        );
    }
    let mut gone = BTreeSet::new();
    spark_deletes(
        &lake,
        &table,
        &mut gone,
        (0..ROWS).filter(|id| id % 5 < 2).collect(),
    )
    .await;
    let first_file = |seen: &serde_json::Value| {
        seen["planned_data_files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().contains(".e1.c1-"))
    };
    for _ in 0..4 {
        commit_one(&mut next, &mut checkpoint).await;
        let seen = metadata_files(&lake, &table).await;
        let expected: Vec<i64> = (0..next).filter(|id| !gone.contains(id)).collect();
        assert_eq!(ids(&seen["ids"]), expected, "pyiceberg");
        assert_eq!(ids(&seen["duckdb_ids"]), expected, "DuckDB");
        if !first_file(&seen) {
            assert!(
                removed_delete_files(&seen) > 0,
                "Spark's delete file stayed: {:#}",
                seen["snapshots"]
            );
            return;
        }
    }
    panic!("the file with 40% of its rows deleted was not rewritten in 4 checkpoints");
}

/// What a new user gets: `compact` left out of the entry. The table the sink created carries
/// `ratchet.created-by` and compacts with the default policy (8 small files); a table someone else created (here
/// iceberg-rust's own `create_table`) compacts nothing unless the entry says `compact`. Both read back every row
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn left_out_compact_compacts_only_the_tables_the_sink_created() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "defaults");
    let (catalog, _) = lake
        .create_foreign_table("foreign", iceberg::spec::FormatVersion::V2, &[])
        .await;
    for (name, created_by_sink) in [("created", true), ("foreign", false)] {
        let table = lake.table(&[name]);
        let config = lake.config(
            "defaults",
            &SinkId::new("lake").unwrap(),
            0,
            &table,
            conformance_schema(),
        );
        assert_eq!(config.compact, Compact::Default);
        // 10 checkpoints: the first pre-commit looks (nothing live yet), the ninth finds 8 small files.
        run(&config, &dir.path().join(format!("state-{name}")), 0, 10).await;
        let loaded = catalog
            .load_table(&iceberg::TableIdent::from_strs(table.split('.')).unwrap())
            .await
            .unwrap();
        assert_eq!(
            loaded
                .metadata()
                .properties()
                .get(iceberg_sink::CREATED_BY_PROPERTY)
                .map(String::as_str),
            created_by_sink.then_some("defaults"),
            "{name}"
        );
        let seen = metadata_files(&lake, &table).await;
        let expected: Vec<i64> = (0..10 * ROWS).collect();
        assert_eq!(ids(&seen["ids"]), expected, "{name}: pyiceberg");
        assert_eq!(ids(&seen["duckdb_ids"]), expected, "{name}: DuckDB");
        assert_every_snapshot_reads_back(&seen, name);
        assert_eq!(
            compacting_snapshots(&seen) > 0,
            created_by_sink,
            "{name}: {:#}",
            seen["snapshots"]
        );
    }
}
