//! The checkpoint store of one subtask in one layout generation of its job, of whichever kind the job's store is
//! ([`JobStore::checkpoints`]), with the check every claim makes against the job's generation.

use std::sync::Arc;

use async_trait::async_trait;
use checkpoint_postgres::PgStoreLimits;
use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, Claim, Loaded, OwnerEpoch, Result, SubtaskId,
};

use super::JobStore;

/// One subtask's checkpoint store in one layout generation of its job ([`crate::job::rescale`]): every claim is
/// checked against the generation the job's record holds, so a process that still runs an older layout (a
/// subtask count the job was rescaled from) cannot claim a subtask and run on from positions that were
/// redistributed.
pub struct SubtaskStore {
    inner: Box<dyn CheckpointStore>,
    /// The job's state: what a claim is checked against.
    jobs: Arc<dyn JobStore>,
    generation: u64,
    /// Whether claims are checked against the job's generation (not while a rescale writes the next one).
    checked: bool,
}

impl SubtaskStore {
    /// Opens the store of `subtask` in layout `generation` of the job `jobs` holds; a PostgreSQL store's calls
    /// are bounded by `limits`.
    ///
    /// # Errors
    /// A directory that cannot be created, or a database that cannot be reached (named).
    pub async fn open(
        jobs: &Arc<dyn JobStore>,
        generation: u64,
        subtask: SubtaskId,
        limits: PgStoreLimits,
    ) -> Result<Self> {
        let inner = jobs
            .checkpoints(generation, subtask, limits, true)
            .await?
            .ok_or_else(|| {
                connector_api::Error::bug(
                    connector_api::Phase::Setup,
                    "the job store opened no checkpoint store although asked to create one",
                )
            })?;
        Ok(Self::of(inner, jobs, generation))
    }

    /// Opens the store of `subtask` in layout `generation` if it exists, creating nothing (no directory, no
    /// table): `None` when the subtask never ran. For `check-config`.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub async fn open_existing(
        jobs: &Arc<dyn JobStore>,
        generation: u64,
        subtask: SubtaskId,
        limits: PgStoreLimits,
    ) -> Result<Option<Self>> {
        let inner = jobs.checkpoints(generation, subtask, limits, false).await?;
        Ok(inner.map(|inner| Self::of(inner, jobs, generation)))
    }

    /// Opens the store of `subtask` in layout `generation` before the job switches to it: for the rescale writing
    /// the new layout's first records, whose claims are not checked against the job's generation (it is still
    /// the one before).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub async fn open_next_generation(
        jobs: &Arc<dyn JobStore>,
        generation: u64,
        subtask: SubtaskId,
        limits: PgStoreLimits,
    ) -> Result<Self> {
        let mut store = Self::open(jobs, generation, subtask, limits).await?;
        store.checked = false;
        Ok(store)
    }

    /// Saves `record` under a new claim of the subtask, for a command that holds the whole job (`rescale`,
    /// `forget-topic`) and rewrites the subtask's record. The claim's guard is let go before the save: on the
    /// local store it is the directory's lock, which the save takes itself. The job stays held (every lease, or
    /// the job's lock) meanwhile, so no other claim comes between; one that did would fence the save.
    ///
    /// # Errors
    /// The claim or the save fails (a newer claim fences the save).
    pub async fn save_under_new_claim(&self, record: &CheckpointRecord) -> Result<()> {
        let claim = self.claim().await?;
        drop(claim.guard);
        self.save(claim.epoch, record).await
    }

    fn of(inner: Box<dyn CheckpointStore>, jobs: &Arc<dyn JobStore>, generation: u64) -> Self {
        Self {
            inner,
            jobs: jobs.clone(),
            generation,
            checked: true,
        }
    }
}

#[async_trait]
impl CheckpointStore for SubtaskStore {
    /// Claims the subtask, then checks (under the claim) that the job is still in this store's layout
    /// generation: a rescale that switched the layout first makes this claim a refusal; one that has not switched
    /// yet sees this claim's newer epoch and gives up (see [`crate::job::rescale`]).
    async fn claim(&self) -> Result<Claim> {
        let claim = self.inner.claim().await?;
        if !self.checked {
            return Ok(claim);
        }
        let now = self.jobs.generation_within_bound().await?;
        if now != self.generation {
            return Err(connector_api::Error::new(
                connector_api::ErrorKind::Config,
                connector_api::Phase::Recover,
                format!(
                    "job {:?} was rescaled while this process ran (its layout generation is {now}, this process \
                     started in {}): its subtasks and positions were redistributed. Restart this process with the \
                     job file's subtasks as the store records them (`ratchet inspect` shows the layout)",
                    self.jobs.job(),
                    self.generation
                ),
            ));
        }
        Ok(claim)
    }

    async fn save(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<()> {
        self.inner.save(owner, record).await
    }

    async fn mark_committed(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()> {
        self.inner.mark_committed(owner, checkpoint).await
    }

    async fn load(&self) -> Result<Loaded> {
        self.inner.load().await
    }

    async fn owner(&self) -> Result<Option<OwnerEpoch>> {
        self.inner.owner().await
    }
}
