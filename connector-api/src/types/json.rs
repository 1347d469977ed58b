//! Rows as JSON objects: the Kafka sink's JSON values and the file sink's JSON lines, one encoding (arrow-json's
//! writer with the overrides below), so a value means the same in both and nothing is changed on the way:
//!
//! | Arrow | JSON |
//! |---|---|
//! | integers | numbers, every digit |
//! | `Float32`, `Float64` | numbers (shortest text that reads back as the same float); NaN and the infinities as the strings `"NaN"`, `"Infinity"`, `"-Infinity"` (JSON has no such numbers) |
//! | `Decimal(p, s)` | a number with exactly `s` fractional digits, or with [`DecimalsAs::String`] that text as a string |
//! | strings; `Dictionary(_, Utf8)` (an enum) | strings |
//! | `Binary`, `LargeBinary`, `FixedSizeBinary(n)` | base64 strings (Kafka Connect's JsonConverter convention) |
//! | `FixedSizeBinary(16)` marked UUID ([`super::marks`]) | the UUID's canonical text |
//! | `Date32` / `Time*` / `Timestamp` without a zone | `"2024-01-02"` / `"12:34:56.789"` / `"2024-01-02T12:34:56.789"`, every fractional digit the value has |
//! | `Timestamp` with a zone | RFC 3339 in UTC: `"2024-01-02T11:34:56.789Z"` (the instant; the zone's name is not kept) |
//! | `Struct` / `List` / `Map` with string keys | objects / arrays / objects; a null field or map value is written as `null` |
//!
//! Refused by [`check`] (so by `check-config` and at start): unions, and maps whose keys are not strings.

use std::io::Write;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Decimal32Type, Decimal64Type, Decimal128Type, Decimal256Type, Float16Type, Float32Type,
    Float64Type,
};
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray, RecordBatch};
use arrow_json::WriterBuilder;
use arrow_json::writer::{
    Encoder, EncoderFactory, EncoderOptions, LineDelimited, NullableEncoder, make_encoder,
};
use arrow_schema::{ArrowError, DataType, FieldRef, Schema};
use base64::Engine;
use serde::Deserialize;

use super::marks::{Mark, mark, uuid_text};
use super::{Refusal, describe};

/// How decimals are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecimalsAs {
    /// A JSON number with exactly the column's scale of fractional digits (`12.30`): exact, but readers that parse
    /// numbers as doubles round past 15-17 digits.
    #[default]
    Number,
    /// The same text as a JSON string (`"12.30"`): exact in every reader.
    String,
}

/// Options of the JSON encoding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JsonOptions {
    /// How decimals are written.
    pub decimals: DecimalsAs,
}

/// Refuses a field the JSON encoding cannot write (a union, a map whose keys are not strings), naming its path.
///
/// # Errors
/// The [`Refusal`].
pub fn check(schema: &Schema) -> Result<(), Refusal> {
    for field in schema.fields() {
        check_type(field.data_type()).map_err(|r| r.under(field.name()))?;
    }
    Ok(())
}

fn check_type(ty: &DataType) -> Result<(), Refusal> {
    super::refuse_nested(ty, &|t| match t {
        DataType::Union(..) => Some(Refusal::new(
            "",
            format!("has type {}, which JSON has no exact form for", describe(t)),
        )),
        _ => super::map_key(t)
            .filter(|key| {
                !matches!(
                    key,
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                )
            })
            .map(|key| {
                Refusal::new(
                    "{}.key",
                    format!("has type {}: JSON object keys are strings", describe(key)),
                )
            }),
    })
}

/// arrow-json's writer options with Ratchet's encodings.
fn builder(options: JsonOptions) -> WriterBuilder {
    WriterBuilder::new()
        .with_explicit_nulls(true)
        .with_encoder_factory(Arc::new(Encodings(options)))
}

/// Each row of `batch` as one JSON object.
///
/// # Errors
/// The encoder's message (a type [`check`] refuses).
pub fn rows(batch: &RecordBatch, options: JsonOptions) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut writer = builder(options).build::<_, LineDelimited>(&mut out);
    writer
        .write(batch)
        .and_then(|()| writer.finish())
        .map_err(|e| format!("cannot encode rows as JSON: {e}"))?;
    drop(writer);
    let rows: Vec<Vec<u8>> = out
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    if rows.len() != batch.num_rows() {
        return Err(format!(
            "JSON encoding produced {} rows for {}",
            rows.len(),
            batch.num_rows()
        ));
    }
    Ok(rows)
}

