//! Builders of a decoding's own columns (a value's, or a JSON or Avro key's): raw key and value columns, or a
//! declared schema filled by arrow-json or arrow-avro.

use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, Int32Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use connector_api::{Error, ErrorKind, Phase, Result};

use crate::avro_rows::AvroRows;
use crate::debezium::{DebeziumDecoding, DebeziumJsonRows, Envelope};
use crate::decoding::{Decoding, raw_schema};
use crate::json_rows::{JsonRows, RowContext};
use crate::json_schema::{JsonSchemaDecoding, LastWriter};
use crate::protobuf::ProtobufRows;
use crate::record::{RecordAt, bad_record, text};

/// Key and value columns of the raw decodings.
pub(crate) enum Payload {
    Text {
        keys: StringBuilder,
        values: StringBuilder,
    },
    Binary {
        keys: BinaryBuilder,
        values: BinaryBuilder,
    },
}

/// The columns of the raw decodings.
pub(crate) struct RawColumns {
    topics: StringBuilder,
    partitions: Int32Builder,
    offsets: Int64Builder,
    payload: Payload,
}

/// The decoding's own columns of one batch under construction.
pub(crate) enum Values {
    Raw(Box<RawColumns>),
    Json {
        rows: Box<JsonRows>,
        schema: SchemaRef,
        /// A JSON Schema decoding (each value's framing is taken off and the document validated first), the
        /// generation of its columns these rows have, and the last writer schema met.
        registry: Option<(JsonSchemaDecoding, usize, LastWriter)>,
    },
    Avro(Box<AvroRows>),
    Protobuf(Box<ProtobufRows>),
    /// Debezium envelopes in Avro, made rows at the end.
    Debezium {
        envelopes: Box<AvroRows>,
        decoding: DebeziumDecoding,
    },
    /// Debezium envelopes in JSON, decoded into rows as they come.
    DebeziumJson(Box<DebeziumJsonRows>),
}

impl Values {
    /// Builders for up to `capacity` rows of `decoding`'s columns.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a schema that cannot be decoded.
    pub(crate) fn new(decoding: &Decoding, capacity: usize) -> Result<Self> {
        let raw = |payload| {
            Self::Raw(Box::new(RawColumns {
                topics: StringBuilder::with_capacity(capacity, capacity * 16),
                partitions: Int32Builder::with_capacity(capacity),
                offsets: Int64Builder::with_capacity(capacity),
                payload,
            }))
        };
        Ok(match decoding {
            Decoding::Text => raw(Payload::Text {
                keys: StringBuilder::with_capacity(capacity, capacity * 16),
                values: StringBuilder::with_capacity(capacity, capacity * 128),
            }),
            Decoding::Binary => raw(Payload::Binary {
                keys: BinaryBuilder::with_capacity(capacity, capacity * 16),
                values: BinaryBuilder::with_capacity(capacity, capacity * 128),
            }),
            Decoding::Json(json) => Self::Json {
                rows: Box::new(JsonRows::new(
                    json.schema().fields(),
                    json.unknown_fields(),
                    capacity,
                )),
                schema: json.schema(),
                registry: None,
            },
            Decoding::JsonSchema(json) => {
                let columns = json.columns();
                Self::Json {
                    rows: Box::new(JsonRows::new(
                        columns.decoding.schema().fields(),
                        columns.decoding.unknown_fields(),
                        capacity,
                    )),
                    schema: columns.decoding.schema(),
                    registry: Some((json.clone(), columns.number, None)),
                }
            }
            Decoding::Avro(avro) => Self::Avro(Box::new(AvroRows::new(avro, capacity)?)),
            Decoding::Protobuf(protobuf) => {
                Self::Protobuf(Box::new(ProtobufRows::new(protobuf, capacity)))
            }
            Decoding::Debezium(debezium) => match debezium.envelope() {
                Envelope::Avro(avro) => Self::Debezium {
                    envelopes: Box::new(AvroRows::new(avro, capacity)?),
                    decoding: debezium.clone(),
                },
                Envelope::Json { .. } => {
                    Self::DebeziumJson(Box::new(DebeziumJsonRows::new(debezium, capacity)))
                }
            },
        })
    }

