//! The consumer thread: polls librdkafka, decodes records into Arrow builders in bulk, and hands finished batches
//! with the positions they reach to the source through a bounded channel (backpressure: when the job falls behind,
//! the thread blocks and librdkafka's prefetch queue, bounded by `queued.max.messages.kbytes`, fills and stops).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::Message;
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::message::Headers;
use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::mpsc;

use kafka_connection::poll::{DEADLINE_CHECK_EVERY, Polled, next_message};

use crate::decode::BatchBuilder;
use crate::decoding::Decoding;
use crate::metadata::MetadataColumns;
use crate::partitions::{Assignment, Gap};
use crate::record::{RecordAt, RecordParts};
use crate::reject::{RawRecords, RejectedRecord};
use crate::tombstone::Tombstone;
use crate::topics::TopicPartition;

/// One decoded batch, the records of it that did not decode (set aside when diverting), the tombstone of the JSON
/// and Avro decodings that ended it (set aside: it has no fields to decode; it comes after every row of the batch),
/// per partition it read from the offset after its last record (or the log start it went on from after a gap),
/// and the gaps it skipped. A chunk's records are of one topic (a record of another topic starts the next chunk),
/// so a batch never mixes topics.
pub(crate) struct Chunk {
    /// The topic of its records (empty when it has none: only a gap).
    pub(crate) topic: String,
    pub(crate) batch: RecordBatch,
    pub(crate) rejected: Vec<RejectedRecord>,
    pub(crate) tombstones: Vec<Tombstone>,
    pub(crate) next: Vec<(TopicPartition, i64)>,
    pub(crate) gaps: Vec<Gap>,
}

/// What the consumer thread needs.
pub(crate) struct Reader {
    pub(crate) consumer: Arc<BaseConsumer>,
    pub(crate) decoding: Decoding,
    pub(crate) batch_rows: usize,
    pub(crate) metadata: MetadataColumns,
    pub(crate) max_batch_wait: Duration,
    pub(crate) closed: Arc<AtomicBool>,
    /// Set records that do not decode aside instead of failing.
    pub(crate) divert: bool,
    /// The partitions read, kept up to date.
    pub(crate) assignment: Assignment,
    /// A record read but left for the next chunk (its topic, and the record): it needs a newer reader schema, or
    /// is of another topic than the chunk's.
    pub(crate) deferred: Option<(String, RawRecords)>,
}

impl Reader {
    /// Runs until the source is dropped or a record or the consumer fails (the error is the last item sent).
    pub(crate) fn run(mut self, chunks: mpsc::Sender<Result<Chunk>>) {
        while !self.closed.load(Ordering::Relaxed) {
            let chunk = match self.refresh().and_then(|()| self.read_chunk()) {
                Ok(None) => continue,
                Ok(Some(chunk)) => Ok(chunk),
                Err(e) => Err(e),
            };
            let failed = chunk.is_err();
            if chunks.blocking_send(chunk).is_err() || failed {
                return;
            }
        }
    }

    /// The periodic metadata refresh, when due.
    fn refresh(&mut self) -> Result<()> {
        if self.assignment.refresh_due() {
            self.assignment.refresh(&self.consumer)?;
        }
        Ok(())
    }

    /// Whether records' headers are used: a `headers` metadata column, or bad records set aside (with their
    /// headers) for a dead-letter topic.
    fn keeps_headers(&self) -> bool {
        self.divert || self.metadata.headers.is_some()
    }

