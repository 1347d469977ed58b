//! [`KafkaSource`]: the consumer thread's batches, handed to the job with the positions they reach.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use connector_api::{Error, ErrorKind, Phase, Result, SourceOffset};
use kafka_connection::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::RejectedRecord;
use crate::decode::Decoding;
use crate::reader::{Chunk, Reader};

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
/// | `headers` | text and binary decodings: add a `headers` column ([`headers_field`](crate::headers_field)) | false |
/// | `batch_rows` | rows per batch at most | 8192 |
/// | `max_batch_wait` | a partial batch is handed out this long after its first record | 50 ms |
/// | `buffered_batches` | decoded batches waiting for the job at most (then the consumer thread waits) | 4 |
/// | `client` | other librdkafka consumer settings (e.g. `fetch.max.bytes`, `queued.max.messages.kbytes`) | none |
/// | `share` | read only this subtask's share of the partitions ([`PartitionShare`]) | every partition |
/// | `divert_bad_records` | set records that do not decode aside ([`KafkaSource::take_rejected`]) instead of failing | false |
#[derive(Debug, Clone)]
pub struct KafkaSourceOptions {
    /// How records become rows.
    pub decoding: Decoding,
    /// Add a `headers` column (text and binary decodings).
    pub headers: bool,
    /// Rows per batch at most.
    pub batch_rows: usize,
    /// How long a partial batch waits for more records.
    pub max_batch_wait: Duration,
    /// Decoded batches buffered ahead of the job.
    pub buffered_batches: usize,
    /// Other librdkafka consumer settings. `group.id`, `enable.auto.commit`, `enable.auto.offset.store` and
    /// `isolation.level` are the source's own.
    pub client: BTreeMap<String, String>,
    /// Read only these partitions of the topic (`None`: all of them).
    pub share: Option<PartitionShare>,
    /// Set records that do not decode aside for a dead-letter destination instead of failing.
    pub divert_bad_records: bool,
}

/// A fixed share of a topic's partitions: those whose number modulo `of` is `index`. A job of `of` subtasks gives
/// subtask `index` this share, so every partition has exactly one subtask, whichever process runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionShare {
    /// The subtask, `0..of`.
    pub index: u32,
    /// The number of subtasks.
    pub of: u32,
}

impl PartitionShare {
    /// Whether `partition` is in the share.
    pub fn contains(&self, partition: i32) -> bool {
        u32::try_from(partition).is_ok_and(|p| p % self.of.max(1) == self.index)
    }
}

impl Default for KafkaSourceOptions {
    fn default() -> Self {
        Self {
            decoding: Decoding::Text,
            headers: false,
            batch_rows: 8192,
            max_batch_wait: Duration::from_millis(50),
            buffered_batches: 4,
            client: BTreeMap::new(),
            share: None,
            divert_bad_records: false,
        }
    }
}

/// Reads every partition of one topic with `isolation.level=read_committed`, from restored positions, on a
/// consumer thread of its own that decodes records into Arrow batches while the job writes and checkpoints the
/// previous ones.
///
/// Positions move when the job takes a batch ([`next_batch`](Self::next_batch)), so
/// [`positions`](Self::positions) always covers exactly the batches handed out. Dropping the source stops the
/// thread within about 100 ms.
pub struct KafkaSource {
    consumer: Arc<BaseConsumer>,
    topic: String,
    schema: SchemaRef,
    chunks: mpsc::Receiver<Result<Chunk>>,
    closed: Arc<AtomicBool>,
    /// Next offset to hand out, per partition.
    next: BTreeMap<i32, i64>,
    /// Records of the batches handed out that did not decode, not yet taken.
    rejected: Vec<RejectedRecord>,
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
    pub fn open(kafka: &KafkaConnection, topic: &str, restored: &[SourceOffset]) -> Result<Self> {
        Self::open_with(kafka, topic, restored, KafkaSourceOptions::default())
    }

