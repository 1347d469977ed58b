//! Snapshot expiry inside the sink's commits (`expire_snapshots`), on a SQLite catalog with a local warehouse,
//! read back by pyiceberg and DuckDB:
//!
//! - two subtasks commit into one table whose retention keeps 3 snapshots: the table never holds more than 4, the
//!   expired snapshots' manifest lists and the retired metadata files are gone, every row is there once, and a
//!   subtask whose every snapshot was expired still knows what it committed (the ledger property);
//! - a real `kill -9` right after a commit that expired snapshots, before anything was deleted, and another after
//!   the first retired file was deleted (the `RATCHET_ICEBERG_KILL_AT` drill): the restarted job lands every row
//!   once, no retained snapshot lost a file, and what the killed process did not delete is an orphan no snapshot
//!   names;
//! - manifest merging inside the commits (Ratchet's own commit to the SQL catalog): with merging at 3 manifests
//!   and 2 kept snapshots, over three runs of two subtasks the current snapshot never names more than 2 manifests,
//!   every retained snapshot reads back its `total-records` in pyiceberg, DuckDB and pyiceberg see every row once
//!   after every run, and the manifests merges replaced are deleted once no snapshot names them;
//! - a real `kill -9` after the merged manifests are written (before the swap) and after a merging commit landed
//!   (before any deletion): the restarted job lands every row once and every retained snapshot still reads back.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::Lake;
use common::appends::{
    ROWS, assert_every_snapshot_reads_back, ids, metadata_files, read, run, spark_ids,
};
use connector_api::{
    CheckpointStore, LocalCheckpointStore, SinkId, TwoPhaseCommit, committables_in,
};
use iceberg_sink::{IcebergSink, IcebergSinkConfig};
use ratchet_conformance::conformance_schema;

const CHILD_DIR: &str = "RATCHET_ICEBERG_MAINTENANCE_CHILD";
const CHILD_TABLE: &str = "RATCHET_ICEBERG_MAINTENANCE_TABLE";

fn config(lake: &Lake, table: &str, subtask: u32) -> IcebergSinkConfig {
    IcebergSinkConfig {
        expire_snapshots: true,
        ..lake.config(
            "maintained",
            &SinkId::new("lake").unwrap(),
            subtask,
            table,
            conformance_schema(),
        )
    }
}

/// Creates `table` (through a sink instance) and sets its retention ([`Lake::set_retention`]).
async fn create_with_retention(lake: &Lake, table: &str, keep: usize) {
    IcebergSink::new(config(lake, table, 0)).await.unwrap();
    lake.set_retention(table, keep).await;
}

