//! Checkpoint records, where they are kept, and who may write them.
//!
//! A checkpoint record holds the source positions to resume from and, for every sink, the committables of its
//! pre-committed transactions. Persisting it is the commit decision of the whole checkpoint.
//!
//! # Claims and fencing
//! One store holds the records of one *subtask* of one job (a directory, or the `(job, subtask)` rows of a shared
//! table), so that a worker can later move a subtask between processes. Before an instance recovers anything it
//! [`claim`](CheckpointStore::claim)s the subtask: the store raises the subtask's owner epoch atomically and hands
//! back the new value with a [`ClaimGuard`]. Every later [`save`](CheckpointStore::save) passes that epoch and is
//! refused with [`Fenced`](crate::ErrorKind::Fenced) once a newer claim exists, and the check and the insert are one
//! atomic step. So a zombie (paused, then resumed after its replacement recovered) or the slower of two instances
//! started at once can never decide a checkpoint: whatever it pre-committed stays undecided and the current
//! owner's recovery aborts it.
//!
//! Recovery itself is destructive (it aborts every transaction the subtask left open), so it must never run for a
//! stale claim: while an instance holds its [`ClaimGuard`], a newer claim waits, and the guard is only handed out
//! while the claim is still the newest. Claim, recovery, guard release is therefore one critical section per
//! subtask: either a recovery finishes before the next claim, or it never starts. A process paused while holding
//! the guard holds off its replacement until it resumes or dies (claims wait a bounded time, then fail with a
//! retryable error naming the lock): availability gives way to safety there, for the few seconds recovery takes.
//!
//! # Unknown outcomes
//! A save's outcome is either known (stored, or definitely not stored) or unknown (a reply was lost, an fsync after
//! the atomic link failed). Unknown is reported as [`InDoubt`](crate::ErrorKind::InDoubt): the record may be the
//! commit decision already, so the caller must not abort the checkpoint's transactions. It may retry the save
//! (saving the identical record again is a no-op that reports success) or stop and let recovery read what is
//! stored.

mod local;
mod record;

// The PostgreSQL store is the `checkpoint-postgres` crate: it implements [`CheckpointStore`] with
// [`CheckpointRecord::encode`] and [`newest_intact`], as any other store would.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use local::LocalCheckpointStore;
pub use record::{CheckpointRecord, SourceOffset, newest_intact};

use crate::{CheckpointId, Result};

/// Which claim of a subtask an instance holds: raised by every [`CheckpointStore::claim`], never lowered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OwnerEpoch(pub u64);

impl std::fmt::Display for OwnerEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Whether a claim still holds off newer claims: what recovery asks immediately before each destructive step.
#[async_trait]
pub trait HeldClaim: Send + Sync {
    /// `Ok` while no newer claim of the subtask can exist: the guard's lock is still held (its database session is
    /// alive and answers within the store's call limit) and the owner epoch is still this claim's.
    ///
    /// # Errors
    /// [`Fenced`](crate::ErrorKind::Fenced) when the claim lapsed (its session was ended by the server, a restart,
    /// a reset, or does not answer in time; or a newer epoch exists): the caller must stop without touching
    /// anything, since another instance may own the subtask now.
    async fn check(&self) -> Result<()>;
}

/// A claim that cannot lapse while its process lives (an exclusive file lock): the check always passes.
struct ProcessBound<T>(T);

#[async_trait]
impl<T: Send + Sync> HeldClaim for ProcessBound<T> {
    async fn check(&self) -> Result<()> {
        Ok(())
    }
}

/// Holds off newer claims of the subtask while alive (an exclusive file lock, or a row lock in an open database
/// transaction). Drop it when recovery is over; a process that dies releases it with its file descriptors or
/// connections. A guard held in a database session can lapse while its process lives (the server ends the
/// session): [`check`](Self::check) says whether it still holds.
#[derive(Clone)]
pub struct ClaimGuard {
    held: Arc<dyn HeldClaim>,
}

impl ClaimGuard {
    /// A guard whose claim is checked by `held`, released when the last clone is dropped.
    pub fn new(held: impl HeldClaim + 'static) -> Self {
        Self {
            held: Arc::new(held),
        }
    }

