//! The two-phase-commit contract every sink implements.

use std::fmt::Debug;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use serde::{Serialize, de::DeserializeOwned};

use crate::{CheckpointId, Error, ErrorKind, Phase, RecoveryPlan, Result, SinkId};

/// The commit half of a sink: makes pre-committed transactions visible, and probes whether they are.
///
/// Split from [`TwoPhaseCommit`] so that the driver can commit checkpoint N on its own task while the sink
/// already writes checkpoint N+1. A committer is cheap to clone and shares the sink's connections.
#[async_trait]
pub trait Committer: Send + Sync + 'static {
    /// What one pre-committed transaction is identified by (the sink's committable).
    type Committable: Send + Sync + 'static;

    /// Makes the given pre-committed transactions visible. Called only after the checkpoint record that holds
    /// them is durable, possibly by a different process than the one that pre-committed them.
    ///
    /// # Idempotence
    /// Committing an already-committed transaction succeeds.
    ///
    /// # Errors
    /// Never swallowed: the checkpoint is decided, so the driver retries [`Retryable`](ErrorKind::Retryable)
    /// errors and stops on others; an outcome that cannot be known is an error carrying the checkpoint and the
    /// transaction. A transaction the external system already aborted (its timeout expired) is a
    /// [`Fatal`](ErrorKind::Fatal) error naming the lost checkpoint.
    async fn commit(&self, committables: Vec<Self::Committable>) -> Result<()>;

    /// Asks the external system whether the transaction behind `committable` is visible.
    async fn is_committed(&self, committable: &Self::Committable) -> Result<bool>;
}

