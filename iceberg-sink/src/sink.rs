//! The Iceberg sink: data files per checkpoint, one snapshot per commit, fenced and idempotent in the table.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{RecordBatch, UInt32Array};
use async_trait::async_trait;
use connector_api::{
    AppliedChanges, CheckpointId, Error, ErrorKind, Phase, RecoveryPlan, Result, SchemaChange,
    SinkId, TwoPhaseCommit,
};
use iceberg::TableIdent;
use iceberg::spec::{PartitionKey, Struct};
use iceberg::table::Table;

use crate::cleanup::delete_unreferenced_files;
use crate::commit::IcebergCommitter;
use crate::commit::TableTarget;
use crate::committable::CompactedFiles;
use crate::committable::encode_files;
use crate::committable::{IcebergCommittable, PendingFile};
use crate::config::IcebergSinkConfig;
use crate::config::UpsertDeletes;
use crate::equality_deletes::EqualityDeletes;
use crate::error::iceberg_error;
use crate::error::within;
use crate::evolve::evolve_table;
use crate::key_index::{IndexedFile, KeyIndex, Row, Shown};
use crate::key_scan;
use crate::ledger::SubtaskKey;
use crate::position_deletes::{DeletedRows, write_position_deletes};
use crate::table_creation::ensure_table;
use crate::types;
use crate::unavailable::{PreviousRows, fill};
use crate::upsert::{KeyedRows, table_columns, table_schema};
use crate::writer::{CheckpointWriter, key_columns};

