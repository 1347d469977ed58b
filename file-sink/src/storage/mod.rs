//! Storage backends: where open files are staged, how a sealed file waits for commit, and how commit makes it
//! visible. Every operation is idempotent where the protocol may repeat it.

mod local;
mod s3;

use std::path::PathBuf;

pub(crate) use crate::committable::{StagedFile, UploadedPart};
use connector_api::{Error, ErrorKind, Phase, Result, SinkScope, SubtaskId};

pub(crate) use local::LocalBackend;
pub(crate) use s3::S3Backend;

use crate::FileName;
use crate::config::StorageConfig;
use crate::format::{FormatWriter, WrittenBytes};

impl StagedFile {
    /// Rows in the file.
    pub fn rows(&self) -> u64 {
        match self {
            StagedFile::Local { rows, .. }
            | StagedFile::Multipart { rows, .. }
            | StagedFile::Staged { rows, .. } => *rows,
        }
    }

    /// The visible file's name (the last component of its path or key).
    pub fn file_name(&self) -> String {
        let location = self.location();
        location.rsplit('/').next().unwrap_or(&location).to_string()
    }

    /// Where the file becomes visible (a path or `s3://bucket/key`).
    pub fn location(&self) -> String {
        match self {
            StagedFile::Local { path, .. } => path.display().to_string(),
            StagedFile::Multipart { bucket, key, .. } | StagedFile::Staged { bucket, key, .. } => {
                format!("s3://{bucket}/{key}")
            }
        }
    }
}

/// S3 multipart progress of an open file.
pub(crate) struct Upload {
    pub(crate) key: String,
    pub(crate) upload_id: String,
    pub(crate) parts: Vec<UploadedPart>,
    /// Bytes of the staging file already uploaded as parts.
    pub(crate) uploaded: u64,
}

/// A file being written: the encoder, its local staging file, and (S3) the upload so far.
pub(crate) struct OpenFile {
    pub(crate) name: FileName,
    pub(crate) writer: FormatWriter,
    pub(crate) written: WrittenBytes,
    pub(crate) rows: u64,
    pub(crate) staging_path: PathBuf,
    pub(crate) upload: Option<Upload>,
}

/// The backend a sink writes to.
pub(crate) enum Backend {
    Local(LocalBackend),
    S3(S3Backend),
}

/// `ratchet check-config` for `config`: the directory or bucket is there (or, locally, would be created), read-only.
///
/// # Errors
/// [`Config`](ErrorKind::Config) for a local path that is not a directory; as the S3 check for a bucket.
pub(crate) async fn check(config: &StorageConfig) -> Result<String> {
    match config {
        StorageConfig::Local { path } => match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => Ok(format!("directory {} exists", path.display())),
            Ok(_) => Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("{} is not a directory", path.display()),
            )),
            Err(_) => Ok(format!(
                "directory {} does not exist yet: the first run creates it",
                path.display()
            )),
        },
        StorageConfig::S3(s3) => s3::check(s3).await,
    }
}

impl Backend {
    pub(crate) async fn open(
        config: &StorageConfig,
        scope: &SinkScope,
        subtask: SubtaskId,
    ) -> Result<Self> {
        Ok(match config {
            StorageConfig::Local { path } => {
                Backend::Local(LocalBackend::new(path.clone(), scope.clone(), subtask)?)
            }
            StorageConfig::S3(s3) => {
                Backend::S3(S3Backend::connect(s3, scope.clone(), subtask).await?)
            }
        })
    }

    /// The local file an open file's bytes are staged in (created by the caller).
    pub(crate) fn staging_path(&self, name: &FileName) -> Result<PathBuf> {
        match self {
            Backend::Local(b) => b.staging_path(name),
            Backend::S3(b) => b.staging_path(name),
        }
    }

    /// After rows were written: S3 uploads the full parts the staging file holds.
    pub(crate) async fn after_write(&self, open: &mut OpenFile) -> Result<()> {
        match self {
            Backend::Local(_) => Ok(()),
            Backend::S3(b) => b.upload_full_parts(open).await,
        }
    }

    /// Closes the file and makes its bytes durable in staging; afterwards any process can publish it.
    pub(crate) async fn seal(&self, open: OpenFile) -> Result<StagedFile> {
        match self {
            Backend::Local(b) => b.seal(open).await,
            Backend::S3(b) => b.seal(open).await,
        }
    }

    /// Throws an open file away.
    pub(crate) async fn discard_open(&self, open: OpenFile) -> Result<()> {
        match self {
            Backend::Local(b) => b.discard_open(open),
            Backend::S3(b) => b.discard_open(open).await,
        }
    }

