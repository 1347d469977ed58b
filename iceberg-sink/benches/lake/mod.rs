//! The benchmarks' table: a SQLite catalog and a local warehouse in a temporary directory, and the sink
//! configuration writing `bench.events` there.
// Each bench binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::time::Duration;

use connector_api::{SinkId, SubtaskId};
use iceberg_sink::{CatalogConfig, DEFAULT_TARGET_FILE_SIZE, IcebergSinkConfig, S3Settings};
use ratchet_conformance::conformance_schema;

pub struct Lake {
    _dir: tempfile::TempDir,
    pub uri: String,
    pub python_uri: String,
    pub warehouse: String,
}

pub fn lake() -> Lake {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("catalog.db");
    Lake {
        uri: format!("sqlite://{}?mode=rwc", db.display()),
        python_uri: format!("sqlite:///{}", db.display()),
        warehouse: format!("file://{}", dir.path().join("warehouse").display()),
        _dir: dir,
    }
}

pub fn config(lake: &Lake) -> IcebergSinkConfig {
    IcebergSinkConfig {
        job: SinkId::new("bench").unwrap(),
        sink: SinkId::new("lake").unwrap(),
        subtask: SubtaskId(0),
        schema: conformance_schema(),
        catalog: CatalogConfig::Sql {
            uri: lake.uri.clone(),
            warehouse: lake.warehouse.clone(),
        },
        catalog_name: "ratchet".into(),
        s3: S3Settings::default(),
        table: "bench.events".into(),
        create_table: true,
        evolution: connector_api::Evolution::None,
        target_file_size: DEFAULT_TARGET_FILE_SIZE,
        commit_every: 1,
        commit_timeout: Duration::from_secs(60),
        cleanup_on_recover: true,
        expire_snapshots: false,
        upsert_key: Vec::new(),
        upsert_deletes: Default::default(),
        sweep_orphans_after: None,
        // The measured runs compact only where they say so (docs/benchmarks.md), not by the created table's default.
        compact: iceberg_sink::Compact::Off,
        layout: iceberg_sink::TableLayout::default(),
    }
}

/// Creates the benchmarks' table `bench.events` (the conformance columns, unpartitioned) as a format-version 3
/// table, as another engine would (the sink creates version 2 tables); the sink then writes it as it finds it.
pub async fn create_version_3_table(lake: &Lake) {
    let catalog = config(lake)
        .catalog
        .open("ratchet", &S3Settings::default())
        .await
        .unwrap();
    let namespace = iceberg::NamespaceIdent::new("bench".into());
    if !catalog.namespace_exists(&namespace).await.unwrap() {
        catalog
            .create_namespace(&namespace, Default::default())
            .await
            .unwrap();
    }
    let schema =
        iceberg::arrow::arrow_schema_to_schema_auto_assign_ids(&conformance_schema()).unwrap();
    catalog
        .create_table(
            &namespace,
            iceberg::TableCreation::builder()
                .name("events".into())
                .schema(schema)
                .format_version(iceberg::spec::FormatVersion::V3)
                .build(),
        )
        .await
        .unwrap();
}
