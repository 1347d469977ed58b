//! Records that do not decode: named precisely, and set aside instead of failing the batch when the job has a
//! dead-letter destination ([`KafkaSourceOptions::divert_bad_records`](crate::KafkaSourceOptions)).
//!
//! The raw decodings check a record before appending anything of it, so a bad one is simply left out. The JSON
//! decoding (arrow-json) only finds some problems when the whole batch is converted (a string where the schema has
//! an integer), and its decoder is unusable after an error; so the reader keeps the raw bytes of the batch's JSON
//! records (one copy, far cheaper than parsing them), and when the batch fails, decodes them one by one to tell the
//! good from the bad: the good ones become the batch, the bad ones are named.

use std::ops::Range;

use arrow_array::RecordBatch;
use connector_api::{Report, Result};

use crate::decode::{BatchBuilder, Decoding, RecordAt, bad_record};

/// A record the source could not decode, with everything a dead-letter record needs (not its headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedRecord {
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key bytes.
    pub key: Option<Vec<u8>>,
    /// Its value bytes.
    pub value: Option<Vec<u8>>,
    /// Why it was refused.
    pub reason: String,
}

impl RejectedRecord {
    /// The record at `at` with `key` and `value`, refused with `error`.
    pub(crate) fn new(
        at: RecordAt<'_>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        error: &connector_api::Error,
    ) -> Self {
        Self {
            topic: at.topic.to_string(),
            partition: at.partition,
            offset: at.offset,
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            reason: Report(error).to_string(),
        }
    }
}

struct RawRecord {
    partition: i32,
    offset: i64,
    key: Option<Range<usize>>,
    value: Option<Range<usize>>,
}

/// The raw key and value bytes of one batch's records, in order.
#[derive(Default)]
pub(crate) struct RawRecords {
    bytes: Vec<u8>,
    records: Vec<RawRecord>,
}

impl RawRecords {
    /// Keeps a copy of one record.
    pub(crate) fn push(&mut self, at: RecordAt<'_>, key: Option<&[u8]>, value: Option<&[u8]>) {
        let mut keep = |bytes: Option<&[u8]>| {
            bytes.map(|b| {
                let start = self.bytes.len();
                self.bytes.extend_from_slice(b);
                start..self.bytes.len()
            })
        };
        let (key, value) = (keep(key), keep(value));
        self.records.push(RawRecord {
            partition: at.partition,
            offset: at.offset,
            key,
            value,
        });
    }

    fn slice(&self, range: &Option<Range<usize>>) -> Option<&[u8]> {
        range.as_ref().map(|r| &self.bytes[r.clone()])
    }

