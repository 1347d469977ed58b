//! Committing data files as one snapshot, conditionally on the table's own record of the subtask, and raising a
//! subtask's owner epoch (fencing).
//!
//! # Why commits are conditional
//! Several subtasks, processes and stale instances commit to one table. Every commit here goes through
//! [`GuardedCatalog`]: the metadata the snapshot is built on has been checked to (1) still carry this instance's
//! epoch for the subtask and (2) not yet show the checkpoint. The catalog accepts the snapshot only if the main
//! branch has not moved since that metadata (iceberg's `RefSnapshotIdMatch` requirement; the SQL catalog also
//! swaps the metadata location atomically), and recovery's epoch raise *is* a snapshot on main. So a commit either
//! lands on metadata it checked, or is rebuilt on fresh metadata and checked again: a zombie that planned its
//! commit before a newer instance recovered can never land it, and a retry never lands a checkpoint twice.
//!
//! # Unknown outcomes
//! A timeout or an error other than a conflict (a REST catalog's HTTP 5xx is `Unexpected` in iceberg-rust) may
//! hide a commit that landed. The error is retryable; the next attempt starts by loading the table and checking
//! its history, so it finds the landed snapshot instead of adding a second one. (iceberg's own duplicate-file
//! check is off: it reads every manifest of the table on every commit, and the ledger check is exact.)
//!
//! # Two commit paths
//! A table that asks for manifest merging (`commit.manifest-merge.enabled`, [`crate::manifest_merge`]) is
//! committed by Ratchet itself: iceberg plans the commit as always (guarded load, expiry, fast append, ledger
//! property) into a capturing [`GuardedCatalog`], the planned snapshot's manifests are merged, and [`OwnCommit`]
//! commits it: the SQL catalog's compare-and-swap of the metadata location ([`crate::metadata_swap`]) or the REST
//! catalog's commit endpoint ([`crate::rest_commit`]). The guard, the requirements and the ledger are the same on
//! both paths. Any other table is committed by iceberg's `Transaction::commit`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use connector_api::{CheckpointId, Committer, Error, ErrorKind, Phase, Result, SubtaskId};
use iceberg::spec::{DataContentType, DataFile};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, TableIdent, TableUpdate};

use crate::committable::CompactedFiles;
use crate::committable::IcebergCommittable;
use crate::committable::decode_files;
use crate::config::CatalogConfig;
use crate::dv_commit::{DeleteManifestCache, merge_with_table};
use crate::error::iceberg_error;
use crate::guarded::{Check, GuardedCatalog, Planned, Verdict};
use crate::ledger::{SubtaskKey, SubtaskState};
use crate::location::canonical;
use crate::manifest_merge::{MergePolicy, merge_manifests};
use crate::own_commit::OwnCommit;
use crate::replace::{Removal, Replaced, remove_data_files};
use crate::retire::{ManifestListCache, delete_retired_files, drill};
use crate::rewritten::read_list;
use crate::row_delta::add_delete_files;
use crate::swap_outcome::SwapOutcome;

/// What a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// A new snapshot was committed.
    Committed,
    /// The table's history already holds this checkpoint (or a later one) of this subtask: nothing was done.
    AlreadyCommitted,
}

/// The catalog, the table and how long one catalog commit may take before its outcome counts as unknown.
#[derive(Debug, Clone)]
pub struct TableTarget {
    /// The catalog.
    pub catalog: Arc<dyn Catalog>,
    /// The table.
    pub table: TableIdent,
    /// The longest one commit (load, build, catalog update, with iceberg's own conflict retries) may take.
    pub commit_timeout: Duration,
    /// Every commit also expires snapshots by the table's retention properties ([`Self::with_snapshot_expiry`]).
    expire_snapshots: bool,
    /// Whether the warning that `gc.enabled = false` keeps expiry off was logged.
    warned_gc_off: Arc<AtomicBool>,
    /// Ratchet's own commit to the catalog, used for tables that ask for manifest merging.
    own_commit: Option<OwnCommit>,
    /// Whether the warning that merging needs Ratchet's own commit was logged.
    warned_no_own_commit: Arc<AtomicBool>,
    /// What the retained snapshots' manifest lists name, for deleting manifests merges replaced.
    lists: Arc<ManifestListCache>,
    /// The table as the last commit left it: the seed of the next commit (which reloads through the guard
    /// anyway, so a stale seed costs nothing but a rebuild).
    seed: Arc<Mutex<Option<Table>>>,
    /// The inputs of the compactions this target committed, with the sequence number of the snapshot that
    /// replaced them, until expiry leaves no snapshot before it ([`crate::replace::due_inputs`]).
    replaced: Arc<Mutex<Vec<Replaced>>>,
    /// The delete manifests the last deletion-vector merge read ([`crate::dv_commit`]).
    delete_manifests: Arc<DeleteManifestCache>,
}

impl TableTarget {
    /// A target for `table` in `catalog`.
    pub fn new(catalog: Arc<dyn Catalog>, table: TableIdent, commit_timeout: Duration) -> Self {
        Self {
            catalog,
            table,
            commit_timeout,
            expire_snapshots: false,
            warned_gc_off: Arc::default(),
            own_commit: None,
            warned_no_own_commit: Arc::default(),
            lists: Arc::default(),
            seed: Arc::default(),
            replaced: Arc::default(),
            delete_manifests: Arc::default(),
        }
    }