/// The Iceberg sink for one subtask.
///
/// Per checkpoint: `begin` opens data file writers named after the subtask, its epoch and the checkpoint;
/// `write` appends (Parquet, zstd, following the partition spec); `pre_commit` closes the files and returns
/// them as the committable (nothing is visible yet); the committer appends them in one snapshot whose summary
/// records job, sink, subtask, checkpoint and epoch; `recover` raises the epoch (fencing every older instance),
/// commits the restored checkpoint if the table does not show it yet, and deletes this subtask's files no
/// snapshot references.
pub struct IcebergSink {
    pub(crate) config: IcebergSinkConfig,
    pub(crate) key: SubtaskKey,
    pub(crate) committer: IcebergCommitter,
    pub(crate) table: Option<Table>,
    pub(crate) writer: Option<CheckpointWriter>,
    /// Files of decided checkpoints not committed yet (commit every K checkpoints).
    pub(crate) carried: Vec<PendingFile>,
    /// Checkpoints in `carried`.
    pub(crate) carried_checkpoints: u32,
    /// The compaction policy of the table ([`crate::Compact::resolve`]; `None`: no compaction).
    pub(crate) compact: Option<crate::CompactPolicy>,
    /// Checkpoints since compaction last looked for small files (`compact`): it looks every `min_input_files`
    /// checkpoints (a fresh instance at its first).
    pub(crate) compact_wait: usize,
    /// This subtask's files per manifest, for compaction's looks.
    pub(crate) own_files: crate::compaction::OwnFileCache,
    /// The committable of the last pre-commit, until the next begin decides what it carries.
    pub(crate) pre_committed: Option<IcebergCommittable>,
    /// The checkpoint whose writers are open (begun, not yet pre-committed or aborted).
    pub(crate) open: Option<CheckpointId>,
    /// The upsert mode's rows of the open checkpoint (`upsert_key`), written at pre-commit.
    pub(crate) keyed: Option<KeyedRows>,
    /// The upsert mode's rows of the previous checkpoint, for the values a change does not carry.
    pub(crate) previous: PreviousRows,
    /// The upsert mode's key index (`upsert_deletes = "position"`): where every key's current row lives.
    pub(crate) index: Option<KeyIndex>,
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
    /// Connects to the catalog and checks the table (creating it from the batches' schema when configured). Each
    /// catalog call is bounded by `commit_timeout`: a catalog that hangs at the start fails it, it does not hang it.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a malformed table name, a missing table without `create_table`, or a
    /// request the catalog refuses (a credential or name it rejects, an HTTP 4xx such as 403);
    /// [`Retryable`](ErrorKind::Retryable) for a catalog that cannot be reached, fails with an HTTP 5xx, or does
    /// not answer one call within `commit_timeout`.
    pub async fn new(config: IcebergSinkConfig) -> Result<Self> {
        if config.commit_every == 0 {
            return Err(Error::config("commit_every must be at least 1"));
        }
        if let Some(after) = config.sweep_orphans_after {
            crate::orphan_sweep::check_bound(after, config.commit_timeout)
                .map_err(|e| e.with_sink(&config.sink))?;
        }
        if let Some(policy) = config.compact.explicit() {
            policy.check(&config.sink, &config.upsert_key, config.upsert_deletes)?;
        }
        let keyed = KeyedRows::of_config(&config)?;
        config.layout.check_settings(
            &config.sink,
            config.create_table,
            &config.upsert_key,
            config.upsert_deletes,
        )?;
        let catalog = within(
            config.commit_timeout,
            "the opening of the catalog",
            config.catalog.open(&config.catalog_name, &config.s3),
        )
        .await
        .map_err(|e| e.with_sink(&config.sink))?;
        let ident = TableIdent::from_strs(config.table.split('.')).map_err(|_| {
            Error::config(format!("table {:?} is not `namespace.name`", config.table))
        })?;
        ensure_table(catalog.as_ref(), &ident, &config).await?;
        let key = SubtaskKey {
            job: config.job.clone(),
            sink: config.sink.clone(),
            subtask: config.subtask,
        };
        let committer = IcebergCommitter {
            target: TableTarget::new(catalog, ident, config.commit_timeout)
                .with_snapshot_expiry(config.expire_snapshots)
                .with_own_commit(&config.catalog, &config.catalog_name)
                .map_err(|e| e.with_sink(&config.sink))?,
            key: key.clone(),
            epoch: Arc::default(),
        };
        if config.evolution.adds_columns() {
            evolve_table(
                &committer.target,
                &table_schema(&config)?,
                &config.sink,
                config.evolution,
            )
            .await?;
        }
        // Refused now, with the table and the fields named, rather than at the first write or pre-commit.
        let table = committer.target.load(Phase::Setup).await?;
        check_columns(&config, &table, &[])?;
        let compact = config.compact.resolve(&table, config.upsert_mode());
        if let Some(keyed) = &keyed {
            EqualityDeletes::of(&table, keyed.key()).map_err(|e| e.with_sink(&config.sink))?;
            if config.upsert_deletes == UpsertDeletes::Equality {
                EqualityDeletes::refuse_partitioned(&table)
                    .map_err(|e| e.with_sink(&config.sink))?;
            }
        }
        let index = match (&keyed, config.upsert_deletes) {
            (Some(keyed), UpsertDeletes::Position) => {
                Some(KeyIndex::new(&table, keyed.key()).map_err(|e| e.with_sink(&config.sink))?)
            }
            _ => None,
        };
        let compact_wait = compact.map_or(0, |p| p.min_input_files);
        Ok(Self {
            config,
            key,
            committer,
            table: None,
            writer: None,
            carried: Vec::new(),
            carried_checkpoints: 0,
            compact,
            compact_wait,
            own_files: Default::default(),
            pre_committed: None,
            open: None,
            keyed,
            previous: PreviousRows::default(),
            index,
        })
    }

    /// Opens the data file writers of `checkpoint` on the table's current schema, named after the subtask, its
    /// epoch and the checkpoint.
    async fn begin_writers(&mut self, checkpoint: CheckpointId, epoch: u64) -> Result<()> {
        let prefix = format!("{}e{epoch}.c{checkpoint}", self.key.file_prefix());
        let table = self.table(Phase::Begin)?;
        self.writer =
            Some(CheckpointWriter::open(table, prefix, self.config.target_file_size).await?);
        if let Some(keyed) = &mut self.keyed {
            keyed.clear();
        }
        self.open = Some(checkpoint);
        Ok(())
    }

