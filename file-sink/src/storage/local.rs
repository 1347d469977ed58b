//! Local filesystem: hidden in-progress file → fsynced hidden pending file → atomic rename into place.

use std::fs;
use std::path::{Path, PathBuf};

use connector_api::{Error, ErrorKind, Phase, Result, SinkScope, SubtaskId};
use connector_common::fs::{lock_exclusive, read_number, replace_file, sync_dir};

use super::{OpenFile, Stage, StageHandle, StagedFile, age_since};
use crate::FileName;

pub(crate) struct LocalBackend {
    base: PathBuf,
    scope: SinkScope,
    subtask: SubtaskId,
}

fn io(kind: ErrorKind, phase: Phase, message: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::new(kind, phase, message).with_source(e)
}

/// How long raising the owner epoch waits for another instance doing the same.
const OWNER_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn pending_of(visible: &Path) -> PathBuf {
    let name = visible.file_name().unwrap_or_default().to_string_lossy();
    visible.with_file_name(format!(".{name}.pending"))
}

fn remove_if_exists(path: &Path) -> std::io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

impl LocalBackend {
    pub(crate) fn new(base: PathBuf, scope: SinkScope, subtask: SubtaskId) -> Result<Self> {
        fs::create_dir_all(&base).map_err(io(
            ErrorKind::Config,
            Phase::Setup,
            format!("cannot create output directory {}", base.display()),
        ))?;
        Ok(Self {
            base,
            scope,
            subtask,
        })
    }

    fn owner_path(&self) -> PathBuf {
        self.base
            .join(format!(".ratchet-owner-{}.{}", self.scope, self.subtask))
    }

    pub(crate) fn staging_path(&self, name: &FileName) -> Result<PathBuf> {
        let dir = self.base.join(&name.partition);
        fs::create_dir_all(&dir).map_err(io(
            ErrorKind::Retryable,
            Phase::Write,
            format!("cannot create directory {}", dir.display()),
        ))?;
        Ok(dir.join(name.in_progress()))
    }

    pub(crate) async fn seal(&self, open: OpenFile) -> Result<StagedFile> {
        let visible = self.base.join(open.name.relative_path());
        let OpenFile {
            writer,
            rows,
            staging_path,
            ..
        } = open;
        connector_api::blocking(Phase::PreCommit, "sealing a file", move || {
            let file = writer.finish().map_err(|e| {
                Error::new(
                    ErrorKind::MustAbort,
                    Phase::PreCommit,
                    format!("cannot finish {}", staging_path.display()),
                )
                .with_source(std::io::Error::other(e))
            })?;
            let fail = |what: &str| {
                io(
                    ErrorKind::MustAbort,
                    Phase::PreCommit,
                    format!("cannot {what} {}", staging_path.display()),
                )
            };
            file.sync_all().map_err(fail("fsync"))?;
            let bytes = file.metadata().map_err(fail("stat"))?.len();
            drop(file);
            fs::rename(&staging_path, pending_of(&visible)).map_err(fail("rename to pending"))?;
            sync_dir(visible.parent().expect("file has a directory"))
                .map_err(fail("fsync the directory of"))?;
            Ok(StagedFile::Local {
                path: visible,
                rows,
                bytes,
            })
        })
        .await?
    }

    pub(crate) fn discard_open(&self, open: OpenFile) -> Result<()> {
        let path = open.staging_path.clone();
        drop(open);
        remove_if_exists(&path).map(|_| ()).map_err(io(
            ErrorKind::Retryable,
            Phase::Abort,
            format!("cannot delete {}", path.display()),
        ))
    }

