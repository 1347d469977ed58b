//! Schema evolution (`evolution = "add-columns"`) on real tables, SQL and REST catalogs, read back by pyiceberg and
//! DuckDB: at a checkpoint boundary the sink adds the new column (one schema update through the catalog) before
//! any row of it is written; an instance still on the old schema goes on committing into the evolved table (its
//! rows read as null there); a second instance adding the same column changes nothing; `evolution = "none"`
//! refuses naming the column and the setting.

use crate::common;

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use common::Lake;
use connector_api::{
    Driver, DriverConfig, ErrorKind, Evolution, LocalCheckpointStore, SinkId, SourceOffset,
};
use iceberg_sink::IcebergSink;
use ratchet_conformance::conformance_schema;

fn with_qty() -> SchemaRef {
    let mut fields: Vec<Field> = conformance_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("qty", DataType::Int64, true));
    Arc::new(Schema::new(fields))
}

fn rows(schema: &SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(ids.clone())),
        Arc::new(StringArray::from_iter_values(
            ids.clone().map(|i| format!("p{i}")),
        )),
    ];
    if schema.fields().len() == 3 {
        columns.push(Arc::new(Int64Array::from_iter_values(ids)));
    }
    RecordBatch::try_new(schema.clone(), columns).unwrap()
}

fn positions(next: i64) -> Vec<SourceOffset> {
    vec![SourceOffset {
        topic: "t".into(),
        partition: 0,
        next_offset: next,
        topic_id: None,
    }]
}

async fn driver(
    lake: &Lake,
    table: &str,
    subtask: u32,
    evolution: Evolution,
    state: &std::path::Path,
) -> (Driver<LocalCheckpointStore>, connector_api::SinkHandle) {
    let sink = SinkId::new("lake").unwrap();
    let config = iceberg_sink::IcebergSinkConfig {
        evolution,
        ..lake.config("evolving", &sink, subtask, table, conformance_schema())
    };
    let mut driver = Driver::new(
        LocalCheckpointStore::open(state, 3).unwrap(),
        DriverConfig::default(),
    );
    let handle = driver
        .add_sink(IcebergSink::new(config).await.unwrap())
        .unwrap();
    driver.start().await.unwrap();
    (driver, handle)
}