    /// The compaction this checkpoint carries, when `compact` is set and it is time to look
    /// ([`crate::live_compaction::compact`]; an upsert table's moves are staged in the key index).
    async fn compact(&mut self, epoch: u64, checkpoint: CheckpointId) -> Option<CompactedFiles> {
        let policy = self.compact?;
        self.compact_wait += 1;
        if self.compact_wait < policy.min_input_files {
            return None;
        }
        self.compact_wait = 0;
        let file_prefix = crate::compaction::file_prefix(&self.key, epoch, checkpoint);
        let compacted = crate::live_compaction::compact(
            &self.committer.target,
            &self.key,
            (&policy, &mut self.own_files),
            self.index.as_ref(),
            file_prefix,
        )
        .await?;
        if let Some(index) = &mut self.index {
            index.stage_compaction(checkpoint, compacted.moves);
        }
        Some(compacted.files)
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

    /// How many keys the upsert mode's key index holds (`upsert_deletes = "position"`; `None` otherwise): every
    /// key with a row in the table once recovery rebuilt it, with this subtask's pre-committed changes on top.
    pub fn indexed_keys(&self) -> Option<usize> {
        self.index.as_ref().map(KeyIndex::len)
    }

    /// The heap the upsert mode's key index holds, in bytes (`None` without one): computed from its tables'
    /// capacities and its keys' allocations as glibc's malloc sizes them.
    pub fn key_index_bytes(&self) -> Option<usize> {
        self.index.as_ref().map(KeyIndex::heap_bytes)
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

    /// Files of decided checkpoints wait for the snapshot of a later one (`commit_every` > 1).
    fn holds_deferred(&self) -> bool {
        !self.carried.is_empty()
            || self
                .pre_committed
                .as_ref()
                .is_some_and(|c| !c.commit && !c.files.is_empty())
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let epoch = self.committer.epoch(Phase::Begin)?;
        // The previous checkpoint is decided by now (the driver begins only after saving its record).
        if let Some(index) = &mut self.index {
            index.settle();
        }
        if let Some(previous) = self.pre_committed.take() {
            if previous.commit {
                self.carried.clear();
                self.carried_checkpoints = 0;
            } else {
                self.carried = previous.files;
                self.carried_checkpoints += 1;
            }
        }
        self.begin_writers(checkpoint, epoch).await
    }

    /// `evolution = "add-columns"`: adds the new columns to the table as optional columns (one schema update
    /// through the catalog; nothing when another instance already added them); `"evolve"` also widens the
    /// columns whose type the batches widen and makes optional the ones they make optional.
    /// Then opens the checkpoint's writers again on the new schema (the ones `begin` opened wrote nothing).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a change `evolution` does not allow, naming the columns and the setting
    /// ([`SchemaChange::to_make`]); [`Retryable`](ErrorKind::Retryable) when the catalog cannot be reached.
    async fn evolve(&mut self, schema: arrow_schema::SchemaRef) -> Result<()> {
        let target = format!("table {}", self.config.table);
        let change = SchemaChange::to_make(
            &self.config.sink,
            self.config.evolution,
            &target,
            &self.config.schema,
            &schema,
        )?;
        if change.is_empty() {
            return Ok(());
        }
        let table = evolve_table(
            &self.committer.target,
            &table_columns(&self.config.upsert_key, &schema)?,
            &self.config.sink,
            self.config.evolution,
        )
        .await?;
        self.committer.target.reseed(table.clone());
        self.table = Some(table);
        if let Some(keyed) = &mut self.keyed {
            *keyed = KeyedRows::new(keyed.key().to_vec(), &schema)?;
            if let (Some(index), Some(table)) = (&mut self.index, &self.table) {
                index.retype(table, keyed.key())?;
            }
        }
        self.config.schema = schema;
        if let Some(checkpoint) = self.open {
            self.writer = None;
            let epoch = self.committer.epoch(Phase::Setup)?;
            self.begin_writers(checkpoint, epoch).await?;
        }
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
        let Some(keyed) = &mut self.keyed else {
            return writer
                .write(batch)
                .await
                .map_err(|e| e.or_sink(&self.config.sink));
        };
        // Checked now, so a bad row is refused with its batch (and dead-lettered where asked) instead of failing
        // the checkpoint's pre-commit; written at pre-commit, when the checkpoint's last change per key is known.
        let rows = keyed
            .checked(batch)
            .map_err(|e| e.or_sink(&self.config.sink))?;
        writer
            .check(&rows)
            .map_err(|e| e.or_sink(&self.config.sink))?;
        keyed.push(batch);
        Ok(())
    }

    /// Closes the data files and returns them (with the carried ones) as the committable; nothing is visible.
    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<IcebergCommittable> {
        let epoch = self.committer.epoch(Phase::PreCommit)?;
        self.open = None;
        let writer = self.writer.take().ok_or_else(|| {
            Error::new(
                ErrorKind::Bug,
                Phase::PreCommit,
                "pre_commit() outside a transaction",
            )
        })?;
        let mut based_on = None;
        let written = match self.keyed.as_mut().map(KeyedRows::take).transpose()? {
            None => writer.close().await?,
            Some(mut applied) => {
                let key = self
                    .keyed
                    .as_ref()
                    .map(|k| k.key().to_vec())
                    .unwrap_or_default();
                let fills = applied
                    .iter()
                    .any(|a| a.unchanged.iter().any(|u| !u.is_empty()));
                // The table as committed now (every checkpoint but the previous one, in `previous`): loaded when
                // the key index catches up with it or a change lacks columns.
                let table = match self.index.is_some() || fills {
                    true => Some(self.committer.target.load(Phase::PreCommit).await?),
                    false => None,
                };
                if let (Some(index), Some(table)) = (&mut self.index, &table) {
                    key_scan::within(
                        (self.config.commit_timeout, Phase::PreCommit),
                        table,
                        key_scan::catch_up(index, table, &self.key, Phase::PreCommit),
                    )
                    .await
                    .map_err(|e| e.or_sink(&self.config.sink))?;
                }
                if let (true, Some(table)) = (fills, &table) {
                    fill(table, &key, &self.previous, &mut applied)
                        .await
                        .map_err(|e| e.or_sink(&self.config.sink))?;
                }
                if self
                    .keyed
                    .as_ref()
                    .is_some_and(KeyedRows::carries_unavailable)
                {
                    self.previous.remember(&applied);
                }
                let deletes = EqualityDeletes::of(self.table(Phase::PreCommit)?, &key)
                    .map_err(|e| e.at_phase(Phase::PreCommit).or_sink(&self.config.sink))?;
                let written = Written {
                    table: self.table.as_ref().ok_or_else(|| {
                        Error::bug(
                            Phase::PreCommit,
                            "the Iceberg sink was used before recover()",
                        )
                    })?,
                    file_prefix: format!("{}e{epoch}.c{checkpoint}", self.key.file_prefix()),
                    target_file_size: self.config.target_file_size,
                };
                match &mut self.index {
                    Some(index) => {
                        based_on = match index.shown() {
                            Shown::At(snapshot) => snapshot,
                            Shown::Stale => None,
                        };
                        written
                            .by_position(writer, index, checkpoint, &deletes, applied)
                            .await?
                    }
                    None => written.by_equality(writer, &deletes, applied).await?,
                }
            }
        };
        let commit = self.carried_checkpoints + 1 >= self.config.commit_every;
        let compaction = match commit && !written.is_empty() {
            true => self.compact(epoch, checkpoint).await,
            false => None,
        };
        let mut files = self.carried.clone();
        files.extend(encode_files(self.table(Phase::PreCommit)?, written)?);
        let committable = IcebergCommittable {
            subtask: self.key.subtask.0,
            epoch,
            checkpoint,
            files,
            commit,
            deletes_based_on: based_on,
            compaction,
        };
        self.pre_committed = Some(committable.clone());
        Ok(committable)
    }

    /// Drops the open writers and deletes the files the aborted checkpoint closed (files of decided checkpoints
    /// carried for a later commit stay). Files still open are left to recovery's cleanup.
    async fn abort(&mut self) -> Result<()> {
        self.writer = None;
        self.open = None;
        self.previous.forget();
        if let Some(keyed) = &mut self.keyed {
            keyed.clear();
        }
        if let Some(index) = &mut self.index {
            index.undo();
        }
        if let Some(aborted) = self.pre_committed.take() {
            let table = self.table(Phase::Abort)?;
            let compacted = aborted.compaction.iter().flat_map(|c| &c.outputs);
            for file in aborted
                .files
                .iter()
                .filter(|f| !self.carried.contains(f))
                .chain(compacted)
            {
                table.file_io().delete(&file.path).await.map_err(|e| {
                    iceberg_error(Phase::Abort, format!("cannot delete {}", file.path), e)
                })?;
            }
        }
        Ok(())
    }

    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<IcebergCommittable>)>,
    ) -> Result<RecoveryPlan<IcebergCommittable>> {
        self.plan(restored).await
    }

