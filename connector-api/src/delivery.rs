//! Delivery guarantees, chosen per sink in its config, and the adapter that gives any two-phase sink the weaker
//! ones.

use std::time::Duration;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{CheckpointId, Committer, RecoveryPlan, Result, SinkId, TwoPhaseCommit};

/// What a sink promises about each source record after crashes and restarts.
///
/// | guarantee | how | cost | failure mode |
/// |---|---|---|---|
/// | `ExactlyOnce` | the sink's transaction is committed only after the checkpoint record holding it is durable; recovery commits the restored checkpoint's transactions and aborts the rest | output becomes visible about one checkpoint interval after it was read; external transactions stay open that long, so their timeout must outlast the checkpoint interval plus a restart | none, as long as transactions are committed before the external system's transaction timeout expires |
/// | `AtLeastOnce` | the transaction is committed at the checkpoint, *before* the checkpoint record is written | no dependence on transaction timeouts across restarts; nothing to recover | a crash between that commit and the durable record replays the checkpoint's records: duplicates |
/// | `AtMostOnce` | the checkpoint record (the new source positions) is written before the transaction is committed, and recovery never commits | no replay work after a crash | a crash between the durable record and the commit loses that checkpoint's records |
///
/// In this release the weaker guarantees run on each sink's transactional machinery through [`GuaranteedSink`]:
/// they change when data becomes visible relative to the checkpoint record and what recovery does, not yet the
/// cost of writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryGuarantee {
    /// Every record becomes visible exactly once, one checkpoint interval after it was read.
    #[default]
    ExactlyOnce,
    /// Every record becomes visible at least once; a crash can repeat the records since the last checkpoint.
    AtLeastOnce,
    /// Every record becomes visible at most once; a crash can lose the records since the last checkpoint.
    AtMostOnce,
}

/// Any two-phase sink run with a chosen [`DeliveryGuarantee`].
///
/// - `ExactlyOnce`: passes everything through.
/// - `AtLeastOnce`: `pre_commit` also commits, and the checkpoint record holds nothing for the sink (`None`).
/// - `AtMostOnce`: commit happens after the record as usual, but recovery aborts the transactions of a checkpoint
///   decided at-most-once instead of committing them (the driver records the guarantee with each committable and
///   hands such a checkpoint to nobody).
pub struct GuaranteedSink<S> {
    inner: S,
    guarantee: DeliveryGuarantee,
}

impl DeliveryGuarantee {
    /// The name a job file uses: `exactly-once`, `at-least-once`, `at-most-once`.
    pub fn name(self) -> &'static str {
        match self {
            Self::ExactlyOnce => "exactly-once",
            Self::AtLeastOnce => "at-least-once",
            Self::AtMostOnce => "at-most-once",
        }
    }
}

impl<S: TwoPhaseCommit> GuaranteedSink<S> {
    /// Runs `inner` with `guarantee`.
    pub fn new(inner: S, guarantee: DeliveryGuarantee) -> Self {
        Self { inner, guarantee }
    }

    /// The guarantee this sink runs with.
    pub fn guarantee(&self) -> DeliveryGuarantee {
        self.guarantee
    }
}

/// The committer of a [`GuaranteedSink`]: commits the `Some` committables, `None` means nothing to commit.
#[derive(Clone)]
pub struct GuaranteedCommitter<C>(C);

#[async_trait]
impl<C: Committer> Committer for GuaranteedCommitter<C> {
    type Committable = Option<C::Committable>;

    async fn commit(&self, committables: Vec<Self::Committable>) -> Result<()> {
        let committables: Vec<_> = committables.into_iter().flatten().collect();
        if committables.is_empty() {
            return Ok(());
        }
        self.0.commit(committables).await
    }

    async fn is_committed(&self, committable: &Self::Committable) -> Result<bool> {
        match committable {
            Some(c) => self.0.is_committed(c).await,
            None => Ok(true),
        }
    }
}

#[async_trait]
impl<S: TwoPhaseCommit> TwoPhaseCommit for GuaranteedSink<S> {
    type Committable = Option<S::Committable>;
    type Committer = GuaranteedCommitter<S::Committer>;

    fn sink_id(&self) -> &SinkId {
        self.inner.sink_id()
    }

    fn committer(&self) -> Self::Committer {
        GuaranteedCommitter(self.inner.committer())
    }

    fn transaction_timeout(&self) -> Option<Duration> {
        // Only exactly-once keeps a transaction open across a restart.
        match self.guarantee {
            DeliveryGuarantee::ExactlyOnce => self.inner.transaction_timeout(),
            _ => None,
        }
    }

    fn restore_committed(&self, committables: &[Self::Committable]) -> bool {
        let inner: Vec<S::Committable> = committables.iter().flatten().cloned().collect();
        self.inner.restore_committed(&inner)
    }

    fn delivery(&self) -> DeliveryGuarantee {
        self.guarantee
    }

    fn holds_deferred(&self) -> bool {
        self.inner.holds_deferred()
    }

    async fn recorded_checkpoint(&mut self) -> Result<Option<CheckpointId>> {
        self.inner.recorded_checkpoint().await
    }

    fn committable_version(&self) -> u32 {
        self.inner.committable_version()
    }

    fn decode_committable(
        &self,
        version: u32,
        value: serde_json::Value,
    ) -> Result<Self::Committable> {
        match value {
            serde_json::Value::Null => Ok(None),
            value => self.inner.decode_committable(version, value).map(Some),
        }
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        self.inner.begin(checkpoint).await
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.inner.write(batch).await
    }

    async fn write_tombstones(&mut self, keys: &[Option<Vec<u8>>]) -> Result<bool> {
        self.inner.write_tombstones(keys).await
    }

    async fn evolve(&mut self, schema: arrow_schema::SchemaRef) -> Result<()> {
        self.inner.evolve(schema).await
    }

    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Self::Committable> {
        let committable = self.inner.pre_commit(checkpoint).await?;
        if self.guarantee == DeliveryGuarantee::AtLeastOnce {
            self.inner.committer().commit(vec![committable]).await?;
            return Ok(None);
        }
        Ok(Some(committable))
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }

    /// Plans to commit what `restored` holds, whatever this sink's guarantee is now: the driver hands over only what a
    /// checkpoint decided under exactly-once carries (an at-least-once checkpoint committed at pre-commit and
    /// holds nothing; recovery never commits an at-most-once checkpoint), so that a change of guarantee never
    /// drops a decided checkpoint.
    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<Self::Committable>)>,
    ) -> Result<RecoveryPlan<Self::Committable>> {
        let restored =
            restored.map(|(id, committables)| (id, committables.into_iter().flatten().collect()));
        Ok(self.inner.plan_recovery(restored).await?.map(Some))
    }

    async fn execute_recovery(&mut self, plan: RecoveryPlan<Self::Committable>) -> Result<()> {
        self.inner.execute_recovery(plan.flatten()).await
    }
}
