//! Shared setup of the Iceberg sink's tests: a catalog on a real server (SQLite file or PostgreSQL) with a local
//! or S3 (SeaweedFS) warehouse, and the independent reader (pyiceberg and DuckDB, `iceberg_table.py`).

pub mod appends;

use std::path::Path;
use std::time::Duration;

use arrow_schema::SchemaRef;
use connector_api::{SinkId, SubtaskId};
use iceberg_sink::{CatalogConfig, IcebergSinkConfig, S3Settings};
use test_support::Services;

/// A catalog and warehouse the tests write into, isolated by namespace.
#[derive(Debug, Clone)]
pub struct Lake {
    pub catalog: CatalogConfig,
    pub s3: S3Settings,
    /// The SQLAlchemy URI pyiceberg opens the same catalog with.
    pub python_uri: String,
    pub warehouse: String,
    pub namespace: String,
}

/// The sink's S3 settings for the SeaweedFS test endpoint.
fn seaweed_s3(s3: &test_support::S3Endpoint) -> S3Settings {
    S3Settings {
        endpoint: Some(s3.endpoint.clone()),
        region: Some(s3.region.clone()),
        access_key_id: Some(s3.access_key.clone()),
        secret_access_key: Some(s3.secret_key.clone().into()),
        force_path_style: true,
    }
}

/// A namespace no other test run uses.
pub fn unique_namespace(label: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{label}_{}_{}", std::process::id(), nanos % 1_000_000_000)
}

impl Lake {
    /// The embedded default: a SQLite catalog file and a local warehouse under `dir`.
    pub fn sqlite_local(dir: &Path, label: &str) -> Self {
        let db = dir.join("catalog.db");
        let warehouse = format!("file://{}", dir.join("warehouse").display());
        Lake {
            catalog: CatalogConfig::Sql {
                uri: format!("sqlite://{}?mode=rwc", db.display()),
                warehouse: warehouse.clone(),
            },
            s3: S3Settings::default(),
            python_uri: format!("sqlite:///{}", db.display()),
            warehouse,
            namespace: unique_namespace(label),
        }
    }

    /// A PostgreSQL catalog with its warehouse in the SeaweedFS test bucket.
    pub fn postgres_s3(label: &str) -> Self {
        let services = Services::get();
        let s3 = services.s3();
        let namespace = unique_namespace(label);
        let warehouse = format!("s3://{}/iceberg-tests/{namespace}", s3.bucket);
        let pg = services.pg_url().to_string();
        Lake {
            catalog: CatalogConfig::Sql {
                uri: pg.clone(),
                warehouse: warehouse.clone(),
            },
            s3: seaweed_s3(&s3),
            python_uri: pg.replacen("postgres://", "postgresql+psycopg://", 1),
            warehouse,
            namespace,
        }
    }

    /// A PostgreSQL catalog (the test database) with a local warehouse under `dir`.
    pub fn postgres_local(dir: &Path, label: &str) -> Self {
        let pg = Services::get().pg_url().to_string();
        let local = Lake::sqlite_local(dir, label);
        Lake {
            catalog: CatalogConfig::Sql {
                uri: pg.clone(),
                warehouse: local.warehouse.clone(),
            },
            python_uri: pg.replacen("postgres://", "postgresql+psycopg://", 1),
            ..local
        }
    }

    /// The host:port of the catalog's server (the PostgreSQL database or the REST server; `None` for SQLite).
    pub fn catalog_server(&self) -> Option<String> {
        let uri = match &self.catalog {
            CatalogConfig::Sql { uri, .. } | CatalogConfig::Rest { uri, .. } => uri,
        };
        let url = url::Url::parse(uri).ok()?;
        Some(format!("{}:{}", url.host_str()?, url.port()?))
    }

    /// This lake with its catalog reached at `proxy` (a host:port standing in for [`catalog_server`]'s).
    ///
    /// [`catalog_server`]: Self::catalog_server
    pub fn through(&self, proxy: &str) -> Self {
        let server = self.catalog_server().expect("a catalog reached over TCP");
        let mut lake = self.clone();
        match &mut lake.catalog {
            CatalogConfig::Sql { uri, .. } | CatalogConfig::Rest { uri, .. } => {
                *uri = uri.replace(&server, proxy);
            }
        }
        lake
    }

