//! Real `kill -9`s around the catalog commit, on a SQLite catalog with a local warehouse, checked with pyiceberg
//! and DuckDB. A child process (this test binary) runs the job and SIGKILLs itself:
//!
//! - right after checkpoint 4's record is durable, before the catalog commit: the parent (a new process with the
//!   same job config) restarts, recovery commits checkpoint 4, and every row is in the table once;
//! - right after the catalog committed checkpoint 4, before the driver learned of it: the restart finds the
//!   checkpoint in the table's history and does not commit it again.
//!
//! Each run ends with the job finished and one more process that only recovers and stops: no checkpoint's data
//! is ever in two snapshots, and no unreferenced data file is left.

use crate::common;

use std::path::Path;

use common::Lake;
use connector_api::{Driver, DriverConfig, LocalCheckpointStore, SinkHandle, SinkId, Step};
use iceberg_sink::IcebergSink;
use integration::conformance::{conformance_batch, conformance_positions, conformance_schema};
use integration::crash::{durable_before, run_killed_child, run_until_killed};

/// Set in the child: `<step>;<state dir>`.
const CHILD: &str = "RATCHET_ICEBERG_KILL9_CHILD";
const ROWS: i64 = 50;
const BATCHES: i64 = 2;
const RECORDS: i64 = 1_000;
const CRASH_CHECKPOINT: u64 = 4;

fn sink_id() -> SinkId {
    SinkId::new("lake").unwrap()
}

/// The lake of a run: its catalog and warehouse live in the run's directory, so parent and child share them.
fn lake(dir: &Path) -> Lake {
    Lake {
        namespace: "kill9".into(),
        ..Lake::sqlite_local(dir, "kill9")
    }
}

fn table(lake: &Lake) -> String {
    lake.table(&["events"])
}

async fn driver(dir: &Path) -> (Driver<LocalCheckpointStore>, SinkHandle) {
    let lake = lake(dir);
    let mut driver = Driver::new(
        LocalCheckpointStore::open(dir.join("state"), 3).unwrap(),
        DriverConfig::default(),
    );
    let config = lake.config(
        "kill9-job",
        &sink_id(),
        0,
        &table(&lake),
        conformance_schema(),
    );
    let handle = driver
        .add_sink(IcebergSink::new(config).await.unwrap())
        .unwrap();
    (driver, handle)
}

/// The child's job (does nothing unless `CHILD` is set).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let (step, dir) = spec.split_once(';').unwrap();
    let step = Step::parse(step).unwrap();
    let (driver, handle) = driver(Path::new(dir)).await;
    run_until_killed(
        driver,
        handle,
        step,
        CRASH_CHECKPOINT,
        BATCHES,
        ROWS,
        conformance_batch,
    )
    .await;
}

/// Restarts from the state the child left, checks what recovery made visible, then runs the job to the end.
async fn restart_and_finish(dir: &Path, step: Step) {
    let lake = lake(dir);
    let (mut driver, handle) = driver(dir).await;
    let restored = driver.start().await.unwrap();
    let next = restored.positions.first().map_or(0, |p| p.next_offset);
    let durable = durable_before(step, CRASH_CHECKPOINT) as i64;
    assert_eq!(next, durable * BATCHES * ROWS, "restored position");
    let seen = {
        let lake = lake.clone();
        tokio::task::spawn_blocking(move || lake.read(&table(&lake)))
            .await
            .unwrap()
    };
    assert_eq!(
        seen.ids,
        (0..next).collect::<Vec<_>>(),
        "after recovery the table holds exactly the durable checkpoints"
    );
    assert_eq!(seen.ids, seen.duckdb_ids, "pyiceberg and DuckDB agree");

    let mut next = next;
    while next < RECORDS {
        let end = (next + ROWS).min(RECORDS);
        driver
            .write(handle, &conformance_batch(next..end))
            .await
            .unwrap();
        next = end;
        driver
            .checkpoint(conformance_positions(next))
            .await
            .unwrap();
    }
    driver.close().await.unwrap();
}

/// One more process with the same job config that only recovers and stops, then the final checks.
async fn recover_again_and_check(dir: &Path) {
    let (mut driver, _) = driver(dir).await;
    driver.start().await.unwrap();
    driver.close().await.unwrap();
    let lake = lake(dir);
    let seen = tokio::task::spawn_blocking(move || lake.read(&table(&lake)))
        .await
        .unwrap();
    assert_eq!(seen.ids, (0..RECORDS).collect::<Vec<_>>(), "every row once");
    assert_eq!(seen.ids, seen.duckdb_ids, "pyiceberg and DuckDB agree");
    assert!(seen.unreferenced.is_empty(), "{:?}", seen.unreferenced);
    let mut data_checkpoints: Vec<&str> = seen
        .snapshots
        .iter()
        .filter(|s| {
            s["summary"]["added-data-files"]
                .as_str()
                .is_some_and(|n| n != "0")
        })
        .map(|s| s["summary"]["ratchet.checkpoint"].as_str().unwrap())
        .collect();
    let total = data_checkpoints.len();
    data_checkpoints.sort_unstable();
    data_checkpoints.dedup();
    assert_eq!(
        total,
        data_checkpoints.len(),
        "a checkpoint committed twice: {:?}",
        seen.snapshots
    );
}

async fn killed_then_restarted(step: Step) {
    integration::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("{step};{}", dir.path().display());
    tokio::task::spawn_blocking(move || run_killed_child("kill9::child", CHILD, &spec))
        .await
        .unwrap();
    restart_and_finish(dir.path(), step).await;
    recover_again_and_check(dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_durable_record_before_the_catalog_commit_lands_each_row_once() {
    killed_then_restarted(Step::AfterRecordDurable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_catalog_commit_before_the_driver_knew_commits_nothing_twice() {
    killed_then_restarted(Step::AfterCommit).await;
}
