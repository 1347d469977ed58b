//! Sending Arrow rows as Kafka records through one producer, with bounded memory: the part of writing that the
//! transactional sink and the at-least-once sink share. Errors carry no sink context; the caller adds it.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{BinaryArray, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::{Error, ErrorKind, Evolution, FollowedSchema, Phase, Result};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use crate::avro_values::AvroValues;
use crate::delivery::{SinkProducer, wait_delivered};
use crate::json_schema_values::JsonSchemaValues;
use crate::protobuf_values::ProtobufValues;
use crate::records::{RecordMapping, ValueFormat};
use crate::{PartitionRange, classify};

/// How long a flush may wait for outstanding deliveries.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// How long to wait when librdkafka's queue is full (`queue.buffering.max.messages`): the backpressure.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(1);

/// Maps rows to records and sends them; the producer's [`DeliveryTracker`](crate::delivery::DeliveryTracker)
/// collects what was delivered.
pub(crate) struct RecordSender {
    mapping: Arc<RecordMapping>,
    default_topic: String,
    max_message_bytes: usize,
    /// Whole rows in a registry format (`records.value_format = "avro"`, `"json-schema"` or `"protobuf"`).
    registered: Option<RegistryValues>,
    /// The batches' schema, and whether new columns may come (nothing to change on the broker).
    followed: FollowedSchema,
}

/// Whole rows as values of a registry format, their schema registered before any record of it.
enum RegistryValues {
    Avro(AvroValues),
    JsonSchema(JsonSchemaValues),
    Protobuf(ProtobufValues),
}

impl RegistryValues {
    async fn register(&mut self, schema: &Schema) -> Result<()> {
        match self {
            Self::Avro(values) => values.register(schema).await,
            Self::JsonSchema(values) => values.register(schema).await,
            Self::Protobuf(values) => values.register(schema).await,
        }
    }

    fn encode(&self, batch: &RecordBatch) -> std::result::Result<Vec<Vec<u8>>, String> {
        match self {
            Self::Avro(values) => values.encode(batch),
            Self::JsonSchema(values) => values.encode(batch),
            Self::Protobuf(values) => values.encode(batch),
        }
    }
}

impl RecordSender {
    /// A sender of `config`'s records.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for settings that do not go together or a registry client that cannot be
    /// made.
    pub(crate) fn new(config: &crate::KafkaSinkConfig) -> Result<Self> {
        config.records.check_format(config.registry.is_some())?;
        let registered = match (&config.registry, config.records.value_format) {
            (Some(registry), ValueFormat::Avro) => Some(RegistryValues::Avro(AvroValues::new(
                registry,
                &config.topic,
            )?)),
            (Some(registry), ValueFormat::JsonSchema) => {
                let options = connector_api::types::json::JsonOptions {
                    decimals: config.records.json_decimals,
                };
                Some(RegistryValues::JsonSchema(JsonSchemaValues::new(
                    registry,
                    &config.topic,
                    options,
                )?))
            }
            (Some(registry), ValueFormat::Protobuf) => Some(RegistryValues::Protobuf(
                ProtobufValues::new(registry, &config.topic)?,
            )),
            _ => None,
        };
        Ok(Self {
            mapping: Arc::new(config.records.clone()),
            default_topic: config.topic.clone(),
            max_message_bytes: config.max_message_bytes(),
            registered,
            followed: FollowedSchema::default(),
        })
    }

    /// Batches have `schema`, and take new columns as `evolution` says (without this a schema change is refused).
    pub(crate) fn follow(&mut self, schema: SchemaRef, evolution: Evolution) {
        self.followed = FollowedSchema::new(Some(schema), evolution);
    }

    /// Takes `schema` for the batches from now on ([`TwoPhaseCommit::evolve`](connector_api::TwoPhaseCommit::evolve)
    /// of both Kafka sinks): allowed by `evolution`, and with Avro values registered before any record of it.
    ///
    /// # Errors
    /// As [`FollowedSchema::evolve`] and [`prepare`](Self::prepare).
    pub(crate) async fn evolve(
        &mut self,
        sink: &connector_api::SinkId,
        schema: SchemaRef,
    ) -> Result<()> {
        let target = format!("topic {}", self.default_topic);
        self.followed.evolve(sink, &target, schema.clone())?;
        self.prepare(&schema).await
    }

    /// Makes sure the values of batches of `schema` can be sent: with Avro values, their schema is registered.
    ///
    /// # Errors
    /// As [`AvroValues::register`].
    pub(crate) async fn prepare(&mut self, schema: &Schema) -> Result<()> {
        match &mut self.registered {
            Some(values) => values.register(schema).await,
            None => Ok(()),
        }
    }

    /// Starts a new transaction (or checkpoint) on `producer`: what was delivered before is forgotten, and late
    /// reports of earlier records are ignored.
    pub(crate) fn start(&self, producer: &SinkProducer) {
        producer.context().start();
    }

