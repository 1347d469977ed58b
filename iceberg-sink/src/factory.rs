//! The Iceberg sink in a job file: `[[sinks]]` entries with `type = "iceberg"`.

use std::time::Duration;

use async_trait::async_trait;
use connector_api::{
    DeliveryGuarantee, DynSink, Error, ErrorKind, Phase, Result, SinkBuilder, SinkCheck,
    SinkContext, SinkId,
};
use serde::Deserialize;

use crate::IcebergSink;
use crate::config::{
    CatalogConfig, DEFAULT_COMMIT_TIMEOUT, DEFAULT_TARGET_FILE_SIZE, IcebergSinkConfig, S3Settings,
};

/// The settings of an Iceberg sink in a job file.
///
/// | key | meaning | default |
/// |---|---|---|
/// | `catalog` | `{ kind = "sql", uri = "sqlite:///path/catalog.db?mode=rwc", warehouse = "file:///path" }` (or a `postgres://` uri, an `s3://` warehouse), or `{ kind = "rest", uri = "http://host:port", warehouse = ".." }` | required |
/// | `catalog_name` | the catalog's name (pyiceberg's `SqlCatalog(name, ..)` must use the same) | `ratchet` |
/// | `table` | `namespace.name` | required |
/// | `create_table` | create the namespace and a table from the input schema when missing (unpartitioned unless `partition_by` says otherwise; with `upsert_key`, its identifier fields are the key when every key column is required) | false |
/// | `job` | the job identity recorded in every snapshot (the ledger key, with the sink id and subtask); must stay the same across restarts and replacements, and differ between jobs writing the same table with the same sink id | the job's name (jobs first run before job scoping, and sinks built without a job: the sink id) |
/// | `s3` | `{ endpoint, region, access_key_id, secret_access_key, force_path_style }` for an `s3://` warehouse | the AWS environment |
/// | `target_file_size` | bytes after which a data file is closed and the next one opened | 128 MiB |
/// | `commit_every` | commit one snapshot every this many checkpoints (fewer, larger snapshots; data becomes visible up to K checkpoints later: the worker keeps checkpointing while files wait, records or not; after a clean stop, at the next start; exactly-once only) | 1 |
/// | `commit_timeout` | the longest one catalog call may take before its outcome counts as unknown (then the next attempt checks the table's history first) | 60s |
/// | `cleanup_on_recover` | delete this subtask's data files no snapshot references when recovering | true |
/// | `upsert_key` | apply the rows by these key columns (`["id"]`): per checkpoint the last change of each key is written as one row, and the row it replaces deleted, in one snapshot (a row delta, merge-on-read); a change stream's `d` rows delete their key, and the table holds the rows without the change columns. Needs a format-version 2 or 3 table (partitioned by any column with position deletes, unpartitioned with equality deletes; a version 3 table's position deletes are deletion vectors), `commit_every = 1`, and each key in one Kafka partition (the default partitioner and Debezium key by the key; a key in two partitions reaches two subtasks, whose deletes would race) | none: rows appended, a change stream as a changelog |
/// | `upsert_deletes` | how `upsert_key` deletes a key's previous row: `"position"` (position-delete files found by a key index each subtask keeps in memory, rebuilt from the table at recovery; read by every engine that reads v2 deletes, pyiceberg and DuckDB included; deletion vectors in a format-version 3 table) or `"equality"` (equality-delete files of the keys; no index, but pyiceberg 0.12 refuses them and DuckDB 1.4.4 misreads them) | `"position"` |
/// | `sweep_orphans_after` | subtask 0's recovery deletes the files under the table's `data/` and `metadata/` that nothing in the table references (left by killed writers, Ratchet's or another engine's) and that were last modified longer ago than this (`"1d"`); at least 3 × `commit_timeout`, and longer than any other writer's commit; never this sink's own data files (each subtask's recovery deletes those) | none: no sweep |
/// | `compact` | rewrite small data files this subtask wrote into larger ones inside the checkpoints' own commits: `{ target_file_size = "128MB", min_input_files = 8 }` (either key may be left out: those are the defaults). Small: under ¾ of the target; a partition's files of one size tier (within a factor `min_input_files`) are rewritten once `min_input_files` of them are live, at most `target_file_size` of input per checkpoint; the checkpoint's snapshot adds its rows and replaces the rewritten files (operation `overwrite`). A file a foreign writer removed meanwhile drops that compaction, never a row. `true`: the default policy; `false`: off. Not with `upsert_key` (planned) | on with the default policy for an append table the sink created (table property `ratchet.created-by`, format version 1 or 2), off for every other table |
/// | `partition_by` | the partition spec of a table the sink creates, in Spark's terms: `["day(created)", "bucket(16, id)", "region"]` (`identity`, `year`, `month`, `day`, `hour`, `bucket(N, c)`, `truncate(W, c)`; fields named as Spark names them: `created_day`, `id_bucket`); needs `create_table`; with `upsert_key`, by any column (`upsert_deletes = "position"`) | unpartitioned |
/// | `sort_by` | the sort order recorded on a table the sink creates, for the engines that rewrite it: `["id", "created desc nulls last"]` (the sink writes rows in arrival order); needs `create_table` | unsorted |
/// | `properties` | table properties of a table the sink creates (`{ "write.parquet.compression-codec" = "zstd" }`), set over the sink's defaults; not `ratchet.*`; needs `create_table` | the sink's defaults (below) |
/// | `format_version` | the Iceberg format version of a table the sink creates: `2` or `3` (row lineage; upserts write deletion vectors; not compacted by the sink); needs `create_table` | 2 |
/// | `expire_snapshots` | expire snapshots inside every commit by the table's `history.expire.max-snapshot-age-ms` (default 5 days) and `history.expire.min-snapshots-to-keep` (default 1), as Iceberg's expire-snapshots procedure does, and delete the expired snapshots' manifest lists; skipped while the table sets `gc.enabled = false` | false |
///
/// Manifest merging is a table property, not a sink key: a table that sets `commit.manifest-merge.enabled = true`
/// (tables `create_table` creates do) has its manifests merged inside the sink's commits once
/// `commit.manifest.min-count-to-merge` (100) pile up, into manifests of `commit.manifest.target-size-bytes`
/// (8 MiB), committed by Ratchet's own catalog commit; the manifests merges replaced are deleted once expiry
/// removed every snapshot naming them. Old metadata files are deleted when the table sets
/// `write.metadata.delete-after-commit.enabled = true` (created tables do).
///
/// ```toml
/// [[sinks]]
/// type = "iceberg"
/// id = "lake"
/// delivery = "exactly-once"
/// job = "orders-pipeline"
/// catalog = { kind = "sql", uri = "sqlite:///var/lib/ratchet/catalog.db?mode=rwc", warehouse = "file:///var/lib/ratchet/warehouse" }
/// table = "shop.orders"
/// create_table = true
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IcebergSinkSettings {
    /// The catalog.
    pub catalog: CatalogConfig,
    /// The catalog's name.
    #[serde(default = "default_catalog_name")]
    pub catalog_name: String,
    /// The table.
    pub table: String,
    /// Create the table when missing.
    #[serde(default)]
    pub create_table: bool,
    /// The job identity.
    #[serde(default)]
    pub job: Option<SinkId>,
    /// S3 settings for an `s3://` warehouse.
    #[serde(default)]
    pub s3: S3Settings,
    /// Target data file size in bytes.
    #[serde(default = "default_target_file_size")]
    pub target_file_size: usize,
    /// Checkpoints per snapshot.
    #[serde(default = "default_commit_every")]
    pub commit_every: u32,
    /// The longest catalog call.
    #[serde(with = "humantime_serde", default = "default_commit_timeout")]
    pub commit_timeout: Duration,
    /// Delete unreferenced files of this subtask at recovery.
    #[serde(default = "default_true")]
    pub cleanup_on_recover: bool,
    /// Expire snapshots inside every commit.
    #[serde(default)]
    pub expire_snapshots: bool,
    /// Apply the rows by these key columns (row deltas).
    #[serde(default)]
    pub upsert_key: Vec<String>,
    /// How the upsert mode deletes a key's previous row.
    #[serde(default)]
    pub upsert_deletes: crate::UpsertDeletes,
    /// Sweep the table's orphan files older than this at subtask 0's recovery.
    #[serde(with = "humantime_serde", default)]
    pub sweep_orphans_after: Option<Duration>,
    /// Compaction inside the commits.
    #[serde(default)]
    pub compact: crate::compact_policy::Compact,
    /// The partition terms of a created table.
    #[serde(default)]
    pub partition_by: Vec<String>,
    /// The sort terms of a created table.
    #[serde(default)]
    pub sort_by: Vec<String>,
    /// The properties of a created table.
    #[serde(default)]
    pub properties: std::collections::BTreeMap<String, String>,
    /// The Iceberg format version of a created table (2 or 3).
    #[serde(default)]
    pub format_version: Option<u8>,
}

