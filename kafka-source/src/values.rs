//! Builders of a decoding's own columns (a value's, or a JSON or Avro key's): raw key and value columns, or a
//! declared schema filled by arrow-json or arrow-avro.

use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, Int32Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_json::reader::{Decoder, ReaderBuilder};
use arrow_schema::SchemaRef;
use connector_api::{Error, ErrorKind, Phase, Result};

use crate::avro_rows::AvroRows;
use crate::debezium::DebeziumDecoding;
use crate::decoding::{Decoding, raw_schema};
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
        decoder: Decoder,
        rows: usize,
        schema: SchemaRef,
    },
    Avro(AvroRows),
    /// Debezium envelopes, made rows at the end.
    Debezium {
        envelopes: Box<Values>,
        decoding: DebeziumDecoding,
    },
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
            Decoding::Json(schema) => Self::Json {
                decoder: ReaderBuilder::new(schema.clone())
                    .with_batch_size(capacity.max(1))
                    .build_decoder()
                    .map_err(|e| {
                        Error::new(
                            ErrorKind::Config,
                            Phase::Setup,
                            "the JSON schema of the Kafka source is not decodable",
                        )
                        .with_source(e)
                    })?,
                rows: 0,
                schema: schema.clone(),
            },
            Decoding::Avro(avro) => Self::Avro(AvroRows::new(avro, capacity)?),
            Decoding::Debezium(debezium) => Self::Debezium {
                envelopes: Box::new(Self::new(&Decoding::from(debezium.envelope()), capacity)?),
                decoding: debezium.clone(),
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
            Self::Json { decoder, rows, .. } => {
                let value = value.ok_or_else(|| bad_record(at, "has no value (a tombstone)"))?;
                let read = decoder.decode(value).map_err(|e| {
                    bad_record(
                        at,
                        &format!("has a {role} that does not fit the JSON schema"),
                    )
                    .with_source(e)
                })?;
                // A value holding less (or more) than one whole JSON object would run into the next record.
                if read != value.len() || decoder.has_partial_record() || decoder.len() != *rows + 1
                {
                    return Err(bad_record(
                        at,
                        &format!("has a {role} that is not exactly one JSON object"),
                    ));
                }
                *rows += 1;
            }
            Self::Avro(rows) => {
                let value = value.ok_or_else(|| bad_record(at, "has no value (a tombstone)"))?;
                rows.append(at, value, role)?;
            }
            Self::Debezium { envelopes, .. } => envelopes.append(at, key, value, role)?,
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
            Self::Debezium { decoding, .. } => decoding.schema(),
        }
    }

    /// Whether these rows read with an older reader schema than the decoding's current one.
    pub(crate) fn outdated(&self) -> bool {
        match self {
            Self::Avro(rows) => rows.outdated(),
            Self::Debezium { envelopes, .. } => envelopes.outdated(),
            Self::Raw(_) | Self::Json { .. } => false,
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
            Self::Json {
                mut decoder,
                schema,
                ..
            } => flushed(decoder.flush(), schema),
            Self::Avro(rows) => rows.finish(),
            Self::Debezium {
                envelopes,
                decoding,
            } => decoding.rows(&envelopes.finish()?),
        }
    }
}

/// A flushed batch of the JSON decoding (an empty one when nothing was appended); a failure is a
/// [`BadRecord`](ErrorKind::BadRecord) of the batch, which the reader then sorts out record by record.
fn flushed(
    batch: std::result::Result<Option<RecordBatch>, arrow_schema::ArrowError>,
    schema: SchemaRef,
) -> Result<RecordBatch> {
    let batch = batch.map_err(|e| {
        Error::new(
            ErrorKind::BadRecord,
            Phase::Write,
            "a batch of JSON records does not fit the declared schema",
        )
        .with_source(e)
    })?;
    Ok(batch.unwrap_or_else(|| RecordBatch::new_empty(schema)))
}
