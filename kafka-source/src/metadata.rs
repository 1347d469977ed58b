//! Kafka record metadata as columns: the topic, partition, offset, timestamp, key and headers of each record,
//! added after the decoding's own columns under the names the job gives them, in every decoding.
//!
//! | metadata | column type | null when |
//! |---|---|---|
//! | `topic` | `Utf8` | never |
//! | `partition` | `Int32` | never |
//! | `offset` | `Int64` | never |
//! | `timestamp` | `Timestamp(Microsecond, "UTC")` (Kafka's millisecond create or log-append time) | the record has none |
//! | `key` (text) | `Utf8` (a key that is not UTF-8 is a bad record) | the record has no key |
//! | `key` (binary) | `Binary` | the record has no key |
//! | `key` (JSON or Avro) | one column per field of the key's schema, named `<key>_<field>`, nullable | the record has no key |
//! | `headers` | `Map<Utf8, Binary>`, in record order (a header without a value has a null value) | never (empty) |
//!
//! The columns come in that order, after the decoding's columns. A name that is also a column of the decoding
//! is refused at start.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Int32Builder, Int64Builder, MapBuilder, StringBuilder,
    TimestampMicrosecondBuilder, UInt32Builder,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::message::Headers;

use crate::decoding::Decoding;
use crate::record::{RecordAt, RecordParts, text};
use crate::values::Values;

/// How a record's key becomes the `key` metadata column(s).
#[derive(Debug, Clone)]
pub enum KeyDecoding {
    /// UTF-8 text (a key that is not UTF-8 is a [`BadRecord`](ErrorKind::BadRecord)).
    Text,
    /// The bytes as they are.
    Binary,
    /// A JSON object or an Avro record ([`Decoding::Json`] or [`Decoding::Avro`]): one column per field.
    Declared(Decoding),
}

/// Which metadata columns the source adds, each under the name given (`None`: not added). See the module docs
/// for their types.
#[derive(Debug, Clone, Default)]
pub struct MetadataColumns {
    /// The record's topic.
    pub topic: Option<String>,
    /// Its partition.
    pub partition: Option<String>,
    /// Its offset.
    pub offset: Option<String>,
    /// Its timestamp (create time, or log-append time when the topic says so).
    pub timestamp: Option<String>,
    /// Its key: the column name (text, binary) or the prefix of the key's field columns (JSON, Avro), and how
    /// the key is decoded.
    pub key: Option<(String, KeyDecoding)>,
    /// Its headers.
    pub headers: Option<String>,
}

impl MetadataColumns {
    /// No metadata columns.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether a bad key may only show when the batch is finished (a JSON or Avro key).
    pub(crate) fn defers_failures(&self) -> bool {
        matches!(self.key, Some((_, KeyDecoding::Declared(_))))
    }

    /// The metadata fields, in column order.
    fn fields(&self) -> Vec<Field> {
        let mut fields = Vec::new();
        let mut add = |name: &Option<String>, data_type: DataType, nullable: bool| {
            if let Some(name) = name {
                fields.push(Field::new(name, data_type, nullable));
            }
        };
        add(&self.topic, DataType::Utf8, false);
        add(&self.partition, DataType::Int32, false);
        add(&self.offset, DataType::Int64, false);
        add(&self.timestamp, timestamp_type(), true);
        match &self.key {
            Some((name, KeyDecoding::Text)) => fields.push(Field::new(name, DataType::Utf8, true)),
            Some((name, KeyDecoding::Binary)) => {
                fields.push(Field::new(name, DataType::Binary, true));
            }
            Some((prefix, KeyDecoding::Declared(decoding))) => {
                fields.extend(decoding.schema().fields().iter().map(|f| {
                    Field::new(
                        format!("{prefix}_{}", f.name()),
                        f.data_type().clone(),
                        true,
                    )
                }));
            }
            None => {}
        }
        if let Some(name) = &self.headers {
            fields.push(headers_field_named(name));
        }
        fields
    }