    /// Assigns every partition of `topic` on the cluster `kafka` reaches (TLS and SASL as its settings say), at
    /// the offsets in `restored` or from the beginning, and starts the consumer thread. Offsets are never
    /// committed to Kafka: the checkpoint record is the only place they live.
    ///
    /// With a [`share`](KafkaSourceOptions::share), only the partitions in it are assigned (possibly none, when
    /// there are more subtasks than partitions: the source then never hands out a batch).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the topic has no partitions (it does not exist), for a client setting
    /// the source controls, or options out of range; [`Retryable`](ErrorKind::Retryable) when the cluster does
    /// not answer.
    pub fn open_with(
        kafka: &KafkaConnection,
        topic: &str,
        restored: &[SourceOffset],
        options: KafkaSourceOptions,
    ) -> Result<Self> {
        const OWN: [&str; 4] = [
            "group.id",
            "enable.auto.commit",
            "enable.auto.offset.store",
            "isolation.level",
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
        let mut config = kafka.consumer_config();
        for (key, value) in &options.client {
            config.set(key, value);
        }
        let consumer: BaseConsumer = config
            .set("group.id", format!("ratchet-{topic}"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .create()
            .map_err(|e| {
                kafka_error(
                    ErrorKind::Config,
                    "cannot create the Kafka consumer".into(),
                    e,
                )
            })?;
        let metadata = consumer
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
            .map_err(|e| {
                kafka_error(
                    ErrorKind::Retryable,
                    format!("cannot read metadata of topic {topic} from {bootstrap}"),
                    e,
                )
            })?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("topic {topic} on {bootstrap} has no partitions (does it exist?)"),
            ));
        }
        let mut assignment = TopicPartitionList::new();
        let mut next = BTreeMap::new();
        let share = options.share;
        for partition in partitions
            .into_iter()
            .filter(|&p| share.is_none_or(|s| s.contains(p)))
        {
            let restored = restored
                .iter()
                .find(|o| o.topic == topic && o.partition == partition)
                .map(|o| o.next_offset);
            let offset = restored.map_or(Offset::Beginning, Offset::Offset);
            assignment
                .add_partition_offset(topic, partition, offset)
                .map_err(|e| {
                    kafka_error(ErrorKind::Bug, "cannot build the assignment".into(), e)
                })?;
            next.insert(partition, restored.unwrap_or(0));
        }
        consumer
            .assign(&assignment)
            .map_err(|e| kafka_error(ErrorKind::Retryable, "cannot assign partitions".into(), e))?;
        let consumer = Arc::new(consumer);
        let closed = Arc::new(AtomicBool::new(false));
        let (sender, chunks) = mpsc::channel(options.buffered_batches);
        let schema = options.decoding.schema_with_headers(options.headers)?;
        let reader = Reader {
            consumer: consumer.clone(),
            decoding: options.decoding,
            batch_rows: options.batch_rows,
            headers: options.headers,
            max_batch_wait: options.max_batch_wait,
            closed: closed.clone(),
            divert: options.divert_bad_records,
        };
        std::thread::Builder::new()
            .name(format!("kafka-source-{topic}"))
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
            topic: topic.to_string(),
            schema,
            chunks,
            closed,
            next,
            rejected: Vec::new(),
        })
    }

    /// The schema of every batch.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The high watermark of every partition now: where "caught up" is.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) when the cluster does not answer.
    pub fn high_watermarks(&self) -> Result<BTreeMap<i32, i64>> {
        self.next
            .keys()
            .map(|&p| {
                let (_, high) = self
                    .consumer
                    .fetch_watermarks(&self.topic, p, REQUEST_TIMEOUT)
                    .map_err(|e| {
                        kafka_error(
                            ErrorKind::Retryable,
                            format!("cannot read watermarks of {}/{p}", self.topic),
                            e,
                        )
                    })?;
                Ok((p, high))
            })
            .collect()
    }

    /// Whether every partition has been handed out up to `ends`.
    pub fn reached(&self, ends: &BTreeMap<i32, i64>) -> bool {
        ends.iter()
            .all(|(p, end)| self.next.get(p).is_some_and(|n| n >= end))
    }

    /// Where the batches handed out so far end: what a checkpoint covering them saves.
    pub fn positions(&self) -> Vec<SourceOffset> {
        self.next
            .iter()
            .map(|(&partition, &next_offset)| SourceOffset {
                topic: self.topic.clone(),
                partition,
                next_offset,
            })
            .collect()
    }

    /// The next decoded batch (at most `batch_rows` rows), or `None` when none is ready within `idle`. Cancel
    /// safe: a batch is either returned or stays queued.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the topic, partition and offset of a record that cannot be
    /// decoded (nothing of its batch was handed out), unless such records are diverted; a batch may then hold no
    /// rows at all (every record of it refused) and still move the positions; [`Retryable`](ErrorKind::Retryable) for consumer errors.
    /// After an error the consumer thread has stopped: reopen the source from the last checkpoint's positions
    /// (restart the job) before reading on.
    pub async fn next_batch(&mut self, idle: Duration) -> Result<Option<RecordBatch>> {
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
        for (partition, next) in chunk.next {
            self.next.insert(partition, next);
        }
        self.rejected.extend(chunk.rejected);
        Ok(Some(chunk.batch))
    }

    /// The records of the batches handed out so far that did not decode (with
    /// [`divert_bad_records`](KafkaSourceOptions::divert_bad_records)), oldest first; [`positions`](Self::positions)
    /// already cover them, so the job writes them to its dead-letter destination in the same checkpoint.
    pub fn take_rejected(&mut self) -> Vec<RejectedRecord> {
        std::mem::take(&mut self.rejected)
    }
}
