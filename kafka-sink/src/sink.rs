//! The exactly-once Kafka sink: one Kafka transaction per checkpoint, on a bounded pool of transactional ids.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::committable::KafkaCommittable;
use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::{
    CheckpointId, Committer, Error, ErrorKind, Fence, FenceOrder, OpenTransaction, Phase,
    RecoveryPlan, Resolution, Result, RetryPolicy, SinkId, SubtaskId, TwoPhaseCommit,
};
use kafka_connection::KafkaConnection;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;

use crate::broker::{broker_max_transaction_timeout, check_transaction_timeout};
use crate::coordinator::CoordinatorClient;
use crate::delivery::{DeliveryTracker, SinkProducer};
use crate::outcome::{CommitStep, commit_step};
use crate::probe::{InLog, Removed, judge_in_log};
use crate::registry::claim_prefix;
use crate::sender::RecordSender;
use crate::{
    KafkaSinkConfig, TransactionDescription, TransactionState, TransactionalId,
    TransactionalIdPool, classify, open_transactional_producer,
};

/// How long librdkafka's transactional calls (commit, abort) may block.
const TXN_TIMEOUT: Duration = Duration::from_secs(60);

/// Producers of this instance by transactional id, shared with its committer.
type Producers = Arc<Mutex<HashMap<String, SinkProducer>>>;

/// Exactly-once Kafka sink. See the crate docs for the protocol and the failure table.
pub struct KafkaSink {
    config: KafkaSinkConfig,
    sink: SinkId,
    subtask: SubtaskId,
    /// How every client of this sink reaches the cluster.
    kafka: KafkaConnection,
    /// The protocol-level client, its coordinator connections kept between checkpoints.
    coordinator: CoordinatorClient,
    pool: TransactionalIdPool,
    producers: Producers,
    current: Option<(CheckpointId, TransactionalId)>,
    sender: RecordSender,
}

/// Commits a [`KafkaSink`]'s transactions: through this process's producer when it still holds the transaction,
/// otherwise at the protocol level (EndTxn with the recorded producer id and epoch).
#[derive(Clone)]
pub struct KafkaCommitter {
    /// How the log probe reaches the cluster.
    kafka: KafkaConnection,
    /// The protocol-level client (shared with the sink).
    coordinator: CoordinatorClient,
    sink: SinkId,
    producers: Producers,
}

fn kafka_error(phase: Phase, message: &str, e: KafkaError) -> Error {
    Error::new(classify(&e), phase, message).with_source(e)
}

impl KafkaSink {
    /// A sink for `config`, as subtask `subtask` of sink `sink`; producers connect on first use.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for an invalid transactional-id prefix or pool size.
    pub fn new(config: KafkaSinkConfig, sink: SinkId, subtask: SubtaskId) -> Result<Self> {
        let config = config.resolve_env().map_err(|e| e.with_sink(&sink))?;
        let kafka = config.kafka_connection().map_err(|e| e.with_sink(&sink))?;
        let pool = config.id_pool().map_err(|e| e.with_sink(&sink))?;
        tracing::info!(%sink, %subtask, topic = %config.topic, connection = ?kafka, "Kafka sink configured");
        Ok(Self {
            coordinator: CoordinatorClient::new(kafka.clone()),
            kafka,
            sender: RecordSender::new(
                config.records.clone(),
                &config.topic,
                config.max_message_bytes(),
            ),
            config,
            sink,
            subtask,
            pool,
            producers: Arc::new(Mutex::new(HashMap::new())),
            current: None,
        })
    }

    /// The producer of the open transaction.
    fn open_producer(&self) -> Result<SinkProducer> {
        let (_, id) = self
            .current
            .clone()
            .ok_or_else(|| self.err(ErrorKind::Bug, Phase::Write, "write before begin"))?;
        self.producer(&id)
            .ok_or_else(|| self.err(ErrorKind::Bug, Phase::Write, "no producer"))
    }

    fn err(&self, kind: ErrorKind, phase: Phase, message: impl Into<String>) -> Error {
        let e = Error::new(kind, phase, message).with_sink(&self.sink);
        match &self.current {
            Some((checkpoint, id)) => e.with_checkpoint(*checkpoint).with_txn(id.to_string()),
            None => e,
        }
    }

    /// Adds this sink, the open checkpoint and its transactional id to an error that lacks them.
    fn context(&self, e: Error) -> Error {
        let e = e.or_sink(&self.sink);
        match &self.current {
            Some((checkpoint, id)) => e.or_checkpoint(*checkpoint).or_txn(id.to_string()),
            None => e,
        }
    }

    fn producer(&self, id: &TransactionalId) -> Option<SinkProducer> {
        self.producers
            .lock()
            .expect("producers")
            .get(id.as_str())
            .cloned()
    }

