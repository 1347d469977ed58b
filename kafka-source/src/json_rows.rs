//! [`JsonRows`]: JSON objects decoded straight into Arrow builders of the declared columns, strictly: each value
//! must fit its declared type exactly (the types are in [`crate::json_types`]), or the record is refused naming the
//! field and the value. Decoded with serde_json's streaming deserializer, one record at a time, without building a
//! JSON tree; decimals and `json` fields are read from the value's own text, so no digit is lost to a float.
//!
//! A record that fails halfway leaves the builders with part of a row: the batch is then unusable, and the reader
//! sorts the batch out record by record (as for every JSON and Avro decoding, [`crate::reject`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, BooleanBuilder, Decimal128Builder, Decimal256Builder,
    FixedSizeBinaryBuilder, Float32Builder, Float64Builder, Int8Builder, Int16Builder,
    Int32Builder, Int64Builder, PrimitiveBuilder, StringBuilder, UInt8Builder, UInt16Builder,
    UInt32Builder, UInt64Builder,
};
use arrow_array::types::ArrowPrimitiveType;
use arrow_array::{Array, ArrayRef, ListArray, MapArray, StructArray, make_array};
use arrow_buffer::{NullBufferBuilder, OffsetBuffer, ScalarBuffer, i256};
use arrow_schema::{DataType, Field, FieldRef, Fields, TimeUnit};
use base64::Engine;
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use connector_api::types::decimal;
use connector_api::types::marks::{Mark, mark, parse_uuid};
use serde::Deserializer;
use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// What a JSON object's keys that are not declared mean.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnknownFields {
    /// Left out (a producer may add fields a job does not read).
    #[default]
    Ignore,
    /// The record is refused, naming the field (nothing is dropped without a word).
    Fail,
}

/// How a top-level field's values are written when the writer says more than the declared type (Debezium's
/// semantic types, from each event's Kafka Connect schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Semantic {
    /// `org.apache.kafka.connect.data.Decimal`: base64 of the unscaled value's big-endian two's complement bytes,
    /// at this scale.
    DecimalBytes(i8),
    /// `io.debezium.data.VariableScaleDecimal`: `{"scale": s, "value": <base64 bytes>}`.
    VariableDecimal,
    /// A time of day as an integer in this unit (`io.debezium.time.Time` ms, `MicroTime` µs, `NanoTime` ns,
    /// Kafka Connect's `Time` ms).
    TimeOfDay(TimeUnit),
    /// A local date-time as an integer in this unit since the epoch (`io.debezium.time.Timestamp` ms,
    /// `MicroTimestamp` µs, `NanoTimestamp` ns, Kafka Connect's `Timestamp` ms).
    Instant(TimeUnit),
    /// Bytes in base64 (a `bytea` column).
    Bytes,
    /// JSON written as a string holding its text (`io.debezium.data.Json`; any Debezium JSON column): a `json`
    /// column takes the string's content, not the string.
    JsonText,
}

/// The row context of one object: semantic types by top-level field, and the placeholder of a value the writer
/// did not have (Debezium's unavailable value).
#[derive(Debug, Default)]
pub(crate) struct RowContext<'c> {
    pub(crate) semantics: Option<&'c HashMap<String, Semantic>>,
    pub(crate) placeholder: Option<&'c str>,
    /// Whether a string where a top-level `json` column is declared holds that column's JSON text (Debezium writes
    /// JSON columns so, with or without schemas): [`Semantic::JsonText`] unless the writer says otherwise.
    pub(crate) json_in_strings: bool,
    /// The top-level fields that held the placeholder (written null).
    pub(crate) unavailable: Vec<String>,
}

/// A value the decoding read, as far as a JSON Schema's bounds go ([`JsonRows::last`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Read<'a> {
    /// Null or absent: no bound applies (JSON Schema's bounds constrain values of their own type only).
    Null,
    Integer(i64),
    Float(f64),
    Text(&'a str),
}

/// The builders of one batch of rows of `fields`.
pub(crate) struct JsonRows {
    columns: Vec<Column>,
    names: HashMap<String, usize>,
    unknown: UnknownFields,
    rows: usize,
}

impl JsonRows {
    /// Builders for about `capacity` rows of `fields`.
    pub(crate) fn new(fields: &Fields, unknown: UnknownFields, capacity: usize) -> Self {
        Self {
            columns: fields.iter().map(|f| Column::new(f, capacity)).collect(),
            names: names(fields),
            unknown,
            rows: 0,
        }
    }

    /// Rows appended.
    pub(crate) fn len(&self) -> usize {
        self.rows
    }

    /// Appends the JSON object `value` as one row.
    ///
    /// # Errors
    /// Why it does not fit, naming the field and the value (the builders are unusable afterwards).
    pub(crate) fn append(
        &mut self,
        value: &[u8],
        context: &mut RowContext<'_>,
    ) -> Result<(), String> {
        let mut de = serde_json::Deserializer::from_slice(value);
        let seed = ObjectSeed {
            columns: &mut self.columns,
            names: &self.names,
            unknown: self.unknown,
            path: "",
            context: Some(context),
        };
        seed.deserialize(&mut de)
            .and_then(|()| de.end())
            .map_err(|e| e.to_string())?;
        self.rows += 1;
        Ok(())
    }

    /// Appends a row of nulls (a row image an event lacks), refusing a column that is not nullable.
    pub(crate) fn append_null_row(&mut self) -> Result<(), String> {
        for column in &mut self.columns {
            column
                .append_null::<serde_json::Error>(|field| field.name().clone())
                .map_err(|e| e.to_string())?;
        }
        self.rows += 1;
        Ok(())
    }

