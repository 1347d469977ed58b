//! The driver: runs the checkpoint protocol over one or more sinks.
//!
//! Checkpoint `N`: `pre_commit` every sink → wait for checkpoint `N-1`'s commit to finish → persist the checkpoint
//! record (the commit decision) → start committing `N` on a background task → `begin(N+1)` and return, so the
//! caller writes `N+1` while `N` commits. A failure before the record is durable aborts `N` in every sink
//! (presumed abort); after it, `N` is decided, and if its commit fails, recovery on the next start commits it.
//!
//! On start the driver checks the timeout budget, loads the last record, recovers every sink from it (commit its
//! committables, abort everything else), durably consumes one checkpoint id (a record with the restored positions
//! and no transactions) so that no checkpoint id is ever reused by a later attempt, and hands back the source
//! positions to resume from.
//!
//! After any error except [`ErrorKind::BadRecord`], the driver refuses further work: restart the job (build a new
//! driver and call [`Driver::start`]) so recovery resolves what the failure left.

mod budget;
mod erased;
mod fault;

use std::collections::BTreeMap;
use std::time::Duration;

use arrow_array::RecordBatch;
use tokio::task::JoinHandle;

pub use erased::committables_in;
pub use fault::{FaultInjector, FaultPoint};

use self::erased::{ErasedSink, PendingCommit};
use crate::{
    CheckpointId, CheckpointRecord, CheckpointStore, Error, ErrorKind, Phase, Result, RetryPolicy,
    SourceOffset, TwoPhaseCommit,
};

/// How the driver runs checkpoints.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// How often the caller checkpoints (the driver does not time checkpoints itself; it uses this for the
    /// timeout budget).
    pub checkpoint_interval: Duration,
    /// The longest a crashed job may take to restart and recover (for the timeout budget).
    pub max_restart_time: Duration,
    /// Retries of transient failures in begin, commit, recover and checkpoint-store calls.
    pub retry: RetryPolicy,
}