/// A writer of JSON lines (one object per row) into `target`.
pub fn line_writer<W: Write>(
    target: W,
    options: JsonOptions,
) -> arrow_json::LineDelimitedWriter<W> {
    builder(options).build::<_, LineDelimited>(target)
}

/// Each value of `array` (a column whose field is `field`) as JSON text, `None` where it is null: how a sink that
/// stores nested values as JSON documents (a `jsonb` or `JSON` column) writes them.
///
/// # Errors
/// The encoder's message (a type [`check`] refuses).
pub fn values(array: &ArrayRef, field: &FieldRef) -> Result<Vec<Option<String>>, String> {
    let options = EncoderOptions::default()
        .with_explicit_nulls(true)
        .with_encoder_factory(Arc::new(Encodings(JsonOptions::default())));
    let mut encoder = make_encoder(field, array.as_ref(), &options)
        .map_err(|e| format!("cannot encode field `{}` as JSON: {e}", field.name()))?;
    let mut out = Vec::with_capacity(array.len());
    let mut buffer = Vec::new();
    for i in 0..array.len() {
        if encoder.is_null(i) {
            out.push(None);
            continue;
        }
        buffer.clear();
        encoder.encode(i, &mut buffer);
        out.push(Some(String::from_utf8_lossy(&buffer).into_owned()));
    }
    Ok(out)
}

/// The overrides of arrow-json's default encoders.
#[derive(Debug)]
struct Encodings(JsonOptions);

impl EncoderFactory for Encodings {
    fn make_default_encoder<'a>(
        &self,
        field: &'a FieldRef,
        array: &'a dyn Array,
        _options: &'a EncoderOptions,
    ) -> Result<Option<NullableEncoder<'a>>, ArrowError> {
        let nulls = array.nulls().cloned();
        let encoder: Box<dyn Encoder + 'a> = match array.data_type() {
            DataType::FixedSizeBinary(16)
                if field.data_type() == array.data_type() && mark(field) == Some(Mark::Uuid) =>
            {
                Box::new(UuidEncoder(array.as_fixed_size_binary()))
            }
            DataType::FixedSizeBinary(_) => {
                let array = array.as_fixed_size_binary();
                Box::new(Base64Encoder(move |i| array.value(i)))
            }
            DataType::Binary => {
                let array = array.as_binary::<i32>();
                Box::new(Base64Encoder(move |i| array.value(i)))
            }
            DataType::LargeBinary => {
                let array = array.as_binary::<i64>();
                Box::new(Base64Encoder(move |i| array.value(i)))
            }
            DataType::BinaryView => {
                let array = array.as_binary_view();
                Box::new(Base64Encoder(move |i| array.value(i)))
            }
            DataType::Float16 => Box::new(FloatEncoder(array.as_primitive::<Float16Type>(), |v| {
                f64::from(v)
            })),
            DataType::Float32 => {
                Box::new(FloatEncoder(array.as_primitive::<Float32Type>(), f64::from))
            }
            DataType::Float64 => Box::new(FloatEncoder(array.as_primitive::<Float64Type>(), |v| v)),
            DataType::Decimal32(_, _) if self.0.decimals == DecimalsAs::String => {
                decimal_text::<Decimal32Type>(array)
            }
            DataType::Decimal64(_, _) if self.0.decimals == DecimalsAs::String => {
                decimal_text::<Decimal64Type>(array)
            }
            DataType::Decimal128(_, _) if self.0.decimals == DecimalsAs::String => {
                decimal_text::<Decimal128Type>(array)
            }
            DataType::Decimal256(_, _) if self.0.decimals == DecimalsAs::String => {
                decimal_text::<Decimal256Type>(array)
            }
            _ => return Ok(None),
        };
        Ok(Some(NullableEncoder::new(encoder, nulls)))
    }
}

fn decimal_text<'a, T: arrow_array::types::DecimalType>(
    array: &'a dyn Array,
) -> Box<dyn Encoder + 'a> {
    Box::new(DecimalTextEncoder(array.as_primitive::<T>()))
}

struct UuidEncoder<'a>(&'a arrow_array::FixedSizeBinaryArray);

impl Encoder for UuidEncoder<'_> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        out.extend_from_slice(uuid_text(self.0.value(idx)).as_bytes());
        out.push(b'"');
    }
}

