//! Configuration of the file sink.

use std::path::PathBuf;

use arrow_schema::SchemaRef;
use connector_api::{SinkId, SinkScope, SubtaskId};
use connector_common::Secret;
use connector_common::s3::S3Credentials;
use serde::Deserialize;

/// Where files go.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum StorageConfig {
    /// A local directory (created if missing). Visible files appear under it; staging files are hidden
    /// (dot-prefixed) next to them.
    Local {
        /// Base directory.
        path: PathBuf,
    },
    /// An S3 bucket (AWS or any S3-compatible store).
    S3(S3Config),
}

/// S3 settings. Credentials default to the standard AWS chain (environment, profile, instance metadata).
///
/// | key | meaning | default |
/// |---|---|---|
/// | `bucket` | bucket name | required |
/// | `prefix` | key prefix of the sink's files (no leading or trailing `/`) | `""` |
/// | `endpoint` | endpoint URL for S3-compatible stores | AWS |
/// | `region` | signing region | from the AWS chain, else `us-east-1` |
/// | `access_key_id` / `secret_access_key` | static credentials | the AWS chain |
/// | `force_path_style` | path-style addressing (`http://host/bucket/key`), needed by most S3-compatible stores | `false` |
/// | `part_size` | multipart part size in bytes, at least 5 MiB | 8 MiB |
/// | `spill_dir` | local directory for the staged bytes of open files (memory stays bounded) | the system temp dir |
///
/// The secret key is redacted in `Debug` output and never appears in an error; leave both keys out to take them
/// from the environment (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`) through the AWS chain.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix.
    #[serde(default)]
    pub prefix: String,
    /// Endpoint URL.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Region.
    #[serde(default)]
    pub region: Option<String>,
    /// Access key id (with `secret_access_key`).
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// Secret access key (never shown in `Debug` output or logs).
    #[serde(default)]
    pub secret_access_key: Option<Secret<String>>,
    /// Path-style addressing.
    #[serde(default)]
    pub force_path_style: bool,
    /// Multipart part size in bytes.
    #[serde(default = "default_part_size")]
    pub part_size: usize,
    /// Where open files are staged locally before upload.
    #[serde(default)]
    pub spill_dir: Option<PathBuf>,
}

impl S3Config {
    /// The static credentials, when both keys are set.
    ///
    /// # Errors
    /// [`Config`](connector_common::ErrorKind::Config) when only one of them is set.
    pub fn credentials(&self) -> connector_common::Result<Option<S3Credentials>> {
        S3Credentials::from_settings(
            self.access_key_id.as_deref(),
            self.secret_access_key.as_ref(),
        )
    }
}

/// The S3 minimum part size (except the last part).
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;

fn default_part_size() -> usize {
    8 * 1024 * 1024
}

/// The file format.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FormatConfig {
    /// Apache Parquet (a bulk format: a file always ends at a checkpoint).
    Parquet {
        /// Compression codec.
        #[serde(default)]
        compression: ParquetCompression,
        /// Rows per row group.
        #[serde(default = "default_row_group_size")]
        row_group_size: usize,
    },
    /// Newline-delimited JSON, one object per row.
    JsonLines,
    /// CSV with a header line.
    Csv,
}

impl Default for FormatConfig {
    /// Parquet, zstd, 128 Ki rows per row group.
    fn default() -> Self {
        FormatConfig::Parquet {
            compression: ParquetCompression::default(),
            row_group_size: default_row_group_size(),
        }
    }
}

impl FormatConfig {
    /// The file extension, without the dot.
    pub fn extension(&self) -> &'static str {
        match self {
            FormatConfig::Parquet { .. } => "parquet",
            FormatConfig::JsonLines => "jsonl",
            FormatConfig::Csv => "csv",
        }
    }
}

fn default_row_group_size() -> usize {
    128 * 1024
}

