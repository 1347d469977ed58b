//! Checkpoint records and where they are kept.
//!
//! A checkpoint record holds the source positions to resume from and, for every sink, the committables of its
//! pre-committed transactions. Persisting it is the commit decision of the whole checkpoint.

mod local;
mod postgres;
mod record;

use async_trait::async_trait;

pub use local::LocalCheckpointStore;
pub use postgres::PgCheckpointStore;
pub use record::{CheckpointRecord, SourceOffset};

use crate::Result;

/// Durable storage for checkpoint records.
#[async_trait]
pub trait CheckpointStore: Send + Sync {
    /// Persists `record` atomically: after `Ok` it survives a crash of this process and of the machine; after an
    /// error, either the record was not stored or it is stored whole (never partially). Saving the same record
    /// again succeeds; saving a *different* record under an id that is already stored is refused
    /// ([`Fenced`](crate::ErrorKind::Fenced)): the commit decision of a checkpoint is never overwritten.
    async fn save(&self, record: &CheckpointRecord) -> Result<()>;

    /// The newest intact record, or `None` for a fresh job. A damaged newest record is refused with a logged error
    /// naming it and the previous intact one is returned.
    async fn load_latest(&self) -> Result<Option<CheckpointRecord>>;
}