    /// The value the last row appended has in top-level column `index`, as far as a JSON Schema's bounds go: an
    /// integer, a float or a text leaf; [`Read::Null`] for a null and for any other column.
    pub(crate) fn last(&self, index: usize) -> Read<'_> {
        let Some(Column::Leaf { leaf, .. }) = self.columns.get(index) else {
            return Read::Null;
        };
        let integer = |v: Option<i64>| v.map_or(Read::Null, Read::Integer);
        match leaf {
            Leaf::I8(b) => integer(last_value(b).map(i64::from)),
            Leaf::I16(b) => integer(last_value(b).map(i64::from)),
            Leaf::I32(b) => integer(last_value(b).map(i64::from)),
            Leaf::I64(b) => integer(last_value(b)),
            Leaf::U8(b) => integer(last_value(b).map(i64::from)),
            Leaf::U16(b) => integer(last_value(b).map(i64::from)),
            Leaf::U32(b) => integer(last_value(b).map(i64::from)),
            Leaf::F32(b) => last_value(b).map_or(Read::Null, |v| Read::Float(f64::from(v))),
            Leaf::F64(b) => last_value(b).map_or(Read::Null, Read::Float),
            Leaf::Text(b) => last_text(b).map_or(Read::Null, Read::Text),
            _ => Read::Null,
        }
    }

    /// The columns of every row appended.
    pub(crate) fn finish(self) -> Result<Vec<ArrayRef>, String> {
        self.columns.into_iter().map(Column::finish).collect()
    }
}

/// The last value appended to `builder`, `None` when it is null (or nothing was appended).
fn last_value<T: ArrowPrimitiveType>(builder: &PrimitiveBuilder<T>) -> Option<T::Native> {
    let last = ArrayBuilder::len(builder).checked_sub(1)?;
    let valid = builder
        .validity_slice()
        .is_none_or(|bits| arrow_buffer::bit_util::get_bit(bits, last));
    valid.then(|| builder.values_slice()[last])
}

/// The last text appended to `builder`, `None` when it is null (or nothing was appended).
fn last_text(builder: &StringBuilder) -> Option<&str> {
    let last = ArrayBuilder::len(builder).checked_sub(1)?;
    if builder
        .validity_slice()
        .is_some_and(|bits| !arrow_buffer::bit_util::get_bit(bits, last))
    {
        return None;
    }
    let offsets = builder.offsets_slice();
    let bytes = &builder.values_slice()[offsets[last] as usize..offsets[last + 1] as usize];
    std::str::from_utf8(bytes).ok()
}

fn names(fields: &Fields) -> HashMap<String, usize> {
    fields
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name().clone(), i))
        .collect()
}

/// How a leaf's JSON values are read.
enum Leaf {
    Bool(BooleanBuilder),
    I8(Int8Builder),
    I16(Int16Builder),
    I32(Int32Builder),
    I64(Int64Builder),
    U8(UInt8Builder),
    U16(UInt16Builder),
    U32(UInt32Builder),
    U64(UInt64Builder),
    F32(Float32Builder),
    F64(Float64Builder),
    D128(Decimal128Builder, u8, i8),
    D256(Decimal256Builder, u8, i8),
    /// Text: strings only.
    Text(StringBuilder),
    /// Any JSON value as its text.
    Json(StringBuilder),
    /// A decimal of any scale as its text.
    DecimalText(StringBuilder),
    Binary(BinaryBuilder),
    Fixed(FixedSizeBinaryBuilder, i32),
    Uuid(FixedSizeBinaryBuilder),
    /// Days since the epoch; the Arrow type is `Date32`.
    Date(Int32Builder),
    /// A time of day in the unit; `Time32` (stored as i32) or `Time64`.
    Time32(Int32Builder, TimeUnit),
    Time64(Int64Builder, TimeUnit),
    /// A timestamp in the unit; with a zone when `zoned`.
    Timestamp(Int64Builder, TimeUnit, bool),
}

/// One column (or nested field) under construction.
enum Column {
    Leaf {
        leaf: Leaf,
        field: FieldRef,
    },
    List {
        item: Box<Column>,
        offsets: Vec<i32>,
        validity: NullBufferBuilder,
        field: FieldRef,
        item_field: FieldRef,
    },
    Struct {
        children: Vec<Column>,
        names: HashMap<String, usize>,
        validity: NullBufferBuilder,
        field: FieldRef,
        fields: Fields,
    },
    Map {
        keys: StringBuilder,
        values: Box<Column>,
        offsets: Vec<i32>,
        validity: NullBufferBuilder,
        field: FieldRef,
        entries: FieldRef,
    },
}

impl Column {
    fn new(field: &FieldRef, capacity: usize) -> Self {
        use DataType::*;
        let leaf = |leaf| Column::Leaf {
            leaf,
            field: field.clone(),
        };
        match field.data_type() {
            Boolean => leaf(Leaf::Bool(BooleanBuilder::with_capacity(capacity))),
            Int8 => leaf(Leaf::I8(Int8Builder::with_capacity(capacity))),
            Int16 => leaf(Leaf::I16(Int16Builder::with_capacity(capacity))),
            Int32 => leaf(Leaf::I32(Int32Builder::with_capacity(capacity))),
            Int64 => leaf(Leaf::I64(Int64Builder::with_capacity(capacity))),
            UInt8 => leaf(Leaf::U8(UInt8Builder::with_capacity(capacity))),
            UInt16 => leaf(Leaf::U16(UInt16Builder::with_capacity(capacity))),
            UInt32 => leaf(Leaf::U32(UInt32Builder::with_capacity(capacity))),
            UInt64 => leaf(Leaf::U64(UInt64Builder::with_capacity(capacity))),
            Float32 => leaf(Leaf::F32(Float32Builder::with_capacity(capacity))),
            Float64 => leaf(Leaf::F64(Float64Builder::with_capacity(capacity))),
            Decimal128(p, s) => leaf(Leaf::D128(
                Decimal128Builder::with_capacity(capacity).with_data_type(Decimal128(*p, *s)),
                *p,
                *s,
            )),
            Decimal256(p, s) => leaf(Leaf::D256(
                Decimal256Builder::with_capacity(capacity).with_data_type(Decimal256(*p, *s)),
                *p,
                *s,
            )),
            Utf8 => leaf(match mark(field) {
                Some(Mark::Json) => {
                    Leaf::Json(StringBuilder::with_capacity(capacity, capacity * 32))
                }
                Some(Mark::DecimalText) => Leaf::DecimalText(StringBuilder::new()),
                _ => Leaf::Text(StringBuilder::with_capacity(capacity, capacity * 16)),
            }),
            Binary => leaf(Leaf::Binary(BinaryBuilder::new())),
            FixedSizeBinary(16) if mark(field) == Some(Mark::Uuid) => leaf(Leaf::Uuid(
                FixedSizeBinaryBuilder::with_capacity(capacity, 16),
            )),
            FixedSizeBinary(n) => leaf(Leaf::Fixed(
                FixedSizeBinaryBuilder::with_capacity(capacity, *n),
                *n,
            )),
            Date32 => leaf(Leaf::Date(Int32Builder::with_capacity(capacity))),
            Time32(unit) => leaf(Leaf::Time32(Int32Builder::with_capacity(capacity), *unit)),
            Time64(unit) => leaf(Leaf::Time64(Int64Builder::with_capacity(capacity), *unit)),
            Timestamp(unit, zone) => leaf(Leaf::Timestamp(
                Int64Builder::with_capacity(capacity),
                *unit,
                zone.is_some(),
            )),
            List(item) => Column::List {
                item: Box::new(Column::new(item, capacity)),
                offsets: vec![0],
                validity: NullBufferBuilder::new(capacity),
                field: field.clone(),
                item_field: item.clone(),
            },
            Struct(fields) => Column::Struct {
                children: fields.iter().map(|f| Column::new(f, capacity)).collect(),
                names: names(fields),
                validity: NullBufferBuilder::new(capacity),
                field: field.clone(),
                fields: fields.clone(),
            },
            Map(entries, _) => {
                let DataType::Struct(kv) = entries.data_type() else {
                    unreachable!("a map's entries are a struct");
                };
                Column::Map {
                    keys: StringBuilder::new(),
                    values: Box::new(Column::new(&kv[1], capacity)),
                    offsets: vec![0],
                    validity: NullBufferBuilder::new(capacity),
                    field: field.clone(),
                    entries: entries.clone(),
                }
            }
            // The declared types are the ones `json_types` makes.
            other => unreachable!("the JSON decoding does not declare {other}"),
        }
    }

