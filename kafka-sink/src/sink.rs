//! The exactly-once Kafka sink: one Kafka transaction per checkpoint, on a bounded pool of transactional ids.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::{
    CheckpointId, Error, ErrorKind, Phase, RecoveryPlan, Result, RetryPolicy, SinkId, SubtaskId,
    TwoPhaseCommit,
};
use kafka_connection::KafkaConnection;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;

use crate::commit::KafkaCommitter;
use crate::committable::KafkaCommittable;
use crate::coordinator::CoordinatorClient;
use crate::delivery::{DeliveryTracker, Producers, SinkProducer};
use crate::error::kafka_error;
use crate::producer::TXN_TIMEOUT;
use crate::sender::RecordSender;
use crate::{
    KafkaSinkConfig, TransactionState, TransactionalId, TransactionalIdPool, classify,
    open_transactional_producer,
};

/// Exactly-once Kafka sink. See the crate docs for the protocol and the failure table.
pub struct KafkaSink {
    pub(crate) config: KafkaSinkConfig,
    pub(crate) sink: SinkId,
    pub(crate) subtask: SubtaskId,
    /// How every client of this sink reaches the cluster.
    pub(crate) kafka: KafkaConnection,
    /// The protocol-level client, its coordinator connections kept between checkpoints.
    pub(crate) coordinator: CoordinatorClient,
    pub(crate) pool: TransactionalIdPool,
    pub(crate) producers: Producers,
    pub(crate) current: Option<(CheckpointId, TransactionalId)>,
    pub(crate) sender: RecordSender,
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
            sender: RecordSender::new(&config).map_err(|e| e.with_sink(&sink))?,
            config,
            sink,
            subtask,
            pool,
            producers: Arc::new(Mutex::new(HashMap::new())),
            current: None,
        })
    }

    /// The same sink, told the batches' `schema` and whether it takes new columns (`evolution`); without this it
    /// refuses a schema change.
    pub fn with_evolution(
        mut self,
        schema: arrow_schema::SchemaRef,
        evolution: connector_api::Evolution,
    ) -> Self {
        self.sender.follow(schema, evolution);
        self
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
    pub(crate) async fn open(&self, id: &TransactionalId) -> Result<SinkProducer> {
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

    /// New columns appear in the next records when `evolution = "add-columns"` (JSON of whatever columns a batch
    /// has; Avro values: the new schema registered first).
    async fn evolve(&mut self, schema: arrow_schema::SchemaRef) -> Result<()> {
        self.sender
            .evolve(&self.sink, schema)
            .await
            .map_err(|e| e.with_sink(&self.sink))
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
            let outcome = connector_api::blocking(Phase::Abort, "abort_transaction", move || {
                // Flush first: librdkafka drops unsent records instead of aborting them otherwise.
                let _ = producer.flush(TXN_TIMEOUT);
                producer.abort_transaction(TXN_TIMEOUT)
            })
            .await?;
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

    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<KafkaCommittable>)>,
    ) -> Result<RecoveryPlan<KafkaCommittable>> {
        self.plan(restored).await
    }

    async fn execute_recovery(&mut self, plan: RecoveryPlan<KafkaCommittable>) -> Result<()> {
        self.execute_plan(plan).await
    }
}
