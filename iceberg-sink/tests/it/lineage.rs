//! Format-version 3 tables: each row's `_row_id` (row lineage) survives Ratchet's own commits, and a SIGKILL at
//! each step of a merging commit.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::appends::{ROWS, ids, java_ids, metadata_files, run};
use crate::common::{self, Lake};
use connector_api::SinkId;
use iceberg::spec::FormatVersion;
use iceberg_sink::{IcebergSinkConfig, MANIFEST_MERGE_ENABLED, MANIFEST_MIN_COUNT_TO_MERGE};
use ratchet_conformance::conformance_schema;

const CHILD_DIR: &str = "RATCHET_ICEBERG_LINEAGE_CHILD";
const CHILD_TABLE: &str = "RATCHET_ICEBERG_LINEAGE_TABLE";

/// A v3 table created by someone else (as v3 tables are: the sink creates v2) that asks for manifest merging at 3
/// manifests, so the sink's commits go through its own commit and rewrite manifests.
async fn merging_v3_table(lake: &Lake) -> String {
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
    table
}

/// Subtask 0 of sink `lake` appending the conformance records to `table`.
fn config(lake: &Lake, table: &str) -> IcebergSinkConfig {
    lake.config(
        "lineage",
        &SinkId::new("lake").unwrap(),
        0,
        table,
        conformance_schema(),
    )
}

/// Spark's `[id, _row_id, _last_updated_sequence_number]` rows by id.
pub(crate) fn by_id(rows: &serde_json::Value) -> BTreeMap<i64, (i64, i64)> {
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

/// Asserts what the readers see of `table` after `checkpoints` checkpoints whose ids are `expected`: Spark (Iceberg
/// 1.12) reads every id once, each `_row_id` once, and in every retained snapshot each row with the `_row_id` and
/// `_last_updated_sequence_number` it has now; the sink's commits merged manifests (the current snapshot names at
/// most `max_manifests`); Iceberg's Java library and pyiceberg read every id once.
async fn assert_lineage_kept(
    lake: &Lake,
    table: &str,
    (expected, max_manifests): (&[i64], u64),
    context: &str,
) {
    let lineage = lake.spark_lineage(table).await;
    let current = by_id(&lineage["current"]);
    assert_eq!(
        current.keys().copied().collect::<Vec<_>>(),
        expected,
        "{context}: Spark"
    );
    let distinct: BTreeSet<i64> = current.values().map(|(row_id, _)| *row_id).collect();
    assert_eq!(
        distinct.len(),
        current.len(),
        "{context}: every _row_id once: {current:?}"
    );
    let manifests = lineage["manifests"].as_u64().unwrap();
    assert!(
        manifests <= max_manifests,
        "{context}: the current snapshot names {manifests} manifests, more than {max_manifests}"
    );
    for (snapshot, rows) in lineage["snapshots"].as_object().unwrap() {
        for (id, then) in by_id(rows) {
            assert_eq!(
                current.get(&id),
                Some(&then),
                "{context}: row {id}: its (_row_id, _last_updated_sequence_number) in snapshot {snapshot} and now"
            );
        }
    }
    assert_eq!(
        java_ids(lake, table).await,
        expected,
        "{context}: Iceberg's Java library"
    );
    let seen = metadata_files(lake, table).await;
    assert_eq!(ids(&seen["ids"]), expected, "{context}: pyiceberg");
}

/// The sink appends 8 checkpoints to a merging v3 table: every row keeps the `_row_id` and
/// `_last_updated_sequence_number` it had in the snapshot that added it. Without the inherited `first_row_id`s
/// written into the merged entries, a merge would hand the rows new ids (this test fails then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v3_tables_rows_keep_their_row_ids_through_the_sinks_manifest_merges() {
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "lineage");
    let table = merging_v3_table(&lake).await;
    let checkpoints = 8;
    run(
        &config(&lake, &table),
        &dir.path().join("state"),
        0,
        checkpoints,
    )
    .await;
    let expected: Vec<i64> = (0..checkpoints * ROWS).collect();
    // Merging at 3 leaves at most 2 manifests.
    assert_lineage_kept(&lake, &table, (&expected, 2), "8 checkpoints").await;
}

/// The sink compacts the small files of a v3 table inside its commits (`compact`, every second checkpoint): the
/// rewritten files carry each moved row's `_row_id` and `_last_updated_sequence_number`, so every row keeps, in every
/// retained snapshot, the lineage it had when it was added. Without them written, a compaction hands the rows it
/// moves new ids (this test fails then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v3_tables_rows_keep_their_row_ids_through_the_sinks_compactions() {
    use iceberg_sink::{Compact, CompactPolicy};
    test_support::Services::get();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "lineage");
    let table = merging_v3_table(&lake).await;
    let config = IcebergSinkConfig {
        compact: Compact::On(CompactPolicy {
            target_file_size: 1 << 20,
            min_input_files: 2,
            ..Default::default()
        }),
        ..config(&lake, &table)
    };
    let checkpoints = 8;
    run(&config, &dir.path().join("state"), 0, checkpoints).await;
    let expected: Vec<i64> = (0..checkpoints * ROWS).collect();
    let seen = metadata_files(&lake, &table).await;
    let compacting = seen["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["summary"]["deleted-data-files"]
                .as_str()
                .is_some_and(|n| n != "0")
        })
        .count();
    assert!(compacting > 0, "no compaction: {:#}", seen["snapshots"]);
    assert_lineage_kept(&lake, &table, (&expected, 3), "8 compacting checkpoints").await;
}

/// The child of the kill test: runs 8 checkpoints of the table in `CHILD_TABLE` from the store under `CHILD_DIR`;
/// the drill in its environment kills it at the first merging commit. Returns at once in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let (Ok(dir), Ok(table)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_TABLE)) else {
        return;
    };
    let lake = Lake::sqlite_local(Path::new(&dir), "child");
    run(&config(&lake, &table), &Path::new(&dir).join("state"), 0, 8).await;
}

/// A SIGKILL after a v3 table's merged manifests and list were written (nothing committed) and after the merging
/// commit landed (nothing cleaned up), then a restart that recovers and commits 4 more checkpoints: every
/// checkpoint once, and every row's lineage as it was in each snapshot (the recovery's epoch raise and the later
/// commits merge again on the table the killed process left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_at_each_step_of_a_merging_commit_keeps_every_row_id_of_a_v3_table() {
    test_support::Services::get();
    for step in ["after-merging", "after-own-commit"] {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::sqlite_local(dir.path(), "killed");
        let table = merging_v3_table(&lake).await;
        common::killed_child(
            "lineage::child",
            &[
                (CHILD_DIR, &dir.path().display().to_string()),
                (CHILD_TABLE, &table),
            ],
            step,
        );
        let state = dir.path().join("state");
        run(&config(&lake, &table), &state, 0, 4).await;
        let next = common::decided_offset(&state).await;
        let expected: Vec<i64> = (0..next).collect();
        assert_lineage_kept(&lake, &table, (&expected, 2), step).await;
        let seen = metadata_files(&lake, &table).await;
        assert_eq!(
            common::checkpoints_in_two_snapshots(seen["snapshots"].as_array().unwrap()),
            Vec::<String>::new(),
            "{step}: checkpoints in two snapshots"
        );
    }
}