    fn field(&self) -> &FieldRef {
        match self {
            Column::Leaf { field, .. }
            | Column::List { field, .. }
            | Column::Struct { field, .. }
            | Column::Map { field, .. } => field,
        }
    }

    /// Appends a null, or refuses one where the field (at `path` of it, made only then) is not nullable.
    fn append_null<E: serde::de::Error>(
        &mut self,
        path: impl FnOnce(&Field) -> String,
    ) -> Result<(), E> {
        if !self.field().is_nullable() {
            return Err(E::custom(format!(
                "field `{}` is null or missing, and it is declared not nullable",
                path(self.field())
            )));
        }
        self.append_masked_null();
        Ok(())
    }

    /// Appends a null unchecked: under a null parent (whatever the field declares), or once checked.
    fn append_masked_null(&mut self) {
        match self {
            Column::Leaf { leaf, .. } => leaf.append_null(),
            Column::List {
                offsets, validity, ..
            }
            | Column::Map {
                offsets, validity, ..
            } => {
                offsets.push(*offsets.last().unwrap_or(&0));
                validity.append_null();
            }
            Column::Struct {
                children, validity, ..
            } => {
                for child in children {
                    child.append_masked_null();
                }
                validity.append_null();
            }
        }
    }

    fn finish(self) -> Result<ArrayRef, String> {
        Ok(match self {
            Column::Leaf { leaf, field } => leaf.finish(field.data_type())?,
            Column::List {
                item,
                offsets,
                mut validity,
                item_field,
                ..
            } => Arc::new(
                ListArray::try_new(
                    item_field,
                    OffsetBuffer::new(ScalarBuffer::from(offsets)),
                    item.finish()?,
                    validity.finish(),
                )
                .map_err(|e| e.to_string())?,
            ),
            Column::Struct {
                children,
                mut validity,
                fields,
                ..
            } => {
                let columns = children
                    .into_iter()
                    .map(Column::finish)
                    .collect::<Result<Vec<_>, _>>()?;
                Arc::new(
                    StructArray::try_new(fields, columns, validity.finish())
                        .map_err(|e| e.to_string())?,
                )
            }
            Column::Map {
                mut keys,
                values,
                offsets,
                mut validity,
                entries,
                ..
            } => {
                let DataType::Struct(kv) = entries.data_type() else {
                    unreachable!("a map's entries are a struct");
                };
                let entry_array = StructArray::try_new(
                    kv.clone(),
                    vec![Arc::new(keys.finish()), values.finish()?],
                    None,
                )
                .map_err(|e| e.to_string())?;
                Arc::new(
                    MapArray::try_new(
                        entries,
                        OffsetBuffer::new(ScalarBuffer::from(offsets)),
                        entry_array,
                        validity.finish(),
                        false,
                    )
                    .map_err(|e| e.to_string())?,
                )
            }
        })
    }
}

impl Leaf {
    fn append_null(&mut self) {
        match self {
            Leaf::Bool(b) => b.append_null(),
            Leaf::I8(b) => b.append_null(),
            Leaf::I16(b) => b.append_null(),
            Leaf::I32(b) | Leaf::Date(b) | Leaf::Time32(b, _) => b.append_null(),
            Leaf::I64(b) | Leaf::Time64(b, _) | Leaf::Timestamp(b, _, _) => b.append_null(),
            Leaf::U8(b) => b.append_null(),
            Leaf::U16(b) => b.append_null(),
            Leaf::U32(b) => b.append_null(),
            Leaf::U64(b) => b.append_null(),
            Leaf::F32(b) => b.append_null(),
            Leaf::F64(b) => b.append_null(),
            Leaf::D128(b, ..) => b.append_null(),
            Leaf::D256(b, ..) => b.append_null(),
            Leaf::Text(b) | Leaf::Json(b) | Leaf::DecimalText(b) => b.append_null(),
            Leaf::Binary(b) => b.append_null(),
            Leaf::Fixed(b, _) | Leaf::Uuid(b) => b.append_null(),
        }
    }

