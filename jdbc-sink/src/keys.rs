//! Tombstone keys as values of the upsert key columns: how the raw key of a deleted Kafka record becomes the row
//! the upsert mode deletes.
//!
//! The rule (also in the crate docs, "Tombstones"):
//! - **one key column**: the key's bytes are that column's value. A Binary / LargeBinary column takes them as they
//!   are. Any other column needs UTF-8 text: a text column takes it as it is; an integer, floating-point, boolean
//!   (`true` / `false`), date or timestamp column parses it (surrounding whitespace ignored). A key that is a JSON
//!   object holding the column (`{"id": 42}`) is accepted too: the column's value is taken from it; so is a JSON
//!   string literal (`"abc"`, as JSON key serializers write string keys): the text inside the quotes.
//! - **several key columns**: the key is a JSON object holding each of them (Kafka Connect's JSON keys without
//!   schemas, `{"tenant": "a", "id": 42}`); other fields are ignored.
//!
//! In a JSON object an integer column takes an integer number (or a string of one), a floating-point column a
//! number (or a string of one), a text column a string, a boolean column `true` / `false`, a binary column a hex
//! string, a date or timestamp column a string (`2024-05-01`, RFC 3339; a timestamp without an offset is UTC) or a
//! number in the column's unit.
//! A key that does not fit is a [`BadRecord`](ErrorKind::BadRecord) error naming the key, the column and what the
//! column takes.

use std::fmt::Write as _;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BinaryArray, LargeBinaryArray, RecordBatch};
use arrow_json::reader::ReaderBuilder;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::{Error, ErrorKind, Phase, Result};
use serde_json::{Map, Value};

use crate::columns::{Columns, SqlType};
use crate::config::config_error;

/// The longest part of a key shown in an error message (characters of text, bytes of anything else).
const SHOWN: usize = 64;

/// Decodes tombstone keys into rows of the upsert key columns; see the module docs for the rule.
#[derive(Debug, Clone)]
pub(crate) struct KeyDecoder {
    /// The key columns as the batches declare them, in the mode's order: for messages and the text rule.
    shown: Vec<Field>,
    /// The key columns as decoded: nullable (a missing value is refused here, naming the column), and a
    /// timestamp with a time zone as one at offset `+00:00` (the same instants: arrow-json reads named zones only
    /// with chrono-tz, which the workspace does not build).
    schema: SchemaRef,
    /// One single-field schema per key column: each column is decoded on its own, so an error names it.
    columns: Vec<SchemaRef>,
}

impl KeyDecoder {
    /// A decoder for the key columns `key` of the batches' `schema`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when `key` is empty or names a column the schema does not have.
    pub(crate) fn new(schema: &Schema, key: &[String]) -> Result<Self> {
        if key.is_empty() {
            return Err(config_error("mode upsert needs at least one key column"));
        }
        let mut shown = Vec::with_capacity(key.len());
        let mut fields = Vec::with_capacity(key.len());
        for name in key {
            let field = schema.field_with_name(name).map_err(|_| {
                config_error(format!(
                    "the key column {name:?} is not in the batches' schema"
                ))
            })?;
            let decoded = match field.data_type() {
                DataType::Timestamp(unit, Some(_)) => {
                    DataType::Timestamp(*unit, Some("+00:00".into()))
                }
                other => other.clone(),
            };
            shown.push(field.clone());
            fields.push(Field::new(name.clone(), decoded, true));
        }
        let columns = fields
            .iter()
            .map(|f| Arc::new(Schema::new(vec![f.clone()])))
            .collect();
        Ok(Self {
            shown,
            schema: Arc::new(Schema::new(fields)),
            columns,
        })
    }

    /// The key columns' schema: what the batches [`decode`](Self::decode) returns hold.
    #[cfg(test)]
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Decodes every key, one row (a batch of the key columns) per key. All of them are decoded before the caller
    /// uses any: one that does not fit fails the whole call.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) (phase `Write`) naming the first key that does not fit, the column and
    /// what it takes.
    pub(crate) fn decode<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<Vec<RecordBatch>> {
        keys.into_iter().map(|key| self.decode_one(key)).collect()
    }