    /// `decoding`'s columns followed by the metadata columns.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming a column that would exist twice, or a key decoding that is not JSON
    /// or Avro under [`KeyDecoding::Declared`].
    pub fn schema(&self, decoding: &Decoding) -> Result<SchemaRef> {
        self.schema_after(&decoding.schema())
    }

    /// The schema of batches whose decoded columns are `decoded`, followed by these metadata columns.
    ///
    /// # Errors
    /// As [`schema`](Self::schema).
    pub(crate) fn schema_after(&self, decoded: &Schema) -> Result<SchemaRef> {
        if let Some((_, KeyDecoding::Declared(Decoding::Text | Decoding::Binary))) = &self.key {
            return Err(Error::config(
                "a declared key decoding is JSON or Avro; use KeyDecoding::Text or Binary for raw keys",
            ));
        }
        let mut fields: Vec<Field> = decoded
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        for field in self.fields() {
            if fields.iter().any(|f| f.name() == field.name()) {
                return Err(Error::config(format!(
                    "the metadata column {:?} is also a column of the decoding: give the metadata another name",
                    field.name()
                )));
            }
            fields.push(field);
        }
        Ok(Arc::new(Schema::new(fields)))
    }
}

/// The type of the `timestamp` metadata column.
fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn headers_builder() -> MapBuilder<StringBuilder, BinaryBuilder> {
    MapBuilder::new(None, StringBuilder::new(), BinaryBuilder::new())
}

/// A `headers` column named `name`: each record's headers, name -> value bytes.
fn headers_field_named(name: &str) -> Field {
    Field::new(name, headers_builder().finish().data_type().clone(), false)
}

/// The `headers` column of [`MetadataColumns::headers`] under its usual name, `headers`.
pub fn headers_field() -> Field {
    headers_field_named("headers")
}

/// A key, checked before anything of its record is appended.
#[derive(Debug)]
pub(crate) enum CheckedKey<'a> {
    /// No key column, or no key.
    Nothing,
    /// A text key, valid UTF-8.
    Text(&'a str),
}

/// How the key column(s) are built.
enum KeyColumns {
    Text(StringBuilder),
    Binary(BinaryBuilder),
    /// The keys present, decoded into their own batch; `rows` maps each record to its key's row (null: none).
    Declared {
        keys: Box<Values>,
        present: u32,
        rows: UInt32Builder,
    },
}

/// The metadata columns of one batch under construction.
pub(crate) struct MetadataBuilder {
    topic: Option<StringBuilder>,
    partition: Option<Int32Builder>,
    offset: Option<Int64Builder>,
    timestamp: Option<TimestampMicrosecondBuilder>,
    key: Option<KeyColumns>,
    headers: Option<MapBuilder<StringBuilder, BinaryBuilder>>,
}

impl MetadataBuilder {
    /// Builders for the columns `columns` asks for, sized for `capacity` rows.
    pub(crate) fn new(columns: &MetadataColumns, capacity: usize) -> Result<Self> {
        let key = match &columns.key {
            None => None,
            Some((_, KeyDecoding::Text)) => Some(KeyColumns::Text(StringBuilder::with_capacity(
                capacity,
                capacity * 16,
            ))),
            Some((_, KeyDecoding::Binary)) => Some(KeyColumns::Binary(
                BinaryBuilder::with_capacity(capacity, capacity * 16),
            )),
            Some((_, KeyDecoding::Declared(decoding))) => Some(KeyColumns::Declared {
                keys: Box::new(Values::new(decoding, capacity)?),
                present: 0,
                rows: UInt32Builder::with_capacity(capacity),
            }),
        };
        Ok(Self {
            topic: columns
                .topic
                .as_ref()
                .map(|_| StringBuilder::with_capacity(capacity, capacity * 16)),
            partition: columns
                .partition
                .as_ref()
                .map(|_| Int32Builder::with_capacity(capacity)),
            offset: columns
                .offset
                .as_ref()
                .map(|_| Int64Builder::with_capacity(capacity)),
            timestamp: columns
                .timestamp
                .as_ref()
                .map(|_| TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone("UTC")),
            key,
            headers: columns.headers.as_ref().map(|_| headers_builder()),
        })
    }