/// Creates `table` keeping `keep` snapshots and merging manifests at `min_count`.
async fn create_merging(lake: &Lake, table: &str, keep: usize, min_count: usize) {
    create_with_retention(lake, table, keep).await;
    lake.set_merge(table, min_count).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_expire_inside_the_commits_and_the_ledger_survives_it() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "expiry");
    let table = lake.table(&["events"]);
    create_with_retention(&lake, &table, 3).await;

    let (zero, one) = (dir.path().join("state-0"), dir.path().join("state-1"));
    run(&config(&lake, &table, 0), &zero, 0, 6).await;
    // Subtask 1's commits expire every snapshot of subtask 0.
    run(&config(&lake, &table, 1), &one, 10_000, 6).await;

    let seen = metadata_files(&lake, &table).await;
    let snapshots = seen["snapshots"].as_array().unwrap();
    assert!(
        snapshots.len() <= 4,
        "retention keeps 3 snapshots before each commit adds one: {snapshots:#?}"
    );
    assert!(
        snapshots
            .iter()
            .all(|s| s["summary"]["ratchet.subtask"].as_str() != Some("0")),
        "subtask 0's snapshots should all be expired: {snapshots:#?}"
    );
    assert_eq!(
        seen["unreferenced_manifest_lists"],
        serde_json::json!([]),
        "the expired snapshots' manifest lists should be deleted"
    );
    let jsons = seen["metadata_json_files"].as_u64().unwrap();
    assert!(
        jsons <= 4,
        "previous-versions-max = 3 keeps 4 metadata files, found {jsons}"
    );
    let mut expected: Vec<i64> = (0..6 * ROWS).chain(10_000..10_000 + 6 * ROWS).collect();
    expected.sort_unstable();
    assert_eq!(ids(&seen["ids"]), expected, "pyiceberg");
    assert_eq!(ids(&seen["duckdb_ids"]), expected, "DuckDB");

    // Subtask 0's last checkpoint, asked about again with every snapshot of it expired: committed (the table
    // property), so recovering it commits nothing twice.
    let record = LocalCheckpointStore::open(&zero, 3)
        .unwrap()
        .load()
        .await
        .unwrap()
        .record
        .expect("subtask 0's last record");
    let mut probe = IcebergSink::new(config(&lake, &table, 0)).await.unwrap();
    let committables = committables_in(&probe, &record)
        .unwrap()
        .expect("the sink's entry");
    let plan = probe
        .plan_recovery(Some((record.id, committables.clone())))
        .await
        .unwrap()
        .summary();
    assert_eq!(
        plan.commits, 0,
        "checkpoint {} of subtask 0 after its snapshots expired: {plan:?}",
        record.id
    );
    probe
        .recover(Some((record.id, committables)))
        .await
        .unwrap();
    let seen = read(&lake, &table).await;
    assert_eq!(seen.ids, expected, "after recovering subtask 0 again");
    assert!(seen.unreferenced.is_empty(), "{:?}", seen.unreferenced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_merge_inside_the_commits_and_every_state_reads_back() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "merging");
    let table = lake.table(&["events"]);
    create_merging(&lake, &table, 2, 3).await;

    let states = [dir.path().join("state-0"), dir.path().join("state-1")];
    let mut expected = Vec::new();
    for round in 0..3i64 {
        for (subtask, state) in states.iter().enumerate() {
            let first = subtask as i64 * 100_000;
            run(&config(&lake, &table, subtask as u32), state, first, 3).await;
            expected.extend(first + round * 3 * ROWS..first + (round + 1) * 3 * ROWS);
            expected.sort_unstable();
            let context = format!("round {round}, subtask {subtask}");
            let seen = metadata_files(&lake, &table).await;
            assert_eq!(ids(&seen["ids"]), expected, "{context}: pyiceberg");
            assert_eq!(ids(&seen["duckdb_ids"]), expected, "{context}: DuckDB");
            let current = seen["current_manifests"].as_u64().unwrap();
            assert!(
                current <= 2,
                "{context}: merging at 3 leaves at most 2 manifests, the current snapshot names {current}"
            );
            assert_every_snapshot_reads_back(&seen, &context);
            assert_eq!(
                seen["unreferenced_manifests"],
                serde_json::json!([]),
                "{context}: the manifests merges replaced are deleted once no snapshot names them"
            );
            assert_eq!(
                seen["unreferenced_manifest_lists"],
                serde_json::json!([]),
                "{context}"
            );
            assert_eq!(
                common::checkpoints_in_two_snapshots(seen["snapshots"].as_array().unwrap()),
                Vec::<String>::new(),
                "{context}: checkpoints in two snapshots"
            );
        }
    }
    let read = read(&lake, &table).await;
    assert!(read.unreferenced.is_empty(), "{:?}", read.unreferenced);
}

/// The child of the kill test: runs 8 checkpoints of the table in `CHILD_TABLE` from the store under
/// `CHILD_DIR`; the drill in its environment kills it at the first commit that expires snapshots. Returns at once
/// in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let (Ok(dir), Ok(table)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_TABLE)) else {
        return;
    };
    let lake = Lake::sqlite_local(Path::new(&dir), "child");
    run(
        &config(&lake, &table, 0),
        &Path::new(&dir).join("state"),
        0,
        8,
    )
    .await;
}

