//! A Kafka source for Ratchet jobs: reads one topic with `isolation.level=read_committed` from the positions a
//! checkpoint restored ([`connector_api::Restored::positions`]), into Arrow batches, and hands back the positions
//! the records read so far reach, for [`connector_api::Driver::checkpoint`]. Offsets are never committed to Kafka
//! (no auto-commit, no group offsets): the checkpoint record is the only place they live, so a restart resumes
//! exactly where the last durable checkpoint ends.
//!
//! ```no_run
//! # async fn job(driver: &mut connector_api::Driver<connector_api::LocalCheckpointStore>,
//! #              sink: connector_api::SinkHandle) -> connector_api::Result<()> {
//! use std::time::Duration;
//! let restored = driver.start().await?;
//! let kafka = kafka_source::KafkaConnection::plaintext("127.0.0.1:19092");
//! let mut source = kafka_source::KafkaSource::open(&kafka, "orders", &restored.positions)?;
//! while let Some(batch) = source.next_batch(10_000, Duration::from_millis(500)).await? {
//!     driver.write(sink, &batch).await?;
//!     driver.checkpoint(source.positions()).await?;
//! }
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_array::builder::{Int32Builder, Int64Builder, StringBuilder};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::{Error, ErrorKind, Phase, Result, SourceOffset};
pub use kafka_connection::KafkaConnection;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

/// How long metadata and watermark requests may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Schema of the batches the source produces: one row per Kafka record, key and value as UTF-8 strings.
pub fn record_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new("key", DataType::Utf8, true),
        Field::new("value", DataType::Utf8, true),
    ]))
}

fn kafka_error(kind: ErrorKind, message: String, e: KafkaError) -> Error {
    Error::new(kind, Phase::Setup, message).with_source(e)
}

/// Reads every partition of one topic with `isolation.level=read_committed`, starting at restored positions.
pub struct KafkaSource {
    consumer: StreamConsumer,
    topic: String,
    /// Next offset to read, per partition.
    next: BTreeMap<i32, i64>,
}

impl KafkaSource {
    /// Assigns every partition of `topic` on the cluster `kafka` reaches (TLS and SASL as its settings say), at the
    /// offsets in `restored` or from the beginning.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) when the cluster does not answer; [`Config`](ErrorKind::Config) when
    /// the topic has no partitions (it does not exist).
    pub fn open(kafka: &KafkaConnection, topic: &str, restored: &[SourceOffset]) -> Result<Self> {
        let bootstrap = kafka.bootstrap_servers();
        let consumer: StreamConsumer = kafka
            .client_config()
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
        for partition in partitions {
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
        Ok(Self {
            consumer,
            topic: topic.to_string(),
            next,
        })
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

    /// Whether every partition has been read up to `ends`.
    pub fn reached(&self, ends: &BTreeMap<i32, i64>) -> bool {
        ends.iter()
            .all(|(p, end)| self.next.get(p).is_some_and(|n| n >= end))
    }

    /// Where the records read so far end: what a checkpoint covering them saves.
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

    /// Reads up to `max_rows` records, returning early when none arrives for `idle`. `None` when nothing arrived.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the topic, partition and offset of a record whose key or value
    /// is not UTF-8 (nothing of the batch was handed out); [`Retryable`](ErrorKind::Retryable) for consumer
    /// errors. After any error the consumer has moved past records that [`positions`](Self::positions) does not
    /// cover: reopen the source from the last checkpoint's positions (restart the job) before reading on.
    pub async fn next_batch(
        &mut self,
        max_rows: usize,
        idle: Duration,
    ) -> Result<Option<RecordBatch>> {
        let mut topics = StringBuilder::new();
        let mut partitions = Int32Builder::new();
        let mut offsets = Int64Builder::new();
        let mut keys = StringBuilder::new();
        let mut values = StringBuilder::new();
        let mut read = BTreeMap::new();
        while read.values().map(|(_, rows)| rows).sum::<usize>() < max_rows {
            let message = match tokio::time::timeout(idle, self.consumer.recv()).await {
                Err(_) => break,
                Ok(message) => message.map_err(|e| {
                    Error::new(
                        ErrorKind::Retryable,
                        Phase::Write,
                        "the Kafka consumer failed",
                    )
                    .with_source(e)
                })?,
            };
            let utf8 = |bytes: Option<&[u8]>, what: &str| -> Result<Option<String>> {
                bytes
                    .map(|b| String::from_utf8(b.to_vec()))
                    .transpose()
                    .map_err(|e| {
                        Error::new(
                            ErrorKind::BadRecord,
                            Phase::Write,
                            format!(
                                "record {}/{}@{} has a {what} that is not UTF-8",
                                message.topic(),
                                message.partition(),
                                message.offset()
                            ),
                        )
                        .with_source(e)
                    })
            };
            keys.append_option(utf8(message.key(), "key")?);
            values.append_option(utf8(message.payload(), "value")?);
            topics.append_value(message.topic());
            partitions.append_value(message.partition());
            offsets.append_value(message.offset());
            let entry = read.entry(message.partition()).or_insert((0, 0));
            *entry = (message.offset() + 1, entry.1 + 1);
        }
        if read.is_empty() {
            return Ok(None);
        }
        // Positions move only once the whole batch is built: a refused batch leaves them where they were.
        for (partition, (next, _)) in read {
            self.next.insert(partition, next);
        }
        let batch = RecordBatch::try_new(
            record_schema(),
            vec![
                Arc::new(topics.finish()),
                Arc::new(partitions.finish()),
                Arc::new(offsets.finish()),
                Arc::new(keys.finish()),
                Arc::new(values.finish()),
            ],
        )
        .map_err(|e| {
            Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "the batch does not match its schema",
            )
            .with_source(e)
        })?;
        Ok(Some(batch))
    }
}
