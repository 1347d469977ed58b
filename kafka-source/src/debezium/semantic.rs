//! Debezium's (and Kafka Connect's) semantic types as the Arrow types that hold them exactly (docs/types.md,
//! "Debezium"):
//!
//! | semantic type (`connect.name`) | written as | Arrow |
//! |---|---|---|
//! | `org.apache.kafka.connect.data.Decimal` | bytes, scale (and `connect.decimal.precision`) in the parameters | `Decimal128(p, s)` (p 38 when not given) |
//! | `io.debezium.data.VariableScaleDecimal` | `{scale, value}` | `Utf8` marked decimal text |
//! | `io.debezium.time.Date`, `org.apache.kafka.connect.data.Date` | int32 days | `Date32` |
//! | `io.debezium.time.Time`, `org.apache.kafka.connect.data.Time` / `MicroTime` / `NanoTime` | int ms / µs / ns | `Time32(ms)` / `Time64(µs)` / `Time64(ns)` |
//! | `io.debezium.time.Timestamp`, `org.apache.kafka.connect.data.Timestamp` / `MicroTimestamp` / `NanoTimestamp` | int64 since the epoch, local | `Timestamp(ms / µs / ns)` without a zone |
//! | `io.debezium.time.ZonedTimestamp` | RFC 3339 text | `Timestamp(µs, UTC)` |
//! | `io.debezium.data.Json` | text | `Utf8` marked JSON |
//! | `io.debezium.data.Uuid` | text | `FixedSizeBinary(16)` marked UUID |
//! | anything else (`Enum`, `ZonedTime`, `Geometry`, ...) | as written | as written |

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    Array, ArrayRef, FixedSizeBinaryArray, StringArray, TimestampMicrosecondArray, make_array,
};
use arrow_buffer::i256;
use arrow_schema::{DataType, Field, TimeUnit};
use chrono::DateTime;
use connector_api::types::decimal;
use connector_api::types::marks::{Mark, marked, parse_uuid};
use serde_json::Value;

use crate::json_rows::Semantic;

/// A field's semantic type name (arrow-avro keeps the Avro schema's `connect.name` as JSON text).
fn connect_name(field: &Field) -> Option<String> {
    let raw = field.metadata().get("connect.name")?;
    Some(serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.clone()))
}