    /// Opens (init_transactions: fencing older holders of the id) the producer for `id`.
    async fn open(&self, id: &TransactionalId) -> Result<SinkProducer> {
        let producer = open_transactional_producer(&self.config, id, DeliveryTracker::default())
            .await
            .map_err(|e| e.or_sink(&self.sink))?;
        self.producers
            .lock()
            .expect("producers")
            .insert(id.to_string(), producer.clone());
        Ok(producer)
    }
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
                    tokio::task::spawn_blocking(move || producer.commit_transaction(TXN_TIMEOUT))
                        .await
                        .expect("commit task panicked");
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
async fn commit_remote(
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

#[async_trait]
impl TwoPhaseCommit for KafkaSink {
    type Committable = KafkaCommittable;
    type Committer = KafkaCommitter;

    fn sink_id(&self) -> &SinkId {
        &self.sink
    }

    fn committer(&self) -> KafkaCommitter {
        KafkaCommitter {
            kafka: self.kafka.clone(),
            coordinator: self.coordinator.clone(),
            sink: self.sink.clone(),
            producers: self.producers.clone(),
        }
    }

    fn transaction_timeout(&self) -> Option<Duration> {
        Some(self.config.transaction_timeout)
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let id = self.pool.for_checkpoint(self.subtask, checkpoint);
        let producer = match self.producer(&id) {
            Some(p) => p,
            None => self.open(&id).await?,
        };
        self.current = Some((checkpoint, id));
        self.sender.start(&producer);
        producer.begin_transaction().map_err(|e| {
            self.err(classify(&e), Phase::Begin, "begin_transaction failed")
                .with_source(e)
        })
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let producer = self.open_producer()?;
        let sent = self.sender.send(&producer, batch).await;
        sent.map_err(|e| self.context(e))
    }

    /// Tombstones (the key, a null value) into the open transaction.
    async fn write_tombstones(&mut self, keys: &[Option<Vec<u8>>]) -> Result<bool> {
        let producer = self.open_producer()?;
        let sent = self.sender.send_tombstones(&producer, keys).await;
        sent.map(|()| true).map_err(|e| self.context(e))
    }

    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<KafkaCommittable> {
        let (current, id) = self
            .current
            .clone()
            .ok_or_else(|| self.err(ErrorKind::Bug, Phase::PreCommit, "no transaction"))?;
        if current != checkpoint {
            return Err(self.err(
                ErrorKind::Bug,
                Phase::PreCommit,
                format!("pre_commit of {checkpoint} but {current} is open"),
            ));
        }
        let producer = self
            .producer(&id)
            .ok_or_else(|| self.err(ErrorKind::Bug, Phase::PreCommit, "no producer"))?;
        let flushed = self.sender.flush(&producer).await;
        let ranges = flushed.map_err(|e| self.context(e.at_phase(Phase::PreCommit)))?;
        let (producer_id, producer_epoch) = if ranges.is_empty() {
            (-1, -1)
        } else {
            // The driver does not retry a pre-commit (it aborts and replays): retry the one idempotent read here,
            // while the coordinator loads or moves.
            let coordinator = &self.coordinator;
            let described = RetryPolicy::default()
                .run_idempotent("DescribeTransactions", || {
                    coordinator.describe_transaction(id.as_str())
                })
                .await
                .map_err(|e| {
                    e.at_phase(Phase::PreCommit)
                        .or_sink(&self.sink)
                        .or_checkpoint(checkpoint)
                })?;
            if described.state != TransactionState::Ongoing {
                return Err(self.err(
                    ErrorKind::MustAbort,
                    Phase::PreCommit,
                    format!(
                        "the coordinator reports the transaction as {}, not Ongoing",
                        described.state
                    ),
                ));
            }
            (described.producer_id, described.producer_epoch)
        };
        Ok(KafkaCommittable {
            checkpoint,
            transactional_id: id.to_string(),
            producer_id,
            producer_epoch,
            ranges,
        })
    }

    async fn abort(&mut self) -> Result<()> {
        let Some((_, id)) = self.current.take() else {
            return Ok(());
        };
        if let Some(producer) = self.producer(&id) {
            let outcome = tokio::task::spawn_blocking(move || {
                // Flush first: librdkafka drops unsent records instead of aborting them otherwise.
                let _ = producer.flush(TXN_TIMEOUT);
                producer.abort_transaction(TXN_TIMEOUT)
            })
            .await
            .expect("abort task panicked");
            match outcome {
                Ok(()) => {}
                Err(KafkaError::Transaction(e)) if e.code() == RDKafkaErrorCode::State => {}
                Err(e) => {
                    return Err(kafka_error(Phase::Abort, "abort_transaction failed", e)
                        .or_sink(&self.sink));
                }
            }
        }
        Ok(())
    }

    /// Commits the restored transactions that are not committed yet (same producer id and epoch, at the protocol
    /// level), then fences: `init_transactions` on every transactional id of the subtask aborts whatever a crashed
    /// attempt or a zombie left open and bumps the epoch (fence after commit: the fence would abort the restored
    /// transactions). Found: the open transactions of the subtask's ids (DescribeTransactions).
    async fn plan_recovery(
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

    async fn execute_recovery(&mut self, plan: RecoveryPlan<KafkaCommittable>) -> Result<()> {
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