struct Base64Encoder<F>(F);

impl<'a, F: Fn(usize) -> &'a [u8]> Encoder for Base64Encoder<F> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        out.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode((self.0)(idx))
                .as_bytes(),
        );
        out.push(b'"');
    }
}

struct FloatEncoder<'a, T: ArrowPrimitiveType, F>(&'a PrimitiveArray<T>, F);

impl<T: ArrowPrimitiveType, F: Fn(T::Native) -> f64> Encoder for FloatEncoder<'_, T, F>
where
    T::Native: std::fmt::Display,
{
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        let value = (self.1)(self.0.value(idx));
        if value.is_nan() {
            out.extend_from_slice(b"\"NaN\"");
        } else if value.is_infinite() {
            out.extend_from_slice(if value > 0.0 {
                b"\"Infinity\""
            } else {
                b"\"-Infinity\""
            });
        } else {
            // The native type's own shortest text: an f32 is written as an f32 reads, not widened.
            let text = self.0.value(idx).to_string();
            out.extend_from_slice(text.as_bytes());
        }
    }
}

struct DecimalTextEncoder<'a, T: arrow_array::types::DecimalType>(&'a PrimitiveArray<T>);

impl<T: arrow_array::types::DecimalType> Encoder for DecimalTextEncoder<'_, T> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        out.extend_from_slice(self.0.value_as_string(idx).as_bytes());
        out.push(b'"');
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow_array::{
        ArrayRef, BinaryArray, Decimal128Array, FixedSizeBinaryArray, Float64Array, Int64Array,
    };
    use arrow_schema::Field;

    use super::*;
    use crate::types::marks::{self, marked};

    #[test]
    fn values_are_written_exactly() {
        let uuid = marks::parse_uuid("123e4567-e89b-12d3-a456-426614174000").unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("amount", DataType::Decimal128(38, 4), true),
            Field::new("blob", DataType::Binary, true),
            marked(
                Field::new("ref", DataType::FixedSizeBinary(16), true),
                Mark::Uuid,
            ),
            Field::new("ratio", DataType::Float64, true),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![i64::MAX, 1])),
            Arc::new(
                Decimal128Array::from(vec![
                    Some(12_345_678_901_234_567_890_123_456_789_012_345_678),
                    None,
                ])
                .with_precision_and_scale(38, 4)
                .unwrap(),
            ),
            Arc::new(BinaryArray::from(vec![Some(&b"\x00\xff"[..]), None])),
            Arc::new(FixedSizeBinaryArray::try_from_iter([uuid, uuid].into_iter()).unwrap()),
            Arc::new(Float64Array::from(vec![f64::NAN, 0.1])),
        ];
        let batch = RecordBatch::try_new(schema, columns).unwrap();
        let rows = rows(&batch, JsonOptions::default()).unwrap();
        assert_eq!(
            String::from_utf8(rows[0].clone()).unwrap(),
            r#"{"id":9223372036854775807,"amount":1234567890123456789012345678901234.5678,"blob":"AP8=","ref":"123e4567-e89b-12d3-a456-426614174000","ratio":"NaN"}"#
        );
        assert_eq!(
            String::from_utf8(rows[1].clone()).unwrap(),
            r#"{"id":1,"amount":null,"blob":null,"ref":"123e4567-e89b-12d3-a456-426614174000","ratio":0.1}"#
        );
        let strings = super::rows(
            &batch,
            JsonOptions {
                decimals: DecimalsAs::String,
            },
        )
        .unwrap();
        assert!(
            String::from_utf8_lossy(&strings[0])
                .contains(r#""amount":"1234567890123456789012345678901234.5678""#)
        );
    }

    #[test]
    fn unions_and_maps_without_string_keys_are_refused_by_path() {
        let entries = Arc::new(Field::new(
            "entries",
            DataType::Struct(
                vec![
                    Field::new("key", DataType::Int32, false),
                    Field::new("value", DataType::Utf8, true),
                ]
                .into(),
            ),
            false,
        ));
        let schema = Schema::new(vec![Field::new(
            "c",
            DataType::Struct(vec![Field::new("m", DataType::Map(entries, false), true)].into()),
            true,
        )]);
        let refusal = check(&schema).unwrap_err();
        assert_eq!(refusal.path, "c.m{}.key");
        let _ = HashMap::<String, String>::new();
    }
}