    fn finish(self, ty: &DataType) -> Result<ArrayRef, String> {
        let retyped = |array: ArrayRef| -> Result<ArrayRef, String> {
            let data = array
                .into_data()
                .into_builder()
                .data_type(ty.clone())
                .build()
                .map_err(|e| e.to_string())?;
            Ok(make_array(data))
        };
        Ok(match self {
            Leaf::Bool(mut b) => Arc::new(b.finish()),
            Leaf::I8(mut b) => Arc::new(b.finish()),
            Leaf::I16(mut b) => Arc::new(b.finish()),
            Leaf::I32(mut b) => Arc::new(b.finish()),
            Leaf::I64(mut b) => Arc::new(b.finish()),
            Leaf::U8(mut b) => Arc::new(b.finish()),
            Leaf::U16(mut b) => Arc::new(b.finish()),
            Leaf::U32(mut b) => Arc::new(b.finish()),
            Leaf::U64(mut b) => Arc::new(b.finish()),
            Leaf::F32(mut b) => Arc::new(b.finish()),
            Leaf::F64(mut b) => Arc::new(b.finish()),
            Leaf::D128(mut b, ..) => Arc::new(b.finish()),
            Leaf::D256(mut b, ..) => Arc::new(b.finish()),
            Leaf::Text(mut b) | Leaf::Json(mut b) | Leaf::DecimalText(mut b) => {
                Arc::new(b.finish())
            }
            Leaf::Binary(mut b) => Arc::new(b.finish()),
            Leaf::Fixed(mut b, _) | Leaf::Uuid(mut b) => Arc::new(b.finish()),
            Leaf::Date(mut b) | Leaf::Time32(mut b, _) => retyped(Arc::new(b.finish()))?,
            Leaf::Time64(mut b, _) | Leaf::Timestamp(mut b, ..) => retyped(Arc::new(b.finish()))?,
        })
    }
}

/// `parent.name` for messages.
fn shown_path(parent: &str, field: &Field) -> String {
    connector_api::types::Refusal::new(field.name().as_str(), "")
        .under(parent)
        .path
}

/// A JSON value shown in a message: its text, cut at 64 characters.
fn shown(text: &str) -> String {
    let mut shown: String = text.chars().take(64).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}

/// Decodes a JSON object into struct children (or a row's columns).
struct ObjectSeed<'a, 'c> {
    columns: &'a mut [Column],
    names: &'a HashMap<String, usize>,
    unknown: UnknownFields,
    path: &'a str,
    /// The row's context (top level only).
    context: Option<&'a mut RowContext<'c>>,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path.is_empty() {
            true => f.write_str("a JSON object"),
            false => write!(f, "a JSON object for field `{}`", self.path),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let ObjectSeed {
            columns,
            names,
            unknown,
            path,
            mut context,
        } = self;
        let mut seen = Seen::new(columns.len());
        let mut next = 0;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            // Writers mostly send the fields in their declared order: the next one is tried before the map.
            let found = match columns.get(next) {
                Some(column) if column.field().name() == key.as_ref() => Some(next),
                _ => names.get(key.as_ref()).copied(),
            };
            let Some(i) = found else {
                match unknown {
                    UnknownFields::Ignore => {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                    UnknownFields::Fail => {
                        return Err(A::Error::custom(format!(
                            "has the field `{}`, which is not declared (unknown_fields = \"fail\")",
                            connector_api::types::Refusal::new(key.as_ref(), "")
                                .under(path)
                                .path
                        )));
                    }
                }
            };
            next = i + 1;
            if seen.mark(i) {
                return Err(A::Error::custom(format!(
                    "has the field `{}` twice",
                    shown_path(path, columns[i].field())
                )));
            }
            let semantic = context
                .as_ref()
                .and_then(|c| c.semantics)
                .and_then(|s| s.get(key.as_ref()))
                .copied()
                .or_else(|| {
                    let json_in_strings = context.as_ref().is_some_and(|c| c.json_in_strings);
                    json_in_strings.then_some(Semantic::JsonText)
                });
            let placeholder = context.as_ref().and_then(|c| c.placeholder);
            let unavailable = map.next_value_seed(ValueSeed {
                column: &mut columns[i],
                path,
                named: true,
                semantic,
                placeholder,
                unknown,
            })?;
            if unavailable && let Some(context) = context.as_mut() {
                context.unavailable.push(key.into_owned());
            }
        }
        for (i, column) in columns.iter_mut().enumerate() {
            if !seen.has(i) {
                column.append_null(|field| shown_path(path, field))?;
            }
        }
        Ok(())
    }
}

/// The fields of one object read so far: a bit each for up to 128 fields (no allocation per record), a vector
/// beyond.
enum Seen {
    Bits(u128),
    Many(Vec<bool>),
}

impl Seen {
    fn new(fields: usize) -> Self {
        match fields <= 128 {
            true => Self::Bits(0),
            false => Self::Many(vec![false; fields]),
        }
    }

    /// Marks field `i`; whether it was marked already.
    fn mark(&mut self, i: usize) -> bool {
        match self {
            Self::Bits(bits) => {
                let was = *bits & (1 << i) != 0;
                *bits |= 1 << i;
                was
            }
            Self::Many(seen) => std::mem::replace(&mut seen[i], true),
        }
    }

    fn has(&self, i: usize) -> bool {
        match self {
            Self::Bits(bits) => *bits & (1 << i) != 0,
            Self::Many(seen) => seen[i],
        }
    }
}

/// Decodes one value into its column; returns whether it was the placeholder of an unavailable value (appended
/// as null).
struct ValueSeed<'a> {
    column: &'a mut Column,
    /// The parent's path.
    path: &'a str,
    /// Whether the field is named in the path (not a list's item or a map's value, whose path is the parent's).
    named: bool,
    semantic: Option<Semantic>,
    placeholder: Option<&'a str>,
    unknown: UnknownFields,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        // The field's path is made only when it is needed (an error, or a nested value's fields): a value that
        // fits costs no allocation for it.
        let (parent, named) = (self.path, self.named);
        let path = move |field: &Field| match named {
            true => shown_path(parent, field),
            false => parent.to_string(),
        };
        // Read from its text: decimals keep every digit, JSON fields their exact text, and a placeholder is
        // recognised before the value is read as its type.
        let raw: &'de RawValue = serde::Deserialize::deserialize(deserializer)?;
        let text = raw.get();
        if text == "null" {
            self.column.append_null::<D::Error>(&path)?;
            return Ok(false);
        }
        if let Some(placeholder) = self.placeholder
            && is_placeholder(text, placeholder)
        {
            self.column.append_masked_null();
            return Ok(true);
        }
        if let Column::Leaf { leaf, field } = self.column {
            read_leaf(leaf, text, self.semantic).map_err(|why| {
                D::Error::custom(format!("field `{}` = {} {why}", path(field), shown(text)))
            })?;
            return Ok(false);
        }
        let path = path(self.column.field());
        match self.column {
            Column::Leaf { .. } => unreachable!("leaves are read above"),
            Column::List {
                item,
                offsets,
                validity,
                ..
            } => {
                let mut de = serde_json::Deserializer::from_str(text);
                let count = de
                    .deserialize_seq(ItemsSeed {
                        item,
                        path: &path,
                        unknown: self.unknown,
                    })
                    .map_err(|e| D::Error::custom(e.to_string()))?;
                offsets.push(offsets.last().unwrap_or(&0) + count);
                validity.append_non_null();
            }
            Column::Struct {
                children,
                names,
                validity,
                ..
            } => {
                let mut de = serde_json::Deserializer::from_str(text);
                ObjectSeed {
                    columns: children,
                    names,
                    unknown: self.unknown,
                    path: &path,
                    context: None,
                }
                .deserialize(&mut de)
                .map_err(|e| D::Error::custom(e.to_string()))?;
                validity.append_non_null();
            }
            Column::Map {
                keys,
                values,
                offsets,
                validity,
                ..
            } => {
                let mut de = serde_json::Deserializer::from_str(text);
                let count = de
                    .deserialize_map(EntriesSeed {
                        keys,
                        values,
                        path: &path,
                        unknown: self.unknown,
                    })
                    .map_err(|e| D::Error::custom(e.to_string()))?;
                offsets.push(offsets.last().unwrap_or(&0) + count);
                validity.append_non_null();
            }
        }
        Ok(false)
    }
}

