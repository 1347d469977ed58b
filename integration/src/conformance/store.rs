//! The harness's checkpoint store: the real [`LocalCheckpointStore`], with injected unknown outcomes, and the
//! deliberately broken variants that prove the overlap scenarios catch what they target.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, Claim, ClaimGuard, Error, ErrorKind, Loaded,
    LocalCheckpointStore, OwnerEpoch, Phase, Result,
};

/// A deliberately broken checkpoint store, to show the harness catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreBug {
    /// No fencing: claims hold nothing off, and every save succeeds whoever claimed since (the store of the
    /// first release: insert-only, first writer wins, no owner).
    NoFencing,
    /// A save whose record was stored but whose reply was lost is reported as a plain failure, so the driver
    /// aborts a checkpoint that is decided (the first release's PostgreSQL store and driver).
    ReportsStoredAsFailed,
}

/// The store every scenario run uses. When armed with [`HarnessStore::in_doubt_at`], every save of that
/// checkpoint stores the record and then reports [`InDoubt`](ErrorKind::InDoubt) (a lost reply).
#[derive(Clone)]
pub(super) struct HarnessStore {
    inner: LocalCheckpointStore,
    bug: Option<StoreBug>,
    /// The checkpoint whose saves report an unknown outcome (0: none).
    in_doubt_at: Arc<AtomicU64>,
    fired: Arc<AtomicBool>,
}

impl HarnessStore {
    pub(super) fn new(inner: LocalCheckpointStore, bug: Option<StoreBug>) -> Self {
        Self {
            inner,
            bug,
            in_doubt_at: Arc::new(AtomicU64::new(0)),
            fired: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Arms the unknown outcome for every save of `checkpoint` (shared by clones).
    pub(super) fn in_doubt_at(&self, checkpoint: u64) {
        self.in_doubt_at.store(checkpoint, Ordering::SeqCst);
    }

    /// Whether an armed unknown outcome fired since the last call (then it is disarmed).
    pub(super) fn take_fired(&self) -> bool {
        if self.fired.swap(false, Ordering::SeqCst) {
            self.in_doubt_at.store(0, Ordering::SeqCst);
            return true;
        }
        false
    }
}

#[async_trait]
impl CheckpointStore for HarnessStore {
    async fn claim(&self) -> Result<Claim> {
        let claim = self.inner.claim().await?;
        if self.bug == Some(StoreBug::NoFencing) {
            return Ok(Claim {
                epoch: claim.epoch,
                guard: ClaimGuard::process_bound(()),
            });
        }
        Ok(claim)
    }

    async fn save(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<()> {
        let owner = match self.bug {
            // Whoever claimed since, this save goes through.
            Some(StoreBug::NoFencing) => self.inner.claim().await?.epoch,
            _ => owner,
        };
        self.inner.save(owner, record).await?;
        if record.id.0 == self.in_doubt_at.load(Ordering::SeqCst) {
            self.fired.store(true, Ordering::SeqCst);
            let kind = match self.bug {
                Some(StoreBug::ReportsStoredAsFailed) => ErrorKind::Fatal,
                _ => ErrorKind::InDoubt,
            };
            return Err(Error::new(
                kind,
                Phase::Checkpoint,
                "injected: the record was stored, the reply was lost",
            )
            .with_checkpoint(record.id));
        }
        Ok(())
    }

    async fn mark_committed(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()> {
        let owner = match self.bug {
            Some(StoreBug::NoFencing) => self.inner.claim().await?.epoch,
            _ => owner,
        };
        self.inner.mark_committed(owner, checkpoint).await
    }

    async fn owner(&self) -> Result<Option<OwnerEpoch>> {
        self.inner.owner().await
    }
    async fn load(&self) -> Result<Loaded> {
        self.inner.load().await
    }
}
