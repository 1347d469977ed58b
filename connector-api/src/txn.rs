//! The two-phase-commit contract every sink implements.

use std::fmt::Debug;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use serde::{Serialize, de::DeserializeOwned};

use crate::{CheckpointId, Result, SinkId};

/// A sink that writes into an external transaction and commits it in two phases, tied to checkpoints.
///
/// One instance serves one subtask of one sink. The [`Driver`](crate::Driver) calls, per checkpoint `N`:
/// `begin(N)`, `write(..)`*, `pre_commit(N)`, then (after the checkpoint record holding the committable is durable)
/// `commit(..)`. On start it calls `recover(..)` once, before the first `begin`.
///
/// # Contract
/// - After `pre_commit` returns, the transaction survives the death of this process and can be committed by *any*
///   process from the [`Committable`](Self::Committable) alone; until then it can still be aborted.
/// - Nothing written becomes visible to readers of the external system before `commit`.
///
/// # Idempotence
/// `commit` and `recover` may run more than once for the same committables (a crash after commit but before the
/// driver learned of it, a replayed notification): committing what is already committed succeeds.
///
/// # Cancel safety
/// None of the methods is cancel safe: a future dropped mid-call leaves the transaction in an unknown state, which
/// only `recover` resolves.
#[async_trait]
pub trait TwoPhaseCommit: Send {
    /// Everything needed to finish a pre-committed transaction from another process: a serde value stored in the
    /// checkpoint record.
    type Committable: Serialize + DeserializeOwned + Clone + Debug + Send + Sync + 'static;

    /// The sink this instance belongs to.
    fn sink_id(&self) -> &SinkId;

    /// Opens a transaction for checkpoint `checkpoint` in the external system.
    ///
    /// # Errors
    /// [`ErrorKind::Retryable`](crate::ErrorKind::Retryable) when the external system is unreachable;
    /// [`ErrorKind::Fenced`](crate::ErrorKind::Fenced) when another instance owns the transaction handle.
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()>;

    /// Writes a batch into the open transaction. May buffer; bounded memory, and it awaits (backpressure) rather
    /// than buffer without limit.
    ///
    /// # Errors
    /// [`ErrorKind::BadRecord`](crate::ErrorKind::BadRecord) for input that cannot be written, naming the field;
    /// [`ErrorKind::MustAbort`](crate::ErrorKind::MustAbort) when the transaction was lost.
    async fn write(&mut self, batch: &RecordBatch) -> Result<()>;

    /// Flushes everything written for `checkpoint` and prepares the transaction; returns what commits it.
    ///
    /// # Errors
    /// Any error here leaves checkpoint `checkpoint` undecided: the driver aborts it everywhere and replays.
    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Self::Committable>;

    /// Makes the given pre-committed transactions visible. Called only after the checkpoint record that holds them
    /// is durable.
    ///
    /// # Idempotence
    /// Committing an already-committed transaction succeeds.
    ///
    /// # Errors
    /// A failure here must not be swallowed: the transaction is decided (committed) and the driver retries or
    /// stops; an outcome that cannot be known is an error carrying the checkpoint and the transaction.
    async fn commit(&mut self, committables: Vec<Self::Committable>) -> Result<()>;

    /// Discards the open transaction, if any (everything written since `begin`).
    async fn abort(&mut self) -> Result<()>;

    /// Resolves what crashed attempts left behind, before the first `begin`: commits `restored` (the committables
    /// of the last durable checkpoint, `None` on a fresh start) and aborts every other transaction this instance
    /// owns, including ones begun after that checkpoint.
    ///
    /// # Idempotence
    /// Running it twice with the same input has the effect of running it once.
    async fn recover(
        &mut self,
        restored: Option<(CheckpointId, Vec<Self::Committable>)>,
    ) -> Result<()>;

    /// Asks the external system whether the transaction behind `committable` is visible.
    ///
    /// Takes `&mut self` so that sinks holding non-`Sync` writers (Parquet, Arrow) can implement it.
    async fn is_committed(&mut self, committable: &Self::Committable) -> Result<bool>;
}