    /// Reads up to `batch_rows` records, shipping a partial batch `max_batch_wait` after its first record. `None`
    /// when nothing arrived within one poll. The builders are made on the first record, so an idle source
    /// allocates nothing. A gap (an offset out of range) or a tombstone ends the batch early; with no rows it ships
    /// an empty batch, so the positions move past the gap or the tombstone. A record whose writer schema widened
    /// the reader schema ends the batch before it and starts the next one (every batch has one schema).
    fn read_chunk(&mut self) -> Result<Option<Chunk>> {
        let mut chunk = ChunkState::new(self);
        // Parsing a record's headers costs (librdkafka parses them on demand): only when they are used.
        let wants_headers = self.keeps_headers();
        let mut deadline: Option<Instant> = None;
        if let Some((topic, deferred)) = self.deferred.take() {
            let record = deferred.parts(&topic, 0);
            deadline = Some(Instant::now() + self.max_batch_wait);
            if let Take::EndAfter = chunk.take(self, &record)? {
                return chunk.finish(self);
            }
        }
        while chunk.records < self.batch_rows && !self.closed.load(Ordering::Relaxed) {
            let message = match next_message(&self.consumer, deadline) {
                Polled::Message(message) => message,
                Polled::Nothing if deadline.is_none() => {
                    chunk.past_skipped(self);
                    return chunk.finish(self);
                }
                Polled::Nothing => continue,
                Polled::DeadlinePassed => break,
            };
            let message = match message {
                Ok(message) => message,
                Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset)) => {
                    chunk.gap(self)?;
                    break;
                }
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::Retryable,
                        Phase::Write,
                        "the Kafka consumer failed",
                    )
                    .with_source(e));
                }
            };
            let record = RecordParts {
                at: RecordAt {
                    topic: message.topic(),
                    partition: message.partition(),
                    offset: message.offset(),
                },
                timestamp: message.timestamp().to_millis(),
                key: message.key(),
                value: message.payload(),
                headers: if wants_headers {
                    message.headers()
                } else {
                    None
                },
            };
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.max_batch_wait);
            match chunk.take(self, &record)? {
                Take::Next => {}
                Take::EndAfter => break,
                Take::EndBefore => {
                    let mut kept = RawRecords::new(true);
                    kept.push(&record);
                    self.deferred = Some((record.at.topic.to_string(), kept));
                    break;
                }
            }
            if (chunk.records as u64).is_multiple_of(DEADLINE_CHECK_EVERY)
                && Instant::now() >= deadline
            {
                break;
            }
        }
        chunk.finish(self)
    }
}

/// What a record does to the chunk being read.
enum Take {
    /// It is in; read on.
    Next,
    /// It is in and ends the chunk (a tombstone of a decoding whose rows are the value's fields).
    EndAfter,
    /// It is not in: it needs a newer reader schema than the chunk's rows, or is of another topic, so it starts
    /// the next chunk.
    EndBefore,
}

/// One chunk being read.
struct ChunkState {
    builder: Option<BatchBuilder>,
    next: Vec<(TopicPartition, i64)>,
    gaps: Vec<Gap>,
    /// JSON and Avro values or keys: the raw records, to sort a batch that fails out record by record.
    raw: Option<RawRecords>,
    decoder_failed: bool,
    rejected: Vec<RejectedRecord>,
    tombstones: Vec<Tombstone>,
    /// Records read and left out (Debezium's tombstones): the positions move past them.
    skipped: usize,
    topic: String,
    records: usize,
}

impl ChunkState {
    fn new(reader: &Reader) -> Self {
        let defers = reader.decoding.defers_failures() || reader.metadata.defers_failures();
        let keep_headers = reader.keeps_headers();
        Self {
            builder: None,
            next: Vec::new(),
            gaps: Vec::new(),
            raw: defers.then(|| RawRecords::new(keep_headers)),
            decoder_failed: false,
            rejected: Vec::new(),
            tombstones: Vec::new(),
            skipped: 0,
            topic: String::new(),
            records: 0,
        }
    }

    /// The consumer reported an offset out of range: records were removed before they were read.
    fn gap(&mut self, reader: &mut Reader) -> Result<()> {
        for (at, offset) in &self.next {
            reader.assignment.took(&at.topic, at.partition, *offset);
        }
        for gap in reader.assignment.out_of_range(&reader.consumer)? {
            let at = TopicPartition::new(gap.topic.clone(), gap.partition);
            match self.next.iter_mut().find(|(p, _)| *p == at) {
                Some(entry) => entry.1 = gap.log_start,
                None => self.next.push((at, gap.log_start)),
            }
            self.gaps.push(gap);
        }
        Ok(())
    }

    /// With nothing to read: moves the positions past records the consumer skipped without handing them out
    /// (transaction markers and aborted transactions' records under read_committed), so a checkpoint and the lag
    /// group stand at the log end, not one marker short of it.
    fn past_skipped(&mut self, reader: &Reader) {
        let moved = reader.assignment.past_skipped(&reader.consumer);
        self.skipped += moved.len();
        self.next.extend(moved);
    }

