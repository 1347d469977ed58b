//! A checkpoint store in a local directory: one file per checkpoint, written atomically, owned through claims.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;

use super::record::newest_intact;
use super::{CheckpointRecord, CheckpointStore, Claim, ClaimGuard, Loaded, OwnerEpoch};
use crate::{CheckpointId, Error, ErrorKind, Phase, Result};
use connector_common::fs::{lock_exclusive, read_number, replace_file, sync_dir, write_unique_tmp};

/// How long `claim` and `save` wait for the directory lock (held by another process for a few milliseconds at a
/// time, or for as long as a process holding it is paused).
const LOCK_WAIT: Duration = Duration::from_secs(30);
const OWNER_FILE: &str = "owner-epoch";
const COMMITTED_FILE: &str = "committed-through";
const LOCK_FILE: &str = ".lock";

/// Keeps the checkpoint records of one subtask as `checkpoint-<id>.json` files in one directory.
///
/// Every mutation (`claim`, `save`, `mark_committed`) runs under an exclusive lock on `<dir>/.lock` (`flock`,
/// released by the kernel when a process dies), so a claim and a save never interleave: a save checks the owner
/// epoch in `<dir>/owner-epoch` and links its record into place in one critical section. A claim keeps the lock
/// as its [`ClaimGuard`] until recovery is over. Files are written under a
/// unique temporary name (process id and a counter), fsynced, then renamed (epoch, committed mark) or hard-linked
/// (records: a link never replaces an existing decision), and the directory is fsynced. Each record carries a
/// CRC-32; the newest `retain` records are kept so a damaged newest record can fall back to the previous one.
///
/// Give each subtask of each job its own directory.
#[derive(Debug, Clone)]
pub struct LocalCheckpointStore {
    dir: PathBuf,
    retain: usize,
}

/// The outcome of an I/O sequence whose failure may or may not have taken effect.
enum SaveError {
    /// Refused: nothing stored, and it never will be (newer claim, or a different decision).
    Fenced(String),
    /// Failed before anything became visible.
    NotStored(std::io::Error),
    /// Failed after the record was linked into place: it may or may not survive a crash.
    InDoubt(std::io::Error),
}

