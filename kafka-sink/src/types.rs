//! The Kafka sink's half of the type contract (docs/types.md): what a whole row becomes as a record value, checked
//! at start and by `check-config` ([`check`]) and applied by the encoders.
//!
//! - **JSON values** ([`connector_api::types::json`]): decimals as exact numbers (or strings with
//!   `records.json_decimals = "string"`), bytes in base64, UUIDs as text, timestamps in RFC 3339 with every
//!   fractional digit; unions and maps without string keys refused.
//! - **Avro values** (arrow-avro's writer, [`crate::avro_values`]): every Arrow type as its Avro type (decimal as a
//!   `bytes` decimal of the same precision and scale, timestamps in their unit with `timestamp-*` for instants and
//!   `local-timestamp-*` without a zone, `time-millis` / `time-micros`, `date`, `uuid`, `fixed`, enums with their
//!   symbols, arrays, maps, records). Refused, because the Avro writer would change them: `UInt64` (Avro's long is
//!   signed), `Time64(ns)` (no Avro type; the writer would truncate to microseconds), `Date64` and `Duration`
//!   (their unit would be lost), unions, maps whose keys are not strings, `Null` columns.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, DictionaryArray, Int32Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, Schema, TimeUnit};
use connector_api::types::marks::{self, Mark};
use connector_api::types::{Refusal, describe, exact, json};
use connector_api::{Error, ErrorKind, Phase, Result, SinkId};

use crate::records::{RecordMapping, ValueFormat};

/// Checks that whole rows of `schema` can become values exactly (nothing to check with a `value_column`).
///
/// # Errors
/// [`Config`](ErrorKind::Config) naming every field that cannot.
pub(crate) fn check(
    records: &RecordMapping,
    schema: &Schema,
    sink: &SinkId,
    topic: &str,
) -> Result<()> {
    if records.value_column.is_some() {
        return Ok(());
    }
    let refusals: Vec<Refusal> = match records.value_format {
        ValueFormat::Json | ValueFormat::JsonSchema => {
            json::check(schema).err().into_iter().collect()
        }
        ValueFormat::Avro => schema
            .fields()
            .iter()
            .filter_map(|f| avro_refusal(f.data_type()).err().map(|r| r.under(f.name())))
            .collect(),
        ValueFormat::Protobuf => schema
            .fields()
            .iter()
            .filter_map(|f| {
                crate::protobuf_schema::refusal(f)
                    .err()
                    .map(|r| r.under(f.name()))
            })
            .collect(),
    };
    match refusals.is_empty() {
        true => Ok(()),
        false => Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            connector_api::types::refusals_message(
                &format!(
                    "the Kafka sink's {} values (topic {topic})",
                    match records.value_format {
                        ValueFormat::Json => "JSON",
                        ValueFormat::Avro => "Avro",
                        ValueFormat::JsonSchema => "JSON Schema",
                        ValueFormat::Protobuf => "Protobuf",
                    }
                ),
                &refusals,
            ),
        )
        .with_sink(sink)),
    }
}

/// Why arrow-avro's writer would not write `ty` exactly, if it would not.
fn avro_refusal(ty: &DataType) -> std::result::Result<(), Refusal> {
    use DataType::*;
    connector_api::types::refuse_nested(ty, &|t| {
        let why = match t {
            UInt64 => "which Avro's long (signed) cannot hold",
            Time64(TimeUnit::Nanosecond) => {
                "which has no Avro type (time-micros would truncate it)"
            }
            Date64 | Duration(_) => "whose unit Avro would not keep",
            Union(..) => "which is not written as Avro here (planned)",
            Null => "which holds no value",
            _ => {
                return connector_api::types::map_key(t)
                    .filter(|key| !matches!(key, Utf8 | LargeUtf8))
                    .map(|key| {
                        Refusal::new(
                            "{}.key",
                            format!("has type {}: Avro map keys are strings", describe(key)),
                        )
                    });
            }
        };
        Some(Refusal::new("", format!("has type {}, {why}", describe(t))))
    })
}

