//! The Kafka sink at-least-once, without transactions: cheaper than running the transactional sink with the weaker
//! guarantee. Records go out through an idempotent producer as they are written (visible at once to every reader);
//! `pre_commit` waits until every one is acknowledged (`acks=all`), so once the checkpoint record is durable,
//! nothing before its positions can be lost. A crash between a write and the next durable record replays those
//! records: duplicates, never loss. No transactional id, no AddPartitionsToTxn, no EndTxn, no transaction markers,
//! and nothing for recovery to do.

use std::time::Duration;

use crate::committable::FlushedRecords;
use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::{
    CheckpointId, Committer, Error, ErrorKind, Fence, Phase, RecoveryPlan, Result, SinkId,
    TwoPhaseCommit,
};

use crate::delivery::{DeliveryTracker, SinkProducer};
use crate::sender::RecordSender;
use crate::{KafkaSinkConfig, classify};

/// The commit half of [`KafkaAtLeastOnceSink`]: there is nothing to commit.
#[derive(Debug, Clone, Copy, Default)]
pub struct NothingToCommit;

#[async_trait]
impl Committer for NothingToCommit {
    type Committable = FlushedRecords;

    async fn commit(&self, _: Vec<FlushedRecords>) -> Result<()> {
        Ok(())
    }

    async fn is_committed(&self, _: &FlushedRecords) -> Result<bool> {
        Ok(true)
    }
}

/// At-least-once Kafka sink without transactions; see the module docs.
pub struct KafkaAtLeastOnceSink {
    config: KafkaSinkConfig,
    sink: SinkId,
    producer: Option<SinkProducer>,
    checkpoint: Option<CheckpointId>,
    sender: RecordSender,
}

impl KafkaAtLeastOnceSink {
    /// A sink for `config` (its transactional settings are not used); the producer connects on first use.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for settings the sink cannot honour.
    pub fn new(config: KafkaSinkConfig, sink: SinkId) -> Result<Self> {
        let config = config.resolve_env().map_err(|e| e.with_sink(&sink))?;
        config.validate().map_err(|e| e.with_sink(&sink))?;
        Ok(Self {
            sender: RecordSender::new(&config).map_err(|e| e.with_sink(&sink))?,
            config,
            sink,
            producer: None,
            checkpoint: None,
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

    fn context(&self, e: Error) -> Error {
        let e = e.or_sink(&self.sink);
        match self.checkpoint {
            Some(checkpoint) => e.or_checkpoint(checkpoint),
            None => e,
        }
    }

    /// The producer `begin` opened, for a step of `phase`.
    fn begun(&self, phase: Phase) -> Result<SinkProducer> {
        self.producer.clone().ok_or_else(|| {
            self.context(Error::new(
                ErrorKind::Bug,
                phase,
                format!("{phase} before begin"),
            ))
        })
    }
}

#[async_trait]
impl TwoPhaseCommit for KafkaAtLeastOnceSink {
    type Committable = FlushedRecords;
    type Committer = NothingToCommit;

    fn sink_id(&self) -> &SinkId {
        &self.sink
    }

    fn committer(&self) -> NothingToCommit {
        NothingToCommit
    }

    fn delivery(&self) -> connector_api::DeliveryGuarantee {
        connector_api::DeliveryGuarantee::AtLeastOnce
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        if self.producer.is_none() {
            let producer = self
                .config
                .idempotent_producer_config()
                .and_then(|c| {
                    c.create_with_context(DeliveryTracker::default())
                        .map_err(|e| {
                            Error::new(classify(&e), Phase::Begin, "cannot create the producer")
                                .with_source(e)
                        })
                })
                .map_err(|e| self.context(e))?;
            self.producer = Some(producer);
        }
        if let Some(producer) = &self.producer {
            self.sender.start(producer);
        }
        self.checkpoint = Some(checkpoint);
        Ok(())
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let producer = self.begun(Phase::Write)?;
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

    /// Tombstones (the key, a null value), acknowledged at pre-commit like every record.
    async fn write_tombstones(&mut self, keys: &[Option<Vec<u8>>]) -> Result<bool> {
        let producer = self.begun(Phase::Write)?;
        let sent = self.sender.send_tombstones(&producer, keys).await;
        sent.map(|()| true).map_err(|e| self.context(e))
    }

    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<FlushedRecords> {
        let producer = self.begun(Phase::PreCommit)?;
        let flushed = self.sender.flush(&producer).await;
        let ranges = flushed.map_err(|e| self.context(e.at_phase(Phase::PreCommit)))?;
        Ok(FlushedRecords { checkpoint, ranges })
    }

    /// Records already sent cannot be taken back (at-least-once): nothing to do; the next `begin` forgets what
    /// was in flight.
    async fn abort(&mut self) -> Result<()> {
        self.checkpoint = None;
        Ok(())
    }

    /// Nothing is held open between checkpoints (sent records are visible already): nothing to commit, abort or
    /// fence.
    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<FlushedRecords>)>,
    ) -> Result<RecoveryPlan<FlushedRecords>> {
        RecoveryPlan::checking(&self.committer(), restored, Fence::nothing()).await
    }

    async fn execute_recovery(&mut self, _: RecoveryPlan<FlushedRecords>) -> Result<()> {
        self.checkpoint = None;
        Ok(())
    }

    fn transaction_timeout(&self) -> Option<Duration> {
        None
    }
}
