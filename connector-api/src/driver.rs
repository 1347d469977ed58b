//! The driver: runs the checkpoint protocol over one or more sinks.
//!
//! Checkpoint `N`: `pre_commit` every sink → persist the checkpoint record (the commit decision) → `commit` every
//! sink → `begin(N+1)`. A failure before the record is durable aborts `N` everywhere (presumed abort); after it,
//! `N` is decided and recovery commits it. On start the driver loads the last record, recovers every sink with its
//! committables, and hands back the source positions to resume from.

use std::collections::BTreeMap;

use arrow_array::RecordBatch;
use async_trait::async_trait;

use crate::{
    CheckpointId, CheckpointRecord, CheckpointStore, Error, ErrorKind, Phase, Result, SinkId,
    SourceOffset, TwoPhaseCommit,
};

/// A sink with its committables as JSON, so sinks of different types can share one driver.
#[async_trait]
trait ErasedSink: Send {
    fn sink_id(&self) -> &SinkId;
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()>;
    async fn write(&mut self, batch: &RecordBatch) -> Result<()>;
    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<serde_json::Value>;
    async fn commit(
        &mut self,
        checkpoint: CheckpointId,
        committables: serde_json::Value,
    ) -> Result<()>;
    async fn abort(&mut self) -> Result<()>;
    async fn recover(&mut self, restored: Option<(CheckpointId, serde_json::Value)>) -> Result<()>;
}

fn decode<C: serde::de::DeserializeOwned>(
    sink: &SinkId,
    checkpoint: CheckpointId,
    value: serde_json::Value,
) -> Result<Vec<C>> {
    serde_json::from_value(value).map_err(|e| {
        Error::new(
            ErrorKind::Fatal,
            Phase::Recover,
            "the checkpoint record holds committables this sink cannot read (written by an incompatible release?)",
        )
        .with_sink(sink)
        .with_checkpoint(checkpoint)
        .with_source(e)
    })
}

#[async_trait]
impl<T: TwoPhaseCommit> ErasedSink for T {
    fn sink_id(&self) -> &SinkId {
        TwoPhaseCommit::sink_id(self)
    }
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        TwoPhaseCommit::begin(self, checkpoint).await
    }
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        TwoPhaseCommit::write(self, batch).await
    }
    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<serde_json::Value> {
        let committable = TwoPhaseCommit::pre_commit(self, checkpoint).await?;
        serde_json::to_value(vec![committable]).map_err(|e| {
            Error::new(
                ErrorKind::Fatal,
                Phase::PreCommit,
                "committable does not serialize",
            )
            .with_sink(TwoPhaseCommit::sink_id(self))
            .with_checkpoint(checkpoint)
            .with_source(e)
        })
    }
    async fn commit(
        &mut self,
        checkpoint: CheckpointId,
        committables: serde_json::Value,
    ) -> Result<()> {
        let committables = decode(TwoPhaseCommit::sink_id(self), checkpoint, committables)?;
        TwoPhaseCommit::commit(self, committables).await
    }
    async fn abort(&mut self) -> Result<()> {
        TwoPhaseCommit::abort(self).await
    }
    async fn recover(&mut self, restored: Option<(CheckpointId, serde_json::Value)>) -> Result<()> {
        let restored = match restored {
            Some((id, value)) => Some((id, decode(TwoPhaseCommit::sink_id(self), id, value)?)),
            None => None,
        };
        TwoPhaseCommit::recover(self, restored).await
    }
}

/// What the driver restored on start.
#[derive(Debug, Clone, PartialEq)]
pub struct Restored {
    /// The last durable checkpoint, `None` for a fresh job.
    pub checkpoint: Option<CheckpointId>,
    /// Where to resume reading the source (empty for a fresh job: start from the beginning).
    pub positions: Vec<SourceOffset>,
}

/// Runs checkpoints over a set of sinks and a checkpoint store.
///
/// Usage: [`Driver::start`] once, then [`Driver::write`] batches and call [`Driver::checkpoint`] with the source
/// positions the written batches reach.
pub struct Driver<S> {
    store: S,
    sinks: Vec<Box<dyn ErasedSink>>,
    current: CheckpointId,
    started: bool,
}

impl<S: CheckpointStore> Driver<S> {
    /// A driver persisting records in `store`. Add sinks with [`Driver::add_sink`] before [`Driver::start`].
    pub fn new(store: S) -> Self {
        Self {
            store,
            sinks: Vec::new(),
            current: CheckpointId(1),
            started: false,
        }
    }

