//! One checkpoint: pre-commit every sink, wait for the previous commit, save the record (the decision), start the
//! commit on its own task, and open the next checkpoint; a failure before the record is durable aborts it
//! everywhere (presumed abort).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use super::commit::spawn_commit;
use super::erased::PendingCommit;
use super::{Driver, FaultPoint};
use crate::{
    Action, CheckpointId, CheckpointRecord, CheckpointStore, Error, ErrorKind, OwnerEpoch, Phase,
    Report, Result, RetryPolicy, SourceOffset, action_after_retries,
};

impl<S: CheckpointStore> Driver<S> {
    /// Completes the current checkpoint, whose writes reach `positions` in the source, and opens the next one.
    /// Returns once the record is durable and the next checkpoint is open; the commit runs on in the background
    /// and is awaited by the next `checkpoint` or by [`Driver::close`].
    ///
    /// # Errors
    /// A failure before the record is durable aborts the checkpoint in every sink (unless this instance was
    /// fenced: then it aborts nothing): restart and replay from the last durable checkpoint. A save whose outcome
    /// stays unknown is [`InDoubt`](ErrorKind::InDoubt) and aborts nothing: restart, and recovery commits or
    /// aborts the checkpoint according to what the store holds. A failed commit of the *previous* checkpoint is
    /// reported here (the record of that checkpoint stays the newest, so recovery commits it on restart).
    pub async fn checkpoint(&mut self, positions: Vec<SourceOffset>) -> Result<CheckpointId> {
        self.ensure_running()?;
        let started = std::time::Instant::now();
        let id = self.current;
        let mut committables = BTreeMap::new();
        let mut pending: Vec<Box<dyn PendingCommit>> = Vec::with_capacity(self.sinks.len());
        for i in 0..self.sinks.len() {
            let sink_id = self.sinks[i].sink_id().clone();
            let limit = self.config.max_call_time;
            let prepared = within(
                limit,
                Phase::PreCommit,
                ErrorKind::Retryable,
                "pre_commit (max_call_time)",
                self.sinks[i].pre_commit(id),
            )
            .await;
            match prepared {
                Ok((entry, commit)) => {
                    committables.insert(sink_id.clone(), entry);
                    pending.push(commit);
                }
                Err(e) => {
                    return Err(self
                        .abort_checkpoint(e.or_sink(&sink_id).or_checkpoint(id))
                        .await);
                }
            }
            self.inject(FaultPoint::AfterPreCommit { sink: sink_id })
                .await?;
        }
        // Record N replaces record N-1 as the newest: N-1 must be committed everywhere before that.
        if let Err(e) = self.finish_commit().await {
            return Err(self.abort_checkpoint(e).await);
        }
        let record = CheckpointRecord {
            id,
            positions,
            committables,
        };
        let retry = self.config.retry;
        let owner = self.owner.expect("a running driver holds a claim");
        if let Err(e) = save_decision(&*self.store, retry, owner, &record).await {
            // An unknown outcome or a lost claim stops without aborting: the record may be the decision already,
            // or a newer owner may need the transactions.
            return Err(self.abort_checkpoint(e).await);
        }
        // Checkpoint `id` is decided: committed, whatever happens next.
        ::metrics::histogram!(crate::metrics::CHECKPOINT_SECONDS, self.labels.clone())
            .record(started.elapsed().as_secs_f64());
        ::metrics::counter!(crate::metrics::CHECKPOINTS, self.labels.clone()).increment(1);
        tracing::debug!(checkpoint = %id, "checkpoint record durable; committing");
        self.inject(FaultPoint::AfterRecordDurable).await?;
        let wait = self.config.retry.worst_case(self.config.max_call_time);
        let task = spawn_commit(
            pending,
            self.store.clone(),
            self.faults.clone(),
            retry,
            wait,
            (id, owner),
            self.labels.clone(),
        );
        self.committing = Some((id, std::time::Instant::now(), task));
        self.current = id.next();
        self.begin_all().await?;
        Ok(id)
    }