    /// Commits the tables that ask for manifest merging through Ratchet's own commit to `catalog` (the
    /// configuration the target's catalog was opened from, under the name `catalog_name`): the SQL catalog's
    /// compare-and-swap (`metadata_swap`) or the REST catalog's commit endpoint (`rest_commit`).
    /// Without it, merging is skipped with a warning.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the catalog's database URI is malformed or a REST credential's
    /// environment variable is not set.
    pub fn with_own_commit(mut self, catalog: &CatalogConfig, catalog_name: &str) -> Result<Self> {
        self.own_commit = Some(catalog.own_commit(catalog_name)?);
        Ok(self)
    }

    /// Ratchet's own catalog commit, when the target was built with one.
    pub(crate) fn own_commit(&self) -> Option<&OwnCommit> {
        self.own_commit.as_ref()
    }

    /// Ratchet's own commit when the snapshot needs it: it adds delete files (a row delta, which iceberg cannot
    /// commit), or `table` asks for manifest merging; `None` for iceberg's own commit.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the property when the table's merge properties are invalid, or when
    /// delete files must be committed by a target built without Ratchet's own commit.
    fn own_commit_for(&self, table: &Table, row_delta: bool) -> Result<Option<&OwnCommit>> {
        let policy = MergePolicy::of(table.metadata()).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                Phase::Commit,
                format!(
                    "table {} asks for manifest merging: {}",
                    self.table,
                    e.message()
                ),
            )
        })?;
        if row_delta {
            return self.own_commit.as_ref().map(Some).ok_or_else(|| {
                Error::new(
                    ErrorKind::Config,
                    Phase::Commit,
                    format!(
                        "the commit to table {} carries equality-delete files (upsert_key), which only Ratchet's \
                         own catalog commit can commit: build the target with TableTarget::with_own_commit",
                        self.table
                    ),
                )
            });
        }
        match (policy, &self.own_commit) {
            (Some(_), Some(own)) => Ok(Some(own)),
            (Some(_), None) => {
                if !self.warned_no_own_commit.swap(true, Ordering::SeqCst) {
                    tracing::warn!(
                        table = %self.table,
                        "the table sets commit.manifest-merge.enabled = true, but this committer was built \
                         without Ratchet's own catalog commit (TableTarget::new alone): its manifests are not merged"
                    );
                }
                Ok(None)
            }
            (None, _) => Ok(None),
        }
    }

    /// Makes every commit also expire snapshots by the table's standard retention properties
    /// (`history.expire.max-snapshot-age-ms`, `history.expire.min-snapshots-to-keep`, per-ref retention), in the
    /// same catalog commit as the snapshot it adds: the expiry lands exactly when the commit does, never on its
    /// own. The ledger survives it (the subtask's state is also a table property, `ledger`). After the
    /// commit, the expired snapshots' manifest lists are deleted (`retire`). A table that sets
    /// `gc.enabled = false` is not expired (a warning says so once).
    pub fn with_snapshot_expiry(mut self, expire: bool) -> Self {
        self.expire_snapshots = expire;
        self
    }

    /// Whether a commit on `table` expires snapshots: asked for, and the table allows it.
    fn expires(&self, table: &Table) -> bool {
        if !self.expire_snapshots {
            return false;
        }
        let gc = table
            .metadata()
            .table_properties()
            .map(|p| p.gc_enabled)
            .unwrap_or(true);
        if !gc && !self.warned_gc_off.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                table = %self.table,
                "expire_snapshots is on, but the table sets gc.enabled = false: its snapshots are not expired"
            );
        }
        gc
    }

    /// Makes `table` the seed of the next commit: the table as a schema change of this sink left it (a seed older
    /// than the change would decode the files written since against the old schema).
    pub(crate) fn reseed(&self, table: Table) {
        *self.seed.lock().expect("seed lock") = Some(table);
    }

    /// The table as the last commit left it, or freshly loaded.
    pub async fn recent(&self, phase: Phase) -> Result<Table> {
        let cached = self.seed.lock().expect("seed lock").clone();
        match cached {
            Some(table) => Ok(table),
            None => self.load(phase).await,
        }
    }

    /// Loads the table.
    ///
    /// # Errors
    /// Retryable when the catalog cannot be reached; fatal when the table does not exist.
    pub async fn load(&self, phase: Phase) -> Result<Table> {
        let loading = async {
            self.catalog
                .load_table(&self.table)
                .await
                .map_err(|e| iceberg_error(phase, format!("cannot load table {}", self.table), e))
        };
        let timed_out = || {
            format!(
                "loading table {} took longer than {:?}: check the catalog",
                self.table, self.commit_timeout
            )
        };
        connector_api::bounded(
            self.commit_timeout,
            (ErrorKind::Retryable, phase),
            timed_out,
            loading,
        )
        .await
    }

    /// Commits `files` as one snapshot recording `checkpoint` for `key` under `epoch`, unless the table already
    /// shows that checkpoint (or a later one) for `key`.
    ///
    /// # Errors
    /// [`Fenced`](ErrorKind::Fenced) when the table shows a different epoch for the subtask (a newer instance
    /// recovered); [`Retryable`](ErrorKind::Retryable) for conflicts that outlasted iceberg's retries and for
    /// unknown outcomes (the next call checks the history first); [`Fatal`](ErrorKind::Fatal) when iceberg refuses
    /// the snapshot itself (invalid data files).
    pub async fn commit_files(
        &self,
        key: &SubtaskKey,
        epoch: u64,
        checkpoint: CheckpointId,
        files: Vec<DataFile>,
    ) -> Result<CommitOutcome> {
        self.commit_checkpoint(key, epoch, checkpoint, files, None, None)
            .await
    }

    /// [`commit_files`](Self::commit_files) with the upsert mode's position deletes written on the key index's
    /// view of snapshot `deletes_based_on` ([`IcebergCommittable::deletes_based_on`]) and a compaction's
    /// `replacement`, dropped when one of its inputs is no longer live ([`crate::replace`]).
    pub(crate) async fn commit_checkpoint(
        &self,
        key: &SubtaskKey,
        epoch: u64,
        checkpoint: CheckpointId,
        files: Vec<DataFile>,
        deletes_based_on: Option<i64>,
        replacement: Option<Replacement>,
    ) -> Result<CommitOutcome> {
        let context = |e: Error| {
            e.with_checkpoint(checkpoint)
                .with_txn(self.table.to_string())
        };
        let check = |table: &Table| {
            let state = key.state(&table.metadata_ref());
            if state.epoch != epoch {
                Err(Verdict::Fenced(state.epoch))
            } else if state.checkpoint.is_some_and(|last| last >= checkpoint) {
                Err(Verdict::AlreadyCommitted)
            } else {
                Ok(())
            }
        };
        let state = SubtaskState {
            epoch,
            checkpoint: Some(checkpoint),
        };
        match self
            .commit_snapshot(key, state, files, deletes_based_on, replacement, &check)
            .await
        {
            Ok(None) => Ok(CommitOutcome::Committed),
            Ok(Some(Verdict::AlreadyCommitted)) => Ok(CommitOutcome::AlreadyCommitted),
            Ok(Some(Verdict::Fenced(newer))) => Err(context(Error::new(
                ErrorKind::Fenced,
                Phase::Commit,
                format!(
                    "subtask {} of sink {} (job {}) was recovered by a newer instance (epoch {newer}, this one \
                     {epoch}): this instance must stop",
                    key.subtask, key.sink, key.job
                ),
            ))),
            Err(e) => Err(context(e)),
        }
    }

    /// Raises the subtask's owner epoch with a snapshot of no data files that records it: from then on, every
    /// commit planned by an older instance is refused. Returns the new epoch and the subtask's state before.
    ///
    /// Called by recovery under the checkpoint store's claim, so no other legitimate instance raises the same
    /// subtask's epoch at the same time; a raise by a stale instance that slipped in is raised over.
    ///
    /// # Errors
    /// Retryable when the catalog is unreachable, the outcome unknown, or the raise kept conflicting.
    pub async fn raise_epoch(&self, key: &SubtaskKey) -> Result<(u64, SubtaskState)> {
        for _ in 0..5 {
            let table = self.load(Phase::Recover).await?;
            let before = key.state(&table.metadata_ref());
            let check = |table: &Table| {
                let now = key.state(&table.metadata_ref());
                if now.epoch == before.epoch {
                    Ok(())
                } else {
                    Err(Verdict::Fenced(now.epoch))
                }
            };
            let raised = SubtaskState {
                epoch: before.epoch + 1,
                checkpoint: before.checkpoint,
            };
            match self
                .commit_snapshot(key, raised, Vec::new(), None, None, &check)
                .await
                .map_err(|e| e.at_phase(Phase::Recover))?
            {
                None => return Ok((raised.epoch, before)),
                Some(_) => continue,
            }
        }
        Err(Error::new(
            ErrorKind::Retryable,
            Phase::Recover,
            format!(
                "the epoch of subtask {} of sink {} in table {} kept changing while recovery raised it: is another \
                 instance recovering the same subtask without the checkpoint store's claim?",
                key.subtask, key.sink, self.table
            ),
        ))
    }

    /// One snapshot with `files` and the subtask's `state` (summary and table property), built only on metadata
    /// `check` accepts. `Ok(Some(verdict))` when a check refused.
    async fn commit_snapshot(
        &self,
        key: &SubtaskKey,
        state: SubtaskState,
        files: Vec<DataFile>,
        deletes_based_on: Option<i64>,
        replacement: Option<Replacement>,
        check: &Check<'_>,
    ) -> Result<Option<Verdict>> {
        // The first load only seeds the transaction; `commit` loads again through the guard and builds on that.
        let table = self.recent(Phase::Commit).await?;
        let (deletes, files): (Vec<DataFile>, Vec<DataFile>) = files
            .into_iter()
            .partition(|f| f.content_type() != DataContentType::Data);
        let replacement = replacement.filter(|r| {
            let own = self.own_commit.is_some();
            if !own {
                tracing::warn!(
                    table = %self.table,
                    inputs = r.inputs.len(),
                    "a compaction needs Ratchet's own catalog commit (TableTarget::with_own_commit); this commit \
                     drops it"
                );
            }
            own
        });
        let merging = match self.own_commit_for(&table, !deletes.is_empty())? {
            None if replacement.is_some() => self.own_commit.as_ref(),
            merging => merging,
        };
        let guarded = GuardedCatalog::new(self.catalog.as_ref(), check);
        let (guarded, committed) = match merging {
            None => {
                let tx = self
                    .plan(&table, key, state, files)
                    .map_err(|e| iceberg_error(Phase::Commit, "cannot build the snapshot", e))?;
                let committed =
                    tokio::time::timeout(self.commit_timeout, tx.commit(&guarded)).await;
                (guarded, committed)
            }
            Some(own) => {
                let guarded = guarded.capturing();
                let deletes = DeleteFiles {
                    files: &deletes,
                    based_on: deletes_based_on,
                };
                let own = self.commit_own(
                    &guarded,
                    table,
                    key,
                    state,
                    (&files, deletes, replacement.as_ref()),
                    own,
                );
                let committed = tokio::time::timeout(self.commit_timeout, own).await;
                (guarded, committed)
            }
        };
        let landed = match &committed {
            Ok(Ok(table)) => Some(table.clone()),
            _ => None,
        };
        *self.seed.lock().expect("seed lock") = landed;
        if let Some(verdict) = guarded.verdict() {
            return Ok(Some(verdict));
        }
        match committed {
            Ok(Ok(table)) => {
                self.retire(guarded.base(), &table, merging.is_some())
                    .await;
                Ok(None)
            }
            Ok(Err(e)) => Err(match e.kind() {
                iceberg::ErrorKind::CatalogCommitConflicts => Error::new(
                    ErrorKind::Retryable,
                    Phase::Commit,
                    format!(
                        "table {} kept changing under the commit (other writers); retrying",
                        self.table
                    ),
                )
                .with_source(e),
                iceberg::ErrorKind::FeatureUnsupported => Error::new(
                    ErrorKind::Config,
                    Phase::Commit,
                    format!("table {} asks for something the sink cannot do", self.table),
                )
                .with_source(e),
                iceberg::ErrorKind::DataInvalid | iceberg::ErrorKind::PreconditionFailed => Error::new(
                    ErrorKind::Fatal,
                    Phase::Commit,
                    format!("iceberg refused the snapshot for table {}", self.table),
                )
                .with_source(e),
                _ => Error::new(
                    ErrorKind::Retryable,
                    Phase::Commit,
                    format!(
                        "the commit to table {} failed with an unknown outcome; the next attempt checks the \
                         table's history before committing again",
                        self.table
                    ),
                )
                .with_source(e),
            }),
            Err(_) => Err(Error::new(
                ErrorKind::Retryable,
                Phase::Commit,
                format!(
                    "the commit to table {} took longer than {:?}; its outcome is unknown, the next attempt checks \
                     the table's history before committing again",
                    self.table, self.commit_timeout
                ),
            )),
        }
    }

    /// iceberg's plan of one snapshot on `table`: the expiry (when on), the fast append of `files` with the
    /// subtask's summary, and the ledger's table property.
    fn plan(
        &self,
        table: &Table,
        key: &SubtaskKey,
        state: SubtaskState,
        files: Vec<DataFile>,
    ) -> iceberg::Result<Transaction> {
        // Files written before a column was widened carry bounds in the narrower type: promoted to the types of
        // the schema the snapshot's manifests are written with.
        let metadata = table.metadata();
        let spec = metadata.default_partition_spec();
        let partition_type = spec.partition_type(metadata.current_schema())?;
        let files = files
            .into_iter()
            .map(|file| {
                crate::promoted_bounds::promote_file(
                    file,
                    spec.spec_id(),
                    metadata.current_schema(),
                    &partition_type,
                    metadata.format_version(),
                )
            })
            .collect::<iceberg::Result<Vec<_>>>()?;
        let mut tx = Transaction::new(table);
        if self.expires(table) {
            // Before the append: every action requires main to be where it saw it, and the catalog checks them
            // all against the base; expiring after the append would name the new snapshot and always conflict.
            let expire = tx.expire_snapshots();
            tx = expire.apply(tx)?;
        }
        tx.fast_append()
            // iceberg's duplicate-file check reads every manifest of the current snapshot on every commit
            // (O(table) per commit, O(n^2) over a run: minutes per commit after a day of 1 s checkpoints). The
            // guarded check of the subtask's ledger on the same metadata is exact, so it stands alone.
            .with_check_duplicate(false)
            .add_data_files(files)
            .set_snapshot_properties(key.summary(state))
            .apply(tx)
            .and_then(|tx| {
                let properties = tx
                    .update_table_properties()
                    .set(key.table_property(), state.property_value());
                properties.apply(tx)
            })
    }

    /// Ratchet's own commit (module docs): iceberg plans the data files into the capturing `guarded`, the
    /// equality-delete files join the planned snapshot as a row delta ([`crate::row_delta`]), its manifests are
    /// merged by the policy of the table it was planned on (read again on every attempt: another writer may have
    /// changed it), `own` commits. A lost swap (another writer moved the table) deletes its merged
    /// files and replans on fresh metadata after a jittered exponential wait, by the table's
    /// `commit.retry.num-retries`, `commit.retry.min-wait-ms` and `commit.retry.max-wait-ms` (the sink's
    /// `commit_timeout` bounds the whole commit instead of `commit.retry.total-timeout-ms`). A refused check stops
    /// with the verdict in `guarded`. A compaction's `replacement` adds its outputs to the planned files and
    /// replaces its inputs ([`crate::replace`]); an attempt whose base no longer holds every input replans without
    /// it, and once committed without it its outputs are deleted.
    async fn commit_own(
        &self,
        guarded: &GuardedCatalog<'_>,
        mut seed: Table,
        key: &SubtaskKey,
        state: SubtaskState,
        (files, deletes, mut replacement): (&[DataFile], DeleteFiles<'_>, Option<&Replacement>),
        own: &OwnCommit,
    ) -> iceberg::Result<Table> {
        let dropped = replacement.map(|r| {
            r.outputs
                .iter()
                .map(|f| f.file_path().to_string())
                .collect::<Vec<_>>()
        });
        let retry = seed.metadata().table_properties()?;
        let mut wait = Duration::from_millis(retry.commit_min_retry_wait_ms.max(1));
        for attempt in 0..=retry.commit_num_retries {
            if attempt > 0 {
                tokio::time::sleep(jittered(wait)).await;
                wait = (wait * 2).min(Duration::from_millis(retry.commit_max_retry_wait_ms.max(1)));
            }
            let mut planned_files = files.to_vec();
            if let Some(replacement) = replacement {
                planned_files.extend(replacement.outputs.iter().cloned());
            }
            self.plan(&seed, key, state, planned_files)?
                .commit(guarded)
                .await?;
            let Some(Planned {
                base,
                requirements,
                mut updates,
            }) = guarded.take_planned()
            else {
                return Err(iceberg::Error::new(
                    iceberg::ErrorKind::Unexpected,
                    "iceberg planned no commit for the snapshot",
                ));
            };
            let mut written = Vec::new();
            let policy = MergePolicy::of(base.metadata())?;
            let mut planned_snapshot = updates.iter_mut().find_map(|u| match u {
                TableUpdate::AddSnapshot { snapshot } => Some(snapshot),
                _ => None,
            });
            // The planned list is read once; each rewrite hands the next the manifests its list names.
            let mut manifests = match &planned_snapshot {
                Some(snapshot)
                    if !deletes.files.is_empty() || policy.is_some() || replacement.is_some() =>
                {
                    read_list(&base, snapshot).await?
                }
                _ => Vec::new(),
            };
            let mut chosen = choose_deletes(&base, key, deletes.files, deletes.based_on);
            // A compaction riding on this commit is checked before anything is written for it.
            if let Some(replacing) = replacement {
                let conflict = match replacing.read_at {
                    Some(read_at) => {
                        conflicting_deletes(&base, read_at, &replacing.inputs, &chosen.commit)
                            .await?
                    }
                    None => None,
                };
                if let Some(why) = conflict {
                    tracing::info!(
                        table = %self.table,
                        subtask = %key.subtask,
                        inputs = replacing.inputs.len(),
                        "{why}: the checkpoint is committed without the compaction"
                    );
                    replacement = None;
                    seed = base;
                    continue;
                }
                chosen.leave_out_vectors_of(&replacing.inputs);
            }
            let mut retired = Vec::new();
            if let (false, Some(snapshot)) =
                (chosen.commit.is_empty(), planned_snapshot.as_deref_mut())
            {
                // A format-version 3 table's deletion vectors replace the base's for the same data files.
                let vectors = merge_with_table(
                    &base,
                    snapshot,
                    (manifests, &self.delete_manifests),
                    &chosen.commit,
                )
                .await?;
                let delta = add_delete_files(
                    &base,
                    snapshot,
                    vectors.manifests,
                    (&vectors.deletes, &vectors.removed),
                )
                .await;
                let delta = match delta {
                    Ok(delta) => delta,
                    Err(e) => {
                        discard(&base, &vectors.written).await;
                        return Err(e);
                    }
                };
                *snapshot = delta.snapshot;
                manifests = delta.manifests;
                written = vectors.written;
                written.extend(delta.written);
                chosen.unused.extend(vectors.unused);
                retired = vectors.retired;
            }
            if let (Some(replacing), Some(snapshot)) =
                (replacement, planned_snapshot.as_deref_mut())
            {
                let removal = Removal {
                    data: &replacing.inputs,
                    deletes: &replacing.deletes,
                    hints: &replacing.manifests,
                };
                match remove_data_files(&base, snapshot, manifests, removal).await? {
                    Some(replaced) => {
                        *snapshot = replaced.snapshot;
                        manifests = replaced.manifests;
                        written.extend(replaced.written);
                    }
                    None => {
                        // The next attempt commits the checkpoint's deletion vectors of the inputs again.
                        tracing::info!(
                            table = %self.table,
                            subtask = %key.subtask,
                            inputs = replacing.inputs.len(),
                            "a file the checkpoint's compaction rewrote or removes is no longer live (another \
                             writer rewrote or removed it): the checkpoint is committed without the compaction"
                        );
                        discard(&base, &written).await;
                        replacement = None;
                        seed = base;
                        continue;
                    }
                }
            }
            if let (Some(policy), Some(snapshot)) = (policy, planned_snapshot) {
                match merge_manifests(&base, snapshot, manifests, policy).await {
                    Ok(Some(merged)) => {
                        *snapshot = merged.snapshot;
                        written.extend(merged.written);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        discard(&base, &written).await;
                        // A manifest the base names may be gone because another writer's commit expired its last
                        // snapshot since: then the table moved, and the plan is replanned like a lost swap.
                        match self.catalog.load_table(&self.table).await {
                            Ok(now) if now.metadata_location() != base.metadata_location() => {
                                seed = now;
                                continue;
                            }
                            _ => {
                                return Err(iceberg::Error::new(
                                    e.kind(),
                                    format!(
                                        "merging the manifests of table {} failed; to commit without merging, \
                                         set the table property {} = false",
                                        self.table,
                                        crate::manifest_merge::MANIFEST_MERGE_ENABLED
                                    ),
                                )
                                .with_source(e));
                            }
                        }
                    }
                }
            }
            match own.commit(&base, requirements, updates).await? {
                SwapOutcome::Committed(table) => {
                    if !written.is_empty() {
                        drill("after-own-commit");
                    }
                    if replacement.is_some() {
                        drill("after-compacted-commit");
                    }
                    // Nothing names the delete files this commit did not choose: they are the checkpoint's
                    // alternative, never committed (one left behind is deleted by recovery's cleanup).
                    discard(&base, &chosen.unused).await;
                    if let (false, Some(snapshot)) =
                        (retired.is_empty(), table.metadata().current_snapshot())
                    {
                        // Superseded vectors' files: deleted once every snapshot naming them is expired.
                        self.replaced.lock().expect("replaced lock").push(Replaced {
                            sequence: snapshot.sequence_number(),
                            inputs: retired,
                        });
                    }
                    match (replacement, &dropped) {
                        (None, Some(outputs)) => discard(&base, outputs).await,
                        (Some(replaced), _) => {
                            if let Some(snapshot) = table.metadata().current_snapshot() {
                                let mut inputs = replaced.inputs.clone();
                                inputs.extend(replaced.deletes.iter().cloned());
                                self.replaced.lock().expect("replaced lock").push(Replaced {
                                    sequence: snapshot.sequence_number(),
                                    inputs,
                                });
                            }
                        }
                        (None, None) => {}
                    }
                    return Ok(*table);
                }
                SwapOutcome::Conflict => {
                    discard(&base, &written).await;
                    seed = self.catalog.load_table(&self.table).await?;
                }
            }
        }
        Err(iceberg::Error::new(
            iceberg::ErrorKind::CatalogCommitConflicts,
            "the table's metadata location kept changing under Ratchet's commit",
        ))
    }

    /// Takes over the compactions recovery found `committed` (the table as recovered) retaining for this target's
    /// subtask ([`crate::replace::retained_replacements`]), and deletes the inputs of those no retained snapshot
    /// reads any more, bounded like a commit.
    pub(crate) async fn resume_replaced(&self, committed: &Table, found: Vec<Replaced>) {
        let inputs = {
            let mut replaced = self.replaced.lock().expect("replaced lock");
            *replaced = found;
            crate::replace::due_inputs(&mut replaced, committed)
        };
        let deleting = crate::replace::delete_inputs(committed, &inputs);
        if tokio::time::timeout(self.commit_timeout, deleting)
            .await
            .is_err()
        {
            tracing::warn!(
                table = %self.table,
                "deleting compacted files took longer than commit_timeout; the rest stay until a later recovery"
            );
        }
    }

    /// Deletes what the commit from `base` to `committed` retired ([`crate::retire`]), bounded like the commit:
    /// a storage that hangs leaves the rest as orphans, never the job. With `merged_manifests`, also the
    /// manifests that merges replaced and no retained snapshot names any more.
    async fn retire(&self, base: Option<Table>, committed: &Table, merged_manifests: bool) {
        let Some(base) = base else { return };
        let lists = merged_manifests.then_some(self.lists.as_ref());
        let inputs = crate::replace::due_inputs(
            &mut self.replaced.lock().expect("replaced lock"),
            committed,
        );
        let retiring = async {
            delete_retired_files(&base, committed, lists).await;
            crate::replace::delete_inputs(committed, &inputs).await;
        };
        if tokio::time::timeout(self.commit_timeout, retiring)
            .await
            .is_err()
        {
            tracing::warn!(
                table = %self.table,
                timeout = ?self.commit_timeout,
                "deleting the files the commit retired took longer than commit_timeout; the rest stay as orphans \
                 (no reader uses them)"
            );
        }
    }
}

