//! The Kafka-to-Kafka fast path: when the source is the same cluster, the consumed offsets go into the producer's
//! transaction (`send_offsets_to_transaction` with the consumer group metadata), so a transaction commits the
//! output and the source positions atomically and no external checkpoint store is needed.
//!
//! Each transaction covers up to `commit_interval` of consumed records: begin → produce the records →
//! send the consumed offsets → commit. A crash anywhere leaves the transaction open; the next start's
//! `init_transactions` aborts it, and the consumer group resumes from the last committed offsets, which moved
//! only together with committed output: every source record lands exactly once. One pipeline instance per group
//! (it assigns every source partition itself).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use connector_api::{Error, ErrorKind, Phase, Result, Step};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};

use connector_api::SubtaskId;

use crate::registry::claim_prefix;
use crate::{KafkaSinkConfig, classify, open_transactional_producer};

/// Called, for fault injection in tests, at each step of a transaction with the transaction's number (from 1):
/// [`Step::AfterWrite`] once the records are produced and flushed (the offsets not yet sent),
/// [`Step::AfterPreCommit`] once the offsets are in the transaction (the commit not yet made), and
/// [`Step::AfterCommit`] once it committed.
pub type PipelineHook = Arc<dyn Fn(u64, Step) + Send + Sync>;

/// A Kafka-to-Kafka pipeline.
#[derive(Clone)]
pub struct KafkaToKafka {
    /// The source topic (on the sink's cluster).
    pub source_topic: String,
    /// The consumer group that holds the source positions.
    pub group_id: String,
    /// The target: topic, transactional-id prefix (slot 0 of subtask 0 is used), transaction timeout, client
    /// settings.
    pub sink: KafkaSinkConfig,
    /// How much consumed time one transaction covers.
    pub commit_interval: Duration,
    /// At most this many records per transaction.
    pub max_records_per_transaction: u64,
    /// Stop after no record arrived for this long (None: run until an error).
    pub stop_when_idle: Option<Duration>,
    /// Fault-injection hook (tests).
    pub hook: Option<PipelineHook>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Records copied and committed.
    pub records: u64,
    /// Transactions committed.
    pub transactions: u64,
}

const TXN_TIMEOUT: Duration = Duration::from_secs(60);

fn failed(phase: Phase, message: &str, e: KafkaError) -> Error {
    Error::new(classify(&e), phase, message).with_source(e)
}

