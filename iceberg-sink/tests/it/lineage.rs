//! Format-version 3 tables: each row's `_row_id` (row lineage) survives Ratchet's own commits.

use std::collections::BTreeMap;

use crate::common::Lake;
use crate::common::appends::{ROWS, ids, java_ids, run};
use connector_api::SinkId;
use iceberg::spec::FormatVersion;
use iceberg_sink::{MANIFEST_MERGE_ENABLED, MANIFEST_MIN_COUNT_TO_MERGE};
use ratchet_conformance::conformance_schema;

/// Spark's `[id, _row_id, _last_updated_sequence_number]` rows by id.
fn by_id(rows: &serde_json::Value) -> BTreeMap<i64, (i64, i64)> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let field = |i: usize| {
                row[i]
                    .as_i64()
                    .unwrap_or_else(|| panic!("a null or non-number in {row}"))
            };
            (field(0), (field(1), field(2)))
        })
        .collect()
}

/// A v3 table (created by someone else, as v3 tables are: the sink creates v2) that asks for manifest merging at
/// 3 manifests: the sink's checkpoints are committed through its own commit, which rewrites manifests, and every
/// row keeps the `_row_id` and `_last_updated_sequence_number` it had in the snapshot that added it. Without the
/// inherited `first_row_id`s written into the merged entries, a merge would hand the rows new ids. Read by Spark
/// with Iceberg 1.12's runtime (lineage, per snapshot) and Iceberg's Java library (every row once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v3_tables_rows_keep_their_row_ids_through_the_sinks_manifest_merges() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "lineage");
    let (_, table) = lake
        .create_foreign_table(
            "v3",
            FormatVersion::V3,
            &[
                (MANIFEST_MERGE_ENABLED, "true"),
                (MANIFEST_MIN_COUNT_TO_MERGE, "3"),
            ],
        )
        .await;
    let config = lake.config(
        "lineage",
        &SinkId::new("lake").unwrap(),
        0,
        &table,
        conformance_schema(),
    );
    let checkpoints = 8;
    run(&config, &dir.path().join("state"), 0, checkpoints).await;

    let lineage = lake.spark_lineage(&table).await;
    let current = by_id(&lineage["current"]);
    let expected: Vec<i64> = (0..checkpoints * ROWS).collect();
    assert_eq!(
        current.keys().copied().collect::<Vec<_>>(),
        expected,
        "Spark"
    );
    let distinct: std::collections::BTreeSet<i64> =
        current.values().map(|(row_id, _)| *row_id).collect();
    assert_eq!(
        distinct.len(),
        current.len(),
        "every _row_id once: {current:?}"
    );
    let manifests = lineage["manifests"].as_i64().unwrap();
    assert!(
        manifests < checkpoints,
        "the sink's commits merged the manifests ({manifests} for {checkpoints} checkpoints)"
    );
    let snapshots = lineage["snapshots"].as_object().unwrap();
    assert!(snapshots.len() as i64 > checkpoints, "{snapshots:?}");
    for (snapshot, rows) in snapshots {
        for (id, then) in by_id(rows) {
            assert_eq!(
                current.get(&id),
                Some(&then),
                "row {id}: its (_row_id, _last_updated_sequence_number) in snapshot {snapshot} and now"
            );
        }
    }
    assert_eq!(
        java_ids(&lake, &table).await,
        expected,
        "Iceberg's Java library"
    );
    let seen = crate::common::appends::metadata_files(&lake, &table).await;
    assert_eq!(ids(&seen["ids"]), expected, "pyiceberg");
}