/// A compaction to commit with a checkpoint ([`crate::compaction`]): its `outputs` hold exactly the rows of its
/// `inputs` (paths as the table's manifests name them).
#[derive(Debug)]
pub(crate) struct Replacement {
    pub(crate) inputs: Vec<String>,
    pub(crate) outputs: Vec<DataFile>,
    /// Where the inputs were listed when picked ([`CompactedFiles::manifests`]).
    pub(crate) manifests: Vec<String>,
    /// An upsert table's: the snapshot the inputs were read at ([`CompactedFiles::read_at`]).
    pub(crate) read_at: Option<i64>,
    /// An upsert table's: the position-delete files removed with the inputs ([`CompactedFiles::deletes`]).
    pub(crate) deletes: Vec<String>,
}

/// The delete files of one commit: the checkpoint's, and the snapshot the key index showed when its position
/// deletes were written.
#[derive(Debug, Clone, Copy)]
struct DeleteFiles<'a> {
    files: &'a [DataFile],
    based_on: Option<i64>,
}

/// Which of a checkpoint's delete files one commit attempt on `base` commits.
#[derive(Debug)]
struct ChosenDeletes {
    commit: Vec<DataFile>,
    /// Paths of the delete files it leaves out.
    unused: Vec<String>,
}

impl ChosenDeletes {
    /// Leaves out the deletion vectors that name one of `inputs`: data files the same snapshot removes with a
    /// compaction, which took them although this checkpoint deletes from them and dropped those rows from its
    /// outputs ([`crate::live_compaction`]). Committed, such a vector would be merged with the file's own vector
    /// that the snapshot removes, and name a file no longer live. A Puffin file none of whose vectors is committed
    /// any more joins `unused` (deleted once the commit landed). Position-delete files stay: the rows they name
    /// are gone with their file, and a later compaction removes them unread.
    fn leave_out_vectors_of(&mut self, inputs: &[String]) {
        let inputs: HashSet<String> = inputs.iter().map(|p| canonical(p)).collect();
        let (left_out, kept): (Vec<DataFile>, Vec<DataFile>) =
            std::mem::take(&mut self.commit).into_iter().partition(|f| {
                crate::deletion_vectors::is_deletion_vector(f)
                    && f.referenced_data_file()
                        .is_some_and(|data| inputs.contains(&canonical(&data)))
            });
        for file in left_out {
            let path = file.file_path();
            if !kept.iter().any(|k| k.file_path() == path) && !self.unused.iter().any(|u| u == path)
            {
                self.unused.push(path.to_string());
            }
        }
        self.commit = kept;
    }
}

