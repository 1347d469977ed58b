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

use crate::topics::{PartitionShare, TopicPartition, TopicSelection};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The topic.
    pub topic: String,
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
    selection: &TopicSelection,
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
        .filter(|&&p| share.is_none_or(|s| s.holds(selection, topic, p)))
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

/// What the source shares with its consumer thread: the partitions assigned and the topics' ids, kept up to date
/// as the thread finds new partitions and topics.
#[derive(Debug, Default)]
pub(crate) struct Assigned {
    /// Every partition assigned.
    pub(crate) partitions: BTreeSet<TopicPartition>,
    /// Each read topic's id (saved with its positions).
    pub(crate) ids: BTreeMap<String, String>,
    /// When the last metadata refresh that read the cluster's metadata began.
    pub(crate) refreshed_at: Option<Instant>,
    /// A refresh asked for now (ahead of `metadata_refresh`).
    pub(crate) refresh_asked: bool,
}

/// One topic being read.
pub(crate) struct TopicState {
    pub(crate) id: Option<TopicId>,
    /// Per assigned partition, the offset after the last record the thread took (or where it was assigned;
    /// `None`: from the log start, nothing taken yet).
    pub(crate) fetched: BTreeMap<i32, Option<i64>>,
}

impl TopicState {
    pub(crate) fn opened(opened: Opened) -> Self {
        Self {
            id: opened.id,
            fetched: opened.start,
        }
    }
}

/// The partitions being read and the state needed to keep them right, owned by the consumer thread.
pub(crate) struct Assignment {
    pub(crate) kafka: KafkaConnection,
    pub(crate) selection: TopicSelection,
    /// The positions the source opened with: where a topic found later starts, when one was saved for it.
    pub(crate) restored: Vec<SourceOffset>,
    pub(crate) topics: BTreeMap<String, TopicState>,
    pub(crate) share: Option<PartitionShare>,
    pub(crate) on_gap: GapPolicy,
    pub(crate) refresh_every: Duration,
    /// The assigned partitions and topic ids, shared with the source (positions, lag, metrics).
    pub(crate) assigned: Arc<Mutex<Assigned>>,
    pub(crate) refreshed: Instant,
    /// Topics the pattern matches that the job writes itself, skipped (each said once).
    pub(crate) skipped_as_written: BTreeSet<String>,
    /// For the protocol-level metadata requests of this thread (built on first use, on the consumer thread).
    pub(crate) runtime: Option<tokio::runtime::Runtime>,
}

impl Assignment {
    /// The assignment that [`open`] chose, to hand to librdkafka.
    pub(crate) fn partition_list(&self) -> Result<TopicPartitionList> {
        let mut list = TopicPartitionList::new();
        for (topic, state) in &self.topics {
            add(&mut list, topic, &state.fetched, Phase::Setup)?;
        }
        Ok(list)
    }

    /// Tells the source what is assigned now.
    pub(crate) fn publish(&self) {
        let mut assigned = self.assigned.lock().expect("not poisoned");
        assigned.partitions = self
            .topics
            .iter()
            .flat_map(|(topic, state)| {
                state
                    .fetched
                    .keys()
                    .map(|&p| TopicPartition::new(topic.clone(), p))
            })
            .collect();
        for (topic, state) in &self.topics {
            if let Some(id) = state.id {
                assigned.ids.insert(topic.clone(), id.to_string());
            }
        }
    }

    /// Notes that the thread took records of `partition` of `topic` up to `next` (exclusive).
    pub(crate) fn took(&mut self, topic: &str, partition: i32, next: i64) {
        if let Some(state) = self.topics.get_mut(topic) {
            state.fetched.insert(partition, Some(next));
        }
    }