    async fn execute_recovery(&mut self, plan: RecoveryPlan<IcebergCommittable>) -> Result<()> {
        self.execute_plan(plan).await
    }
}

/// Every column of the batches but `skip` (the ones evolution changes first) must convert exactly into `table`'s
/// column of that name ([`types`]).
///
/// # Errors
/// [`Config`](ErrorKind::Config) naming every field that does not.
pub(crate) fn check_columns(
    config: &IcebergSinkConfig,
    table: &Table,
    skip: &[String],
) -> Result<()> {
    let arrow =
        iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).map_err(|e| {
            iceberg_error(
                Phase::Setup,
                format!(
                    "cannot convert the schema of table {} to Arrow",
                    config.table
                ),
                e,
            )
        })?;
    let mut refusals = types::refusals_against(table_schema(config)?.as_ref(), &arrow);
    refusals.retain(|r| {
        !skip
            .iter()
            .any(|s| r.path == *s || r.path.starts_with(&format!("{s}.")))
    });
    match refusals.is_empty() {
        true => Ok(()),
        false => Err(types::refused(&config.sink, &config.table, &refusals)),
    }
}

/// Where the upsert mode's pre-commit writes: the table, the checkpoint's file name prefix and file size.
struct Written<'a> {
    table: &'a Table,
    file_prefix: String,
    target_file_size: usize,
}