/// The upsert mode writes a checkpoint's deletes twice when positions are asked for: position-delete files (the
/// rows the key index located on snapshot `based_on`) and equality-delete files (the keys). The positions are
/// committed unless a snapshot in `base`'s history since `based_on` that `key` did not commit removed data files
/// (a rewrite, an overwrite: a located row may live in another file now), or the history no longer reaches
/// `based_on` (expired, rolled back); then the equality deletes are, which reach the keys' rows wherever they moved
/// (every data file of a lower sequence number). Delete files of one kind only are committed as they are.
fn choose_deletes(
    base: &Table,
    key: &SubtaskKey,
    files: &[DataFile],
    based_on: Option<i64>,
) -> ChosenDeletes {
    let (positions, equalities): (Vec<&DataFile>, Vec<&DataFile>) = files
        .iter()
        .partition(|f| f.content_type() == DataContentType::PositionDeletes);
    let (commit, unused) = if positions.is_empty() || equalities.is_empty() {
        (files.iter().collect(), Vec::new())
    } else {
        match crate::key_scan::moved_rows_since(base, key, based_on) {
            None => (positions, equalities),
            Some(why) => {
                tracing::info!(
                    table = %base.identifier(),
                    subtask = %key.subtask,
                    "{why}: this commit deletes the checkpoint's keys by equality instead of by position"
                );
                (equalities, positions)
            }
        }
    };
    ChosenDeletes {
        commit: commit.into_iter().cloned().collect(),
        unused: unused.iter().map(|f| f.file_path().to_string()).collect(),
    }
}

