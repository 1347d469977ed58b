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

mod budget;
mod erased;
mod fault;
mod restore;
mod stream;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use arrow_array::RecordBatch;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::task::JoinHandle;

pub(crate) use erased::ErasedSink;
pub use erased::committables_in;
pub use fault::{FaultAction, FaultInjector, FaultPoint, Faults, Step};
pub use stream::StreamEvent;

use self::budget::BudgetInputs;
pub use self::budget::TimeoutBudget;
use self::erased::PendingCommit;
use crate::fence;
use crate::{
    Action, CheckpointId, CheckpointRecord, CheckpointStore, DynSink, Error, ErrorKind, OwnerEpoch,
    Phase, Report, Result, RetryPolicy, SourceOffset, TwoPhaseCommit, action_after_retries,
};

/// Histogram of one sink's commit of one checkpoint (seconds, label `sink`), from the checkpoint record being
/// durable to the sink's commit returning: the latency until the checkpoint is visible there.
pub const COMMIT_SECONDS: &str = "ratchet_commit_seconds";

/// A sink added to a [`Driver`]: what [`Driver::write`] takes to say which sink a batch goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SinkHandle {
    index: usize,
}

/// How the driver runs checkpoints.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// How often the caller checkpoints. The driver does not time checkpoints itself: the caller calls
    /// [`Driver::checkpoint`]; the driver uses this for the timeout budget.
    pub checkpoint_interval: Duration,
    /// The longest a crashed job may take to be restarted (for the timeout budget).
    pub max_restart_time: Duration,
    /// The longest recovery may take once the job restarted: enforced (a longer recovery fails, and the next start
    /// tries again), and a term of the timeout budget.
    pub max_recovery_time: Duration,
    /// How long other processes take to pick up a subtask of a process that went silent (its lease expires, its
    /// orphaned claim guard is ended): a term of the timeout budget when longer than `max_restart_time`. Zero for
    /// a job that runs in one process.
    pub takeover_time: Duration,
    /// The longest one sink or store call may take, enforced: a sink's `pre_commit` is abandoned after it (the
    /// checkpoint is aborted and replayed), its `begin` and `commit`, retries included, after the retry policy's
    /// worst case of it (a commit abandoned so stops the driver, and recovery commits the checkpoint); a store
    /// bounds its own calls by it ([`crate::PgStoreLimits`]). Writes are not bounded: they wait for the sink's
    /// backpressure. An `abort` is abandoned after it (recovery aborts what is left).
    pub max_call_time: Duration,
    /// Retries of transient failures in begin, commit, recover and checkpoint-store calls.
    pub retry: RetryPolicy,
}

impl Default for DriverConfig {
    /// 10 s checkpoint interval, 60 s restart and 60 s recovery budget, 15 s per call, default retries: a budget
    /// of about 8.5 min, inside the Kafka sink's default 10 min transaction timeout.
    fn default() -> Self {
        Self {
            checkpoint_interval: Duration::from_secs(10),
            max_restart_time: Duration::from_secs(60),
            max_recovery_time: Duration::from_secs(60),
            max_call_time: Duration::from_secs(15),
            takeover_time: Duration::ZERO,
            retry: RetryPolicy::default(),
        }
    }
}

impl DriverConfig {
    /// The timeout budget of this configuration: the longest a pre-committed transaction may wait for its
    /// commit, term by term (`ratchet check-config` prints it).
    pub fn budget(&self) -> TimeoutBudget {
        TimeoutBudget::new(&BudgetInputs {
            checkpoint_interval: self.checkpoint_interval,
            wait: self.retry.worst_case(self.max_call_time),
            max_restart_time: self.max_restart_time,
            takeover_time: self.takeover_time,
            max_recovery_time: self.max_recovery_time,
        })
    }
}

/// What the driver restored on start.
#[derive(Debug, Clone, PartialEq)]
pub struct Restored {
    /// The last durable checkpoint, `None` for a fresh job.
    pub checkpoint: Option<CheckpointId>,
    /// Where to resume reading the source (empty for a fresh job: start from the beginning).
    pub positions: Vec<SourceOffset>,
    /// The claim this instance holds: every record it saves is conditional on it.
    pub owner: OwnerEpoch,
}