    /// SeaweedFS's Iceberg REST catalog (OAuth2 client credential = the S3 key pair) on its S3 Tables bucket.
    pub fn rest(label: &str) -> Self {
        let services = Services::get();
        let s3 = services.s3();
        let uri = services.var("RATCHET_ICEBERG_REST_URI").to_string();
        let warehouse = services.var("RATCHET_ICEBERG_REST_WAREHOUSE").to_string();
        Lake {
            catalog: CatalogConfig::Rest {
                uri: uri.clone(),
                warehouse: Some(warehouse.clone()),
                credential_env: None,
                props: [(
                    "credential".to_string(),
                    format!("{}:{}", s3.access_key, s3.secret_key),
                )]
                .into(),
            },
            s3: seaweed_s3(&s3),
            python_uri: uri,
            warehouse,
            namespace: unique_namespace(label),
        }
    }

    /// Opens the catalog and creates the lake's namespace (for tests that create tables themselves).
    pub async fn catalog_with_namespace(
        &self,
    ) -> (
        std::sync::Arc<dyn iceberg::Catalog>,
        iceberg::NamespaceIdent,
    ) {
        let catalog = self.catalog.open("ratchet", &self.s3).await.unwrap();
        let namespace = iceberg::NamespaceIdent::new(self.namespace.clone());
        catalog
            .create_namespace(&namespace, Default::default())
            .await
            .unwrap();
        (catalog, namespace)
    }

    /// Creates `name` in the lake's namespace from the conformance schema with iceberg-rust's own `create_table`,
    /// as another tool would (no `ratchet.*` property), of format `version` with `properties`; returns the
    /// catalog it opened and the table's `namespace.name`.
    pub async fn create_foreign_table(
        &self,
        name: &str,
        version: iceberg::spec::FormatVersion,
        properties: &[(&str, &str)],
    ) -> (std::sync::Arc<dyn iceberg::Catalog>, String) {
        self.create_foreign_table_of(
            name,
            version,
            properties,
            &ratchet_conformance::conformance_schema(),
        )
        .await
    }

