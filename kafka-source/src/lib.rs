//! A Kafka source for Ratchet jobs: reads one topic, a list, or every topic matching a pattern
//! ([`TopicSelection`]) with `isolation.level=read_committed` from the positions a
//! checkpoint restored ([`connector_api::Restored::positions`]), into Arrow batches, and hands back the positions
//! the batches handed out so far reach, for [`connector_api::Driver::checkpoint`]. Offsets are never committed to
//! Kafka (no auto-commit, no group offsets): the checkpoint record is the only place they live, so a restart
//! resumes exactly where the last durable checkpoint ends.
//!
//! Positions never move by themselves: a saved offset below the partition's log start (records removed by
//! retention, compaction or DeleteRecords before they were read) is a gap, which stops the source or is skipped
//! as [`GapPolicy`] says; a topic deleted and created again under the same name (a new topic id) is refused;
//! partitions added while it runs, and topics created since that a pattern selects, are found within
//! [`KafkaSourceOptions::metadata_refresh`] and read from their beginning. Each batch holds one topic's records;
//! positions are per topic and partition.
//!
//! A consumer thread of its own polls librdkafka and decodes records straight into Arrow column builders (raw key
//! and value as text or bytes, JSON values into declared columns (strictly: [`JsonField`]), registry JSON Schema
//! values validated and decoded into the schema's columns ([`JsonSchemaDecoding`]) or Avro values with arrow-avro,
//! plus
//! whichever record metadata the job asks for as columns: [`MetadataColumns`]), so consumption goes on while
//! the job writes, pre-commits and saves; at most `buffered_batches` decoded batches wait for the job
//! (backpressure).
//!
//! ```no_run
//! # async fn job(driver: &mut connector_api::Driver<connector_api::LocalCheckpointStore>,
//! #              sink: connector_api::SinkHandle) -> connector_api::Result<()> {
//! use std::time::Duration;
//! let restored = driver.start().await?;
//! let kafka = kafka_source::KafkaConnection::plaintext("127.0.0.1:19092");
//! let mut source = kafka_source::KafkaSource::open(&kafka, "orders", &restored.positions).await?;
//! while let Some(batch) = source.next_batch(Duration::from_millis(500)).await? {
//!     driver.write(sink, &batch).await?;
//!     driver.checkpoint(source.positions()).await?;
//! }
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod avro;
mod avro_fields;
mod avro_rows;
mod debezium;
mod decode;
mod decoding;
mod event;
mod json_rows;
mod json_schema;
mod json_types;
mod metadata;
mod partitions;
mod protobuf;
mod reader;
mod record;
mod registry_lookup;
mod reject;
mod renames;
mod settings;
mod source;
mod tombstone;
mod topics;
mod values;
mod writer_schemas;

pub use avro::{AvroDecoding, AvroFraming};
pub use debezium::{DEFAULT_PLACEHOLDER, DebeziumDecoding, Truncate, UNAVAILABLE_COLUMN};
pub use decoding::{Decoding, binary_schema, text_schema};
pub use event::{SourceBatch, SourceEvent};
pub use json_rows::UnknownFields;
pub use json_schema::JsonSchemaDecoding;
pub use json_types::{JsonDecoding, JsonField, JsonItem};
pub use kafka_connection::KafkaConnection;
pub use metadata::{KeyDecoding, MetadataColumns, headers_field};
pub use partitions::{Gap, GapPolicy};
pub use protobuf::ProtobufDecoding;
pub use reject::RejectedRecord;
pub use settings::{
    AvroFramingSettings, DebeziumConverter, DecodingSettings, KafkaSourceSettings,
    MetadataSettings, OnGap, is_connection_setting,
};
pub use source::{KafkaSource, KafkaSourceOptions, Watermarks};
pub use tombstone::Tombstone;
pub use topics::{PartitionShare, TopicPartition, TopicSelection, topic_hash};
pub use writer_schemas::ReaderSchema;