    /// A guard that holds as long as `held` is alive, which only the death of the process ends (a file lock).
    pub fn process_bound(held: impl Send + Sync + 'static) -> Self {
        Self::new(ProcessBound(held))
    }

    /// Whether the claim still holds; see [`HeldClaim::check`].
    ///
    /// # Errors
    /// [`Fenced`](crate::ErrorKind::Fenced) when it lapsed.
    pub async fn check(&self) -> Result<()> {
        self.held.check().await
    }
}

impl std::fmt::Debug for ClaimGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClaimGuard")
    }
}

/// A successful claim: the new owner epoch, and the guard to hold while recovering.
#[derive(Debug)]
pub struct Claim {
    /// The epoch every later save and mark passes.
    pub epoch: OwnerEpoch,
    /// Held off newer claims until dropped.
    pub guard: ClaimGuard,
}

/// What a store holds for its subtask when an instance starts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Loaded {
    /// The newest intact record, `None` for a fresh subtask.
    pub record: Option<CheckpointRecord>,
    /// The highest checkpoint id present, damaged records included: a new record must use a higher id, or it
    /// would collide with the damaged one forever.
    pub highest_id: Option<CheckpointId>,
    /// The newest checkpoint whose commit finished in every sink ([`CheckpointStore::mark_committed`]); every
    /// earlier checkpoint is committed too. Recovery does not ask the external systems about these again, which
    /// matters once they have forgotten the transaction (a Kafka transactional id expires after
    /// `transactional.id.expiration.ms`).
    pub committed_through: Option<CheckpointId>,
}

/// Durable storage for the checkpoint records of one subtask of one job, with ownership claims.
///
/// Implementations: [`LocalCheckpointStore`] (a directory, one machine) and `checkpoint_postgres::PgCheckpointStore` (a PostgreSQL
/// table shared by every worker of a job). See the module docs for the claim and unknown-outcome rules.
#[async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// Takes ownership of the subtask: atomically raises its owner epoch, durably, and returns the new value,
    /// higher than every epoch handed out before, with a guard that holds off newer claims until dropped. From
    /// then on saves of older epochs are refused.
    ///
    /// # Errors
    /// [`Retryable`](crate::ErrorKind::Retryable) when the store cannot be reached or another instance holds its
    /// claim guard (it is recovering, or paused while recovering); [`Fenced`](crate::ErrorKind::Fenced) when a
    /// newer claim overtook this one before its guard was taken. Retrying may hand out a higher epoch than an
    /// attempt whose reply was lost, which is harmless.
    async fn claim(&self) -> Result<Claim>;

    /// Persists `record` if `owner` is still the newest claim, atomically with that check. After `Ok` the record
    /// survives a crash of this process and of the machine. Saving an identical record again succeeds.
    ///
    /// # Errors
    /// - [`Fenced`](crate::ErrorKind::Fenced): a newer claim exists, or a *different* record is stored under this
    ///   id; nothing was stored. The caller must stop without aborting anything: another owner may need it.
    /// - [`Retryable`](crate::ErrorKind::Retryable): definitely not stored; retrying may succeed.
    /// - [`InDoubt`](crate::ErrorKind::InDoubt): maybe stored. Retrying is safe (it succeeds if the record is
    ///   there); giving up means stopping without aborting.
    async fn save(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<()>;

    /// Notes durably that `checkpoint` (and so every earlier one) is committed in every sink, if `owner` is still
    /// the newest claim. Never lowers the mark. A failure only means a later recovery asks the sinks again.
    async fn mark_committed(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()>;

    /// The subtask's newest claim, `None` if it was never claimed. Read-only: tells a process whose sink reported
    /// it fenced whether another process took the subtask over (a newer epoch) or the sink's transaction expired
    /// (the epoch is still its own).
    ///
    /// # Errors
    /// The store cannot be read.
    async fn owner(&self) -> Result<Option<OwnerEpoch>>;

    /// The newest intact record, the highest id present and the committed mark. A damaged newest record is
    /// refused with a logged error naming it, and the previous intact one is returned.
    async fn load(&self) -> Result<Loaded>;
}
