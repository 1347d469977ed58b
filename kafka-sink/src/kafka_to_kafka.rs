//! The Kafka-to-Kafka fast path: when the source is the same cluster, the consumed offsets go into the producer's
//! transaction (`send_offsets_to_transaction` with the consumer group metadata), so a transaction commits the
//! output and the source positions atomically and no external checkpoint store is needed.
//!
//! Each transaction covers up to `commit_interval` of consumed records: begin → produce the records →
//! send the consumed offsets → commit. Two transactional producers (the first two ids of the pool) alternate:
//! while transaction N flushes, sends its offsets and commits on a thread of its own, the copy loop keeps consuming
//! into transaction N+1 on the other producer; N+1 commits only after N did, so the group's offsets only move
//! forward. Records are copied with librdkafka's own delivery thread and no future per record: a failed delivery
//! makes the commit fail. A crash anywhere leaves the open transactions open; the next start's
//! `init_transactions` on both ids aborts them, and the consumer group resumes from the last committed offsets,
//! which moved only together with committed output: every source record lands exactly once. One pipeline instance
//! per group (it assigns every source partition itself).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use connector_api::{Error, ErrorKind, Phase, Result, Step};
use kafka_connection::poll::{DEADLINE_CHECK_EVERY, Polled, next_message};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};

use connector_api::SubtaskId;

use crate::delivery::wait_delivered_blocking;
use crate::producer::TXN_TIMEOUT;
use crate::registry::claim_prefix;
use crate::{KafkaSinkConfig, classify, open_transactional_producer};

/// Called, for fault injection in tests, at each step of a transaction with the transaction's number (from 1):
/// [`Step::AfterWrite`] once the records are produced and flushed (the offsets not yet sent),
/// [`Step::AfterPreCommit`] once the offsets are in the transaction (the commit not yet made), and
/// [`Step::AfterCommit`] once it committed.
pub type PipelineHook = Arc<dyn Fn(u64, Step) + Send + Sync>;

/// Called once per committed transaction (for metrics), on the commit thread.
pub type CommitObserver = Arc<dyn Fn(&CommittedTransaction) + Send + Sync>;

/// A transaction the pipeline committed: the fast path's checkpoint (its records and their source offsets made
/// visible and decided in one Kafka commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommittedTransaction {
    /// Its number, from 1.
    pub number: u64,
    /// Records it copied.
    pub records: u64,
    /// From the end of its filling to its commit returning: the flush of its records, the offsets sent into it,
    /// the commit.
    pub closing: Duration,
}

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
    /// Stop once this many records are committed (None: no limit).
    pub stop_after_records: Option<u64>,
    /// Fault-injection hook (tests).
    pub hook: Option<PipelineHook>,
    /// Told of every committed transaction (metrics).
    pub observer: Option<CommitObserver>,
    /// Set it to stop gracefully: the open transaction is committed (with its offsets) and `run` returns, within
    /// about `commit_interval`.
    pub stop: Option<Arc<AtomicBool>>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Records copied and committed.
    pub records: u64,
    /// Transactions committed.
    pub transactions: u64,
    /// From the first record read to the last commit: the time the copying itself took, without start-up
    /// (claiming the prefix, initialising the producers) and idle time before the first record.
    pub copying: Duration,
    /// When the first record was read (None: none was).
    pub first_record_at: Option<std::time::SystemTime>,
    /// When the last transaction with records finished filling (None: none did).
    pub last_record_at: Option<std::time::SystemTime>,
}

fn failed(phase: Phase, message: &str, e: KafkaError) -> Error {
    Error::new(classify(&e), phase, message).with_source(e)
}

/// The producer the pipeline copies with: librdkafka's own delivery thread, no future per record (a failed
/// delivery fails the transaction's commit).
type Copier = ThreadedProducer<DefaultProducerContext>;

/// One transaction handed to the commit thread: its producer, its number and the source offsets it covers.
struct Closing {
    producer: Copier,
    number: u64,
    offsets: TopicPartitionList,
    records: u64,
}

