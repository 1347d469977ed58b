//! The checkpoint store of one subtask, as the job file's `[store]` says: a directory per subtask, or the
//! subtask's rows in the shared PostgreSQL tables.

use async_trait::async_trait;
use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, Claim, Loaded, LocalCheckpointStore,
    OwnerEpoch, PgCheckpointStore, Result, SubtaskId,
};

use crate::config::StoreConfig;

/// Records kept per subtask: the newest and a few before it, to fall back on if the newest is damaged.
const RETAIN: usize = 5;

/// One subtask's checkpoint store, of either kind.
pub enum SubtaskStore {
    /// `<path>/subtask-<n>`.
    Local(LocalCheckpointStore),
    /// The `(job, subtask)` rows of the shared tables.
    Postgres(Box<PgCheckpointStore>),
}

impl SubtaskStore {
    /// Opens the store of `subtask` of `job`.
    ///
    /// # Errors
    /// A directory that cannot be created, or a database that cannot be reached (named).
    pub async fn open(config: &StoreConfig, job: &str, subtask: SubtaskId) -> Result<Self> {
        Ok(match config {
            StoreConfig::Local { path } => Self::Local(LocalCheckpointStore::open(
                path.join(job).join(format!("subtask-{}", subtask.0)),
                RETAIN,
            )?),
            StoreConfig::Postgres { url } => Self::Postgres(Box::new(
                PgCheckpointStore::connect(url, job, subtask, RETAIN).await?,
            )),
        })
    }

    fn inner(&self) -> &dyn CheckpointStore {
        match self {
            Self::Local(store) => store,
            Self::Postgres(store) => store.as_ref(),
        }
    }
}

#[async_trait]
impl CheckpointStore for SubtaskStore {
    async fn claim(&self) -> Result<Claim> {
        self.inner().claim().await
    }

    async fn save(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<()> {
        self.inner().save(owner, record).await
    }

    async fn mark_committed(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()> {
        self.inner().mark_committed(owner, checkpoint).await
    }

    async fn load(&self) -> Result<Loaded> {
        self.inner().load().await
    }
}
