//! The harness's checkpoint store: the real [`LocalCheckpointStore`], with injected unknown outcomes, and the
//! deliberately broken variants that prove the overlap scenarios catch what they target.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, Claim, ClaimGuard, Error, ErrorKind,
    HeldClaim, Loaded, LocalCheckpointStore, OwnerEpoch, Phase, Result,
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
    /// A claim guard that lapsed still passes its check (the first release: the claim was never checked again
    /// after it was taken), so a recovery whose claim lapsed runs anyway.
    LapsedClaimStillPasses,
}

/// A claim guard that can lapse while its holder lives, as a PostgreSQL guard session the server ended: lapsing
/// releases the lock (a newer claim gets through) and makes [`HeldClaim::check`] fail.
struct LapsingGuard {
    held: Mutex<Option<ClaimGuard>>,
    lapsed: AtomicBool,
    /// [`StoreBug::LapsedClaimStillPasses`].
    check_ignored: bool,
}

impl LapsingGuard {
    fn lapse(&self) {
        self.lapsed.store(true, Ordering::SeqCst);
        drop(self.held.lock().expect("guard").take());
    }
}

#[async_trait]
impl HeldClaim for LapsingGuard {
    async fn check(&self) -> Result<()> {
        if self.lapsed.load(Ordering::SeqCst) && !self.check_ignored {
            return Err(Error::new(
                ErrorKind::Fenced,
                Phase::Recover,
                "the claim lapsed (injected: its guard session was ended)",
            ));
        }
        let held = self.held.lock().expect("guard").clone();
        match held {
            Some(guard) => guard.check().await,
            None => Ok(()),
        }
    }
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
    /// Every claim guard handed out and still alive, for [`HarnessStore::lapse_claims`].
    guards: Arc<Mutex<Vec<Weak<LapsingGuard>>>>,
}

impl HarnessStore {
    pub(super) fn new(inner: LocalCheckpointStore, bug: Option<StoreBug>) -> Self {
        Self {
            inner,
            bug,
            in_doubt_at: Arc::new(AtomicU64::new(0)),
            fired: Arc::new(AtomicBool::new(false)),
            guards: Arc::default(),
        }
    }

    /// Makes every claim guard alive now lapse (shared by clones): their locks are released and their checks fail.
    pub(super) fn lapse_claims(&self) {
        for guard in self.guards.lock().expect("guards").drain(..) {
            if let Some(guard) = guard.upgrade() {
                guard.lapse();
            }
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

/// A [`LapsingGuard`] the store can still reach after handing it out.
struct SharedGuard(Arc<LapsingGuard>);

#[async_trait]
impl HeldClaim for SharedGuard {
    async fn check(&self) -> Result<()> {
        self.0.check().await
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
        let lapsing = Arc::new(LapsingGuard {
            held: Mutex::new(Some(claim.guard)),
            lapsed: AtomicBool::new(false),
            check_ignored: self.bug == Some(StoreBug::LapsedClaimStillPasses),
        });
        let mut guards = self.guards.lock().expect("guards");
        guards.retain(|g| g.strong_count() > 0);
        guards.push(Arc::downgrade(&lapsing));
        drop(guards);
        Ok(Claim {
            epoch: claim.epoch,
            guard: ClaimGuard::new(SharedGuard(lapsing)),
        })
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