    /// Takes one record into the chunk.
    fn take<H: Headers>(&mut self, reader: &Reader, record: &RecordParts<'_, H>) -> Result<Take> {
        let at = record.at;
        // A registry-backed decoding learns the record's writer schema first: it may widen the reader schema,
        // and rows of two reader schemas never share a batch.
        reader.decoding.learn_schema(at, record.value)?;
        if self.builder.as_ref().is_some_and(BatchBuilder::outdated) {
            return Ok(Take::EndBefore);
        }
        if self.topic.is_empty() {
            self.topic = at.topic.to_string();
        } else if self.topic != at.topic {
            return Ok(Take::EndBefore);
        }
        self.records += 1;
        match self
            .next
            .iter_mut()
            .find(|(p, _)| p.partition == at.partition && p.topic == at.topic)
        {
            Some(entry) => entry.1 = at.offset + 1,
            None => self
                .next
                .push((TopicPartition::new(at.topic, at.partition), at.offset + 1)),
        }
        if reader.decoding.skips_tombstones() && record.value.is_none() {
            // Debezium's tombstone after a delete: the delete event before it carried the change.
            self.skipped += 1;
            return Ok(Take::Next);
        }
        if reader.decoding.defers_failures() && record.value.is_none() {
            // A tombstone of a decoding whose rows are the value's fields: a record with no row. It ends the
            // chunk, so it comes after every row read before it and before every row read after it (a sink
            // applies the chunk's rows, then its tombstone: a key deleted after an upsert stays deleted).
            self.tombstones.push(Tombstone {
                topic: at.topic.to_string(),
                partition: at.partition,
                offset: at.offset,
                key: record.key.map(<[u8]>::to_vec),
            });
            return Ok(Take::EndAfter);
        }
        let builder = match &mut self.builder {
            Some(builder) => builder,
            None => self.builder.insert(BatchBuilder::new(
                &reader.decoding,
                &reader.metadata,
                reader.batch_rows,
            )?),
        };
        if let Some(raw) = &mut self.raw {
            raw.push(record);
        }
        if !self.decoder_failed {
            match builder.append(record) {
                Ok(()) => {}
                // Not the record's fault (a schema registry that cannot be reached): never set aside.
                Err(e) if e.kind() != ErrorKind::BadRecord => return Err(e),
                Err(_) if self.raw.is_some() => self.decoder_failed = true,
                Err(e) if reader.divert => self.rejected.push(RejectedRecord::new(record, &e)),
                Err(e) => return Err(e),
            }
        }
        Ok(Take::Next)
    }

    /// The chunk of everything taken (`None` when nothing was: no rows, gaps, tombstones or skipped records).
    fn finish(mut self, reader: &mut Reader) -> Result<Option<Chunk>> {
        for (at, offset) in &self.next {
            reader.assignment.took(&at.topic, at.partition, *offset);
        }
        let Some(builder) = self.builder else {
            if self.gaps.is_empty() && self.tombstones.is_empty() && self.skipped == 0 {
                return Ok(None);
            }
            let schema = reader.metadata.schema(&reader.decoding)?;
            return Ok(Some(Chunk {
                topic: self.topic,
                batch: RecordBatch::new_empty(schema),
                rejected: self.rejected,
                tombstones: self.tombstones,
                next: self.next,
                gaps: self.gaps,
            }));
        };
        let finished = if self.decoder_failed {
            None
        } else {
            Some(builder.finish())
        };
        let batch = match (finished, &self.raw) {
            (Some(Ok(batch)), _) => batch,
            (Some(Err(e)), None) => return Err(e),
            (_, Some(raw)) => {
                let (batch, bad) = raw.sort(
                    &self.topic,
                    &reader.decoding,
                    &reader.metadata,
                    reader.divert,
                )?;
                self.rejected.extend(bad);
                batch
            }
            (None, None) => unreachable!("only JSON and Avro values or keys defer failures"),
        };
        Ok(Some(Chunk {
            topic: self.topic,
            batch,
            rejected: self.rejected,
            tombstones: self.tombstones,
            next: self.next,
            gaps: self.gaps,
        }))
    }
}