/// The catalog calls opening a sink makes at most, each within `commit_timeout` (namespace lookup and creation,
/// table lookup, creation, load, a schema change's commit).
const SETUP_CATALOG_CALLS: u32 = 6;

fn default_catalog_name() -> String {
    "ratchet".into()
}

fn default_target_file_size() -> usize {
    DEFAULT_TARGET_FILE_SIZE
}

fn default_commit_every() -> u32 {
    1
}

fn default_commit_timeout() -> Duration {
    DEFAULT_COMMIT_TIMEOUT
}

fn default_true() -> bool {
    true
}

/// Builds [`IcebergSink`]s from [`IcebergSinkSettings`].
///
/// At-least-once commits each checkpoint's snapshot at pre-commit
/// ([`GuaranteedSink`](connector_api::GuaranteedSink)): a crash before the record is durable replays rows that a
/// snapshot already holds. At-most-once never commits a restored checkpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct IcebergSinkFactory;

#[async_trait]
impl SinkBuilder for IcebergSinkFactory {
    const KIND: &'static str = "iceberg";
    type Settings = IcebergSinkSettings;

    fn key_columns(settings: &IcebergSinkSettings) -> Vec<String> {
        settings.upsert_key.clone()
    }

    /// Opening takes a few catalog calls, each bounded by `commit_timeout`: the table's lookup, its creation or
    /// load, and a schema change's commit, with the namespace's lookup and creation.
    fn setup_time(settings: &IcebergSinkSettings) -> Option<Duration> {
        Some(settings.commit_timeout * SETUP_CATALOG_CALLS)
    }

