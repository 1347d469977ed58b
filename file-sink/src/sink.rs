//! The file sink: partitioned, rolling files in one format, staged per checkpoint and published at commit.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Arc;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::{
    CheckpointId, Error, ErrorKind, Phase, RecoveryPlan, Result, SchemaChange, SinkId,
    TwoPhaseCommit,
};

use crate::FileName;
use crate::commit::FileCommitter;
use crate::committable::FileCommittable;
use crate::config::FileSinkConfig;
use crate::error::zombie;
use crate::format::FormatWriter;
use crate::partition;
use crate::schema::check_schema;
use crate::storage::{Backend, OpenFile, StagedFile};

/// Exactly-once files on local disk or S3. See the crate docs for the protocol and the failure table.
pub struct FileSink {
    pub(crate) config: FileSinkConfig,
    pub(crate) backend: Arc<Backend>,
    /// The owner epoch this instance holds since `recover` (0 before).
    pub(crate) epoch: u64,
    pub(crate) checkpoint: Option<CheckpointId>,
    /// Open files by partition directory.
    pub(crate) open: BTreeMap<String, OpenFile>,
    /// Files sealed in the current checkpoint (rolled, or at pre-commit).
    pub(crate) sealed: Vec<StagedFile>,
    /// Next sequence number per partition in the current checkpoint.
    pub(crate) next_seq: BTreeMap<String, u32>,
}

/// Refuses a format that cannot hold the schema exactly ([`crate::types`]).
///
/// # Errors
/// [`Config`](ErrorKind::Config) naming every field.
pub(crate) fn check_format(config: &FileSinkConfig) -> Result<()> {
    crate::types::check(&config.format, &config.schema, &config.sink)
}

impl FileSink {
    /// A sink for `config`; connects to the storage (an S3 bucket is checked with HeadBucket).
    pub async fn new(config: FileSinkConfig) -> Result<Self> {
        check_format(&config)?;
        let backend = Backend::open(&config.storage, &config.scope, config.subtask)
            .await
            .map_err(|e| e.or_sink(&config.sink))?;
        Ok(Self {
            config,
            backend: Arc::new(backend),
            epoch: 0,
            checkpoint: None,
            open: BTreeMap::new(),
            sealed: Vec::new(),
            next_seq: BTreeMap::new(),
        })
    }

    fn err(&self, kind: ErrorKind, phase: Phase, message: impl Into<String>) -> Error {
        let err = Error::new(kind, phase, message).with_sink(&self.config.sink);
        match self.checkpoint {
            Some(checkpoint) => err.with_checkpoint(checkpoint),
            None => err,
        }
    }

    pub(crate) fn context(&self, e: Error) -> Error {
        let e = e.or_sink(&self.config.sink);
        match self.checkpoint {
            Some(checkpoint) => e.or_checkpoint(checkpoint),
            None => e,
        }
    }

    fn open_file(&mut self, checkpoint: CheckpointId, partition: &str) -> Result<&mut OpenFile> {
        if !self.open.contains_key(partition) {
            let seq = self.next_seq.entry(partition.to_string()).or_insert(0);
            let name = FileName {
                scope: self.config.scope.clone(),
                subtask: self.config.subtask,
                checkpoint,
                epoch: self.epoch,
                seq: *seq,
                partition: partition.to_string(),
                extension: self.config.format.extension(),
            };
            *seq += 1;
            let staging_path = self
                .backend
                .staging_path(&name)
                .map_err(|e| self.context(e))?;
            let file = File::create(&staging_path).map_err(|e| {
                self.err(
                    ErrorKind::Retryable,
                    Phase::Write,
                    format!("cannot create {}", staging_path.display()),
                )
                .with_source(e)
            })?;
            let (writer, written) =
                FormatWriter::new(&self.config.format, &self.config.schema, file).map_err(|e| {
                    self.err(ErrorKind::Fatal, Phase::Write, "cannot start a file")
                        .with_source(e)
                })?;
            let open = OpenFile {
                name,
                writer,
                written,
                rows: 0,
                staging_path,
                upload: None,
            };
            self.open.insert(partition.to_string(), open);
        }
        Ok(self.open.get_mut(partition).expect("just opened"))
    }

    /// A newer instance's recovery removes this instance's stages (files, uploads) from under it: when a storage
    /// call fails and the owner epoch moved on, report that (`Fenced`) rather than "file not found".
    async fn fenced_or(&mut self, e: Error) -> Error {
        match self.backend.read_epoch().await {
            Ok(current) if current > self.epoch => {
                self.context(zombie(e.phase(), current, self.epoch).with_source(e))
            }
            _ => e,
        }
    }

    fn should_roll(&self, open: &OpenFile) -> bool {
        let rolling = &self.config.rolling;
        open.rows >= rolling.max_records
            || open.written.encoded() + open.writer.buffered_bytes() >= rolling.max_bytes
    }