    /// Sends every row of `batch` through `producer`; when librdkafka's queue is full, waits for it to drain.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the row when the batch cannot be mapped or a record is too large:
    /// then nothing of the batch was sent. Once part of it was sent, errors are never `BadRecord`.
    pub(crate) async fn send(
        &mut self,
        producer: &SinkProducer,
        batch: &RecordBatch,
    ) -> Result<()> {
        let mapping = self.mapping.clone();
        let whole_rows = match &mut self.registered {
            Some(values) => {
                values.register(batch.schema_ref()).await?;
                Some(
                    values
                        .encode(batch)
                        .map_err(|m| Error::new(ErrorKind::BadRecord, Phase::Write, m))?,
                )
            }
            None => None,
        };
        self.send_mapped(&mapping, producer, batch, whole_rows)
            .await
    }

    /// Sends a tombstone (the key, a null value) per key to the sink's topic: deletions of those keys for
    /// compacted topics and their readers.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub(crate) async fn send_tombstones(
        &mut self,
        producer: &SinkProducer,
        keys: &[Option<Vec<u8>>],
    ) -> Result<()> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Binary, true),
            Field::new("value", DataType::Binary, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(BinaryArray::from_iter(keys.iter().map(|k| k.as_deref()))),
                Arc::new(BinaryArray::from_iter(keys.iter().map(|_| None::<&[u8]>))),
            ],
        )
        .map_err(|e| {
            Error::new(ErrorKind::Bug, Phase::Write, "cannot build the tombstones").with_source(e)
        })?;
        let mapping = RecordMapping {
            key_column: Some("key".into()),
            value_column: Some("value".into()),
            ..RecordMapping::default()
        };
        self.send_mapped(&mapping, producer, &batch, None).await
    }

    async fn send_mapped(
        &mut self,
        mapping: &RecordMapping,
        producer: &SinkProducer,
        batch: &RecordBatch,
        whole_rows: Option<Vec<Vec<u8>>>,
    ) -> Result<()> {
        let records = mapping
            .records(batch, whole_rows)
            .map_err(|m| Error::new(ErrorKind::BadRecord, Phase::Write, m))?;
        // Validated whole before anything is sent: a refused batch must not leave a prefix behind.
        let max = self.max_message_bytes;
        if let Some((row, size)) = records
            .iter()
            .map(|r| {
                r.value.as_ref().map_or(0, |v| v.len())
                    + r.key.map_or(0, <[u8]>::len)
                    + r.headers
                        .iter()
                        .map(|(k, v)| k.len() + v.map_or(0, <[u8]>::len))
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
        let generation = producer.context().current();
        let default_topic = self.default_topic.clone();
        let mut sent = 0usize;
        for record in records {
            let topic = record.topic.unwrap_or(&default_topic);
            let mut base = BaseRecord::<[u8], [u8], usize>::with_opaque_to(topic, generation);
            // No payload: a tombstone.
            if let Some(value) = &record.value {
                base = base.payload(&value[..]);
            }
            if let Some(key) = record.key {
                base = base.key(key);
            }
            if let Some(partition) = record.partition {
                base = base.partition(partition);
            }
            if !record.headers.is_empty() {
                let headers = record.headers.iter().fold(
                    OwnedHeaders::new_with_capacity(record.headers.len()),
                    |h, (key, value)| h.insert(Header { key, value: *value }),
                );
                base = base.headers(headers);
            }
            loop {
                match producer.send(base) {
                    Ok(()) => {
                        sent += 1;
                        break;
                    }
                    Err((e, returned))
                        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) =>
                    {
                        base = returned;
                        tokio::time::sleep(QUEUE_FULL_WAIT).await;
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
        }
        Ok(())
    }

    /// Waits for every delivery; returns the offsets written since [`start`](Self::start), per partition.
    ///
    /// # Errors
    /// [`Fenced`](ErrorKind::Fenced) when a newer instance fenced the producer (its queued records purged);
    /// [`MustAbort`](ErrorKind::MustAbort) when a record was not delivered otherwise; [`Retryable`](ErrorKind::Retryable)
    /// when deliveries are still outstanding after a minute.
    pub(crate) async fn flush(&mut self, producer: &SinkProducer) -> Result<Vec<PartitionRange>> {
        if !wait_delivered(producer, FLUSH_TIMEOUT).await {
            return Err(Error::new(
                ErrorKind::Retryable,
                Phase::PreCommit,
                format!(
                    "{} records are still undelivered after a minute",
                    producer.in_flight_count()
                ),
            ));
        }
        producer.context().take().map_err(|e| {
            // A fenced producer purges what it had queued: the purge is what the deliveries report, the fence
            // is the producer's fatal error.
            match producer.client().fatal_error() {
                Some((code, reason)) if crate::error::is_fence(code) => Error::new(
                    ErrorKind::Fenced,
                    Phase::PreCommit,
                    format!("records were not delivered: a newer instance fenced this producer ({reason})"),
                ),
                _ => Error::new(
                    ErrorKind::MustAbort,
                    Phase::Write,
                    "a record was not delivered",
                ),
            }
            .with_source(e)
        })
    }
}