    fn decode_one(&self, key: &[u8]) -> Result<RecordBatch> {
        let fields = &self.shown;
        if let [field] = fields.as_slice() {
            let raw: Option<ArrayRef> = match field.data_type() {
                DataType::Binary => Some(Arc::new(BinaryArray::from_iter_values([key]))),
                DataType::LargeBinary => Some(Arc::new(LargeBinaryArray::from_iter_values([key]))),
                _ => None,
            };
            if let Some(array) = raw {
                return RecordBatch::try_new(self.schema.clone(), vec![array]).map_err(bug);
            }
            // A JSON string literal (`"abc"`, as JSON key serializers write a string key) holds the text.
            let literal = serde_json::from_slice::<String>(key).ok();
            let text = literal.as_deref().map_or(key, str::as_bytes);
            let value = match json_object(key) {
                Some(mut object) if object.contains_key(field.name()) => {
                    object.remove(field.name()).unwrap_or(Value::Null)
                }
                _ => text_value(text, field)?,
            };
            return self.decode_values(key, vec![value]);
        }
        let Some(object) = json_object(key) else {
            let names: Vec<String> = fields.iter().map(|f| format!("{:?}", f.name())).collect();
            return Err(bad_key(
                key,
                format!(
                    "is not a JSON object: with several upsert key columns ({}), a key must be a JSON object \
                     holding each of them",
                    names.join(", ")
                ),
            ));
        };
        let values = fields
            .iter()
            .map(|f| object.get(f.name()).cloned().unwrap_or(Value::Null))
            .collect();
        self.decode_values(key, values)
    }

    /// The row of `values` (one per key column, in order), each checked and decoded on its own.
    fn decode_values(&self, key: &[u8], values: Vec<Value>) -> Result<RecordBatch> {
        let mut arrays = Vec::with_capacity(values.len());
        for ((schema, field), value) in self.columns.iter().zip(&self.shown).zip(values) {
            if value.is_null() {
                return Err(unfit(key, field, "it has no value for it"));
            }
            if !fits(field.data_type(), &value) {
                return Err(unfit(
                    key,
                    field,
                    &format!("the column takes {}", expected(field.data_type())),
                ));
            }
            let mut object = Map::new();
            object.insert(field.name().clone(), value);
            let json = serde_json::to_vec(&Value::Object(object)).map_err(bug)?;
            let mut decoder = ReaderBuilder::new(schema.clone())
                .with_batch_size(1)
                .build_decoder()
                .map_err(bug)?;
            let not_parsed = |e: arrow_schema::ArrowError| {
                unfit(
                    key,
                    field,
                    &format!("the column takes {}", expected(field.data_type())),
                )
                .with_source(e)
            };
            let read = decoder.decode(&json).map_err(not_parsed)?;
            let batch = decoder.flush().map_err(not_parsed)?;
            match batch {
                Some(batch)
                    if read == json.len()
                        && batch.num_rows() == 1
                        && !batch.column(0).is_null(0) =>
                {
                    arrays.push(batch.column(0).clone());
                }
                _ => {
                    return Err(bug(format!(
                        "the key column {:?} decoded to no value",
                        field.name()
                    )));
                }
            }
        }
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(bug)
    }
}

/// `key` as a JSON object, when it is one.
fn json_object(key: &[u8]) -> Option<Map<String, Value>> {
    serde_json::from_slice::<Map<String, Value>>(key).ok()
}

/// The value of a single key column given as text (see the module docs).
fn text_value(key: &[u8], field: &Field) -> Result<Value> {
    let text = std::str::from_utf8(key).map_err(|_| {
        unfit(
            key,
            field,
            &format!(
                "the key is not UTF-8 text, and the column takes {}",
                expected(field.data_type())
            ),
        )
    })?;
    Ok(match field.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Value::String(text.into()),
        DataType::Boolean => match text.trim() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => {
                return Err(unfit(
                    key,
                    field,
                    &format!("the column takes {}", expected(field.data_type())),
                ));
            }
        },
        _ => Value::String(text.trim().into()),
    })
}

/// Whether a JSON `value` can be decoded as `data_type` at all (the decoder then parses it). An integer column
/// refuses fractional numbers here: the decoder would truncate them.
fn fits(data_type: &DataType, value: &Value) -> bool {
    match (data_type, value) {
        (_, Value::Null | Value::Array(_) | Value::Object(_)) => false,
        (DataType::Boolean, value) => value.is_boolean(),
        (t, Value::Number(n)) if t.is_integer() => n.is_i64() || n.is_u64(),
        (t, Value::String(_)) if t.is_integer() => true,
        (t, Value::Number(_) | Value::String(_)) if t.is_floating() => true,
        (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, value) => value.is_string(),
        (DataType::Binary | DataType::LargeBinary, value) => value.is_string(),
        (DataType::Date32 | DataType::Timestamp(..), Value::Number(_) | Value::String(_)) => true,
        _ => false,
    }
}

/// What a key column of `data_type` takes, for error messages.
fn expected(data_type: &DataType) -> &'static str {
    match data_type {
        DataType::Boolean => "true or false",
        t if t.is_integer() => "an integer in its range",
        t if t.is_floating() => "a number",
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            "text (in a JSON key: a string)"
        }
        DataType::Binary | DataType::LargeBinary => "bytes (in a JSON key: a hex string)",
        DataType::Date32 => "a date (2024-05-01)",
        DataType::Timestamp(..) => "a timestamp (RFC 3339, or a number in the column's unit)",
        _ => "a value of its type",
    }
}

