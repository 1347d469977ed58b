//! The local store's job state ([`LocalJobStore`]): files in the job's directory `<path>/<job>/`, each written
//! by one atomic replace, and a directory per subtask and layout generation. The job's lock file (taken by
//! [`crate::membership::local`]) admits one process, so nothing here needs a lock of its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;
use checkpoint_postgres::PgStoreLimits;
use connector_api::{CheckpointStore, LocalCheckpointStore, OwnerEpoch, SubtaskId};
use serde::{Deserialize, Serialize};

use super::layout::PartitionLayout;
use super::{Identity, JobRecord, JobStore, LayoutChange, RETAIN, RescaleLock, store_key};

/// The job state of one job in a local store's directory.
pub struct LocalJobStore {
    /// The store's directory (`[store] path`).
    root: PathBuf,
    /// The job's directory in it.
    dir: PathBuf,
    job: String,
}

impl LocalJobStore {
    /// Job `job` in the local store at `root`. Touches nothing on disk until written.
    pub fn new(root: &Path, job: &str) -> Self {
        Self {
            root: root.to_path_buf(),
            dir: root.join(job),
            job: job.to_string(),
        }
    }

    /// The directory of `subtask` in layout `generation`.
    fn subtask_dir(&self, generation: u64, subtask: SubtaskId) -> PathBuf {
        self.root
            .join(store_key(&self.job, generation))
            .join(format!("subtask-{}", subtask.0))
    }
}

#[async_trait]
impl JobStore for LocalJobStore {
    fn job(&self) -> &str {
        &self.job
    }

    async fn record(&self, subtasks: u32, write: bool) -> Result<Option<JobRecord>> {
        local_job(&self.dir, subtasks, write)
    }

    async fn generation(&self) -> Result<u64> {
        Ok(local_layout(&self.dir)?.map_or(0, |l| l.generation))
    }

    async fn history(&self) -> Result<Vec<LayoutChange>> {
        Ok(local_layout(&self.dir)?.map_or_else(Vec::new, |l| l.history))
    }

    async fn partition_layout(
        &self,
        layout: PartitionLayout,
        write: bool,
    ) -> Result<Option<PartitionLayout>> {
        local_partition_layout(&self.dir, layout, write)
    }

    async fn lock_rescale(&self, _patience: Duration) -> Result<RescaleLock> {
        // The job's lock file, held by the rescale's exclusive hold, admits one process.
        Ok(RescaleLock::holding(None))
    }

    async fn switch(
        &self,
        generation: u64,
        from: u32,
        to: u32,
        _owners: &BTreeMap<u32, OwnerEpoch>,
    ) -> Result<()> {
        let change = LayoutChange::now(generation, from, to);

        // The local lock keeps every other process out: no claim can have moved.
        let dir = &self.dir;
        let mut history = local_layout(dir)?.map_or_else(Vec::new, |l| l.history);
        history.push(change);
        let layout = LocalLayout {
            generation: generation + 1,
            subtasks: to,
            history,
        };
        connector_common::fs::replace_file(
            dir,
            &dir.join(LOCAL_LAYOUT),
            &serde_json::to_vec_pretty(&layout)?,
        )
        .with_context(|| format!("cannot write {}", dir.join(LOCAL_LAYOUT).display()))?;
        Ok(())
    }

    async fn purge(&self, generation: u64) -> Result<()> {
        let dir = self.root.join(store_key(&self.job, generation));
        if generation > 0 {
            return match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("cannot remove {}", dir.display()))
                }
                _ => Ok(()),
            };
        }
        // The first layout's records share the job's directory with its identity files.
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
        };
        for entry in entries {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with("subtask-") {
                std::fs::remove_dir_all(entry.path())
                    .with_context(|| format!("cannot remove {}", entry.path().display()))?;
            }
        }
        Ok(())
    }

    async fn checkpoints(
        &self,
        generation: u64,
        subtask: SubtaskId,
        _limits: PgStoreLimits,
        create: bool,
    ) -> connector_api::Result<Option<Box<dyn CheckpointStore>>> {
        let dir = self.subtask_dir(generation, subtask);
        Ok(if create {
            Some(Box::new(LocalCheckpointStore::open(dir, RETAIN)?))
        } else {
            LocalCheckpointStore::open_existing(dir, RETAIN)?
                .map(|store| Box::new(store) as Box<dyn CheckpointStore>)
        })
    }
}