impl Written<'_> {
    /// `upsert_deletes = "equality"`: the checkpoint's last change per key, `applied`, written as data files (the
    /// upserted rows, by `writer`) and equality-delete files named `<file_prefix>-<n>-eqdel.parquet` (the key of
    /// every upserted or deleted row).
    async fn by_equality(
        &self,
        mut writer: CheckpointWriter,
        deletes: &EqualityDeletes,
        applied: Vec<AppliedChanges>,
    ) -> Result<Vec<iceberg::spec::DataFile>> {
        for part in applied.iter().filter(|a| a.upserts.num_rows() > 0) {
            writer.write(&part.upserts).await?;
        }
        let mut files = writer.close().await?;
        files.extend(self.equality_deletes(deletes, &applied).await?);
        Ok(files)
    }

    /// `upsert_deletes = "position"`: the upserted rows written by `writer`, each key pointed at its new row in
    /// `index` (staged for `checkpoint`), and the rows they replace, with the rows of deleted keys, written as
    /// position-delete files `<file_prefix>-<n>-posdel.parquet` in the replaced rows' partitions. When there are
    /// any, the keys of the replaced rows are also written as equality-delete files in the same partitions: the
    /// commit takes those instead if the rows moved in between ([`IcebergCommittable::deletes_based_on`]; a
    /// rewrite keeps a row in its partition).
    async fn by_position(
        &self,
        mut writer: CheckpointWriter,
        index: &mut KeyIndex,
        checkpoint: CheckpointId,
        deletes: &EqualityDeletes,
        applied: Vec<AppliedChanges>,
    ) -> Result<Vec<iceberg::spec::DataFile>> {
        let name = self.table.identifier().to_string();
        let spec_id = self.table.metadata().default_partition_spec_id();
        let mut replaced = DeletedRows::new();
        // Per partition of a replaced row: the keys whose row it was (for the equality deletes).
        let mut replaced_keys: HashMap<Struct, Vec<RecordBatch>> = HashMap::new();
        // A replaced row's copy by a compaction the table does not show yet is deleted too
        // (crate::compaction_moves): whether that compaction lands or is dropped, the row is deleted.
        let mut replace = |keys: &RecordBatch,
                           rows: Vec<(Option<Row>, Option<Row>)>|
         -> Result<()> {
            let mut by_partition: HashMap<&Struct, Vec<u32>> = HashMap::new();
            for (i, (row, copy)) in rows.iter().enumerate() {
                if let Some((file, pos)) = copy {
                    replaced.entry(file.clone()).or_default().push(*pos);
                }
                if let Some((file, pos)) = row {
                    replaced.entry(file.clone()).or_default().push(*pos);
                    by_partition
                        .entry(&file.partition)
                        .or_default()
                        .push(i as u32);
                }
            }
            for (partition, rows) in by_partition {
                let taken = arrow_select::take::take_record_batch(keys, &UInt32Array::from(rows))
                    .map_err(|e| {
                    Error::bug(Phase::PreCommit, "cannot collect replaced keys").with_source(e)
                })?;
                replaced_keys
                    .entry(partition.clone())
                    .or_default()
                    .push(taken);
            }
            Ok(())
        };
        for part in &applied {
            if part.upserts.num_rows() > 0 {
                for located in writer.write_located(&part.upserts).await? {
                    let keys = key_columns(&name, index.key_schema(), &located.rows)?;
                    let encoded = index.encode(&keys)?;
                    let file = Arc::new(IndexedFile {
                        path: located.file,
                        spec_id,
                        partition: located.partition,
                    });
                    let rows = encoded
                        .iter()
                        .enumerate()
                        .map(|(i, key)| {
                            let row = index.stage(
                                checkpoint,
                                key.as_ref(),
                                Some((&file, located.start + i as u64)),
                            );
                            let copy = row.as_ref().and_then(|row| index.copy_of(row));
                            (row, copy)
                        })
                        .collect();
                    replace(&keys, rows)?;
                }
            }
            if part.deletes.num_rows() > 0 {
                let keys = key_columns(&name, index.key_schema(), &part.deletes)?;
                let encoded = index.encode(&keys)?;
                let rows = encoded
                    .iter()
                    .map(|key| {
                        let row = index.stage(checkpoint, key.as_ref(), None);
                        let copy = row.as_ref().and_then(|row| index.copy_of(row));
                        (row, copy)
                    })
                    .collect();
                replace(&keys, rows)?;
            }
        }
        let mut files = writer.close().await?;
        let positions = write_position_deletes(
            self.table,
            self.file_prefix.clone(),
            self.target_file_size,
            replaced,
        )
        .await?;
        if !positions.is_empty() {
            files.extend(positions);
            let metadata = self.table.metadata();
            let spec = metadata.default_partition_spec();
            for (partition, keys) in replaced_keys {
                let key = (!spec.is_unpartitioned()).then(|| {
                    PartitionKey::new(
                        spec.as_ref().clone(),
                        metadata.current_schema().clone(),
                        partition,
                    )
                });
                let keys: Vec<&RecordBatch> = keys.iter().collect();
                files.extend(
                    deletes
                        .write(
                            self.table,
                            self.file_prefix.clone(),
                            self.target_file_size,
                            key,
                            &keys,
                        )
                        .await?,
                );
            }
        }
        Ok(files)
    }

    /// The keys of every upserted or deleted row of `applied`, as equality-delete files
    /// `<file_prefix>-<n>-eqdel.parquet`.
    async fn equality_deletes(
        &self,
        deletes: &EqualityDeletes,
        applied: &[AppliedChanges],
    ) -> Result<Vec<iceberg::spec::DataFile>> {
        let keys: Vec<&RecordBatch> = applied
            .iter()
            .flat_map(|a| [&a.upserts, &a.deletes])
            .collect();
        deletes
            .write(
                self.table,
                self.file_prefix.clone(),
                self.target_file_size,
                None,
                &keys,
            )
            .await
    }
}
