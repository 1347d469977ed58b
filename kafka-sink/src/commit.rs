//! The commit half of the Kafka sink: through this process's producer while it still holds the transaction,
//! otherwise at the protocol level (EndTxn with the recorded producer id and epoch), idempotently; a transaction the
//! broker aborted is a loud error, and one whose outcome neither the coordinator nor the log can tell is in doubt.

use async_trait::async_trait;
use connector_api::{Committer, Error, ErrorKind, Phase, Result, SinkId};
use kafka_connection::KafkaConnection;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;

use crate::TransactionDescription;
use crate::committable::KafkaCommittable;
use crate::coordinator::CoordinatorClient;
use crate::delivery::Producers;
use crate::error::kafka_error;
use crate::outcome::{CommitStep, commit_step};
use crate::probe::{InLog, Removed, judge_in_log};
use crate::producer::TXN_TIMEOUT;

/// Commits a [`KafkaSink`](crate::KafkaSink)'s transactions: through this process's producer when it still holds
/// the transaction, otherwise at the protocol level (EndTxn with the recorded producer id and epoch).
#[derive(Clone)]
pub struct KafkaCommitter {
    /// How the log probe reaches the cluster.
    pub(crate) kafka: KafkaConnection,
    /// The protocol-level client (shared with the sink).
    pub(crate) coordinator: CoordinatorClient,
    pub(crate) sink: SinkId,
    pub(crate) producers: Producers,
}

#[async_trait]
impl Committer for KafkaCommitter {
    type Committable = KafkaCommittable;

    async fn commit(&self, committables: Vec<KafkaCommittable>) -> Result<()> {
        for c in committables {
            let context = |e: Error| {
                e.or_sink(&self.sink)
                    .or_checkpoint(c.checkpoint)
                    .or_txn(c.transactional_id.clone())
            };
            let local = self
                .producers
                .lock()
                .expect("producers")
                .get(&c.transactional_id)
                .cloned();
            if let Some(producer) = local {
                // This process began the transaction: finish it through librdkafka's own state machine.
                let outcome =
                    connector_api::blocking(Phase::Commit, "commit_transaction", move || {
                        producer.commit_transaction(TXN_TIMEOUT)
                    })
                    .await?;
                match outcome {
                    Ok(()) => continue,
                    // The producer is not in a transaction (committed before, e.g. by a retried commit): fall
                    // through to the coordinator, which knows.
                    Err(KafkaError::Transaction(e)) if e.code() == RDKafkaErrorCode::State => {}
                    Err(e) => {
                        return Err(context(kafka_error(
                            Phase::Commit,
                            "commit_transaction failed",
                            e,
                        )));
                    }
                }
            }
            if c.ranges.is_empty() {
                continue; // an empty transaction has nothing on the broker to commit
            }
            commit_remote(&self.coordinator, &self.kafka, &c)
                .await
                .map_err(context)?;
        }
        Ok(())
    }

    async fn is_committed(&self, c: &KafkaCommittable) -> Result<bool> {
        if c.ranges.is_empty() {
            return Ok(true);
        }
        let now = self
            .coordinator
            .find_transaction(&c.transactional_id)
            .await?;
        match commit_step(now.as_ref(), c) {
            CommitStep::AlreadyCommitted => Ok(true),
            CommitStep::EndTxn | CommitStep::Lost => Ok(false),
            CommitStep::AskTheLog => {
                match judge_in_log(&self.kafka.client_config(), &c.ranges).await? {
                    InLog::Committed => Ok(true),
                    InLog::Aborted => Ok(false),
                    InLog::Gone(removed) => {
                        Err(removed_from_log(now.as_ref(), c, &removed).with_sink(&self.sink))
                    }
                }
            }
        }
    }
}

