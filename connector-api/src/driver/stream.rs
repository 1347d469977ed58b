//! Driving the protocol from a `futures` stream: a job built on streams forwards its batches and checkpoint
//! barriers into the driver in one call.

use arrow_array::RecordBatch;
use futures_util::{Stream, StreamExt};

use super::{Driver, SinkHandle};
use crate::{CheckpointId, CheckpointStore, Result, SourceOffset};

/// What a stream job sends the driver.
#[derive(Debug, Clone)]
pub enum StreamEvent {
    /// Rows for one sink, written into its open transaction.
    Batch {
        /// The sink, from [`Driver::add_sink`].
        sink: SinkHandle,
        /// The rows.
        batch: RecordBatch,
    },
    /// A checkpoint barrier: every batch before it is covered by these source positions. The driver checkpoints
    /// (pre-commit, durable record, commit overlapping what follows).
    Checkpoint(Vec<SourceOffset>),
}

impl<S: CheckpointStore> Driver<S> {
    /// Forwards `events` into this started driver until the stream ends: batches to [`Driver::write`], barriers
    /// to [`Driver::checkpoint`]. Returns the last checkpoint decided. Batches after the last barrier stay in the
    /// open transaction (send a barrier last, or they are discarded by [`Driver::close`]).
    ///
    /// # Errors
    /// The first error of the stream or of the driver, as [`Driver::write`] and [`Driver::checkpoint`] report
    /// it; the stream is not polled further.
    pub async fn forward<St>(&mut self, events: St) -> Result<Option<CheckpointId>>
    where
        St: Stream<Item = Result<StreamEvent>>,
    {
        let mut events = std::pin::pin!(events);
        let mut last = None;
        while let Some(event) = events.next().await {
            match event? {
                StreamEvent::Batch { sink, batch } => self.write(sink, &batch).await?,
                StreamEvent::Checkpoint(positions) => {
                    last = Some(self.checkpoint(positions).await?)
                }
            }
        }
        Ok(last)
    }
}
