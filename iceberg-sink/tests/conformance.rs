//! The conformance harness on the Iceberg sink, on the embedded default (SQLite catalog, local warehouse) and on
//! a PostgreSQL catalog with its warehouse in S3 (SeaweedFS); every visible row is read by pyiceberg and by
//! DuckDB's iceberg_scan, which must agree, and data files no snapshot references count as leftovers. Also on
//! SeaweedFS's REST catalog, and with one snapshot per three checkpoints.

mod common;

use async_trait::async_trait;
use common::Lake;
use connector_api::{Error, ErrorKind, Phase, Result, SinkId};
use iceberg_sink::IcebergSink;
use integration::conformance::{
    Conformance, ConformanceTarget, conformance_schema, run_conformance,
};

/// A lake and how many checkpoints each snapshot commits.
struct Target(Lake, u32);

impl Target {
    async fn seen(&self, run: &str, sink: &SinkId) -> Result<common::Seen> {
        let lake = self.0.clone();
        let table = lake.table(&[run, sink.as_str()]);
        let seen = tokio::task::spawn_blocking(move || lake.read(&table))
            .await
            .unwrap();
        if seen.ids != seen.duckdb_ids {
            return Err(Error::new(
                ErrorKind::Fatal,
                Phase::Checkpoint,
                format!(
                    "pyiceberg and DuckDB disagree on table {run}/{sink}: {} vs {} rows",
                    seen.ids.len(),
                    seen.duckdb_ids.len()
                ),
            ));
        }
        Ok(seen)
    }
}

#[async_trait]
impl ConformanceTarget for Target {
    type Sink = IcebergSink;

    async fn create_sink(&self, run: &str, sink: &SinkId) -> Result<IcebergSink> {
        let table = self.0.table(&[run, sink.as_str()]);
        let mut config = self
            .0
            .config("conformance", sink, 0, &table, conformance_schema());
        config.commit_every = self.1;
        IcebergSink::new(config).await
    }

    async fn visible_ids(&self, run: &str, sink: &SinkId) -> Result<Vec<i64>> {
        Ok(self.seen(run, sink).await?.ids)
    }

    async fn leftovers(&self, run: &str, sink: &SinkId) -> Result<Vec<String>> {
        Ok(self.seen(run, sink).await?.unreferenced)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_catalog_with_local_warehouse_passes_the_conformance_harness() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target(Lake::sqlite_local(dir.path(), "conf"), 1);
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
    let target = Target(Lake::postgres_s3("conf"), 1);
    run_conformance(
        "iceberg-sink, PostgreSQL catalog, S3 warehouse",
        &target,
        &Conformance::default(),
    )
    .await
    .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_catalog_with_s3_warehouse_passes_the_conformance_harness() {
    let target = Target(Lake::rest("conf"), 1);
    run_conformance(
        "iceberg-sink, REST catalog (SeaweedFS), S3 warehouse",
        &target,
        &Conformance::default(),
    )
    .await
    .assert_passed();
}

/// One snapshot per three checkpoints: the files of the two in between ride in the committables, and recovery
/// commits whatever the restored one carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committing_every_third_checkpoint_passes_the_conformance_harness() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target(Lake::sqlite_local(dir.path(), "every3"), 3);
    run_conformance(
        "iceberg-sink, one snapshot per 3 checkpoints, SQLite catalog",
        &target,
        &Conformance::default(),
    )
    .await
    .assert_passed();
}
