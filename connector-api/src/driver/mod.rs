//! The driver: runs the checkpoint protocol over one or more sinks.
//!
//! Checkpoint `N`: `pre_commit` every sink → wait for checkpoint `N-1`'s commit to finish → persist the checkpoint
//! record (the commit decision), conditional on this instance's claim → start committing `N` on a background task,
//! every sink at once (which notes "committed through N" in the store when done) → `begin(N+1)` and return, so the caller writes `N+1`
//! while `N` commits. A failure before the record is durable aborts `N` in every sink (presumed abort); after it,
//! `N` is decided, and if its commit fails, recovery on the next start commits it.
//!
//! On start the driver checks the timeout budget, *claims* the subtask in the checkpoint store (fencing every older
//! instance's saves, and holding off newer claims while it recovers), loads the last record, recovers every sink
//! from it (commit its committables unless the store notes them committed, abort everything else), releases the
//! claim guard, durably consumes one checkpoint id (a record with the restored positions and no transactions) so
//! that no checkpoint id is ever reused by a later attempt, and hands back the source positions to resume from.
//!
//! # What the driver does about an error
//! One table, in [`crate::error`]: [`action`](crate::action) of the error's kind and phase decides retry,
//! abort-and-replay, stop, stop-without-aborting or dead-letter, and the driver follows it everywhere.
//!
//! After any error except [`ErrorKind::BadRecord`], the driver refuses further work: restart the job (build a new
//! driver and call [`Driver::start`]) so recovery resolves what the failure left.
//!
//! # Layout
//! One file per protocol step: `start.rs` (budget check, claim, load, recovery under the claim), `checkpoint.rs`
//! (pre-commit, the decision, presumed abort, opening the next checkpoint), `commit.rs` (the decided checkpoint's
//! commit on its own task, and the committed mark); `evolve.rs` (a schema change between checkpoints); `config.rs` and `budget.rs` (limits and the timeout budget),
//! `restore.rs` (what a restored record allows), `fault.rs` (fault points), `erased.rs` (sinks behind one object
//! type), `stream.rs` (batches and barriers in one call). This file: the driver's state, writes, close.

mod budget;
mod checkpoint;
mod commit;
mod config;
mod erased;
mod evolve;
mod fault;
mod ignored;
mod restore;
mod start;
mod stream;

use std::future::Future;
use std::sync::Arc;

use arrow_array::RecordBatch;

pub(crate) use erased::ErasedSink;
pub use erased::committables_in;
pub use fault::{FaultAction, FaultInjector, FaultPoint, Faults, Step};
pub(crate) use ignored::{IgnoringSink, Kept};
pub use stream::StreamEvent;

pub use self::budget::TimeoutBudget;
use self::checkpoint::{save_decision, within};
use self::commit::CommitTask;
pub use self::config::DriverConfig;
use self::fault::crash_error;
pub use self::start::{Restored, SinksForRecord};
use crate::{
    Action, CheckpointId, CheckpointStore, DynSink, Error, ErrorKind, OwnerEpoch, Phase, Report,
    Result, TwoPhaseCommit,
};

/// A sink added to a [`Driver`]: what [`Driver::write`] takes to say which sink a batch goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SinkHandle {
    index: usize,
}

