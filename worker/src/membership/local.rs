//! The local store's membership ([`LocalLease`]): one process runs every subtask, holding an exclusive lock on
//! `<path>/<job>/worker.lock`; a second process is refused at start.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;

use super::{Assignment, Membership};

/// The local store's single process: holds every subtask while it holds `<dir>/worker.lock`.
pub struct LocalLease {
    _lock: File,
    subtasks: u32,
}

impl LocalLease {
    /// Takes the job's lock in `dir`.
    ///
    /// # Errors
    /// Another process runs the job on this directory.
    pub fn take(dir: &Path, job: &str, subtasks: u32) -> Result<Self> {
        let dir = dir.join(job);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
        let path = dir.join("worker.lock");
        let lock = connector_common::fs::lock_exclusive(&path, Duration::ZERO).with_context(
            || {
                format!(
                    "another ratchet process runs job {job:?} on the local store {} (it holds {}): the local \
                     store serves one process; stop the other one, or use [store] kind = \"postgres\" to run \
                     several processes",
                    dir.display(),
                    path.display()
                )
            },
        )?;
        Ok(Self {
            _lock: lock,
            subtasks,
        })
    }
}

#[async_trait]
impl Membership for LocalLease {
    async fn renew(&self) -> Result<Assignment> {
        Ok(Assignment {
            handing: BTreeSet::new(),
            held: (0..self.subtasks).collect(),
            quota: self.subtasks as usize,
            members: 1,
        })
    }

    async fn release(&self, _subtask: u32) -> Result<()> {
        Ok(())
    }

    async fn leave(&self) -> Result<()> {
        Ok(())
    }

    fn mode(&self) -> String {
        "local lock".into()
    }
}