    /// Checks what can be checked of `key` without appending anything (a text key must be UTF-8).
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record.
    pub(crate) fn check_key<'k>(
        &self,
        at: RecordAt<'_>,
        key: Option<&'k [u8]>,
    ) -> Result<CheckedKey<'k>> {
        // Only a text key column reads the key as text: a binary or JSON/Avro key column, or none, takes any bytes.
        Ok(match (&self.key, key) {
            (Some(KeyColumns::Text(_)), Some(_)) => match text(at, key, "key")? {
                Some(text) => CheckedKey::Text(text),
                None => CheckedKey::Nothing,
            },
            _ => CheckedKey::Nothing,
        })
    }

    /// Appends the metadata of one record whose key passed [`check_key`](Self::check_key).
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record when its JSON or Avro key does not decode (the
    /// batch is then sorted out record by record, as for values).
    pub(crate) fn append<H: Headers>(
        &mut self,
        record: &RecordParts<'_, H>,
        checked: CheckedKey<'_>,
    ) -> Result<()> {
        let at = record.at;
        if let Some(key) = &mut self.key {
            match key {
                KeyColumns::Text(keys) => match checked {
                    CheckedKey::Text(text) => keys.append_value(text),
                    CheckedKey::Nothing => keys.append_null(),
                },
                KeyColumns::Binary(keys) => keys.append_option(record.key),
                KeyColumns::Declared {
                    keys,
                    present,
                    rows,
                } => match record.key {
                    Some(bytes) => {
                        keys.append(at, None, Some(bytes), "key")?;
                        rows.append_value(*present);
                        *present += 1;
                    }
                    None => rows.append_null(),
                },
            }
        }
        if let Some(topics) = &mut self.topic {
            topics.append_value(at.topic);
        }
        if let Some(partitions) = &mut self.partition {
            partitions.append_value(at.partition);
        }
        if let Some(offsets) = &mut self.offset {
            offsets.append_value(at.offset);
        }
        if let Some(timestamps) = &mut self.timestamp {
            timestamps.append_option(record.timestamp.map(|millis| millis * 1000));
        }
        if let Some(columns) = &mut self.headers {
            for header in record.headers.into_iter().flat_map(|h| h.iter()) {
                columns.keys().append_value(header.key);
                columns.values().append_option(header.value);
            }
            columns.append(true).map_err(|e| {
                Error::new(ErrorKind::Bug, Phase::Write, "cannot append headers").with_source(e)
            })?;
        }
        Ok(())
    }

    /// The metadata columns of every record appended, in schema order.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) when a batch of JSON or Avro keys does not fit their schema.
    pub(crate) fn finish(self) -> Result<Vec<ArrayRef>> {
        let mut columns: Vec<ArrayRef> = Vec::new();
        if let Some(mut b) = self.topic {
            columns.push(Arc::new(b.finish()));
        }
        if let Some(mut b) = self.partition {
            columns.push(Arc::new(b.finish()));
        }
        if let Some(mut b) = self.offset {
            columns.push(Arc::new(b.finish()));
        }
        if let Some(mut b) = self.timestamp {
            columns.push(Arc::new(b.finish()));
        }
        match self.key {
            Some(KeyColumns::Text(mut b)) => columns.push(Arc::new(b.finish())),
            Some(KeyColumns::Binary(mut b)) => columns.push(Arc::new(b.finish())),
            Some(KeyColumns::Declared { keys, mut rows, .. }) => {
                let keys = keys.finish()?;
                let rows = rows.finish();
                for column in keys.columns() {
                    let taken =
                        arrow_select::take::take(column.as_ref(), &rows, None).map_err(|e| {
                            Error::new(
                                ErrorKind::Bug,
                                Phase::Write,
                                "cannot place the decoded keys",
                            )
                            .with_source(e)
                        })?;
                    columns.push(taken);
                }
            }
            None => {}
        }
        if let Some(mut b) = self.headers {
            columns.push(Arc::new(b.finish()));
        }
        Ok(columns)
    }
}