    /// [`create_foreign_table`](Self::create_foreign_table) with the columns of `schema`.
    pub async fn create_foreign_table_of(
        &self,
        name: &str,
        version: iceberg::spec::FormatVersion,
        properties: &[(&str, &str)],
        schema: &arrow_schema::Schema,
    ) -> (std::sync::Arc<dyn iceberg::Catalog>, String) {
        let (catalog, namespace) = self.catalog_with_namespace().await;
        let schema = iceberg::arrow::arrow_schema_to_schema_auto_assign_ids(schema).unwrap();
        catalog
            .create_table(
                &namespace,
                iceberg::TableCreation::builder()
                    .name(name.into())
                    .schema(schema)
                    .format_version(version)
                    .properties(
                        properties
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string())),
                    )
                    .build(),
            )
            .await
            .unwrap();
        (catalog, self.table(&[name]))
    }

    /// The format version of `table` (`namespace.name`), loaded from the catalog now.
    pub async fn format_version(&self, table: &str) -> iceberg::spec::FormatVersion {
        let catalog = self.catalog.open("ratchet", &self.s3).await.unwrap();
        let ident = iceberg::TableIdent::from_strs(table.split('.')).unwrap();
        catalog
            .load_table(&ident)
            .await
            .unwrap()
            .metadata()
            .format_version()
    }

    /// The id of `table`'s (`namespace.name`) current snapshot, loaded from the catalog now.
    pub async fn current_snapshot(&self, table: &str) -> Option<i64> {
        let catalog = self.catalog.open("ratchet", &self.s3).await.unwrap();
        let ident = iceberg::TableIdent::from_strs(table.split('.')).unwrap();
        let loaded = catalog.load_table(&ident).await.unwrap();
        loaded.metadata().current_snapshot_id()
    }

    /// `namespace.name` for a table named after `parts`.
    pub fn table(&self, parts: &[&str]) -> String {
        let name: String = parts
            .join("_")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        format!("{}.{name}", self.namespace)
    }

    /// A sink configuration writing `table` (created from `schema` when missing).
    pub fn config(
        &self,
        job: &str,
        sink: &SinkId,
        subtask: u32,
        table: &str,
        schema: SchemaRef,
    ) -> IcebergSinkConfig {
        IcebergSinkConfig {
            job: SinkId::new(job).unwrap(),
            sink: sink.clone(),
            subtask: SubtaskId(subtask),
            schema,
            catalog: self.catalog.clone(),
            catalog_name: "ratchet".into(),
            s3: self.s3.clone(),
            table: table.into(),
            create_table: true,
            evolution: connector_api::Evolution::None,
            target_file_size: iceberg_sink::DEFAULT_TARGET_FILE_SIZE,
            commit_every: 1,
            commit_timeout: Duration::from_secs(60),
            cleanup_on_recover: true,
            expire_snapshots: false,
            upsert_key: Vec::new(),
            upsert_deletes: Default::default(),
            sweep_orphans_after: None,
            compact: Default::default(),
            layout: iceberg_sink::TableLayout::default(),
        }
    }

    /// What pyiceberg and DuckDB see in `table` (blocking: runs the verifier).
    pub fn read(&self, table: &str) -> Seen {
        let seen = Services::get().verify(
            "iceberg_table.py",
            &["ratchet", &self.python_uri, &self.warehouse, table, "id"],
        );
        let ids = |key: &str| -> Vec<i64> {
            seen[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect()
        };
        Seen {
            ids: ids("ids"),
            duckdb_ids: ids("duckdb_ids"),
            second_reader: seen["second_reader"].as_str().unwrap().to_string(),
            second_ids: ids("second_ids"),
            snapshots: seen["snapshots"].as_array().unwrap().clone(),
            unreferenced: seen["unreferenced"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect(),
        }
    }
}

impl Lake {
    /// Per column of `table`'s current schema, the ids of the rows where pyiceberg reads a value (blocking).
    pub fn non_null_ids(&self, table: &str) -> serde_json::Value {
        self.read_with(table, "--columns")["columns"].clone()
    }

    /// What the verifier prints for `table` with `flag` (blocking).
    pub fn read_with(&self, table: &str, flag: &str) -> serde_json::Value {
        Services::get().verify(
            "iceberg_table.py",
            &[
                "ratchet",
                &self.python_uri,
                &self.warehouse,
                table,
                "id",
                flag,
            ],
        )
    }
}

impl Lake {
    /// The catalog database and warehouse Spark opens: a [`sqlite_local`](Self::sqlite_local) lake's (Spark's
    /// JdbcCatalog over the same SQLite file).
    fn spark_catalog(&self) -> [&str; 2] {
        let db = self
            .python_uri
            .strip_prefix("sqlite:///")
            .expect("Spark opens the SQLite lakes (sqlite_local)");
        [db, &self.warehouse]
    }

    /// Row lineage as Spark with Iceberg's runtime reads it from a format-version 3 `table`: per snapshot (by id,
    /// read with `VERSION AS OF`) and for the current one, each row's `[id, _row_id,
    /// _last_updated_sequence_number]` sorted by id; and how many manifests the current snapshot names.
    pub async fn spark_lineage(&self, table: &str) -> serde_json::Value {
        let (lake, table) = (self.clone(), table.to_string());
        tokio::task::spawn_blocking(move || {
            let [db, warehouse] = lake.spark_catalog();
            Services::get().spark(&["lineage", db, warehouse, &table])
        })
        .await
        .unwrap()
    }

    /// Every row Spark with Iceberg's runtime reads of `table`, sorted by `id`, each as its columns by name.
    pub async fn spark_rows(&self, table: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
        let (lake, table) = (self.clone(), table.to_string());
        let seen = tokio::task::spawn_blocking(move || {
            let [db, warehouse] = lake.spark_catalog();
            Services::get().spark(&["read", db, warehouse, &table, "id"])
        })
        .await
        .unwrap();
        let columns = seen["column_names"].as_array().unwrap();
        seen["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                columns
                    .iter()
                    .zip(row.as_array().unwrap())
                    .map(|(name, value)| (name.as_str().unwrap().to_string(), value.clone()))
                    .collect()
            })
            .collect()
    }
}

