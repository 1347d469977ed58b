//! Which partitions the source reads, from where, and keeping that true while it runs: the topic's identity
//! (a topic deleted and created again under the same name is refused, never read from old offsets), partitions
//! added while running (assigned from their beginning), and positions that fell out of the log (a gap: records
//! removed by retention, compaction or DeleteRecords before they were read), handled as [`GapPolicy`] says.
//!
//! librdkafka is told `auto.offset.reset=error`, so it never moves a position by itself: an offset out of range
//! comes back as an error, and this module finds the partition, says what was lost, and either stops the source or
//! goes on from the log start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use connector_api::{Error, ErrorKind, Phase, Result, SourceOffset};
use kafka_connection::{KafkaConnection, TopicId, TopicMetadata};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::PartitionShare;

/// How long a metadata or watermark request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the source does when the next offset of a partition is below the partition's log start: the records in
/// between were removed (retention, compaction, DeleteRecords, a topic truncated) before the job read them.
///
/// A partition with no saved position is never a gap: it is read from its log start, as a new job reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GapPolicy {
    /// Stop the source with an error naming the topic, partition, the next offset and the log start (a
    /// [`Config`](ErrorKind::Config) error: restarting does not bring the records back).
    #[default]
    Fail,
    /// Go on from the log start; the gap is logged once and reported ([`KafkaSource::take_gaps`](crate::KafkaSource)).
    Earliest,
}

/// Records a partition skipped under [`GapPolicy::Earliest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// The partition.
    pub partition: i32,
    /// The offset the source was to read next.
    pub next_offset: i64,
    /// The log start it went on from: offsets `next_offset..log_start` were never read.
    pub log_start: i64,
}

impl Gap {
    /// How many offsets were skipped.
    pub fn skipped(&self) -> i64 {
        self.log_start - self.next_offset
    }
}

/// The topic as the source found it at open, checked against what the checkpoint restored.
pub(crate) struct Opened {
    /// Partitions to assign, with where to start (`None`: the log start).
    pub(crate) start: BTreeMap<i32, Option<i64>>,
    /// The topic's id.
    pub(crate) id: Option<TopicId>,
}

/// Checks `metadata` of `topic` against the `restored` positions and picks this share's partitions and where each
/// starts: the saved offset, or the log start for a partition with none.
///
/// # Errors
/// [`Config`](ErrorKind::Config) when the topic was deleted and created again since the positions were saved (its
/// id changed, or a saved partition no longer exists).
pub(crate) fn open(
    topic: &str,
    metadata: &TopicMetadata,
    restored: &[SourceOffset],
    share: Option<PartitionShare>,
) -> Result<Opened> {
    let saved: Vec<&SourceOffset> = restored.iter().filter(|o| o.topic == topic).collect();
    if let (Some(now), Some(then)) = (
        metadata.id,
        saved.iter().find_map(|o| o.topic_id.as_deref()),
    ) && now.to_string() != then
    {
        return Err(recreated(
            topic,
            &format!("its topic id was {then} when the positions were saved and is {now} now"),
        ));
    }
    if let Some(missing) = saved
        .iter()
        .find(|o| !metadata.partitions.contains(&o.partition))
    {
        return Err(recreated(
            topic,
            &format!(
                "a position was saved for partition {} (offset {}), and the topic now has {} partition(s)",
                missing.partition,
                missing.next_offset,
                metadata.partitions.len()
            ),
        ));
    }
    let start = metadata
        .partitions
        .iter()
        .filter(|&&p| share.is_none_or(|s| s.contains(p)))
        .map(|&p| {
            let offset = saved
                .iter()
                .find(|o| o.partition == p)
                .map(|o| o.next_offset);
            (p, offset)
        })
        .collect();
    Ok(Opened {
        start,
        id: metadata.id,
    })
}

fn recreated(topic: &str, evidence: &str) -> Error {
    Error::new(
        ErrorKind::Config,
        Phase::Setup,
        format!(
            "topic {topic} is not the topic this job's positions were saved for ({evidence}): it was deleted and \
             created again, and its offsets started over. Reading it from the saved offsets would skip or repeat \
             records. To read the new topic from its beginning, run it as a new job (a new [job] name, or an empty \
             checkpoint store)"
        ),
    )
}