/// The decimal precision Kafka Connect's parameters give (`connect.decimal.precision`).
fn connect_precision(field: &Field) -> Option<u8> {
    let raw = field.metadata().get("connect.parameters")?;
    let parameters: Value = serde_json::from_str(raw).ok()?;
    parameters["connect.decimal.precision"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .or_else(|| {
            parameters["connect.decimal.precision"]
                .as_u64()
                .and_then(|p| u8::try_from(p).ok())
        })
}

/// The column `field` (an Avro row's field, with its metadata) becomes.
pub(crate) fn field(field: &Field) -> Field {
    let plain = |ty: DataType| Field::new(field.name(), ty, field.is_nullable());
    match (connect_name(field).as_deref(), field.data_type()) {
        (Some("org.apache.kafka.connect.data.Decimal"), DataType::Decimal128(p, s)) => {
            let precision =
                connect_precision(field).unwrap_or(if field.metadata().contains_key("precision") {
                    *p
                } else {
                    38
                });
            plain(DataType::Decimal128(precision.max(*p), *s))
        }
        (Some("io.debezium.data.VariableScaleDecimal"), DataType::Struct(_)) => {
            marked(plain(DataType::Utf8), Mark::DecimalText)
        }
        (Some("io.debezium.time.Date" | "org.apache.kafka.connect.data.Date"), DataType::Int32) => {
            plain(DataType::Date32)
        }
        (Some("io.debezium.time.Time" | "org.apache.kafka.connect.data.Time"), DataType::Int32) => {
            plain(DataType::Time32(TimeUnit::Millisecond))
        }
        (Some("io.debezium.time.MicroTime"), DataType::Int64) => {
            plain(DataType::Time64(TimeUnit::Microsecond))
        }
        (Some("io.debezium.time.NanoTime"), DataType::Int64) => {
            plain(DataType::Time64(TimeUnit::Nanosecond))
        }
        (
            Some("io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp"),
            DataType::Int64,
        ) => plain(DataType::Timestamp(TimeUnit::Millisecond, None)),
        (Some("io.debezium.time.MicroTimestamp"), DataType::Int64) => {
            plain(DataType::Timestamp(TimeUnit::Microsecond, None))
        }
        (Some("io.debezium.time.NanoTimestamp"), DataType::Int64) => {
            plain(DataType::Timestamp(TimeUnit::Nanosecond, None))
        }
        (Some("io.debezium.time.ZonedTimestamp"), DataType::Utf8) => plain(DataType::Timestamp(
            TimeUnit::Microsecond,
            Some("UTC".into()),
        )),
        (Some("io.debezium.data.Json"), DataType::Utf8) => {
            marked(plain(DataType::Utf8), Mark::Json)
        }
        (Some("io.debezium.data.Uuid"), DataType::Utf8) => {
            marked(plain(DataType::FixedSizeBinary(16)), Mark::Uuid)
        }
        _ => {
            // Keep the Arrow type and what it means (an enum's symbols, a uuid), without Avro's bookkeeping.
            let metadata: HashMap<String, String> = field
                .metadata()
                .iter()
                .filter(|(k, _)| k.as_str() == "avro.enum.symbols" || k.as_str() == "logicalType")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            plain(field.data_type().clone()).with_metadata(metadata)
        }
    }
}

/// `column` (decoded as `source` says) as the column `target` ([`field`]); each value unchanged.
///
/// # Errors
/// A message naming the value that does not convert (an invalid UUID, a zoned timestamp finer than
/// microseconds), for the caller to put in a bad record.
pub(crate) fn column(
    column: &ArrayRef,
    source: &Field,
    target: &Field,
) -> Result<ArrayRef, String> {
    if column.data_type() == target.data_type() {
        return Ok(column.clone());
    }
    let retyped = |array: &ArrayRef| -> Result<ArrayRef, String> {
        let data = array
            .to_data()
            .into_builder()
            .data_type(target.data_type().clone())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(make_array(data))
    };
    match (
        connect_name(source).as_deref(),
        column.data_type(),
        target.data_type(),
    ) {
        (_, DataType::Int32, DataType::Date32 | DataType::Time32(_))
        | (_, DataType::Int64, DataType::Time64(_) | DataType::Timestamp(_, None)) => {
            retyped(column)
        }
        (Some("io.debezium.data.VariableScaleDecimal"), DataType::Struct(_), DataType::Utf8) => {
            variable_decimals(column)
        }
        (Some("io.debezium.time.ZonedTimestamp"), DataType::Utf8, DataType::Timestamp(..)) => {
            zoned(column.as_string::<i32>())
        }
        (Some("io.debezium.data.Uuid"), DataType::Utf8, DataType::FixedSizeBinary(16)) => {
            uuids(column.as_string::<i32>())
        }
        _ => connector_api::types::exact::convert(column, target.data_type())
            .map_err(|e| e.to_string()),
    }
}

fn variable_decimals(column: &ArrayRef) -> Result<ArrayRef, String> {
    let s = column.as_struct();
    let (Some(scales), Some(values)) = (s.column_by_name("scale"), s.column_by_name("value"))
    else {
        return Err("a VariableScaleDecimal without scale and value".into());
    };
    let scales = arrow_cast::cast(scales, &DataType::Int64).map_err(|e| e.to_string())?;
    let scales = scales.as_primitive::<Int64Type>();
    let values = values.as_binary::<i32>();
    let texts: Vec<Option<String>> = (0..s.len())
        .map(|i| {
            (s.is_valid(i) && values.is_valid(i)).then(|| {
                let bytes = values.value(i);
                let fill = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
                    0xff
                } else {
                    0
                };
                let mut full = [fill; 32];
                let len = bytes.len().min(32);
                full[32 - len..].copy_from_slice(&bytes[bytes.len() - len..]);
                decimal::text(i256::from_be_bytes(full), scales.value(i) as i8)
            })
        })
        .collect();
    Ok(Arc::new(StringArray::from(texts)))
}

fn zoned(texts: &StringArray) -> Result<ArrayRef, String> {
    let mut micros = Vec::with_capacity(texts.len());
    for text in texts {
        micros.push(match text {
            None => None,
            Some(text) => {
                let instant = DateTime::parse_from_rfc3339(text).map_err(|_| {
                    format!("the ZonedTimestamp {text:?} is not an RFC 3339 date-time")
                })?;
                if instant.timestamp_subsec_nanos() % 1000 != 0 {
                    return Err(format!(
                        "the ZonedTimestamp {text:?} is finer than microseconds"
                    ));
                }
                Some(instant.timestamp_micros())
            }
        });
    }
    Ok(Arc::new(
        TimestampMicrosecondArray::from(micros).with_timezone("UTC"),
    ))
}

fn uuids(texts: &StringArray) -> Result<ArrayRef, String> {
    let values: Vec<Option<[u8; 16]>> = texts
        .iter()
        .map(|t| {
            t.map(|t| parse_uuid(t).ok_or_else(|| format!("{t:?} is not a UUID")))
                .transpose()
        })
        .collect::<Result<_, _>>()?;
    FixedSizeBinaryArray::try_from_sparse_iter_with_size(values.into_iter(), 16)
        .map(|a| Arc::new(a) as ArrayRef)
        .map_err(|e| e.to_string())
}