impl LocalCheckpointStore {
    /// Opens (creating it if needed) the store in `dir`, keeping the newest `retain` records (at least 2).
    pub fn open(dir: impl Into<PathBuf>, retain: usize) -> Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("cannot create checkpoint directory {}", dir.display()),
            )
            .with_source(e)
        })?;
        Ok(Self {
            dir,
            retain: retain.max(2),
        })
    }

    /// Opens the store in `dir` if it exists, creating nothing: `None` for a subtask that never ran here. For
    /// read-only tools (`ratchet check-config`), which must leave a fresh job fresh.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when `dir` cannot be looked at.
    pub fn open_existing(dir: impl Into<PathBuf>, retain: usize) -> Result<Option<Self>> {
        let dir = dir.into();
        match fs::metadata(&dir) {
            Ok(_) => Self::open(dir, retain).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("cannot look at checkpoint directory {}", dir.display()),
            )
            .with_source(e)),
        }
    }

    /// The directory holding the records.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, id: CheckpointId) -> PathBuf {
        self.dir.join(format!("checkpoint-{:020}.json", id.0))
    }

    /// Checkpoint ids present in the directory, newest first.
    fn ids(&self) -> std::io::Result<Vec<CheckpointId>> {
        let mut ids: Vec<CheckpointId> = fs::read_dir(&self.dir)?
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                let id = name.strip_prefix("checkpoint-")?.strip_suffix(".json")?;
                id.parse().ok().map(CheckpointId)
            })
            .collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        Ok(ids)
    }

    /// Takes the directory's exclusive lock, waiting up to [`LOCK_WAIT`]; released when the file is dropped.
    fn lock(&self) -> Result<File> {
        let path = self.dir.join(LOCK_FILE);
        lock_exclusive(&path, LOCK_WAIT).map_err(|e| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Checkpoint,
                format!("cannot lock {}", path.display()),
            )
            .with_source(e)
        })
    }

    fn owner_epoch(&self) -> std::io::Result<OwnerEpoch> {
        Ok(OwnerEpoch(
            read_number(&self.dir.join(OWNER_FILE))?.unwrap_or(0),
        ))
    }

    /// Raises the epoch under the lock and keeps the lock as the claim guard.
    fn claim_blocking(&self) -> Result<Claim> {
        let lock = self.lock()?;
        let io = |e: std::io::Error| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Checkpoint,
                format!("cannot claim the checkpoint store {}", self.dir.display()),
            )
            .with_source(e)
        };
        let next = OwnerEpoch(self.owner_epoch().map_err(io)?.0 + 1);
        replace_file(
            &self.dir,
            &self.dir.join(OWNER_FILE),
            next.0.to_string().as_bytes(),
        )
        .map_err(io)?;
        Ok(Claim {
            epoch: next,
            guard: ClaimGuard::process_bound(lock),
        })
    }

    fn save_blocking(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<(), SaveError> {
        let _lock = self.lock().map_err(|e| {
            SaveError::NotStored(std::io::Error::other(crate::Report(&e).to_string()))
        })?;
        let current = self.owner_epoch().map_err(SaveError::NotStored)?;
        if current != owner {
            return Err(SaveError::Fenced(format!(
                "the subtask was claimed by owner epoch {current} since this instance claimed epoch {owner}: \
                 another instance of this job (a replacement, or a second worker on the same checkpoint \
                 directory) owns it now; this instance must stop"
            )));
        }
        let target = self.path_of(record.id);
        let bytes = record.encode();
        let tmp =
            write_unique_tmp(&self.dir, "checkpoint", &bytes).map_err(SaveError::NotStored)?;
        // A hard link creates the target atomically and only if it does not exist: the decision for a checkpoint
        // is never overwritten.
        let linked = fs::hard_link(&tmp, &target);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // An identical record is a retried save (possibly of an attempt whose outcome was in doubt).
                match fs::read(&target) {
                    Ok(stored) if stored == bytes => {}
                    Ok(_) => {
                        return Err(SaveError::Fenced(
                            "a different record for this checkpoint is already stored: another instance of this \
                             job decided it first; this instance must stop"
                                .into(),
                        ));
                    }
                    Err(e) => return Err(SaveError::InDoubt(e)),
                }
            }
            Err(e) => return Err(SaveError::NotStored(e)),
        }
        sync_dir(&self.dir).map_err(SaveError::InDoubt)?;
        self.prune();
        Ok(())
    }

    /// Removes records beyond the newest `retain`. Failures are logged: pruning never fails a save.
    fn prune(&self) {
        let outcome = self.ids().and_then(|ids| {
            ids.into_iter()
                .skip(self.retain)
                .try_for_each(|old| fs::remove_file(self.path_of(old)))
        });
        if let Err(e) = outcome {
            tracing::warn!(dir = %self.dir.display(), error = %e,
                "cannot prune old checkpoint records; they are kept until the next save");
        }
    }

    fn mark_committed_blocking(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()> {
        let _lock = self.lock()?;
        let path = self.dir.join(COMMITTED_FILE);
        let io = |e: std::io::Error| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Checkpoint,
                format!("cannot update {}", path.display()),
            )
            .with_checkpoint(checkpoint)
            .with_source(e)
        };
        let current = self.owner_epoch().map_err(io)?;
        if current != owner {
            return Err(Error::new(
                ErrorKind::Fenced,
                Phase::Checkpoint,
                format!("owner epoch {current} claimed the subtask since epoch {owner}"),
            )
            .with_checkpoint(checkpoint));
        }
        if read_number(&path).map_err(io)?.unwrap_or(0) >= checkpoint.0 {
            return Ok(());
        }
        replace_file(&self.dir, &path, checkpoint.0.to_string().as_bytes()).map_err(io)
    }

    fn load_blocking(&self) -> Result<Loaded> {
        let io_error = |e: std::io::Error| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Checkpoint,
                format!("cannot read checkpoint directory {}", self.dir.display()),
            )
            .with_source(e)
        };
        let ids = self.ids().map_err(io_error)?;
        let mut candidates = Vec::with_capacity(ids.len());
        for &id in &ids {
            let path = self.path_of(id);
            match fs::read(&path) {
                Ok(bytes) => candidates.push((id, path.display().to_string(), bytes)),
                // Pruned by a concurrent save between listing and reading.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(e)),
            }
        }
        let committed_through = read_number(&self.dir.join(COMMITTED_FILE))
            .map_err(io_error)?
            .map(CheckpointId);
        Ok(Loaded {
            record: newest_intact(&self.dir.display().to_string(), candidates)?,
            highest_id: ids.first().copied(),
            committed_through,
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Self) -> T + Send + 'static,
    ) -> Result<T> {
        let store = self.clone();
        crate::blocking(Phase::Checkpoint, "a checkpoint store call", move || {
            f(&store)
        })
        .await
    }
}

