//! The Iceberg sink: data files per checkpoint, one snapshot per commit, fenced and idempotent in the table.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::committable::{IcebergCommittable, PendingFile};
use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::{
    CheckpointId, Committer, Error, ErrorKind, Fence, FenceOrder, OpenTransaction, Phase,
    RecoveryPlan, Resolution, Result, SinkId, SubtaskId, TwoPhaseCommit,
};
use iceberg::spec::{DataFile, deserialize_data_file_from_json, serialize_data_file_to_json};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use crate::cleanup::{DELETE_METADATA_AFTER_COMMIT, delete_unreferenced_files, unreferenced_files};
use crate::commit::{CommitOutcome, TableTarget};
use crate::config::IcebergSinkConfig;
use crate::error::iceberg_error;
use crate::ledger::SubtaskKey;
use crate::location::canonical;
use crate::writer::CheckpointWriter;

/// The commit half of [`IcebergSink`].
#[derive(Debug, Clone)]
pub struct IcebergCommitter {
    target: TableTarget,
    key: SubtaskKey,
    epoch: Arc<AtomicU64>,
}

impl IcebergCommitter {
    fn epoch(&self, phase: Phase) -> Result<u64> {
        match self.epoch.load(Ordering::SeqCst) {
            0 => Err(Error::new(
                ErrorKind::Bug,
                phase,
                "the Iceberg sink was used before recover() raised its epoch",
            )),
            epoch => Ok(epoch),
        }
    }

    /// Commits `committable`'s files as one snapshot (whether or not it is due, see
    /// [`IcebergCommittable::commit`]), unless the table already shows its checkpoint.
    async fn commit_files(&self, committable: &IcebergCommittable) -> Result<CommitOutcome> {
        let epoch = self.epoch(Phase::Commit)?;
        if committable.subtask != self.key.subtask.0 {
            return Err(Error::bug(
                Phase::Commit,
                format!(
                    "a committable of subtask {} reached the committer of subtask {} outside recovery",
                    committable.subtask, self.key.subtask
                ),
            ));
        }
        self.commit_files_as(&self.key, epoch, committable).await
    }

    /// Commits `committable`'s files as one snapshot recorded for `key` (the subtask that wrote them) under
    /// `epoch`, unless the table already shows its checkpoint for that subtask: committed under the writer's own
    /// key, a checkpoint taken over by another subtask's recovery is never committed twice.
    async fn commit_files_as(
        &self,
        key: &SubtaskKey,
        epoch: u64,
        committable: &IcebergCommittable,
    ) -> Result<CommitOutcome> {
        if committable.files.is_empty() {
            return Ok(CommitOutcome::AlreadyCommitted);
        }
        let table = self.target.recent(Phase::Commit).await?;
        let files = decode_files(&table, &committable.files)?;
        self.target
            .commit_files(key, epoch, committable.checkpoint, files)
            .await
    }

    /// The ledger key of the subtask that wrote `committable`.
    fn key_of(&self, committable: &IcebergCommittable) -> SubtaskKey {
        SubtaskKey {
            subtask: SubtaskId(committable.subtask),
            ..self.key.clone()
        }
    }
}

#[async_trait]
impl Committer for IcebergCommitter {
    type Committable = IcebergCommittable;

    /// Commits each due committable as one snapshot; skips what the table's history already shows.
    async fn commit(&self, committables: Vec<IcebergCommittable>) -> Result<()> {
        for committable in committables.iter().filter(|c| c.commit) {
            self.commit_files(committable)
                .await
                .map_err(|e| e.or_sink(&self.key.sink))?;
        }
        Ok(())
    }

    /// Whether the table's history shows the committable's checkpoint (or a later one) of its subtask (the one
    /// that wrote it, whichever instance asks).
    async fn is_committed(&self, committable: &IcebergCommittable) -> Result<bool> {
        let table = self.target.load(Phase::Commit).await?;
        let state = self.key_of(committable).state(&table.metadata_ref());
        Ok(committable.files.is_empty()
            || state
                .checkpoint
                .is_some_and(|last| last >= committable.checkpoint))
    }
}