impl KafkaToKafka {
    /// Runs the pipeline until it is idle for `stop_when_idle`.
    ///
    /// # Errors
    /// Any producer or consumer failure stops the run; what was not committed is replayed by the next run.
    pub async fn run(&self) -> Result<PipelineStats> {
        let started = Instant::now();
        let sink = self.sink.clone().resolve_env()?;
        let owner = format!(
            "{}/kafka-to-kafka:{}",
            sink.job.as_deref().unwrap_or("-"),
            self.group_id
        );
        let kafka = sink.kafka_connection()?;
        claim_prefix(
            &kafka.client_config(),
            &sink.transactional_id_prefix,
            &owner,
        )
        .await?;
        // Two producers from the pool alternate: one commits while the other takes the next records. Their
        // init_transactions (fencing earlier holders of the ids) run at once.
        let ids = sink.id_pool()?.all(SubtaskId(0));
        let (first, second) = tokio::try_join!(
            open_transactional_producer(&sink, &ids[0], DefaultProducerContext),
            open_transactional_producer(&sink, &ids[1], DefaultProducerContext),
        )?;
        let producers = vec![first, second];
        let consumer: BaseConsumer = kafka
            .consumer_config()
            .set("group.id", &self.group_id)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .create()
            .map_err(|e| failed(Phase::Setup, "cannot create the source consumer", e))?;
        self.assign_from_committed(&consumer)?;
        tracing::info!(source = %self.source_topic, target = %sink.topic, group = %self.group_id,
            setup = ?started.elapsed(), "Kafka-to-Kafka copying: prefix claimed, producers initialised, partitions assigned");
        let pipeline = self.clone();
        connector_api::blocking(Phase::Write, "the copy thread", move || {
            pipeline.copy(&consumer, producers, &sink.topic)
        })
        .await?
    }

