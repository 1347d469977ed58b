//! The local-filesystem Parquet sink: hidden in-progress file → fsynced pending file → atomic rename.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use connector_api::{
    CheckpointId, Committer, Error, ErrorKind, Phase, Result, SinkId, SubtaskId, TwoPhaseCommit,
};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};

use crate::FileName;
use crate::owner::OwnerFile;

/// Configuration of a [`LocalParquetSink`].
#[derive(Debug, Clone)]
pub struct LocalParquetSinkConfig {
    /// The sink's id; scopes the files it owns.
    pub sink: SinkId,
    /// This instance's subtask.
    pub subtask: SubtaskId,
    /// Directory the visible files appear in (created if missing).
    pub dir: PathBuf,
    /// Schema every written batch must have.
    pub schema: SchemaRef,
}

/// One file of a checkpoint, pending until commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingFile {
    /// Visible file name (the pending stage is `.<name>.pending` in the same directory).
    pub name: String,
    /// Rows in the file.
    pub rows: u64,
}

/// What commits one checkpoint's files: the directory and the pending files. Enough for any process to finish the
/// commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCommittable {
    /// The checkpoint the files belong to.
    pub checkpoint: CheckpointId,
    /// The directory holding them.
    pub dir: PathBuf,
    /// The files (none when the checkpoint wrote no rows).
    pub files: Vec<PendingFile>,
}

struct OpenFile {
    name: FileName,
    writer: ArrowWriter<File>,
    rows: u64,
}

/// Exactly-once Parquet files in a local directory. See the crate docs for the protocol and failure table.
pub struct LocalParquetSink {
    config: LocalParquetSinkConfig,
    props: WriterProperties,
    owner: OwnerFile,
    /// The owner epoch this instance holds since `recover` (0 before).
    epoch: u64,
    checkpoint: Option<CheckpointId>,
    open: Option<OpenFile>,
    /// The pre-committed files of the current checkpoint, until the next `begin` (for `abort`).
    prepared: Option<FileCommittable>,
}

/// Commits a [`LocalParquetSink`]'s files: renames pending files into place, unless a newer instance of the same
/// sink and subtask has recovered since this committer was made (then it is fenced).
#[derive(Debug, Clone)]
pub struct LocalCommitter {
    sink: SinkId,
    owner: OwnerFile,
    epoch: u64,
}

