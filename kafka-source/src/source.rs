//! [`KafkaSource`]: the consumer thread's batches, handed to the job with the positions they reach.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use connector_api::{Error, ErrorKind, Phase, Result, SourceOffset};
use kafka_connection::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use tokio::sync::mpsc;

use crate::RejectedRecord;
use crate::decoding::Decoding;
use crate::event::{SourceBatch, SourceEvent};
use crate::metadata::MetadataColumns;
use crate::partitions::{self, Assigned, Assignment, Gap, GapPolicy, TopicState};
use crate::reader::{Chunk, Reader};
use crate::tombstone::Tombstone;
use crate::topics::{PartitionShare, TopicPartition, TopicSelection};

/// How long metadata and watermark requests may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

fn kafka_error(kind: ErrorKind, message: String, e: KafkaError) -> Error {
    Error::new(kind, Phase::Setup, message).with_source(e)
}

/// How the source reads and batches.
///
/// | field | meaning | default |
/// |---|---|---|
/// | `decoding` | how records become rows ([`Decoding`]) | `Text` |
/// | `metadata` | record metadata as columns after the decoding's: topic, partition, offset, timestamp, key (text, binary, JSON or Avro), headers ([`MetadataColumns`], names and types in its module docs) | none |
/// | `batch_rows` | rows per batch at most | 8192 |
/// | `max_batch_wait` | a partial batch is handed out this long after its first record | 50 ms |
/// | `buffered_batches` | decoded batches waiting for the job at most (then the consumer thread waits) | 4 |
/// | `client` | other librdkafka consumer settings (e.g. `fetch.max.bytes`, `queued.max.messages.kbytes`) | none |
/// | `share` | read only this subtask's share of the partitions ([`PartitionShare`]) | every partition |
/// | `divert_bad_records` | set records that do not decode aside ([`KafkaSource::take_rejected`]) instead of failing | false |
/// | `on_gap` | a saved or current position below the log start ([`GapPolicy`]) | `Fail` |
/// | `metadata_refresh` | how often the topics' metadata is read again (new partitions, new topics of a pattern, a deleted or recreated topic) | 30 s |
#[derive(Debug, Clone)]
pub struct KafkaSourceOptions {
    /// How records become rows.
    pub decoding: Decoding,
    /// Record metadata added as columns after the decoding's (topic, partition, offset, timestamp, key, headers).
    pub metadata: MetadataColumns,
    /// Rows per batch at most.
    pub batch_rows: usize,
    /// How long a partial batch waits for more records.
    pub max_batch_wait: Duration,
    /// Decoded batches buffered ahead of the job.
    pub buffered_batches: usize,
    /// Other librdkafka consumer settings. `group.id`, `enable.auto.commit`, `enable.auto.offset.store`,
    /// `isolation.level` and `auto.offset.reset` are the source's own.
    pub client: BTreeMap<String, String>,
    /// Read only this share of the partitions (`None`: all of them).
    pub share: Option<PartitionShare>,
    /// Set records that do not decode aside for a dead-letter destination instead of failing.
    pub divert_bad_records: bool,
    /// What to do about records removed from the log before they were read.
    pub on_gap: GapPolicy,
    /// How often the topics' metadata is read again: partitions added since (and topics created since that a
    /// pattern selects) are read from their beginning, a topic deleted or created again stops the source.
    pub metadata_refresh: Duration,
}

impl Default for KafkaSourceOptions {
    fn default() -> Self {
        Self {
            decoding: Decoding::Text,
            metadata: MetadataColumns::none(),
            batch_rows: 8192,
            max_batch_wait: Duration::from_millis(50),
            buffered_batches: 4,
            client: BTreeMap::new(),
            share: None,
            divert_bad_records: false,
            on_gap: GapPolicy::Fail,
            metadata_refresh: Duration::from_secs(30),
        }
    }
}

/// Where a partition stands: its log start and end (the high watermark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    /// The first offset still in the log.
    pub log_start: i64,
    /// The offset after the last record (the high watermark).
    pub high: i64,
}