/// `key` in printable form: text quoted (the first [`SHOWN`] characters), other bytes in hex.
pub(crate) fn printable(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) => {
            let shown: String = text.chars().take(SHOWN).collect();
            let more = if shown.len() < text.len() { ".." } else { "" };
            format!("{shown:?}{more}")
        }
        Err(_) => {
            let mut hex = String::with_capacity(2 * SHOWN);
            for b in key.iter().take(SHOWN) {
                let _ = write!(hex, "{b:02x}");
            }
            let more = if key.len() > SHOWN { ".." } else { "" };
            format!("<{} bytes: {hex}{more}>", key.len())
        }
    }
}

/// Decoded keys (rows of the key columns, of SQL types `types`) for error messages: how many, and the first one's
/// values.
pub(crate) fn describe(keys: &[RecordBatch], types: &[SqlType]) -> String {
    let count: usize = keys.iter().map(RecordBatch::num_rows).sum();
    let first = keys.iter().find(|k| k.num_rows() > 0).map(|batch| {
        let schema = batch.schema();
        match Columns::new(batch, types, &vec![false; types.len()]) {
            Ok(columns) => (0..columns.len())
                .map(|c| format!("{} = {}", schema.field(c).name(), columns.show(c, 0)))
                .collect::<Vec<_>>()
                .join(", "),
            Err(e) => e.to_string(),
        }
    });
    match first {
        Some(first) => format!("{count} tombstone key(s), the first with {first}"),
        None => "no tombstone keys".into(),
    }
}

fn bad_key(key: &[u8], what: String) -> Error {
    Error::new(
        ErrorKind::BadRecord,
        Phase::Write,
        format!("the tombstone key {} {what}", printable(key)),
    )
}

fn unfit(key: &[u8], field: &Field, why: &str) -> Error {
    bad_key(
        key,
        format!(
            "does not fit the upsert key column {:?} ({}): {why}",
            field.name(),
            field.data_type()
        ),
    )
}