    async fn seal(&mut self, partition: &str) -> Result<()> {
        if let Some(open) = self.open.remove(partition) {
            let staged = self.backend.seal(open).await.map_err(|e| self.context(e))?;
            self.sealed.push(staged);
        }
        Ok(())
    }
}

#[async_trait]
impl TwoPhaseCommit for FileSink {
    type Committable = FileCommittable;
    type Committer = FileCommitter;

    fn sink_id(&self) -> &SinkId {
        &self.config.sink
    }

    fn committer(&self) -> FileCommitter {
        FileCommitter {
            sink: self.config.sink.clone(),
            backend: self.backend.clone(),
            epoch: self.epoch,
        }
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        if !self.open.is_empty() {
            return Err(self.err(ErrorKind::Bug, Phase::Begin, "begin while files are open"));
        }
        self.checkpoint = Some(checkpoint);
        self.sealed.clear();
        self.next_seq.clear();
        Ok(())
    }

    /// `evolution = "add-columns"` or `"evolve"`: the files opened from now on have the new schema (no file is
    /// open: the driver evolves between checkpoints, and each checkpoint seals its files). Files already
    /// published keep the schema they were written with; a reader merging schemas (Spark, DuckDB
    /// `union_by_name`, pyarrow datasets) sees null in the new columns for them, and reads a widened column's
    /// older files with the narrower type (Spark and DuckDB widen int to long and float to double when merging).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a change `evolution` does not allow ([`SchemaChange::to_make`]), or a
    /// format that cannot hold the new schema (CSV and nested columns).
    async fn evolve(&mut self, schema: arrow_schema::SchemaRef) -> Result<()> {
        let change = SchemaChange::to_make(
            &self.config.sink,
            self.config.evolution,
            "the files' schema",
            &self.config.schema,
            &schema,
        )?;
        if change.is_empty() {
            return Ok(());
        }
        if !self.open.is_empty() {
            return Err(self.err(
                ErrorKind::Bug,
                Phase::Setup,
                "a schema change while files are open",
            ));
        }
        let mut config = self.config.clone();
        config.schema = schema;
        check_format(&config)?;
        self.config = config;
        Ok(())
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let checkpoint = self
            .checkpoint
            .ok_or_else(|| self.err(ErrorKind::Bug, Phase::Write, "write before begin"))?;
        check_schema(&self.config.schema, batch)
            .map_err(|m| self.err(ErrorKind::BadRecord, Phase::Write, m))?;
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let parts = partition::split(&self.config.partition, batch)
            .map_err(|m| self.err(ErrorKind::BadRecord, Phase::Write, m))?;
        for (dir, part) in parts {
            let backend = self.backend.clone();
            let open = self.open_file(checkpoint, &dir)?;
            open.writer.write(&part).map_err(|e| {
                Error::new(
                    ErrorKind::MustAbort,
                    Phase::Write,
                    format!("cannot encode rows into {}", open.name.visible()),
                )
                .with_source(std::io::Error::other(e))
            })?;
            open.rows += part.num_rows() as u64;
            if let Err(e) = backend.after_write(open).await {
                let e = self.context(e);
                return Err(self.fenced_or(e).await);
            }
            if self.should_roll(&self.open[&dir])
                && let Err(e) = self.seal(&dir).await
            {
                return Err(self.fenced_or(e).await);
            }
        }
        Ok(())
    }

    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<FileCommittable> {
        if self.checkpoint != Some(checkpoint) {
            return Err(self.err(
                ErrorKind::Bug,
                Phase::PreCommit,
                format!(
                    "pre_commit of checkpoint {checkpoint} but the open transaction is {:?}",
                    self.checkpoint
                ),
            ));
        }
        let partitions: Vec<String> = self.open.keys().cloned().collect();
        for dir in partitions {
            if let Err(e) = self.seal(&dir).await {
                return Err(self.fenced_or(e).await);
            }
        }
        Ok(FileCommittable {
            checkpoint,
            files: self.sealed.clone(),
        })
    }

    /// Throws away the open files and the current checkpoint's sealed files (if pre-committed but not committed).
    async fn abort(&mut self) -> Result<()> {
        let open = std::mem::take(&mut self.open);
        for (_, file) in open {
            self.backend
                .discard_open(file)
                .await
                .map_err(|e| self.context(e))?;
        }
        for staged in std::mem::take(&mut self.sealed) {
            self.backend
                .discard_staged(&staged)
                .await
                .map_err(|e| self.context(e))?;
        }
        self.checkpoint = None;
        Ok(())
    }

    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<FileCommittable>)>,
    ) -> Result<RecoveryPlan<FileCommittable>> {
        self.plan(restored).await
    }

    async fn execute_recovery(&mut self, plan: RecoveryPlan<FileCommittable>) -> Result<()> {
        self.execute_plan(plan).await
    }
}