    async fn build_sink(
        &self,
        settings: IcebergSinkSettings,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<DynSink> {
        refuse_commit_every(&settings, delivery, &context)?;
        let config = config(settings, context)?;
        Ok(DynSink::new(IcebergSink::new(config).await?, delivery))
    }

    async fn check_sink(
        &self,
        settings: IcebergSinkSettings,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<SinkCheck> {
        refuse_commit_every(&settings, delivery, &context)?;
        crate::check::check(&config(settings, context)?).await
    }

    /// The batches' columns the table lacks (none before the first run creates it).
    async fn lacking_columns(
        &self,
        settings: IcebergSinkSettings,
        context: SinkContext,
    ) -> Result<Vec<String>> {
        crate::check::lacking_columns(&config(settings, context)?).await
    }
}

/// `commit_every > 1` needs exactly-once: at-least-once and at-most-once keep no committable in the checkpoint
/// record to carry files in.
fn refuse_commit_every(
    settings: &IcebergSinkSettings,
    delivery: DeliveryGuarantee,
    context: &SinkContext,
) -> Result<()> {
    if settings.commit_every > 1 && delivery != DeliveryGuarantee::ExactlyOnce {
        return Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "commit_every = {} needs delivery = \"exactly-once\" (the files between commits ride in the \
                 checkpoint records); use commit_every = 1 or a longer checkpoint interval",
                settings.commit_every
            ),
        )
        .with_sink(&context.sink));
    }
    Ok(())
}

/// The sink's config from its settings and the job.
fn config(settings: IcebergSinkSettings, context: SinkContext) -> Result<IcebergSinkConfig> {
    let job = match (settings.job, &context.job) {
        (Some(job), _) => job,
        // A job id has a sink id's alphabet.
        (None, Some(job)) => SinkId::new(job.as_str())?,
        (None, None) => context.sink.clone(),
    };
    Ok(IcebergSinkConfig {
        job,
        sink: context.sink,
        subtask: context.subtask,
        schema: context.schema,
        catalog: settings.catalog,
        catalog_name: settings.catalog_name,
        s3: settings.s3,
        table: settings.table,
        create_table: settings.create_table,
        evolution: context.evolution,
        target_file_size: settings.target_file_size,
        commit_every: settings.commit_every,
        commit_timeout: settings.commit_timeout,
        cleanup_on_recover: settings.cleanup_on_recover,
        expire_snapshots: settings.expire_snapshots,
        upsert_key: settings.upsert_key,
        upsert_deletes: settings.upsert_deletes,
        sweep_orphans_after: settings.sweep_orphans_after,
        compact: settings.compact,
        layout: crate::TableLayout {
            partition_by: settings.partition_by,
            sort_by: settings.sort_by,
            properties: settings.properties,
            format_version: settings.format_version,
        },
    })
}
