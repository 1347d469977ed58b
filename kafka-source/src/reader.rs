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

/// One decoded batch, the records of it that did not decode (set aside when diverting), the tombstone of the JSON
/// and Avro decodings that ended it (set aside: it has no fields to decode; it comes after every row of the batch),
/// per partition it read from the offset after its last record (or the log start it went on from after a gap),
/// and the gaps it skipped.
pub(crate) struct Chunk {
    pub(crate) batch: RecordBatch,
    pub(crate) rejected: Vec<RejectedRecord>,
    pub(crate) tombstones: Vec<Tombstone>,
    pub(crate) next: Vec<(i32, i64)>,
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

    /// Reads up to `batch_rows` records, shipping a partial batch `max_batch_wait` after its first record. `None`
    /// when nothing arrived within one poll. The builders are made on the first record, so an idle source
    /// allocates nothing. A gap (an offset out of range) or a tombstone ends the batch early; with no rows it ships
    /// an empty batch, so the positions move past the gap or the tombstone.
    fn read_chunk(&mut self) -> Result<Option<Chunk>> {
        let mut builder: Option<BatchBuilder> = None;
        let mut next: Vec<(i32, i64)> = Vec::new();
        let mut gaps: Vec<Gap> = Vec::new();
        let mut deadline: Option<Instant> = None;
        // JSON and Avro values or keys: the raw records, to sort a batch that fails out record by record.
        let defers = self.decoding.defers_failures() || self.metadata.defers_failures();
        let keep_headers = self.divert || self.metadata.headers.is_some();
        let mut raw = defers.then(|| RawRecords::new(keep_headers));
        let mut decoder_failed = false;
        let mut rejected = Vec::new();
        let mut tombstones = Vec::new();
        let mut topic = String::new();
        let mut records = 0;
        while records < self.batch_rows && !self.closed.load(Ordering::Relaxed) {
            let message = match next_message(&self.consumer, deadline) {
                Polled::Message(message) => message,
                Polled::Nothing if deadline.is_none() => return Ok(None),
                Polled::Nothing => continue,
                Polled::DeadlinePassed => break,
            };
            let message = match message {
                Ok(message) => message,
                Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset)) => {
                    for &(partition, offset) in &next {
                        self.assignment.took(partition, offset);
                    }
                    for gap in self.assignment.out_of_range(&self.consumer)? {
                        match next.iter_mut().find(|(p, _)| *p == gap.partition) {
                            Some(entry) => entry.1 = gap.log_start,
                            None => next.push((gap.partition, gap.log_start)),
                        }
                        gaps.push(gap);
                    }
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
            let at = RecordAt {
                topic: message.topic(),
                partition: message.partition(),
                offset: message.offset(),
            };
            if topic.is_empty() {
                topic = at.topic.to_string();
            }
            records += 1;
            match next.iter_mut().find(|(p, _)| *p == at.partition) {
                Some(entry) => entry.1 = at.offset + 1,
                None => next.push((at.partition, at.offset + 1)),
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.max_batch_wait);
            let past_deadline =
                (records as u64).is_multiple_of(DEADLINE_CHECK_EVERY) && Instant::now() >= deadline;
            if self.decoding.defers_failures() && message.payload().is_none() {
                // A tombstone of a decoding whose rows are the value's fields: a record with no row. It ends the
                // chunk, so it comes after every row read before it and before every row read after it (a sink
                // applies the chunk's rows, then its tombstone: a key deleted after an upsert stays deleted).
                tombstones.push(Tombstone {
                    topic: at.topic.to_string(),
                    partition: at.partition,
                    offset: at.offset,
                    key: message.key().map(<[u8]>::to_vec),
                });
                break;
            }
            let record = RecordParts {
                at,
                timestamp: message.timestamp().to_millis(),
                key: message.key(),
                value: message.payload(),
                headers: message.headers(),
            };
            let builder = match &mut builder {
                Some(builder) => builder,
                None => builder.insert(BatchBuilder::new(
                    &self.decoding,
                    &self.metadata,
                    self.batch_rows,
                )?),
            };
            if let Some(raw) = &mut raw {
                raw.push(&record);
            }
            if !decoder_failed {
                match builder.append(&record) {
                    Ok(()) => {}
                    // Not the record's fault (a schema registry that cannot be reached): never set aside.
                    Err(e) if e.kind() != ErrorKind::BadRecord => return Err(e),
                    Err(_) if raw.is_some() => decoder_failed = true,
                    Err(e) if self.divert => rejected.push(RejectedRecord::new(&record, &e)),
                    Err(e) => return Err(e),
                }
            }
            if past_deadline {
                break;
            }
        }
        for &(partition, offset) in &next {
            self.assignment.took(partition, offset);
        }
        let Some(builder) = builder else {
            if gaps.is_empty() && tombstones.is_empty() {
                return Ok(None);
            }
            let schema = self.metadata.schema(&self.decoding)?;
            return Ok(Some(Chunk {
                batch: RecordBatch::new_empty(schema),
                rejected,
                tombstones,
                next,
                gaps,
            }));
        };
        let finished = if decoder_failed {
            None
        } else {
            Some(builder.finish())
        };
        let batch = match (finished, &raw) {
            (Some(Ok(batch)), _) => batch,
            (Some(Err(e)), None) => return Err(e),
            (_, Some(raw)) => {
                let (batch, bad) = raw.sort(&topic, &self.decoding, &self.metadata, self.divert)?;
                rejected.extend(bad);
                batch
            }
            (None, None) => unreachable!("only JSON and Avro values or keys defer failures"),
        };
        Ok(Some(Chunk {
            batch,
            rejected,
            tombstones,
            next,
            gaps,
        }))
    }
}