/// Runs checkpoints over a set of sinks and a checkpoint store.
///
/// Usage: [`Driver::add_sink`] each sink, [`Driver::start`] once, then [`Driver::write`] batches and call
/// [`Driver::checkpoint`] with the source positions the written batches reach; [`Driver::close`] at the end.
/// Dropping a driver without `close` behaves like a crash: an in-flight commit is cancelled, and the next start
/// recovers it.
pub struct Driver<S> {
    store: Arc<S>,
    config: DriverConfig,
    sinks: Vec<Box<dyn ErasedSink>>,
    current: CheckpointId,
    owner: Option<OwnerEpoch>,
    state: State,
    /// The decided checkpoint whose commit runs on a background task, when its record became durable, and the
    /// task.
    committing: Option<(CheckpointId, std::time::Instant, CommitTask)>,
    faults: Option<FaultInjector>,
    /// Labels of every metric this driver records ([`crate::metrics`]).
    labels: Vec<::metrics::Label>,
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
            store: Arc::new(store),
            config,
            sinks: Vec::new(),
            current: CheckpointId(1),
            owner: None,
            state: State::Created,
            committing: None,
            faults: None,
            labels: Vec::new(),
        }
    }

    /// Crashes or pauses the driver where `faults` says so (for the conformance harness).
    pub fn with_fault_injector(mut self, faults: FaultInjector) -> Self {
        self.faults = Some(faults);
        self
    }

    /// Adds a sink (run exactly-once) before [`Driver::start`]; returns its handle for [`Driver::write`]. Sink ids
    /// must be unique within a job. Wrap it in a [`GuaranteedSink`](crate::GuaranteedSink), or add a
    /// [`DynSink`], for another delivery guarantee.
    pub fn add_sink<T: TwoPhaseCommit>(&mut self, sink: T) -> Result<SinkHandle> {
        self.add_dyn_sink(DynSink(Box::new(sink)))
    }

    /// Adds a sink of any type (built by a [`SinkRegistry`](crate::SinkRegistry), or by [`DynSink::new`]) before
    /// [`Driver::start`]; returns its handle for [`Driver::write`].
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when another sink of the job has the same id; [`Bug`](ErrorKind::Bug) after
    /// `start`.
    pub fn add_dyn_sink(&mut self, sink: DynSink) -> Result<SinkHandle> {
        if self.state != State::Created {
            return Err(
                Error::new(ErrorKind::Bug, Phase::Setup, "add_sink after start")
                    .with_sink(sink.sink_id()),
            );
        }
        self.push_sink(sink)
    }

    /// Adds `sink` to the set, refusing a second sink of one id.
    fn push_sink(&mut self, sink: DynSink) -> Result<SinkHandle> {
        let id = sink.sink_id().clone();
        if self.sinks.iter().any(|s| s.sink_id() == &id) {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "two sinks share this id; give each sink of a job its own id",
            )
            .with_sink(&id));
        }
        self.sinks.push(sink.0);
        Ok(SinkHandle {
            index: self.sinks.len() - 1,
        })
    }

    /// The handle of the sink with id `sink`, if it was added.
    pub fn handle_of(&self, sink: &crate::SinkId) -> Option<SinkHandle> {
        self.sinks
            .iter()
            .position(|s| s.sink_id() == sink)
            .map(|index| SinkHandle { index })
    }

    /// The checkpoint whose transactions are open.
    pub fn current_checkpoint(&self) -> CheckpointId {
        self.current
    }

    /// Whether a sink holds data of decided checkpoints that a later commit makes visible
    /// ([`TwoPhaseCommit::holds_deferred`](crate::TwoPhaseCommit::holds_deferred)): a job checkpoints on while it
    /// does, records or not.
    pub fn holds_deferred(&self) -> bool {
        self.sinks.iter().any(|sink| sink.holds_deferred())
    }

    /// Reads, without claiming or changing anything, what the store holds for this subtask and what every sink
    /// holds open in its external system, with what recovery would do with each transaction. Before
    /// [`start`](Self::start) only; works while the job is down (and while it runs, as a snapshot).
    ///
    /// # Errors
    /// The store cannot be read, or the driver was started. A sink that cannot be read is reported in its entry.
    pub async fn inspect(&mut self) -> Result<crate::Inspection> {
        if self.state != State::Created {
            return Err(Error::new(
                ErrorKind::Bug,
                Phase::Setup,
                "inspect runs before start",
            ));
        }
        let store = self
            .config
            .retry
            .run("load checkpoint", || self.store.load())
            .await?;
        let checkpoint = store.record.as_ref().map(|r| r.id);
        let already_committed = checkpoint.is_some() && store.committed_through >= checkpoint;
        let refusal = match restore::refuse_removed_sinks(
            &self.sinks,
            store.record.as_ref(),
            already_committed,
        ) {
            Err(e) => Some(e),
            Ok(()) => {
                restore::refuse_sinks_ahead(&mut self.sinks, store.highest_id.max(checkpoint))
                    .await
                    .err()
            }
        };
        let mut sinks = Vec::with_capacity(self.sinks.len());
        for sink in &mut self.sinks {
            let id = sink.sink_id().clone();
            let restored = store
                .record
                .as_ref()
                .and_then(|r| r.committables.get(&id).map(|v| (r.id, v.clone())));
            let plan = sink
                .inspect(restored, already_committed)
                .await
                .map_err(|e| e.or_sink(&id));
            sinks.push(crate::SinkInspection {
                sink: id,
                timeout: sink.transaction_timeout(),
                plan,
            });
        }
        Ok(crate::Inspection {
            store,
            sinks,
            refusal,
        })
    }

    /// Labels every metric this driver records ([`crate::metrics`]) with `labels` (the worker: `subtask`).
    pub fn with_metric_labels(
        mut self,
        labels: impl IntoIterator<Item = (&'static str, String)>,
    ) -> Self {
        self.labels = labels
            .into_iter()
            .map(|(key, value)| ::metrics::Label::new(key, value))
            .collect();
        self
    }

    /// Sets [`PENDING_COMMIT_AGE`](crate::metrics::PENDING_COMMIT_AGE) to the age of the decided checkpoint whose
    /// commit still runs (0 when none): call it periodically, it is what an operator watches grow when a sink's
    /// commit hangs.
    pub fn record_pending_commit_age(&self) {
        let age = self
            .commit_in_flight()
            .map_or(0.0, |(_, age)| age.as_secs_f64());
        ::metrics::gauge!(crate::metrics::PENDING_COMMIT_AGE, self.labels.clone()).set(age);
    }

    /// Writes `batch` to `sink` (a handle from [`Driver::add_sink`] of this driver).
    ///
    /// # Errors
    /// A [`BadRecord`](ErrorKind::BadRecord) error leaves the driver usable (the batch was refused whole, so the
    /// caller can dead-letter it); any other error stops the driver.
    pub async fn write(&mut self, sink: SinkHandle, batch: &RecordBatch) -> Result<()> {
        let target = self.writable(sink)?;
        let result = target.write(batch).await;
        self.settle_write(sink, result)
    }

    /// Writes deletions of `keys` to `sink` ([`TwoPhaseCommit::write_tombstones`]); `false` when the sink cannot
    /// express a deletion (nothing written: the caller skips them there).
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn write_tombstones(
        &mut self,
        sink: SinkHandle,
        keys: &[Option<Vec<u8>>],
    ) -> Result<bool> {
        let target = self.writable(sink)?;
        let result = target.write_tombstones(keys).await;
        self.settle_write(sink, result)
    }

    /// The sink behind `sink`, while the driver runs.
    fn writable(&mut self, sink: SinkHandle) -> Result<&mut Box<dyn ErasedSink>> {
        self.ensure_running()?;
        self.sinks.get_mut(sink.index).ok_or_else(|| {
            Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "a sink handle of another driver",
            )
        })
    }

    /// A write's outcome, located (sink, checkpoint); any error but a refused batch stops the driver.
    fn settle_write<T>(&mut self, sink: SinkHandle, result: Result<T>) -> Result<T> {
        let id = self.sinks[sink.index].sink_id().clone();
        let result = result.map_err(|e| e.or_sink(&id).or_checkpoint(self.current));
        if let Err(e) = &result
            && e.action() != Action::DeadLetter
        {
            self.fail(e);
        }
        result
    }

    /// Whether another instance claimed the subtask since this one did (the store's newest epoch is not this
    /// instance's): tells a take-over apart from a sink that fenced this instance by itself (a Kafka transaction
    /// the broker expired).
    ///
    /// # Errors
    /// The store cannot be read; [`Bug`](ErrorKind::Bug) before [`Driver::start`] claimed the subtask.
    ///
    /// Borrows nothing of the driver across the wait (the driver is `Send`, not `Sync`).
    pub fn taken_over(&self) -> impl Future<Output = Result<bool>> + Send + use<S> {
        let (store, owner) = (self.store.clone(), self.owner);
        async move {
            let Some(owner) = owner else {
                return Err(Error::new(
                    ErrorKind::Bug,
                    Phase::Setup,
                    "taken_over asked before the driver claimed the subtask",
                ));
            };
            Ok(store.owner().await? != Some(owner))
        }
    }

    /// Finishes the last commit (noting it committed in the store) and aborts the open transactions (records
    /// written since the last checkpoint are discarded: checkpoint first to keep them).
    ///
    /// # Errors
    /// A failed commit or abort; and, after the open transactions were aborted, a commit that succeeded in every
    /// sink but could not be noted in the store after retries (nothing is lost: `ratchet inspect` shows the
    /// checkpoint as decided and not noted committed, and the next start asks the sinks).
    pub async fn close(mut self) -> Result<()> {
        self.ensure_running()?;
        let unnoted = self.join_commit().await?;
        let (current, limit) = (self.current, self.config.max_call_time);
        for sink in &mut self.sinks {
            let id = sink.sink_id().clone();
            within(
                limit,
                Phase::Abort,
                ErrorKind::Retryable,
                "abort (max_call_time)",
                sink.abort(),
            )
            .await
            .map_err(|e| e.or_sink(&id).or_checkpoint(current))?;
        }
        self.state = State::Failed("closed".into());
        match unnoted {
            None => Ok(()),
            Some((checkpoint, e)) => Err(Error::new(
                ErrorKind::Retryable,
                Phase::Checkpoint,
                "the last checkpoint is committed in every sink, but the checkpoint store could not note it after                  retries: nothing is lost; `ratchet inspect` shows it as decided and not noted committed, and the                  next start asks the sinks",
            )
            .with_checkpoint(checkpoint)
            .with_source(e)),
        }
    }

    /// What the fault injector says at `point`. Borrows nothing of the driver across the wait, so a driver's
    /// futures stay `Send` (the sinks are `Send`, not `Sync`) and a job can run it on a spawned task.
    fn fault_action(&self, point: &FaultPoint) -> impl Future<Output = FaultAction> + use<S> {
        let (faults, current, point) = (self.faults.clone(), self.current, point.clone());
        async move {
            match faults {
                Some(faults) => faults.at(current, &point).await,
                None => FaultAction::Continue,
            }
        }
    }

    async fn inject(&mut self, point: FaultPoint) -> Result<()> {
        if self.fault_action(&point).await == FaultAction::Crash {
            let e = crash_error(&point);
            self.fail(&e);
            return Err(e);
        }
        Ok(())
    }

    fn fail(&mut self, cause: &Error) {
        if self.state == State::Running || self.state == State::Created {
            self.state = State::Failed(Report(cause).to_string());
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
        if let Some((_, _, task)) = self.committing.take() {
            task.abort();
        }
    }
}