/// Whether the JSON `text` is the placeholder: the string itself, or (for bytes) its base64.
fn is_placeholder(text: &str, placeholder: &str) -> bool {
    let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return false;
    };
    inner == placeholder || inner == base64::engine::general_purpose::STANDARD.encode(placeholder)
}

/// A list's items, each into `item`; the count.
struct ItemsSeed<'a> {
    item: &'a mut Column,
    path: &'a str,
    unknown: UnknownFields,
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = i32;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a JSON array for field `{}`", self.path)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<i32, A::Error> {
        let path = format!("{}[]", self.path);
        let mut count = 0;
        while seq
            .next_element_seed(ValueSeed {
                column: self.item,
                path: &path,
                named: false,
                semantic: None,
                placeholder: None,
                unknown: self.unknown,
            })?
            .is_some()
        {
            count += 1;
        }
        Ok(count)
    }
}

/// A map's entries: keys into `keys`, values into `values`; the count.
struct EntriesSeed<'a> {
    keys: &'a mut StringBuilder,
    values: &'a mut Column,
    path: &'a str,
    unknown: UnknownFields,
}

impl<'de> Visitor<'de> for EntriesSeed<'_> {
    type Value = i32;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a JSON object for the map field `{}`", self.path)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<i32, A::Error> {
        let path = format!("{}{{}}", self.path);
        let mut count = 0;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            self.keys.append_value(key.as_ref());
            map.next_value_seed(ValueSeed {
                column: self.values,
                path: &path,
                named: false,
                semantic: None,
                placeholder: None,
                unknown: self.unknown,
            })?;
            count += 1;
        }
        Ok(count)
    }
}

/// The largest integer every value up to which a float holds exactly (2^24 for f32, 2^53 for f64).
const F32_EXACT: f64 = 16_777_216.0;
const F64_EXACT: f64 = 9_007_199_254_740_992.0;

/// A JSON number's value as an integer, when it is one exactly.
fn integer(text: &str) -> Result<i128, String> {
    if let Ok(v) = text.parse::<i128>() {
        return Ok(v);
    }
    let float: f64 = text
        .parse()
        .map_err(|_| "is not a number (the field is declared as an integer)".to_string())?;
    if float.fract() == 0.0 && float.abs() <= F64_EXACT {
        return Ok(float as i128);
    }
    Err(match float.fract() == 0.0 {
        true => {
            "is an integer beyond 2^53 written with an exponent or point: write its digits".into()
        }
        false => "has a fraction, and the field is declared as an integer".into(),
    })
}

fn in_range<T: TryFrom<i128>>(v: i128, ty: &str) -> Result<T, String> {
    T::try_from(v).map_err(|_| format!("is out of the range of {ty}"))
}

/// The JSON string `text` holds, unescaped.
fn string(text: &str) -> Result<Cow<'_, str>, String> {
    if !text.starts_with('"') {
        return Err("is not a string".into());
    }
    match text.contains('\\') {
        false => Ok(Cow::Borrowed(&text[1..text.len() - 1])),
        true => serde_json::from_str::<String>(text)
            .map(Cow::Owned)
            .map_err(|e| e.to_string()),
    }
}

fn is_number(text: &str) -> bool {
    text.starts_with(|c: char| c == '-' || c.is_ascii_digit())
}