/// Runs [`child`] (subtask 0 of the SQLite lake in `dir`, its store in `dir/state`) until it kills itself with
/// SIGKILL at `step`.
fn killed_at(dir: &Path, table: &str, step: &str) {
    common::killed_child(
        "maintenance::child",
        &[
            (CHILD_DIR, &dir.display().to_string()),
            (CHILD_TABLE, table),
        ],
        step,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_at_each_step_of_an_expiring_or_merging_commit_loses_nothing() {
    test_support::Services::get();
    for step in [
        "after-expiring-commit",
        "while-retiring",
        "after-merging",
        "after-own-commit",
    ] {
        let merging = matches!(step, "after-merging" | "after-own-commit");
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::sqlite_local(dir.path(), "killed");
        let table = lake.table(&["events"]);
        if merging {
            create_merging(&lake, &table, 2, 3).await;
        } else {
            create_with_retention(&lake, &table, 2).await;
        }
        killed_at(dir.path(), &table, step);
        let killed = metadata_files(&lake, &table).await;

        let state = dir.path().join("state");
        run(&config(&lake, &table, 0), &state, 0, 2).await;
        let seen = metadata_files(&lake, &table).await;
        let next = common::decided_offset(&state).await;
        let expected: Vec<i64> = (0..next).collect();
        assert_eq!(ids(&seen["ids"]), expected, "{step}: pyiceberg");
        assert_eq!(ids(&seen["duckdb_ids"]), expected, "{step}: DuckDB");
        let snapshots = seen["snapshots"].as_array().unwrap();
        assert!(snapshots.len() <= 3, "{step}: {snapshots:#?}");
        // What the killed process left undeleted stays an orphan; nothing later adds to it.
        let left = killed["unreferenced_manifest_lists"].clone();
        if step == "after-expiring-commit" {
            assert_ne!(
                left,
                serde_json::json!([]),
                "{step}: the expired manifest lists the kill left"
            );
        }
        assert_eq!(
            seen["unreferenced_manifest_lists"], left,
            "{step}: the later commits delete what they expire"
        );
        if step == "after-merging" {
            assert_ne!(
                killed["unreferenced_manifests"],
                serde_json::json!([]),
                "{step}: the merged manifests the kill left unused"
            );
        }
        assert_eq!(
            seen["unreferenced_manifests"], killed["unreferenced_manifests"],
            "{step}: only the killed attempt's files are orphans; the later commits delete what merges replace"
        );
        assert_every_snapshot_reads_back(&seen, step);
        let read = read(&lake, &table).await;
        assert!(
            read.unreferenced.is_empty(),
            "{step}: {:?}",
            read.unreferenced
        );
        assert_eq!(
            common::checkpoints_in_two_snapshots(snapshots),
            Vec::<String>::new(),
            "{step}: checkpoints in two snapshots"
        );
    }
}

/// Spark (4.1 with Iceberg 1.12's runtime) maintaining an append table while the sink writes it, merging its
/// manifests, and is killed with SIGKILL after the merged manifests are written and after the merging commit
/// landed, each followed by a restarted run: rewrite_data_files (small groups, each committed), rewrite_manifests,
/// expire_snapshots and the removal of orphan files older than 120 s, in a loop, until Spark has committed
/// rewrites and expiries in between. Spark, pyiceberg and DuckDB then read every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_maintenance_beside_appends_and_kills_leaves_every_row_once() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "spark");
    let table = lake.table(&["events"]);
    // The sink merges manifests; Spark alone expires snapshots (the sink's expiry keeps Iceberg's defaults).
    IcebergSink::new(config(&lake, &table, 0)).await.unwrap();
    lake.set_merge(&table, 3).await;
    let state = dir.path().join("state");
    run(&config(&lake, &table, 0), &state, 0, 2).await;
    // The orphan cut-off must exceed the longest time a decided checkpoint's files wait unreferenced (docs/worker.md):
    // here a killed child's until the restarted run's recovery commits them, which took more than 20 s under CI's
    // load (a file the restart committed was gone).
    let mut spark = common::SparkMaintainer::start(&lake, &table, Duration::from_secs(120));
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let mut rounds = 0;
    while rounds < 2
        || spark.count("rewrite_data_files", "committed") < 2
        || spark.count("expire_snapshots", "committed") < 2
    {
        assert!(
            std::time::Instant::now() < deadline,
            "Spark committed too little beside {rounds} rounds of the sink: {:?}\n{}",
            spark.progress(),
            spark.last_exceptions()
        );
        for step in ["after-merging", "after-own-commit"] {
            killed_at(dir.path(), &table, step);
            run(&config(&lake, &table, 0), &state, 0, 2).await;
        }
        rounds += 1;
    }
    let done = spark.stop();
    eprintln!("Spark's maintenance beside {rounds} rounds: {done}");
    assert!(done["rewritten_data_files"].as_u64().unwrap() > 0, "{done}");

    let next = common::decided_offset(&state).await;
    let expected: Vec<i64> = (0..next).collect();
    assert_eq!(spark_ids(&lake, &table).await, expected, "Spark");
    let read = read(&lake, &table).await;
    assert_eq!(read.ids, expected, "pyiceberg");
    assert_eq!(read.duckdb_ids, expected, "DuckDB");
}
