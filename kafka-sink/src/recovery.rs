//! Recovery of the Kafka sink as a plan ([`RecoveryPlan`]): the restored transactions not yet committed are
//! committed at the protocol level (EndTxn with the recorded producer id and epoch), then every transactional id
//! of the subtask is fenced with `init_transactions`, which aborts whatever a crashed attempt or a zombie left
//! open. Fence after commit: the fence would abort the restored transactions.

use std::time::Duration;

use connector_api::{
    CheckpointId, Fence, FenceOrder, OpenTransaction, Phase, RecoveryPlan, Resolution, Result,
    TwoPhaseCommit,
};

use crate::TransactionState;
use crate::broker::{broker_max_transaction_timeout, check_transaction_timeout};
use crate::commit::commit_remote;
use crate::committable::KafkaCommittable;
use crate::registry::claim_prefix;
use crate::sink::KafkaSink;

impl KafkaSink {
    /// Commits the restored transactions that are not committed yet (same producer id and epoch, at the protocol
    /// level), then fences: `init_transactions` on every transactional id of the subtask aborts whatever a crashed
    /// attempt or a zombie left open and bumps the epoch (fence after commit: the fence would abort the restored
    /// transactions). Found: the open transactions of the subtask's ids (DescribeTransactions).
    pub(crate) async fn plan(
        &mut self,
        restored: Option<(CheckpointId, Vec<KafkaCommittable>)>,
    ) -> Result<RecoveryPlan<KafkaCommittable>> {
        let held_by_restored: Vec<KafkaCommittable> = restored
            .iter()
            .flat_map(|(_, c)| c.iter().cloned())
            .collect();
        let ids = self.pool.all(self.subtask);
        let fence = Fence {
            order: FenceOrder::AfterCommit,
            how: format!(
                "init_transactions on each of the subtask's {} transactional id(s) (aborts what is open, bumps \
                 the producer epoch)",
                ids.len()
            ),
        };
        let mut plan = RecoveryPlan::checking(&self.committer(), restored, fence)
            .await
            .map_err(|e| e.or_sink(&self.sink))?;
        for id in ids {
            let Some(described) = self
                .coordinator
                .find_transaction(id.as_str())
                .await
                .map_err(|e| e.or_sink(&self.sink))?
            else {
                continue;
            };
            let open = matches!(
                described.state,
                TransactionState::Ongoing
                    | TransactionState::PrepareCommit
                    | TransactionState::PrepareAbort
                    | TransactionState::PrepareEpochFence
            );
            if !open {
                continue;
            }
            let held = held_by_restored.iter().find(|c| {
                c.transactional_id == id.as_str()
                    && c.producer_id == described.producer_id
                    && c.producer_epoch == described.producer_epoch
            });
            let started = u64::try_from(described.start_time_ms).ok();
            let age = started.and_then(|ms| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH + Duration::from_millis(ms))
                    .ok()
            });
            plan.found.push(OpenTransaction {
                name: id.as_str().to_string(),
                checkpoint: held.map(|c| c.checkpoint),
                state: format!(
                    "{:?} (producer id {} epoch {}, {} partition(s), timeout {} ms)",
                    described.state,
                    described.producer_id,
                    described.producer_epoch,
                    described.partitions.len(),
                    described.timeout_ms
                ),
                age,
                resolution: Resolution::held_by_restored(held.is_some()),
            });
        }
        Ok(plan)
    }

    pub(crate) async fn execute_plan(
        &mut self,
        plan: RecoveryPlan<KafkaCommittable>,
    ) -> Result<()> {
        self.current = None;
        self.producers.lock().expect("producers").clear();
        let connection = self.kafka.client_config();
        let broker_max = broker_max_transaction_timeout(&connection)
            .await
            .map_err(|e| e.or_sink(&self.sink))?;
        check_transaction_timeout(self.config.transaction_timeout, broker_max)
            .map_err(|e| e.or_sink(&self.sink))?;
        let owner = match &self.config.job {
            Some(job) => format!("{job}/{}", self.sink),
            None => self.sink.to_string(),
        };
        claim_prefix(&connection, &self.config.transactional_id_prefix, &owner)
            .await
            .map_err(|e| e.or_sink(&self.sink))?;
        // First finish the restored transactions (they must not be aborted by the fencing below)...
        for c in plan.commit.iter().filter(|c| !c.ranges.is_empty()) {
            commit_remote(&self.coordinator, &self.kafka, c)
                .await
                .map_err(|e| {
                    e.at_phase(Phase::Recover)
                        .or_sink(&self.sink)
                        .or_checkpoint(c.checkpoint)
                        .or_txn(c.transactional_id.clone())
                })?;
        }
        // ...then fence every id of the pool: init_transactions aborts whatever a crashed attempt or a zombie left
        // open, so read_committed consumers are never stuck behind the last stable offset.
        for id in self.pool.all(self.subtask) {
            connector_api::ensure_claim_held(&format!("init_transactions of {id}")).await?;
            let _fenced_and_ready = self.open(&id).await?;
        }
        Ok(())
    }
}
