//! Helpers of the tests that append the conformance records (`maintenance.rs`, `compaction.rs`): runs of
//! committed checkpoints through the driver, and what each independent reader sees of the table afterwards.

use std::path::Path;

use iceberg_sink::IcebergSinkConfig;
use ratchet_conformance::{conformance_batch as batch, conformance_positions};

use super::{Lake, Seen};

/// Records per checkpoint of [`run`].
pub const ROWS: i64 = 50;

/// Runs `checkpoints` checkpoints of [`ROWS`] records with ids from `first` (positions count from 0, resumed from
/// the local store under `state`), each committed before the next.
pub async fn run(config: &IcebergSinkConfig, state: &Path, first: i64, checkpoints: i64) {
    let (mut job, sink, restored) = super::started(state, config).await;
    let mut next = restored.positions.first().map_or(0, |p| p.next_offset);
    for _ in 0..checkpoints {
        job.write(sink, &batch(first + next..first + next + ROWS))
            .await
            .unwrap();
        next += ROWS;
        job.checkpoint(conformance_positions(next)).await.unwrap();
        job.finish_commit().await.unwrap();
    }
    job.close().await.unwrap();
}

/// [`Lake::metadata_files`] off the async runtime.
pub async fn metadata_files(lake: &Lake, table: &str) -> serde_json::Value {
    let (lake, table) = (lake.clone(), table.to_string());
    tokio::task::spawn_blocking(move || lake.metadata_files(&table))
        .await
        .unwrap()
}

/// [`Lake::read`] off the async runtime.
pub async fn read(lake: &Lake, table: &str) -> Seen {
    let (lake, table) = (lake.clone(), table.to_string());
    tokio::task::spawn_blocking(move || lake.read(&table))
        .await
        .unwrap()
}

/// The verifier's JSON list of ids as numbers.
pub fn ids(value: &serde_json::Value) -> Vec<i64> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

/// The ids Iceberg's Java library reads from `table` (`IcebergGenerics`), sorted.
pub async fn java_ids(lake: &Lake, table: &str) -> Vec<i64> {
    let (lake, table) = (lake.clone(), table.to_string());
    let java = tokio::task::spawn_blocking(move || lake.read_with(&table, "--java-rows"))
        .await
        .unwrap();
    let position = java["java_column_names"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| c == "id")
        .expect("an id column");
    let mut ids: Vec<i64> = java["java_rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row[position].as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    ids
}

/// The ids Spark (4.1 with Iceberg 1.12's runtime) reads from `table`, sorted.
pub async fn spark_ids(lake: &Lake, table: &str) -> Vec<i64> {
    let mut ids: Vec<i64> = lake
        .spark_rows(table)
        .await
        .iter()
        .map(|row| row["id"].as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    ids
}

/// Every retained snapshot of `seen` ([`metadata_files`]) read back its summary's `total-records` in pyiceberg,
/// and every data file kept the snapshot that added it and its sequence numbers in every manifest naming it
/// (merges and compactions rewrite entries).
pub fn assert_every_snapshot_reads_back(seen: &serde_json::Value, context: &str) {
    assert_eq!(
        seen["inconsistent_entries"],
        serde_json::json!([]),
        "{context}: files whose snapshot id or sequence numbers changed between manifests"
    );
    let states = seen["snapshot_rows"].as_array().unwrap();
    assert!(!states.is_empty(), "{context}: no snapshot");
    for state in states {
        assert_eq!(
            state["rows"], state["total_records"],
            "{context}: pyiceberg at snapshot {}",
            state["snapshot_id"]
        );
    }
}