/// A local store's `layout.json`: written once a job's subtask count first changes, replaced atomically at each
/// change; its count overrides the `subtasks` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct LocalLayout {
    /// The layout generation.
    pub generation: u64,
    /// The subtask count.
    pub subtasks: u32,
    /// Every change so far, oldest first.
    pub history: Vec<LayoutChange>,
}

/// The local store's layout file, in the job's directory.
const LOCAL_LAYOUT: &str = "layout.json";

/// The local store's layout file of the job directory `dir`, if the job was ever rescaled.
///
/// # Errors
/// The file cannot be read or does not parse (named).
fn local_layout(dir: &Path) -> Result<Option<LocalLayout>> {
    let file = dir.join(LOCAL_LAYOUT);
    match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("{} does not parse", file.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", file.display())),
    }
}

/// The local store's record of a job: `<dir>/subtasks` and `<dir>/identity`, or for a job from before they were
/// recorded, its `subtask-<n>` directories (and the sink-id identity). Records a fresh job's.
fn local_job(
    dir: &std::path::Path,
    subtasks: u32,
    record: bool,
) -> anyhow::Result<Option<JobRecord>> {
    // After a rescale, the layout file holds the count and generation (written in one atomic replace).
    let layout = local_layout(dir)?;
    let count_file = dir.join("subtasks");
    let identity_file = dir.join("identity");
    let counted = connector_common::fs::read_number(&count_file)
        .with_context(|| format!("cannot read {}", count_file.display()))?;
    let identity = match std::fs::read_to_string(&identity_file) {
        Ok(text) => Some(Identity::parse(&text).with_context(|| {
            format!(
                "{} holds {text:?}, not `job` or `sink`",
                identity_file.display()
            )
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read {}", identity_file.display()));
        }
    };
    // A job from before the count was recorded: its subtask directories say how many it had.
    let inferred = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("subtask-")?
                .parse::<u32>()
                .ok()
        })
        .max()
        .map(|highest| highest + 1);
    let count = match (&layout, counted) {
        (Some(layout), _) => Some(layout.subtasks),
        (None, Some(n)) => Some(u32::try_from(n)?),
        (None, None) => inferred,
    };
    let generation = layout.as_ref().map_or(0, |l| l.generation);
    let found = match (count, identity) {
        (None, _) => None,
        (Some(count), Some(identity)) => Some((count, identity)),
        // Ran before identities were recorded: its sinks are sink-scoped.
        (Some(count), None) => Some((count, Identity::Sink)),
    };
    let found = JobRecord::found(found, generation);
    if !record {
        return Ok(found);
    }
    let (count, identity) = JobRecord::to_record(found, subtasks);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if counted.is_none() {
        connector_common::fs::replace_file(dir, &count_file, count.to_string().as_bytes())
            .with_context(|| format!("cannot write {}", count_file.display()))?;
    }
    if identity_file.metadata().is_err() {
        connector_common::fs::replace_file(dir, &identity_file, identity.as_str().as_bytes())
            .with_context(|| format!("cannot write {}", identity_file.display()))?;
    }
    Ok(found)
}