/// The Iceberg sink for one subtask.
///
/// Per checkpoint: `begin` opens data file writers named after the subtask, its epoch and the checkpoint;
/// `write` appends (Parquet, zstd, following the partition spec); `pre_commit` closes the files and returns
/// them as the committable (nothing is visible yet); the committer appends them in one snapshot whose summary
/// records job, sink, subtask, checkpoint and epoch; `recover` raises the epoch (fencing every older instance),
/// commits the restored checkpoint if the table does not show it yet, and deletes this subtask's files no
/// snapshot references.
pub struct IcebergSink {
    config: IcebergSinkConfig,
    key: SubtaskKey,
    committer: IcebergCommitter,
    table: Option<Table>,
    writer: Option<CheckpointWriter>,
    /// Files of decided checkpoints not committed yet (commit every K checkpoints).
    carried: Vec<PendingFile>,
    /// Checkpoints in `carried`.
    carried_checkpoints: u32,
    /// The committable of the last pre-commit, until the next begin decides what it carries.
    pre_committed: Option<IcebergCommittable>,
}

impl std::fmt::Debug for IcebergSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcebergSink")
            .field("key", &self.key)
            .field("table", &self.config.table)
            .finish_non_exhaustive()
    }
}

impl IcebergSink {
    /// Connects to the catalog and checks the table (creating it from the batches' schema when configured).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a catalog that cannot be opened, a malformed table name, or a missing
    /// table without `create_table`.
    pub async fn new(config: IcebergSinkConfig) -> Result<Self> {
        if config.commit_every == 0 {
            return Err(config_error("commit_every must be at least 1"));
        }
        let catalog = config
            .catalog
            .open(&config.catalog_name, &config.s3)
            .await
            .map_err(|e| e.with_sink(&config.sink))?;
        let ident = TableIdent::from_strs(config.table.split('.')).map_err(|_| {
            config_error(format!("table {:?} is not `namespace.name`", config.table))
        })?;
        let exists = catalog
            .table_exists(&ident)
            .await
            .map_err(|e| iceberg_error(Phase::Setup, format!("cannot look up table {ident}"), e))?;
        if !exists {
            if !config.create_table {
                return Err(config_error(format!(
                    "table {ident} does not exist in the catalog: create it, or set create_table = true to \
                     create an unpartitioned table from the input schema"
                ))
                .with_sink(&config.sink));
            }
            create_table(catalog.as_ref(), &ident, &config.schema).await?;
        }
        let key = SubtaskKey {
            job: config.job.clone(),
            sink: config.sink.clone(),
            subtask: config.subtask,
        };
        let committer = IcebergCommitter {
            target: TableTarget::new(catalog, ident, config.commit_timeout),
            key: key.clone(),
            epoch: Arc::default(),
        };
        Ok(Self {
            config,
            key,
            committer,
            table: None,
            writer: None,
            carried: Vec::new(),
            carried_checkpoints: 0,
            pre_committed: None,
        })
    }

    fn table(&self, phase: Phase) -> Result<&Table> {
        self.table.as_ref().ok_or_else(|| {
            Error::new(
                ErrorKind::Bug,
                phase,
                "the Iceberg sink was used before recover()",
            )
        })
    }

    /// Deletes this subtask's data files that no snapshot of the table references, of this instance's owner epoch
    /// or older (the maintenance call; recovery runs it when `cleanup_on_recover`).
    ///
    /// # Errors
    /// [`Fenced`](ErrorKind::Fenced), deleting nothing, when another instance recovered the subtask since;
    /// [`Bug`](ErrorKind::Bug) before `recover`.
    pub async fn delete_unreferenced_files(&self) -> Result<Vec<String>> {
        let epoch = self.committer.epoch(Phase::Recover)?;
        delete_unreferenced_files(&self.committer.target, &self.key, epoch, &self.config.s3).await
    }
}