    /// The copy loop, on a blocking thread: fill transaction N+1 on one producer while transaction N commits on
    /// the other. N+1's commit starts only after N's finished, so the group's offsets only move forward.
    fn copy(
        &self,
        consumer: &BaseConsumer,
        producers: Vec<Copier>,
        topic: &str,
    ) -> Result<PipelineStats> {
        let mut stats = PipelineStats::default();
        let mut committing: Option<std::thread::JoinHandle<Result<u64>>> = None;
        let mut last_record = Instant::now();
        let mut number = 0u64;
        // Records put into transactions so far (committed or committing).
        let mut taken = 0u64;
        let mut first_record: Option<Instant> = None;
        let finish = |handle: std::thread::JoinHandle<Result<u64>>,
                      stats: &mut PipelineStats,
                      first_record: Option<Instant>| {
            let records = handle.join().map_err(|_| {
                Error::new(ErrorKind::Bug, Phase::Commit, "the commit thread panicked")
            })??;
            stats.transactions += 1;
            stats.records += records;
            stats.copying = first_record.map(|t| t.elapsed()).unwrap_or_default();
            Ok::<(), Error>(())
        };
        loop {
            if self
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed))
            {
                if let Some(handle) = committing.take() {
                    finish(handle, &mut stats, first_record)?;
                }
                return Ok(stats);
            }
            let limit = match self.stop_after_records {
                Some(total) if taken >= total => {
                    if let Some(handle) = committing.take() {
                        finish(handle, &mut stats, first_record)?;
                    }
                    return Ok(stats);
                }
                Some(total) => (total - taken).min(self.max_records_per_transaction),
                None => self.max_records_per_transaction,
            };
            let producer = producers[(number % producers.len() as u64) as usize].clone();
            producer
                .begin_transaction()
                .map_err(|e| failed(Phase::Begin, "begin_transaction failed", e))?;
            let (offsets, copied, started) = self.fill(consumer, &producer, topic, limit)?;
            if first_record.is_none()
                && let Some(started) = started
            {
                stats.first_record_at = Some(std::time::SystemTime::now() - started.elapsed());
            }
            first_record = first_record.or(started);
            if copied == 0 {
                producer
                    .abort_transaction(TXN_TIMEOUT)
                    .map_err(|e| failed(Phase::Abort, "abort_transaction failed", e))?;
                if let Some(handle) = committing.take() {
                    finish(handle, &mut stats, first_record)?;
                }
                if self
                    .stop_when_idle
                    .is_some_and(|idle| last_record.elapsed() >= idle)
                {
                    return Ok(stats);
                }
                continue;
            }
            last_record = Instant::now();
            stats.last_record_at = Some(std::time::SystemTime::now());
            number += 1;
            taken += copied;
            if let Some(handle) = committing.take() {
                finish(handle, &mut stats, first_record)?;
            }
            let group = consumer.group_metadata().ok_or_else(|| {
                Error::new(
                    ErrorKind::Retryable,
                    Phase::PreCommit,
                    "the consumer has no group metadata yet",
                )
            })?;
            let closing = Closing {
                producer,
                number,
                offsets,
                records: copied,
            };
            let pipeline = self.clone();
            committing = Some(
                std::thread::Builder::new()
                    .name("kafka-to-kafka-commit".into())
                    .spawn(move || pipeline.commit(closing, &group))
                    .map_err(|e| {
                        Error::new(
                            ErrorKind::Retryable,
                            Phase::Commit,
                            "cannot start the commit thread",
                        )
                        .with_source(e)
                    })?,
            );
        }
    }

    /// Copies records into the open transaction of `producer` for up to `commit_interval` (from the first record)
    /// or `limit` records; returns the source offsets to commit with them, how many, and when the first arrived.
    fn fill(
        &self,
        consumer: &BaseConsumer,
        producer: &Copier,
        topic: &str,
        limit: u64,
    ) -> Result<(TopicPartitionList, u64, Option<Instant>)> {
        let mut next: Vec<(i32, i64)> = Vec::new();
        let mut copied = 0u64;
        let mut deadline: Option<Instant> = None;
        while copied < limit {
            let message = match next_message(consumer, deadline) {
                Polled::Message(message) => message,
                Polled::Nothing if deadline.is_none() => break,
                Polled::Nothing => continue,
                Polled::DeadlinePassed => break,
            };
            let message =
                message.map_err(|e| failed(Phase::Write, "the source consumer failed", e))?;
            let until = *deadline.get_or_insert_with(|| Instant::now() + self.commit_interval);
            let mut record = BaseRecord::<[u8], [u8]>::to(topic);
            if let Some(key) = message.key() {
                record = record.key(key);
            }
            if let Some(payload) = message.payload() {
                record = record.payload(payload);
            }
            if let Some(headers) = message.headers() {
                record = record.headers(headers.detach());
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((e, returned))
                        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) =>
                    {
                        record = returned;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err((e, _)) => return Err(failed(Phase::Write, "cannot send a record", e)),
                }
            }
            let partition = message.partition();
            match next.iter_mut().find(|(p, _)| *p == partition) {
                Some(entry) => entry.1 = message.offset() + 1,
                None => next.push((partition, message.offset() + 1)),
            }
            copied += 1;
            if copied.is_multiple_of(DEADLINE_CHECK_EVERY) && Instant::now() >= until {
                break;
            }
        }
        let mut offsets = TopicPartitionList::new();
        for (partition, offset) in next {
            offsets
                .add_partition_offset(&self.source_topic, partition, Offset::Offset(offset))
                .map_err(|e| failed(Phase::PreCommit, "bad offset", e))?;
        }
        Ok((
            offsets,
            copied,
            deadline.map(|deadline| deadline - self.commit_interval),
        ))
    }

    /// Flushes transaction `closing`, sends its source offsets into it and commits it; returns its record count.
    fn commit(&self, closing: Closing, group: &ConsumerGroupMetadata) -> Result<u64> {
        let Closing {
            producer,
            number,
            offsets,
            records,
        } = closing;
        let closing_started = Instant::now();
        if !wait_delivered_blocking(&producer, TXN_TIMEOUT) {
            return Err(Error::new(
                ErrorKind::Retryable,
                Phase::PreCommit,
                format!(
                    "transaction {number}: {} records are still undelivered after {TXN_TIMEOUT:?}",
                    producer.in_flight_count()
                ),
            ));
        }
        self.at(number, Step::AfterWrite);
        producer
            .send_offsets_to_transaction(&offsets, group, TXN_TIMEOUT)
            .map_err(|e| failed(Phase::PreCommit, "send_offsets_to_transaction failed", e))?;
        self.at(number, Step::AfterPreCommit);
        producer
            .commit_transaction(TXN_TIMEOUT)
            .map_err(|e| failed(Phase::Commit, "commit_transaction failed", e))?;
        let closing = closing_started.elapsed();
        tracing::debug!(transaction = number, records, closing = ?closing,
            "Kafka-to-Kafka transaction committed");
        if let Some(observer) = &self.observer {
            observer(&CommittedTransaction {
                number,
                records,
                closing,
            });
        }
        self.at(number, Step::AfterCommit);
        Ok(records)
    }

    /// Assigns every partition of the source topic at the group's committed offset (the beginning when none).
    /// Assignment instead of a group subscription: a restarted pipeline does not wait for the dead instance's
    /// session to expire, and the transactional id's epoch fences the dead instance's producer.
    fn assign_from_committed(&self, consumer: &BaseConsumer) -> Result<()> {
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
