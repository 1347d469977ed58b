//! Real `kill -9`s at every protocol step, around the catalog commit too, on a SQLite catalog with a local
//! warehouse, through the conformance kit's runner ([`KillNine`]), checked with pyiceberg and DuckDB. A child
//! process (this test binary) runs the job and SIGKILLs itself at the step; among the steps:
//!
//! - right after checkpoint 4's record is durable, before the catalog commit: the parent (a new process with the
//!   same job config) recovers, committing checkpoint 4, and every row is in the table once;
//! - right after the catalog committed checkpoint 4, before the driver learned of it: the recovery finds the
//!   checkpoint in the table's history and does not commit it again.
//!
//! Each run ends with the job going on for two checkpoints and one more process that only recovers and stops: no
//! checkpoint's data is ever in two snapshots, pyiceberg and DuckDB agree, and no unreferenced data file is left.

use crate::common;

use std::path::Path;

use async_trait::async_trait;
use common::{Lake, Seen};
use connector_api::{Result, SinkId};
use iceberg_sink::IcebergSink;
use ratchet_conformance::conformance_schema;
use ratchet_conformance::kill9::{KillNine, KillTarget, KilledRun};

const KILL9: KillNine = KillNine {
    batches: 2,
    rows: 50,
    ..KillNine::new("kill9::child", "RATCHET_ICEBERG_KILL9_CHILD")
};

/// The run's lake: its catalog and warehouse live in the run's directory, so parent and child share them.
struct Warehouse;

impl Warehouse {
    fn lake(dir: &Path) -> Lake {
        Lake {
            namespace: "kill9".into(),
            ..Lake::sqlite_local(dir, "kill9")
        }
    }

    async fn read(run: &KilledRun) -> Seen {
        let lake = Warehouse::lake(&run.dir);
        tokio::task::spawn_blocking(move || lake.read(&lake.table(&["events"])))
            .await
            .expect("the verifier's task")
    }
}

#[async_trait]
impl KillTarget for Warehouse {
    type Sink = IcebergSink;

    async fn create_sink(&self, run: &KilledRun) -> Result<IcebergSink> {
        let lake = Warehouse::lake(&run.dir);
        let table = lake.table(&["events"]);
        let config = lake.config(
            "kill9-job",
            &SinkId::new("lake")?,
            0,
            &table,
            conformance_schema(),
        );
        IcebergSink::new(config).await
    }

    async fn visible_ids(&self, run: &KilledRun) -> Result<Vec<i64>> {
        Ok(Warehouse::read(run).await.ids)
    }

    /// Unreferenced data files, a checkpoint committed in two snapshots, pyiceberg and DuckDB disagreeing.
    async fn leftovers(&self, run: &KilledRun) -> Result<Vec<String>> {
        let seen = Warehouse::read(run).await;
        let mut problems: Vec<String> = seen
            .unreferenced
            .iter()
            .map(|file| format!("unreferenced data file {file}"))
            .collect();
        if seen.ids != seen.duckdb_ids {
            problems.push(format!(
                "pyiceberg sees {} rows, DuckDB {}",
                seen.ids.len(),
                seen.duckdb_ids.len()
            ));
        }
        problems.extend(
            common::checkpoints_in_two_snapshots(&seen.snapshots)
                .into_iter()
                .map(|checkpoint| format!("checkpoint {checkpoint} committed in two snapshots")),
        );
        Ok(problems)
    }
}

/// The child's entry point (returns at once in a normal test run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    if let Some(run) = KILL9.child_run() {
        KILL9.run_child(&Warehouse, run).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_every_step_lands_each_row_once_and_commits_nothing_twice() {
    test_support::Services::get();
    KILL9.every_step(&Warehouse, "sqlite-local").await;
}
