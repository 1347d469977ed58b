//! Records that do not decode: named precisely, and set aside (with their key, value and headers) instead of
//! failing the batch when the job has a dead-letter destination
//! ([`KafkaSourceOptions::divert_bad_records`](crate::KafkaSourceOptions)).
//!
//! The raw decodings check a record before appending anything of it, so a bad one is simply left out. The JSON
//! decoding (arrow-json) only finds some problems when the whole batch is converted (a string where the schema has
//! an integer), and its decoder is unusable after an error (Avro alike, and a JSON or Avro key); so the reader keeps
//! the raw bytes of such a batch's records (one copy, far cheaper than parsing them), and when the batch fails,
//! decodes them one by one to tell the good from the bad: the good ones become the batch, the bad ones are named.

use std::ops::Range;

use arrow_array::RecordBatch;
use connector_api::{ErrorKind, Report, Result};
use rdkafka::message::{Header, Headers, OwnedHeaders};

use crate::decode::BatchBuilder;
use crate::decoding::Decoding;
use crate::metadata::MetadataColumns;
use crate::record::{RecordAt, RecordParts, bad_record};

/// A record the source could not decode, with everything a dead-letter record needs.
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
    /// Its headers, in order (a header without a value has `None`).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Why it was refused.
    pub reason: String,
}

impl RejectedRecord {
    /// `record`, refused with `error`.
    pub(crate) fn new<H: Headers>(
        record: &RecordParts<'_, H>,
        error: &connector_api::Error,
    ) -> Self {
        Self {
            topic: record.at.topic.to_string(),
            partition: record.at.partition,
            offset: record.at.offset,
            key: record.key.map(<[u8]>::to_vec),
            value: record.value.map(<[u8]>::to_vec),
            headers: record
                .headers
                .into_iter()
                .flat_map(|h| h.iter())
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect(),
            reason: Report(error).to_string(),
        }
    }
}

struct RawRecord {
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    key: Option<Range<usize>>,
    value: Option<Range<usize>>,
    headers: Option<OwnedHeaders>,
}

/// The raw key, value and headers of one batch's records, in order.
#[derive(Default)]
pub(crate) struct RawRecords {
    bytes: Vec<u8>,
    records: Vec<RawRecord>,
    /// Copy each record's headers (a headers column or dead letters read them; otherwise nothing does).
    keep_headers: bool,
}

impl RawRecords {
    /// An empty set; records' headers are copied only when `keep_headers`.
    pub(crate) fn new(keep_headers: bool) -> Self {
        Self {
            keep_headers,
            ..Self::default()
        }
    }

    /// Keeps a copy of one record.
    pub(crate) fn push<H: Headers>(&mut self, record: &RecordParts<'_, H>) {
        let mut keep = |bytes: Option<&[u8]>| {
            bytes.map(|b| {
                let start = self.bytes.len();
                self.bytes.extend_from_slice(b);
                start..self.bytes.len()
            })
        };
        let (key, value) = (keep(record.key), keep(record.value));
        let headers = record.headers.filter(|_| self.keep_headers).map(|headers| {
            headers.iter().fold(
                OwnedHeaders::new_with_capacity(headers.count()),
                |owned, h| {
                    owned.insert(Header {
                        key: h.key,
                        value: h.value,
                    })
                },
            )
        });
        self.records.push(RawRecord {
            partition: record.at.partition,
            offset: record.at.offset,
            timestamp: record.timestamp,
            key,
            value,
            headers,
        });
    }

    fn slice(&self, range: &Option<Range<usize>>) -> Option<&[u8]> {
        range.as_ref().map(|r| &self.bytes[r.clone()])
    }

    /// Record `i` as the builders take it.
    pub(crate) fn parts<'a>(&'a self, topic: &'a str, i: usize) -> RecordParts<'a, OwnedHeaders> {
        let record = &self.records[i];
        RecordParts {
            at: RecordAt {
                topic,
                partition: record.partition,
                offset: record.offset,
            },
            timestamp: record.timestamp,
            key: self.slice(&record.key),
            value: self.slice(&record.value),
            headers: record.headers.as_ref(),
        }
    }

    /// Decodes the records one by one (value, and key when it is JSON or Avro): the batch of those that decode,
    /// with `metadata`'s columns, and the others.
    ///
    /// # Errors
    /// With `divert` off, the first record that does not decode ([`BadRecord`](connector_api::ErrorKind::BadRecord)
    /// naming it). Otherwise only a batch of good records that still fails (a bug). Either way an error that is
    /// not the record's fault (a schema registry that cannot be reached) as it is.
    pub(crate) fn sort(
        &self,
        topic: &str,
        decoding: &Decoding,
        metadata: &MetadataColumns,
        divert: bool,
    ) -> Result<(RecordBatch, Vec<RejectedRecord>)> {
        let mut good = Vec::new();
        let mut rejected = Vec::new();
        for i in 0..self.records.len() {
            let record = self.parts(topic, i);
            let mut alone = BatchBuilder::new(decoding, metadata, 1)?;
            let outcome = match alone.append(&record) {
                Err(e) => Err(e),
                Ok(()) => alone.finish().map(|_| ()).map_err(|e| {
                    bad_record(record.at, "does not fit the declared schema").with_source(e)
                }),
            };
            match outcome {
                Ok(()) => good.push(i),
                Err(e) if !divert || e.kind() != ErrorKind::BadRecord => return Err(e),
                Err(e) => rejected.push(RejectedRecord::new(&record, &e)),
            }
        }
        let mut builder = BatchBuilder::new(decoding, metadata, good.len().max(1))?;
        for i in good {
            builder.append(&self.parts(topic, i))?;
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

    use super::*;

    fn records(values: &[&str]) -> RawRecords {
        let mut raw = RawRecords::default();
        for (offset, value) in values.iter().enumerate() {
            let at = RecordAt {
                topic: "orders",
                partition: 2,
                offset: offset as i64,
            };
            raw.push(&RecordParts::<OwnedHeaders> {
                at,
                timestamp: None,
                key: Some(b"k"),
                value: Some(value.as_bytes()),
                headers: None,
            });
        }
        raw
    }

    fn decoding() -> Decoding {
        Decoding::Json(Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])).into())
    }

    #[test]
    fn a_failed_json_batch_is_sorted_into_good_rows_and_named_rejects() {
        let raw = records(&[r#"{"id":1}"#, "not json", r#"{"id":"abc"}"#, r#"{"id":4}"#]);
        let (batch, rejected) = raw
            .sort("orders", &decoding(), &MetadataColumns::none(), true)
            .unwrap();
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
            rejected[1].reason.contains("field `id` = \"abc\""),
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
            raw.push(&RecordParts::<OwnedHeaders> {
                at: at(offset),
                timestamp: None,
                key: None,
                value: Some(&value),
                headers: None,
            });
        }
        let (batch, rejected) = raw
            .sort("orders", &decoding, &MetadataColumns::none(), true)
            .unwrap();
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
        let err = raw
            .sort("orders", &decoding(), &MetadataColumns::none(), false)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRecord);
        assert!(err.to_string().contains("orders/2@1"), "{err}");
    }
}