/// Reads every partition of the selected topics ([`TopicSelection`]) with `isolation.level=read_committed`, from
/// restored positions, on a consumer thread of its own that decodes records into Arrow batches (each of one topic)
/// while the job writes and checkpoints the previous ones.
///
/// Positions move when the job takes a batch ([`next_batch`](Self::next_batch)), so
/// [`positions`](Self::positions) always covers exactly the batches handed out. Dropping the source stops the
/// thread within about 100 ms.
pub struct KafkaSource {
    consumer: Arc<BaseConsumer>,
    selection: TopicSelection,
    schema: SchemaRef,
    chunks: mpsc::Receiver<Result<Chunk>>,
    closed: Arc<AtomicBool>,
    /// Next offset to hand out, per partition that has a position (restored, or read since). Restored positions
    /// of topics no longer selected stay, so a topic selected again resumes where it stopped.
    next: BTreeMap<TopicPartition, i64>,
    /// Every partition assigned and the topics' ids (the consumer thread adds new ones).
    assigned: Arc<Mutex<Assigned>>,
    /// Records of the batches handed out that did not decode, not yet taken.
    rejected: Vec<RejectedRecord>,
    /// Gaps of the batches handed out, not yet taken.
    gaps: Vec<Gap>,
    /// Tombstones of the batches handed out (JSON and Avro decodings), not yet taken.
    tombstones: Vec<Tombstone>,
    /// The first chunk of a new schema, or of a topic outside `handed_topics`, held back until the job accepts
    /// the change (or reopens the source).
    held: Option<Chunk>,
    /// The only topics whose batches are handed out (`None`: every topic), set by [`KafkaSource::limit_topics`].
    handed_topics: Option<BTreeSet<String>>,
    /// The topic of the last batch handed out.
    batch_topic: String,
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}

impl KafkaSource {
    /// [`open_with`](Self::open_with) default options: text key and value, 8192-row batches.
    ///
    /// # Errors
    /// As [`open_with`](Self::open_with).
    pub async fn open(
        kafka: &KafkaConnection,
        topic: &str,
        restored: &[SourceOffset],
    ) -> Result<Self> {
        Self::open_with(kafka, topic, restored, KafkaSourceOptions::default()).await
    }

    /// [`open_topics`](Self::open_topics) of one topic.
    ///
    /// # Errors
    /// As [`open_topics`](Self::open_topics).
    pub async fn open_with(
        kafka: &KafkaConnection,
        topic: &str,
        restored: &[SourceOffset],
        options: KafkaSourceOptions,
    ) -> Result<Self> {
        Self::open_topics(
            kafka,
            TopicSelection::One(topic.to_string()),
            restored,
            options,
        )
        .await
    }

