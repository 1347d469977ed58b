//! Decoding Kafka records into Arrow columns, in bulk: one builder per column, appended to record by record on the
//! consumer thread, finished once per batch.

use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, Int32Builder, Int64Builder, MapBuilder, StringBuilder};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_json::reader::{Decoder, ReaderBuilder};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::{Error, ErrorKind, Phase, Result};

use crate::avro::AvroDecoding;
use rdkafka::message::{BorrowedHeaders, Headers};

/// How record values become rows.
#[derive(Debug, Clone)]
pub enum Decoding {
    /// One row per record: `topic`, `partition`, `offset`, `key` and `value` as UTF-8 strings ([`text_schema`]).
    /// A key or value that is not UTF-8 is a [`BadRecord`](ErrorKind::BadRecord).
    Text,
    /// As [`Text`](Self::Text), key and value as raw bytes ([`binary_schema`]): nothing is refused.
    Binary,
    /// Each value is one JSON object, decoded into `schema` (arrow-json); fields not in the schema are ignored,
    /// a value that does not fit is a [`BadRecord`](ErrorKind::BadRecord) naming the record.
    Json(SchemaRef),
    /// Each value is one Avro record of the declared schema in Confluent or single-object framing (arrow-avro); a
    /// value that does not decode is a [`BadRecord`](ErrorKind::BadRecord) naming the record.
    Avro(AvroDecoding),
}

impl Decoding {
    /// The schema of the batches this decoding produces (without a `headers` column).
    pub fn schema(&self) -> SchemaRef {
        match self {
            Self::Text => text_schema(),
            Self::Binary => binary_schema(),
            Self::Json(schema) => schema.clone(),
            Self::Avro(avro) => avro.schema(),
        }
    }

    /// Whether a bad record may only show when the batch is finished, leaving the decoder unusable: the reader then
    /// sorts the batch out record by record ([`crate::reject`]).
    pub(crate) fn defers_failures(&self) -> bool {
        matches!(self, Self::Json(_) | Self::Avro(_))
    }

    /// The schema with the [`headers_field`] appended when `headers` is set (raw decodings only).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when headers are asked of the JSON decoding, whose schema is declared.
    pub fn schema_with_headers(&self, headers: bool) -> Result<SchemaRef> {
        if !headers {
            return Ok(self.schema());
        }
        if self.defers_failures() {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "the Kafka source's `headers` column exists for the text and binary decodings; JSON and Avro \
                 values are decoded into their declared schema only",
            ));
        }
        let mut fields: Vec<Field> = self
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(headers_field());
        Ok(Arc::new(Schema::new(fields)))
    }
}

fn headers_builder() -> MapBuilder<StringBuilder, BinaryBuilder> {
    MapBuilder::new(None, StringBuilder::new(), BinaryBuilder::new())
}

/// The `headers` column of the raw decodings when asked for: each record's headers, name -> value bytes (in
/// order; a header without a value has a null value).
pub fn headers_field() -> Field {
    Field::new(
        "headers",
        headers_builder().finish().data_type().clone(),
        false,
    )
}

fn raw_schema(payload: DataType) -> SchemaRef {
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

/// Where a record came from, for error messages.
#[derive(Clone, Copy)]
pub(crate) struct RecordAt<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

/// A [`BadRecord`](ErrorKind::BadRecord) naming the record at `at` and what is wrong with it.
pub(crate) fn bad_record(at: RecordAt<'_>, what: &str) -> Error {
    Error::new(
        ErrorKind::BadRecord,
        Phase::Write,
        format!("record {}/{}@{} {what}", at.topic, at.partition, at.offset),
    )
}

/// `bytes` as UTF-8, or a [`BadRecord`](ErrorKind::BadRecord) naming the record and `what`.
fn text<'b>(at: RecordAt<'_>, bytes: Option<&'b [u8]>, what: &str) -> Result<Option<&'b str>> {
    bytes
        .map(std::str::from_utf8)
        .transpose()
        .map_err(|e| bad_record(at, &format!("has a {what} that is not UTF-8")).with_source(e))
}

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
    headers: Option<MapBuilder<StringBuilder, BinaryBuilder>>,
    schema: SchemaRef,
}

/// The columns of one batch under construction.
pub(crate) enum BatchBuilder {
    Raw(Box<RawColumns>),
    Json {
        decoder: Decoder,
        rows: usize,
        schema: SchemaRef,
    },
    Avro {
        decoder: arrow_avro::reader::Decoder,
        schema: SchemaRef,
    },
}