/// How many rows `columns` hold (all the same), for checks.
#[cfg(test)]
fn rows(columns: &[ArrayRef]) -> Vec<usize> {
    columns.iter().map(|c| c.len()).collect()
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use rdkafka::message::{Header, OwnedHeaders};

    use super::*;

    fn at(offset: i64) -> RecordAt<'static> {
        RecordAt {
            topic: "orders",
            partition: 2,
            offset,
        }
    }

    fn parts<'a>(
        offset: i64,
        key: Option<&'a [u8]>,
        headers: Option<&'a OwnedHeaders>,
    ) -> RecordParts<'a, OwnedHeaders> {
        RecordParts {
            at: at(offset),
            timestamp: Some(1_700_000_000_123),
            key,
            value: None,
            headers,
        }
    }

    fn json_key() -> KeyDecoding {
        KeyDecoding::Declared(Decoding::Json(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])).into(),
        ))
    }

    fn every(key: KeyDecoding) -> MetadataColumns {
        MetadataColumns {
            topic: Some("t".into()),
            partition: Some("p".into()),
            offset: Some("o".into()),
            timestamp: Some("ts".into()),
            key: Some(("k".into(), key)),
            headers: Some("h".into()),
        }
    }

    #[test]
    fn a_json_key_becomes_its_field_columns_with_nulls_for_records_without_a_key() {
        let columns = every(json_key());
        let schema = columns.schema(&Decoding::Text).unwrap();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "topic",
                "partition",
                "offset",
                "key",
                "value",
                "t",
                "p",
                "o",
                "ts",
                "k_id",
                "h"
            ]
        );
        let mut builder = MetadataBuilder::new(&columns, 4).unwrap();
        let headers = OwnedHeaders::new().insert(Header {
            key: "trace",
            value: Some("abc"),
        });
        for (offset, key) in [
            (7, Some(&br#"{"id": 41}"#[..])),
            (8, None),
            (9, Some(br#"{"id": 43}"#)),
        ] {
            let record = parts(offset, key, Some(&headers));
            let checked = builder.check_key(record.at, record.key).unwrap();
            builder.append(&record, checked).unwrap();
        }
        let out = builder.finish().unwrap();
        assert_eq!(rows(&out), vec![3; 6]);
        let ids = out[4].as_primitive::<Int64Type>();
        assert_eq!(ids.iter().collect::<Vec<_>>(), [Some(41), None, Some(43)]);
        let stamps = out[3].as_primitive::<arrow_array::types::TimestampMicrosecondType>();
        assert_eq!(stamps.value(0), 1_700_000_000_123_000);
        assert_eq!(out[5].as_map().value(0).len(), 1);
    }

    #[test]
    fn a_key_that_is_not_utf8_is_a_bad_record_before_anything_is_appended() {
        let builder = MetadataBuilder::new(&every(KeyDecoding::Text), 1).unwrap();
        let err = builder.check_key(at(5), Some(&[0xff, 0xfe])).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
        assert!(
            err.to_string()
                .contains("orders/2@5 has a key that is not UTF-8"),
            "{err}"
        );
    }

    #[test]
    fn a_key_that_is_not_utf8_is_taken_where_no_text_key_column_reads_it() {
        let not_text: &[u8] = &[0xff, 0xfe];
        for columns in [MetadataColumns::none(), every(KeyDecoding::Binary)] {
            let builder = MetadataBuilder::new(&columns, 1).unwrap();
            assert!(builder.check_key(at(5), Some(not_text)).is_ok());
        }
    }

    #[test]
    fn a_json_key_that_does_not_decode_names_the_record_and_the_key() {
        let mut builder = MetadataBuilder::new(&every(json_key()), 1).unwrap();
        let record = parts(6, Some(b"not json"), None);
        let err = builder.append(&record, CheckedKey::Nothing).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
        assert!(err.to_string().contains("orders/2@6 has a key"), "{err}");
    }

    #[test]
    fn a_metadata_column_named_like_a_decoded_column_is_refused() {
        let columns = MetadataColumns {
            offset: Some("offset".into()),
            ..MetadataColumns::none()
        };
        let err = columns.schema(&Decoding::Binary).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains("\"offset\""), "{err}");
    }
}