    /// The partitions whose consumer position is past the last record taken, with that position: librdkafka moves
    /// the position past what read_committed skips (transaction markers, aborted records) once the fetch reached
    /// it, so nothing between was handed out. A position that cannot be read is left for the next call.
    pub(crate) fn past_skipped(&self, consumer: &BaseConsumer) -> Vec<(TopicPartition, i64)> {
        let positions = match consumer.position() {
            Ok(positions) => positions,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the consumer's positions");
                return Vec::new();
            }
        };
        positions
            .elements()
            .iter()
            .filter_map(|element| {
                let rdkafka::Offset::Offset(position) = element.offset() else {
                    return None;
                };
                let taken = self
                    .topics
                    .get(element.topic())?
                    .fetched
                    .get(&element.partition())
                    .copied()
                    .flatten()?;
                (position > taken).then(|| {
                    (
                        TopicPartition::new(element.topic(), element.partition()),
                        position,
                    )
                })
            })
            .collect()
    }

    /// Whether the periodic metadata refresh is due.
    pub(crate) fn refresh_due(&self) -> bool {
        self.refreshed.elapsed() >= self.refresh_every
            || self.assigned.lock().expect("not poisoned").refresh_asked
    }

    /// Reads the topics' metadata again: a topic deleted (or deleted and created again) stops the source; a
    /// partition added since (in this share) is assigned from its log start; with a pattern, a topic created since
    /// that matches it is assigned (from a position saved for it, or its log start). A metadata request that
    /// fails is only logged: the next refresh asks again (and the consumer reports a cluster that stays away).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when a topic is gone or is another topic now.
    pub(crate) fn refresh(&mut self, consumer: &BaseConsumer) -> Result<()> {
        let began = Instant::now();
        self.refreshed = began;
        let read = self.refresh_from_metadata(consumer)?;
        let mut assigned = self.assigned.lock().expect("not poisoned");
        assigned.refresh_asked = false;
        if read {
            assigned.refreshed_at = Some(began);
        }
        Ok(())
    }

    /// [`refresh`](Self::refresh)'s work; whether the cluster's metadata could be read.
    fn refresh_from_metadata(&mut self, consumer: &BaseConsumer) -> Result<bool> {
        let runtime = match &self.runtime {
            Some(runtime) => runtime,
            None => match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => self.runtime.insert(runtime),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the metadata refresh runtime; partitions are not refreshed");
                    return Ok(false);
                }
            },
        };
        let named = self.selection.named();
        let metadata = match runtime.block_on(
            self.kafka
                .topics_metadata(named.as_deref(), REQUEST_TIMEOUT),
        ) {
            Ok(metadata) => metadata,
            Err(e) => {
                tracing::warn!(source = %self.selection, error = %connector_api::Report(&e),
                    "cannot refresh the topics' metadata; trying again later");
                return Ok(false);
            }
        };
        let mut list = TopicPartitionList::new();
        let mut added: Vec<(String, Vec<i32>)> = Vec::new();
        for (topic, state) in &mut self.topics {
            let Some(now) = metadata.get(topic) else {
                return Err(Error::new(
                    ErrorKind::Config,
                    Phase::Write,
                    format!("topic {topic} no longer exists: it was deleted while the job read it"),
                ));
            };
            if let (Some(then), Some(id)) = (state.id, now.id)
                && then != id
            {
                return Err(recreated(
                    topic,
                    &format!("its topic id changed from {then} to {id} while the job read it"),
                )
                .at_phase(Phase::Write));
            }
            let new: BTreeMap<i32, Option<i64>> = now
                .partitions
                .iter()
                .copied()
                .filter(|&p| {
                    self.share
                        .is_none_or(|s| s.holds(&self.selection, topic, p))
                })
                .filter(|p| !state.fetched.contains_key(p))
                .map(|p| (p, None))
                .collect();
            if !new.is_empty() {
                add(&mut list, topic, &new, Phase::Write)?;
                added.push((topic.clone(), new.keys().copied().collect()));
                state.fetched.extend(new);
            }
        }
        let mut found = Vec::new();
        for (topic, now) in &metadata {
            if self.selection.skips_as_written(topic)
                && self.skipped_as_written.insert(topic.clone())
            {
                tracing::warn!(%topic, source = %self.selection,
                    "a new topic matches the source's pattern, but this job writes it (a Kafka sink's or the \
                     dead-letter topic): skipped, a job never reads what it writes");
            }
            if self.topics.contains_key(topic)
                || !self.selection.selects(topic)
                || now.partitions.is_empty()
            {
                continue;
            }
            let opened = open(topic, now, &self.restored, self.share, &self.selection)
                .map_err(|e| e.at_phase(Phase::Write))?;
            add(&mut list, topic, &opened.start, Phase::Write)?;
            found.push(topic.clone());
            self.topics
                .insert(topic.clone(), TopicState::opened(opened));
        }
        if list.count() == 0 {
            return Ok(true);
        }
        consumer.incremental_assign(&list).map_err(|e| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Write,
                format!("cannot assign the new partitions of {}", self.selection),
            )
            .with_source(e)
        })?;
        for (topic, partitions) in added {
            tracing::info!(%topic, ?partitions,
                "the topic has new partitions; reading them from their beginning");
        }
        for topic in found {
            tracing::info!(%topic, source = %self.selection,
                "a new topic is selected; reading it (from a saved position, or its beginning)");
        }
        self.publish();
        Ok(true)
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
        let fetched: Vec<(String, i32, i64)> = self
            .topics
            .iter()
            .flat_map(|(topic, state)| {
                state
                    .fetched
                    .iter()
                    .filter_map(|(&p, next)| next.map(|n| (topic.clone(), p, n)))
            })
            .collect();
        for (topic, partition, next_offset) in fetched {
            let (log_start, log_end) = consumer
                .fetch_watermarks(&topic, partition, REQUEST_TIMEOUT)
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Retryable,
                        Phase::Write,
                        format!(
                            "an offset of topic {topic} is out of range, and the watermarks of partition {partition} cannot be read"
                        ),
                    )
                    .with_source(e)
                })?;
            if next_offset > log_end {
                return Err(Error::new(
                    ErrorKind::Config,
                    Phase::Write,
                    format!(
                        "topic {topic} partition {partition}: the next offset to read, {next_offset}, is past the end of \
                         the log ({log_end}): the partition lost records the job had read (the topic was deleted \
                         and created again, or an unclean leader election truncated it). Reading on from another \
                         offset would skip or repeat records; check the topic, then run the job anew"
                    ),
                ));
            }
            if next_offset >= log_start {
                continue;
            }
            let gap = Gap {
                topic: topic.clone(),
                partition,
                next_offset,
                log_start,
            };
            if self.on_gap == GapPolicy::Fail {
                return Err(Error::new(
                    ErrorKind::Config,
                    Phase::Write,
                    format!(
                        "topic {topic} partition {partition}: the next offset to read, {next_offset}, is below the log \
                         start offset {log_start}: {} record offset(s) were removed (retention, compaction or \
                         DeleteRecords) before the job read them. Restore them, or set [source] on_gap = \
                         \"earliest\" to go on from the log start without them",
                        gap.skipped()
                    ),
                ));
            }
            restart_at_log_start(consumer, &topic, partition)?;
            tracing::warn!(%topic, partition, next_offset, log_start, skipped = gap.skipped(),
                "records were removed from the log before the job read them (on_gap = earliest): going on from \
                 the log start");
            self.took(&topic, partition, log_start);
            gaps.push(gap);
        }
        if gaps.is_empty() {
            return Err(Error::new(
                ErrorKind::Retryable,
                Phase::Write,
                format!(
                    "the Kafka consumer reports an offset of {} out of range, but no partition's next offset \
                     is outside its log now; restarting from the last checkpoint",
                    self.selection
                ),
            ));
        }
        Ok(gaps)
    }
}

/// Adds `partitions` of `topic` to `list`, each at its offset (`None`: the log start).
fn add(
    list: &mut TopicPartitionList,
    topic: &str,
    partitions: &BTreeMap<i32, Option<i64>>,
    phase: Phase,
) -> Result<()> {
    for (&partition, offset) in partitions {
        let offset = offset.map_or(Offset::Beginning, Offset::Offset);
        list.add_partition_offset(topic, partition, offset)
            .map_err(|e| {
                Error::new(ErrorKind::Bug, phase, "cannot build the assignment").with_source(e)
            })?;
    }
    Ok(())
}

/// Assigns `partition` of `topic` again from its log start (librdkafka stops fetching a partition whose offset
/// reset failed, and a seek does not restart it).
fn restart_at_log_start(consumer: &BaseConsumer, topic: &str, partition: i32) -> Result<()> {
    let mut list = TopicPartitionList::new();
    list.add_partition(topic, partition);
    let failed = |what: &str, e: rdkafka::error::KafkaError| {
        Error::new(
            ErrorKind::Retryable,
            Phase::Write,
            format!("cannot {what} partition {partition} of topic {topic}"),
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
