//! Type erasure: sinks of different types, with different committables, behind one driver.

use std::time::Duration;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{
    CheckpointId, CheckpointRecord, Committer, DeliveryGuarantee, Error, ErrorKind, Phase, Result,
    SinkId, TwoPhaseCommit,
};

/// A sink's entry in a checkpoint record: its committables, the format version they were written with, and what
/// recovery needs to know about them whatever the sink's settings are by then.
#[derive(Serialize, Deserialize)]
struct RecordEntry {
    version: u32,
    /// The guarantee the sink ran with (entries from before it was recorded: exactly-once, the only guarantee whose
    /// committables recovery commits, so they are never dropped).
    #[serde(default)]
    delivery: DeliveryGuarantee,
    /// Whether committing these committables left data for a later commit to make visible
    /// ([`TwoPhaseCommit::restore_committed`]): recovery needs them even once the store notes them committed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    deferred: bool,
    committables: Vec<serde_json::Value>,
}

impl RecordEntry {
    fn parse(sink: &SinkId, checkpoint: CheckpointId, value: serde_json::Value) -> Result<Self> {
        serde_json::from_value(value).map_err(|e| {
            Error::new(
                ErrorKind::Fatal,
                Phase::Recover,
                "the checkpoint record's entry for this sink is malformed",
            )
            .with_sink(sink)
            .with_checkpoint(checkpoint)
            .with_source(e)
        })
    }

    /// Whether recovery hands these committables to the sink at all: only a checkpoint decided exactly-once that
    /// holds something (at-least-once committed at pre-commit and holds nothing; recovery never commits an
    /// at-most-once checkpoint, whose transactions are aborted with everything else).
    fn restorable(&self) -> bool {
        self.delivery == DeliveryGuarantee::ExactlyOnce
            && self.committables.iter().any(|c| !c.is_null())
    }
}

/// Whether the entry `value` of a checkpoint record holds work recovery must still do (commit), given whether the
/// store notes the checkpoint committed: for a sink the job no longer has, whose work would be left undone.
pub(crate) fn entry_pending(
    sink: &SinkId,
    checkpoint: CheckpointId,
    value: &serde_json::Value,
    committed: bool,
) -> Result<bool> {
    let entry = RecordEntry::parse(sink, checkpoint, value.clone())?;
    Ok(entry.restorable() && (!committed || entry.deferred))
}

/// One sink's pre-committed transaction, ready to commit on the driver's commit task.
#[async_trait]
pub(crate) trait PendingCommit: Send + Sync {
    fn sink_id(&self) -> &SinkId;
    async fn commit(&self) -> Result<()>;
}

struct TypedPendingCommit<C: Committer> {
    sink: SinkId,
    committer: C,
    committables: Vec<C::Committable>,
}

#[async_trait]
impl<C> PendingCommit for TypedPendingCommit<C>
where
    C: Committer,
    C::Committable: Clone,
{
    fn sink_id(&self) -> &SinkId {
        &self.sink
    }

    async fn commit(&self) -> Result<()> {
        self.committer.commit(self.committables.clone()).await
    }
}

/// What the driver needs of a sink, with committables as JSON.
#[async_trait]
pub(crate) trait ErasedSink: Send {
    fn sink_id(&self) -> &SinkId;
    fn transaction_timeout(&self) -> Option<Duration>;
    fn delivery(&self) -> DeliveryGuarantee;
    fn holds_deferred(&self) -> bool;
    async fn recorded_checkpoint(&mut self) -> Result<Option<CheckpointId>>;
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()>;
    async fn write(&mut self, batch: &RecordBatch) -> Result<()>;
    async fn write_tombstones(&mut self, keys: &[Option<Vec<u8>>]) -> Result<bool>;
    async fn evolve(&mut self, schema: arrow_schema::SchemaRef) -> Result<()>;
    /// Pre-commits; returns the sink's checkpoint-record entry and the commit to run once the record is durable.
    async fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> Result<(serde_json::Value, Box<dyn PendingCommit>)>;
    async fn abort(&mut self) -> Result<()>;
    /// Recovers from the sink's entry of the restored record (`committed`: the store notes it committed).
    async fn recover(
        &mut self,
        restored: Option<(CheckpointId, serde_json::Value)>,
        committed: bool,
    ) -> Result<()>;
    /// Lists what recovery would do with the same input.
    async fn inspect(
        &mut self,
        restored: Option<(CheckpointId, serde_json::Value)>,
        committed: bool,
    ) -> Result<crate::PlanSummary>;
}

#[async_trait]
impl<T: TwoPhaseCommit> ErasedSink for T {
    fn sink_id(&self) -> &SinkId {
        TwoPhaseCommit::sink_id(self)
    }

    fn transaction_timeout(&self) -> Option<Duration> {
        TwoPhaseCommit::transaction_timeout(self)
    }

    fn holds_deferred(&self) -> bool {
        TwoPhaseCommit::holds_deferred(self)
    }

    fn delivery(&self) -> DeliveryGuarantee {
        TwoPhaseCommit::delivery(self)
    }

