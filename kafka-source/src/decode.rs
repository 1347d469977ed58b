//! Decoding Kafka records into Arrow columns, in bulk: one builder per column, appended to record by record on the
//! consumer thread, finished once per batch: the decoding's columns ([`crate::values`]), then the metadata columns
//! ([`crate::metadata`]).

use arrow_array::RecordBatch;
use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::message::Headers;

use crate::decoding::Decoding;
use crate::metadata::{MetadataBuilder, MetadataColumns};
use crate::record::RecordParts;
use crate::values::Values;

/// The columns of one batch under construction: the decoding's, then the metadata columns.
pub(crate) struct BatchBuilder {
    values: Values,
    metadata: MetadataBuilder,
    schema: arrow_schema::SchemaRef,
}

impl BatchBuilder {
    /// Builders for up to `capacity` rows (they grow beyond it if needed) of `decoding`'s columns followed by
    /// `metadata`'s.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a schema that cannot be decoded or a metadata column named like a
    /// decoded column.
    pub(crate) fn new(
        decoding: &Decoding,
        metadata: &MetadataColumns,
        capacity: usize,
    ) -> Result<Self> {
        // The schema follows the decoded columns the builders were made for (a registry-backed Avro decoding's
        // reader schema may be widened meanwhile by another subtask of the process).
        let values = Values::new(decoding, capacity)?;
        let schema = metadata.schema_after(&values.schema())?;
        Ok(Self {
            values,
            metadata: MetadataBuilder::new(metadata, capacity)?,
            schema,
        })
    }

    /// Appends one record.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record when its key or value cannot be decoded. The raw
    /// decodings with a text or binary key then appended nothing of it (the builder goes on); a JSON or Avro value
    /// or key leaves the builder unusable (the reader sorts the batch out record by record, [`crate::reject`]).
    pub(crate) fn append<H: Headers>(&mut self, record: &RecordParts<'_, H>) -> Result<()> {
        let checked = self.metadata.check_key(record.at, record.key)?;
        self.values
            .append(record.at, record.key, record.value, "value")?;
        self.metadata.append(record, checked)
    }

    /// Whether the rows appended so far read with an older reader schema than the decoding's current one (a
    /// registry-backed Avro decoding widened it since): a record read now belongs in the next batch.
    pub(crate) fn outdated(&self) -> bool {
        self.values.outdated()
    }

    /// The batch of every row appended.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) when a batch of JSON or Avro values or keys does not fit its schema
    /// (the reader then sorts it out record by record).
    pub(crate) fn finish(self) -> Result<RecordBatch> {
        let values = self.values.finish()?;
        let rows = values.num_rows();
        let mut columns = values.columns().to_vec();
        columns.extend(self.metadata.finish()?);
        RecordBatch::try_new_with_options(
            self.schema,
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(|e| {
            Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "the batch does not match its schema",
            )
            .with_source(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::record::RecordAt;

    fn json() -> BatchBuilder {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        BatchBuilder::new(&Decoding::Json(schema.into()), &MetadataColumns::none(), 8).unwrap()
    }

    fn record<'a>(
        offset: i64,
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
    ) -> RecordParts<'a, rdkafka::message::OwnedHeaders> {
        RecordParts {
            at: at(offset),
            timestamp: None,
            key,
            value,
            headers: None,
        }
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
            .append(&record(0, None, Some(br#"{"a":1}"#)))
            .unwrap();
        builder
            .append(&record(1, None, Some(br#" {"a":2} "#)))
            .unwrap();
        for (offset, value) in [(2, &br#"{"a":3}{"a":4}"#[..]), (3, br#"{"a":"#)] {
            let mut builder = json();
            let err = builder
                .append(&record(offset, None, Some(value)))
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
            assert!(err.to_string().contains(&format!("t/0@{offset}")), "{err}");
        }
        let batch = builder.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
    }

    #[test]
    fn a_tombstone_has_no_json_row() {
        let err = json().append(&record(7, Some(b"k"), None)).unwrap_err();
        assert!(err.to_string().contains("tombstone"), "{err}");
    }
}
