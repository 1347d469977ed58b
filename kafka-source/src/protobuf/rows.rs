//! Decoded Protobuf messages appended to Arrow builders, one builder per column (nested for messages, lists and
//! maps), each value read from the writer's message by the reader's field number and converted exactly.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, DurationNanosecondBuilder, Float32Builder, Float64Builder,
    Int32Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder, UInt32Builder,
    UInt64Builder,
};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, DictionaryArray, ListArray, MapArray, StringArray, StructArray};
use arrow_buffer::{NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, FieldRef, Fields, TimeUnit};
use prost_reflect::{DynamicMessage, MapKey, ReflectMessage, Value};

use super::columns::{ProtoColumn, ProtoType, UTC, arrow_fields, list_item, map_entries};

/// Why a value does not fit its column: the dotted path of the field (outermost last while it is built) and why.
#[derive(Debug)]
pub(crate) struct ValueError {
    path: Vec<String>,
    why: String,
}

impl ValueError {
    fn new(why: impl Into<String>) -> Self {
        Self {
            path: Vec::new(),
            why: why.into(),
        }
    }

    fn within(mut self, name: &str) -> Self {
        self.path.push(name.to_string());
        self
    }
}

impl std::fmt::Display for ValueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path: Vec<&str> = self.path.iter().rev().map(String::as_str).collect();
        write!(f, "field `{}` {}", path.join("."), self.why)
    }
}

/// A scalar value of a message, borrowed where it is text or bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scalar<'a> {
    Bool(bool),
    I32(i32),
    I64(i64),
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    /// An enum value's number.
    Enum(i32),
}

impl<'a> Scalar<'a> {
    /// `value` when it is a scalar.
    pub(crate) fn of(value: &'a Value) -> Option<Self> {
        Some(match value {
            Value::Bool(v) => Self::Bool(*v),
            Value::I32(v) => Self::I32(*v),
            Value::I64(v) => Self::I64(*v),
            Value::U32(v) => Self::U32(*v),
            Value::U64(v) => Self::U64(*v),
            Value::F32(v) => Self::F32(*v),
            Value::F64(v) => Self::F64(*v),
            Value::String(v) => Self::Str(v),
            Value::Bytes(v) => Self::Bytes(v),
            Value::EnumNumber(v) => Self::Enum(*v),
            Value::Message(_) | Value::List(_) | Value::Map(_) => return None,
        })
    }
}