fn read_leaf(leaf: &mut Leaf, text: &str, semantic: Option<Semantic>) -> Result<(), String> {
    let number = |what: &str| match is_number(text) {
        true => Ok(()),
        false => Err(format!("is not a number (the field is declared as {what})")),
    };
    match leaf {
        Leaf::Bool(b) => match text {
            "true" => b.append_value(true),
            "false" => b.append_value(false),
            _ => return Err("is not true or false".into()),
        },
        Leaf::I8(b) => b.append_value(in_range(integer(text)?, "int8")?),
        Leaf::I16(b) => b.append_value(in_range(integer(text)?, "int16")?),
        Leaf::I32(b) => b.append_value(in_range(integer(text)?, "int32")?),
        Leaf::I64(b) => b.append_value(in_range(integer(text)?, "int64")?),
        Leaf::U8(b) => b.append_value(in_range(integer(text)?, "uint8")?),
        Leaf::U16(b) => b.append_value(in_range(integer(text)?, "uint16")?),
        Leaf::U32(b) => b.append_value(in_range(integer(text)?, "uint32")?),
        Leaf::U64(b) => b.append_value(in_range(integer(text)?, "uint64")?),
        Leaf::F32(b) => {
            number("float32")?;
            let value = float(text, F32_EXACT)? as f32;
            if !value.is_finite() {
                return Err("is out of the range of float32".into());
            }
            b.append_value(value)
        }
        Leaf::F64(b) => {
            number("float64")?;
            b.append_value(float(text, F64_EXACT)?)
        }
        Leaf::D128(b, p, s) => {
            let v = decimal(text, *p, *s, semantic)?;
            b.append_value(v.to_i128().ok_or("is out of range")?)
        }
        Leaf::D256(b, p, s) => b.append_value(decimal(text, *p, *s, semantic)?),
        Leaf::Text(b) => {
            let declare = match semantic {
                Some(Semantic::DecimalBytes(_)) => {
                    Some("decimal(p, s) with the column's precision and scale")
                }
                Some(Semantic::VariableDecimal) => Some("decimal"),
                Some(Semantic::Bytes) => Some("binary"),
                _ => None,
            };
            if let Some(declare) = declare {
                return Err(format!(
                    "is written in base64 (a Debezium decimal or bytes value), and the field is declared string: \
                     declare it {declare}"
                ));
            }
            b.append_value(string(text)?)
        }
        Leaf::Json(b) => {
            match semantic {
                Some(Semantic::JsonText) if text.starts_with('"') => {
                    let inner = string(text)?;
                    serde_json::from_str::<IgnoredAny>(&inner).map_err(|e| {
                    format!("is a string that is not JSON text ({e}), and the writer says it holds JSON")
                })?;
                    b.append_value(inner)
                }
                _ => b.append_value(text),
            }
        }
        Leaf::DecimalText(b) => b.append_value(decimal_text(text, semantic)?),
        Leaf::Binary(b) => b.append_value(base64(&string(text)?)?),
        Leaf::Fixed(b, n) => {
            let bytes = base64(&string(text)?)?;
            if bytes.len() != *n as usize {
                return Err(format!(
                    "has {} bytes, and the field holds exactly {n}",
                    bytes.len()
                ));
            }
            b.append_value(bytes).map_err(|e| e.to_string())?
        }
        Leaf::Uuid(b) => {
            let uuid = parse_uuid(&string(text)?).ok_or("is not a UUID")?;
            b.append_value(uuid).map_err(|e| e.to_string())?
        }
        Leaf::Date(b) => b.append_value(match is_number(text) {
            true => in_range(integer(text)?, "a date")?,
            false => {
                let text = string(text)?;
                let date = NaiveDate::parse_from_str(&text, "%Y-%m-%d").map_err(|_| {
                    "is not a date (YYYY-MM-DD, or days since 1970-01-01)".to_string()
                })?;
                (date - DateTime::UNIX_EPOCH.date_naive()).num_days() as i32
            }
        }),
        Leaf::Time32(b, unit) => b.append_value(in_range(
            time_of_day(text, *unit, semantic)?.into(),
            "a time",
        )?),
        Leaf::Time64(b, unit) => b.append_value(time_of_day(text, *unit, semantic)?),
        Leaf::Timestamp(b, unit, zoned) => {
            b.append_value(timestamp(text, *unit, *zoned, semantic)?)
        }
    }
    Ok(())
}

fn float(text: &str, exact: f64) -> Result<f64, String> {
    let v: f64 = text.parse().map_err(|_| "is not a number".to_string())?;
    let integral = !text.contains(['.', 'e', 'E']);
    if integral && v.abs() > exact {
        return Err(format!(
            "is an integer beyond {exact}, which the float does not hold exactly"
        ));
    }
    if !v.is_finite() {
        return Err("is out of the float's range".into());
    }
    Ok(v)
}

fn base64(text: &str) -> Result<Vec<u8>, String> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
    STANDARD
        .decode(text)
        .or_else(|_| STANDARD_NO_PAD.decode(text))
        .map_err(|_| "is not base64".to_string())
}

/// Sign, digits (no leading zeros) and scale of a decimal's text.
fn decimal_parts(text: &str) -> Result<(bool, String, u32), String> {
    decimal::parse(text).ok_or_else(|| "is not a decimal number".to_string())
}

/// The unscaled value of a decimal at scale `s` with at most `p` digits: exact, or an error.
fn decimal(text: &str, p: u8, s: i8, semantic: Option<Semantic>) -> Result<i256, String> {
    let (negative, digits, scale) = match semantic {
        Some(Semantic::DecimalBytes(scale)) => {
            let bytes = base64(&string(text)?)?;
            let unscaled = big_endian(&bytes)?;
            let text = unscaled.to_string();
            let (negative, digits) = match text.strip_prefix('-') {
                Some(d) => (true, d.trim_start_matches('0').to_string()),
                None => (false, text.trim_start_matches('0').to_string()),
            };
            (negative, digits, scale.max(0) as u32)
        }
        Some(Semantic::VariableDecimal) => decimal_parts(&variable_decimal(text)?)?,
        _ => match text.starts_with('"') {
            true => decimal_parts(&string(text)?)?,
            false => decimal_parts(text)?,
        },
    };
    let s = s.max(0) as u32;
    // Drop trailing zeros beyond the declared scale (they change nothing); anything else beyond it would be cut.
    let mut digits = digits;
    let mut scale = scale;
    while scale > s && digits.ends_with('0') {
        digits.pop();
        scale -= 1;
    }
    if scale > s {
        return Err(format!(
            "has more fractional digits than the declared scale {s} (it would be rounded)"
        ));
    }
    digits.push_str(&"0".repeat((s - scale) as usize));
    let digits = digits.trim_start_matches('0');
    if digits.len() > usize::from(p) {
        return Err(format!("has more digits than the declared precision {p}"));
    }
    let value =
        i256::from_string(if digits.is_empty() { "0" } else { digits }).ok_or("is out of range")?;
    Ok(if negative {
        value.wrapping_neg()
    } else {
        value
    })
}

/// A decimal of any scale as normalised text (no exponent).
fn decimal_text(text: &str, semantic: Option<Semantic>) -> Result<String, String> {
    let source = match semantic {
        Some(Semantic::VariableDecimal) => variable_decimal(text)?,
        Some(Semantic::DecimalBytes(scale)) => {
            let unscaled = big_endian(&base64(&string(text)?)?)?;
            decimal::text(unscaled, scale)
        }
        _ if text.starts_with('"') => string(text)?.into_owned(),
        _ => text.to_string(),
    };
    let (negative, digits, scale) = decimal_parts(&source)?;
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    let sign = if negative && digits.bytes().any(|d| d != b'0') {
        "-"
    } else {
        ""
    };
    Ok(match scale {
        0 => format!("{sign}{int}"),
        _ => format!("{sign}{int}.{frac}"),
    })
}

