//! The conformance harness on the Iceberg sink, on the embedded default (SQLite catalog, local warehouse) and on
//! a PostgreSQL catalog with its warehouse in S3 (SeaweedFS); every visible row is read by pyiceberg and by
//! DuckDB's iceberg_scan, which must agree, and data files no snapshot references count as leftovers. Also on
//! SeaweedFS's REST catalog, and with one snapshot per three checkpoints; these two with snapshot expiry inside
//! the commits (`expire_snapshots`) on tables that keep 2 snapshots, so recovery often finds none of a subtask's
//! snapshots and goes by the ledger's table property. Every table the sink creates (SQL or REST catalog) is
//! committed by Ratchet's own catalog commit (manifest merging on); the PostgreSQL, REST and every-third runs
//! merge at 2 manifests, so nearly every commit merges. The REST run and one more SQLite run write in the upsert
//! mode (`upsert_key = ["id"]`): every commit is a row delta, data files plus the ids' equality deletes, read back
//! merged-on-read by Apache Iceberg's Java library and by the verifier's own reading of the manifests (pyiceberg
//! 0.12 refuses equality deletes, DuckDB 1.4.4 misreads them).

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use async_trait::async_trait;
use common::Lake;
use connector_api::{Error, ErrorKind, Phase, Result, SinkId, SubtaskId};
use iceberg_sink::IcebergSink;
use ratchet_conformance::{Conformance, ConformanceTarget, conformance_schema, run_conformance};

/// A lake and how many checkpoints each snapshot commits; what the readers saw last per table, until a new sink
/// instance may change it (the end-of-scenario `leftovers` reuses the `visible_ids` read just before it); with
/// `keep`, the sinks expire snapshots in their commits on tables that keep that many; with `merge_at`, the tables
/// merge manifests at that count (`configured`: the tables given these properties so far).
struct Target {
    lake: Lake,
    commit_every: u32,
    keep: Option<usize>,
    merge_at: Option<usize>,
    upsert: bool,
    seen: Mutex<HashMap<String, common::Seen>>,
    configured: Mutex<HashSet<String>>,
}

impl Target {
    fn new(lake: Lake, commit_every: u32) -> Self {
        Target {
            lake,
            commit_every,
            keep: None,
            merge_at: None,
            upsert: false,
            seen: Mutex::default(),
            configured: Mutex::default(),
        }
    }

    /// The sinks expire snapshots in their commits, on tables that keep `keep` snapshots.
    fn expiring(self, keep: usize) -> Self {
        Target {
            keep: Some(keep),
            ..self
        }
    }

    /// The tables merge their manifests once `min_count` pile up.
    fn merging(self, min_count: usize) -> Self {
        Target {
            merge_at: Some(min_count),
            ..self
        }
    }

    /// The sinks apply the records by `id` (`upsert_key`): every commit a row delta with the ids' equality
    /// deletes, read back merged-on-read.
    fn upserting(self) -> Self {
        Target {
            upsert: true,
            ..self
        }
    }

    async fn seen(&self, run: &str, sink: &SinkId) -> Result<common::Seen> {
        let table = self.lake.table(&[run, sink.as_str()]);
        if let Some(seen) = self.seen.lock().unwrap().get(&table) {
            return Ok(seen.clone());
        }
        let seen = self.read(run, sink).await?;
        self.seen.lock().unwrap().insert(table, seen.clone());
        Ok(seen)
    }

    async fn read(&self, run: &str, sink: &SinkId) -> Result<common::Seen> {
        let lake = self.lake.clone();
        let table = lake.table(&[run, sink.as_str()]);
        let seen = tokio::task::spawn_blocking(move || lake.read(&table))
            .await
            .unwrap();
        if seen.ids != seen.second_ids {
            return Err(Error::new(
                ErrorKind::Fatal,
                Phase::Checkpoint,
                format!(
                    "the verifier's first reader (pyiceberg, or its merge-on-read for row deltas) and {} disagree \
                     on table {run}/{sink}: {} vs {} rows",
                    seen.second_reader,
                    seen.ids.len(),
                    seen.second_ids.len()
                ),
            ));
        }
        Ok(seen)
    }
}