async fn evolves_at_a_checkpoint_boundary(lake: Lake) {
    let table = lake.table(&["evolving"]);
    let (first_state, second_state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut first, sink) =
        driver(&lake, &table, 0, Evolution::AddColumns, first_state.path()).await;
    let (mut second, old) =
        driver(&lake, &table, 1, Evolution::AddColumns, second_state.path()).await;
    first
        .write(sink, &rows(&conformance_schema(), 0..3))
        .await
        .unwrap();
    first.checkpoint(positions(3)).await.unwrap();

    first.evolve(&[sink], with_qty()).await.unwrap();
    first.write(sink, &rows(&with_qty(), 3..6)).await.unwrap();
    first.checkpoint(positions(6)).await.unwrap();
    first.close().await.unwrap();

    // The second instance, still on the old schema, commits into the evolved table; then takes the change too,
    // which finds the column there and changes nothing.
    second
        .write(old, &rows(&conformance_schema(), 6..8))
        .await
        .unwrap();
    second.checkpoint(positions(8)).await.unwrap();
    second.evolve(&[old], with_qty()).await.unwrap();
    second.write(old, &rows(&with_qty(), 8..10)).await.unwrap();
    second.checkpoint(positions(10)).await.unwrap();
    second.close().await.unwrap();

    let (reader, name) = (lake.clone(), table.clone());
    let (seen, columns) =
        tokio::task::spawn_blocking(move || (reader.read(&name), reader.non_null_ids(&name)))
            .await
            .unwrap();
    assert_eq!(seen.ids, (0..10).collect::<Vec<_>>());
    assert_eq!(seen.duckdb_ids, seen.ids);
    assert!(seen.unreferenced.is_empty(), "{:?}", seen.unreferenced);
    assert_eq!(columns["qty"], serde_json::json!([3, 4, 5, 8, 9]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_catalog_table_gains_the_column_at_the_boundary() {
    let dir = tempfile::tempdir().unwrap();
    evolves_at_a_checkpoint_boundary(Lake::sqlite_local(dir.path(), "evolve")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_catalog_table_gains_the_column_at_the_boundary() {
    evolves_at_a_checkpoint_boundary(Lake::rest("evolve")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_evolution_the_change_is_refused_naming_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "no-evolve");
    let table = lake.table(&["fixed"]);
    let state = tempfile::tempdir().unwrap();
    let (mut driver, sink) = driver(&lake, &table, 0, Evolution::None, state.path()).await;
    let err = driver.evolve(&[sink], with_qty()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("qty") && text.contains("add-columns"),
        "{text}"
    );
}

/// `id`, `payload`, then `qty` as each side of the widening types it.
fn with_qty_typed(qty: DataType, nullable: bool) -> SchemaRef {
    let mut fields: Vec<Field> = conformance_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("qty", qty, nullable));
    Arc::new(Schema::new(fields))
}

/// Rows `ids` of `schema`, `qty` the id (as an int) or, widened, the id times ten billion, null for odd ids when
/// the column takes nulls.
fn typed_rows(schema: &SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
    let base = rows(&conformance_schema(), ids.clone());
    let qty: ArrayRef = match schema.field(2).data_type() {
        DataType::Int32 => Arc::new(arrow_array::Int32Array::from_iter_values(
            ids.map(|i| i as i32),
        )),
        _ => Arc::new(Int64Array::from_iter(
            ids.map(|i| (i % 2 == 0).then_some(i * 10_000_000_000)),
        )),
    };
    let mut columns = base.columns().to_vec();
    columns.push(qty);
    RecordBatch::try_new(schema.clone(), columns).unwrap()
}

/// `evolution = "evolve"`: a required int column becomes an optional long at a checkpoint boundary (a new table
/// schema, same field id, through Ratchet's own commit); an instance still on the old schema goes on committing
/// int rows into it; a third, killed after its int rows' checkpoint record was durable, restarts on the new schema
/// and its recovery commits them. pyiceberg and Iceberg's Java library read every value, the old files' promoted.
async fn widens_at_a_checkpoint_boundary(lake: Lake) {
    let table = lake.table(&["widening"]);
    let narrow = with_qty_typed(DataType::Int32, false);
    let wide = with_qty_typed(DataType::Int64, true);
    let open = |subtask: u32, state: std::path::PathBuf, schema: SchemaRef, crash: bool| {
        let (lake, table) = (lake.clone(), table.clone());
        async move {
            let sink = SinkId::new("lake").unwrap();
            let config = iceberg_sink::IcebergSinkConfig {
                evolution: Evolution::Evolve,
                ..lake.config("widening", &sink, subtask, &table, schema)
            };
            let crashes: connector_api::FaultInjector = Arc::new(
                move |_: connector_api::CheckpointId, point: &connector_api::FaultPoint| {
                    crash && matches!(point, connector_api::FaultPoint::AfterRecordDurable)
                },
            );
            let mut driver = Driver::new(
                LocalCheckpointStore::open(&state, 3).unwrap(),
                DriverConfig::default(),
            )
            .with_fault_injector(crashes);
            let handle = driver
                .add_sink(IcebergSink::new(config).await.unwrap())
                .unwrap();
            driver.start().await.unwrap();
            (driver, handle)
        }
    };
    let (first_state, second_state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let third_state = tempfile::tempdir().unwrap();
    let (mut first, sink) = open(0, first_state.path().to_path_buf(), narrow.clone(), false).await;
    let (mut second, old) = open(1, second_state.path().to_path_buf(), narrow.clone(), false).await;
    first.write(sink, &typed_rows(&narrow, 0..3)).await.unwrap();
    first.checkpoint(positions(3)).await.unwrap();
    first.evolve(&[sink], wide.clone()).await.unwrap();
    first.write(sink, &typed_rows(&wide, 3..6)).await.unwrap();
    first.checkpoint(positions(6)).await.unwrap();
    first.close().await.unwrap();

    second.write(old, &typed_rows(&narrow, 6..8)).await.unwrap();
    second.checkpoint(positions(8)).await.unwrap();
    second.evolve(&[old], wide.clone()).await.unwrap();
    second.write(old, &typed_rows(&wide, 8..10)).await.unwrap();
    second.checkpoint(positions(10)).await.unwrap();
    second.close().await.unwrap();

    let third_dir = third_state.path().to_path_buf();
    let (mut third, killed) = open(2, third_dir.clone(), narrow.clone(), true).await;
    third
        .write(killed, &typed_rows(&narrow, 10..12))
        .await
        .unwrap();
    let crashed = third.checkpoint(positions(12)).await.unwrap_err();
    assert!(crashed.to_string().contains("injected crash"), "{crashed}");
    drop(third);
    let (third, _) = open(2, third_dir, wide.clone(), false).await;
    third.close().await.unwrap();

    let (reader, name) = (lake.clone(), table.clone());
    let (seen, rows, java) = tokio::task::spawn_blocking(move || {
        (
            reader.read(&name),
            reader.read_with(&name, "--rows"),
            reader.read_with(&name, "--java-rows"),
        )
    })
    .await
    .unwrap();
    assert_eq!(seen.ids, (0..12).collect::<Vec<_>>());
    assert!(seen.unreferenced.is_empty(), "{:?}", seen.unreferenced);
    let expected = |id: i64| match id {
        0..3 | 6..8 | 10..12 => Some(id),
        _ => (id % 2 == 0).then_some(id * 10_000_000_000),
    };
    for (names, rows) in [
        (&rows["column_names"], &rows["rows"]),
        (&java["java_column_names"], &java["java_rows"]),
    ] {
        assert_eq!(names[2], "qty", "{names}");
        let mut qty: Vec<(i64, Option<i64>)> = rows
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let number = |v: &serde_json::Value| {
                    v.as_i64()
                        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                };
                (number(&r[0]).unwrap(), number(&r[2]))
            })
            .collect();
        qty.sort();
        let want: Vec<(i64, Option<i64>)> = (0..12).map(|id| (id, expected(id))).collect();
        assert_eq!(qty, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_catalog_table_widens_the_column_at_the_boundary() {
    let dir = tempfile::tempdir().unwrap();
    widens_at_a_checkpoint_boundary(Lake::sqlite_local(dir.path(), "widen")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_catalog_table_widens_the_column_at_the_boundary() {
    widens_at_a_checkpoint_boundary(Lake::rest("widen")).await;
}
