//! Cleanup of unreferenced data files never deletes a file a snapshot references or another instance still needs,
//! on real tables read back by pyiceberg and DuckDB: a table whose location holds `//` (derived from a warehouse
//! ending in `/`), string partition values holding `/` (escaped into one path segment), and a stale instance's
//! cleanup after a newer instance recovered the subtask and pre-committed files of its own.

use crate::common;

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use common::Lake;
use connector_api::{CheckpointId, Committer, ErrorKind, SinkId, TwoPhaseCommit};
use iceberg::TableCreation;
use iceberg::spec::{NestedField, PrimitiveType, Schema, Transform, Type, UnboundPartitionSpec};
use iceberg_sink::IcebergSink;

fn schema() -> Arc<ArrowSchema> {
    Arc::new(ArrowSchema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("region", DataType::Utf8, false),
    ]))
}

fn iceberg_schema() -> Schema {
    Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::required(2, "region", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap()
}

fn rows(ids: std::ops::Range<i64>, regions: &[&str]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter_values(
                ids.map(|i| regions[i as usize % regions.len()]),
            )),
        ],
    )
    .unwrap()
}

async fn sink(lake: &Lake, table: &str) -> IcebergSink {
    let config = lake.config("cleanup", &SinkId::new("lake").unwrap(), 0, table, schema());
    IcebergSink::new(config).await.unwrap()
}

/// Recovers a fresh instance, writes `ids` as checkpoint `checkpoint` and commits it.
async fn commit_checkpoint(
    lake: &Lake,
    table: &str,
    checkpoint: u64,
    ids: std::ops::Range<i64>,
    regions: &[&str],
) {
    let mut sink = sink(lake, table).await;
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(checkpoint)).await.unwrap();
    sink.write(&rows(ids, regions)).await.unwrap();
    let committable = sink.pre_commit(CheckpointId(checkpoint)).await.unwrap();
    sink.committer().commit(vec![committable]).await.unwrap();
}

async fn read(lake: &Lake, table: &str) -> common::Seen {
    let (lake, table) = (lake.clone(), table.to_string());
    tokio::task::spawn_blocking(move || lake.read(&table))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_located_under_a_double_slash_keeps_its_committed_files_through_recoveries() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "slashes");
    let (catalog, namespace) = lake.catalog_with_namespace().await;
    // What a warehouse given as `file:///.../warehouse/` made of a table's location before it was trimmed.
    let location = format!("{}//{}/orders", lake.warehouse, lake.namespace);
    catalog
        .create_table(
            &namespace,
            TableCreation::builder()
                .name("orders".into())
                .location(location)
                .schema(iceberg_schema())
                .build(),
        )
        .await
        .unwrap();
    let table = lake.table(&["orders"]);
    commit_checkpoint(&lake, &table, 1, 0..20, &["eu"]).await;
    commit_checkpoint(&lake, &table, 2, 20..40, &["eu"]).await;
    // Two more recoveries, each cleaning up.
    for _ in 0..2 {
        sink(&lake, &table).await.recover(None).await.unwrap();
    }
    let seen = read(&lake, &table).await;
    assert_eq!(seen.ids, (0..40).collect::<Vec<_>>());
    assert_eq!(seen.duckdb_ids, seen.ids);
    assert!(seen.unreferenced.is_empty(), "{:?}", seen.unreferenced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_partition_values_holding_slashes_are_one_escaped_directory_and_survive_cleanup() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "values");
    let (catalog, namespace) = lake.catalog_with_namespace().await;
    let spec = UnboundPartitionSpec::builder()
        .add_partition_field(2, "region", Transform::Identity)
        .unwrap()
        .build();
    catalog
        .create_table(
            &namespace,
            TableCreation::builder()
                .name("events".into())
                .schema(iceberg_schema())
                .partition_spec(spec)
                .build(),
        )
        .await
        .unwrap();
    let table = lake.table(&["events"]);
    let regions = ["a/b", "a//b", "abc/", "x y%"];
    let mut sink = sink(&lake, &table).await;
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(1)).await.unwrap();
    sink.write(&rows(0..40, &regions)).await.unwrap();
    let committable = sink.pre_commit(CheckpointId(1)).await.unwrap();
    sink.committer()
        .commit(vec![committable.clone()])
        .await
        .unwrap();
    let directories: std::collections::BTreeSet<String> = committable
        .files
        .iter()
        .map(|f| {
            let (dir, _) = f.path.rsplit_once('/').unwrap();
            dir.rsplit_once('/').unwrap().1.to_string()
        })
        .collect();
    assert_eq!(
        directories,
        [
            "region=a%2F%2Fb",
            "region=a%2Fb",
            "region=abc%2F",
            "region=x+y%25"
        ]
        .into_iter()
        .map(String::from)
        .collect()
    );
    // A later instance's recovery cleans up: nothing committed goes.
    drop(sink);
    let mut next = self::sink(&lake, &table).await;
    next.recover(None).await.unwrap();
    assert_eq!(
        next.delete_unreferenced_files().await.unwrap(),
        Vec::<String>::new()
    );
    let seen = read(&lake, &table).await;
    assert_eq!(seen.ids, (0..40).collect::<Vec<_>>());
    assert_eq!(seen.duckdb_ids, seen.ids);
    assert!(seen.unreferenced.is_empty(), "{:?}", seen.unreferenced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_instance_never_deletes_the_files_a_newer_instance_pre_committed() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "stale");
    let table = lake.table(&["orders"]);
    let mut stale = sink(&lake, &table).await;
    stale.recover(None).await.unwrap();
    // A newer instance takes the subtask over and pre-commits checkpoint 5: its files are in no snapshot yet.
    let mut newer = sink(&lake, &table).await;
    newer.recover(None).await.unwrap();
    newer.begin(CheckpointId(5)).await.unwrap();
    newer.write(&rows(0..30, &["eu"])).await.unwrap();
    let decided = newer.pre_commit(CheckpointId(5)).await.unwrap();

    // The stale instance's maintenance call (or a recovery that lost its claim) runs now.
    let err = stale.delete_unreferenced_files().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    for file in &decided.files {
        let path = file.path.strip_prefix("file://").unwrap();
        assert!(std::path::Path::new(path).exists(), "{path} was deleted");
    }
    newer.committer().commit(vec![decided]).await.unwrap();
    let seen = read(&lake, &table).await;
    assert_eq!(seen.ids, (0..30).collect::<Vec<_>>());
    assert_eq!(seen.duckdb_ids, seen.ids);
}