impl Default for DriverConfig {
    /// 10 s checkpoint interval, 5 min restart budget, default retries.
    fn default() -> Self {
        Self {
            checkpoint_interval: Duration::from_secs(10),
            max_restart_time: Duration::from_secs(300),
            retry: RetryPolicy::default(),
        }
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
/// Usage: [`Driver::add_sink`] each sink, [`Driver::start`] once, then [`Driver::write`] batches and call
/// [`Driver::checkpoint`] with the source positions the written batches reach; [`Driver::close`] at the end.
/// Dropping a driver without `close` behaves like a crash: an in-flight commit is cancelled, and the next start
/// recovers it.
pub struct Driver<S> {
    store: S,
    config: DriverConfig,
    sinks: Vec<Box<dyn ErasedSink>>,
    current: CheckpointId,
    state: State,
    committing: Option<(CheckpointId, JoinHandle<Result<()>>)>,
    faults: Option<FaultInjector>,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Created,
    Running,
    /// Stopped by an error or an injected crash; the message says why.
    Failed(String),
}

impl<S: CheckpointStore> Driver<S> {
    /// A driver persisting records in `store`.
    pub fn new(store: S, config: DriverConfig) -> Self {
        Self {
            store,
            config,
            sinks: Vec::new(),
            current: CheckpointId(1),
            state: State::Created,
            committing: None,
            faults: None,
        }
    }

    /// Crashes the driver where `faults` says so (for the conformance harness).
    pub fn with_fault_injector(mut self, faults: FaultInjector) -> Self {
        self.faults = Some(faults);
        self
    }

    /// Adds a sink before [`Driver::start`]; returns its index for [`Driver::write`]. Sink ids must be unique.
    pub fn add_sink<T: TwoPhaseCommit>(&mut self, sink: T) -> Result<usize> {
        let id = TwoPhaseCommit::sink_id(&sink).clone();
        if self.state != State::Created {
            return Err(
                Error::new(ErrorKind::Bug, Phase::Setup, "add_sink after start").with_sink(&id),
            );
        }
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

    /// Checks the timeout budget, loads the last durable record, recovers every sink from it (commit its
    /// committables, abort everything else), opens the next checkpoint's transactions, and returns the positions
    /// to resume from.
    pub async fn start(&mut self) -> Result<Restored> {
        if self.state != State::Created {
            return Err(Error::new(
                ErrorKind::Bug,
                Phase::Setup,
                "start called twice",
            ));
        }
        for sink in &self.sinks {
            budget::check(
                sink.sink_id(),
                sink.transaction_timeout(),
                self.config.checkpoint_interval,
                self.config.max_restart_time,
            )?;
        }
        let retry = self.config.retry;
        let record = retry
            .run("load checkpoint", || self.store.load_latest())
            .await?;
        let checkpoint = record.as_ref().map(|r| r.id);
        for sink in &mut self.sinks {
            let restored = record.as_ref().and_then(|r| {
                r.committables
                    .get(sink.sink_id())
                    .map(|v| (r.id, v.clone()))
            });
            let id = sink.sink_id().clone();
            let mut attempts = retry.attempts();
            loop {
                match sink.recover(restored.clone()).await {
                    Err(e) if attempts.retry("recover", &e).await => {}
                    outcome => break outcome.map_err(|e| e.or_sink(&id))?,
                }
            }
        }
        // Each start consumes a checkpoint id durably, so no id is ever used twice: a crashed attempt may have begun
        // (and, at-least-once, even committed) the checkpoint after the restored one, and a sink that recognises
        // replays by checkpoint id must never mistake the new attempt's data for it.
        let positions = record.map(|r| r.positions).unwrap_or_default();
        let start = CheckpointRecord {
            id: checkpoint.map_or(CheckpointId(1), CheckpointId::next),
            positions: positions.clone(),
            committables: BTreeMap::new(),
        };
        retry
            .run("save start record", || self.store.save(&start))
            .await
            .map_err(|e| e.or_checkpoint(start.id))?;
        self.current = start.id.next();
        self.begin_all().await?;
        self.state = State::Running;
        Ok(Restored {
            checkpoint,
            positions,
        })
    }

    /// Writes `batch` to the sink at index `sink` (from [`Driver::add_sink`]).
    ///
    /// # Errors
    /// A [`BadRecord`](ErrorKind::BadRecord) error leaves the driver usable (the batch was refused whole, so the
    /// caller can dead-letter it); any other error stops the driver.
    pub async fn write(&mut self, sink: usize, batch: &RecordBatch) -> Result<()> {
        self.ensure_running()?;
        let current = self.current;
        let target = self.sinks.get_mut(sink).ok_or_else(|| {
            Error::new(
                ErrorKind::Bug,
                Phase::Write,
                format!("no sink with index {sink}"),
            )
        })?;
        let id = target.sink_id().clone();
        let result = target
            .write(batch)
            .await
            .map_err(|e| e.or_sink(&id).or_checkpoint(current));
        if let Err(e) = &result
            && e.kind() != ErrorKind::BadRecord
        {
            self.fail(e);
        }
        result
    }

    /// Completes the current checkpoint, whose writes reach `positions` in the source, and opens the next one.
    /// Returns once the record is durable and the next checkpoint is open; the commit runs on in the background
    /// and is awaited by the next `checkpoint` or by [`Driver::close`].
    ///
    /// # Errors
    /// A failure before the record is durable aborts the checkpoint in every sink: restart and replay from the
    /// last durable checkpoint. A failed commit of the *previous* checkpoint is reported here (the record of that
    /// checkpoint stays the newest, so recovery commits it on restart).
    pub async fn checkpoint(&mut self, positions: Vec<SourceOffset>) -> Result<CheckpointId> {
        self.ensure_running()?;
        let id = self.current;
        let mut committables = BTreeMap::new();
        let mut pending: Vec<Box<dyn PendingCommit>> = Vec::with_capacity(self.sinks.len());
        for i in 0..self.sinks.len() {
            let sink_id = self.sinks[i].sink_id().clone();
            match self.sinks[i].pre_commit(id).await {
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
            self.inject(FaultPoint::AfterPreCommit { sink: sink_id })?;
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
        if let Err(e) = retry
            .run("save checkpoint", || self.store.save(&record))
            .await
        {
            return Err(self.abort_checkpoint(e.or_checkpoint(id)).await);
        }
        // Checkpoint `id` is decided: committed, whatever happens next.
        self.inject(FaultPoint::AfterRecordDurable)?;
        let faults = self.faults.clone();
        let task = tokio::spawn(async move {
            for commit in pending {
                let sink = commit.sink_id().clone();
                retry
                    .run("commit", || commit.commit())
                    .await
                    .map_err(|e| e.or_sink(&sink).or_checkpoint(id))?;
                let point = FaultPoint::AfterCommit { sink };
                if faults.as_ref().is_some_and(|f| f(id, &point)) {
                    return Err(crash_error(&point));
                }
            }
            Ok(())
        });
        self.committing = Some((id, task));
        self.current = id.next();
        self.begin_all().await?;
        Ok(id)
    }

    /// Waits for the last checkpoint's commit to finish. [`Driver::checkpoint`] and [`Driver::close`] do this
    /// themselves; call it to know that everything checkpointed so far is visible.
    pub async fn finish_commit(&mut self) -> Result<()> {
        let Some((id, task)) = self.committing.take() else {
            return Ok(());
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
        outcome
    }

    /// Finishes the last commit and aborts the open transactions (records written since the last checkpoint are
    /// discarded: checkpoint first to keep them).
    pub async fn close(mut self) -> Result<()> {
        self.ensure_running()?;
        self.finish_commit().await?;
        let current = self.current;
        for sink in &mut self.sinks {
            let id = sink.sink_id().clone();
            sink.abort()
                .await
                .map_err(|e| e.or_sink(&id).or_checkpoint(current))?;
        }
        self.state = State::Failed("closed".into());
        Ok(())
    }

    async fn begin_all(&mut self) -> Result<()> {
        let (retry, current) = (self.config.retry, self.current);
        for i in 0..self.sinks.len() {
            let sink = &mut self.sinks[i];
            let id = sink.sink_id().clone();
            let mut attempts = retry.attempts();
            let outcome = loop {
                match sink.begin(current).await {
                    Err(e) if attempts.retry("begin", &e).await => {}
                    outcome => break outcome,
                }
            };
            if let Err(e) = outcome {
                let e = e.or_sink(&id).or_checkpoint(current);
                self.fail(&e);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Presumed abort: discards the current checkpoint in every sink, stops the driver, and returns `cause`.
    /// Abort failures are logged, not returned: `cause` is what to report, and recovery aborts what is left.
    async fn abort_checkpoint(&mut self, cause: Error) -> Error {
        self.fail(&cause);
        let current = self.current;
        for sink in &mut self.sinks {
            if let Err(e) = sink.abort().await {
                tracing::error!(sink = %sink.sink_id(), checkpoint = %current, error = %crate::Report(&e),
                    "abort after a failed checkpoint failed; recovery will abort the transaction");
            }
        }
        cause
    }

    fn inject(&mut self, point: FaultPoint) -> Result<()> {
        if self
            .faults
            .as_ref()
            .is_some_and(|f| f(self.current, &point))
        {
            let e = crash_error(&point);
            self.fail(&e);
            return Err(e);
        }
        Ok(())
    }

    fn fail(&mut self, cause: &Error) {
        if self.state == State::Running || self.state == State::Created {
            self.state = State::Failed(crate::Report(cause).to_string());
        }
    }

    fn ensure_running(&self) -> Result<()> {
        match &self.state {
            State::Running => Ok(()),
            State::Created => Err(Error::new(
                ErrorKind::Bug,
                Phase::Setup,
                "Driver::start must run before writing or checkpointing",
            )),
            State::Failed(why) => Err(Error::new(
                ErrorKind::Fatal,
                Phase::Setup,
                format!(
                    "the driver stopped ({why}); restart the job so recovery can resolve what was in flight"
                ),
            )),
        }
    }
}

impl<S> Drop for Driver<S> {
    fn drop(&mut self) {
        if let Some((_, task)) = self.committing.take() {
            task.abort();
        }
    }
}

fn crash_error(point: &FaultPoint) -> Error {
    Error::new(
        ErrorKind::Fatal,
        Phase::Checkpoint,
        format!("injected crash {point}"),
    )
}
