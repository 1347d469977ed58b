//! Type erasure: sinks of different types, with different committables, behind one driver.

use std::time::Duration;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{
    CheckpointId, CheckpointRecord, Committer, Error, ErrorKind, Phase, Result, SinkId,
    TwoPhaseCommit,
};

/// A sink's entry in a checkpoint record: its committables and the format version they were written with.
#[derive(Serialize, Deserialize)]
struct RecordEntry {
    version: u32,
    committables: Vec<serde_json::Value>,
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
    fn restore_committed(&self) -> bool;
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()>;
    async fn write(&mut self, batch: &RecordBatch) -> Result<()>;
    /// Pre-commits; returns the sink's checkpoint-record entry and the commit to run once the record is durable.
    async fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> Result<(serde_json::Value, Box<dyn PendingCommit>)>;
    async fn abort(&mut self) -> Result<()>;
    async fn recover(&mut self, restored: Option<(CheckpointId, serde_json::Value)>) -> Result<()>;
    async fn inspect(
        &mut self,
        restored: Option<(CheckpointId, serde_json::Value)>,
    ) -> Result<crate::ExternalView>;
}

#[async_trait]
impl<T: TwoPhaseCommit> ErasedSink for T {
    fn sink_id(&self) -> &SinkId {
        TwoPhaseCommit::sink_id(self)
    }

    fn transaction_timeout(&self) -> Option<Duration> {
        TwoPhaseCommit::transaction_timeout(self)
    }

    fn restore_committed(&self) -> bool {
        TwoPhaseCommit::restore_committed(self)
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        TwoPhaseCommit::begin(self, checkpoint).await
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        TwoPhaseCommit::write(self, batch).await
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

    async fn recover(&mut self, restored: Option<(CheckpointId, serde_json::Value)>) -> Result<()> {
        let restored = match restored {
            None => None,
            Some((id, value)) => Some((id, decode_entry(self, id, value)?)),
        };
        TwoPhaseCommit::recover(self, restored).await
    }

    async fn inspect(
        &mut self,
        restored: Option<(CheckpointId, serde_json::Value)>,
    ) -> Result<crate::ExternalView> {
        let restored = match restored {
            None => None,
            Some((id, value)) => Some((id, decode_entry(self, id, value)?)),
        };
        TwoPhaseCommit::inspect(self, restored).await
    }
}

fn decode_entry<T: TwoPhaseCommit>(
    sink: &T,
    checkpoint: CheckpointId,
    value: serde_json::Value,
) -> Result<Vec<T::Committable>> {
    let entry: RecordEntry = serde_json::from_value(value).map_err(|e| {
        Error::new(
            ErrorKind::Fatal,
            Phase::Recover,
            "the checkpoint record's entry for this sink is malformed",
        )
        .with_sink(TwoPhaseCommit::sink_id(sink))
        .with_checkpoint(checkpoint)
        .with_source(e)
    })?;
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
    record
        .committables
        .get(TwoPhaseCommit::sink_id(sink))
        .map(|value| decode_entry(sink, record.id, value.clone()))
        .transpose()
}
