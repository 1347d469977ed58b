//! The read-only rules a job must meet before anything is written, in one place: `ratchet run` checks them at
//! start (before a rescale writes the new layout) and `check-config` reports them. What the source selects now
//! must not include a topic the job writes (its Kafka sinks' or dead-letter topic), its routed names must not
//! collide across the whole job, and its partition layout must be the one the store recorded.

use std::collections::BTreeSet;

use anyhow::Result;
use kafka_source::{KafkaConnection, KafkaSource, TopicSelection};

use crate::config::JobConfig;
use crate::jobstore::JobStore;
use crate::jobstore::layout::PartitionLayout;

/// Checks the topics `job` selects now: never one it writes, and routed names that do not collide.
///
/// # Errors
/// Naming the topic and its writer, or the two topics and the sink whose names collide.
pub fn check_topics(job: &JobConfig, topics: &BTreeSet<String>) -> Result<()> {
    crate::config::refuse_reading_written(job, topics)?;
    crate::job::routing::instances(&job.sinks, topics)?;
    Ok(())
}

/// `job`'s selection, with the topics it selects now read from the cluster and checked ([`check_topics`]).
///
/// # Errors
/// The selection does not parse, the cluster does not answer, or a rule above.
pub async fn checked_selection(job: &JobConfig, kafka: &KafkaConnection) -> Result<TopicSelection> {
    let selection = job.selection()?;
    let topics = KafkaSource::topics_held(kafka, &selection, None).await?;
    check_topics(job, &topics)?;
    Ok(selection)
}

/// Checks `selection`'s partition layout against the one the store recorded, recording it with `write`
/// ([`crate::jobstore::layout::check`]).
///
/// # Errors
/// A different layout recorded (named, with what to do); the store cannot be read or written.
pub async fn check_layout(
    jobs: &dyn JobStore,
    selection: &TopicSelection,
    write: bool,
) -> Result<()> {
    crate::jobstore::layout::check(jobs, PartitionLayout::of(selection), write).await
}
