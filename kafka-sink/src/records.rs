//! Turning Arrow rows into Kafka records: key and value from columns (bytes or strings) or the whole row as JSON,
//! an explicit partition column, and a topic per record from a column.

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use serde::Deserialize;
use std::borrow::Cow;

/// How rows become records.
///
/// | key | meaning | default |
/// |---|---|---|
/// | `key_column` | column whose value (Utf8 or Binary) is the record key; none = no key | none |
/// | `value_column` | column whose value is the record value (a null value is a tombstone: a record with a null value); none = the whole row as a JSON object (or Avro), except that a change stream's delete (a row with `__op = "d"`, [`connector_api::ChangeColumns`]) with a `key_column` is a tombstone of its key | none |
/// | `partition_column` | Int32 column with an explicit partition; none = partitioned by key | none |
/// | `topic_column` | Utf8 column naming each record's topic; none = the sink's `topic` | none |
/// | `header_columns` | columns (Utf8 or Binary) sent as record headers named after the column; nulls are omitted | none |
/// | `value_format` | the whole row as `json`; or in Confluent's wire format with its schema registered in the sink's `[registry]` (subject `<topic>-value`): `avro`, `json-schema` (the `json` text, its JSON Schema registered) or `protobuf` (a `ratchet.Row` message, its `.proto` registered); each type as docs/types.md says | `json` |
/// | `json_decimals` | JSON values: decimals as exact `number`s (`12.30`) or as `string`s (`"12.30"`, exact in readers that parse numbers as doubles) | `number` |
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordMapping {
    /// Key column.
    #[serde(default)]
    pub key_column: Option<String>,
    /// Value column (none: the row as JSON).
    #[serde(default)]
    pub value_column: Option<String>,
    /// Partition column.
    #[serde(default)]
    pub partition_column: Option<String>,
    /// Topic column.
    #[serde(default)]
    pub topic_column: Option<String>,
    /// Header columns: each a header named after its column (a null leaves the header out).
    #[serde(default)]
    pub header_columns: Vec<String>,
    /// A column of headers (`Map<Utf8, Binary or Utf8>`, as the source's `headers` metadata column): each entry a
    /// header, in order, after the header columns' (a null value is a header without a value). With it, records
    /// read from Kafka keep their headers.
    #[serde(default)]
    pub headers_column: Option<String>,
    /// How a whole row becomes the value (without `value_column`).
    #[serde(default)]
    pub value_format: ValueFormat,
    /// How JSON values write decimals.
    #[serde(default)]
    pub json_decimals: connector_api::types::json::DecimalsAs,
}

/// `records.value_format`: how a whole row becomes a record value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ValueFormat {
    /// A JSON object.
    #[default]
    Json,
    /// Avro in Confluent's wire format, its schema registered (the sink's `registry`).
    Avro,
    /// The JSON object in Confluent's wire format, its JSON Schema registered (the sink's `registry`).
    JsonSchema,
    /// A Protobuf message in Confluent's wire format, its schema registered (the sink's `registry`).
    Protobuf,
}

impl ValueFormat {
    /// How the job file writes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Avro => "avro",
            Self::JsonSchema => "json-schema",
            Self::Protobuf => "protobuf",
        }
    }
}

/// One record, borrowed from a batch where possible.
pub(crate) struct Record<'a> {
    pub(crate) topic: Option<&'a str>,
    pub(crate) key: Option<&'a [u8]>,
    /// Borrowed from the value column, or the row serialised as JSON; `None`: a tombstone (a null value in the
    /// value column).
    pub(crate) value: Option<Cow<'a, [u8]>>,
    pub(crate) partition: Option<i32>,
    /// (header name, value) pairs; a header without a value has `None`.
    pub(crate) headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

fn column<'a>(batch: &'a RecordBatch, name: &str, what: &str) -> Result<&'a ArrayRef, String> {
    batch.column_by_name(name).ok_or_else(|| {
        format!(
            "{what} {name:?} is not in the batch (columns: {:?})",
            batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
        )
    })
}

fn bytes_at<'a>(array: &'a ArrayRef, row: usize, name: &str) -> Result<Option<&'a [u8]>, String> {
    if array.is_null(row) {
        return Ok(None);
    }
    Ok(Some(match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(row).as_bytes(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(row).as_bytes(),
        DataType::Binary => array.as_binary::<i32>().value(row),
        DataType::LargeBinary => array.as_binary::<i64>().value(row),
        other => {
            return Err(format!(
                "column {name:?} has type {other}; key and value columns must be strings or binary"
            ));
        }
    }))
}