/// One column's value of a row the wire fast path decoded.
pub(crate) enum Cell<'a> {
    /// Null (a field with presence, unset).
    Null,
    /// A scalar (a wrapper's value too).
    Scalar(Scalar<'a>),
    /// A `Timestamp` or `Duration`: seconds and nanoseconds.
    Time(i64, i32),
    /// A nested message: appends its row to the struct's rows.
    Message(FillRow<'a>),
}

/// Appends one row to a nested message's rows.
pub(crate) type FillRow<'a> = Box<dyn FnOnce(&mut MessageRows) -> Result<(), ValueError> + 'a>;

/// The columns of a message's fields under construction.
pub(crate) struct MessageRows {
    children: Vec<Child>,
    fields: Fields,
    len: usize,
}

/// One field's builder and how it is read.
struct Child {
    column: ProtoColumn,
    builder: Builder,
}

enum Builder {
    Bool(BooleanBuilder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    UInt32(UInt32Builder),
    UInt64(UInt64Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Utf8(StringBuilder),
    Binary(BinaryBuilder),
    Enum {
        keys: Int32Builder,
        names: ArrayRef,
        /// The position of each number's (first) name among `names`.
        positions: HashMap<i32, i32>,
        name: String,
    },
    Timestamp(TimestampMicrosecondBuilder),
    Duration(DurationNanosecondBuilder),
    Json(StringBuilder),
    Wrapper(Box<Builder>),
    Struct {
        rows: MessageRows,
        nulls: NullBufferBuilder,
    },
    List {
        offsets: Vec<i32>,
        items: Box<Builder>,
        field: FieldRef,
    },
    Map {
        offsets: Vec<i32>,
        keys: Box<Builder>,
        values: Box<Builder>,
        entries: FieldRef,
    },
}

impl MessageRows {
    /// Builders for up to `capacity` rows of `columns`.
    pub(crate) fn new(columns: &[ProtoColumn], capacity: usize) -> Self {
        Self {
            children: columns
                .iter()
                .map(|column| Child {
                    builder: Builder::new(&column.kind, capacity),
                    column: column.clone(),
                })
                .collect(),
            fields: arrow_fields(columns),
            len: 0,
        }
    }

    /// How many rows were appended.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `message`'s fields: each column's value is the writer's field of the same number (its default
    /// when unset and the writer's field has no presence; null when unset and it has, or when the writer has no such
    /// field and the column takes null).
    ///
    /// # Errors
    /// A value that does not fit its column. The builders are then unusable: some columns have the row.
    pub(crate) fn append(&mut self, message: &DynamicMessage) -> Result<(), ValueError> {
        let descriptor = message.descriptor();
        for child in &mut self.children {
            let reader = &child.column;
            let writer = descriptor.get_field(reader.field.number());
            // A writer field without presence always has a value (its default when unset): read as it is, also
            // into a nullable column (one a newer writer gave presence), where an unset field is null only if
            // the writer could tell.
            let appended = match writer {
                Some(writer)
                    if !reader.nullable
                        || !writer.supports_presence()
                        || message.has_field(&writer) =>
                {
                    child.builder.append(&message.get_field(&writer))
                }
                _ if reader.nullable => {
                    child.builder.append_null();
                    Ok(())
                }
                _ => child
                    .builder
                    .append(&Value::default_value_for_field(&reader.field)),
            };
            appended.map_err(|e| e.within(reader.name()))?;
        }
        self.len += 1;
        Ok(())
    }

    /// Appends one row given cell by cell (the wire fast path's values), one cell per column.
    ///
    /// # Errors
    /// A value that does not fit its column. The builders are then unusable: some columns have the row.
    pub(crate) fn append_cells(&mut self, cells: Vec<Cell<'_>>) -> Result<(), ValueError> {
        for (child, cell) in self.children.iter_mut().zip(cells) {
            let appended = match (cell, &mut child.builder) {
                (Cell::Null, builder) => {
                    builder.append_null();
                    Ok(())
                }
                (Cell::Scalar(value), Builder::Wrapper(inner)) => inner.append_scalar(value),
                (Cell::Scalar(value), builder) => builder.append_scalar(value),
                (Cell::Time(seconds, nanos), builder) => builder.append_time(seconds, nanos),
                (Cell::Message(fill), Builder::Struct { rows, nulls }) => {
                    fill(rows).map(|()| nulls.append_non_null())
                }
                (Cell::Message(_), _) => {
                    Err(ValueError::new("has a message where its column holds none"))
                }
            };
            appended.map_err(|e| e.within(child.column.name()))?;
        }
        self.len += 1;
        Ok(())
    }

    /// Appends a row of nulls (empty lists and maps where a column cannot be null), under a null struct.
    fn append_placeholder(&mut self) {
        for child in &mut self.children {
            child.builder.append_null();
        }
        self.len += 1;
    }

    /// The columns of every row appended.
    ///
    /// # Errors
    /// The arrays do not make a column of their type (a bug).
    pub(crate) fn finish(&mut self) -> Result<Vec<ArrayRef>, arrow_schema::ArrowError> {
        self.len = 0;
        self.children
            .iter_mut()
            .map(|child| child.builder.finish())
            .collect()
    }

    /// The Arrow fields of the columns.
    pub(crate) fn fields(&self) -> &Fields {
        &self.fields
    }
}

impl Builder {
    fn new(kind: &ProtoType, capacity: usize) -> Self {
        match kind {
            ProtoType::Bool => Self::Bool(BooleanBuilder::with_capacity(capacity)),
            ProtoType::Int32 => Self::Int32(Int32Builder::with_capacity(capacity)),
            ProtoType::Int64 => Self::Int64(Int64Builder::with_capacity(capacity)),
            ProtoType::UInt32 => Self::UInt32(UInt32Builder::with_capacity(capacity)),
            ProtoType::UInt64 => Self::UInt64(UInt64Builder::with_capacity(capacity)),
            ProtoType::Float32 => Self::Float32(Float32Builder::with_capacity(capacity)),
            ProtoType::Float64 => Self::Float64(Float64Builder::with_capacity(capacity)),
            ProtoType::Utf8 => Self::Utf8(StringBuilder::with_capacity(capacity, capacity * 16)),
            ProtoType::Binary => {
                Self::Binary(BinaryBuilder::with_capacity(capacity, capacity * 16))
            }
            ProtoType::Json => Self::Json(StringBuilder::with_capacity(capacity, capacity * 32)),
            ProtoType::Enum(e) => {
                let mut positions = HashMap::new();
                let mut names = Vec::new();
                for (position, value) in e.values().enumerate() {
                    positions
                        .entry(value.number())
                        .or_insert(i32::try_from(position).unwrap_or(i32::MAX));
                    names.push(value.name().to_string());
                }
                Self::Enum {
                    keys: Int32Builder::with_capacity(capacity),
                    names: Arc::new(StringArray::from(names)),
                    positions,
                    name: e.full_name().to_string(),
                }
            }
            ProtoType::Timestamp => Self::Timestamp(
                TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone(UTC),
            ),
            ProtoType::Duration => {
                Self::Duration(DurationNanosecondBuilder::with_capacity(capacity))
            }
            ProtoType::Wrapper(inner) => Self::Wrapper(Box::new(Self::new(inner, capacity))),
            ProtoType::Message(fields) => Self::Struct {
                rows: MessageRows::new(fields, capacity),
                nulls: NullBufferBuilder::new(capacity),
            },
            ProtoType::List(item) => Self::List {
                offsets: offsets(capacity),
                items: Box::new(Self::new(item, capacity)),
                field: list_item(item),
            },
            ProtoType::Map(key, value) => Self::Map {
                offsets: offsets(capacity),
                keys: Box::new(Self::new(key, capacity)),
                values: Box::new(Self::new(value, capacity)),
                entries: map_entries(key, value),
            },
        }
    }

    /// Appends null (an empty list or map, which cannot be null: only under a null struct).
    fn append_null(&mut self) {
        match self {
            Self::Bool(b) => b.append_null(),
            Self::Int32(b) => b.append_null(),
            Self::Int64(b) => b.append_null(),
            Self::UInt32(b) => b.append_null(),
            Self::UInt64(b) => b.append_null(),
            Self::Float32(b) => b.append_null(),
            Self::Float64(b) => b.append_null(),
            Self::Utf8(b) | Self::Json(b) => b.append_null(),
            Self::Binary(b) => b.append_null(),
            Self::Enum { keys, .. } => keys.append_null(),
            Self::Timestamp(b) => b.append_null(),
            Self::Duration(b) => b.append_null(),
            Self::Wrapper(inner) => inner.append_null(),
            Self::Struct { rows, nulls } => {
                rows.append_placeholder();
                nulls.append_null();
            }
            Self::List { offsets, .. } | Self::Map { offsets, .. } => {
                offsets.push(*offsets.last().unwrap_or(&0));
            }
        }
    }

    /// Appends `value`, converted exactly to the column's type.
    fn append(&mut self, value: &Value) -> Result<(), ValueError> {
        if let Some(scalar) = Scalar::of(value) {
            return self.append_scalar(scalar);
        }
        match (self, value) {
            (builder @ (Self::Timestamp(_) | Self::Duration(_)), Value::Message(m)) => {
                let (seconds, nanos) = seconds_and_nanos(m);
                builder.append_time(seconds, nanos)?;
            }
            (Self::Json(b), Value::Message(m)) => {
                let text = serde_json::to_string(m)
                    .map_err(|e| ValueError::new(format!("cannot be written as JSON ({e})")))?;
                b.append_value(text);
            }
            (Self::Wrapper(inner), Value::Message(m)) => {
                let wrapped = m
                    .get_field_by_number(1)
                    .ok_or_else(|| ValueError::new("is a wrapper message without a `value`"))?;
                inner.append(&wrapped)?;
            }
            (Self::Struct { rows, nulls }, Value::Message(m)) => {
                rows.append(m)?;
                nulls.append_non_null();
            }
            (Self::List { offsets, items, .. }, Value::List(values)) => {
                for (i, item) in values.iter().enumerate() {
                    items
                        .append(item)
                        .map_err(|e| e.within(&format!("[{i}]")))?;
                }
                push_offset(offsets, values.len())?;
            }
            (
                Self::Map {
                    offsets,
                    keys,
                    values,
                    ..
                },
                Value::Map(map),
            ) => {
                // Sorted by key: a record decodes to the same rows every time it is read.
                let mut entries: Vec<(&MapKey, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for (key, value) in &entries {
                    keys.append(&key_value(key))?;
                    values
                        .append(value)
                        .map_err(|e| e.within(&format!("{{{}}}", key_text(key))))?;
                }
                push_offset(offsets, entries.len())?;
            }
            (_, value) => {
                return Err(ValueError::new(format!(
                    "has a value ({value:?}) of another type than its column"
                )));
            }
        }
        Ok(())
    }

    /// Appends the `Timestamp` or `Duration` of `seconds` and `nanos`, exactly (a timestamp in microseconds, a
    /// duration in nanoseconds).
    ///
    /// # Errors
    /// A timestamp with nanoseconds that are not whole microseconds; a value past what the column's 64 bits hold.
    fn append_time(&mut self, seconds: i64, nanos: i32) -> Result<(), ValueError> {
        match self {
            Self::Timestamp(b) => b.append_value(micros(seconds, nanos)?),
            Self::Duration(b) => {
                let value = seconds
                    .checked_mul(1_000_000_000)
                    .and_then(|n| n.checked_add(i64::from(nanos)))
                    .ok_or_else(|| {
                        ValueError::new(format!(
                            "is a duration of {seconds} s, past what 64-bit nanoseconds hold"
                        ))
                    })?;
                b.append_value(value);
            }
            _ => return Err(ValueError::new("has a time where its column holds none")),
        }
        Ok(())
    }

    /// Appends scalar `value`, converted exactly to the column's type (an exact widening: `int32` into `int64`,
    /// `uint32` into `uint64` or `int64`, `float` into `double`).
    pub(crate) fn append_scalar(&mut self, value: Scalar<'_>) -> Result<(), ValueError> {
        match (self, value) {
            (Self::Bool(b), Scalar::Bool(v)) => b.append_value(v),
            (Self::Int32(b), Scalar::I32(v)) => b.append_value(v),
            (Self::Int64(b), Scalar::I64(v)) => b.append_value(v),
            (Self::Int64(b), Scalar::I32(v)) => b.append_value(i64::from(v)),
            (Self::Int64(b), Scalar::U32(v)) => b.append_value(i64::from(v)),
            (Self::UInt32(b), Scalar::U32(v)) => b.append_value(v),
            (Self::UInt64(b), Scalar::U64(v)) => b.append_value(v),
            (Self::UInt64(b), Scalar::U32(v)) => b.append_value(u64::from(v)),
            (Self::Float32(b), Scalar::F32(v)) => b.append_value(v),
            (Self::Float64(b), Scalar::F64(v)) => b.append_value(v),
            (Self::Float64(b), Scalar::F32(v)) => b.append_value(f64::from(v)),
            (Self::Utf8(b), Scalar::Str(v)) => b.append_value(v),
            (Self::Binary(b), Scalar::Bytes(v)) => b.append_value(v),
            (
                Self::Enum {
                    keys,
                    positions,
                    name,
                    ..
                },
                Scalar::Enum(n),
            ) => match positions.get(&n) {
                Some(position) => keys.append_value(*position),
                None => {
                    return Err(ValueError::new(format!(
                        "has number {n}, which enum {name} of the reader schema does not declare"
                    )));
                }
            },
            (_, value) => {
                return Err(ValueError::new(format!(
                    "has a value ({value:?}) of another type than its column"
                )));
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<ArrayRef, arrow_schema::ArrowError> {
        Ok(match self {
            Self::Bool(b) => Arc::new(b.finish()),
            Self::Int32(b) => Arc::new(b.finish()),
            Self::Int64(b) => Arc::new(b.finish()),
            Self::UInt32(b) => Arc::new(b.finish()),
            Self::UInt64(b) => Arc::new(b.finish()),
            Self::Float32(b) => Arc::new(b.finish()),
            Self::Float64(b) => Arc::new(b.finish()),
            Self::Utf8(b) | Self::Json(b) => Arc::new(b.finish()),
            Self::Binary(b) => Arc::new(b.finish()),
            Self::Enum { keys, names, .. } => Arc::new(DictionaryArray::<Int32Type>::try_new(
                keys.finish(),
                names.clone(),
            )?),
            Self::Timestamp(b) => Arc::new(b.finish()),
            Self::Duration(b) => Arc::new(b.finish()),
            Self::Wrapper(inner) => inner.finish()?,
            Self::Struct { rows, nulls } => {
                let fields = rows.fields().clone();
                let columns = rows.finish()?;
                Arc::new(StructArray::try_new(fields, columns, nulls.finish())?)
            }
            Self::List {
                offsets,
                items,
                field,
            } => {
                let offsets = take_offsets(offsets);
                Arc::new(ListArray::try_new(
                    field.clone(),
                    offsets,
                    items.finish()?,
                    None,
                )?)
            }
            Self::Map {
                offsets,
                keys,
                values,
                entries,
            } => {
                let DataType::Struct(fields) = entries.data_type() else {
                    unreachable!("map entries are a struct")
                };
                let pairs = StructArray::try_new(
                    fields.clone(),
                    vec![keys.finish()?, values.finish()?],
                    None,
                )?;
                Arc::new(MapArray::try_new(
                    entries.clone(),
                    take_offsets(offsets),
                    pairs,
                    None,
                    false,
                )?)
            }
        })
    }
}

fn offsets(capacity: usize) -> Vec<i32> {
    let mut offsets = Vec::with_capacity(capacity + 1);
    offsets.push(0);
    offsets
}

fn push_offset(offsets: &mut Vec<i32>, added: usize) -> Result<(), ValueError> {
    let last = *offsets.last().unwrap_or(&0);
    let next = i32::try_from(added)
        .ok()
        .and_then(|added| last.checked_add(added))
        .ok_or_else(|| ValueError::new("makes a batch's list or map past 2^31 items"))?;
    offsets.push(next);
    Ok(())
}

fn take_offsets(offsets: &mut Vec<i32>) -> OffsetBuffer<i32> {
    let done = std::mem::replace(offsets, vec![0]);
    OffsetBuffer::new(ScalarBuffer::from(done))
}

fn key_value(key: &MapKey) -> Value {
    match key {
        MapKey::Bool(v) => Value::Bool(*v),
        MapKey::I32(v) => Value::I32(*v),
        MapKey::I64(v) => Value::I64(*v),
        MapKey::U32(v) => Value::U32(*v),
        MapKey::U64(v) => Value::U64(*v),
        MapKey::String(v) => Value::String(v.clone()),
    }
}

/// A map key as it names an entry in errors.
fn key_text(key: &MapKey) -> String {
    match key {
        MapKey::String(v) => v.clone(),
        other => format!("{:?}", key_value(other)),
    }
}

/// `seconds` and `nanos` of a `Timestamp` or `Duration` message.
fn seconds_and_nanos(message: &DynamicMessage) -> (i64, i32) {
    let seconds = message
        .get_field_by_number(1)
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    let nanos = message
        .get_field_by_number(2)
        .and_then(|v| v.as_i32())
        .unwrap_or(0);
    (seconds, nanos)
}

/// A `Timestamp` of `seconds` and `nanos` as microseconds since the epoch.
///
/// # Errors
/// Nanoseconds that are not whole microseconds, or an instant past what 64-bit microseconds hold.
fn micros(seconds: i64, nanos: i32) -> Result<i64, ValueError> {
    if nanos % 1000 != 0 {
        return Err(ValueError::new(format!(
            "is a timestamp with nanoseconds ({seconds} s + {nanos} ns), and the column holds microseconds ({})",
            DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into()))
        )));
    }
    seconds
        .checked_mul(1_000_000)
        .and_then(|m| m.checked_add(i64::from(nanos / 1000)))
        .ok_or_else(|| {
            ValueError::new(format!(
                "is a timestamp of {seconds} s, past what 64-bit microseconds hold"
            ))
        })
}
