//! Against a real SQL catalog (SQLite) with a local warehouse, checked with pyiceberg: one checkpoint = one
//! snapshot carrying the sink and checkpoint ids; committing the same checkpoint again changes nothing.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use connector_api::{CheckpointId, ErrorKind, SinkId};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::{Catalog, NamespaceIdent, TableCreation, TableIdent};
use iceberg_sink::{
    CatalogConfig, CommitOutcome, commit_checkpoint, last_committed_checkpoint, write_data_files,
};
use integration::Services;

fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
    let schema = Arc::new(ArrowSchema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let names: Vec<String> = ids.clone().map(|i| format!("n{i}")).collect();
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(ids)),
            Arc::new(StringArray::from_iter_values(names)),
        ],
    )
    .unwrap()
}

/// A SQLite SQL catalog with a local warehouse in `dir` and a `demo` namespace: (catalog, namespace, catalog URI
/// for pyiceberg, warehouse).
async fn catalog(dir: &std::path::Path) -> (Arc<dyn Catalog>, NamespaceIdent, String, String) {
    let db = dir.join("catalog.db");
    let warehouse = format!("file://{}", dir.join("warehouse").display());
    let config = CatalogConfig::Sql {
        uri: format!("sqlite://{}?mode=rwc", db.display()),
        warehouse: warehouse.clone(),
    };
    let catalog = config.open("ratchet").await.unwrap();
    let namespace = NamespaceIdent::new("demo".into());
    catalog
        .create_namespace(&namespace, HashMap::new())
        .await
        .unwrap();
    (
        catalog,
        namespace,
        format!("sqlite:///{}", db.display()),
        warehouse,
    )
}

#[tokio::test]
async fn one_snapshot_per_checkpoint_and_recommit_is_a_no_op() {
    let services = Services::get();
    let dir = tempfile::tempdir().unwrap();
    let (catalog, namespace, catalog_uri, warehouse) = catalog(dir.path()).await;
    let schema = Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap();
    let creation = TableCreation::builder()
        .name("events".into())
        .schema(schema)
        .build();
    let table = catalog.create_table(&namespace, creation).await.unwrap();
    let ident = TableIdent::new(namespace, "events".into());
    let sink = SinkId::new("lake").unwrap();

    let files = write_data_files(&table, "lake-0-1", &[batch(0..50), batch(50..80)])
        .await
        .unwrap();
    let outcome = commit_checkpoint(
        catalog.as_ref(),
        &ident,
        &sink,
        CheckpointId(1),
        files.clone(),
    )
    .await
    .unwrap();
    assert_eq!(outcome, CommitOutcome::Committed);
    // A repeated commit (crash after the catalog accepted it) is recognised from the table's history.
    let again = commit_checkpoint(catalog.as_ref(), &ident, &sink, CheckpointId(1), files)
        .await
        .unwrap();
    assert_eq!(again, CommitOutcome::AlreadyCommitted);
    let table = catalog.load_table(&ident).await.unwrap();
    assert_eq!(
        last_committed_checkpoint(&table, &sink),
        Some(CheckpointId(1))
    );

    let seen = services.verify(
        "iceberg_sql_table.py",
        &["ratchet", &catalog_uri, &warehouse, "demo.events", "id"],
    );
    assert_eq!(seen["rows"], 80);
    assert_eq!(seen["ids"].as_array().unwrap().len(), 80);
    let snapshots = seen["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    assert_eq!(snapshots[0]["summary"]["ratchet.checkpoint-id"], "1");
    assert_eq!(snapshots[0]["summary"]["ratchet.sink-id"], "lake");
}

#[tokio::test]
async fn a_batch_missing_a_column_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, namespace, _, _) = catalog(dir.path()).await;
    let schema = Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "amount", Type::Primitive(PrimitiveType::Long)).into(),
        ])
        .build()
        .unwrap();
    let table = catalog
        .create_table(
            &namespace,
            TableCreation::builder()
                .name("t".into())
                .schema(schema)
                .build(),
        )
        .await
        .unwrap();
    let err = write_data_files(&table, "p", &[batch(0..1)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRecord);
    assert!(err.to_string().contains("no column \"amount\""), "{err}");
}