    /// Adds a sink; returns its index for [`Driver::write`]. Sink ids must be unique.
    pub fn add_sink<T: TwoPhaseCommit + 'static>(&mut self, sink: T) -> Result<usize> {
        let id = TwoPhaseCommit::sink_id(&sink).clone();
        if self.sinks.iter().any(|s| s.sink_id() == &id) {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "two sinks share this id; give each sink of a job its own id",
            )
            .with_sink(&id));
        }
        self.sinks.push(Box::new(sink));
        Ok(self.sinks.len() - 1)
    }

    /// The checkpoint whose transactions are open.
    pub fn current_checkpoint(&self) -> CheckpointId {
        self.current
    }

    /// Loads the last durable record, recovers every sink from it (commit its committables, abort everything
    /// else), opens the next checkpoint's transactions, and returns the positions to resume from.
    pub async fn start(&mut self) -> Result<Restored> {
        let record = self.store.load_latest().await?;
        let checkpoint = record.as_ref().map(|r| r.id);
        for sink in &mut self.sinks {
            let restored = record.as_ref().and_then(|r| {
                r.committables
                    .get(sink.sink_id())
                    .map(|value| (r.id, value.clone()))
            });
            sink.recover(restored).await?;
        }
        self.current = checkpoint.map_or(CheckpointId(1), CheckpointId::next);
        for sink in &mut self.sinks {
            sink.begin(self.current).await?;
        }
        self.started = true;
        Ok(Restored {
            checkpoint,
            positions: record.map(|r| r.positions).unwrap_or_default(),
        })
    }

    /// Writes `batch` to the sink at `sink` (an index from [`Driver::add_sink`]).
    pub async fn write(&mut self, sink: usize, batch: &RecordBatch) -> Result<()> {
        self.ensure_started()?;
        let target = self.sinks.get_mut(sink).ok_or_else(|| {
            Error::new(
                ErrorKind::Fatal,
                Phase::Write,
                format!("no sink with index {sink}"),
            )
        })?;
        target.write(batch).await
    }

    /// Completes the current checkpoint, whose writes reach `positions` in the source, and opens the next one.
    /// Returns the id of the completed checkpoint.
    ///
    /// # Errors
    /// A failure before the record is durable aborts the checkpoint in every sink and returns the error: the
    /// caller replays from the last durable checkpoint. A failure to commit after the record is durable returns
    /// the error with the checkpoint decided: restarting (recover) finishes the commit.
    pub async fn checkpoint(&mut self, positions: Vec<SourceOffset>) -> Result<CheckpointId> {
        self.ensure_started()?;
        let id = self.current;
        let mut committables = BTreeMap::new();
        let mut failure = None;
        for sink in &mut self.sinks {
            match sink.pre_commit(id).await {
                Ok(value) => {
                    committables.insert(sink.sink_id().clone(), value);
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if failure.is_none() {
            let record = CheckpointRecord {
                id,
                positions,
                committables: committables.clone(),
            };
            if let Err(e) = self.store.save(&record).await {
                failure = Some(e);
            }
        }
        if let Some(e) = failure {
            self.abort_all(id).await;
            return Err(e);
        }
        // The record is durable: checkpoint `id` is committed, whatever happens next.
        for sink in &mut self.sinks {
            let value = committables
                .remove(sink.sink_id())
                .expect("every sink pre-committed");
            sink.commit(id, value).await?;
        }
        self.current = id.next();
        for sink in &mut self.sinks {
            sink.begin(self.current).await?;
        }
        Ok(id)
    }

    /// Presumed abort: discard checkpoint `id` in every sink. Abort errors are logged, not returned: the original
    /// failure is the one to report, and recovery aborts whatever is left.
    async fn abort_all(&mut self, id: CheckpointId) {
        for sink in &mut self.sinks {
            if let Err(e) = sink.abort().await {
                tracing::error!(sink = %sink.sink_id(), checkpoint = %id, error = %crate::Report(&e),
                    "abort after a failed checkpoint failed; recovery will abort the transaction");
            }
        }
    }

    fn ensure_started(&self) -> Result<()> {
        if self.started {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Fatal,
                Phase::Setup,
                "Driver::start must run before writing or checkpointing",
            ))
        }
    }
}