fn bug(e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Bug,
        Phase::Write,
        format!("cannot build the row of a tombstone key: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Date32Type, Float64Type, Int8Type, Int64Type, TimestampMicrosecondType,
    };
    use arrow_schema::TimeUnit;

    use super::*;

    fn decoder(fields: Vec<Field>, key: &[&str]) -> KeyDecoder {
        let key: Vec<String> = key.iter().map(|k| k.to_string()).collect();
        KeyDecoder::new(&Schema::new(fields), &key).unwrap()
    }

    fn orders() -> KeyDecoder {
        decoder(
            vec![
                Field::new("id", DataType::Int64, false),
                Field::new("payload", DataType::Utf8, false),
            ],
            &["id"],
        )
    }

    fn one(decoder: &KeyDecoder, key: &[u8]) -> Result<RecordBatch> {
        let mut rows = decoder.decode([key])?;
        assert_eq!(rows.len(), 1);
        Ok(rows.remove(0))
    }

    fn int64(batch: &RecordBatch, column: usize) -> i64 {
        batch.column(column).as_primitive::<Int64Type>().value(0)
    }

    #[test]
    fn a_single_integer_key_is_its_text_or_a_json_object_holding_it() {
        let keys = orders();
        assert_eq!(keys.schema().fields().len(), 1);
        for (key, id) in [
            ("42", 42),
            (" -7\n", -7),
            (r#"{"id": 5}"#, 5),
            (r#"{"id": "6", "other": true}"#, 6),
            ("9223372036854775807", i64::MAX),
        ] {
            let batch = one(&keys, key.as_bytes()).unwrap();
            assert_eq!(int64(&batch, 0), id, "{key:?}");
        }
    }

    #[test]
    fn a_key_that_does_not_fit_is_a_bad_record_naming_key_column_and_type() {
        let keys = orders();
        for key in [
            &b"abc"[..],
            b"3.5",
            b"",
            br#"{"id": 3.5}"#,
            br#"{"id": null}"#,
            br#"{"other": 1}"#,
            b"9223372036854775808",
            b"\xff\xfe",
        ] {
            let err = one(&keys, key).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
            assert_eq!(err.phase(), Phase::Write, "{err}");
            let text = err.to_string();
            assert!(text.contains(&printable(key)), "{text}");
            assert!(text.contains("\"id\"") && text.contains("Int64"), "{text}");
        }
        let err = one(&keys, b"abc").unwrap_err().to_string();
        assert!(
            err.contains("\"abc\"") && err.contains("an integer"),
            "{err}"
        );
    }

    #[test]
    fn nothing_is_decoded_when_one_key_does_not_fit() {
        let keys = orders();
        let err = keys
            .decode([&b"1"[..], b"2", b"x", b"4"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"x\""), "{err}");
        let rows = keys.decode([&b"1"[..], b"2"]).unwrap();
        assert_eq!(rows.iter().map(|r| int64(r, 0)).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn text_binary_boolean_float_and_date_keys() {
        let text = decoder(vec![Field::new("name", DataType::Utf8, false)], &["name"]);
        for (key, value) in [
            (" a b ", " a b "),
            (r#"{"name": "x"}"#, "x"),
            (r#"{"other": 1}"#, r#"{"other": 1}"#),
        ] {
            let batch = one(&text, key.as_bytes()).unwrap();
            assert_eq!(batch.column(0).as_string::<i32>().value(0), value);
        }
        let err = one(&text, br#"{"name": 1}"#).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");

        let binary = decoder(vec![Field::new("k", DataType::Binary, false)], &["k"]);
        let batch = one(&binary, &[0xff, 0x00, b'{']).unwrap();
        assert_eq!(
            batch.column(0).as_binary::<i32>().value(0),
            &[0xff, 0x00, b'{']
        );

        let flag = decoder(vec![Field::new("on", DataType::Boolean, false)], &["on"]);
        assert!(one(&flag, b"true").unwrap().column(0).as_boolean().value(0));
        assert!(
            !one(&flag, br#"{"on": false}"#)
                .unwrap()
                .column(0)
                .as_boolean()
                .value(0)
        );
        assert_eq!(one(&flag, b"yes").unwrap_err().kind(), ErrorKind::BadRecord);

        let float = decoder(vec![Field::new("f", DataType::Float64, false)], &["f"]);
        let batch = one(&float, b"1.5").unwrap();
        let value = batch.column(0).as_primitive::<Float64Type>().value(0);
        assert!((value - 1.5).abs() < 1e-12, "{value}");

        let date = decoder(vec![Field::new("d", DataType::Date32, false)], &["d"]);
        let batch = one(&date, b"2024-01-02").unwrap();
        assert_eq!(
            batch.column(0).as_primitive::<Date32Type>().value(0),
            19_724
        );

        let at = decoder(
            vec![Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            )],
            &["at"],
        );
        let batch = one(&at, b"1970-01-01T00:00:01Z").unwrap();
        assert_eq!(
            batch
                .column(0)
                .as_primitive::<TimestampMicrosecondType>()
                .value(0),
            1_000_000
        );
    }

    #[test]
    fn a_json_string_literal_key_holds_its_text() {
        let decoder = decoder(vec![Field::new("code", DataType::Utf8, false)], &["code"]);
        let batch = one(&decoder, br#""abc""#).unwrap();
        assert_eq!(batch.column(0).as_string::<i32>().value(0), "abc");
        let ids = orders();
        assert_eq!(int64(&one(&ids, br#""42""#).unwrap(), 0), 42);
    }

    #[test]
    fn several_key_columns_come_from_a_json_object() {
        let keys = decoder(
            vec![
                Field::new("payload", DataType::Utf8, false),
                Field::new("tenant", DataType::Utf8, false),
                Field::new("id", DataType::Int64, false),
                Field::new("small", DataType::Int8, true),
            ],
            &["tenant", "id", "small"],
        );
        let batch = one(
            &keys,
            br#"{"id": 7, "tenant": "a", "small": -3, "payload": "ignored"}"#,
        )
        .unwrap();
        assert_eq!(batch.num_columns(), 3);
        assert_eq!(batch.column(0).as_string::<i32>().value(0), "a");
        assert_eq!(int64(&batch, 1), 7);
        assert_eq!(batch.column(2).as_primitive::<Int8Type>().value(0), -3);

        for (key, column) in [
            (r#"{"id": 7, "small": 1}"#, "\"tenant\""),
            (r#"{"id": 7.5, "tenant": "a", "small": 1}"#, "\"id\""),
            (r#"{"id": 7, "tenant": "a", "small": 300}"#, "\"small\""),
            ("7", "\"tenant\", \"id\", \"small\""),
        ] {
            let err = one(&keys, key.as_bytes()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
            let text = err.to_string();
            assert!(
                text.contains(column) && text.contains(&printable(key.as_bytes())),
                "{text}"
            );
        }
    }

    #[test]
    fn keys_are_shown_printable() {
        assert_eq!(printable(b"abc"), "\"abc\"");
        assert_eq!(printable(&[0xff, 0x01]), "<2 bytes: ff01>");
        let long = "x".repeat(100);
        assert_eq!(
            printable(long.as_bytes()),
            format!("{:?}..", "x".repeat(64))
        );
    }
}
