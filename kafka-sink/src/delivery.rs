//! Delivery reports of the sinks' producers, tracked by the producer's context instead of a future per record:
//! per partition, the first and last offset delivered in the current transaction, and the first failure.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext, ThreadedProducer};

use crate::PartitionRange;

/// The producer both Kafka sinks send through: librdkafka's own delivery thread, deliveries tracked by
/// [`DeliveryTracker`].
pub type SinkProducer = ThreadedProducer<DeliveryTracker>;

/// A sink instance's producers by transactional id, shared with its committer.
pub(crate) type Producers = std::sync::Arc<Mutex<std::collections::HashMap<String, SinkProducer>>>;

/// What was delivered in the current generation (transaction or checkpoint).
#[derive(Default)]
struct Delivered {
    /// (topic, partition, first offset, last offset): a few entries, scanned linearly (no allocation per record).
    ranges: Vec<(String, i32, i64, i64)>,
    failed: Option<KafkaError>,
}

/// Counts the deliveries of one producer. Every record is sent with the current generation as its opaque; a
/// delivery report of an older generation (a transaction already finished) is ignored, so a late report can
/// never widen the next transaction's offset ranges.
#[derive(Default)]
pub struct DeliveryTracker {
    generation: AtomicUsize,
    delivered: Mutex<Delivered>,
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, generation: usize) {
        if generation != self.generation.load(Ordering::Acquire) {
            return;
        }
        let mut delivered = self.delivered.lock().expect("delivery tracker");
        match result {
            Ok(message) => {
                let (topic, partition, offset) =
                    (message.topic(), message.partition(), message.offset());
                match delivered
                    .ranges
                    .iter_mut()
                    .find(|(t, p, _, _)| *p == partition && t == topic)
                {
                    Some(range) => {
                        range.2 = range.2.min(offset);
                        range.3 = range.3.max(offset);
                    }
                    None => delivered
                        .ranges
                        .push((topic.to_string(), partition, offset, offset)),
                }
            }
            Err((e, _)) => {
                delivered.failed.get_or_insert_with(|| e.clone());
            }
        }
    }
}

impl DeliveryTracker {
    /// Starts a new generation: forgets what was delivered and returns the opaque the generation's records carry.
    pub(crate) fn start(&self) -> usize {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        *self.delivered.lock().expect("delivery tracker") = Delivered::default();
        generation
    }

    /// The current generation.
    pub(crate) fn current(&self) -> usize {
        self.generation.load(Ordering::Acquire)
    }

    /// What the current generation delivered, per partition; or its first failed delivery.
    pub(crate) fn take(&self) -> Result<Vec<PartitionRange>, KafkaError> {
        let mut delivered = self.delivered.lock().expect("delivery tracker");
        if let Some(e) = delivered.failed.take() {
            return Err(e);
        }
        let mut ranges: Vec<PartitionRange> = std::mem::take(&mut delivered.ranges)
            .into_iter()
            .map(|(topic, partition, first, last)| PartitionRange {
                topic,
                partition,
                first_offset: first,
                last_offset: last,
            })
            .collect();
        ranges.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        Ok(ranges)
    }
}

/// How often the wait for deliveries looks at the producer's queue.
const DELIVERY_CHECK: Duration = Duration::from_millis(1);

/// Whether every record sent through `producer` is delivered and its report served.
fn all_delivered<C: ProducerContext + 'static>(producer: &ThreadedProducer<C>) -> bool {
    producer.in_flight_count() == 0
}

/// Waits, on a blocking thread, until every record sent through `producer` is delivered and its report served;
/// `false` after `timeout`.
///
/// Not `Producer::flush`: rdkafka's flush polls the report queue in 100 ms slices, and with a `ThreadedProducer`
/// the producer's own thread takes the reports, so each slice ran to its end and every flush cost ~100 ms
/// (docs/benchmarks.md).
pub(crate) fn wait_delivered_blocking<C: ProducerContext + 'static>(
    producer: &ThreadedProducer<C>,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    while !all_delivered(producer) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(DELIVERY_CHECK);
    }
    true
}

/// [`wait_delivered_blocking`] on the async runtime.
pub(crate) async fn wait_delivered<C: ProducerContext + 'static>(
    producer: &ThreadedProducer<C>,
    timeout: Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while !all_delivered(producer) {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(DELIVERY_CHECK).await;
    }
    true
}
