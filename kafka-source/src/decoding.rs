//! What the source decodes: the [`Decoding`] of record values and the raw decodings' schemas.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::{ErrorKind, Result};

use crate::avro::AvroDecoding;
use crate::debezium::{DebeziumDecoding, Envelope};
use crate::json_schema::JsonSchemaDecoding;
use crate::json_types::JsonDecoding;
use crate::protobuf::ProtobufDecoding;
use crate::record::RecordAt;

/// How record values become rows.
#[derive(Debug, Clone)]
pub enum Decoding {
    /// One row per record: `topic`, `partition`, `offset`, `key` and `value` as UTF-8 strings ([`text_schema`]).
    /// A key or value that is not UTF-8 is a [`BadRecord`](ErrorKind::BadRecord).
    Text,
    /// As [`Text`](Self::Text), key and value as raw bytes ([`binary_schema`]): nothing is refused.
    Binary,
    /// Each value is one JSON object, decoded into the declared columns exactly ([`JsonDecoding`]); a value that
    /// does not fit is a [`BadRecord`](ErrorKind::BadRecord) naming the record, the field and the value.
    Json(JsonDecoding),
    /// Each value one JSON document in Confluent framing whose JSON Schema is in a schema registry: validated
    /// against it, decoded into the reader schema's columns exactly ([`JsonSchemaDecoding`]); a value that does
    /// not validate or fit is a [`BadRecord`](ErrorKind::BadRecord) naming the record and the violation.
    JsonSchema(JsonSchemaDecoding),
    /// Each value one Protobuf message in Confluent framing whose schema is in a schema registry: decoded with
    /// the schema its id names into the reader message's columns exactly ([`ProtobufDecoding`]); a value that
    /// does not decode or fit is a [`BadRecord`](ErrorKind::BadRecord) naming the record and the field.
    Protobuf(ProtobufDecoding),
    /// Each value is one Avro record of the declared schema in Confluent or single-object framing (arrow-avro); a
    /// value that does not decode is a [`BadRecord`](ErrorKind::BadRecord) naming the record.
    Avro(AvroDecoding),
    /// Each value is one Debezium change event (JSON or Avro), decoded into the table's columns and the change
    /// columns ([`DebeziumDecoding`]); Debezium's tombstones after deletes yield nothing.
    Debezium(DebeziumDecoding),
}

impl Decoding {
    /// The schema of the rows this decoding produces (before any [metadata columns](crate::MetadataColumns)).
    pub fn schema(&self) -> SchemaRef {
        match self {
            Self::Text => text_schema(),
            Self::Binary => binary_schema(),
            Self::Json(json) => json.schema(),
            Self::JsonSchema(json) => json.schema(),
            Self::Protobuf(protobuf) => protobuf.schema(),
            Self::Avro(avro) => avro.schema(),
            Self::Debezium(debezium) => debezium.schema(),
        }
    }

    /// Learns the writer schema of a value about to be read (a registry-backed Avro, JSON Schema or Protobuf
    /// decoding looks up an id it has not seen; Avro's may widen the reader schema). A schema that is refused is reported when the value is
    /// appended, naming the record, so it is not reported here.
    ///
    /// # Errors
    /// A registry that cannot be reached ([`Retryable`](ErrorKind::Retryable)) or refuses the client.
    pub(crate) fn learn_schema(&self, at: RecordAt<'_>, value: Option<&[u8]>) -> Result<()> {
        let avro = match self {
            Self::JsonSchema(json) => {
                return match value.map(|value| json.learn_schema(at, value)) {
                    Some(Err(e)) if e.kind() == ErrorKind::BadRecord => Ok(()),
                    Some(outcome) => outcome,
                    None => Ok(()),
                };
            }
            Self::Protobuf(protobuf) => {
                return match value.map(|value| protobuf.learn_schema(at, value)) {
                    Some(Err(e)) if e.kind() == ErrorKind::BadRecord => Ok(()),
                    Some(outcome) => outcome,
                    None => Ok(()),
                };
            }
            Self::Avro(avro) => avro,
            Self::Debezium(debezium) => match debezium.envelope() {
                Envelope::Avro(avro) => avro,
                Envelope::Json { .. } => return Ok(()),
            },
            Self::Text | Self::Binary | Self::Json(_) => return Ok(()),
        };
        match value.map(|value| avro.learn_schema(at, value)) {
            Some(Err(e)) if e.kind() == ErrorKind::BadRecord => Ok(()),
            Some(outcome) => outcome,
            None => Ok(()),
        }
    }

    /// Whether a bad value may only show when the batch is finished, leaving the decoder unusable: the reader then
    /// sorts the batch out record by record ([`crate::reject`]). Such decodings' rows are the value's fields, so a
    /// record without a value (a tombstone) has no row.
    pub(crate) fn defers_failures(&self) -> bool {
        matches!(
            self,
            Self::Json(_)
                | Self::JsonSchema(_)
                | Self::Protobuf(_)
                | Self::Avro(_)
                | Self::Debezium(_)
        )
    }

    /// Whether a record without a value is read and left out: Debezium's tombstone after a delete event, which
    /// the delete event already carried (a changelog would otherwise hold the delete twice).
    pub(crate) fn skips_tombstones(&self) -> bool {
        matches!(self, Self::Debezium(_))
    }
}

/// The schema of the raw decodings with key and value of type `payload`.
pub(crate) fn raw_schema(payload: DataType) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new("key", payload.clone(), true),
        Field::new("value", payload, true),
    ]))
}

/// Schema of [`Decoding::Text`] batches: one row per Kafka record, key and value as UTF-8 strings.
pub fn text_schema() -> SchemaRef {
    raw_schema(DataType::Utf8)
}

/// Schema of [`Decoding::Binary`] batches: one row per Kafka record, key and value as bytes.
pub fn binary_schema() -> SchemaRef {
    raw_schema(DataType::Binary)
}