#[async_trait]
impl TwoPhaseCommit for IcebergSink {
    type Committable = IcebergCommittable;
    type Committer = IcebergCommitter;

    fn sink_id(&self) -> &SinkId {
        &self.config.sink
    }

    fn committer(&self) -> IcebergCommitter {
        self.committer.clone()
    }

    /// A committable carried into a later commit (`commit = false`, from `commit_every` > 1 when it was written)
    /// still holds files only its recovery makes visible, even once the store notes its checkpoint committed.
    fn restore_committed(&self, committables: &[IcebergCommittable]) -> bool {
        committables
            .iter()
            .any(|c| !c.commit && !c.files.is_empty())
    }

    /// The newest checkpoint the table's ledger shows for this subtask.
    async fn recorded_checkpoint(&mut self) -> Result<Option<CheckpointId>> {
        let table = self.committer.target.load(Phase::Recover).await?;
        Ok(self.key.state(&table.metadata_ref()).checkpoint)
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let epoch = self.committer.epoch(Phase::Begin)?;
        // The previous checkpoint is decided by now (the driver begins only after saving its record).
        if let Some(previous) = self.pre_committed.take() {
            if previous.commit {
                self.carried.clear();
                self.carried_checkpoints = 0;
            } else {
                self.carried = previous.files;
                self.carried_checkpoints += 1;
            }
        }
        let prefix = format!("{}e{epoch}.c{checkpoint}", self.key.file_prefix());
        let table = self.table(Phase::Begin)?;
        self.writer =
            Some(CheckpointWriter::open(table, prefix, self.config.target_file_size).await?);
        Ok(())
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let writer = self.writer.as_mut().ok_or_else(|| {
            Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "write() outside a transaction",
            )
        })?;
        writer
            .write(batch)
            .await
            .map_err(|e| e.or_sink(&self.config.sink))
    }

    /// Closes the data files and returns them (with the carried ones) as the committable; nothing is visible.
    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<IcebergCommittable> {
        let epoch = self.committer.epoch(Phase::PreCommit)?;
        let writer = self.writer.take().ok_or_else(|| {
            Error::new(
                ErrorKind::Bug,
                Phase::PreCommit,
                "pre_commit() outside a transaction",
            )
        })?;
        let written = writer.close().await?;
        let mut files = self.carried.clone();
        files.extend(encode_files(self.table(Phase::PreCommit)?, written)?);
        let committable = IcebergCommittable {
            subtask: self.key.subtask.0,
            epoch,
            checkpoint,
            files,
            commit: self.carried_checkpoints + 1 >= self.config.commit_every,
        };
        self.pre_committed = Some(committable.clone());
        Ok(committable)
    }

    /// Drops the open writers and deletes the files the aborted checkpoint closed (files of decided checkpoints
    /// carried for a later commit stay). Files still open are left to recovery's cleanup.
    async fn abort(&mut self) -> Result<()> {
        self.writer = None;
        if let Some(aborted) = self.pre_committed.take() {
            let table = self.table(Phase::Abort)?;
            for file in aborted.files.iter().filter(|f| !self.carried.contains(f)) {
                table.file_io().delete(&file.path).await.map_err(|e| {
                    iceberg_error(Phase::Abort, format!("cannot delete {}", file.path), e)
                })?;
            }
        }
        Ok(())
    }

    /// Found: the subtask's data files that no snapshot references, and those of every other subtask whose
    /// committables `restored` holds (a takeover). Recovery commits the restored files the table does not show
    /// yet and deletes the rest. Fence before commit: the subtask's owner epoch is raised with a snapshot of its
    /// own (so is a taken-over subtask's), and a commit planned under an older epoch is refused. Notes: what the
    /// ledger shows for the subtask.
    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<IcebergCommittable>)>,
    ) -> Result<RecoveryPlan<IcebergCommittable>> {
        let fence = Fence {
            order: FenceOrder::BeforeCommit,
            how: format!(
                "raise the owner epoch of subtask {} in table {} (a snapshot of no files; an older instance's \
                 commit is refused)",
                self.key.subtask, self.config.table
            ),
        };
        let mut plan = RecoveryPlan::checking(&self.committer, restored, fence).await?;
        let pending: BTreeSet<String> = plan
            .commit
            .iter()
            .flat_map(|c| &c.files)
            .map(|f| canonical(&f.path))
            .collect();
        for key in self.recovered_keys(&plan.commit) {
            let (table, unreferenced) =
                unreferenced_files(&self.committer.target, &key, None, &self.config.s3).await?;
            let state = key.state(&table.metadata_ref());
            plan.notes.push(match state.checkpoint {
                Some(checkpoint) => format!(
                    "table {} shows checkpoint {checkpoint} of subtask {} (owner epoch {})",
                    table.identifier(),
                    key.subtask,
                    state.epoch
                ),
                None => format!(
                    "table {} shows no checkpoint of subtask {}",
                    table.identifier(),
                    key.subtask
                ),
            });
            if key.subtask != self.key.subtask {
                plan.notes.push(format!(
                    "takes over subtask {}: raises its owner epoch, commits its restored files and deletes its \
                     unreferenced ones",
                    key.subtask
                ));
            }
            plan.found
                .extend(unreferenced.into_iter().map(|path| OpenTransaction {
                    checkpoint: key.checkpoint_of_file(&path),
                    state: format!(
                        "data file of subtask {} no snapshot references",
                        key.subtask
                    ),
                    age: None,
                    resolution: Resolution::held_by_restored(pending.contains(&canonical(&path))),
                    name: path,
                }));
        }
        Ok(plan)
    }

    /// Raises the subtask's epoch in the table (fencing older instances), commits the plan's files, then deletes
    /// this subtask's unreferenced files; the same for every other subtask whose committables the plan holds.
    async fn execute_recovery(&mut self, plan: RecoveryPlan<IcebergCommittable>) -> Result<()> {
        let context = |e: Error| e.or_sink(&self.config.sink).at_phase(Phase::Recover);
        self.writer = None;
        self.carried.clear();
        self.carried_checkpoints = 0;
        self.pre_committed = None;
        for key in self.recovered_keys(&plan.commit) {
            connector_api::ensure_claim_held("raising the Iceberg ledger's epoch").await?;
            let (epoch, before) = self
                .committer
                .target
                .raise_epoch(&key)
                .await
                .map_err(context)?;
            if key == self.key {
                self.committer.epoch.store(epoch, Ordering::SeqCst);
            }
            tracing::info!(
                sink = %self.config.sink,
                subtask = %key.subtask,
                recovering_subtask = %self.key.subtask,
                epoch,
                table_shows = ?before.checkpoint,
                "iceberg sink recovering"
            );
            for committable in plan
                .commit
                .iter()
                .filter(|c| self.committer.key_of(c) == key)
            {
                self.committer
                    .commit_files_as(&key, epoch, committable)
                    .await
                    .map_err(context)?;
            }
            if self.config.cleanup_on_recover {
                connector_api::ensure_claim_held("deleting unreferenced data files").await?;
                delete_unreferenced_files(&self.committer.target, &key, epoch, &self.config.s3)
                    .await
                    .map_err(context)?;
            }
        }
        self.table = Some(self.committer.target.load(Phase::Recover).await?);
        Ok(())
    }
}