/// Debezium's `VariableScaleDecimal` (`{"scale": 2, "value": "<base64>"}`) as decimal text.
fn variable_decimal(text: &str) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    struct Variable {
        scale: i8,
        value: String,
    }
    let variable: Variable = serde_json::from_str(text).map_err(|_| {
        "is not a variable-scale decimal ({\"scale\": .., \"value\": ..})".to_string()
    })?;
    let unscaled = big_endian(&base64(&variable.value)?)?;
    Ok(decimal::text(unscaled, variable.scale))
}

/// A big-endian two's complement integer of up to 32 bytes.
fn big_endian(bytes: &[u8]) -> Result<i256, String> {
    if bytes.len() > 32 {
        return Err("has more than 32 bytes of unscaled value".into());
    }
    let fill = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
        0xff
    } else {
        0
    };
    let mut full = [fill; 32];
    full[32 - bytes.len()..].copy_from_slice(bytes);
    Ok(i256::from_be_bytes(full))
}

fn unit_nanos(unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => 1_000_000_000,
        TimeUnit::Millisecond => 1_000_000,
        TimeUnit::Microsecond => 1_000,
        TimeUnit::Nanosecond => 1,
    }
}

/// `value` in `from` as a count of `to`, exactly.
fn rescale(value: i64, from: TimeUnit, to: TimeUnit) -> Result<i64, String> {
    let (f, t) = (unit_nanos(from), unit_nanos(to));
    if f >= t {
        value
            .checked_mul(f / t)
            .ok_or_else(|| "is out of range".to_string())
    } else if value % (t / f) == 0 {
        Ok(value / (t / f))
    } else {
        Err(format!(
            "is finer than the declared unit ({to:?}): it would be cut"
        ))
    }
}

/// Nanoseconds of a fraction of a second, refusing digits finer than `unit`.
fn fraction_in(nanos: u32, unit: TimeUnit) -> Result<i64, String> {
    let nanos = i64::from(nanos);
    match nanos % unit_nanos(unit) {
        0 => Ok(nanos / unit_nanos(unit)),
        _ => Err(format!(
            "is finer than the declared unit ({unit:?}): it would be cut"
        )),
    }
}

fn time_of_day(text: &str, unit: TimeUnit, semantic: Option<Semantic>) -> Result<i64, String> {
    let value = match (semantic, is_number(text)) {
        (Some(Semantic::TimeOfDay(from)), true) => {
            rescale(in_range(integer(text)?, "a time")?, from, unit)?
        }
        (_, true) => in_range(integer(text)?, "a time")?,
        (_, false) => {
            let text = string(text)?;
            let time = NaiveTime::parse_from_str(&text, "%H:%M:%S%.f")
                .or_else(|_| NaiveTime::parse_from_str(&text, "%H:%M"))
                .map_err(|_| "is not a time of day (HH:MM:SS[.fraction])".to_string())?;
            let seconds = i64::from(time.num_seconds_from_midnight());
            seconds * (1_000_000_000 / unit_nanos(unit)) + fraction_in(time.nanosecond(), unit)?
        }
    };
    let day = 86_400 * (1_000_000_000 / unit_nanos(unit));
    match (0..day).contains(&value) {
        true => Ok(value),
        false => Err("is not within a day".into()),
    }
}