/// A sink that writes into an external transaction and commits it in two phases, tied to checkpoints.
///
/// One instance serves one subtask of one sink. The [`Driver`](crate::Driver) calls, per checkpoint `N`:
/// `begin(N)`, `write(..)`*, `pre_commit(N)`, then, once the checkpoint record holding the committable is durable,
/// [`Committer::commit`] (on its own task, overlapping `begin(N+1)` and its writes). On start it calls `recover(..)`
/// once, before the first `begin` ([`plan_recovery`](Self::plan_recovery), then
/// [`execute_recovery`](Self::execute_recovery)).
///
/// # Contract
/// What every sink must do:
/// - After `pre_commit` returns, the transaction survives the death of this process and can be committed by *any*
///   process from the [`Committable`](Self::Committable) alone; until then it can still be aborted.
/// - Nothing written becomes visible to readers of the external system before commit.
/// - Recovery is a [`RecoveryPlan`]: [`plan_recovery`](Self::plan_recovery) computes it read-only (it is what
///   `ratchet inspect` shows) and [`execute_recovery`](Self::execute_recovery) carries out exactly that plan's
///   commits. Every item the plan marks for abort is gone afterwards, and so is anything a zombie prepared
///   after the plan was made.
/// - After recovery, an older instance of the same sink and subtask (a zombie) can no longer make anything
///   visible: the sink fences it.
/// - Recovery accepts committables of *any* subtask of the sink (a subtask taken over from another, a job
///   rescaled) and commits them exactly once, even if that subtask's own recovery commits them too.
/// - Recovery needs no in-memory state: a fresh instance, built from configuration alone, recovers.
///
/// What sinks may differ on:
/// - the order of fence and commit ([`FenceOrder`](crate::FenceOrder)), provided nothing a zombie can still
///   prepare survives recovery; each sink documents its order in its plan's [`Fence`](crate::Fence);
/// - what they find and how they name it (prepared transactions, transactional ids, staged files, data files).
///
/// # Idempotence
/// `commit` and `recover` may run more than once for the same committables (a crash after commit but before the
/// driver learned of it, a replayed notification): committing what is already committed succeeds.
///
/// # Cancel safety
/// None of the methods is cancel safe: a future dropped mid-call leaves the transaction in an unknown state, which
/// only `recover` resolves.
///
/// The trait is object safe: `Box<dyn TwoPhaseCommit<Committable = C, Committer = K>>` works.
#[async_trait]
pub trait TwoPhaseCommit: Send + 'static {
    /// Everything needed to finish a pre-committed transaction from another process: a serde value stored in the
    /// checkpoint record.
    type Committable: Serialize + DeserializeOwned + Clone + Debug + Send + Sync + 'static;

    /// The commit half of this sink.
    type Committer: Committer<Committable = Self::Committable> + Clone;

    /// The sink this instance belongs to.
    fn sink_id(&self) -> &SinkId;

    /// A committer sharing this instance's connections.
    fn committer(&self) -> Self::Committer;

    /// The external system's transaction timeout, where it has one: a transaction older than this is aborted by
    /// the external system. The driver refuses to start when checkpoint interval + maximum restart time exceeds it.
    fn transaction_timeout(&self) -> Option<Duration> {
        None
    }

    /// Whether `recover` must be given `committables` of the restored checkpoint even though the checkpoint store
    /// notes that checkpoint committed: `true` when their commit left data for a later commit to make visible (the
    /// Iceberg sink committing one snapshot every K checkpoints carries the files of the checkpoints in between
    /// in the next committables, and marks them so). Decided from the committables, not from the sink's current
    /// settings, so a job whose settings changed since (a lower K) still finishes what its record carries. Such a
    /// sink's `recover` must be idempotent for committables it already made visible. The default, `false`, suits
    /// every sink whose commit makes everything visible: a committed checkpoint is not handed back (the external
    /// system may have forgotten the transaction since).
    fn restore_committed(&self, committables: &[Self::Committable]) -> bool {
        let _ = committables;
        false
    }

    /// Whether this instance holds data of decided checkpoints that their commits deferred to a later commit (the
    /// Iceberg sink committing one snapshot every K checkpoints, between two snapshots). A job keeps taking
    /// checkpoints while a sink does, even when no record arrives, so that the data becomes visible within K
    /// checkpoint intervals instead of waiting for the next record. The default, `false`, suits every sink whose
    /// commit makes everything visible.
    fn holds_deferred(&self) -> bool {
        false
    }

    /// The guarantee this instance runs with ([`GuaranteedSink`](crate::GuaranteedSink) says which; a sink that is
    /// weaker by itself says so too). The driver records it with every committable, so that recovery follows the
    /// guarantee a checkpoint was decided under, not the one the sink runs with after a change of settings: a
    /// checkpoint decided exactly-once is committed whatever the sink runs with now.
    fn delivery(&self) -> crate::DeliveryGuarantee {
        crate::DeliveryGuarantee::ExactlyOnce
    }

    /// The newest checkpoint of this instance's subtask that the external system itself records as committed
    /// (the Iceberg table's snapshot ledger, the JDBC sink's commit markers), for a sink that keeps such a record;
    /// `None` otherwise. Read-only; asked before recovery. The driver refuses to start when it is above every
    /// checkpoint the checkpoint store holds (more than one above for an at-least-once sink, which commits before
    /// the record): the store is then not the one this sink's state was written with (a new or reset store,
    /// another job with the same identity), and going on would skip checkpoint ids the external system already
    /// shows, or mix two jobs' data.
    ///
    /// # Errors
    /// The external system cannot be read.
    async fn recorded_checkpoint(&mut self) -> Result<Option<CheckpointId>> {
        Ok(None)
    }

    /// The version of the committable format this release writes. Raise it when the format changes, and teach
    /// [`decode_committable`](Self::decode_committable) to read the older versions.
    fn committable_version(&self) -> u32 {
        1
    }

    /// Reads a committable written with format `version` (by this release or an older one).
    ///
    /// # Errors
    /// [`Fatal`](ErrorKind::Fatal) for a version this release cannot read (written by a newer release).
    fn decode_committable(
        &self,
        version: u32,
        value: serde_json::Value,
    ) -> Result<Self::Committable> {
        let current = self.committable_version();
        if version != current {
            return Err(Error::new(
                ErrorKind::Fatal,
                Phase::Recover,
                format!(
                    "the checkpoint holds committables of format version {version}, this release reads version \
                     {current}: restore with the release that wrote the checkpoint"
                ),
            )
            .with_sink(self.sink_id()));
        }
        serde_json::from_value(value).map_err(|e| {
            Error::new(
                ErrorKind::Fatal,
                Phase::Recover,
                "the checkpoint holds a committable this sink cannot read",
            )
            .with_sink(self.sink_id())
            .with_source(e)
        })
    }

    /// Opens a transaction for checkpoint `checkpoint` in the external system.
    ///
    /// # Errors
    /// [`ErrorKind::Retryable`] when the external system is unreachable;
    /// [`ErrorKind::Fenced`] when a newer instance owns the transaction handle.
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()>;

    /// Writes a batch into the open transaction. May buffer; memory is bounded, and it awaits (backpressure)
    /// rather than buffer without limit.
    ///
    /// # Errors
    /// [`ErrorKind::BadRecord`] for input that cannot be written, naming the field;
    /// [`ErrorKind::MustAbort`] when the transaction was lost.
    async fn write(&mut self, batch: &RecordBatch) -> Result<()>;

    /// Writes deletions into the open transaction, for a sink that can express one: a record per key saying the
    /// key is deleted (the Kafka sink writes a tombstone, the key with a null value). A source hands these out for
    /// records whose value is null where its rows cannot hold them (a JSON or Avro decoding: no fields to
    /// decode). Returns `false`, writing nothing, for a sink that cannot express a deletion (the default): the
    /// caller skips them there, and counts them.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    async fn write_tombstones(&mut self, keys: &[Option<Vec<u8>>]) -> Result<bool> {
        let _ = keys;
        Ok(false)
    }

    /// Takes `schema` for every batch written from now on: the schema this instance was built with (or last took)
    /// with new nullable columns added, and columns widened or made nullable (a source's reader schema changed;
    /// [`SchemaChange::to_make`](crate::SchemaChange::to_make) checks what the sink's `evolution` allows). Called by
    /// [`Driver::evolve`](crate::Driver::evolve) at a checkpoint boundary: every earlier checkpoint is committed and
    /// the open transaction holds nothing yet. The sink makes the external system hold the new columns and types
    /// (`ALTER TABLE .. ADD COLUMN` / `ALTER COLUMN .. TYPE`, an Iceberg schema update) before it returns, outside
    /// the open transaction, so no row with a value for a column ever reaches a table that cannot hold it.
    ///
    /// # Idempotence
    /// The external system may already have the columns (another instance evolved it, or this one did and crashed
    /// before the next checkpoint): evolving again succeeds. A sink built after a restart with the new schema does
    /// the same when it opens.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the sink when it does not evolve (the default; a sink's
    /// `evolution = "none"`) or the change is not one it can make (a column removed, a type changed);
    /// [`Retryable`](ErrorKind::Retryable) when the external system is unreachable.
    async fn evolve(&mut self, schema: SchemaRef) -> Result<()> {
        let added: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "sink {} cannot take a new schema (columns {}): it does not evolve",
                self.sink_id(),
                added.join(", ")
            ),
        ))
    }

    /// Flushes everything written for `checkpoint` and prepares the transaction; returns what commits it.
    ///
    /// # Errors
    /// Any error here leaves checkpoint `checkpoint` undecided: the driver aborts it everywhere and replays.
    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Self::Committable>;

    /// Makes the given pre-committed transactions visible: [`Committer::commit`] on this instance's committer.
    async fn commit(&mut self, committables: Vec<Self::Committable>) -> Result<()> {
        self.committer().commit(committables).await
    }

    /// Discards the open transaction, if any (everything written since `begin`).
    async fn abort(&mut self) -> Result<()>;

    /// Computes, read-only, what recovery does given `restored` (the committables of the last durable checkpoint,
    /// `None` on a fresh start): which restored committables it commits (those the external system does not show
    /// committed, [`RecoveryPlan::checking`]), what the subtask holds open in the external system (prepared or
    /// open transactions, staged files, open uploads) and what happens to each, and how it fences. Callable
    /// before recovery and while the job is down; changes nothing, fences nothing.
    ///
    /// A sink that keeps nothing outside the process plans with
    /// `RecoveryPlan::checking(&self.committer(), restored, Fence::nothing())`.
    ///
    /// # Errors
    /// The external system cannot be read.
    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<Self::Committable>)>,
    ) -> Result<RecoveryPlan<Self::Committable>>;

    /// Carries out `plan` (made by [`plan_recovery`](Self::plan_recovery) on this instance), before the first
    /// `begin`: commits `plan.commit`, aborts every other transaction this instance's subtask owns (the plan's
    /// aborts, and anything begun since the plan was made), and fences older instances of the same sink and
    /// subtask, in the order the plan's fence says.
    ///
    /// # Idempotence
    /// Running it twice with the same plan has the effect of running it once.
    async fn execute_recovery(&mut self, plan: RecoveryPlan<Self::Committable>) -> Result<()>;

    /// Resolves what crashed attempts left behind: [`plan_recovery`](Self::plan_recovery), then
    /// [`execute_recovery`](Self::execute_recovery). Not meant to be overridden.
    async fn recover(
        &mut self,
        restored: Option<(CheckpointId, Vec<Self::Committable>)>,
    ) -> Result<()> {
        let plan = self.plan_recovery(restored).await?;
        self.execute_recovery(plan).await
    }

    /// What recovery would do given `restored`, without the committables: the plan's
    /// [`summary`](RecoveryPlan::summary), for `ratchet inspect`. Read-only.
    ///
    /// # Errors
    /// The external system cannot be read.
    async fn inspect(
        &mut self,
        restored: Option<(CheckpointId, Vec<Self::Committable>)>,
    ) -> Result<crate::PlanSummary> {
        Ok(self.plan_recovery(restored).await?.summary())
    }

    /// Asks the external system whether the transaction behind `committable` is visible.
    async fn is_committed(&mut self, committable: &Self::Committable) -> Result<bool> {
        self.committer().is_committed(committable).await
    }
}