    /// Makes a sealed file visible. Publishing an already-visible file succeeds.
    pub(crate) async fn publish(&self, staged: &StagedFile) -> Result<()> {
        match (self, staged) {
            (Backend::Local(b), StagedFile::Local { .. }) => b.publish(staged).await,
            (Backend::S3(b), StagedFile::Multipart { .. } | StagedFile::Staged { .. }) => {
                b.publish(staged).await
            }
            _ => Err(mismatch(staged)),
        }
    }

    /// Whether a sealed file is visible (and no longer staged).
    pub(crate) async fn is_published(&self, staged: &StagedFile) -> Result<bool> {
        match (self, staged) {
            (Backend::Local(b), StagedFile::Local { .. }) => Ok(b.is_published(staged)),
            (Backend::S3(b), StagedFile::Multipart { .. } | StagedFile::Staged { .. }) => {
                b.is_published(staged).await
            }
            _ => Err(mismatch(staged)),
        }
    }

    /// Throws a sealed, unpublished file away.
    pub(crate) async fn discard_staged(&self, staged: &StagedFile) -> Result<()> {
        match (self, staged) {
            (Backend::Local(b), StagedFile::Local { .. }) => b.discard_staged(staged),
            (Backend::S3(b), StagedFile::Multipart { .. } | StagedFile::Staged { .. }) => {
                b.discard_staged(staged).await
            }
            _ => Err(mismatch(staged)),
        }
    }

    /// The owner epoch (0 before any instance recovered).
    pub(crate) async fn read_epoch(&self) -> Result<u64> {
        match self {
            Backend::Local(b) => b.read_epoch(),
            Backend::S3(b) => b.read_epoch().await.map(|(epoch, _)| epoch),
        }
    }

    /// Raises the owner epoch by one, durably; returns the new epoch.
    pub(crate) async fn bump_epoch(&self) -> Result<u64> {
        match self {
            Backend::Local(b) => b.bump_epoch(),
            Backend::S3(b) => b.bump_epoch().await,
        }
    }

    /// Every staged or in-progress file (and, on S3, open multipart upload, staged object and spill file) this
    /// instance's sink and subtask own. Read-only.
    pub(crate) async fn owned_stages(&self) -> Result<Vec<Stage>> {
        match self {
            Backend::Local(b) => b.owned_stages(),
            Backend::S3(b) => b.owned_stages().await,
        }
    }

    /// Removes every stage [`owned_stages`](Self::owned_stages) lists; returns what it removed. Called by recovery
    /// after the restored files are published.
    pub(crate) async fn remove_owned_stages(&self) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        for stage in self.owned_stages().await? {
            match (self, &stage.handle) {
                (Backend::Local(b), StageHandle::Path(path)) => b.remove_stage(path)?,
                (Backend::S3(b), handle) => b.remove_stage(handle).await?,
                (Backend::Local(_), _) => continue,
            }
            removed.push(format!("{} {}", stage.kind, stage.location));
        }
        Ok(removed)
    }
}

/// Something one sink instance staged that no visible file covers yet: what recovery publishes (when the restored
/// checkpoint holds it) or removes.
#[derive(Debug, Clone)]
pub(crate) struct Stage {
    /// What it is: `pending file`, `in-progress file`, `multipart upload`, `staged object`, `spill file`.
    pub(crate) kind: &'static str,
    /// Where it is.
    pub(crate) location: String,
    /// The name of the visible file it would become.
    pub(crate) file: String,
    /// How old it is, when the storage says.
    pub(crate) age: Option<std::time::Duration>,
    /// How to remove it.
    pub(crate) handle: StageHandle,
}

/// How a [`Stage`] is removed.
#[derive(Debug, Clone)]
pub(crate) enum StageHandle {
    /// A local file (a hidden stage, or an S3 spill file).
    Path(PathBuf),
    /// An open S3 multipart upload.
    Upload {
        /// The key it completes into.
        key: String,
        /// Its id.
        upload_id: String,
    },
    /// A small file staged under `_ratchet-staging/`.
    Object {
        /// Its key.
        key: String,
    },
}

/// The time since `modified`, if in the past.
pub(crate) fn age_since(modified: std::time::SystemTime) -> Option<std::time::Duration> {
    std::time::SystemTime::now().duration_since(modified).ok()
}

fn mismatch(staged: &StagedFile) -> Error {
    Error::new(
        ErrorKind::Config,
        Phase::Commit,
        format!(
            "the checkpoint holds a file for another storage backend ({}); the sink's storage setting changed \
             since the checkpoint was taken: restore with the old setting",
            staged.location()
        ),
    )
}