/// A decided checkpoint whose data file is deleted before its commit (as a foreign orphan removal with a cut-off
/// shorter than a stalled commit would) is refused by name and the table stays as it was; a checkpoint the table
/// already shows is committed again without the check (its files may have been compacted away since); and a
/// zombie whose uncommitted files a newer instance's recovery deleted is told it was fenced, not that a file is
/// gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_gone_before_its_commit_is_refused_naming_it_unless_committed_or_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "vanished");
    let table = lake.table(&["orders"]);
    commit_checkpoint(&lake, &table, 1, 0..20, &["eu"]).await;
    let local = |path: &str| std::path::PathBuf::from(path.strip_prefix("file://").unwrap());

    let mut sink = self::sink(&lake, &table).await;
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(2)).await.unwrap();
    sink.write(&rows(20..40, &["eu"])).await.unwrap();
    let decided = sink.pre_commit(CheckpointId(2)).await.unwrap();
    let gone = &decided.files[0].path;
    std::fs::remove_file(local(gone)).unwrap();
    let refused = sink
        .committer()
        .commit(vec![decided.clone()])
        .await
        .unwrap_err();
    let said = connector_api::Report(&refused).to_string();
    assert_eq!(refused.kind(), ErrorKind::Fatal, "{said}");
    assert!(
        said.contains(gone.rsplit('/').next().unwrap()) && said.contains("remove_orphan_files"),
        "{said}"
    );
    assert_eq!(read(&lake, &table).await.ids, (0..20).collect::<Vec<_>>());

    // Committed, then its file moved away: committing it again finds it in the table and checks nothing.
    let mut sink = self::sink(&lake, &table).await;
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(3)).await.unwrap();
    sink.write(&rows(40..60, &["eu"])).await.unwrap();
    let committed = sink.pre_commit(CheckpointId(3)).await.unwrap();
    sink.committer()
        .commit(vec![committed.clone()])
        .await
        .unwrap();
    let moved = local(&committed.files[0].path);
    let aside = moved.with_extension("aside");
    std::fs::rename(&moved, &aside).unwrap();
    sink.committer().commit(vec![committed]).await.unwrap();
    std::fs::rename(&aside, &moved).unwrap();

    // A zombie pre-commits; a newer instance recovers the subtask and deletes the zombie's unreferenced files.
    sink.begin(CheckpointId(4)).await.unwrap();
    sink.write(&rows(60..80, &["eu"])).await.unwrap();
    let zombie = sink.pre_commit(CheckpointId(4)).await.unwrap();
    self::sink(&lake, &table).await.recover(None).await.unwrap();
    assert!(!local(&zombie.files[0].path).exists(), "recovery's cleanup");
    let fenced = sink.committer().commit(vec![zombie]).await.unwrap_err();
    assert_eq!(
        fenced.kind(),
        ErrorKind::Fenced,
        "{}",
        connector_api::Report(&fenced)
    );
    let seen = read(&lake, &table).await;
    assert_eq!(
        seen.ids,
        (0..20).chain(40..60).collect::<Vec<_>>(),
        "checkpoints 1 and 3 once"
    );
    assert_eq!(seen.duckdb_ids, seen.ids);
}