#[async_trait]
impl CheckpointStore for LocalCheckpointStore {
    async fn claim(&self) -> Result<Claim> {
        self.blocking(Self::claim_blocking).await?
    }

    async fn owner(&self) -> Result<Option<OwnerEpoch>> {
        let epoch = self.blocking(|store| {
            store.owner_epoch().map_err(|e| {
                Error::new(
                    ErrorKind::Retryable,
                    Phase::Checkpoint,
                    format!("cannot read {}", store.dir.join(OWNER_FILE).display()),
                )
                .with_source(e)
            })
        });
        Ok(Some(epoch.await??).filter(|e| e.0 > 0))
    }

    async fn save(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<()> {
        let id = record.id;
        let dir = self.dir.display().to_string();
        let record = record.clone();
        let outcome = self
            .blocking(move |store| store.save_blocking(owner, &record))
            .await?;
        outcome.map_err(|e| {
            let (kind, message, source) = match e {
                SaveError::Fenced(why) => (ErrorKind::Fenced, format!("{dir}: {why}"), None),
                SaveError::NotStored(e) => (
                    ErrorKind::Retryable,
                    format!("cannot persist the checkpoint record in {dir}"),
                    Some(e),
                ),
                SaveError::InDoubt(e) => (
                    ErrorKind::InDoubt,
                    format!(
                        "the checkpoint record was linked into {dir} but could not be made durable: it may or may \
                         not survive a crash"
                    ),
                    Some(e),
                ),
            };
            let error = Error::new(kind, Phase::Checkpoint, message).with_checkpoint(id);
            match source {
                Some(source) => error.with_source(source),
                None => error,
            }
        })
    }

    async fn mark_committed(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()> {
        self.blocking(move |store| store.mark_committed_blocking(owner, checkpoint))
            .await?
    }

    async fn load(&self) -> Result<Loaded> {
        self.blocking(Self::load_blocking).await?
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::SourceOffset;

    fn record(id: u64) -> CheckpointRecord {
        CheckpointRecord {
            id: CheckpointId(id),
            positions: vec![SourceOffset::new("t", 0, id as i64 * 10)],
            committables: BTreeMap::new(),
        }
    }

    async fn claimed(dir: &Path) -> (LocalCheckpointStore, OwnerEpoch) {
        let store = LocalCheckpointStore::open(dir, 3).unwrap();
        let owner = store.claim().await.unwrap().epoch;
        (store, owner)
    }

    #[tokio::test]
    async fn keeps_the_newest_records_and_loads_the_latest() {
        let dir = tempfile::tempdir().unwrap();
        let (store, owner) = claimed(dir.path()).await;
        assert_eq!(store.load().await.unwrap(), Loaded::default());
        for id in 1..=5 {
            store.save(owner, &record(id)).await.unwrap();
        }
        let loaded = store.load().await.unwrap();
        assert_eq!(loaded.record, Some(record(5)));
        assert_eq!(loaded.highest_id, Some(CheckpointId(5)));
        assert_eq!(
            store.ids().unwrap(),
            vec![CheckpointId(5), CheckpointId(4), CheckpointId(3)]
        );
    }

    #[tokio::test]
    async fn a_checkpoint_decision_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let (store, owner) = claimed(dir.path()).await;
        store.save(owner, &record(1)).await.unwrap();
        store.save(owner, &record(1)).await.unwrap(); // a retried save
        let mut other = record(1);
        other.positions[0].next_offset = 99;
        let err = store.save(owner, &other).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
        assert_eq!(store.load().await.unwrap().record, Some(record(1)));
    }

    #[tokio::test]
    async fn a_newer_claim_fences_every_save_of_the_older_one() {
        let dir = tempfile::tempdir().unwrap();
        let (old, old_owner) = claimed(dir.path()).await;
        old.save(old_owner, &record(1)).await.unwrap();
        let (new, new_owner) = claimed(dir.path()).await;
        assert!(new_owner > old_owner);
        let err = old.save(old_owner, &record(2)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
        assert!(err.to_string().contains("claimed"), "{err}");
        let err = old
            .mark_committed(old_owner, CheckpointId(1))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
        new.save(new_owner, &record(2)).await.unwrap();
        assert_eq!(new.load().await.unwrap().record, Some(record(2)));
    }

    #[tokio::test]
    async fn concurrent_claims_get_distinct_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let claims = (0..16).map(|_| {
            let store = LocalCheckpointStore::open(dir.path(), 3).unwrap();
            tokio::spawn(async move { store.claim().await.unwrap().epoch })
        });
        let mut epochs = Vec::new();
        for claim in claims {
            epochs.push(claim.await.unwrap().0);
        }
        epochs.sort_unstable();
        assert_eq!(epochs, (1..=16).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_claim_waits_while_another_claim_guard_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalCheckpointStore::open(dir.path(), 3).unwrap();
        let first = store.claim().await.unwrap();
        let second = tokio::spawn({
            let store = store.clone();
            async move { store.claim().await.unwrap().epoch }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !second.is_finished(),
            "a claim overtook a recovery in progress"
        );
        drop(first.guard);
        assert_eq!(second.await.unwrap(), OwnerEpoch(first.epoch.0 + 1));
    }

    #[tokio::test]
    async fn the_committed_mark_only_rises() {
        let dir = tempfile::tempdir().unwrap();
        let (store, owner) = claimed(dir.path()).await;
        store.mark_committed(owner, CheckpointId(4)).await.unwrap();
        store.mark_committed(owner, CheckpointId(3)).await.unwrap();
        assert_eq!(
            store.load().await.unwrap().committed_through,
            Some(CheckpointId(4))
        );
    }

    #[tokio::test]
    async fn a_truncated_newest_record_falls_back_and_its_id_stays_taken() {
        let dir = tempfile::tempdir().unwrap();
        let (store, owner) = claimed(dir.path()).await;
        store.save(owner, &record(1)).await.unwrap();
        store.save(owner, &record(2)).await.unwrap();
        let newest = store.path_of(CheckpointId(2));
        let bytes = fs::read(&newest).unwrap();
        fs::write(&newest, &bytes[..bytes.len() - 10]).unwrap();
        let loaded = store.load().await.unwrap();
        assert_eq!(loaded.record, Some(record(1)));
        assert_eq!(loaded.highest_id, Some(CheckpointId(2)));
    }

    #[tokio::test]
    async fn refuses_to_start_fresh_when_every_record_is_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let (store, owner) = claimed(dir.path()).await;
        store.save(owner, &record(1)).await.unwrap();
        fs::write(store.path_of(CheckpointId(1)), b"{").unwrap();
        let err = store.load().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fatal);
        assert!(err.to_string().contains("every checkpoint record"), "{err}");
    }

    #[tokio::test]
    async fn leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let (store, owner) = claimed(dir.path()).await;
        store.save(owner, &record(1)).await.unwrap();
        store.mark_committed(owner, CheckpointId(1)).await.unwrap();
        let tmp: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(tmp.is_empty(), "{tmp:?}");
    }
}
