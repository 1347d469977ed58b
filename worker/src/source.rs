//! A Kafka source that reads from explicit positions (restored from a checkpoint) into Arrow batches.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use arrow_array::builder::{Int32Builder, Int64Builder, StringBuilder};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::SourceOffset;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// Schema of the batches the source produces: one row per Kafka record.
pub fn record_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new("key", DataType::Utf8, true),
        Field::new("value", DataType::Utf8, true),
    ]))
}

/// Reads every partition of one topic with `isolation.level=read_committed`, starting at restored positions.
/// Offsets are never committed to Kafka: the checkpoint record holds them.
pub struct KafkaSource {
    consumer: StreamConsumer,
    topic: String,
    /// Next offset to read, per partition.
    next: BTreeMap<i32, i64>,
}

impl KafkaSource {
    /// Assigns every partition of `topic`, at the offsets in `restored` or from the beginning.
    pub fn open(bootstrap: &str, topic: &str, restored: &[SourceOffset]) -> Result<Self> {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("ratchet-{topic}"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .create()
            .context("cannot create the Kafka consumer")?;
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(30))
            .with_context(|| format!("cannot read metadata of topic {topic} from {bootstrap}"))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        anyhow::ensure!(
            !partitions.is_empty(),
            "topic {topic} has no partitions (does it exist?)"
        );
        let mut assignment = TopicPartitionList::new();
        let mut next = BTreeMap::new();
        for partition in partitions {
            let restored = restored
                .iter()
                .find(|o| o.topic == topic && o.partition == partition)
                .map(|o| o.next_offset);
            let offset = restored.map_or(Offset::Beginning, Offset::Offset);
            assignment.add_partition_offset(topic, partition, offset)?;
            next.insert(partition, restored.unwrap_or(0));
        }
        consumer
            .assign(&assignment)
            .context("cannot assign partitions")?;
        Ok(Self {
            consumer,
            topic: topic.to_string(),
            next,
        })
    }

    /// The high watermark of every partition now: where "caught up" is.
    pub fn high_watermarks(&self) -> Result<BTreeMap<i32, i64>> {
        self.next
            .keys()
            .map(|&p| {
                let (_, high) = self
                    .consumer
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(30))
                    .with_context(|| format!("cannot read watermarks of {}/{p}", self.topic))?;
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
        let mut rows = 0;
        while rows < max_rows {
            let message = match tokio::time::timeout(idle, self.consumer.recv()).await {
                Err(_) => break,
                Ok(message) => message.context("Kafka consumer error")?,
            };
            let utf8 = |bytes: Option<&[u8]>, what: &str| -> Result<Option<String>> {
                bytes
                    .map(|b| String::from_utf8(b.to_vec()))
                    .transpose()
                    .with_context(|| {
                        format!(
                            "record {}/{}@{} has a {what} that is not UTF-8",
                            message.topic(),
                            message.partition(),
                            message.offset()
                        )
                    })
            };
            topics.append_value(message.topic());
            partitions.append_value(message.partition());
            offsets.append_value(message.offset());
            keys.append_option(utf8(message.key(), "key")?);
            values.append_option(utf8(message.payload(), "value")?);
            self.next.insert(message.partition(), message.offset() + 1);
            rows += 1;
        }
        if rows == 0 {
            return Ok(None);
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
        )?;
        Ok(Some(batch))
    }
}