impl RecordMapping {
    /// Refuses settings that do not go together: Avro and JSON Schema values need a registry and the whole row
    /// (no `value_column`), and one subject (no `topic_column`).
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming the settings.
    pub(crate) fn check_format(&self, registry: bool) -> connector_api::Result<()> {
        if self.value_format == ValueFormat::Json {
            return Ok(());
        }
        let refuse = |why: &str| {
            Err(connector_api::Error::config(format!(
                "records.value_format = {:?} {why}",
                self.value_format.name()
            )))
        };
        match (registry, &self.value_column, &self.topic_column) {
            (false, _, _) => {
                refuse("needs the sink's [registry] to register the values' schema in")
            }
            (_, Some(_), _) => refuse("encodes the whole row: remove records.value_column"),
            (_, _, Some(_)) => {
                refuse("registers one subject, <topic>-value: remove records.topic_column")
            }
            _ => Ok(()),
        }
    }

    /// The records of `batch`, in row order; without a value column each value is `whole_rows`'s (the rows
    /// encoded already, as Avro) or the row as JSON. Errors name the column and row.
    pub(crate) fn records<'a>(
        &'a self,
        batch: &'a RecordBatch,
        whole_rows: Option<Vec<Vec<u8>>>,
    ) -> Result<Vec<Record<'a>>, String> {
        let key = self
            .key_column
            .as_deref()
            .map(|c| column(batch, c, "key_column"))
            .transpose()?;
        let value = self
            .value_column
            .as_deref()
            .map(|c| column(batch, c, "value_column"))
            .transpose()?;
        let partition = self
            .partition_column
            .as_deref()
            .map(|c| column(batch, c, "partition_column"))
            .transpose()?;
        let topic = self
            .topic_column
            .as_deref()
            .map(|c| column(batch, c, "topic_column"))
            .transpose()?;
        let headers = self
            .header_columns
            .iter()
            .map(|c| column(batch, c, "header_columns entry").map(|array| (c.as_str(), array)))
            .collect::<Result<Vec<_>, _>>()?;
        let header_map = self
            .headers_column
            .as_deref()
            .map(|c| column(batch, c, "headers_column"))
            .transpose()?
            .map(|array| {
                array.as_map_opt().ok_or_else(|| {
                    format!(
                        "headers_column has type {}; it must be a map of header names to bytes or text",
                        array.data_type()
                    )
                })
            })
            .transpose()?;
        if let Some(map) = header_map
            && map.keys().data_type() != &DataType::Utf8
        {
            return Err(format!(
                "headers_column has keys of type {}; header names must be Utf8",
                map.keys().data_type()
            ));
        }
        // A change stream's deletes (a CDC source's rows with `__op = "d"`) become tombstones of their key:
        // Kafka's way of deleting it from a compacted topic. Without a key there is nothing to delete.
        let deletes = match (key, value) {
            (Some(_), None) => connector_api::ChangeColumns::of(&batch.schema())
                .map_err(|e| e.to_string())?
                .map(|changes| changes.deletes(batch)),
            _ => None,
        };
        let mut json_rows = match (value, whole_rows) {
            (Some(_), _) => None,
            (None, Some(rows)) => Some(rows),
            (None, None) => Some(connector_api::types::json::rows(
                batch,
                connector_api::types::json::JsonOptions {
                    decimals: self.json_decimals,
                },
            )?),
        };
        if let Some(p) = partition
            && p.data_type() != &DataType::Int32
        {
            return Err(format!(
                "partition_column has type {}; it must be Int32",
                p.data_type()
            ));
        }
        if let Some(t) = topic
            && t.data_type() != &DataType::Utf8
        {
            return Err(format!(
                "topic_column has type {}; it must be Utf8",
                t.data_type()
            ));
        }
        let mut records = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let key = match key {
                Some(k) => bytes_at(k, row, self.key_column.as_deref().unwrap_or_default())?,
                None => None,
            };
            let value = match (value, &mut json_rows) {
                _ if deletes.as_ref().is_some_and(|d| d[row]) => None,
                (Some(v), _) => bytes_at(v, row, self.value_column.as_deref().unwrap_or_default())?
                    .map(Cow::Borrowed),
                (None, Some(rows)) => Some(Cow::Owned(std::mem::take(&mut rows[row]))),
                (None, None) => unreachable!("json rows exist when there is no value column"),
            };
            let partition = partition
                .map(|p| {
                    let p = p.as_primitive::<arrow_array::types::Int32Type>();
                    if p.is_null(row) {
                        Err(format!("row {row}: partition column is null"))
                    } else {
                        Ok(p.value(row))
                    }
                })
                .transpose()?;
            let topic = topic
                .map(|t| {
                    let t = t.as_string::<i32>();
                    if t.is_null(row) {
                        Err(format!("row {row}: topic column is null"))
                    } else {
                        Ok(t.value(row))
                    }
                })
                .transpose()?;
            let mut row_headers = Vec::with_capacity(headers.len());
            for (name, array) in &headers {
                if let Some(bytes) = bytes_at(array, row, name)? {
                    row_headers.push((*name, Some(bytes)));
                }
            }
            if let Some(map) = header_map
                && !map.is_null(row)
            {
                let offsets = map.value_offsets();
                let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
                let names = map.keys().as_string::<i32>();
                let name = self.headers_column.as_deref().unwrap_or_default();
                for entry in start..end {
                    row_headers.push((names.value(entry), bytes_at(map.values(), entry, name)?));
                }
            }
            records.push(Record {
                topic,
                key,
                value,
                partition,
                headers: row_headers,
            });
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int32Array, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};

    use super::*;

    fn batch() -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("k", DataType::Utf8, true),
                Field::new("p", DataType::Int32, false),
            ])),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
                Arc::new(Int32Array::from(vec![0, 1])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn rows_become_json_records_with_keys_and_partitions() {
        let mapping = RecordMapping {
            key_column: Some("k".into()),
            partition_column: Some("p".into()),
            header_columns: vec!["k".into()],
            ..RecordMapping::default()
        };
        let batch = batch();
        let records = mapping.records(&batch, None).unwrap();
        assert_eq!(records[0].headers, vec![("k", Some(&b"a"[..]))]);
        assert!(
            records[1].headers.is_empty(),
            "a null header value is omitted"
        );
        assert_eq!(records[0].key, Some(&b"a"[..]));
        assert_eq!(records[1].key, None);
        assert_eq!(records[1].partition, Some(1));
        assert_eq!(
            String::from_utf8(records[0].value.as_deref().unwrap().to_vec()).unwrap(),
            r#"{"id":1,"k":"a","p":0}"#
        );
    }

    #[test]
    fn a_headers_column_becomes_the_records_headers_in_order() {
        use arrow_array::builder::{BinaryBuilder, MapBuilder, StringBuilder};

        let mut headers = MapBuilder::new(None, StringBuilder::new(), BinaryBuilder::new());
        headers.keys().append_value("trace");
        headers.values().append_value(b"abc");
        headers.keys().append_value("empty");
        headers.values().append_null();
        headers.append(true).unwrap();
        headers.append(true).unwrap();
        let headers = headers.finish();
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("h", headers.data_type().clone(), false),
            ])),
            vec![Arc::new(Int64Array::from(vec![1, 2])), Arc::new(headers)],
        )
        .unwrap();
        let mapping = RecordMapping {
            headers_column: Some("h".into()),
            ..RecordMapping::default()
        };
        let records = mapping.records(&batch, None).unwrap();
        assert_eq!(
            records[0].headers,
            vec![("trace", Some(&b"abc"[..])), ("empty", None)]
        );
        assert!(records[1].headers.is_empty());
    }

    #[test]
    fn a_null_in_the_value_column_is_a_tombstone() {
        let mapping = RecordMapping {
            key_column: Some("k".into()),
            value_column: Some("k".into()),
            ..RecordMapping::default()
        };
        let batch = batch();
        let records = mapping.records(&batch, None).unwrap();
        assert_eq!(records[0].value.as_deref(), Some(&b"a"[..]));
        assert_eq!(records[1].value, None, "row 1's value is null: a tombstone");
    }

    #[test]
    fn a_change_streams_delete_with_a_key_is_a_tombstone() {
        let op = Field::new(connector_api::OP_COLUMN, DataType::Utf8, false).with_metadata(
            [(connector_api::CHANGE_COLUMN.to_string(), "op".to_string())]
                .into_iter()
                .collect(),
        );
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true), op])),
            vec![
                Arc::new(StringArray::from(vec!["1", "1", "2"])),
                Arc::new(StringArray::from(vec!["c", "d", "u"])),
            ],
        )
        .unwrap();
        let keyed = RecordMapping {
            key_column: Some("k".into()),
            ..RecordMapping::default()
        };
        let records = keyed.records(&batch, None).unwrap();
        assert!(records[0].value.is_some() && records[2].value.is_some());
        assert_eq!(records[1].key, Some(&b"1"[..]));
        assert_eq!(
            records[1].value, None,
            "the delete is a tombstone of its key"
        );
        let no_key = RecordMapping::default();
        let keyless = no_key.records(&batch, None).unwrap();
        assert!(
            keyless[1].value.is_some(),
            "without a key, the delete is a row"
        );
    }

    #[test]
    fn a_missing_or_mistyped_column_is_named() {
        let batch = batch();
        let missing = RecordMapping {
            key_column: Some("nope".into()),
            ..RecordMapping::default()
        };
        assert!(
            missing
                .records(&batch, None)
                .err()
                .unwrap()
                .contains("key_column \"nope\"")
        );
        let mistyped = RecordMapping {
            value_column: Some("id".into()),
            ..RecordMapping::default()
        };
        assert!(
            mistyped
                .records(&batch, None)
                .err()
                .unwrap()
                .contains("column \"id\" has type Int64")
        );
    }
}