#[async_trait]
impl ConformanceTarget for Target {
    type Sink = IcebergSink;

    async fn create_sink(
        &self,
        run: &str,
        sink: &SinkId,
        subtask: SubtaskId,
    ) -> Result<IcebergSink> {
        let table = self.lake.table(&[run, sink.as_str()]);
        self.seen.lock().unwrap().remove(&table);
        let mut config =
            self.lake
                .config("conformance", sink, subtask.0, &table, conformance_schema());
        config.commit_every = self.commit_every;
        config.expire_snapshots = self.keep.is_some();
        if self.upsert {
            config.upsert_key = vec!["id".into()];
        }
        let created = IcebergSink::new(config).await?;
        if self.configured.lock().unwrap().insert(table.clone()) {
            if let Some(keep) = self.keep {
                self.lake.set_retention(&table, keep).await;
            }
            if let Some(min_count) = self.merge_at {
                self.lake.set_merge(&table, min_count).await;
            }
        }
        Ok(created)
    }

    async fn visible_ids(&self, run: &str, sink: &SinkId) -> Result<Vec<i64>> {
        let table = self.lake.table(&[run, sink.as_str()]);
        self.seen.lock().unwrap().remove(&table);
        Ok(self.seen(run, sink).await?.ids)
    }

    async fn leftovers(&self, run: &str, sink: &SinkId) -> Result<Vec<String>> {
        Ok(self.seen(run, sink).await?.unreferenced)
    }
}

/// Every scenario, with one randomized run instead of two: the variants beyond the two setups the issue names
/// (the suite's time is budgeted).
fn one_random_run() -> Conformance {
    Conformance {
        random_runs: 1,
        ..Conformance::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_catalog_with_local_warehouse_passes_the_conformance_harness() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::new(Lake::sqlite_local(dir.path(), "conf"), 1);
    run_conformance(
        "iceberg-sink, SQLite catalog, local warehouse",
        &target,
        &Conformance::default(),
    )
    .await
    .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_catalog_with_s3_warehouse_passes_the_conformance_harness() {
    let target = Target::new(Lake::postgres_s3("conf"), 1).merging(2);
    run_conformance(
        "iceberg-sink, PostgreSQL catalog, S3 warehouse, merging manifests at 2",
        &target,
        &Conformance::default(),
    )
    .await
    .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_catalog_with_s3_warehouse_passes_the_conformance_harness() {
    let target = Target::new(Lake::rest("conf"), 1)
        .expiring(2)
        .merging(2)
        .upserting();
    run_conformance(
        "iceberg-sink, REST catalog (SeaweedFS), S3 warehouse, expiring snapshots, merging manifests at 2, \
         upserting by id",
        &target,
        &one_random_run(),
    )
    .await
    .assert_passed();
}

/// One snapshot per three checkpoints: the files of the two in between ride in the committables, and recovery
/// commits whatever the restored one carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committing_every_third_checkpoint_passes_the_conformance_harness() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::new(Lake::sqlite_local(dir.path(), "every3"), 3)
        .expiring(2)
        .merging(2);
    run_conformance(
        "iceberg-sink, one snapshot per 3 checkpoints, SQLite catalog, expiring snapshots, merging manifests at 2",
        &target,
        &one_random_run(),
    )
    .await
    .assert_passed();
}

/// Row deltas on a SQL catalog: every record upserted by its id, each commit a snapshot of data files and the
/// ids' equality deletes (the REST run upserts too, expiring and merging).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserting_by_id_on_a_sql_catalog_passes_the_conformance_harness() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::new(Lake::sqlite_local(dir.path(), "upsert"), 1).upserting();
    run_conformance(
        "iceberg-sink, SQLite catalog, local warehouse, upserting by id",
        &target,
        &one_random_run(),
    )
    .await
    .assert_passed();
}
