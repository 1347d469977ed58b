//! How a job deals its source partitions to its subtasks ([`PartitionLayout`]), recorded in the checkpoint store
//! beside the subtask count and, like it, fixed for the job's life: a job that switched between one `topic` and
//! `topics` / `topic_pattern` would hand partitions to subtasks that do not hold their positions, which would read
//! them again from the beginning.

use anyhow::{Context, Result, bail};
use kafka_source::TopicSelection;

use crate::config::StoreConfig;

/// How partitions are dealt ([`kafka_source::PartitionShare`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionLayout {
    /// `topic`: partition `p` to subtask `p % subtasks`.
    OneTopic,
    /// `topics` or `topic_pattern`: partition `p` of topic `t` to subtask `(FNV-1a(t) + p) % subtasks`.
    Topics,
}

impl PartitionLayout {
    /// The layout a job reading `selection` uses.
    pub fn of(selection: &TopicSelection) -> Self {
        match selection {
            TopicSelection::One(_) => Self::OneTopic,
            TopicSelection::List(_) | TopicSelection::Pattern { .. } => Self::Topics,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::OneTopic => "one-topic",
            Self::Topics => "topics",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "one-topic" => Some(Self::OneTopic),
            "topics" => Some(Self::Topics),
            _ => None,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::OneTopic => "one `topic`",
            Self::Topics => "`topics` or `topic_pattern`",
        }
    }
}

/// Checks `layout` against the one `job` recorded, recording it (with `record`) when there is none: for a job
/// that never claimed a subtask, `layout`; for one that ran before layouts were recorded, [`OneTopic`]
/// (the only one there was). Run after [`crate::jobstore::store::job_identity`], under the job's local lock.
///
/// [`OneTopic`]: PartitionLayout::OneTopic
///
/// # Errors
/// The recorded layout differs (named, with what to do); the store cannot be read or written.
pub async fn check(
    config: &StoreConfig,
    job: &str,
    layout: PartitionLayout,
    record: bool,
) -> Result<()> {
    let recorded = match config {
        StoreConfig::Local { path } => local(&path.join(job), layout, record)?,
        StoreConfig::Postgres { url } => {
            crate::jobstore::store_calls::retried("recording the job's partition layout", || {
                postgres(url, job, layout, record)
            })
            .await?
        }
    };
    match recorded {
        Some(recorded) if recorded != layout => bail!(
            "job {job:?} read {} when it started, and its job file now reads {}: the two deal partitions to \
             subtasks differently, so subtasks would read partitions whose positions another subtask holds, from \
             the beginning. Go back to {} (nothing was written under the new selection). Running the new \
             selection as a new job (a new [job] name) reads its topics from the beginning again: every record \
             already in the sinks would be written a second time, unless every sink upserts by key",
            recorded.describe(),
            layout.describe(),
            recorded.describe()
        ),
        _ => Ok(()),
    }
}

/// `<dir>/partition_layout`; absent: [`PartitionLayout::OneTopic`] when the job has checkpoint directories.
fn local(
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

/// `ratchet_jobs.partition_layout`; null: [`PartitionLayout::OneTopic`] when the job has claim rows.
async fn postgres(
    url: &str,
    job: &str,
    layout: PartitionLayout,
    record: bool,
) -> Result<Option<PartitionLayout>> {
    let client = crate::jobstore::store_calls::store_session(url).await?;
    let has_column: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                    WHERE table_name = 'ratchet_jobs' AND column_name = 'partition_layout'
                      AND table_schema = current_schema())",
            &[],
        )
        .await
        .context("cannot look for ratchet_jobs.partition_layout")?
        .get(0);
    if !has_column && !record {
        return Ok(None);
    }
    if !has_column {
        client
            .batch_execute(
                "ALTER TABLE ratchet_jobs ADD COLUMN IF NOT EXISTS partition_layout text",
            )
            .await
            .context("cannot add partition_layout to ratchet_jobs")?;
    }
    // Claim rows mean the job ran (the table is there from its first claim on).
    let has_owners: bool = client
        .query_one(
            "SELECT to_regclass('ratchet_checkpoint_owners') IS NOT NULL",
            &[],
        )
        .await
        .context("cannot look for ratchet_checkpoint_owners")?
        .get(0);
    let ran = has_owners
        && client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM ratchet_checkpoint_owners WHERE job = $1)",
                &[&job],
            )
            .await
            .context("cannot read the job's claim rows")?
            .get::<_, bool>(0);
    if record {
        // A job that ran before layouts were recorded read one topic; a fresh one records its own. Two fresh
        // starts at once: the first update wins, the other finds its row set and compares below.
        let fill = if ran {
            PartitionLayout::OneTopic
        } else {
            layout
        };
        client
            .execute(
                "UPDATE ratchet_jobs SET partition_layout = $2 WHERE job = $1 AND partition_layout IS NULL",
                &[&job, &fill.as_str()],
            )
            .await
            .context("cannot record the partition layout in ratchet_jobs")?;
    }
    let row = client
        .query_opt(
            "SELECT partition_layout FROM ratchet_jobs WHERE job = $1",
            &[&job],
        )
        .await
        .context("cannot read ratchet_jobs")?;
    let recorded = row.and_then(|row| row.get::<_, Option<String>>(0));
    match recorded {
        Some(text) => Ok(Some(PartitionLayout::parse(&text).with_context(|| {
            format!("ratchet_jobs holds partition_layout {text:?} for job {job:?}")
        })?)),
        None => Ok(ran.then_some(PartitionLayout::OneTopic)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_job_keeps_the_layout_it_started_with() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("orders");
        assert_eq!(local(&job, PartitionLayout::Topics, false).unwrap(), None);
        assert!(!job.exists(), "a read-only look wrote something");
        assert_eq!(local(&job, PartitionLayout::Topics, true).unwrap(), None);
        assert_eq!(
            local(&job, PartitionLayout::OneTopic, false).unwrap(),
            Some(PartitionLayout::Topics)
        );
        // A job from before layouts were recorded read one topic.
        let old = dir.path().join("old");
        std::fs::create_dir_all(old.join("subtask-0")).unwrap();
        assert_eq!(
            local(&old, PartitionLayout::Topics, true).unwrap(),
            Some(PartitionLayout::OneTopic)
        );
        assert_eq!(
            local(&old, PartitionLayout::Topics, false).unwrap(),
            Some(PartitionLayout::OneTopic)
        );
    }
}