/// Why an upsert table's compaction that read its inputs at `read_at` must not ride on a commit on `base` that
/// commits `deletes`: the commit deletes the checkpoint's keys by equality (they reach rows of lower sequence
/// numbers only, not the outputs of the same snapshot), or a delete file added since may reach an input
/// ([`crate::rewrite_conflicts`]).
///
/// # Errors
/// A manifest or delete file that cannot be read (the attempt fails retryably).
async fn conflicting_deletes(
    base: &Table,
    read_at: i64,
    inputs: &[String],
    deletes: &[DataFile],
) -> iceberg::Result<Option<String>> {
    if deletes
        .iter()
        .any(|f| f.content_type() == DataContentType::EqualityDeletes)
    {
        return Ok(Some(
            "the checkpoint deletes its keys by equality (rows moved since its pre-commit)"
                .to_string(),
        ));
    }
    crate::rewrite_conflicts::added_since(base, read_at, inputs)
        .await
        .map_err(|e| {
            iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "cannot check the compaction against the delete files added since it read the table",
            )
            .with_source(e)
        })
}

/// Deletes the files an attempt of Ratchet's own commit wrote for a snapshot that will not be committed (merged
/// manifests, a row delta's delete manifest, rewritten lists); a file a later step already deleted, or one that
/// cannot be deleted now, stays an orphan nothing references.
async fn discard(base: &Table, written: &[String]) {
    for file in written {
        if let Err(e) = base.file_io().delete(file).await {
            tracing::debug!(file, error = %e, "cannot delete a file of an abandoned commit attempt");
        }
    }
}