impl LocalParquetSink {
    /// A sink writing zstd-compressed Parquet files into `config.dir`.
    pub fn new(config: LocalParquetSinkConfig) -> Result<Self> {
        fs::create_dir_all(&config.dir).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("cannot create output directory {}", config.dir.display()),
            )
            .with_sink(&config.sink)
            .with_source(e)
        })?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build();
        let owner = OwnerFile::new(&config.dir, &config.sink, config.subtask);
        Ok(Self {
            config,
            props,
            owner,
            epoch: 0,
            checkpoint: None,
            open: None,
            prepared: None,
        })
    }

    fn err(&self, kind: ErrorKind, phase: Phase, message: impl Into<String>) -> Error {
        let err = Error::new(kind, phase, message).with_sink(&self.config.sink);
        match self.checkpoint {
            Some(checkpoint) => err.with_checkpoint(checkpoint),
            None => err,
        }
    }

    fn check_schema(&self, batch: &RecordBatch) -> Result<()> {
        let expected = &self.config.schema;
        let actual = batch.schema();
        for field in expected.fields() {
            match actual.field_with_name(field.name()) {
                Err(_) => {
                    return Err(self.err(
                        ErrorKind::BadRecord,
                        Phase::Write,
                        format!(
                            "batch has no field {:?} required by the sink's schema",
                            field.name()
                        ),
                    ));
                }
                Ok(got) if got.data_type() != field.data_type() => {
                    return Err(self.err(
                        ErrorKind::BadRecord,
                        Phase::Write,
                        format!(
                            "field {:?} has type {} but the sink's schema says {}",
                            field.name(),
                            got.data_type(),
                            field.data_type()
                        ),
                    ));
                }
                Ok(got) if got.is_nullable() && !field.is_nullable() => {
                    return Err(self.err(
                        ErrorKind::BadRecord,
                        Phase::Write,
                        format!(
                            "field {:?} is nullable but the sink's schema is not",
                            field.name()
                        ),
                    ));
                }
                Ok(_) => {}
            }
        }
        if actual.fields().len() != expected.fields().len() {
            let extra: Vec<_> = actual
                .fields()
                .iter()
                .filter(|f| expected.field_with_name(f.name()).is_err())
                .map(|f| f.name().as_str())
                .collect();
            return Err(self.err(
                ErrorKind::BadRecord,
                Phase::Write,
                format!("batch has fields {extra:?} that are not in the sink's schema"),
            ));
        }
        Ok(())
    }

    fn open_file(&mut self, checkpoint: CheckpointId) -> Result<&mut OpenFile> {
        if self.open.is_none() {
            let name = FileName {
                sink: self.config.sink.clone(),
                subtask: self.config.subtask,
                checkpoint,
                epoch: self.epoch,
                seq: 0,
            };
            let path = self.config.dir.join(name.in_progress());
            let io = |e: std::io::Error| {
                self.err(
                    ErrorKind::Retryable,
                    Phase::Write,
                    format!("cannot create {}", path.display()),
                )
                .with_source(e)
            };
            let file = File::create(&path).map_err(io)?;
            let writer =
                ArrowWriter::try_new(file, self.config.schema.clone(), Some(self.props.clone()))
                    .map_err(|e| {
                        self.err(ErrorKind::Fatal, Phase::Write, "cannot start Parquet file")
                            .with_source(e)
                    })?;
            self.open = Some(OpenFile {
                name,
                writer,
                rows: 0,
            });
        }
        Ok(self.open.as_mut().expect("just opened"))
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Closes the Parquet file, fsyncs it, renames in-progress → pending and fsyncs the directory.
fn seal(
    dir: &Path,
    open: OpenFile,
) -> Result<PendingFile, (String, Box<dyn std::error::Error + Send + Sync>)> {
    let OpenFile { name, writer, rows } = open;
    let file = writer.into_inner().map_err(|e| {
        (
            format!("cannot finish Parquet file {}", name.in_progress()),
            e.into(),
        )
    })?;
    file.sync_all()
        .map_err(|e| (format!("cannot fsync {}", name.in_progress()), e.into()))?;
    fs::rename(dir.join(name.in_progress()), dir.join(name.pending())).map_err(|e| {
        (
            format!("cannot rename {} to pending", name.in_progress()),
            e.into(),
        )
    })?;
    sync_dir(dir).map_err(|e| {
        (
            format!("cannot fsync directory {}", dir.display()),
            e.into(),
        )
    })?;
    Ok(PendingFile {
        name: name.visible(),
        rows,
    })
}

/// Makes one committable's files visible. A file already renamed counts as committed.
fn publish(committable: &FileCommittable) -> Result<(), String> {
    for file in &committable.files {
        let pending = committable.dir.join(format!(".{}.pending", file.name));
        let visible = committable.dir.join(&file.name);
        match fs::rename(&pending, &visible) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && visible.exists() => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!(
                    "neither {} nor {} exists: the pre-committed file was lost (deleted outside Ratchet?)",
                    pending.display(),
                    visible.display()
                ));
            }
            Err(e) => {
                return Err(format!(
                    "cannot rename {} into place: {e}",
                    pending.display()
                ));
            }
        }
    }
    sync_dir(&committable.dir)
        .map_err(|e| format!("cannot fsync {}: {e}", committable.dir.display()))
}

#[async_trait]
impl Committer for LocalCommitter {
    type Committable = FileCommittable;

    async fn commit(&self, committables: Vec<FileCommittable>) -> Result<()> {
        for committable in committables {
            let checkpoint = committable.checkpoint;
            let txn = committable
                .files
                .first()
                .map(|f| f.name.clone())
                .unwrap_or_default();
            let context = |e: Error| {
                e.with_sink(&self.sink)
                    .with_checkpoint(checkpoint)
                    .with_txn(txn.clone())
            };
            let current = self.owner.read().map_err(|e| {
                context(
                    Error::new(
                        ErrorKind::Retryable,
                        Phase::Commit,
                        "cannot read the owner epoch",
                    )
                    .with_source(e),
                )
            })?;
            if current > self.epoch {
                return Err(context(Error::new(
                    ErrorKind::Fenced,
                    Phase::Commit,
                    format!(
                        "a newer instance of this sink (owner epoch {current}, this one holds {}) has recovered;                          this instance is a zombie and must stop",
                        self.epoch
                    ),
                )));
            }
            tokio::task::spawn_blocking(move || publish(&committable))
                .await
                .expect("publish task panicked")
                .map_err(|message| context(Error::new(ErrorKind::Fatal, Phase::Commit, message)))?;
        }
        Ok(())
    }

    async fn is_committed(&self, committable: &FileCommittable) -> Result<bool> {
        Ok(committable.files.iter().all(|f| {
            committable.dir.join(&f.name).exists()
                && !committable
                    .dir
                    .join(format!(".{}.pending", f.name))
                    .exists()
        }))
    }
}

impl LocalParquetSink {
    /// Deletes `path` if it exists.
    fn remove(&self, phase: Phase, path: &Path) -> Result<()> {
        match fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self
                .err(
                    ErrorKind::Retryable,
                    phase,
                    format!("cannot delete {}", path.display()),
                )
                .with_source(e)),
        }
    }
}