    /// Appends one record's `value` (for a key builder: the key, as `value`); `role` names it in errors.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record. The raw decodings then appended nothing of it; a
    /// JSON or Avro decoder is unusable afterwards.
    pub(crate) fn append(
        &mut self,
        at: RecordAt<'_>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        role: &str,
    ) -> Result<()> {
        match self {
            Self::Raw(raw) => {
                let RawColumns {
                    topics,
                    partitions,
                    offsets,
                    payload,
                } = raw.as_mut();
                match payload {
                    Payload::Text { keys, values } => {
                        // Both checked before either is appended: a bad record leaves the columns as they were.
                        let (key, value) = (text(at, key, "key")?, text(at, value, "value")?);
                        keys.append_option(key);
                        values.append_option(value);
                    }
                    Payload::Binary { keys, values } => {
                        keys.append_option(key);
                        values.append_option(value);
                    }
                }
                topics.append_value(at.topic);
                partitions.append_value(at.partition);
                offsets.append_value(at.offset);
            }
            Self::Json { rows, registry, .. } => {
                let value = value.ok_or_else(|| bad_record(at, "has no value (a tombstone)"))?;
                let (value, bounds) = match registry {
                    Some((json, generation, last)) => {
                        let document = json.document(at, value, *generation, last)?;
                        (document.body, document.bounds.map(|b| (document.id, b)))
                    }
                    None => (value, None),
                };
                rows.append(value, &mut RowContext::default())
                    .map_err(|why| {
                        bad_record(
                            at,
                            &format!(
                                "has a {role} that does not fit {}: {why}",
                                if registry.is_some() {
                                    "its JSON Schema's columns"
                                } else {
                                    "the declared JSON fields"
                                }
                            ),
                        )
                    })?;
                // Bounds the validator was spared: checked on the values just read (a violation leaves the
                // builders with the row, and the reader then sorts the batch out record by record).
                for (id, column) in bounds
                    .iter()
                    .flat_map(|(id, b)| b.iter().map(move |c| (id, c)))
                {
                    if let Some(why) = column.violation(rows.last(column.index)) {
                        return Err(bad_record(
                            at,
                            &format!("violates JSON Schema id {id}: at `/{}`: {why}", column.name),
                        ));
                    }
                }
            }
            Self::Avro(rows) => {
                let value = value.ok_or_else(|| bad_record(at, "has no value (a tombstone)"))?;
                rows.append(at, value, role)?;
            }
            Self::Protobuf(rows) => {
                let value = value.ok_or_else(|| bad_record(at, "has no value (a tombstone)"))?;
                rows.append(at, value, role)?;
            }
            Self::Debezium { envelopes, .. } => {
                let value = value.ok_or_else(|| bad_record(at, "has no value (a tombstone)"))?;
                envelopes.append(at, value, role)?;
            }
            Self::DebeziumJson(rows) => {
                let value = value.ok_or_else(|| bad_record(at, "has no value (a tombstone)"))?;
                rows.append(at, value)?;
            }
        }
        Ok(())
    }

    /// The schema of the columns these builders make.
    pub(crate) fn schema(&self) -> SchemaRef {
        match self {
            Self::Raw(raw) => match raw.payload {
                Payload::Text { .. } => raw_schema(arrow_schema::DataType::Utf8),
                Payload::Binary { .. } => raw_schema(arrow_schema::DataType::Binary),
            },
            Self::Json { schema, .. } => schema.clone(),
            Self::Avro(rows) => rows.schema(),
            Self::Protobuf(rows) => rows.schema(),
            Self::Debezium {
                envelopes,
                decoding,
            } => decoding.columns_of(&envelopes.schema()).1,
            Self::DebeziumJson(rows) => rows.schema(),
        }
    }

    /// Whether these rows read with an older reader schema than the decoding's current one.
    pub(crate) fn outdated(&self) -> bool {
        match self {
            Self::Avro(rows) => rows.outdated(),
            Self::Protobuf(rows) => rows.outdated(),
            Self::Debezium { envelopes, .. } => envelopes.outdated(),
            Self::Json {
                registry: Some((json, generation, _)),
                ..
            } => json.generation() != *generation,
            Self::Raw(_) | Self::Json { .. } | Self::DebeziumJson(_) => false,
        }
    }

    /// The batch of every row appended.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) when a batch of JSON or Avro records does not fit the declared schema.
    pub(crate) fn finish(self) -> Result<RecordBatch> {
        match self {
            Self::Raw(raw) => {
                let RawColumns {
                    mut topics,
                    mut partitions,
                    mut offsets,
                    payload,
                } = *raw;
                let (keys, values): (ArrayRef, ArrayRef) = match payload {
                    Payload::Text {
                        mut keys,
                        mut values,
                    } => (Arc::new(keys.finish()), Arc::new(values.finish())),
                    Payload::Binary {
                        mut keys,
                        mut values,
                    } => (Arc::new(keys.finish()), Arc::new(values.finish())),
                };
                let schema = raw_schema(keys.data_type().clone());
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(topics.finish()),
                    Arc::new(partitions.finish()),
                    Arc::new(offsets.finish()),
                    keys,
                    values,
                ];
                RecordBatch::try_new(schema, columns).map_err(|e| {
                    Error::new(
                        ErrorKind::Bug,
                        Phase::Write,
                        "the batch does not match its schema",
                    )
                    .with_source(e)
                })
            }
            Self::Json { rows, schema, .. } => {
                let count = rows.len();
                let columns = rows.finish().map_err(|why| {
                    Error::new(
                        ErrorKind::BadRecord,
                        Phase::Write,
                        format!("a batch of JSON records does not fit the declared fields: {why}"),
                    )
                })?;
                RecordBatch::try_new_with_options(
                    schema,
                    columns,
                    &arrow_array::RecordBatchOptions::new().with_row_count(Some(count)),
                )
                .map_err(|e| {
                    Error::bug(Phase::Write, "the JSON columns do not match their schema")
                        .with_source(e)
                })
            }
            Self::Avro(rows) => rows.finish(),
            Self::Protobuf(rows) => rows.finish(),
            Self::Debezium {
                envelopes,
                decoding,
            } => decoding.rows(&envelopes.finish()?),
            Self::DebeziumJson(rows) => rows.finish(),
        }
    }
}