/// The field arrow-avro's writer is given for `field`: an enum (a dictionary with symbols) stays an enum, any other
/// dictionary becomes its values, and a UUID is marked the way the writer recognises (`logicalType = uuid`);
/// nested fields likewise. Other metadata is dropped.
pub(crate) fn avro_field(field: &Field) -> Field {
    let mut metadata = std::collections::HashMap::new();
    if let Some(symbols) = field.metadata().get(marks::ENUM_SYMBOLS)
        && marks::enum_symbols(field).is_some()
    {
        metadata.insert(marks::ENUM_SYMBOLS.to_string(), symbols.clone());
    }
    if marks::mark(field) == Some(Mark::Uuid) {
        metadata.insert("logicalType".to_string(), "uuid".to_string());
    }
    let ty = match field.data_type() {
        DataType::Dictionary(_, values) if !metadata.contains_key(marks::ENUM_SYMBOLS) => {
            values.as_ref().clone()
        }
        DataType::List(f) => DataType::List(Arc::new(avro_field(f))),
        DataType::LargeList(f) => DataType::LargeList(Arc::new(avro_field(f))),
        DataType::Struct(fields) => {
            DataType::Struct(fields.iter().map(|f| avro_field(f)).collect::<Fields>())
        }
        DataType::Map(entries, sorted) => DataType::Map(Arc::new(avro_field(entries)), *sorted),
        other => other.clone(),
    };
    Field::new(field.name(), ty, field.is_nullable()).with_metadata(metadata)
}

/// `batch`'s columns in the types of `schema` (made by [`avro_field`]): dictionaries unpacked, enums with their
/// dictionary in symbol order (what the writer requires).
///
/// # Errors
/// A message naming the field and value for an enum value that is not one of its symbols.
pub(crate) fn avro_columns(
    batch: &RecordBatch,
    schema: &Schema,
) -> std::result::Result<Vec<ArrayRef>, String> {
    batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| {
            if let Some(symbols) = marks::enum_symbols(field) {
                return enum_in_symbol_order(column, &symbols).map_err(|v| {
                    format!(
                        "field `{}` holds {v:?}, which is not one of its enum's symbols",
                        field.name()
                    )
                });
            }
            exact::convert(column, field.data_type())
                .map_err(|e| format!("field `{}`: {e}", field.name()))
        })
        .collect()
}

fn enum_in_symbol_order(
    column: &ArrayRef,
    symbols: &[String],
) -> std::result::Result<ArrayRef, String> {
    let text = exact::convert(column, &DataType::Utf8).map_err(|e| e.to_string())?;
    let text = text.as_string::<i32>();
    let mut keys = Vec::with_capacity(text.len());
    for i in 0..text.len() {
        if text.is_null(i) {
            keys.push(None);
            continue;
        }
        let value = text.value(i);
        let index = symbols
            .iter()
            .position(|s| s == value)
            .ok_or_else(|| value.to_string())?;
        keys.push(Some(index as i32));
    }
    let dictionary = DictionaryArray::<Int32Type>::try_new(
        Int32Array::from(keys),
        Arc::new(StringArray::from_iter_values(symbols)),
    )
    .map_err(|e| e.to_string())?;
    Ok(Arc::new(dictionary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_avro_would_change_are_refused_by_path() {
        let schema = Schema::new(vec![
            Field::new("ok", DataType::Decimal128(38, 9), true),
            Field::new(
                "s",
                DataType::Struct(
                    vec![Field::new(
                        "t",
                        DataType::Time64(TimeUnit::Nanosecond),
                        true,
                    )]
                    .into(),
                ),
                true,
            ),
        ]);
        let records = RecordMapping {
            value_format: ValueFormat::Avro,
            ..RecordMapping::default()
        };
        let err = check(&records, &schema, &SinkId::new("k").unwrap(), "t").unwrap_err();
        assert!(err.to_string().contains("field `s.t`"), "{err}");
        let json = RecordMapping::default();
        check(&json, &schema, &SinkId::new("k").unwrap(), "t").unwrap();
    }

    #[test]
    fn enums_are_written_in_symbol_order() {
        let field = Field::new(
            "status",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            true,
        )
        .with_metadata(
            [(
                marks::ENUM_SYMBOLS.to_string(),
                r#"["NEW","PAID"]"#.to_string(),
            )]
            .into(),
        );
        let column: ArrayRef = Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(vec![0, 1]),
                Arc::new(StringArray::from(vec!["PAID", "NEW"])),
            )
            .unwrap(),
        );
        let schema = Schema::new(vec![avro_field(&field)]);
        let batch = RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![column]).unwrap();
        let columns = avro_columns(&batch, &schema).unwrap();
        let dict = columns[0].as_dictionary::<Int32Type>();
        assert_eq!(dict.keys().values().to_vec(), vec![1, 0]);
    }
}