/// `wait` scaled by a random factor in [0.5, 1.5): writers that lost the same swap do not retry in step.
fn jittered(wait: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    wait.mul_f64(0.5 + (random % 1000) as f64 / 1000.0)
}

/// The commit half of [`IcebergSink`](crate::IcebergSink).
#[derive(Debug, Clone)]
pub struct IcebergCommitter {
    pub(crate) target: TableTarget,
    pub(crate) key: SubtaskKey,
    pub(crate) epoch: Arc<AtomicU64>,
}

impl IcebergCommitter {
    pub(crate) fn epoch(&self, phase: Phase) -> Result<u64> {
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
    pub(crate) async fn commit_files(
        &self,
        committable: &IcebergCommittable,
    ) -> Result<CommitOutcome> {
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
    pub(crate) async fn commit_files_as(
        &self,
        key: &SubtaskKey,
        epoch: u64,
        committable: &IcebergCommittable,
    ) -> Result<CommitOutcome> {
        if committable.files.is_empty() {
            return Ok(CommitOutcome::AlreadyCommitted);
        }
        let table = self.target.recent(Phase::Commit).await?;
        // A file written on a schema newer than the last commit saw (another instance widened a column since)
        // decodes against the table as it is now.
        let (table, files) = match decode_files(&table, &committable.files) {
            Ok(files) => (table, files),
            Err(_) => {
                let table = self.target.load(Phase::Commit).await?;
                let files = decode_files(&table, &committable.files)?;
                (table, files)
            }
        };
        self.check_files_exist(&table, key, epoch, committable)
            .await?;
        let replacement = match &committable.compaction {
            Some(compaction) => self.replacement(&table, compaction).await?,
            None => None,
        };
        self.target
            .commit_checkpoint(
                key,
                epoch,
                committable.checkpoint,
                files,
                committable.deletes_based_on,
                replacement,
            )
            .await
    }

    /// Checks, before a checkpoint the ledger in `table` does not show yet is committed, that its files still exist.
    /// No snapshot references them until that commit, so a foreign orphan removal whose cut-off is shorter than the
    /// time between the pre-commit and the commit (a subtask down, a catalog that kept failing, a paused process:
    /// Spark's `remove_orphan_files`, a bucket lifecycle rule) may have deleted them, and committing would make
    /// every reader of the table fail on the missing file. A checkpoint the table already shows is not checked (its
    /// files may since have been compacted and removed legitimately), nor one of an instance that was fenced: a
    /// file found missing is checked against a fresh load first, since a newer instance's recovery deletes the
    /// files of an older one's uncommitted checkpoint (the commit then reports the fence, or that the checkpoint is
    /// in the table).
    ///
    /// # Errors
    /// [`Fatal`](ErrorKind::Fatal), naming the missing file, its checkpoint and the likely cause (nothing is
    /// committed: the table stays readable); [`Retryable`](ErrorKind::Retryable) when the storage or the catalog
    /// does not answer within `commit_timeout`.
    async fn check_files_exist(
        &self,
        table: &Table,
        key: &SubtaskKey,
        epoch: u64,
        committable: &IcebergCommittable,
    ) -> Result<()> {
        let uncommitted = |table: &Table| {
            let state = key.state(&table.metadata_ref());
            state.epoch == epoch
                && state
                    .checkpoint
                    .is_none_or(|last| last < committable.checkpoint)
        };
        if !uncommitted(table) {
            return Ok(());
        }
        let Some(missing) = self.first_missing(table, committable).await? else {
            return Ok(());
        };
        let fresh = self.target.load(Phase::Commit).await?;
        if !uncommitted(&fresh) {
            return Ok(());
        }
        Err(self.gone(committable, missing))
    }

    /// The first file of `committable` that does not exist, each asked within `commit_timeout`.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) when the storage does not answer in time; its own errors, classified.
    pub(crate) async fn first_missing<'c>(
        &self,
        table: &Table,
        committable: &'c IcebergCommittable,
    ) -> Result<Option<&'c str>> {
        for file in &committable.files {
            if !self.exists(table, &file.path).await? {
                return Ok(Some(&file.path));
            }
        }
        Ok(None)
    }