impl Lake {
    /// Spark's `DELETE FROM table WHERE where_` (another writer; a deletion vector on a merge-on-read
    /// format-version 3 table); returns the live delete files after it ([`spark_delete_files`](Self::spark_delete_files)).
    pub async fn spark_delete(&self, table: &str, where_: &str) -> Vec<serde_json::Value> {
        self.spark_delete_command(table, &["delete", where_]).await
    }

    /// Spark's upgrade of `table` to format version 3 (`ALTER TABLE .. SET TBLPROPERTIES`); returns the live delete
    /// files after it.
    pub async fn spark_upgrade_to_version_3(&self, table: &str) -> Vec<serde_json::Value> {
        self.spark_delete_command(table, &["upgrade", "3"]).await
    }

    /// The live delete files of `table` as Spark's `delete_files` metadata table lists them (`content`,
    /// `file_path`, `file_format`, `referenced_data_file`, `record_count`, `content_offset`).
    pub async fn spark_delete_files(&self, table: &str) -> Vec<serde_json::Value> {
        self.spark_delete_command(table, &["delete_files"]).await
    }

    async fn spark_delete_command(&self, table: &str, command: &[&str]) -> Vec<serde_json::Value> {
        let (lake, table) = (self.clone(), table.to_string());
        let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        let seen = tokio::task::spawn_blocking(move || {
            let [db, warehouse] = lake.spark_catalog();
            let mut args = vec![command[0].as_str(), db, warehouse, &table];
            args.extend(command[1..].iter().map(String::as_str));
            Services::get().spark(&args)
        })
        .await
        .unwrap();
        seen["delete_files"].as_array().unwrap().clone()
    }

    /// Spark's rewrite_data_files of every data file of `table`, once (`spark_iceberg.py rewrite`); returns how
    /// many files it rewrote.
    pub async fn spark_rewrite(&self, table: &str) -> u64 {
        let (lake, table) = (self.clone(), table.to_string());
        let done = tokio::task::spawn_blocking(move || {
            let [db, warehouse] = lake.spark_catalog();
            Services::get().spark(&["rewrite", db, warehouse, &table])
        })
        .await
        .unwrap();
        done["rewritten_data_files"].as_u64().unwrap()
    }
}

/// Spark's maintenance procedures (rewrite_data_files, rewrite_manifests, expire_snapshots, remove_orphan_files)
/// running in a loop on a table while a test writes it (`spark_iceberg.py maintain`).
pub struct SparkMaintainer {
    child: std::process::Child,
    stop: tempfile::TempDir,
}

impl SparkMaintainer {
    /// Starts the loop on `table`; remove_orphan_files deletes unreferenced files older than `orphan_cut_off`.
    pub fn start(lake: &Lake, table: &str, orphan_cut_off: Duration) -> Self {
        let stop = tempfile::tempdir().unwrap();
        let stop_file = stop.path().join("stop");
        let [db, warehouse] = lake.spark_catalog();
        let child = Services::get().spawn_verifier(
            "spark_iceberg.py",
            &[
                "maintain",
                db,
                warehouse,
                table,
                &stop_file.display().to_string(),
                &orphan_cut_off.as_secs().to_string(),
            ],
            &stop.path().join("stderr"),
        );
        SparkMaintainer { child, stop }
    }

    /// What the loop did by its last finished procedure (as [`stop`](Self::stop) returns it), or `None` before one;
    /// a loop that ended (it only ends on an error before [`stop`](Self::stop)) fails the test with its error.
    pub fn progress(&mut self) -> Option<serde_json::Value> {
        if self.child.try_wait().unwrap().is_some() {
            panic!("Spark's maintenance ended on its own:\n{}", self.stderr());
        }
        let text = std::fs::read(self.stop.path().join("progress")).ok()?;
        Some(serde_json::from_slice(&text).unwrap())
    }