    pub(crate) async fn publish(&self, staged: &StagedFile) -> Result<()> {
        let StagedFile::Local { path, .. } = staged else {
            unreachable!("checked by Backend::publish")
        };
        let visible = path.clone();
        connector_api::blocking(Phase::Commit, "publishing a file", move || {
            let pending = pending_of(&visible);
            match fs::rename(&pending, &visible) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && visible.exists() => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::new(
                        ErrorKind::Fatal,
                        Phase::Commit,
                        format!(
                            "neither {} nor {} exists: the pre-committed file was lost (deleted outside Ratchet?); \
                             replay the source from the previous checkpoint",
                            pending.display(),
                            visible.display()
                        ),
                    )
                    .with_source(e));
                }
                Err(e) => {
                    return Err(io(ErrorKind::Retryable, Phase::Commit, format!("cannot rename {} into place", pending.display()))(e));
                }
            }
            sync_dir(visible.parent().expect("file has a directory"))
                .map_err(io(ErrorKind::Retryable, Phase::Commit, format!("cannot fsync the directory of {}", visible.display())))
        })
        .await?
    }

    pub(crate) fn is_published(&self, staged: &StagedFile) -> bool {
        let StagedFile::Local { path, .. } = staged else {
            return false;
        };
        path.exists() && !pending_of(path).exists()
    }

    pub(crate) fn discard_staged(&self, staged: &StagedFile) -> Result<()> {
        let StagedFile::Local { path, .. } = staged else {
            return Ok(());
        };
        let pending = pending_of(path);
        remove_if_exists(&pending).map(|_| ()).map_err(io(
            ErrorKind::Retryable,
            Phase::Abort,
            format!("cannot delete {}", pending.display()),
        ))
    }

    fn owner_lock_path(&self) -> PathBuf {
        self.base.join(format!(
            ".ratchet-owner-{}.{}.lock",
            self.scope, self.subtask
        ))
    }

    pub(crate) fn read_epoch(&self) -> Result<u64> {
        let path = self.owner_path();
        read_number(&path).map(Option::unwrap_or_default).map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::InvalidData {
                ErrorKind::Fatal
            } else {
                ErrorKind::Retryable
            };
            Error::new(
                kind,
                Phase::Recover,
                format!(
                    "cannot read the owner epoch in {} (remove it only if no instance of this sink runs)",
                    path.display()
                ),
            )
            .with_source(e)
        })
    }

    /// Raises this subtask's owner epoch by one under an exclusive lock on its own lock file, so two instances
    /// recovering at once never take the same epoch; written atomically under a unique temporary name.
    pub(crate) fn bump_epoch(&self) -> Result<u64> {
        let path = self.owner_path();
        let failed = |e: std::io::Error| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Recover,
                format!("cannot raise the owner epoch in {}", path.display()),
            )
            .with_source(e)
        };
        let _lock = lock_exclusive(&self.owner_lock_path(), OWNER_LOCK_WAIT).map_err(failed)?;
        let epoch = self.read_epoch()? + 1;
        replace_file(&self.base, &path, epoch.to_string().as_bytes()).map_err(failed)?;
        Ok(epoch)
    }

    /// Deletes every hidden in-progress or pending file of this instance under the base directory.
    pub(crate) fn owned_stages(&self) -> Result<Vec<Stage>> {
        let mut stages = Vec::new();
        let mut dirs = vec![self.base.clone()];
        while let Some(dir) = dirs.pop() {
            let listing = || {
                io(
                    ErrorKind::Retryable,
                    Phase::Recover,
                    format!("cannot list {}", dir.display()),
                )
            };
            let entries = match fs::read_dir(&dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                entries => entries.map_err(listing())?,
            };
            for entry in entries {
                let entry = entry.map_err(listing())?;
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(path);
                } else if FileName::is_owned_stage(&name, &self.scope, self.subtask) {
                    let kind = if name.ends_with(".pending") {
                        "pending file"
                    } else {
                        "in-progress file"
                    };
                    stages.push(Stage {
                        kind,
                        location: path.display().to_string(),
                        file: FileName::visible_of_stage(&name).to_string(),
                        age: entry
                            .metadata()
                            .ok()
                            .and_then(|m| m.modified().ok())
                            .and_then(age_since),
                        handle: StageHandle::Path(path),
                    });
                }
            }
        }
        Ok(stages)
    }

    pub(crate) fn remove_stage(&self, path: &Path) -> Result<()> {
        remove_if_exists(path).map_err(io(
            ErrorKind::Retryable,
            Phase::Recover,
            format!("cannot delete {}", path.display()),
        ))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_recoveries_of_one_subtask_take_distinct_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let sink = SinkScope::from(connector_api::SinkId::new("s").unwrap());
        let threads: Vec<_> = (0..8)
            .map(|i| {
                // Two subtasks, four instances each: epochs are per subtask and never repeat.
                let backend =
                    LocalBackend::new(dir.path().to_path_buf(), sink.clone(), SubtaskId(i % 2))
                        .unwrap();
                std::thread::spawn(move || (i % 2, backend.bump_epoch().unwrap()))
            })
            .collect();
        let mut epochs: Vec<(u32, u64)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        epochs.sort_unstable();
        assert_eq!(
            epochs,
            [
                (0, 1),
                (0, 2),
                (0, 3),
                (0, 4),
                (1, 1),
                (1, 2),
                (1, 3),
                (1, 4)
            ]
        );
    }
}