/// The partitions being read and the state needed to keep them right, owned by the consumer thread.
pub(crate) struct Assignment {
    pub(crate) kafka: KafkaConnection,
    pub(crate) topic: String,
    pub(crate) id: Option<TopicId>,
    pub(crate) share: Option<PartitionShare>,
    pub(crate) on_gap: GapPolicy,
    pub(crate) refresh_every: Duration,
    /// Per assigned partition, the offset after the last record the thread took (or where it was assigned;
    /// `None`: from the log start, nothing taken yet).
    pub(crate) fetched: BTreeMap<i32, Option<i64>>,
    /// The assigned partitions, shared with the source (lag, "caught up", metrics).
    pub(crate) assigned: Arc<Mutex<BTreeSet<i32>>>,
    pub(crate) refreshed: Instant,
    /// For the protocol-level metadata requests of this thread (built on first use, on the consumer thread).
    pub(crate) runtime: Option<tokio::runtime::Runtime>,
}

impl Assignment {
    /// The assignment that [`open`] chose, to hand to librdkafka.
    pub(crate) fn partition_list(&self) -> Result<TopicPartitionList> {
        let mut list = TopicPartitionList::new();
        for (&partition, offset) in &self.fetched {
            let offset = offset.map_or(Offset::Beginning, Offset::Offset);
            list.add_partition_offset(&self.topic, partition, offset)
                .map_err(|e| {
                    Error::new(ErrorKind::Bug, Phase::Setup, "cannot build the assignment")
                        .with_source(e)
                })?;
        }
        Ok(list)
    }

    /// Notes that the thread took records of `partition` up to `next` (exclusive).
    pub(crate) fn took(&mut self, partition: i32, next: i64) {
        self.fetched.insert(partition, Some(next));
    }

    /// Whether the periodic metadata refresh is due.
    pub(crate) fn refresh_due(&self) -> bool {
        self.refreshed.elapsed() >= self.refresh_every
    }

