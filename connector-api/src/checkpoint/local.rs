//! A checkpoint store in a local directory: one file per checkpoint, written atomically.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::record::newest_intact;
use super::{CheckpointRecord, CheckpointStore};
use crate::{CheckpointId, Error, ErrorKind, Phase, Result};

/// Keeps checkpoint records as `checkpoint-<id>.json` files in one directory.
///
/// `save` writes a hidden temporary file, fsyncs it, renames it into place and fsyncs the directory, so a record
/// is either absent or complete after any crash. Each record carries a CRC-32; the newest `retain` records are
/// kept so a damaged newest record can fall back to the previous one.
#[derive(Debug, Clone)]
pub struct LocalCheckpointStore {
    dir: PathBuf,
    retain: usize,
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

    fn save_blocking(&self, record: &CheckpointRecord) -> std::io::Result<()> {
        let target = self.path_of(record.id);
        let tmp = self
            .dir
            .join(format!(".checkpoint-{:020}.tmp", record.id.0));
        let bytes = record.encode();
        let mut file = File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        drop(file);
        // A hard link creates the target atomically and only if it does not exist: the decision for a checkpoint
        // is never overwritten, not even by a zombie racing this instance.
        let linked = fs::hard_link(&tmp, &target);
        fs::remove_file(&tmp)?;
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if fs::read(&target)? != bytes {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        AlreadyDecided,
                    ));
                }
            }
            Err(e) => return Err(e),
        }
        File::open(&self.dir)?.sync_all()?;
        for old in self.ids()?.into_iter().skip(self.retain) {
            fs::remove_file(self.path_of(old))?;
        }
        Ok(())
    }

    fn load_latest_blocking(&self) -> Result<Option<CheckpointRecord>> {
        let io_error = |e: std::io::Error| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Checkpoint,
                format!("cannot read checkpoint directory {}", self.dir.display()),
            )
            .with_source(e)
        };
        let mut candidates = Vec::new();
        for id in self.ids().map_err(io_error)? {
            let path = self.path_of(id);
            let bytes = fs::read(&path).map_err(io_error)?;
            candidates.push((id, path.display().to_string(), bytes));
        }
        newest_intact(&self.dir.display().to_string(), candidates)
    }
}

/// A different record for the same checkpoint id is already stored.
#[derive(Debug)]
struct AlreadyDecided;

impl std::fmt::Display for AlreadyDecided {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a different record for this checkpoint is already stored")
    }
}

impl std::error::Error for AlreadyDecided {}

#[async_trait]
impl CheckpointStore for LocalCheckpointStore {
    async fn save(&self, record: &CheckpointRecord) -> Result<()> {
        let store = self.clone();
        let record = record.clone();
        let id = record.id;
        tokio::task::spawn_blocking(move || store.save_blocking(&record))
            .await
            .expect("checkpoint save task panicked")
            .map_err(|e| {
                if e.get_ref().is_some_and(|inner| inner.is::<AlreadyDecided>()) {
                    return Error::new(
                        ErrorKind::Fenced,
                        Phase::Checkpoint,
                        format!(
                            "{} already holds a different record for this checkpoint: another instance of this job \
                             (a zombie, or a second worker using the same checkpoint directory) decided it first; \
                             this instance must stop",
                            self.dir.display()
                        ),
                    )
                    .with_checkpoint(id);
                }
                Error::new(
                    ErrorKind::Retryable,
                    Phase::Checkpoint,
                    format!("cannot persist checkpoint record in {}", self.dir.display()),
                )
                .with_checkpoint(id)
                .with_source(e)
            })
    }

    async fn load_latest(&self) -> Result<Option<CheckpointRecord>> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.load_latest_blocking())
            .await
            .expect("checkpoint load task panicked")
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
            positions: vec![SourceOffset {
                topic: "t".into(),
                partition: 0,
                next_offset: id as i64 * 10,
            }],
            committables: BTreeMap::new(),
        }
    }

    #[tokio::test]
    async fn keeps_the_newest_records_and_loads_the_latest() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalCheckpointStore::open(dir.path(), 3).unwrap();
        assert_eq!(store.load_latest().await.unwrap(), None);
        for id in 1..=5 {
            store.save(&record(id)).await.unwrap();
        }
        assert_eq!(store.load_latest().await.unwrap(), Some(record(5)));
        assert_eq!(
            store.ids().unwrap(),
            vec![CheckpointId(5), CheckpointId(4), CheckpointId(3)]
        );
    }

    #[tokio::test]
    async fn a_checkpoint_decision_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalCheckpointStore::open(dir.path(), 3).unwrap();
        store.save(&record(1)).await.unwrap();
        store.save(&record(1)).await.unwrap(); // a retried save of the same record
        let mut other = record(1);
        other.positions[0].next_offset = 99;
        let err = store.save(&other).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
        assert_eq!(store.load_latest().await.unwrap(), Some(record(1)));
    }

    #[tokio::test]
    async fn a_truncated_newest_record_falls_back_to_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalCheckpointStore::open(dir.path(), 3).unwrap();
        store.save(&record(1)).await.unwrap();
        store.save(&record(2)).await.unwrap();
        let newest = store.path_of(CheckpointId(2));
        let bytes = fs::read(&newest).unwrap();
        fs::write(&newest, &bytes[..bytes.len() - 10]).unwrap();
        assert_eq!(store.load_latest().await.unwrap(), Some(record(1)));
    }

    #[tokio::test]
    async fn refuses_to_start_fresh_when_every_record_is_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalCheckpointStore::open(dir.path(), 3).unwrap();
        store.save(&record(1)).await.unwrap();
        fs::write(store.path_of(CheckpointId(1)), b"{").unwrap();
        let err = store.load_latest().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fatal);
        assert!(err.to_string().contains("every checkpoint record"), "{err}");
    }
}