#[async_trait]
impl TwoPhaseCommit for LocalParquetSink {
    type Committable = FileCommittable;
    type Committer = LocalCommitter;

    fn sink_id(&self) -> &SinkId {
        &self.config.sink
    }

    fn committer(&self) -> LocalCommitter {
        LocalCommitter {
            sink: self.config.sink.clone(),
            owner: self.owner.clone(),
            epoch: self.epoch,
        }
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        if self.open.is_some() {
            return Err(self.err(
                ErrorKind::Bug,
                Phase::Begin,
                "begin while a transaction is open",
            ));
        }
        self.checkpoint = Some(checkpoint);
        self.prepared = None;
        Ok(())
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let checkpoint = self
            .checkpoint
            .ok_or_else(|| self.err(ErrorKind::Bug, Phase::Write, "write before begin"))?;
        self.check_schema(batch)?;
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let sink = self.config.sink.clone();
        let open = self.open_file(checkpoint)?;
        open.writer.write(batch).map_err(|e| {
            Error::new(
                ErrorKind::MustAbort,
                Phase::Write,
                format!("cannot write to {}", open.name.in_progress()),
            )
            .with_sink(&sink)
            .with_checkpoint(checkpoint)
            .with_source(e)
        })?;
        open.rows += batch.num_rows() as u64;
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
        let mut files = Vec::new();
        if let Some(open) = self.open.take() {
            let dir = self.config.dir.clone();
            let sealed = tokio::task::spawn_blocking(move || seal(&dir, open))
                .await
                .expect("seal task panicked");
            match sealed {
                Ok(file) => files.push(file),
                Err((message, source)) => {
                    return Err(self
                        .err(ErrorKind::MustAbort, Phase::PreCommit, message)
                        .with_source(std::io::Error::other(source)));
                }
            }
        }
        let committable = FileCommittable {
            checkpoint,
            dir: self.config.dir.clone(),
            files,
        };
        self.prepared = Some(committable.clone());
        Ok(committable)
    }

    /// Deletes the open in-progress file and the current checkpoint's pending files (if pre-committed).
    async fn abort(&mut self) -> Result<()> {
        if let Some(open) = self.open.take() {
            let path = self.config.dir.join(open.name.in_progress());
            drop(open);
            self.remove(Phase::Abort, &path)?;
        }
        if let Some(prepared) = self.prepared.take() {
            for file in &prepared.files {
                self.remove(
                    Phase::Abort,
                    &prepared.dir.join(format!(".{}.pending", file.name)),
                )?;
            }
        }
        self.checkpoint = None;
        Ok(())
    }

    async fn recover(
        &mut self,
        restored: Option<(CheckpointId, Vec<FileCommittable>)>,
    ) -> Result<()> {
        self.open = None;
        self.prepared = None;
        self.checkpoint = None;
        // Fence every older instance first: from here on, their committers refuse to publish.
        self.epoch = self.owner.bump().map_err(|e| {
            self.err(
                ErrorKind::Retryable,
                Phase::Recover,
                "cannot raise the owner epoch",
            )
            .with_source(e)
        })?;
        if let Some((_, committables)) = restored {
            self.committer().commit(committables).await?;
        }
        // The restored files are visible now, so every hidden stage this instance still owns belongs to a
        // checkpoint that never became durable: presumed abort.
        let dir = self.config.dir.clone();
        let entries = fs::read_dir(&dir).map_err(|e| {
            self.err(
                ErrorKind::Retryable,
                Phase::Recover,
                format!("cannot list {}", dir.display()),
            )
            .with_source(e)
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if FileName::is_owned_stage(&name, &self.config.sink, self.config.subtask) {
                tracing::info!(sink = %self.config.sink, file = %name, "recover: deleting uncommitted file");
                self.remove(Phase::Recover, &entry.path())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]))
    }

    fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
        let names: Vec<String> = ids.clone().map(|i| format!("n{i}")).collect();
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(ids)),
                Arc::new(StringArray::from_iter_values(names)),
            ],
        )
        .unwrap()
    }

    fn sink(dir: &Path) -> LocalParquetSink {
        LocalParquetSink::new(LocalParquetSinkConfig {
            sink: SinkId::new("files").unwrap(),
            subtask: SubtaskId(0),
            dir: dir.to_path_buf(),
            schema: schema(),
        })
        .unwrap()
    }

    /// Ids in the visible (non-hidden) Parquet files of `dir`.
    fn visible_ids(dir: &Path) -> Vec<i64> {
        let mut ids = Vec::new();
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().unwrap().to_string_lossy().starts_with('.') {
                continue;
            }
            let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap())
                .unwrap()
                .build()
                .unwrap();
            for batch in reader {
                let batch = batch.unwrap();
                let col = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap();
                ids.extend(col.values().iter().copied());
            }
        }
        ids.sort_unstable();
        ids
    }

    fn hidden(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect()
    }

    #[tokio::test]
    async fn nothing_is_visible_before_commit_and_commit_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = sink(dir.path());
        sink.recover(None).await.unwrap();
        sink.begin(CheckpointId(1)).await.unwrap();
        sink.write(&batch(0..10)).await.unwrap();
        let committable = sink.pre_commit(CheckpointId(1)).await.unwrap();
        assert!(visible_ids(dir.path()).is_empty());
        assert!(!sink.is_committed(&committable).await.unwrap());

        sink.commit(vec![committable.clone()]).await.unwrap();
        sink.commit(vec![committable.clone()]).await.unwrap();
        assert_eq!(visible_ids(dir.path()), (0..10).collect::<Vec<_>>());
        assert!(sink.is_committed(&committable).await.unwrap());
        assert_eq!(hidden(dir.path()), [".ratchet-owner-files.0"]);
    }

    #[tokio::test]
    async fn recover_commits_the_restored_files_and_deletes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut crashed = sink(dir.path());
        crashed.begin(CheckpointId(1)).await.unwrap();
        crashed.write(&batch(0..5)).await.unwrap();
        let durable = crashed.pre_commit(CheckpointId(1)).await.unwrap();
        // Checkpoint 2 was pre-committed but its record never became durable; 3 was still being written.
        crashed.begin(CheckpointId(2)).await.unwrap();
        crashed.write(&batch(5..8)).await.unwrap();
        crashed.pre_commit(CheckpointId(2)).await.unwrap();
        crashed.begin(CheckpointId(3)).await.unwrap();
        crashed.write(&batch(8..9)).await.unwrap();
        std::mem::forget(crashed); // a crash: no abort, no cleanup
        assert_eq!(hidden(dir.path()).len(), 3);

        let mut restarted = sink(dir.path());
        restarted
            .recover(Some((CheckpointId(1), vec![durable.clone()])))
            .await
            .unwrap();
        assert_eq!(visible_ids(dir.path()), (0..5).collect::<Vec<_>>());
        assert_eq!(
            hidden(dir.path()),
            [".ratchet-owner-files.0"],
            "left behind"
        );
        // Recovering again (a crash during recovery) changes nothing.
        restarted
            .recover(Some((CheckpointId(1), vec![durable])))
            .await
            .unwrap();
        assert_eq!(visible_ids(dir.path()), (0..5).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn recover_leaves_other_sinks_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut other = LocalParquetSink::new(LocalParquetSinkConfig {
            sink: SinkId::new("files").unwrap(),
            subtask: SubtaskId(1),
            dir: dir.path().to_path_buf(),
            schema: schema(),
        })
        .unwrap();
        other.begin(CheckpointId(1)).await.unwrap();
        other.write(&batch(0..1)).await.unwrap();
        other.pre_commit(CheckpointId(1)).await.unwrap();

        sink(dir.path()).recover(None).await.unwrap();
        assert!(
            hidden(dir.path()).iter().any(|n| n.ends_with(".pending")),
            "{:?}",
            hidden(dir.path())
        );
    }

    #[tokio::test]
    async fn a_zombie_cannot_publish_after_a_newer_instance_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let mut zombie = sink(dir.path());
        zombie.recover(None).await.unwrap();
        zombie.begin(CheckpointId(1)).await.unwrap();
        zombie.write(&batch(0..3)).await.unwrap();
        let committable = zombie.pre_commit(CheckpointId(1)).await.unwrap();

        let mut successor = sink(dir.path());
        successor.recover(None).await.unwrap();

        let err = zombie.commit(vec![committable]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
        assert!(visible_ids(dir.path()).is_empty());
    }

    #[tokio::test]
    async fn abort_after_pre_commit_deletes_the_pending_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = sink(dir.path());
        sink.recover(None).await.unwrap();
        sink.begin(CheckpointId(1)).await.unwrap();
        sink.write(&batch(0..3)).await.unwrap();
        sink.pre_commit(CheckpointId(1)).await.unwrap();
        sink.abort().await.unwrap();
        assert!(
            hidden(dir.path())
                .iter()
                .all(|n| n.starts_with(".ratchet-owner")),
            "{:?}",
            hidden(dir.path())
        );
        assert!(visible_ids(dir.path()).is_empty());
    }

    #[tokio::test]
    async fn a_batch_with_the_wrong_schema_is_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = sink(dir.path());
        sink.begin(CheckpointId(1)).await.unwrap();
        let wrong = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)])),
            vec![Arc::new(StringArray::from(vec!["x"]))],
        )
        .unwrap();
        let err = sink.write(&wrong).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRecord);
        assert!(
            err.to_string().contains("field \"id\" has type Utf8"),
            "{err}"
        );
    }
}
