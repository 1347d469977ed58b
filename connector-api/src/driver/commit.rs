//! The commit of a decided checkpoint: every sink at once on a task of its own, each bounded by the budget's
//! commit term, then "committed through N" noted in the store.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::task::JoinHandle;

use super::checkpoint::within;
use super::erased::PendingCommit;
use super::fault::crash_error;
use super::{Driver, FaultAction, FaultInjector, FaultPoint};
use crate::{
    CheckpointId, CheckpointStore, Error, ErrorKind, OwnerEpoch, Phase, Report, Result, RetryPolicy,
};

/// A decided checkpoint's commit, on its own task: `Ok(Some(e))` when every sink committed but noting it in the
/// store failed with `e`.
pub(super) type CommitTask = JoinHandle<Result<Option<Error>>>;

impl<S: CheckpointStore> Driver<S> {
    /// The decided checkpoint whose commit is still running, and how long ago its record became durable: what an
    /// operator watches as "pending" (it grows when a sink's commit hangs).
    pub fn commit_in_flight(&self) -> Option<(CheckpointId, Duration)> {
        self.committing
            .as_ref()
            .filter(|(_, _, task)| !task.is_finished())
            .map(|(id, since, _)| (*id, since.elapsed()))
    }

    /// Waits for the last checkpoint's commit to finish. [`Driver::checkpoint`] and [`Driver::close`] do this
    /// themselves; call it to know that everything checkpointed so far is visible. A failure to note the commit in
    /// the store (after retries) is only logged here: the next checkpoint's note covers it.
    pub async fn finish_commit(&mut self) -> Result<()> {
        if let Some((checkpoint, e)) = self.join_commit().await? {
            tracing::warn!(%checkpoint, error = %Report(&e),
                "cannot note the checkpoint as committed; the next note covers it, or the next recovery asks the sinks");
        }
        Ok(())
    }

    /// Waits for the commit task: `Ok(Some(..))` when the commit succeeded but noting it in the store failed.
    pub(super) async fn join_commit(&mut self) -> Result<Option<(CheckpointId, Error)>> {
        let Some((id, _, task)) = self.committing.take() else {
            return Ok(None);
        };
        let outcome = match task.await {
            Ok(outcome) => outcome,
            Err(e) => Err(
                Error::new(ErrorKind::Bug, Phase::Commit, "the commit task panicked")
                    .with_checkpoint(id)
                    .with_source(e),
            ),
        };
        if let Err(e) = &outcome {
            self.fail(e);
        }
        Ok(outcome?.map(|e| (id, e)))
    }
}

/// Notes `checkpoint` committed in the store, retrying transient failures; a failure only means the next recovery
/// asks the sinks again.
pub(super) async fn note_committed<S: CheckpointStore + ?Sized>(
    store: &S,
    retry: RetryPolicy,
    owner: OwnerEpoch,
    checkpoint: CheckpointId,
) -> Result<()> {
    retry
        .run("note the checkpoint committed", || {
            store.mark_committed(owner, checkpoint)
        })
        .await
}

/// Commits decided checkpoint `id` in every sink at once, each with its own retries: a slow sink never eats another's
/// transaction timeout. A crash drill after one sink's commit abandons the others mid-flight, as a killed process
/// would. A commit still running after `wait` (the budget's commit term) is abandoned `InDoubt`, which stops the
/// driver: the restart and the recovery that commits it are the budget's next terms. Once every sink committed,
/// notes the checkpoint committed in the store (with `owner`'s claim). Each sink's commit time is recorded in
/// [`COMMIT_SECONDS`](crate::metrics::COMMIT_SECONDS) with `labels` and the sink.
pub(super) fn spawn_commit<S: CheckpointStore>(
    pending: Vec<Box<dyn PendingCommit>>,
    store: Arc<S>,
    faults: Option<FaultInjector>,
    retry: RetryPolicy,
    wait: Duration,
    (id, owner): (CheckpointId, OwnerEpoch),
    labels: Vec<::metrics::Label>,
) -> CommitTask {
    tokio::spawn(async move {
        let mut commits: FuturesUnordered<_> = pending
            .into_iter()
            .map(|commit| async move {
                let sink = commit.sink_id().clone();
                let started = std::time::Instant::now();
                let outcome = within(
                    wait,
                    Phase::Commit,
                    ErrorKind::InDoubt,
                    "the commit, retries included (the timeout budget's commit term)",
                    retry.run("commit", || commit.commit()),
                )
                .await;
                (sink, started, outcome)
            })
            .collect();
        while let Some((sink, started, outcome)) = commits.next().await {
            outcome.map_err(|e| e.or_sink(&sink).or_checkpoint(id))?;
            let mut labels = labels.clone();
            labels.push(::metrics::Label::new("sink", sink.to_string()));
            ::metrics::histogram!(crate::metrics::COMMIT_SECONDS, labels)
                .record(started.elapsed().as_secs_f64());
            let point = FaultPoint::AfterCommit { sink };
            if let Some(faults) = &faults
                && faults.at(id, &point).await == FaultAction::Crash
            {
                return Err(crash_error(&point));
            }
        }
        tracing::debug!(checkpoint = %id, "checkpoint committed in every sink");
        Ok(note_committed(&*store, retry, owner, id).await.err())
    })
}
