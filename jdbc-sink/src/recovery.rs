//! Recovery of the JDBC sink as a plan ([`RecoveryPlan`]): the restored prepared transactions are committed (of any
//! subtask), every other prepared transaction of the subtask is rolled back, then the owner row is raised (fence
//! after commit), which fences every older instance.

use std::collections::BTreeSet;

use connector_api::{
    CheckpointId, Committer, Error, ErrorKind, Fence, FenceOrder, OpenTransaction, Phase,
    RecoveryPlan, Resolution, Result, TwoPhaseCommit,
};

use crate::committable::JdbcCommittable;
use crate::database::{OWNERS_TABLE, Prepared};
use crate::sink::JdbcSink;

/// How often recovery lists and resolves prepared transactions again when the owner row stays locked.
const CLAIM_ATTEMPTS: u32 = 15;

impl JdbcSink {
    /// Found: the subtask's prepared transactions (`pg_prepared_xacts` with their age, or MariaDB's `XA
    /// RECOVER`); recovery commits those the restored checkpoint holds (of any subtask: a recovery that took over
    /// a vanished subtask passes its committables) and rolls back the rest. Fence after commit: the owner epoch
    /// is raised once the prepared transactions are resolved.
    pub(crate) async fn plan(
        &mut self,
        restored: Option<(CheckpointId, Vec<JdbcCommittable>)>,
    ) -> Result<RecoveryPlan<JdbcCommittable>> {
        let keep = held_xids(restored.iter().flat_map(|(_, c)| c));
        let fence = Fence {
            order: FenceOrder::AfterCommit,
            how: format!(
                "raise the owner epoch of subtask {} in {OWNERS_TABLE} (an older instance's next statement \
                 fails its owner check)",
                self.subtask
            ),
        };
        let mut plan = RecoveryPlan::checking(&self.committer(), restored, fence).await?;
        plan.found = self
            .coordinator
            .list_prepared(&self.scope)
            .await?
            .into_iter()
            .filter(|p| p.xid.subtask == self.subtask)
            .map(|Prepared { xid, age }| {
                let name = xid.to_string();
                OpenTransaction {
                    resolution: Resolution::held_by_restored(keep.contains(&name)),
                    name,
                    checkpoint: Some(xid.checkpoint),
                    state: "prepared".into(),
                    age,
                }
            })
            .collect();
        Ok(plan)
    }

    /// Commits the plan's prepared transactions, rolls back every other prepared transaction of this subtask,
    /// then raises the owner epoch, which fences every older instance, and deletes the markers of checkpoints
    /// after the restored one ([`Self::markers_kept_through`]; a reset checkpoint store starts its ids again).
    /// A transaction that passed its owner check just before holds the owner row; the raise waits
    /// `lock_timeout` for it, then lists and resolves again.
    pub(crate) async fn execute_plan(&mut self, plan: RecoveryPlan<JdbcCommittable>) -> Result<()> {
        self.session.rollback().await?;
        let kept_through = self.markers_kept_through(plan.checkpoint).await?;
        let keep = held_xids(&plan.commit);
        let committer = self.committer();
        for attempt in 1..=CLAIM_ATTEMPTS {
            committer
                .commit(plan.commit.clone())
                .await
                .map_err(|e| e.at_phase(Phase::Recover))?;
            for Prepared { xid, .. } in self.coordinator.list_prepared(&self.scope).await? {
                if xid.subtask == self.subtask && !keep.contains(&xid.to_string()) {
                    connector_api::ensure_claim_held(&format!(
                        "rolling back prepared transaction {xid}"
                    ))
                    .await?;
                    tracing::info!(%xid, "rolling back a prepared transaction no durable checkpoint holds");
                    self.coordinator.rollback_prepared(&xid).await?;
                }
            }
            connector_api::ensure_claim_held("claiming the sink's owner row").await?;
            if let Some(epoch) = self
                .coordinator
                .claim_owner(&self.scope, self.subtask, kept_through)
                .await?
            {
                tracing::info!(sink = %self.sink, subtask = %self.subtask, epoch, "claimed the owner row");
                self.epoch = Some(epoch);
                return Ok(());
            }
            tracing::warn!(
                sink = %self.sink, subtask = %self.subtask, attempt,
                "the owner row is locked by an open transaction of an older instance; resolving again"
            );
        }
        Err(Error::new(
            ErrorKind::Retryable,
            Phase::Recover,
            "the owner row stays locked by an open (not prepared) transaction of an older instance of this \
             subtask: that process is alive (paused?); stop it, or find it with pg_locks / \
             information_schema.innodb_trx",
        )
        .with_sink(&self.sink))
    }

    /// The checkpoint whose commit markers (and every older one's) recovery keeps: the restored checkpoint; with
    /// none restored, in xa mode, the last checkpoint the subtask committed. The driver restores nothing of a
    /// checkpoint its store notes committed, yet that checkpoint's marker must stay: it is how a zombie's commit
    /// retry, a takeover or `inspect` tells a committed transaction from a lost one. A fresh store over an xa
    /// sink that shows a committed checkpoint is refused before recovery (`recorded_checkpoint`), so in xa mode
    /// no marker after the last committed checkpoint can belong to an earlier store. The other modes delete every
    /// marker on a fresh start: their commit check reads the owner row, and a reset store starts its ids again.
    async fn markers_kept_through(
        &mut self,
        restored: Option<CheckpointId>,
    ) -> Result<Option<CheckpointId>> {
        match restored {
            None if self.xa => {
                self.coordinator
                    .applied_through(&self.scope, self.subtask)
                    .await
            }
            restored => Ok(restored),
        }
    }
}

/// The prepared transactions `committables` hold, by name.
pub(crate) fn held_xids<'a>(
    committables: impl IntoIterator<Item = &'a JdbcCommittable>,
) -> BTreeSet<String> {
    committables
        .into_iter()
        .filter(|c| c.prepared)
        .map(|c| c.xid.clone())
        .collect()
}