    /// The fatal error of a decided checkpoint whose file `missing` is gone before its commit.
    pub(crate) fn gone(&self, committable: &IcebergCommittable, missing: &str) -> Error {
        Error::new(
            ErrorKind::Fatal,
            Phase::Commit,
            format!(
                "file {missing} of checkpoint {} (subtask {}, decided, not yet in table {}) is gone: something \
                 deleted it while no snapshot referenced it, such as Spark's remove_orphan_files or a storage \
                 lifecycle rule with a cut-off shorter than the time between this checkpoint's pre-commit and its \
                 commit (a subtask down, a catalog that kept failing). Committing would make the table unreadable, \
                 so nothing was committed. Restore the file (from the storage's versioning or a backup) and start \
                 again; otherwise that checkpoint's records are missing from the table and must be replayed from \
                 the source. Keep foreign orphan removal's cut-off longer than any subtask may stay down \
                 (docs/worker.md)",
                committable.checkpoint.0, committable.subtask, self.target.table
            ),
        )
    }

    /// Whether `path` exists, asked within `commit_timeout`.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) when the storage does not answer in time; its own errors, classified.
    async fn exists(&self, table: &Table, path: &str) -> Result<bool> {
        let timed_out = || {
            format!(
                "checking that {path} exists got no answer within {:?}",
                self.target.commit_timeout
            )
        };
        connector_api::bounded(
            self.target.commit_timeout,
            (ErrorKind::Retryable, Phase::Commit),
            timed_out,
            async {
                table.file_io().exists(path).await.map_err(|e| {
                    iceberg_error(Phase::Commit, format!("cannot check that {path} exists"), e)
                })
            },
        )
        .await
    }

