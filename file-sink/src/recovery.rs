//! Recovery of the file sink as a plan ([`RecoveryPlan`]): the sink's epoch is raised first (fence before commit:
//! an older committer refuses to publish), the restored files not yet visible are published, and every other stage
//! of the subtask is removed.

use std::collections::BTreeSet;

use connector_api::{
    CheckpointId, Committer, Fence, FenceOrder, OpenTransaction, RecoveryPlan, Resolution, Result,
    TwoPhaseCommit,
};

use crate::FileName;
use crate::committable::FileCommittable;
use crate::sink::FileSink;

impl FileSink {
    /// Found: the subtask's hidden stages (local pending and in-progress files; S3 open multipart uploads, staged
    /// objects and spill files) with their age. Recovery publishes the restored files not yet visible and removes
    /// every other stage. Fence before commit: the sink's epoch is raised first, and a committer of an older
    /// epoch refuses to publish.
    pub(crate) async fn plan(
        &mut self,
        restored: Option<(CheckpointId, Vec<FileCommittable>)>,
    ) -> Result<RecoveryPlan<FileCommittable>> {
        let keep: BTreeSet<String> = restored
            .iter()
            .flat_map(|(_, committables)| committables)
            .flat_map(|c| &c.files)
            .map(|f| f.file_name())
            .collect();
        let fence = Fence {
            order: FenceOrder::BeforeCommit,
            how: "raise the sink's epoch (an older instance's committer refuses to publish)".into(),
        };
        let mut plan = RecoveryPlan::checking(&self.committer(), restored, fence).await?;
        let stages = self
            .backend
            .owned_stages()
            .await
            .map_err(|e| self.context(e))?;
        plan.found = stages
            .into_iter()
            .map(|stage| OpenTransaction {
                checkpoint: FileName::checkpoint_of(
                    &stage.file,
                    &self.config.scope,
                    self.config.subtask,
                ),
                resolution: Resolution::held_by_restored(keep.contains(&stage.file)),
                state: stage.kind.to_string(),
                name: stage.location,
                age: stage.age,
            })
            .collect();
        Ok(plan)
    }

    pub(crate) async fn execute_plan(&mut self, plan: RecoveryPlan<FileCommittable>) -> Result<()> {
        self.open.clear();
        self.sealed.clear();
        self.checkpoint = None;
        // Fence every older instance first: from here on their committers refuse to publish.
        connector_api::ensure_claim_held("raising the file sink's epoch").await?;
        self.epoch = self
            .backend
            .bump_epoch()
            .await
            .map_err(|e| self.context(e))?;
        self.committer().commit(plan.commit).await?;
        // The restored files are visible now, so every stage this instance still owns belongs to a checkpoint that
        // never became durable: presumed abort.
        connector_api::ensure_claim_held("removing uncommitted staged files").await?;
        for removed in self
            .backend
            .remove_owned_stages()
            .await
            .map_err(|e| self.context(e))?
        {
            tracing::info!(sink = %self.config.sink, %removed, "recover: removed uncommitted file");
        }
        Ok(())
    }
}