impl IcebergSink {
    /// The subtasks a recovery with `commit` covers: this instance's own first, then every other subtask whose
    /// committables it holds.
    fn recovered_keys(&self, commit: &[IcebergCommittable]) -> Vec<SubtaskKey> {
        let mut keys = vec![self.key.clone()];
        for committable in commit {
            let key = self.committer.key_of(committable);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }
}

fn config_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Config, Phase::Setup, message)
}

/// Creates the namespace (if missing) and an unpartitioned table from an Arrow schema.
async fn create_table(
    catalog: &dyn iceberg::Catalog,
    ident: &TableIdent,
    schema: &arrow_schema::SchemaRef,
) -> Result<()> {
    let iceberg_schema =
        iceberg::arrow::arrow_schema_to_schema_auto_assign_ids(schema).map_err(|e| {
            iceberg_error(
                Phase::Setup,
                format!("cannot derive an Iceberg schema for {ident} from the input schema"),
                e,
            )
        })?;
    let namespace: &NamespaceIdent = ident.namespace();
    let exists = catalog
        .namespace_exists(namespace)
        .await
        .map_err(|e| iceberg_error(Phase::Setup, "cannot look up the namespace", e))?;
    if !exists {
        // Another subtask may create it at the same moment: a failure is fine if it exists afterwards.
        if let Err(e) = catalog.create_namespace(namespace, HashMap::new()).await
            && !catalog.namespace_exists(namespace).await.unwrap_or(false)
        {
            return Err(iceberg_error(
                Phase::Setup,
                "cannot create the namespace",
                e,
            ));
        }
    }
    // A streaming writer commits often: keep only the last 100 metadata versions on storage (Iceberg's standard
    // property, which `TableTarget` honours after every commit; iceberg-rust itself never deletes them).
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(iceberg_schema)
        .properties(HashMap::from([(
            DELETE_METADATA_AFTER_COMMIT.to_string(),
            "true".to_string(),
        )]))
        .build();
    if let Err(e) = catalog.create_table(namespace, creation).await
        && !catalog.table_exists(ident).await.unwrap_or(false)
    {
        return Err(iceberg_error(
            Phase::Setup,
            format!("cannot create table {ident}"),
            e,
        ));
    }
    Ok(())
}