    /// Assigns every partition of the `selection`'s topics on the cluster `kafka` reaches (TLS and SASL as its
    /// settings say), at the offsets in `restored` or from the log start, and starts the consumer thread. Offsets
    /// are never committed to Kafka: the checkpoint record is the only place they live.
    ///
    /// With a [`share`](KafkaSourceOptions::share), only the partitions in it are assigned (possibly none, when
    /// there are more subtasks than partitions: the source then never hands out a batch, unless partitions or
    /// topics are added later).
    ///
    /// A restored offset below its partition's log start is a gap, handled as
    /// [`on_gap`](KafkaSourceOptions::on_gap) says once the consumer finds it; an offset past the log end stops
    /// the source. Partitions added later, and topics created later that a pattern selects, are found by the
    /// [`metadata_refresh`] and read from their log start (a topic with a saved position: from there).
    ///
    /// [`metadata_refresh`]: KafkaSourceOptions::metadata_refresh
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when a named topic does not exist, when a topic is not the topic the
    /// positions were saved for (deleted and created again: its topic id changed, or a saved partition is gone),
    /// for a client setting the source controls, or options out of range; [`Retryable`](ErrorKind::Retryable)
    /// when the cluster does not answer.
    pub async fn open_topics(
        kafka: &KafkaConnection,
        selection: TopicSelection,
        restored: &[SourceOffset],
        options: KafkaSourceOptions,
    ) -> Result<Self> {
        const OWN: [&str; 5] = [
            "group.id",
            "enable.auto.commit",
            "enable.auto.offset.store",
            "isolation.level",
            "auto.offset.reset",
        ];
        if let Some(key) = options.client.keys().find(|k| OWN.contains(&k.as_str())) {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("Kafka source client setting {key:?} is the source's own; remove it"),
            ));
        }
        if options.batch_rows == 0 || options.buffered_batches == 0 {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "Kafka source batch_rows and buffered_batches must be at least 1",
            ));
        }
        let bootstrap = kafka.bootstrap_servers();
        let named = selection.named();
        let metadata = kafka
            .topics_metadata(named.as_deref(), REQUEST_TIMEOUT)
            .await?;
        let mut topics = BTreeMap::new();
        for (topic, found) in &metadata {
            if found.partitions.is_empty() || !selection.selects(topic) {
                continue;
            }
            let opened = partitions::open(topic, found, restored, options.share, &selection)?;
            topics.insert(topic.clone(), TopicState::opened(opened));
        }
        if let Some(missing) = named
            .iter()
            .flatten()
            .find(|topic| !topics.contains_key(*topic))
        {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("topic {missing} does not exist on {bootstrap}: create it first"),
            ));
        }
        if topics.is_empty() {
            tracing::info!(source = %selection,
                "no topic is selected yet; topics created later are read once the metadata refresh finds them");
        }
        let mut config = kafka.consumer_config();
        for (key, value) in &options.client {
            config.set(key, value);
        }
        let label = match &selection {
            TopicSelection::One(topic) => topic.clone(),
            _ => "topics".to_string(),
        };
        let consumer: BaseConsumer = config
            .set("group.id", format!("ratchet-{label}"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            // Never move a position by itself: an offset out of range comes back as an error (a gap).
            .set("auto.offset.reset", "error")
            .create()
            .map_err(|e| {
                kafka_error(
                    ErrorKind::Config,
                    "cannot create the Kafka consumer".into(),
                    e,
                )
            })?;
        // Every restored position, then where the opened partitions start.
        let mut next: BTreeMap<TopicPartition, i64> = restored
            .iter()
            .map(|o| {
                (
                    TopicPartition::new(o.topic.clone(), o.partition),
                    o.next_offset,
                )
            })
            .collect();
        let mut assigned = Assigned::default();
        for offset in restored {
            if let Some(id) = &offset.topic_id {
                assigned.ids.insert(offset.topic.clone(), id.clone());
            }
        }
        for (topic, state) in &topics {
            for (&partition, start) in &state.fetched {
                if let Some(offset) = start {
                    next.insert(TopicPartition::new(topic.clone(), partition), *offset);
                }
            }
        }
        let assignment = Assignment {
            kafka: kafka.clone(),
            selection: selection.clone(),
            restored: restored.to_vec(),
            topics,
            share: options.share,
            on_gap: options.on_gap,
            refresh_every: options.metadata_refresh,
            assigned: Arc::new(Mutex::new(assigned)),
            refreshed: std::time::Instant::now(),
            skipped_as_written: Default::default(),
            runtime: None,
        };
        assignment.publish();
        let assigned = assignment.assigned.clone();
        consumer
            .assign(&assignment.partition_list()?)
            .map_err(|e| kafka_error(ErrorKind::Retryable, "cannot assign partitions".into(), e))?;
        let consumer = Arc::new(consumer);
        let closed = Arc::new(AtomicBool::new(false));
        let (sender, chunks) = mpsc::channel(options.buffered_batches);
        let schema = options.metadata.schema(&options.decoding)?;
        let reader = Reader {
            consumer: consumer.clone(),
            decoding: options.decoding,
            batch_rows: options.batch_rows,
            metadata: options.metadata,
            max_batch_wait: options.max_batch_wait,
            closed: closed.clone(),
            divert: options.divert_bad_records,
            assignment,
            deferred: None,
        };
        std::thread::Builder::new()
            .name(format!("kafka-source-{label}"))
            .spawn(move || reader.run(sender))
            .map_err(|e| {
                Error::new(
                    ErrorKind::Retryable,
                    Phase::Setup,
                    "cannot start the consumer thread",
                )
                .with_source(e)
            })?;
        Ok(Self {
            consumer,
            selection,
            schema,
            chunks,
            closed,
            next,
            assigned,
            rejected: Vec::new(),
            gaps: Vec::new(),
            tombstones: Vec::new(),
            held: None,
            handed_topics: None,
            batch_topic: String::new(),
        })
    }

    /// The topics `selection` selects now in which `share` holds at least one partition (every selected topic
    /// without a share): what a subtask will read when it opens, for preparing something per topic first. One
    /// metadata request. A topic created afterwards shows up as [`unexpected_topic`](Self::unexpected_topic) once
    /// read, when [`limit_topics`](Self::limit_topics) was set.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) when the cluster does not answer within the request timeout.
    pub async fn topics_held(
        kafka: &KafkaConnection,
        selection: &TopicSelection,
        share: Option<PartitionShare>,
    ) -> Result<BTreeSet<String>> {
        let named = selection.named();
        let metadata = kafka
            .topics_metadata(named.as_deref(), REQUEST_TIMEOUT)
            .await?;
        Ok(metadata
            .into_iter()
            .filter(|(topic, found)| {
                selection.selects(topic)
                    && found
                        .partitions
                        .iter()
                        .any(|&p| share.is_none_or(|s| s.holds(selection, topic, p)))
            })
            .map(|(topic, _)| topic)
            .collect())
    }

    /// The schema of the batches handed out (it changes only through
    /// [`accept_schema_change`](Self::accept_schema_change)).
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The schema of the next batch, when it differs from [`schema`](Self::schema): a registry-backed Avro decoding
    /// that evolves widened its reader schema (a writer schema added fields). The batch is held back:
    /// [`next_batch`](Self::next_batch) returns `None` until the job accepts the change, and
    /// [`positions`](Self::positions) cover only the batches of the old schema. The job finishes its checkpoint
    /// with them, makes its sinks take the new columns, then calls
    /// [`accept_schema_change`](Self::accept_schema_change).
    pub fn schema_change(&self) -> Option<SchemaRef> {
        self.held
            .as_ref()
            .map(|chunk| chunk.batch.schema())
            .filter(|schema| schema.fields() != self.schema.fields())
    }

    /// Hands out the held batch of the new schema next; [`schema`](Self::schema) becomes that schema.
    pub fn accept_schema_change(&mut self) {
        if let Some(schema) = self.schema_change() {
            self.schema = schema;
        }
    }

    /// Hands out only batches of `topics` from now on: the first batch of any other topic (a topic a pattern
    /// found while running, or one whose partitions joined this share) is held back, and
    /// [`next_batch`](Self::next_batch) returns `None` while [`unexpected_topic`](Self::unexpected_topic) names it.
    /// For a job whose sinks need something per topic (a routed sink's instance): it checkpoints what it read (the
    /// [`positions`](Self::positions) do not cover the held batch), prepares for the topic, and reopens the source.
    pub fn limit_topics(&mut self, topics: BTreeSet<String>) {
        self.handed_topics = Some(topics);
    }

    /// The topic of the held batch that [`limit_topics`](Self::limit_topics) keeps back, if any.
    pub fn unexpected_topic(&self) -> Option<&str> {
        let chunk = self.held.as_ref()?;
        self.outside_limit(&chunk.topic)
            .then_some(chunk.topic.as_str())
    }

    fn outside_limit(&self, topic: &str) -> bool {
        !topic.is_empty()
            && self
                .handed_topics
                .as_ref()
                .is_some_and(|topics| !topics.contains(topic))
    }

    /// The partitions being read (those of the share; partitions and topics added later join once found).
    pub fn partitions(&self) -> BTreeSet<TopicPartition> {
        self.assigned
            .lock()
            .expect("not poisoned")
            .partitions
            .clone()
    }

    /// Asks the reading thread to refresh the topics' metadata now, ahead of `metadata_refresh` (before a caller
    /// decides nothing more is coming: partitions or topics added since the last refresh are found by it).
    pub fn ask_refresh(&self) {
        self.assigned.lock().expect("not poisoned").refresh_asked = true;
    }

    /// When the last refresh that read the cluster's metadata began (`None`: none since the source opened).
    pub fn refreshed_at(&self) -> Option<std::time::Instant> {
        self.assigned.lock().expect("not poisoned").refreshed_at
    }

    /// The topic of the last batch [`next_batch`](Self::next_batch) handed out: a batch's rows are all of one
    /// topic (empty before the first batch).
    pub fn batch_topic(&self) -> &str {
        &self.batch_topic
    }

    /// What the source reads ([`TopicSelection`]).
    pub fn selection(&self) -> &TopicSelection {
        &self.selection
    }

    /// Where every partition being read stands now: its log start and its high watermark.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) when the cluster does not answer.
    pub fn watermarks(&self) -> Result<BTreeMap<TopicPartition, Watermarks>> {
        self.partitions()
            .into_iter()
            .map(|at| {
                let (log_start, high) = self
                    .consumer
                    .fetch_watermarks(&at.topic, at.partition, REQUEST_TIMEOUT)
                    .map_err(|e| {
                        kafka_error(
                            ErrorKind::Retryable,
                            format!("cannot read watermarks of {at}"),
                            e,
                        )
                    })?;
                Ok((at, Watermarks { log_start, high }))
            })
            .collect()
    }

    /// The records of partition `at` not handed out yet, as of `marks` (from [`watermarks`](Self::watermarks)).
    pub fn lag(&self, at: &TopicPartition, marks: Watermarks) -> i64 {
        let next = self
            .next
            .get(at)
            .copied()
            .unwrap_or(marks.log_start)
            .max(marks.log_start);
        (marks.high - next).max(0)
    }

    /// Whether every partition has been handed out up to `ends` (from [`watermarks`](Self::watermarks)).
    pub fn reached(&self, ends: &BTreeMap<TopicPartition, Watermarks>) -> bool {
        ends.iter().all(|(at, &marks)| self.lag(at, marks) == 0)
    }

    /// Where the batches handed out so far end: what a checkpoint covering them saves. A partition with no
    /// position yet (nothing read, none restored) is left out: it is read from its log start after a restart.
    pub fn positions(&self) -> Vec<SourceOffset> {
        let ids = self.assigned.lock().expect("not poisoned").ids.clone();
        self.next
            .iter()
            .map(|(at, &next_offset)| SourceOffset {
                topic: at.topic.clone(),
                partition: at.partition,
                next_offset,
                topic_id: ids.get(&at.topic).cloned(),
            })
            .collect()
    }

    /// The next decoded batch (at most `batch_rows` rows), or `None` when none is ready within `idle`, or while a
    /// batch of a new schema ([`schema_change`](Self::schema_change)) or of an unexpected topic
    /// ([`unexpected_topic`](Self::unexpected_topic)) is held. Cancel safe: a batch is either
    /// returned or stays queued.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the topic, partition and offset of a record that cannot be
    /// decoded (nothing of its batch was handed out), unless such records are diverted; a batch may then hold no
    /// rows at all (every record of it refused) and still move the positions; [`Retryable`](ErrorKind::Retryable) for consumer errors.
    /// After an error the consumer thread has stopped: reopen the source from the last checkpoint's positions
    /// (restart the job) before reading on.
    pub async fn next_batch(&mut self, idle: Duration) -> Result<Option<RecordBatch>> {
        if self.held.is_some() {
            if self.schema_change().is_some() || self.unexpected_topic().is_some() {
                return Ok(None);
            }
            let chunk = self.held.take().expect("held");
            return Ok(Some(self.hand_out(chunk)));
        }
        let chunk = match tokio::time::timeout(idle, self.chunks.recv()).await {
            Err(_) => return Ok(None),
            Ok(None) => {
                return Err(Error::new(
                    ErrorKind::Retryable,
                    Phase::Write,
                    "the Kafka source stopped after an earlier error; reopen it from the last checkpoint",
                ));
            }
            Ok(Some(chunk)) => chunk?,
        };
        if self.outside_limit(&chunk.topic) {
            tracing::info!(topic = %chunk.topic, "a batch of a topic the job was not prepared for: held");
            self.held = Some(chunk);
            return Ok(None);
        }
        if chunk.batch.schema().fields() != self.schema.fields() {
            tracing::info!(source = %self.selection, "the source's batches change schema: held until the job accepts it");
            self.held = Some(chunk);
            return Ok(None);
        }
        Ok(Some(self.hand_out(chunk)))
    }

    /// The next thing the job must act on, waiting at most `idle` for a batch: [`next_batch`](Self::next_batch)
    /// with what its follow-up calls would say folded in (a held batch's new topic or new schema, or the batch with
    /// its topic, rejected records, tombstones and gaps). Cancel safe, as `next_batch`.
    ///
    /// # Errors
    /// As [`next_batch`](Self::next_batch).
    pub async fn next_event(&mut self, idle: Duration) -> Result<SourceEvent> {
        let batch = self.next_batch(idle).await?;
        if let Some(topic) = self.unexpected_topic() {
            return Ok(SourceEvent::NewTopic(topic.to_string()));
        }
        if let Some(schema) = self.schema_change() {
            return Ok(SourceEvent::SchemaChange(schema));
        }
        Ok(match batch {
            None => SourceEvent::Idle,
            Some(rows) => SourceEvent::Batch(SourceBatch {
                topic: self.batch_topic.clone(),
                rows,
                rejected: self.take_rejected(),
                tombstones: self.take_tombstones(),
                gaps: self.take_gaps(),
            }),
        })
    }

    /// Moves the positions past `chunk` and keeps what it set aside; its batch.
    fn hand_out(&mut self, chunk: Chunk) -> RecordBatch {
        if !chunk.topic.is_empty() {
            self.batch_topic = chunk.topic;
        }
        for (at, next) in chunk.next {
            self.next.insert(at, next);
        }
        self.rejected.extend(chunk.rejected);
        self.tombstones.extend(chunk.tombstones);
        self.gaps.extend(chunk.gaps);
        chunk.batch
    }

    /// The records of the batches handed out so far that did not decode (with
    /// [`divert_bad_records`](KafkaSourceOptions::divert_bad_records)), oldest first; [`positions`](Self::positions)
    /// already cover them, so the job writes them to its dead-letter destination in the same checkpoint.
    pub fn take_rejected(&mut self) -> Vec<RejectedRecord> {
        std::mem::take(&mut self.rejected)
    }

    /// The tombstones (records with a null value) of the batches handed out so far, oldest first, for the JSON and
    /// Avro decodings, whose rows are the value's fields (the raw decodings carry them as rows with a null
    /// `value`); [`positions`](Self::positions) already cover them. A tombstone ends its batch: taken after each
    /// batch, it comes after every row of that batch and before every row of the next, as in the log.
    pub fn take_tombstones(&mut self) -> Vec<Tombstone> {
        std::mem::take(&mut self.tombstones)
    }

    /// The gaps the batches handed out so far skipped (with [`GapPolicy::Earliest`]), oldest first; the
    /// positions already start after them.
    pub fn take_gaps(&mut self) -> Vec<Gap> {
        std::mem::take(&mut self.gaps)
    }
}