    async fn recorded_checkpoint(&mut self) -> Result<Option<CheckpointId>> {
        TwoPhaseCommit::recorded_checkpoint(self).await
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        TwoPhaseCommit::begin(self, checkpoint).await
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        TwoPhaseCommit::write(self, batch).await
    }

    async fn write_tombstones(&mut self, keys: &[Option<Vec<u8>>]) -> Result<bool> {
        TwoPhaseCommit::write_tombstones(self, keys).await
    }

    async fn evolve(&mut self, schema: arrow_schema::SchemaRef) -> Result<()> {
        TwoPhaseCommit::evolve(self, schema).await
    }

    async fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> Result<(serde_json::Value, Box<dyn PendingCommit>)> {
        let committable = TwoPhaseCommit::pre_commit(self, checkpoint).await?;
        let sink = TwoPhaseCommit::sink_id(self).clone();
        let serialized = serde_json::to_value(&committable).map_err(|e| {
            Error::new(
                ErrorKind::Bug,
                Phase::PreCommit,
                "committable does not serialize",
            )
            .with_source(e)
        })?;
        let entry = RecordEntry {
            version: self.committable_version(),
            delivery: TwoPhaseCommit::delivery(self),
            deferred: TwoPhaseCommit::restore_committed(self, std::slice::from_ref(&committable)),
            committables: vec![serialized],
        };
        let entry = serde_json::to_value(entry).expect("record entry serializes");
        let pending = TypedPendingCommit {
            sink,
            committer: self.committer(),
            committables: vec![committable],
        };
        Ok((entry, Box::new(pending)))
    }

    async fn abort(&mut self) -> Result<()> {
        TwoPhaseCommit::abort(self).await
    }

    async fn recover(
        &mut self,
        restored: Option<(CheckpointId, serde_json::Value)>,
        committed: bool,
    ) -> Result<()> {
        let restored = restorable(self, restored, committed)?;
        TwoPhaseCommit::recover(self, restored).await
    }

    async fn inspect(
        &mut self,
        restored: Option<(CheckpointId, serde_json::Value)>,
        committed: bool,
    ) -> Result<crate::PlanSummary> {
        let restored = restorable(self, restored, committed)?;
        TwoPhaseCommit::inspect(self, restored).await
    }
}

/// What `recover` gets from the sink's entry of the restored record, decided from the entry (the guarantee and
/// settings the checkpoint was decided under), never from the sink's current settings: the committables of a
/// checkpoint decided exactly-once, unless the store notes it `committed` and their commit deferred nothing.
fn restorable<T: TwoPhaseCommit>(
    sink: &T,
    restored: Option<(CheckpointId, serde_json::Value)>,
    committed: bool,
) -> Result<Option<(CheckpointId, Vec<T::Committable>)>> {
    let Some((checkpoint, value)) = restored else {
        return Ok(None);
    };
    let entry = RecordEntry::parse(TwoPhaseCommit::sink_id(sink), checkpoint, value)?;
    if !entry.restorable() {
        return Ok(None);
    }
    let (delivery, deferred) = (entry.delivery, entry.deferred);
    let decoded = decode_committables(sink, checkpoint, entry);
    if committed && !deferred {
        // Entries written before `deferred` was recorded: the committables themselves say (a sink that cannot
        // read them any more has nothing deferred in them).
        return Ok(decoded
            .ok()
            .filter(|c| TwoPhaseCommit::restore_committed(sink, c))
            .map(|c| (checkpoint, c)));
    }
    let decoded = decoded.map_err(|e| {
        let now = TwoPhaseCommit::delivery(sink);
        if now == delivery {
            return e;
        }
        Error::new(
            ErrorKind::Fatal,
            Phase::Recover,
            format!(
                "checkpoint {checkpoint} was decided with delivery = {} and is not committed in this sink yet, \
                 which now runs {}: it cannot finish it. Run the job (or `ratchet resolve`) once with the sink's \
                 previous delivery to commit it, then change the setting",
                delivery.name(),
                now.name()
            ),
        )
        .with_sink(TwoPhaseCommit::sink_id(sink))
        .with_checkpoint(checkpoint)
        .with_source(e)
    })?;
    Ok(Some((checkpoint, decoded)))
}

fn decode_committables<T: TwoPhaseCommit>(
    sink: &T,
    checkpoint: CheckpointId,
    entry: RecordEntry,
) -> Result<Vec<T::Committable>> {
    entry
        .committables
        .into_iter()
        .map(|c| sink.decode_committable(entry.version, c))
        .collect::<Result<Vec<_>>>()
        .map_err(|e| e.or_checkpoint(checkpoint))
}

/// The committables `record` holds for `sink` (`None` when the record has no entry for it), decoded as the
/// driver's recovery decodes them. For tools and tests that replay or inspect a checkpoint.
pub fn committables_in<T: TwoPhaseCommit>(
    sink: &T,
    record: &CheckpointRecord,
) -> Result<Option<Vec<T::Committable>>> {
    let id = TwoPhaseCommit::sink_id(sink);
    record
        .committables
        .get(id)
        .map(|value| {
            let entry = RecordEntry::parse(id, record.id, value.clone())?;
            decode_committables(sink, record.id, entry)
        })
        .transpose()
}