/// Parquet compression codecs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ParquetCompression {
    /// zstd (level 3).
    #[default]
    Zstd,
    /// Snappy.
    Snappy,
    /// LZ4 (raw).
    Lz4,
    /// No compression.
    Uncompressed,
}

/// Hive-style partition directories, `field=value/`, from record fields and from event or processing time.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionConfig {
    /// Fields whose values name directories, outermost first.
    #[serde(default)]
    pub fields: Vec<String>,
    /// A time partition after the field partitions.
    #[serde(default)]
    pub time: Option<TimePartition>,
}

/// A date (and hour) directory, from an event-time field or from processing time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimePartition {
    /// An event-time field (a Timestamp, or Int64 milliseconds since the epoch); processing time when absent.
    #[serde(default)]
    pub field: Option<String>,
    /// `day` → `dt=YYYY-MM-DD/`; `hour` → `dt=YYYY-MM-DD/hour=HH/` (UTC).
    #[serde(default)]
    pub granularity: TimeGranularity,
}

/// How fine time partitions are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TimeGranularity {
    /// One directory per day.
    #[default]
    Day,
    /// One directory per hour.
    Hour,
}

/// When a file is closed and the next one started. Every open file is also closed at every checkpoint: its rows
/// belong to that checkpoint's transaction. There is no rotation on the wall clock outside checkpoints, so an idle
/// file is closed at the next checkpoint at the latest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollingPolicy {
    /// Roll once a file holds this many bytes (as written so far; Parquet buffers a row group in memory first).
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Roll once a file holds this many rows.
    #[serde(default = "default_max_records")]
    pub max_records: u64,
}

impl Default for RollingPolicy {
    /// 128 MiB or 10 million rows.
    fn default() -> Self {
        Self {
            max_bytes: default_max_bytes(),
            max_records: default_max_records(),
        }
    }
}

fn default_max_bytes() -> u64 {
    128 * 1024 * 1024
}

fn default_max_records() -> u64 {
    10_000_000
}

/// Everything a [`FileSink`](crate::FileSink) instance needs.
#[derive(Debug, Clone)]
pub struct FileSinkConfig {
    /// The sink's id.
    pub sink: SinkId,
    /// Scopes the files it owns: their names, the owner-epoch file, staging objects ([`SinkScope`]; the sink id
    /// by default, `<job>~<sink>` from a job file).
    pub scope: SinkScope,
    /// This instance's subtask.
    pub subtask: SubtaskId,
    /// Schema every written batch must have.
    pub schema: SchemaRef,
    /// Where files go.
    pub storage: StorageConfig,
    /// File format.
    pub format: FormatConfig,
    /// Partition directories.
    pub partition: PartitionConfig,
    /// When files roll.
    pub rolling: RollingPolicy,
    /// Take new columns, widened types and columns made optional when the batches' schema changes (new files
    /// have the new schema; files already written keep theirs): `add-columns` takes new columns, `evolve` all of
    /// them; `none` refuses.
    pub evolution: connector_api::Evolution,
}

impl FileSinkConfig {
    /// A config with Parquet (zstd), no partitions and default rolling, scoped by the sink id alone.
    pub fn new(
        sink: SinkId,
        subtask: SubtaskId,
        schema: SchemaRef,
        storage: StorageConfig,
    ) -> Self {
        Self {
            scope: SinkScope::from(sink.clone()),
            sink,
            subtask,
            schema,
            storage,
            format: FormatConfig::default(),
            partition: PartitionConfig::default(),
            rolling: RollingPolicy::default(),
            evolution: connector_api::Evolution::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_key_is_redacted_in_debug() {
        let config: StorageConfig = serde_json::from_value(serde_json::json!({
            "kind": "s3", "bucket": "b", "access_key_id": "AKIA", "secret_access_key": "very-secret-value"
        }))
        .unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("very-secret-value"), "{shown}");
        assert!(
            shown.contains("<redacted>") && shown.contains("AKIA"),
            "{shown}"
        );
    }
}
