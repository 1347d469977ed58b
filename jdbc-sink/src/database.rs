//! What the sink needs from a database, one implementation per dialect ([`crate::pg`], [`crate::mysql`]).
//!
//! Two connections per sink instance: the writer's [`Session`], which holds the open transaction of the current
//! checkpoint, and the [`Coordinator`], which finishes prepared transactions (from any session, so also those of
//! a dead process), lists them, and claims the owner row. They are separate because the driver commits
//! checkpoint N on its own task while the writer already fills checkpoint N+1's transaction.

use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::{CheckpointId, Result, SinkScope, SubtaskId};

use crate::Xid;

/// The table holding one row per sink subtask: its owner epoch (raised by every recovery) and the last checkpoint
/// it applied. Every checkpoint transaction updates its row *where the epoch is still its own*: that is the
/// fencing (an older instance's update matches nothing), and the row lock it takes is held until the transaction
/// ends, so a recovery's epoch raise waits for (and then resolves) a transaction that fenced itself in before it.
pub(crate) const OWNERS_TABLE: &str = "ratchet_sink_owners";
/// The table of commit markers: one row `(sink, subtask, checkpoint)` per prepared transaction, written inside it,
/// so a marker is visible exactly when its transaction committed.
pub(crate) const MARKERS_TABLE: &str = "ratchet_xa_commits";
/// Markers older than this many checkpoints are deleted by later transactions of the same subtask (a restored
/// checkpoint is always one of the newest).
pub(crate) const MARKERS_KEPT: u64 = 1000;

/// When the append mode deletes expired ids from its dedup table: at the first checkpoint, then at most once a
/// minute (every dialect's session keeps one).
#[derive(Debug, Default)]
pub(crate) struct DedupCleanup {
    last: Option<std::time::Instant>,
}

impl DedupCleanup {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(60);

    /// Whether the cleanup is due.
    pub(crate) fn due(&self) -> bool {
        self.last.is_none_or(|at| at.elapsed() >= Self::EVERY)
    }

    /// Notes a cleanup that succeeded.
    pub(crate) fn done(&mut self) {
        self.last = Some(std::time::Instant::now());
    }
}

/// What committing a prepared transaction found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// This call committed it.
    Committed,
    /// It had been committed before (its marker is visible): nothing to do.
    AlreadyCommitted,
}

/// The writer's connection and the transaction of the current checkpoint.
#[async_trait]
pub(crate) trait Session: Send {
    /// Opens the transaction of `xid`'s checkpoint (XA mode: under that global id). Reconnects first when the
    /// connection was lost.
    async fn begin(&mut self, xid: &Xid) -> Result<()>;

    /// Writes `batch` into the open transaction (the dialect's bulk path). In the keyed modes a row that exists
    /// keeps its values in the `unchanged` columns (a change that did not carry them); a new row gets null there.
    ///
    /// # Errors
    /// [`BadRecord`](connector_api::ErrorKind::BadRecord) naming the column and key for a row the table refuses;
    /// [`Retryable`](connector_api::ErrorKind::Retryable) when the connection was lost (the transaction with it).
    async fn write(&mut self, batch: &RecordBatch, unchanged: &[String]) -> Result<()>;

    /// Keyed modes: deletes every row of the table inside the open transaction (a change stream's truncate), behind
    /// a savepoint like `write`.
    ///
    /// # Errors
    /// As [`delete`](Self::delete).
    async fn delete_all(&mut self) -> Result<()>;

    /// Upsert mode: deletes, inside the open transaction, every row whose key columns equal a row of `keys`
    /// (batches of the upsert key columns, in the mode's order: [`crate::keys::KeyDecoder`]'s output). Behind a
    /// savepoint like `write`: refused whole or applied whole.
    ///
    /// # Errors
    /// [`BadRecord`](connector_api::ErrorKind::BadRecord) naming the table when it refuses a deletion (a foreign
    /// key); [`Retryable`](connector_api::ErrorKind::Retryable) when the connection was lost;
    /// [`Bug`](connector_api::ErrorKind::Bug) outside a transaction or in another mode.
    async fn delete(&mut self, keys: &[RecordBatch]) -> Result<()>;

    /// XA mode: updates the owner row at `epoch` (or fails [`Fenced`](connector_api::ErrorKind::Fenced) and rolls
    /// back), inserts the marker, and prepares the transaction under `xid`.
    async fn prepare(&mut self, xid: &Xid, epoch: u64) -> Result<()>;

    /// Upsert and append modes: updates the owner row at `epoch` with the checkpoint
    /// (or fails `Fenced` and rolls back), and commits.
    async fn apply(&mut self, xid: &Xid, epoch: u64) -> Result<()>;

    /// Rolls the open transaction back, if there is one.
    async fn rollback(&mut self) -> Result<()>;
}

/// A prepared transaction found in the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Its global id.
    pub xid: Xid,
    /// How long ago it was prepared, when the database says (PostgreSQL does, MariaDB's `XA RECOVER` does not).
    pub age: Option<std::time::Duration>,
}

/// Operations on prepared transactions and the owner row, from a connection of their own.
#[async_trait]
pub(crate) trait Coordinator: Send + Sync {
    /// Commits the prepared transaction `xid`, idempotently: gone but its marker visible = committed before.
    ///
    /// # Errors
    /// [`Fatal`](connector_api::ErrorKind::Fatal) when it is neither prepared nor committed (rolled back outside
    /// Ratchet): the checkpoint's rows are lost, and the message names it.
    async fn commit_prepared(&self, xid: &Xid) -> Result<CommitOutcome>;

    /// Rolls back the prepared transaction `xid`; one that is not prepared (any more) is left alone.
    async fn rollback_prepared(&self, xid: &Xid) -> Result<()>;

    /// Every prepared transaction of `sink` in this database (all subtasks), oldest checkpoint first.
    async fn list_prepared(&self, sink: &SinkScope) -> Result<Vec<Prepared>>;

    /// Whether `xid`'s transaction committed (its marker is visible).
    async fn is_committed(&self, xid: &Xid) -> Result<bool>;

    /// The last checkpoint the upsert or append mode applied for `sink`/`subtask`.
    async fn applied_through(
        &self,
        sink: &SinkScope,
        subtask: SubtaskId,
    ) -> Result<Option<CheckpointId>>;

    /// Raises the owner epoch of `sink`/`subtask` and returns it; `None` when the owner row stayed locked for
    /// the lock timeout (a transaction that passed its fencing check is still open or prepared: list again).
    ///
    /// In the same transaction it deletes the subtask's markers of checkpoints after `kept_through` (all of them
    /// when `None`: a fresh start): no durable checkpoint holds those, so nothing will ask about them, and the
    /// checkpoint ids the job takes next must be free (a job whose checkpoint store was reset starts again from
    /// id 1).
    async fn claim_owner(
        &self,
        sink: &SinkScope,
        subtask: SubtaskId,
        kept_through: Option<CheckpointId>,
    ) -> Result<Option<u64>>;
}
