//! Recovery of the Iceberg sink as a plan ([`RecoveryPlan`]): the subtask's owner epoch is raised with a snapshot of
//! its own (fence before commit), the restored files the table does not show yet are committed under the ledger key
//! of the subtask that wrote them (another subtask's are taken over: its epoch is raised too), and data files no
//! snapshot references are deleted.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use connector_api::{
    CheckpointId, Error, Fence, FenceOrder, OpenTransaction, Phase, RecoveryPlan, Resolution,
    Result,
};

use crate::cleanup::{delete_unreferenced_files, unreferenced_files};
use crate::committable::IcebergCommittable;
use crate::key_index::KeyIndex;
use crate::key_scan;
use crate::ledger::SubtaskKey;
use crate::location::canonical;
use crate::sink::IcebergSink;

/// How many `commit_timeout`s the orphan sweep may take (it lists two directories and reads every retained
/// manifest).
const SWEEP_TIMEOUTS: u32 = 10;

impl IcebergSink {
    /// Found: the subtask's data files that no snapshot references, and those of every other subtask whose
    /// committables `restored` holds (a takeover). Recovery commits the restored files the table does not show
    /// yet and deletes the rest. Fence before commit: the subtask's owner epoch is raised with a snapshot of its
    /// own (so is a taken-over subtask's), and a commit planned under an older epoch is refused. Notes: what the
    /// ledger shows for the subtask.
    pub(crate) async fn plan(
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
            .flat_map(|c| {
                c.files
                    .iter()
                    .chain(c.compaction.iter().flat_map(|x| &x.outputs))
            })
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
    pub(crate) async fn execute_plan(
        &mut self,
        plan: RecoveryPlan<IcebergCommittable>,
    ) -> Result<()> {
        let context = |e: Error| e.or_sink(&self.config.sink).at_phase(Phase::Recover);
        self.writer = None;
        self.carried.clear();
        self.carried_checkpoints = 0;
        self.pre_committed = None;
        if !plan.commit.is_empty() {
            // Before the epoch is raised: a restored checkpoint with a file gone leaves the table as it was. Each
            // commit checks its files again (a deleter may still be at work).
            let table = self.committer.target.load(Phase::Recover).await?;
            for committable in &plan.commit {
                if let Some(missing) = self.committer.first_missing(&table, committable).await? {
                    return Err(context(self.committer.gone(committable, missing)));
                }
            }
        }
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
        if let (Some(after), 0) = (self.config.sweep_orphans_after, self.key.subtask.0) {
            connector_api::ensure_claim_held("sweeping orphan files").await?;
            crate::orphan_sweep::sweep_within(
                self.config.commit_timeout * SWEEP_TIMEOUTS,
                &self.committer.target,
                &self.key,
                after,
                &self.config.s3,
            )
            .await
            .map_err(context)?;
        }
        let table = self.committer.target.load(Phase::Recover).await?;
        if self.compact.is_some() {
            let found = crate::replace::retained_replacements(&table, &self.key)
                .await
                .map_err(|e| {
                    crate::error::iceberg_error(
                        Phase::Recover,
                        "cannot read the table's compacting snapshots",
                        e,
                    )
                })
                .map_err(context)?;
            self.committer.target.resume_replaced(&table, found).await;
        }
        if let Some(keyed) = &self.keyed
            && self.index.is_some()
        {
            // Built afresh on the table as recovered: no change of an undecided checkpoint survives.
            let index = self
                .index
                .insert(KeyIndex::new(&table, keyed.key()).map_err(context)?);
            key_scan::within(
                (self.config.commit_timeout, Phase::Recover),
                &table,
                key_scan::rebuild(index, &table, &self.key, Phase::Recover),
            )
            .await
            .map_err(context)?;
        }
        self.table = Some(table);
        Ok(())
    }

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