    /// Decodes the records one by one: the batch of those that decode, and the others.
    ///
    /// # Errors
    /// With `divert` off, the first record that does not decode ([`BadRecord`](connector_api::ErrorKind::BadRecord)
    /// naming it). Otherwise only a batch of good records that still fails (a bug).
    pub(crate) fn sort(
        &self,
        topic: &str,
        decoding: &Decoding,
        divert: bool,
    ) -> Result<(RecordBatch, Vec<RejectedRecord>)> {
        let mut good = Vec::new();
        let mut rejected = Vec::new();
        for (i, record) in self.records.iter().enumerate() {
            let at = RecordAt {
                topic,
                partition: record.partition,
                offset: record.offset,
            };
            let (key, value) = (self.slice(&record.key), self.slice(&record.value));
            let mut alone = BatchBuilder::new(decoding, 1, false)?;
            let outcome = match alone.append(at, key, value, None) {
                Err(e) => Err(e),
                Ok(()) => alone.finish().map(|_| ()).map_err(|e| {
                    bad_record(at, "has a value that does not fit the declared schema")
                        .with_source(e)
                }),
            };
            match outcome {
                Ok(()) => good.push(i),
                Err(e) if !divert => return Err(e),
                Err(e) => rejected.push(RejectedRecord::new(at, key, value, &e)),
            }
        }
        let mut builder = BatchBuilder::new(decoding, good.len().max(1), false)?;
        for i in good {
            let record = &self.records[i];
            let at = RecordAt {
                topic,
                partition: record.partition,
                offset: record.offset,
            };
            builder.append(at, self.slice(&record.key), self.slice(&record.value), None)?;
        }
        Ok((builder.finish()?, rejected))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_schema::{DataType, Field, Schema};
    use connector_api::ErrorKind;

    use super::*;

    fn records(values: &[&str]) -> RawRecords {
        let mut raw = RawRecords::default();
        for (offset, value) in values.iter().enumerate() {
            let at = RecordAt {
                topic: "orders",
                partition: 2,
                offset: offset as i64,
            };
            raw.push(at, Some(b"k"), Some(value.as_bytes()));
        }
        raw
    }

    fn decoding() -> Decoding {
        Decoding::Json(Arc::new(Schema::new(vec![Field::new(
            "id",
            DataType::Int64,
            false,
        )])))
    }

    #[test]
    fn a_failed_json_batch_is_sorted_into_good_rows_and_named_rejects() {
        let raw = records(&[r#"{"id":1}"#, "not json", r#"{"id":"abc"}"#, r#"{"id":4}"#]);
        let (batch, rejected) = raw.sort("orders", &decoding(), true).unwrap();
        let ids: Vec<i64> = batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(ids, [1, 4]);
        let offsets: Vec<i64> = rejected.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [1, 2]);
        assert_eq!(rejected[0].value.as_deref(), Some(&b"not json"[..]));
        assert_eq!(rejected[0].key.as_deref(), Some(&b"k"[..]));
        assert!(
            rejected[1].reason.contains("orders/2@2"),
            "{}",
            rejected[1].reason
        );
        assert!(
            rejected[1].reason.contains("declared schema"),
            "{}",
            rejected[1].reason
        );
    }

    #[test]
    fn a_failed_avro_batch_is_sorted_too() {
        use std::collections::HashMap;

        use arrow_array::Int64Array;
        use arrow_avro::schema::{FingerprintStrategy, SCHEMA_METADATA_KEY};
        use arrow_avro::writer::WriterBuilder;
        use arrow_avro::writer::format::AvroSoeFormat;

        use crate::{AvroDecoding, AvroFraming};

        let avro = r#"{"type":"record","name":"R","fields":[{"name":"id","type":"long"}]}"#;
        let encode = |id: i64| {
            let metadata = HashMap::from([(SCHEMA_METADATA_KEY.to_string(), avro.to_string())]);
            let schema =
                Schema::new_with_metadata(vec![Field::new("id", DataType::Int64, false)], metadata);
            let batch = RecordBatch::try_new(
                Arc::new(schema.clone()),
                vec![Arc::new(Int64Array::from(vec![id]))],
            )
            .unwrap();
            let mut writer = WriterBuilder::new(schema)
                .with_fingerprint_strategy(FingerprintStrategy::Id(9))
                .build::<_, AvroSoeFormat>(Vec::new())
                .unwrap();
            writer.write(&batch).unwrap();
            writer.finish().unwrap();
            writer.into_inner()
        };
        let decoding = Decoding::Avro(
            AvroDecoding::new(avro, AvroFraming::Confluent { schema_id: 9 }).unwrap(),
        );
        let mut raw = RawRecords::default();
        let at = |offset| RecordAt {
            topic: "orders",
            partition: 0,
            offset,
        };
        let unknown_id = [0u8, 0, 0, 0, 8, 2];
        let bare_prefix = [0u8, 0, 0, 0, 9];
        for (offset, value) in [
            (0, encode(1)),
            (1, b"not avro".to_vec()),
            (2, unknown_id.to_vec()),
            (3, bare_prefix.to_vec()),
            (4, Vec::new()),
            (5, encode(6)),
        ] {
            raw.push(at(offset), None, Some(&value));
        }
        let (batch, rejected) = raw.sort("orders", &decoding, true).unwrap();
        let ids: Vec<i64> = batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(ids, [1, 6]);
        let offsets: Vec<i64> = rejected.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [1, 2, 3, 4]);
    }

    #[test]
    fn without_diverting_the_first_bad_record_is_named() {
        let raw = records(&[r#"{"id":1}"#, r#"{"id":"abc"}"#, "not json"]);
        let err = raw.sort("orders", &decoding(), false).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRecord);
        assert!(err.to_string().contains("orders/2@1"), "{err}");
    }
}