impl KafkaToKafka {
    /// Runs the pipeline until it is idle for `stop_when_idle`.
    ///
    /// # Errors
    /// Any producer or consumer failure stops the run; what was not committed is replayed by the next run.
    pub async fn run(&self) -> Result<PipelineStats> {
        let sink = self.sink.clone().resolve_env()?;
        let id = sink.id_pool()?.all(SubtaskId(0)).remove(0);
        let owner = format!(
            "{}/kafka-to-kafka:{}",
            sink.job.as_deref().unwrap_or("-"),
            self.group_id
        );
        let connection = sink.kafka_connection()?.client_config();
        claim_prefix(&connection, &sink.transactional_id_prefix, &owner).await?;
        let producer = open_transactional_producer(&sink, &id).await?;
        let consumer: StreamConsumer = connection
            .clone()
            .set("group.id", &self.group_id)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .create()
            .map_err(|e| failed(Phase::Setup, "cannot create the source consumer", e))?;
        self.assign_from_committed(&consumer)?;
        let mut stats = PipelineStats::default();
        let mut last_record = Instant::now();
        loop {
            producer
                .begin_transaction()
                .map_err(|e| failed(Phase::Begin, "begin_transaction failed", e))?;
            let number = stats.transactions + 1;
            let mut next: BTreeMap<(String, i32), i64> = BTreeMap::new();
            let mut copied = 0u64;
            let mut in_flight = Vec::new();
            let deadline = Instant::now() + self.commit_interval;
            while Instant::now() < deadline && copied < self.max_records_per_transaction {
                let message =
                    match tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await {
                        Err(_) => continue,
                        Ok(message) => message
                            .map_err(|e| failed(Phase::Write, "the source consumer failed", e))?,
                    };
                last_record = Instant::now();
                let mut record = FutureRecord::to(&sink.topic);
                if let Some(key) = message.key() {
                    record = record.key(key);
                }
                if let Some(payload) = message.payload() {
                    record = record.payload(payload);
                }
                if let Some(headers) = message.headers() {
                    let copied = headers
                        .iter()
                        .fold(OwnedHeaders::new(), |h, header| h.insert(header));
                    record = record.headers(copied);
                }
                loop {
                    match producer.send_result(record) {
                        Ok(delivery) => {
                            in_flight.push(delivery);
                            break;
                        }
                        Err((e, returned))
                            if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) =>
                        {
                            record = returned;
                            producer.poll(Duration::from_millis(10));
                        }
                        Err((e, _)) => return Err(failed(Phase::Write, "cannot send a record", e)),
                    }
                }
                next.insert(
                    (message.topic().to_string(), message.partition()),
                    message.offset() + 1,
                );
                copied += 1;
            }
            if next.is_empty() {
                let idle = producer.clone();
                blocking(move || idle.abort_transaction(TXN_TIMEOUT))
                    .await
                    .map_err(|e| failed(Phase::Abort, "abort_transaction failed", e))?;
                if self
                    .stop_when_idle
                    .is_some_and(|idle| last_record.elapsed() >= idle)
                {
                    return Ok(stats);
                }
                continue;
            }
            for delivery in in_flight.drain(..) {
                delivery
                    .await
                    .map_err(|_| {
                        Error::new(
                            ErrorKind::MustAbort,
                            Phase::Write,
                            "the producer dropped a delivery",
                        )
                    })?
                    .map_err(|(e, _)| failed(Phase::Write, "a record was not delivered", e))?;
            }
            self.at(number, Step::AfterWrite);
            let mut offsets = TopicPartitionList::new();
            for ((topic, partition), offset) in &next {
                offsets
                    .add_partition_offset(topic, *partition, Offset::Offset(*offset))
                    .map_err(|e| failed(Phase::PreCommit, "bad offset", e))?;
            }
            let group = consumer.group_metadata().ok_or_else(|| {
                Error::new(
                    ErrorKind::Retryable,
                    Phase::PreCommit,
                    "the consumer has no group metadata yet",
                )
            })?;
            let sending = producer.clone();
            blocking(move || sending.send_offsets_to_transaction(&offsets, &group, TXN_TIMEOUT))
                .await
                .map_err(|e| failed(Phase::PreCommit, "send_offsets_to_transaction failed", e))?;
            self.at(number, Step::AfterPreCommit);
            let committing = producer.clone();
            blocking(move || committing.commit_transaction(TXN_TIMEOUT))
                .await
                .map_err(|e| failed(Phase::Commit, "commit_transaction failed", e))?;
            stats.transactions += 1;
            stats.records += copied;
            self.at(number, Step::AfterCommit);
        }
    }

    /// Assigns every partition of the source topic at the group's committed offset (the beginning when none).
    /// Assignment instead of a group subscription: a restarted pipeline does not wait for the dead instance's
    /// session to expire, and the transactional id's epoch fences the dead instance's producer.
    fn assign_from_committed(&self, consumer: &StreamConsumer) -> Result<()> {
        let metadata = consumer
            .fetch_metadata(Some(&self.source_topic), TXN_TIMEOUT)
            .map_err(|e| failed(Phase::Setup, "cannot read the source topic's metadata", e))?;
        let mut wanted = TopicPartitionList::new();
        for topic in metadata.topics() {
            for partition in topic.partitions() {
                wanted.add_partition(&self.source_topic, partition.id());
            }
        }
        if wanted.count() == 0 {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "source topic {:?} has no partitions (does it exist?)",
                    self.source_topic
                ),
            ));
        }
        let committed = consumer
            .committed_offsets(wanted, TXN_TIMEOUT)
            .map_err(|e| failed(Phase::Setup, "cannot read the group's committed offsets", e))?;
        let mut assignment = TopicPartitionList::new();
        for element in committed.elements() {
            let offset = match element.offset() {
                Offset::Offset(o) => Offset::Offset(o),
                _ => Offset::Beginning,
            };
            assignment
                .add_partition_offset(element.topic(), element.partition(), offset)
                .map_err(|e| failed(Phase::Setup, "bad committed offset", e))?;
        }
        consumer
            .assign(&assignment)
            .map_err(|e| failed(Phase::Setup, "cannot assign the source partitions", e))
    }

    fn at(&self, number: u64, step: Step) {
        if let Some(hook) = &self.hook {
            hook(number, step);
        }
    }
}

/// Runs a blocking librdkafka call on the blocking pool.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> std::result::Result<T, KafkaError> + Send + 'static,
) -> std::result::Result<T, KafkaError> {
    tokio::task::spawn_blocking(call)
        .await
        .expect("librdkafka call panicked")
}