impl BatchBuilder {
    /// Builders for up to `capacity` rows (they grow beyond it if needed), with a `headers` column if `headers`.
    pub(crate) fn new(decoding: &Decoding, capacity: usize, headers: bool) -> Result<Self> {
        let schema = decoding.schema_with_headers(headers)?;
        let raw = |payload| {
            Self::Raw(Box::new(RawColumns {
                topics: StringBuilder::with_capacity(capacity, capacity * 16),
                partitions: Int32Builder::with_capacity(capacity),
                offsets: Int64Builder::with_capacity(capacity),
                payload,
                headers: headers.then(headers_builder),
                schema: schema.clone(),
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
            Decoding::Avro(avro) => Self::Avro {
                decoder: avro.decoder(capacity).map_err(|e| {
                    Error::new(
                        ErrorKind::Config,
                        Phase::Setup,
                        "the Avro schema of the Kafka source is not decodable",
                    )
                    .with_source(e)
                })?,
                schema: avro.schema(),
            },
        })
    }

    /// Appends one record.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record when its key or value cannot be decoded. The raw
    /// decodings then appended nothing of it (the builder goes on); the JSON decoder is unusable afterwards (the
    /// reader sorts the batch out record by record, [`crate::reject`]).
    pub(crate) fn append(
        &mut self,
        at: RecordAt<'_>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: Option<&BorrowedHeaders>,
    ) -> Result<()> {
        match self {
            Self::Raw(raw) => {
                let RawColumns {
                    topics,
                    partitions,
                    offsets,
                    payload,
                    headers: header_columns,
                    ..
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
                if let Some(columns) = header_columns {
                    for header in headers.into_iter().flat_map(|h| h.iter()) {
                        columns.keys().append_value(header.key);
                        columns.values().append_option(header.value);
                    }
                    columns.append(true).map_err(|e| {
                        Error::new(ErrorKind::Bug, Phase::Write, "cannot append headers")
                            .with_source(e)
                    })?;
                }
                topics.append_value(at.topic);
                partitions.append_value(at.partition);
                offsets.append_value(at.offset);
            }
            Self::Json { decoder, rows, .. } => {
                let value = value.ok_or_else(|| bad_record(at, "has no value (a tombstone)"))?;
                let read = decoder.decode(value).map_err(|e| {
                    bad_record(at, "has a value that does not fit the JSON schema").with_source(e)
                })?;
                // A value holding less (or more) than one whole JSON object would run into the next record.
                if read != value.len() || decoder.has_partial_record() || decoder.len() != *rows + 1
                {
                    return Err(bad_record(
                        at,
                        "has a value that is not exactly one JSON object",
                    ));
                }
                *rows += 1;
            }
            Self::Avro { decoder, .. } => {
                let value = value.ok_or_else(|| bad_record(at, "has no value (a tombstone)"))?;
                let room = decoder.capacity();
                let read = decoder.decode(value).map_err(|e| {
                    bad_record(
                        at,
                        "has a value that is not an Avro record of the declared schema",
                    )
                    .with_source(e)
                })?;
                // Exactly one row from exactly this value: an empty value or a bare framing prefix adds no row
                // (and a prefix would take the next record's bytes as its body).
                if read != value.len() || decoder.capacity() + 1 != room {
                    return Err(bad_record(
                        at,
                        "has a value that is not exactly one framed Avro record of the declared schema",
                    ));
                }
            }
        }
        Ok(())
    }

    /// The batch of every row appended.
    pub(crate) fn finish(self) -> Result<RecordBatch> {
        let bug = |e: arrow_schema::ArrowError| {
            Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "the batch does not match its schema",
            )
            .with_source(e)
        };
        match self {
            Self::Raw(raw) => {
                let RawColumns {
                    mut topics,
                    mut partitions,
                    mut offsets,
                    payload,
                    headers,
                    schema,
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
                let mut columns: Vec<ArrayRef> = vec![
                    Arc::new(topics.finish()),
                    Arc::new(partitions.finish()),
                    Arc::new(offsets.finish()),
                    keys,
                    values,
                ];
                if let Some(mut headers) = headers {
                    columns.push(Arc::new(headers.finish()));
                }
                RecordBatch::try_new(schema, columns).map_err(bug)
            }
            Self::Json {
                mut decoder,
                schema,
                ..
            } => flushed(decoder.flush(), "JSON", schema),
            Self::Avro {
                mut decoder,
                schema,
            } => flushed(decoder.flush(), "Avro", schema),
        }
    }
}

/// A flushed batch of a declared-schema decoding (an empty one when nothing was appended); a failure is a
/// [`BadRecord`](ErrorKind::BadRecord) of the batch, which the reader then sorts out record by record.
fn flushed<E: std::error::Error + Send + Sync + 'static>(
    batch: std::result::Result<Option<RecordBatch>, E>,
    format: &str,
    schema: SchemaRef,
) -> Result<RecordBatch> {
    let batch = batch.map_err(|e| {
        Error::new(
            ErrorKind::BadRecord,
            Phase::Write,
            format!("a batch of {format} records does not fit the declared schema"),
        )
        .with_source(e)
    })?;
    Ok(batch.unwrap_or_else(|| RecordBatch::new_empty(schema)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json() -> BatchBuilder {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        BatchBuilder::new(&Decoding::Json(schema), 8, false).unwrap()
    }

    fn at(offset: i64) -> RecordAt<'static> {
        RecordAt {
            topic: "t",
            partition: 0,
            offset,
        }
    }

    #[test]
    fn a_json_value_must_be_exactly_one_object() {
        let mut builder = json();
        builder
            .append(at(0), None, Some(br#"{"a":1}"#), None)
            .unwrap();
        builder
            .append(at(1), None, Some(br#" {"a":2} "#), None)
            .unwrap();
        for (offset, value) in [(2, &br#"{"a":3}{"a":4}"#[..]), (3, br#"{"a":"#)] {
            let mut builder = json();
            let err = builder
                .append(at(offset), None, Some(value), None)
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
            assert!(err.to_string().contains(&format!("t/0@{offset}")), "{err}");
        }
        let batch = builder.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
    }

    #[test]
    fn a_tombstone_has_no_json_row() {
        let err = json().append(at(7), Some(b"k"), None, None).unwrap_err();
        assert!(err.to_string().contains("tombstone"), "{err}");
    }
}
