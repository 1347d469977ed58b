//! How a job deals its source partitions to its subtasks ([`PartitionLayout`]), recorded in the checkpoint store
//! beside the subtask count and, like it, fixed for the job's life: a job that switched between one `topic` and
//! `topics` / `topic_pattern` would hand partitions to subtasks that do not hold their positions, which would read
//! them again from the beginning.

use anyhow::{Result, bail};
use kafka_source::TopicSelection;

use super::JobStore;

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

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::OneTopic => "one-topic",
            Self::Topics => "topics",
        }
    }

    pub(super) fn parse(text: &str) -> Option<Self> {
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

/// Checks `layout` against the one the job recorded, recording it (with `write`) when there is none
/// ([`JobStore::partition_layout`]). Run after [`JobStore::record`], under the job's hold.
///
/// # Errors
/// The recorded layout differs (named, with what to do); the store cannot be read or written.
pub async fn check(store: &dyn JobStore, layout: PartitionLayout, write: bool) -> Result<()> {
    let job = store.job();
    match store.partition_layout(layout, write).await? {
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