/// `<dir>/partition_layout`; absent: [`PartitionLayout::OneTopic`] when the job has checkpoint directories.
fn local_partition_layout(
    dir: &std::path::Path,
    layout: PartitionLayout,
    record: bool,
) -> Result<Option<PartitionLayout>> {
    let file = dir.join("partition_layout");
    let recorded = match std::fs::read_to_string(&file) {
        Ok(text) => Some(
            PartitionLayout::parse(&text)
                .with_context(|| format!("{} holds {text:?}", file.display()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    if recorded.is_some() {
        return Ok(recorded);
    }
    let ran = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("subtask-"));
    let found = ran.then_some(PartitionLayout::OneTopic);
    if record {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let layout = found.unwrap_or(layout);
        connector_common::fs::replace_file(dir, &file, layout.as_str().as_bytes())
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::jobstore::subtask_store::SubtaskStore;

    #[test]
    fn a_fresh_local_job_is_recorded_job_scoped_and_a_read_only_look_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("orders");
        assert_eq!(local_job(&job, 3, false).unwrap(), None);
        assert!(
            !job.exists(),
            "a read-only look created the job's directory"
        );
        assert_eq!(local_job(&job, 3, true).unwrap(), None);
        assert_eq!(
            local_job(&job, 3, false).unwrap(),
            Some(JobRecord {
                subtasks: 3,
                identity: Identity::Job,
                generation: 0
            })
        );
    }

    #[test]
    fn a_local_job_from_before_keeps_its_count_and_its_sink_id_scope() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("orders");
        std::fs::create_dir_all(job.join("subtask-0")).unwrap();
        std::fs::create_dir_all(job.join("subtask-1")).unwrap();
        assert_eq!(
            local_job(&job, 2, false).unwrap(),
            Some(JobRecord {
                subtasks: 2,
                identity: Identity::Sink,
                generation: 0
            })
        );
        assert_eq!(
            local_job(&job, 2, true).unwrap(),
            Some(JobRecord {
                subtasks: 2,
                identity: Identity::Sink,
                generation: 0
            })
        );
        assert_eq!(
            std::fs::read_to_string(job.join("identity")).unwrap(),
            "sink"
        );
        // Recorded from now on, whatever directories come later.
        std::fs::create_dir_all(job.join("subtask-2")).unwrap();
        assert_eq!(
            local_job(&job, 2, false).unwrap(),
            Some(JobRecord {
                subtasks: 2,
                identity: Identity::Sink,
                generation: 0
            })
        );
    }

    #[test]
    fn a_local_job_keeps_the_layout_it_started_with() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("orders");
        assert_eq!(
            local_partition_layout(&job, PartitionLayout::Topics, false).unwrap(),
            None
        );
        assert!(!job.exists(), "a read-only look wrote something");
        assert_eq!(
            local_partition_layout(&job, PartitionLayout::Topics, true).unwrap(),
            None
        );
        assert_eq!(
            local_partition_layout(&job, PartitionLayout::OneTopic, false).unwrap(),
            Some(PartitionLayout::Topics)
        );
        // A job from before layouts were recorded read one topic.
        let old = dir.path().join("old");
        std::fs::create_dir_all(old.join("subtask-0")).unwrap();
        assert_eq!(
            local_partition_layout(&old, PartitionLayout::Topics, true).unwrap(),
            Some(PartitionLayout::OneTopic)
        );
        assert_eq!(
            local_partition_layout(&old, PartitionLayout::Topics, false).unwrap(),
            Some(PartitionLayout::OneTopic)
        );
    }

    fn limits() -> checkpoint_postgres::PgStoreLimits {
        checkpoint_postgres::PgStoreLimits::default()
    }

    #[tokio::test]
    async fn a_claim_in_a_layout_the_job_has_left_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let jobs: Arc<dyn JobStore> = Arc::new(LocalJobStore::new(dir.path(), "orders"));
        let old = SubtaskStore::open(&jobs, 0, SubtaskId(1), limits())
            .await
            .unwrap();
        old.claim().await.unwrap();
        jobs.switch(0, 2, 3, &BTreeMap::new()).await.unwrap();
        let refused = old.claim().await.unwrap_err();
        assert_eq!(refused.kind(), connector_api::ErrorKind::Config);
        assert!(
            refused
                .to_string()
                .contains("was rescaled while this process ran"),
            "{refused}"
        );
        let new = SubtaskStore::open(&jobs, 1, SubtaskId(1), limits())
            .await
            .unwrap();
        new.claim().await.unwrap();
        let layout = local_layout(&dir.path().join("orders")).unwrap().unwrap();
        assert_eq!((layout.generation, layout.subtasks), (1, 3));
        assert_eq!(layout.history.len(), 1);
    }

    #[tokio::test]
    async fn retiring_removes_only_older_layouts_records() {
        let dir = tempfile::tempdir().unwrap();
        let jobs: Arc<dyn JobStore> = Arc::new(LocalJobStore::new(dir.path(), "orders"));
        for generation in [0, 1, 2] {
            let store =
                SubtaskStore::open_next_generation(&jobs, generation, SubtaskId(0), limits())
                    .await
                    .unwrap();
            store.claim().await.unwrap();
        }
        std::fs::write(dir.path().join("orders").join("identity"), "job").unwrap();
        jobs.retire_old_generations(2).await.unwrap();
        assert!(!dir.path().join("orders").join("subtask-0").exists());
        assert!(dir.path().join("orders").join("identity").exists());
        assert!(!dir.path().join("orders@1").exists());
        assert!(dir.path().join("orders@2").join("subtask-0").exists());
    }
}
