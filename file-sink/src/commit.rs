//! The commit half of the file sink: publishing staged files (rename, multipart completion, copy of a staged
//! object), refused once a newer instance of the same sink and subtask has recovered.

use std::sync::Arc;

use async_trait::async_trait;
use connector_api::{Committer, Error, Phase, Result, SinkId};

use crate::committable::FileCommittable;
use crate::error::zombie;
use crate::storage::Backend;

/// Publishes a [`FileSink`](crate::FileSink)'s files, unless a newer instance of the same sink and subtask has recovered since
/// this committer was made (then it is fenced).
#[derive(Clone)]
pub struct FileCommitter {
    pub(crate) sink: SinkId,
    pub(crate) backend: Arc<Backend>,
    pub(crate) epoch: u64,
}

#[async_trait]
impl Committer for FileCommitter {
    type Committable = FileCommittable;

    async fn commit(&self, committables: Vec<FileCommittable>) -> Result<()> {
        for committable in committables {
            let checkpoint = committable.checkpoint;
            let context = |e: Error| e.or_sink(&self.sink).or_checkpoint(checkpoint);
            for file in &committable.files {
                // Checked before every file: a zombie stops at the first file after a newer instance recovered.
                let current = self.backend.read_epoch().await.map_err(context)?;
                if current > self.epoch {
                    return Err(context(zombie(Phase::Commit, current, self.epoch)));
                }
                self.backend
                    .publish(file)
                    .await
                    .map_err(|e| context(e).with_txn(file.location()))?;
            }
        }
        Ok(())
    }

    async fn is_committed(&self, committable: &FileCommittable) -> Result<bool> {
        for file in &committable.files {
            if !self.backend.is_published(file).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
