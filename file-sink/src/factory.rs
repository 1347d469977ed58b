//! The file sink in a job file: `[[sinks]]` entries with `type = "file"`.

use async_trait::async_trait;
use connector_api::{
    DeliveryGuarantee, DynSink, Result, SinkBuilder, SinkCheck, SinkContext, SinkId, SinkScope,
};
use serde::Deserialize;

use crate::config::{FormatConfig, PartitionConfig, RollingPolicy, StorageConfig};
use crate::{FileSink, FileSinkConfig};

/// The settings of a file sink in a job file: everything of [`FileSinkConfig`] but the sink id, subtask and
/// schema, which come from the job.
///
/// | key | meaning | default |
/// |---|---|---|
/// | `storage` | `{ kind = "local", path = ".." }` or `{ kind = "s3", bucket = "..", .. }` ([`StorageConfig`]) | required |
/// | `format` | `{ kind = "parquet", compression = "zstd", row_group_size = .. }`, `{ kind = "json_lines" }`, `{ kind = "csv" }` | Parquet, zstd |
/// | `partition` | `{ fields = [..], time = { field = "..", granularity = "day" } }` | none |
/// | `rolling` | `{ max_bytes = .., max_records = .. }` | 128 MiB / 10 M rows |
/// | `scope` | scopes the sink's file names, owner-epoch file and staging objects (unique per job and sink in one directory or prefix) | `<job>~<sink id>` (jobs first run before job scoping, and sinks built without a job: the sink id) |
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSinkSettings {
    /// Where files go.
    pub storage: StorageConfig,
    /// File format.
    #[serde(default)]
    pub format: FormatConfig,
    /// Partition directories.
    #[serde(default)]
    pub partition: PartitionConfig,
    /// When files roll.
    #[serde(default)]
    pub rolling: RollingPolicy,
    /// Scopes the files the sink owns.
    #[serde(default)]
    pub scope: Option<SinkId>,
}

/// Builds [`FileSink`]s from [`FileSinkSettings`].
///
/// At-least-once and at-most-once stage and publish files exactly as exactly-once does (publishing at
/// pre-commit, or after the record, through [`GuaranteedSink`](connector_api::GuaranteedSink)): staging is what
/// keeps a half-written file invisible, so the weaker guarantees are not cheaper here.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileSinkFactory;

#[async_trait]
impl SinkBuilder for FileSinkFactory {
    const KIND: &'static str = "file";
    type Settings = FileSinkSettings;

    async fn build_sink(
        &self,
        settings: FileSinkSettings,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<DynSink> {
        let config = FileSinkConfig {
            scope: settings
                .scope
                .map_or_else(|| context.scope(), SinkScope::from),
            sink: context.sink,
            subtask: context.subtask,
            schema: context.schema,
            storage: settings.storage,
            format: settings.format,
            partition: settings.partition,
            rolling: settings.rolling,
            evolution: context.evolution,
        };
        Ok(DynSink::new(FileSink::new(config).await?, delivery))
    }

    async fn check_sink(
        &self,
        settings: FileSinkSettings,
        _: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<SinkCheck> {
        let mut config = FileSinkConfig::new(
            context.sink.clone(),
            context.subtask,
            context.schema,
            settings.storage,
        );
        config.format = settings.format;
        crate::sink::check_format(&config)?;
        let storage = crate::storage::check(&config.storage).await?;
        Ok(SinkCheck {
            summary: format!("settings valid; {storage}"),
            transaction_timeout: None,
        })
    }
}