    /// How many runs of `procedure` have finished with `outcome` (`committed` or `lost`), as the loop reports
    /// after each procedure; 0 before the first.
    pub fn count(&mut self, procedure: &str, outcome: &str) -> u64 {
        self.progress()
            .map_or(0, |p| p["procedures"][procedure][outcome].as_u64().unwrap())
    }

    /// What the loop wrote to its stderr so far (Spark's log, and the error that ended it).
    fn stderr(&self) -> String {
        std::fs::read_to_string(self.stop.path().join("stderr")).unwrap_or_default()
    }

    /// The last exceptions in Spark's log (a procedure's refusal says why it lost).
    pub fn last_exceptions(&self) -> String {
        let log = self.stderr();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains("Exception")).collect();
        lines[lines.len().saturating_sub(6)..].join("\n")
    }

    /// Asks the loop to end after its current round and returns what it did (per procedure, the runs committed
    /// and lost to the sink's commits; the data files rewritten), blocking; a failed loop fails the test.
    pub fn stop(self) -> serde_json::Value {
        std::fs::write(self.stop.path().join("stop"), b"").unwrap();
        let out = self.child.wait_with_output().unwrap();
        let stderr = std::fs::read_to_string(self.stop.path().join("stderr")).unwrap_or_default();
        assert!(
            out.status.success(),
            "Spark's maintenance failed:\n{stderr}"
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "Spark's maintenance printed no JSON ({e}):\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

/// A driver over the local store in `state` with the sink of `config`, started the way the worker starts a
/// subtask: a retryable error (a foreign writer's commits or expiry racing the recovery) is printed and the start
/// tried again with a new driver, at most 5 times; any other error fails the test with its report.
pub async fn started(
    state: &Path,
    config: &IcebergSinkConfig,
) -> (
    connector_api::Driver<connector_api::LocalCheckpointStore>,
    connector_api::SinkHandle,
    connector_api::Restored,
) {
    let mut attempt = 1;
    loop {
        let mut job = connector_api::Driver::new(
            connector_api::LocalCheckpointStore::open(state, 3).unwrap(),
            connector_api::DriverConfig::default(),
        );
        let sink = job
            .add_sink(
                iceberg_sink::IcebergSink::new(config.clone())
                    .await
                    .unwrap(),
            )
            .unwrap();
        match job.start().await {
            Ok(restored) => return (job, sink, restored),
            Err(e) if e.is_retryable() && attempt < 5 => {
                eprintln!(
                    "start attempt {attempt} failed, retrying: {}",
                    connector_api::Report(&e)
                );
                attempt += 1;
            }
            Err(e) => panic!("the start failed: {}", connector_api::Report(&e)),
        }
    }
}

/// The checkpoints that `snapshots` (the verifier's) show added by more than one snapshot with data files.
pub fn checkpoints_in_two_snapshots(snapshots: &[serde_json::Value]) -> Vec<String> {
    let mut committed: Vec<&str> = snapshots
        .iter()
        .filter(|s| {
            s["summary"]["added-data-files"]
                .as_str()
                .is_some_and(|n| n != "0")
        })
        .filter_map(|s| s["summary"]["ratchet.checkpoint"].as_str())
        .collect();
    committed.sort_unstable();
    let mut twice: Vec<String> = committed
        .windows(2)
        .filter(|pair| pair[0] == pair[1])
        .map(|pair| pair[0].to_string())
        .collect();
    twice.dedup();
    twice
}

impl Lake {
    /// Sets `table`'s retention (Iceberg's standard properties): keep `keep` snapshots, expire every older one at
    /// once, keep 3 old metadata files.
    pub async fn set_retention(&self, table: &str, keep: usize) {
        self.set_properties(
            table,
            &[
                ("history.expire.min-snapshots-to-keep", keep.to_string()),
                ("history.expire.max-snapshot-age-ms", "1".into()),
                ("write.metadata.previous-versions-max", "3".into()),
            ],
        )
        .await;
    }

    /// Makes the sink merge `table`'s manifests once `min_count` pile up (Iceberg's standard properties).
    pub async fn set_merge(&self, table: &str, min_count: usize) {
        self.set_properties(
            table,
            &[
                (iceberg_sink::MANIFEST_MERGE_ENABLED, "true".into()),
                (
                    iceberg_sink::MANIFEST_MIN_COUNT_TO_MERGE,
                    min_count.to_string(),
                ),
            ],
        )
        .await;
    }

    /// Removes the property that marks `table` as created by the sink (`ratchet.created-by`): with `compact` left
    /// out, the sink then does not compact it.
    pub async fn forget_creator(&self, table: &str) {
        use iceberg::transaction::{ApplyTransactionAction, Transaction};
        let catalog = self.catalog.open("ratchet", &self.s3).await.unwrap();
        let ident = iceberg::TableIdent::from_strs(table.split('.')).unwrap();
        let loaded = catalog.load_table(&ident).await.unwrap();
        let tx = Transaction::new(&loaded);
        let update = tx
            .update_table_properties()
            .remove(iceberg_sink::CREATED_BY_PROPERTY.to_string());
        let tx = update.apply(tx).unwrap();
        tx.commit(catalog.as_ref()).await.unwrap();
    }

    /// Sets table properties of `table` with iceberg-rust's own transaction.
    pub async fn set_properties(&self, table: &str, properties: &[(&str, String)]) {
        use iceberg::transaction::{ApplyTransactionAction, Transaction};
        let catalog = self.catalog.open("ratchet", &self.s3).await.unwrap();
        let ident = iceberg::TableIdent::from_strs(table.split('.')).unwrap();
        let loaded = catalog.load_table(&ident).await.unwrap();
        let tx = Transaction::new(&loaded);
        let mut update = tx.update_table_properties();
        for (key, value) in properties {
            update = update.set(key.to_string(), value.clone());
        }
        let tx = update.apply(tx).unwrap();
        tx.commit(catalog.as_ref()).await.unwrap();
    }

    /// What pyiceberg sees of `table` with the manifest lists and metadata files under its `metadata/` directory
    /// (blocking): `snapshots`, `unreferenced_manifest_lists`, `unreferenced_manifests`, `current_manifests`,
    /// `snapshot_rows`, `metadata_json_files`, `ids`, `duckdb_ids`.
    pub fn metadata_files(&self, table: &str) -> serde_json::Value {
        self.read_with(table, "--metadata-files")
    }
}

/// What the independent readers saw.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Ids per pyiceberg, sorted, one per visible row.
    pub ids: Vec<i64>,
    /// Ids per DuckDB's iceberg_scan, sorted.
    pub duckdb_ids: Vec<i64>,
    /// Which reader gave `second_ids`: `duckdb`, or `iceberg-java` (Iceberg's Java library) for a table whose
    /// current snapshot has delete files (DuckDB 1.4's iceberg extension misreads equality deletes).
    pub second_reader: String,
    /// Ids per the second reader, sorted.
    pub second_ids: Vec<i64>,
    /// Every snapshot, oldest first, with its summary.
    pub snapshots: Vec<serde_json::Value>,
    /// Ratchet's data files no snapshot references.
    pub unreferenced: Vec<String>,
}

/// Runs the test `test` of this binary (a child that reads its setup from `env`) with the drill at `step`, and
/// asserts that it killed itself there with SIGKILL.
pub fn killed_child(test: &str, env: &[(&str, &str)], step: &str) {
    use std::os::unix::process::ExitStatusExt;
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .envs(env.iter().copied())
        .env(iceberg_sink::KILL_VARIABLE, step)
        .status()
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "{step}: the child {test} should have killed itself at the step ({status})"
    );
}

/// The next offset the last decided checkpoint in the local store under `state` records (its only partition).
pub async fn decided_offset(state: &Path) -> i64 {
    use connector_api::CheckpointStore;
    connector_api::LocalCheckpointStore::open(state, 3)
        .unwrap()
        .load()
        .await
        .unwrap()
        .record
        .and_then(|r| r.positions.first().map(|p| p.next_offset))
        .expect("a decided checkpoint")
}