/// The semantic types of a JSON event's row image `image` (`before` or `after`), from the Kafka Connect schema of
/// the event (`schema`, the JSON converter's wrapper): how each column's values are written.
pub(crate) fn of_connect_schema(schema: &str, image: &str) -> HashMap<String, Semantic> {
    let Ok(schema) = serde_json::from_str::<Value>(schema) else {
        return HashMap::new();
    };
    let fields = schema["fields"]
        .as_array()
        .and_then(|fields| fields.iter().find(|f| f["field"] == image))
        .and_then(|row| row["fields"].as_array())
        .cloned()
        .unwrap_or_default();
    fields
        .iter()
        .filter_map(|f| {
            let name = f["field"].as_str()?.to_string();
            let semantic = match (f["name"].as_str(), f["type"].as_str()) {
                (Some("org.apache.kafka.connect.data.Decimal"), _) => {
                    let scale = &f["parameters"]["scale"];
                    let scale = scale
                        .as_str()
                        .and_then(|s| s.parse().ok())
                        .or(scale.as_i64().map(|s| s as i8))?;
                    Semantic::DecimalBytes(scale)
                }
                (Some("io.debezium.data.VariableScaleDecimal"), _) => Semantic::VariableDecimal,
                (Some("io.debezium.time.Time" | "org.apache.kafka.connect.data.Time"), _) => {
                    Semantic::TimeOfDay(TimeUnit::Millisecond)
                }
                (Some("io.debezium.time.MicroTime"), _) => {
                    Semantic::TimeOfDay(TimeUnit::Microsecond)
                }
                (Some("io.debezium.time.NanoTime"), _) => Semantic::TimeOfDay(TimeUnit::Nanosecond),
                (
                    Some("io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp"),
                    _,
                ) => Semantic::Instant(TimeUnit::Millisecond),
                (Some("io.debezium.time.MicroTimestamp"), _) => {
                    Semantic::Instant(TimeUnit::Microsecond)
                }
                (Some("io.debezium.time.NanoTimestamp"), _) => {
                    Semantic::Instant(TimeUnit::Nanosecond)
                }
                (Some("io.debezium.data.Json"), _) => Semantic::JsonText,
                (None, Some("bytes")) => Semantic::Bytes,
                _ => return None,
            };
            Some((name, semantic))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_schemas_say_how_values_are_written() {
        let schema = r#"{"type":"struct","fields":[{"type":"struct","fields":[
            {"type":"int32","optional":false,"field":"id"},
            {"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"},"field":"amount"},
            {"type":"int64","optional":true,"name":"io.debezium.time.Timestamp","version":1,"field":"at"},
            {"type":"bytes","optional":true,"field":"blob"}],"optional":true,"name":"pg.public.t.Value","field":"after"}]}"#;
        let semantics = of_connect_schema(schema, "after");
        assert_eq!(semantics.get("amount"), Some(&Semantic::DecimalBytes(2)));
        assert_eq!(
            semantics.get("at"),
            Some(&Semantic::Instant(TimeUnit::Millisecond))
        );
        assert_eq!(semantics.get("blob"), Some(&Semantic::Bytes));
        assert!(!semantics.contains_key("id"));
    }

    #[test]
    fn avro_fields_become_the_types_that_hold_them() {
        let named = |name: &str, ty: DataType| {
            Field::new("c", ty, true).with_metadata(HashMap::from([(
                "connect.name".to_string(),
                format!("\"{name}\""),
            )]))
        };
        let micros = field(&named("io.debezium.time.MicroTimestamp", DataType::Int64));
        assert_eq!(
            micros.data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, None)
        );
        let column: ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![1_000_000]));
        let converted = super::column(
            &column,
            &named("io.debezium.time.MicroTimestamp", DataType::Int64),
            &micros,
        )
        .unwrap();
        assert_eq!(converted.data_type(), micros.data_type());
        let zoned = named("io.debezium.time.ZonedTimestamp", DataType::Utf8);
        let texts: ArrayRef = Arc::new(StringArray::from(vec![
            Some("2024-05-01T12:00:00.123456+02:00"),
            None,
        ]));
        let converted = super::column(&texts, &zoned, &field(&zoned)).unwrap();
        let converted = converted.as_primitive::<arrow_array::types::TimestampMicrosecondType>();
        assert_eq!(converted.value(0), 1_714_557_600_123_456);
        assert!(converted.is_null(1));
    }
}