    /// The compaction a committable carries, to commit with it; `None` (logged) when one of its outputs is gone
    /// (a foreign orphan removal with a short cut-off deleted it while nothing referenced it): its inputs still
    /// hold the rows, so the checkpoint is committed without it. Each existence check is bounded by
    /// `commit_timeout`.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) when the storage does not answer in time; a committable whose outputs
    /// do not decode.
    async fn replacement(
        &self,
        table: &Table,
        compaction: &CompactedFiles,
    ) -> Result<Option<Replacement>> {
        for output in &compaction.outputs {
            if !self.exists(table, &output.path).await? {
                tracing::warn!(
                    table = %self.target.table,
                    file = %output.path,
                    "a compacted file is gone before its commit (a foreign orphan removal?): the checkpoint is \
                     committed without its compaction"
                );
                return Ok(None);
            }
        }
        Ok(Some(Replacement {
            inputs: compaction.inputs.clone(),
            outputs: decode_files(table, &compaction.outputs)?,
            manifests: compaction.manifests.clone(),
            read_at: compaction.read_at,
            deletes: compaction.deletes.clone(),
        }))
    }

    /// The ledger key of the subtask that wrote `committable`.
    pub(crate) fn key_of(&self, committable: &IcebergCommittable) -> SubtaskKey {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A deletion vector in the Puffin file `puffin` of data file `data`.
    fn vector(puffin: &str, data: &str) -> DataFile {
        iceberg::spec::DataFileBuilder::default()
            .content(DataContentType::PositionDeletes)
            .file_path(format!("file:///t/data/{puffin}"))
            .file_format(iceberg::spec::DataFileFormat::Puffin)
            .partition(iceberg::spec::Struct::empty())
            .record_count(1)
            .file_size_in_bytes(100)
            .referenced_data_file(Some(format!("file:///t/data/{data}")))
            .content_offset(Some(4))
            .content_size_in_bytes(Some(40))
            .build()
            .unwrap()
    }

    #[test]
    fn the_vectors_of_a_compactions_inputs_are_left_out_and_a_puffin_file_left_empty_goes() {
        let mut chosen = ChosenDeletes {
            commit: vec![
                vector("p.puffin", "a.parquet"),
                vector("p.puffin", "b.parquet"),
                vector("q.puffin", "c.parquet"),
            ],
            unused: vec!["file:///t/data/e.parquet".to_string()],
        };
        // An operator's doubled slash in the table's location spells the same path another way.
        chosen.leave_out_vectors_of(&[
            "file:///t//data/a.parquet".to_string(),
            "file:///t/data/c.parquet".to_string(),
        ]);
        let committed: Vec<_> = chosen
            .commit
            .iter()
            .map(|f| f.referenced_data_file().unwrap())
            .collect();
        assert_eq!(committed, ["file:///t/data/b.parquet"]);
        // p.puffin still holds b's vector; q.puffin holds nothing committed.
        assert_eq!(
            chosen.unused,
            ["file:///t/data/e.parquet", "file:///t/data/q.puffin"]
        );
    }
}