/// Commits `c` at the protocol level, idempotently; a transaction the broker aborted is a loud, fatal error, and one
/// whose outcome neither the coordinator nor the log can tell any more is in doubt.
pub(crate) async fn commit_remote(
    coordinator: &CoordinatorClient,
    kafka: &KafkaConnection,
    c: &KafkaCommittable,
) -> Result<()> {
    let now = coordinator.find_transaction(&c.transactional_id).await?;
    match commit_step(now.as_ref(), c) {
        CommitStep::AlreadyCommitted => return Ok(()),
        CommitStep::EndTxn => {
            return coordinator
                .end_transaction(&c.transactional_id, c.producer_id, c.producer_epoch, true)
                .await;
        }
        CommitStep::AskTheLog => {
            // The id has moved on (re-initialised, or expired): the log itself says whether our records committed.
            match judge_in_log(&kafka.client_config(), &c.ranges).await? {
                InLog::Committed => return Ok(()),
                InLog::Aborted => {}
                InLog::Gone(removed) => return Err(removed_from_log(now.as_ref(), c, &removed)),
            }
        }
        CommitStep::Lost => {}
    }
    let lost: Vec<String> = c
        .ranges
        .iter()
        .map(|r| {
            format!(
                "{}/{} offsets {}..={}",
                r.topic, r.partition, r.first_offset, r.last_offset
            )
        })
        .collect();
    Err(Error::new(
        ErrorKind::Fatal,
        Phase::Commit,
        format!(
            "the transaction of this durable checkpoint is no longer committable ({}; expected producer \
             {} epoch {}) and its records are not in the log: the broker aborted it, most likely because \
             transaction.timeout.ms expired before recovery. Its records are LOST: {}. Replay them from the source \
             positions of the previous checkpoint, and raise transaction_timeout or shorten restarts",
            coordinator_view(now.as_ref()),
            c.producer_id,
            c.producer_epoch,
            lost.join(", ")
        ),
    ))
}

/// What the coordinator shows for a transactional id (`None`: it does not know the id), for messages.
fn coordinator_view(now: Option<&TransactionDescription>) -> String {
    match now {
        Some(now) => format!(
            "coordinator: state {}, producer {} epoch {}",
            now.state, now.producer_id, now.producer_epoch
        ),
        None => "the coordinator no longer knows the transactional id: it expired after \
                 transactional.id.expiration.ms"
            .to_string(),
    }
}

/// The in-doubt error for `c` when the coordinator no longer tracks its transaction and the log no longer holds the
/// records that would tell how it ended: what happened, what was not done, how to decide and what to do then.
fn removed_from_log(
    now: Option<&TransactionDescription>,
    c: &KafkaCommittable,
    removed: &[Removed],
) -> Error {
    let ranges: Vec<String> = removed
        .iter()
        .map(|r| {
            let log_start = match r.log_start {
                Some(offset) => format!("log start now {offset}"),
                None => "log start unknown".to_string(),
            };
            format!(
                "{}/{} offsets {}..={} ({log_start})",
                r.range.topic, r.range.partition, r.range.first_offset, r.range.last_offset
            )
        })
        .collect();
    let checkpoint = c.checkpoint;
    Error::new(
        ErrorKind::InDoubt,
        Phase::Commit,
        format!(
            "cannot tell whether the transaction of this durable checkpoint committed: the coordinator no longer \
             tracks it ({}; expected producer {} epoch {}), and the records that would tell were removed from the \
             log by DeleteRecords, retention or compaction: {}. Nothing was committed, aborted or reported lost. \
             To decide, check whether read_committed readers of the topic received these records, or, while the \
             log segment holding the transaction's end marker (after the last offset of a range) remains, run \
             `kafka-dump-log.sh --print-data-log --files <segment>.log` on it: the marker of producer id {} reads \
             COMMIT or ABORT. If it committed: note checkpoint {checkpoint} as committed in the checkpoint store \
             (local store: write {checkpoint} to the subtask's committed-through file; PostgreSQL store: set \
             committed_through to {checkpoint} in the subtask's ratchet_checkpoint_owners row) and restart. If it \
             aborted: its records are lost; replay them from the source positions of the previous checkpoint. \
             Keep the topic's retention longer than a job can stay down",
            coordinator_view(now),
            c.producer_id,
            c.producer_epoch,
            ranges.join(", "),
            c.producer_id,
        ),
    )
    .with_checkpoint(checkpoint)
    .with_txn(c.transactional_id.clone())
}
