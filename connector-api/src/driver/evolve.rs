//! A schema change at a checkpoint boundary: the source's batches gained columns, or widened or relaxed some (a
//! registry's reader schema took a writer's change), and the sinks take the new schema before any batch of it is
//! written.
//!
//! Order: every checkpoint before the change is committed (its commit awaited), then each sink evolves (outside
//! the open, still empty transaction), then the caller writes batches of the new schema. A crash before a sink
//! evolved leaves the old schema and replays from the last checkpoint; a crash after leaves new nullable (or wider)
//! columns the replayed rows fill, or leave null (as records without the field would). Both are crash points
//! ([`Step::BeforeEvolve`](super::Step::BeforeEvolve), [`Step::AfterEvolve`](super::Step::AfterEvolve)).

use arrow_schema::SchemaRef;

use super::checkpoint::within;
use super::{Driver, FaultPoint, SinkHandle};
use crate::{CheckpointStore, ErrorKind, Phase, Result};

impl<S: CheckpointStore> Driver<S> {
    /// Makes each of `sinks` take `schema` ([`TwoPhaseCommit::evolve`](crate::TwoPhaseCommit::evolve)) for the
    /// batches written from now on. Call it right after [`checkpoint`](Self::checkpoint), with nothing written
    /// since: it first waits for that checkpoint's commit, so the change comes after every earlier row is visible.
    ///
    /// # Errors
    /// A sink that does not evolve or cannot make the change ([`Config`](ErrorKind::Config)), or that stayed
    /// unreachable through the retries; the driver then stops (restart the job: recovery resolves the open
    /// checkpoint, and a sink built with the new schema evolves when it opens).
    pub async fn evolve(&mut self, sinks: &[SinkHandle], schema: SchemaRef) -> Result<()> {
        self.ensure_running()?;
        self.finish_commit().await?;
        self.inject(FaultPoint::BeforeEvolve).await?;
        let (retry, current) = (self.config.retry, self.current);
        let wait = retry.worst_case(self.config.max_call_time);
        for handle in sinks {
            let sink = self.writable(*handle)?;
            let id = sink.sink_id().clone();
            let evolved = async {
                let mut attempts = retry.attempts();
                loop {
                    match sink.evolve(schema.clone()).await {
                        Err(e) if attempts.retry("evolve", &e).await => {}
                        outcome => break outcome,
                    }
                }
            };
            let outcome = within(
                wait,
                Phase::Setup,
                ErrorKind::Retryable,
                "evolve, retries included",
                evolved,
            )
            .await;
            if let Err(e) = outcome {
                let e = e.or_sink(&id).or_checkpoint(current);
                self.fail(&e);
                return Err(e);
            }
            tracing::info!(sink = %id, columns = schema.fields().len(), "sink took the new schema");
            self.inject(FaultPoint::AfterEvolve { sink: id }).await?;
        }
        Ok(())
    }
}