fn encode_files(table: &Table, files: Vec<DataFile>) -> Result<Vec<PendingFile>> {
    let metadata = table.metadata();
    // The writer opened every file for the table's default spec (DataFile has no public spec id accessor).
    let spec_id = metadata.default_partition_spec_id();
    files
        .into_iter()
        .map(|file| {
            let path = file.file_path().to_string();
            let spec = metadata.partition_spec_by_id(spec_id).ok_or_else(|| {
                Error::new(
                    ErrorKind::Bug,
                    Phase::PreCommit,
                    format!("unknown partition spec {spec_id}"),
                )
            })?;
            let partition_type = spec
                .partition_type(metadata.current_schema())
                .map_err(|e| {
                    iceberg_error(Phase::PreCommit, "cannot derive the partition type", e)
                })?;
            let data_file =
                serialize_data_file_to_json(file, &partition_type, metadata.format_version())
                    .map_err(|e| iceberg_error(Phase::PreCommit, "cannot encode a data file", e))?;
            Ok(PendingFile {
                path,
                spec_id,
                data_file,
            })
        })
        .collect()
}

fn decode_files(table: &Table, files: &[PendingFile]) -> Result<Vec<DataFile>> {
    let metadata = table.metadata();
    let schema = metadata.current_schema();
    files
        .iter()
        .map(|file| {
            let spec = metadata.partition_spec_by_id(file.spec_id).ok_or_else(|| {
                Error::new(
                    ErrorKind::Fatal,
                    Phase::Commit,
                    format!(
                        "the committable's file {} was written for partition spec {}, which table {} no longer \
                         has",
                        file.path,
                        file.spec_id,
                        table.identifier()
                    ),
                )
            })?;
            let partition_type = spec
                .partition_type(schema)
                .map_err(|e| iceberg_error(Phase::Commit, "cannot derive the partition type", e))?;
            deserialize_data_file_from_json(&file.data_file, file.spec_id, &partition_type, schema)
                .map_err(|e| iceberg_error(Phase::Commit, format!("cannot decode data file {}", file.path), e))
        })
        .collect()
}
