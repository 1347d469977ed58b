//! Fencing of zombie instances on a local filesystem: an owner-epoch file per sink instance.
//!
//! `recover` raises the epoch in `.ratchet-owner-<sink>.<subtask>`; a committer only renames files into place while
//! the epoch it was created with is still the current one. An older instance that keeps running after a newer one
//! recovered (a zombie) is refused with [`ErrorKind::Fenced`](connector_api::ErrorKind::Fenced). The check and the
//! rename are two steps (a local filesystem has no conditional rename), so a zombie that passes the check in the
//! instant before a new instance recovers can still publish one file; object stores close that gap with
//! conditional writes.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use connector_api::{SinkId, SubtaskId};

/// The owner-epoch file of one sink instance in `dir`.
#[derive(Debug, Clone)]
pub(crate) struct OwnerFile {
    path: PathBuf,
}

impl OwnerFile {
    pub(crate) fn new(dir: &Path, sink: &SinkId, subtask: SubtaskId) -> Self {
        Self {
            path: dir.join(format!(".ratchet-owner-{sink}.{subtask}")),
        }
    }

    /// The current epoch (0 when no instance recovered yet).
    pub(crate) fn read(&self) -> std::io::Result<u64> {
        match fs::read_to_string(&self.path) {
            Ok(text) => text.trim().parse().map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} holds {text:?}, not an epoch: {e}", self.path.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Raises the epoch by one, durably, and returns the new epoch.
    pub(crate) fn bump(&self) -> std::io::Result<u64> {
        let epoch = self.read()? + 1;
        let tmp = self.path.with_extension("tmp");
        let mut file = File::create(&tmp)?;
        file.write_all(epoch.to_string().as_bytes())?;
        file.sync_all()?;
        fs::rename(&tmp, &self.path)?;
        File::open(self.path.parent().expect("owner file has a directory"))?.sync_all()?;
        Ok(epoch)
    }
}
