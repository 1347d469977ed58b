//! Sending Arrow rows as Kafka records through one producer, with bounded memory: the part of writing that the
//! transactional sink and the at-least-once sink share. Errors carry no sink context; the caller adds it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use arrow_array::RecordBatch;
use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use crate::records::RecordMapping;
use crate::{PartitionRange, classify};

/// At most this many records in flight before sending waits for deliveries (backpressure).
const MAX_IN_FLIGHT: usize = 100_000;

/// Records sent and not yet confirmed, and the offsets confirmed so far, per partition.
pub(crate) struct RecordSender {
    mapping: Arc<RecordMapping>,
    default_topic: String,
    max_message_bytes: usize,
    /// Deliveries not yet confirmed, with their topic (`None`: the default topic).
    in_flight: VecDeque<(Option<String>, DeliveryFuture)>,
    ranges: BTreeMap<(String, i32), (i64, i64)>,
}

impl RecordSender {
    pub(crate) fn new(
        mapping: RecordMapping,
        default_topic: &str,
        max_message_bytes: usize,
    ) -> Self {
        Self {
            mapping: Arc::new(mapping),
            default_topic: default_topic.to_string(),
            max_message_bytes,
            in_flight: VecDeque::new(),
            ranges: BTreeMap::new(),
        }
    }

    /// Sends every row of `batch` through `producer`.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the row when the batch cannot be mapped or a record is too large:
    /// then nothing of the batch was sent. Once part of it was sent, errors are never `BadRecord`.
    pub(crate) async fn send(
        &mut self,
        producer: &FutureProducer,
        batch: &RecordBatch,
    ) -> Result<()> {
        let mapping = self.mapping.clone();
        let records = mapping
            .records(batch)
            .map_err(|m| Error::new(ErrorKind::BadRecord, Phase::Write, m))?;
        // Validated whole before anything is sent: a refused batch must not leave a prefix behind.
        let max = self.max_message_bytes;
        if let Some((row, size)) = records
            .iter()
            .map(|r| {
                r.value.len()
                    + r.key.map_or(0, <[u8]>::len)
                    + r.headers
                        .iter()
                        .map(|(k, v)| k.len() + v.len())
                        .sum::<usize>()
            })
            .enumerate()
            .find(|(_, size)| *size > max)
        {
            return Err(Error::new(
                ErrorKind::BadRecord,
                Phase::Write,
                format!(
                    "row {row} of the batch makes a record of {size} bytes, above message.max.bytes ({max}): the \
                     batch was refused whole; shrink the record or raise message.max.bytes in `client` (and the \
                     topic's max.message.bytes)"
                ),
            ));
        }
        let default_topic = self.default_topic.clone();
        let mut sent = 0usize;
        for record in records {
            let topic = record.topic.unwrap_or(&default_topic);
            let mut future = FutureRecord::to(topic).payload(&record.value);
            if let Some(key) = record.key {
                future = future.key(key);
            }
            if let Some(partition) = record.partition {
                future = future.partition(partition);
            }
            if !record.headers.is_empty() {
                let headers = record.headers.iter().fold(
                    OwnedHeaders::new_with_capacity(record.headers.len()),
                    |h, (key, value)| {
                        h.insert(Header {
                            key,
                            value: Some(*value),
                        })
                    },
                );
                future = future.headers(headers);
            }
            loop {
                match producer.send_result(future) {
                    Ok(delivery) => {
                        self.in_flight
                            .push_back((record.topic.map(str::to_string), delivery));
                        sent += 1;
                        break;
                    }
                    Err((e, returned))
                        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) =>
                    {
                        future = returned;
                        let Some(oldest) = self.in_flight.pop_front() else {
                            return Err(Error::new(
                                ErrorKind::Retryable,
                                Phase::Write,
                                "producer queue full",
                            )
                            .with_source(e));
                        };
                        self.await_delivery(oldest).await?;
                    }
                    Err((e, _)) => {
                        // Once part of the batch was sent, the batch cannot be refused whole.
                        let kind = match classify(&e) {
                            ErrorKind::BadRecord if sent > 0 => ErrorKind::MustAbort,
                            kind => kind,
                        };
                        return Err(
                            Error::new(kind, Phase::Write, "cannot send a record").with_source(e)
                        );
                    }
                }
            }
            while self.in_flight.len() > MAX_IN_FLIGHT {
                let oldest = self.in_flight.pop_front().expect("non-empty");
                self.await_delivery(oldest).await?;
            }
        }
        Ok(())
    }

    async fn await_delivery(
        &mut self,
        (topic, delivery): (Option<String>, DeliveryFuture),
    ) -> Result<()> {
        match delivery.await {
            Ok(Ok(delivered)) => {
                let topic = topic.unwrap_or_else(|| self.default_topic.clone());
                let entry = self
                    .ranges
                    .entry((topic, delivered.partition))
                    .or_insert((delivered.offset, delivered.offset));
                entry.0 = entry.0.min(delivered.offset);
                entry.1 = entry.1.max(delivered.offset);
                Ok(())
            }
            Ok(Err((e, _))) => Err(Error::new(
                ErrorKind::MustAbort,
                Phase::Write,
                "a record was not delivered",
            )
            .with_source(e)),
            Err(_) => Err(Error::new(
                ErrorKind::MustAbort,
                Phase::Write,
                "the producer dropped a delivery",
            )),
        }
    }

    /// Waits for every delivery; returns the offsets written since the last `flush` or `clear`, per partition.
    ///
    /// # Errors
    /// [`MustAbort`](ErrorKind::MustAbort) when a record was not delivered.
    pub(crate) async fn flush(&mut self) -> Result<Vec<PartitionRange>> {
        while let Some(delivery) = self.in_flight.pop_front() {
            self.await_delivery(delivery).await?;
        }
        Ok(std::mem::take(&mut self.ranges)
            .into_iter()
            .map(|((topic, partition), (first, last))| PartitionRange {
                topic,
                partition,
                first_offset: first,
                last_offset: last,
            })
            .collect())
    }

    /// Forgets what was sent (the transaction was aborted, or the sink is restarting).
    pub(crate) fn clear(&mut self) {
        self.in_flight.clear();
        self.ranges.clear();
    }
}