    pub(super) async fn begin_all(&mut self) -> Result<()> {
        let (retry, current) = (self.config.retry, self.current);
        let wait = retry.worst_case(self.config.max_call_time);
        for i in 0..self.sinks.len() {
            let sink = &mut self.sinks[i];
            let id = sink.sink_id().clone();
            let begun = async {
                let mut attempts = retry.attempts();
                loop {
                    match sink.begin(current).await {
                        Err(e) if attempts.retry("begin", &e).await => {}
                        outcome => break outcome,
                    }
                }
            };
            let outcome = within(
                wait,
                Phase::Begin,
                ErrorKind::Retryable,
                "begin, retries included",
                begun,
            )
            .await;
            if let Err(e) = outcome {
                let e = e.or_sink(&id).or_checkpoint(current);
                self.fail(&e);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Presumed abort: discards the current (undecided) checkpoint in every sink, stops the driver, and returns
    /// `cause`, unless the error table says to stop without aborting (a fenced instance: what it holds may be what
    /// the newer owner recovers; a save whose outcome is unknown: the record may be the decision). Abort failures
    /// are logged, not returned: `cause` is what to report, and recovery aborts what is left.
    pub(super) async fn abort_checkpoint(&mut self, cause: Error) -> Error {
        self.fail(&cause);
        if action_after_retries(cause.kind(), cause.phase()) == Action::StopWithoutAbort {
            return cause;
        }
        let (current, limit) = (self.current, self.config.max_call_time);
        for sink in &mut self.sinks {
            let aborted = within(
                limit,
                Phase::Abort,
                ErrorKind::Retryable,
                "abort (max_call_time)",
                sink.abort(),
            )
            .await;
            if let Err(e) = aborted {
                tracing::error!(sink = %sink.sink_id(), checkpoint = %current, error = %Report(&e),
                    "abort after a failed checkpoint failed; recovery will abort the transaction");
            }
        }
        cause
    }
}

/// Saves a decision record, retrying transient and unknown outcomes (saving the identical record again is
/// idempotent).
///
/// # Errors
/// [`InDoubt`](ErrorKind::InDoubt) when some attempt's outcome was unknown and no later attempt settled it: the
/// caller must not abort. [`Fenced`](ErrorKind::Fenced) as the store reports it. Otherwise the record was
/// definitely not stored.
pub(super) async fn save_decision<S: CheckpointStore + ?Sized>(
    store: &S,
    retry: RetryPolicy,
    owner: OwnerEpoch,
    record: &CheckpointRecord,
) -> Result<()> {
    let mut attempts = retry.attempts();
    let mut in_doubt = false;
    loop {
        let e = match store.save(owner, record).await {
            Ok(()) => return Ok(()),
            Err(e) => e.or_checkpoint(record.id),
        };
        in_doubt |= e.kind() == ErrorKind::InDoubt;
        if attempts.retry("save checkpoint record", &e).await {
            continue;
        }
        if in_doubt && e.kind() != ErrorKind::Fenced {
            return Err(Error::new(
                ErrorKind::InDoubt,
                Phase::Checkpoint,
                "whether the checkpoint record was stored is unknown, and retries did not settle it; stopping \
                 without aborting anything: restart the job, and recovery commits the checkpoint if its record is \
                 stored, or aborts it",
            )
            .with_checkpoint(record.id)
            .with_source(e));
        }
        return Err(e);
    }
}

/// `call` bounded by `limit`: when it does not finish in time it is dropped (like a crash at that point) and the
/// result is an error of `kind` in `phase` saying what ran out of time.
pub(super) async fn within<T>(
    limit: Duration,
    phase: Phase,
    kind: ErrorKind,
    what: &str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    crate::bounded(
        limit,
        (kind, phase),
        || format!("{what} did not finish within {limit:?}; abandoned"),
        call,
    )
    .await
}