    /// Reads the topic's metadata again: a topic deleted (or deleted and created again) stops the source; a
    /// partition added since (in this share) is assigned from its log start. A metadata request that fails is
    /// only logged: the next refresh asks again (and the consumer reports a cluster that stays away).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the topic is gone or is another topic now.
    pub(crate) fn refresh(&mut self, consumer: &BaseConsumer) -> Result<()> {
        self.refreshed = Instant::now();
        let runtime = match &self.runtime {
            Some(runtime) => runtime,
            None => match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => self.runtime.insert(runtime),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the metadata refresh runtime; partitions are not refreshed");
                    return Ok(());
                }
            },
        };
        let metadata =
            match runtime.block_on(self.kafka.topic_metadata(&self.topic, REQUEST_TIMEOUT)) {
                Ok(metadata) => metadata,
                Err(e) => {
                    tracing::warn!(topic = %self.topic, error = %connector_api::Report(&e),
                    "cannot refresh the topic's metadata; trying again later");
                    return Ok(());
                }
            };
        let Some(metadata) = metadata else {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Write,
                format!(
                    "topic {} no longer exists: it was deleted while the job read it",
                    self.topic
                ),
            ));
        };
        if let (Some(then), Some(now)) = (self.id, metadata.id)
            && then != now
        {
            return Err(recreated(
                &self.topic,
                &format!("its topic id changed from {then} to {now} while the job read it"),
            )
            .at_phase(Phase::Write));
        }
        let added: Vec<i32> = metadata
            .partitions
            .iter()
            .copied()
            .filter(|&p| self.share.is_none_or(|s| s.contains(p)))
            .filter(|p| !self.fetched.contains_key(p))
            .collect();
        if added.is_empty() {
            return Ok(());
        }
        let mut list = TopicPartitionList::new();
        for &partition in &added {
            list.add_partition_offset(&self.topic, partition, Offset::Beginning)
                .map_err(|e| {
                    Error::new(ErrorKind::Bug, Phase::Write, "cannot build the assignment")
                        .with_source(e)
                })?;
        }
        consumer.incremental_assign(&list).map_err(|e| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Write,
                format!(
                    "cannot assign the new partitions {added:?} of topic {}",
                    self.topic
                ),
            )
            .with_source(e)
        })?;
        tracing::info!(topic = %self.topic, partitions = ?added,
            "the topic has new partitions; reading them from their beginning");
        for partition in added {
            self.fetched.insert(partition, None);
        }
        *self.assigned.lock().expect("not poisoned") = self.fetched.keys().copied().collect();
        Ok(())
    }

    /// librdkafka reported an offset out of range: finds each partition whose next offset is outside its log
    /// now, and either fails (a gap under [`GapPolicy::Fail`], or any offset past the log end) or restarts the
    /// partition at its log start and returns the gap.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the topic, partition, next offset and log start (or end);
    /// [`Retryable`](ErrorKind::Retryable) when the watermarks cannot be read or no partition is out of range
    /// any more.
    pub(crate) fn out_of_range(&mut self, consumer: &BaseConsumer) -> Result<Vec<Gap>> {
        let mut gaps = Vec::new();
        let fetched: Vec<(i32, i64)> = self
            .fetched
            .iter()
            .filter_map(|(&p, next)| next.map(|n| (p, n)))
            .collect();
        for (partition, next_offset) in fetched {
            let (log_start, log_end) = consumer
                .fetch_watermarks(&self.topic, partition, REQUEST_TIMEOUT)
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Retryable,
                        Phase::Write,
                        format!(
                            "an offset of topic {} is out of range, and the watermarks of partition {partition} cannot be read",
                            self.topic
                        ),
                    )
                    .with_source(e)
                })?;
            if next_offset > log_end {
                return Err(Error::new(
                    ErrorKind::Config,
                    Phase::Write,
                    format!(
                        "topic {} partition {partition}: the next offset to read, {next_offset}, is past the end of \
                         the log ({log_end}): the partition lost records the job had read (the topic was deleted \
                         and created again, or an unclean leader election truncated it). Reading on from another \
                         offset would skip or repeat records; check the topic, then run the job anew",
                        self.topic
                    ),
                ));
            }
            if next_offset >= log_start {
                continue;
            }
            let gap = Gap {
                partition,
                next_offset,
                log_start,
            };
            if self.on_gap == GapPolicy::Fail {
                return Err(Error::new(
                    ErrorKind::Config,
                    Phase::Write,
                    format!(
                        "topic {} partition {partition}: the next offset to read, {next_offset}, is below the log \
                         start offset {log_start}: {} record offset(s) were removed (retention, compaction or \
                         DeleteRecords) before the job read them. Restore them, or set [source] on_gap = \
                         \"earliest\" to go on from the log start without them",
                        self.topic,
                        gap.skipped()
                    ),
                ));
            }
            self.restart_at_log_start(consumer, partition)?;
            tracing::warn!(topic = %self.topic, partition, next_offset, log_start, skipped = gap.skipped(),
                "records were removed from the log before the job read them (on_gap = earliest): going on from \
                 the log start");
            self.fetched.insert(partition, Some(log_start));
            gaps.push(gap);
        }
        if gaps.is_empty() {
            return Err(Error::new(
                ErrorKind::Retryable,
                Phase::Write,
                format!(
                    "the Kafka consumer reports an offset of topic {} out of range, but no partition's next offset \
                     is outside its log now; restarting from the last checkpoint",
                    self.topic
                ),
            ));
        }
        Ok(gaps)
    }

    /// Assigns `partition` again from its log start (librdkafka stops fetching a partition whose offset reset
    /// failed, and a seek does not restart it).
    fn restart_at_log_start(&self, consumer: &BaseConsumer, partition: i32) -> Result<()> {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.topic, partition);
        let failed = |what: &str, e: rdkafka::error::KafkaError| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Write,
                format!(
                    "cannot {what} partition {partition} of topic {}",
                    self.topic
                ),
            )
            .with_source(e)
        };
        consumer
            .incremental_unassign(&list)
            .map_err(|e| failed("unassign", e))?;
        list.set_all_offsets(Offset::Beginning)
            .map_err(|e| failed("restart", e))?;
        consumer
            .incremental_assign(&list)
            .map_err(|e| failed("reassign", e))
    }
}