/// A decided checkpoint's commit, on its own task: `Ok(Some(e))` when every sink committed but noting it in the
/// store failed with `e`.
type CommitTask = JoinHandle<Result<Option<Error>>>;

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
        let id = sink.sink_id().clone();
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
            let view = sink
                .inspect(restored, already_committed)
                .await
                .map_err(|e| e.or_sink(&id));
            sinks.push(crate::SinkInspection {
                sink: id,
                timeout: sink.transaction_timeout(),
                view,
            });
        }
        Ok(crate::Inspection {
            store,
            sinks,
            refusal,
        })
    }

    /// Checks every added sink's transaction timeout against the longest a pre-committed transaction may wait for
    /// its commit under this configuration (checkpoint interval, retries, restart and recovery time). `start` does
    /// this first; `ratchet check-config` does it without starting.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the sink and every term of the budget.
    pub fn check_budget(&self) -> Result<()> {
        let budget = self.config.budget();
        for sink in &self.sinks {
            budget.check(sink.sink_id(), sink.transaction_timeout())?;
        }
        Ok(())
    }

    /// Checks the timeout budget, claims the subtask in the store, loads the last durable record, recovers every
    /// sink from it (commit its committables, abort everything else), opens the next checkpoint's transactions, and
    /// returns the positions to resume from.
    ///
    /// # Errors
    /// [`Fenced`](ErrorKind::Fenced) when a newer instance claimed the subtask meanwhile: this instance must stop.
    /// [`Retryable`](ErrorKind::Retryable) after the retries when the store is unreachable or another instance is
    /// recovering: start again later. A sink's recovery error as the sink reports it.
    pub async fn start(&mut self) -> Result<Restored> {
        if self.state != State::Created {
            return Err(Error::new(
                ErrorKind::Bug,
                Phase::Setup,
                "start called twice",
            ));
        }
        self.check_budget()?;
        let outcome = self.claim_and_recover().await;
        if let Err(e) = &outcome {
            self.fail(e);
        }
        outcome
    }

    async fn claim_and_recover(&mut self) -> Result<Restored> {
        let retry = self.config.retry;
        let claim = retry.run("claim", || self.store.claim()).await?;
        let owner = claim.epoch;
        let loaded = retry.run("load checkpoint", || self.store.load()).await?;
        let record = loaded.record;
        let checkpoint = record.as_ref().map(|r| r.id);
        if let Some(committed) = loaded.committed_through
            && Some(committed) > checkpoint
        {
            // The newest records are damaged, and one of them was committed: resuming from an older one would
            // write that checkpoint's records a second time.
            return Err(Error::new(
                ErrorKind::Fatal,
                Phase::Recover,
                format!(
                    "checkpoint {committed} was committed, but its record is damaged or missing (the newest intact \
                     one is {}): falling back would write its records twice. Restore the record from a backup, or \
                     move the source positions past it by hand",
                    checkpoint.map_or("none".to_string(), |c| c.to_string())
                ),
            ));
        }
        // Each start consumes a checkpoint id durably, above every id present (a damaged newest record included),
        // so no id is ever used twice: a crashed attempt may have begun (and, at-least-once, even committed) the
        // checkpoint after the restored one, and a sink that recognises replays by checkpoint id must never mistake
        // the new attempt's data for it.
        let start_id = loaded
            .highest_id
            .max(checkpoint)
            .map_or(CheckpointId(1), CheckpointId::next);
        self.current = start_id;
        self.inject(FaultPoint::AfterLoad).await?;
        // A checkpoint the store notes as committed is not committed again: the external system may have forgotten
        // the transaction since (a Kafka transactional id expires), and recovery only has to abort leftovers. A
        // sink whose commits may defer visibility to a later commit gets it anyway (`restore_committed`); what each
        // sink gets is decided from its entry in the record (the guarantee it was decided under), not from the job
        // file as it is now.
        let already_committed = checkpoint.is_some() && loaded.committed_through >= checkpoint;
        restore::refuse_removed_sinks(&self.sinks, record.as_ref(), already_committed)?;
        restore::refuse_sinks_ahead(&mut self.sinks, loaded.highest_id.max(checkpoint)).await?;
        let limit = self.config.max_recovery_time;
        match tokio::time::timeout(
            limit,
            self.recover_sinks(&claim.guard, record.as_ref(), already_committed),
        )
        .await
        {
            Ok(recovered) => recovered?,
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Retryable,
                    Phase::Recover,
                    format!(
                        "recovery did not finish within max_recovery_time ({limit:?}); stopped (recovery is \
                         idempotent: the next start runs it again). Raise max_recovery_time if a sink's recovery \
                         legitimately takes longer (a large backlog of prepared transactions or staged files)"
                    ),
                ));
            }
        }
        drop(claim.guard);
        if let Some(checkpoint) = checkpoint.filter(|_| !already_committed)
            && let Err(e) = note_committed(&*self.store, retry, owner, checkpoint).await
        {
            tracing::warn!(%checkpoint, error = %Report(&e),
                "cannot note the recovered checkpoint as committed; the next recovery asks the sinks again");
        }
        let positions = record.map(|r| r.positions).unwrap_or_default();
        let start = CheckpointRecord {
            id: start_id,
            positions: positions.clone(),
            committables: BTreeMap::new(),
        };
        self.owner = Some(owner);
        save_decision(&*self.store, retry, owner, &start).await?;
        self.current = start.id.next();
        self.begin_all().await?;
        self.state = State::Running;
        tracing::info!(owner = owner.0, restored = ?checkpoint, next = %self.current,
            sinks = self.sinks.len(), "driver started: claimed the subtask and recovered every sink");
        Ok(Restored {
            checkpoint,
            positions,
            owner,
        })
    }

    /// Recovers every sink in turn from `record`, under `guard`: the claim is checked before each sink, and the
    /// sinks check it before each destructive step.
    async fn recover_sinks(
        &mut self,
        guard: &crate::ClaimGuard,
        record: Option<&CheckpointRecord>,
        already_committed: bool,
    ) -> Result<()> {
        let retry = self.config.retry;
        for i in 0..self.sinks.len() {
            let id = self.sinks[i].sink_id().clone();
            let restored = record
                .as_ref()
                .and_then(|r| r.committables.get(&id).map(|v| (r.id, v.clone())));
            // The claim is the fence: a recovery whose claim lapsed touches nothing (and the sinks check again
            // before each destructive step, through `ensure_claim_held`).
            guard
                .check()
                .await
                .map_err(|e| e.at_phase(Phase::Recover).or_sink(&id))?;
            let interrupt = FaultPoint::DuringRecover { sink: id.clone() };
            if self.fault_action(&interrupt).await == FaultAction::Crash {
                // Run the recovery up to its first suspension, then abandon it: a crash inside recover.
                let _ = first_poll(self.sinks[i].recover(restored, already_committed)).await;
                return Err(crash_error(&interrupt));
            }
            let mut attempts = retry.attempts();
            loop {
                let recovery = self.sinks[i].recover(restored.clone(), already_committed);
                match fence::recovering_under(guard.clone(), recovery).await {
                    Err(e) if attempts.retry("recover", &e).await => {}
                    outcome => break outcome.map_err(|e| e.or_sink(&id))?,
                }
            }
            self.inject(FaultPoint::AfterRecover { sink: id }).await?;
        }
        Ok(())
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
        tracing::debug!(checkpoint = %id, "checkpoint record durable; committing");
        self.inject(FaultPoint::AfterRecordDurable).await?;
        let faults = self.faults.clone();
        let store = self.store.clone();
        // Every sink commits at once, each with its own retries: a slow sink never eats another's transaction
        // timeout. A crash drill after one sink's commit abandons the others mid-flight, as a killed process would.
        // A commit still running after the budget's commit term stops the driver: the restart and the recovery
        // that commits it are the budget's next terms.
        let wait = self.config.retry.worst_case(self.config.max_call_time);
        let task = tokio::spawn(async move {
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
                metrics::histogram!(COMMIT_SECONDS, "sink" => sink.to_string())
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
        });
        self.committing = Some((id, std::time::Instant::now(), task));
        self.current = id.next();
        self.begin_all().await?;
        Ok(id)
    }

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
    async fn join_commit(&mut self) -> Result<Option<(CheckpointId, Error)>> {
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

    async fn begin_all(&mut self) -> Result<()> {
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
    async fn abort_checkpoint(&mut self, cause: Error) -> Error {
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

/// Saves a decision record, retrying transient and unknown outcomes (saving the identical record again is
/// idempotent).
///
/// # Errors
/// [`InDoubt`](ErrorKind::InDoubt) when some attempt's outcome was unknown and no later attempt settled it: the
/// caller must not abort. [`Fenced`](ErrorKind::Fenced) as the store reports it. Otherwise the record was
/// definitely not stored.
async fn save_decision<S: CheckpointStore + ?Sized>(
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

/// Notes `checkpoint` committed in the store, retrying transient failures; a failure only means the next recovery
/// asks the sinks again.
async fn note_committed<S: CheckpointStore + ?Sized>(
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

/// `call` bounded by `limit`: when it does not finish in time it is dropped (like a crash at that point) and the
/// result is an error of `kind` in `phase` saying what ran out of time.
async fn within<T>(
    limit: Duration,
    phase: Phase,
    kind: ErrorKind,
    what: &str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(Error::new(
            kind,
            phase,
            format!("{what} did not finish within {limit:?}; abandoned"),
        ))
    })
}

/// Polls `future` once: its output if it finished, `None` if it suspended (and is then dropped).
async fn first_poll<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        Poll::Ready(match future.as_mut().poll(cx) {
            Poll::Ready(output) => Some(output),
            Poll::Pending => None,
        })
    })
    .await
}

fn crash_error(point: &FaultPoint) -> Error {
    Error::new(
        ErrorKind::Fatal,
        Phase::Checkpoint,
        format!("injected crash {point}"),
    )
}