fn timestamp(
    text: &str,
    unit: TimeUnit,
    zoned: bool,
    semantic: Option<Semantic>,
) -> Result<i64, String> {
    if is_number(text) {
        let value = in_range(integer(text)?, "a timestamp")?;
        return match semantic {
            Some(Semantic::Instant(from)) => rescale(value, from, unit),
            _ => Ok(value),
        };
    }
    let text = string(text)?;
    let instant: NaiveDateTime = match DateTime::parse_from_rfc3339(&text) {
        Ok(with_offset) if zoned => with_offset.naive_utc(),
        Ok(_) => {
            return Err(
                "has an offset, and the field is a local date-time (timestamp): declare it timestamptz".into(),
            );
        }
        Err(_) => NaiveDateTime::parse_from_str(&text, "%Y-%m-%dT%H:%M:%S%.f")
            .or_else(|_| NaiveDateTime::parse_from_str(&text, "%Y-%m-%d %H:%M:%S%.f"))
            .map_err(|_| {
                "is not a date-time (RFC 3339, or YYYY-MM-DDTHH:MM:SS[.fraction])".to_string()
            })?,
    };
    let seconds = instant.and_utc().timestamp();
    seconds
        .checked_mul(1_000_000_000 / unit_nanos(unit))
        .and_then(|s| s.checked_add(fraction_in(instant.nanosecond(), unit).ok()?))
        .ok_or_else(|| format!("is out of range, or finer than the declared unit ({unit:?})"))
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Decimal128Type, Int64Type, TimestampMillisecondType};
    use arrow_schema::Schema;

    use super::*;
    use crate::json_types::JsonField;

    fn fields(declared: &[JsonField]) -> Fields {
        Schema::new(
            declared
                .iter()
                .map(|f| f.field().unwrap())
                .collect::<Vec<_>>(),
        )
        .fields()
        .clone()
    }

    fn decode(declared: &[JsonField], values: &[&str]) -> Result<Vec<ArrayRef>, String> {
        let mut rows = JsonRows::new(&fields(declared), UnknownFields::Ignore, 4);
        for value in values {
            rows.append(value.as_bytes(), &mut RowContext::default())?;
        }
        rows.finish()
    }

    #[test]
    fn fields_in_any_order_each_once_at_any_width() {
        for width in [3, 128, 130] {
            let declared: Vec<JsonField> = (0..width)
                .map(|i| JsonField::new(format!("f{i}"), "int64", true))
                .collect();
            let last = width - 1;
            let ordered = format!(r#"{{"f0": 0, "f1": 1, "f{last}": {last}}}"#);
            let reversed = format!(r#"{{"f{last}": {last}, "f1": 1, "f0": 0}}"#);
            let columns = decode(&declared, &[&ordered, &reversed]).unwrap();
            for row in 0..2 {
                for (i, column) in columns.iter().enumerate() {
                    let column = column.as_primitive::<Int64Type>();
                    match i == 0 || i == 1 || i == last {
                        true => assert_eq!(column.value(row), i as i64, "width {width}, f{i}"),
                        false => assert!(column.is_null(row), "width {width}, f{i}"),
                    }
                }
            }
            let twice = format!(r#"{{"f{last}": 1, "f0": 0, "f{last}": 2}}"#);
            let err = decode(&declared, &[&twice]).unwrap_err();
            assert!(
                err.contains(&format!("has the field `f{last}` twice")),
                "{err}"
            );
        }
    }

    #[test]
    fn integers_take_integers_only() {
        let n = [JsonField::new("n", "int64", true)];
        let columns = decode(
            &n,
            &[r#"{"n": 1}"#, r#"{"n": 1.0}"#, r#"{"n": 1e3}"#, r#"{}"#],
        )
        .unwrap();
        let n64 = columns[0].as_primitive::<Int64Type>();
        assert_eq!(
            (n64.value(0), n64.value(1), n64.value(2), n64.is_null(3)),
            (1, 1, 1000, true)
        );
        for (value, why) in [
            (r#"{"n": 1.5}"#, "fraction"),
            (r#"{"n": "12"}"#, "not a number"),
            (r#"{"n": 9223372036854775808}"#, "range"),
            (r#"{"n": true}"#, "not a number"),
        ] {
            let err = decode(&n, &[value]).unwrap_err();
            assert!(
                err.contains("field `n`") && err.contains(why),
                "{value}: {err}"
            );
        }
        let small = [JsonField::new("n", "int8", false)];
        assert!(
            decode(&small, &[r#"{"n": 128}"#])
                .unwrap_err()
                .contains("range")
        );
        assert!(
            decode(&small, &[r#"{}"#])
                .unwrap_err()
                .contains("not nullable")
        );
    }

    #[test]
    fn decimals_keep_every_digit_or_are_refused() {
        let d = [JsonField::new("d", "decimal(38, 4)", true)];
        let columns = decode(
            &d,
            &[
                r#"{"d": 1234567890123456789012345678901234.5678}"#,
                r#"{"d": "-0.5"}"#,
                r#"{"d": 1.50000}"#,
            ],
        )
        .unwrap();
        let d128 = columns[0].as_primitive::<Decimal128Type>();
        assert_eq!(
            d128.value_as_string(0),
            "1234567890123456789012345678901234.5678"
        );
        assert_eq!(d128.value_as_string(1), "-0.5000");
        assert_eq!(d128.value_as_string(2), "1.5000");
        assert!(
            decode(&d, &[r#"{"d": 0.12345}"#])
                .unwrap_err()
                .contains("scale")
        );
        let text = [JsonField::new("d", "decimal", true)];
        let columns = decode(&text, &[r#"{"d": 1.2300E+2}"#]).unwrap();
        assert_eq!(columns[0].as_string::<i32>().value(0), "123.00");
    }

    #[test]
    fn times_and_timestamps_are_exact_in_their_unit() {
        let t = [
            JsonField::new("t", "timestamptz(ms)", true),
            JsonField::new("l", "timestamp(ms)", true),
        ];
        let columns = decode(
            &t,
            &[r#"{"t": "1969-12-31T23:59:59.999Z", "l": "2024-05-01T12:00:00.123"}"#],
        )
        .unwrap();
        assert_eq!(
            columns[0]
                .as_primitive::<TimestampMillisecondType>()
                .value(0),
            -1
        );
        assert_eq!(
            columns[1]
                .as_primitive::<TimestampMillisecondType>()
                .value(0),
            1_714_564_800_123
        );
        let err = decode(&t, &[r#"{"t": "2024-05-01T12:00:00.1234Z"}"#]).unwrap_err();
        assert!(err.contains("finer"), "{err}");
        let err = decode(&t, &[r#"{"l": "2024-05-01T12:00:00Z"}"#]).unwrap_err();
        assert!(err.contains("offset"), "{err}");
    }

    #[test]
    fn nested_values_and_unknown_fields() {
        let item = crate::json_types::JsonItem {
            kind: "struct".into(),
            nullable: false,
            fields: vec![JsonField::new("qty", "int32", false)],
            items: None,
            values: None,
        };
        let lines = JsonField {
            items: Some(Box::new(item)),
            ..JsonField::new("lines", "list", true)
        };
        let columns = decode(
            std::slice::from_ref(&lines),
            &[r#"{"lines": [{"qty": 1}, {"qty": 2}], "x": 1}"#],
        )
        .unwrap();
        assert_eq!(columns[0].as_list::<i32>().value(0).len(), 2);
        let err = decode(
            std::slice::from_ref(&lines),
            &[r#"{"lines": [{"qty": 1.5}]}"#],
        )
        .unwrap_err();
        assert!(err.contains("field `lines[].qty`"), "{err}");
        let mut strict = JsonRows::new(&fields(&[lines]), UnknownFields::Fail, 1);
        let err = strict
            .append(br#"{"lines": null, "x": 1}"#, &mut RowContext::default())
            .unwrap_err();
        assert!(
            err.contains("field `x`") && err.contains("not declared"),
            "{err}"
        );
    }

    #[test]
    fn debezium_semantics_and_placeholders() {
        let declared = [
            JsonField::new("amount", "decimal(10, 2)", true),
            JsonField::new("note", "string", true),
            JsonField::new("doc", "json", true),
        ];
        let semantics = HashMap::from([("amount".to_string(), Semantic::DecimalBytes(2))]);
        let mut rows = JsonRows::new(&fields(&declared), UnknownFields::Ignore, 2);
        let mut context = RowContext {
            semantics: Some(&semantics),
            placeholder: Some("__debezium_unavailable_value"),
            json_in_strings: true,
            unavailable: Vec::new(),
        };
        // 12345 = 0x3039 -> 123.45; a JSON column's value is a string holding its JSON text.
        rows.append(
            br#"{"amount": "MDk=", "note": "__debezium_unavailable_value", "doc": "{\"a\": [1, \"\u00fc\"]}"}"#,
            &mut context,
        )
        .unwrap();
        assert_eq!(context.unavailable, ["note"]);
        let err = rows
            .append(
                br#"{"doc": "{not json"}"#,
                &mut RowContext {
                    json_in_strings: true,
                    ..RowContext::default()
                },
            )
            .unwrap_err();
        assert!(
            err.contains("`doc`") && err.contains("not JSON text"),
            "{err}"
        );
        let columns = rows.finish().unwrap();
        assert_eq!(
            columns[0]
                .as_primitive::<Decimal128Type>()
                .value_as_string(0),
            "123.45"
        );
        assert!(columns[1].is_null(0));
        assert_eq!(columns[2].as_string::<i32>().value(0), r#"{"a": [1, "ü"]}"#);
    }
}
