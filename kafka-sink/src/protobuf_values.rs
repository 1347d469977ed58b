//! Record values as Protobuf through a schema registry (`records.value_format = "protobuf"`): each row is one
//! `ratchet.Row` message ([`crate::protobuf_schema`]) in Confluent's wire format (`0x00`, the schema's 4-byte id,
//! the message-index path `[0]` as the single byte `0x00`, the message). The schema is registered under
//! `<topic>-value` as `.proto` source (the form every registry serves to every client; Apicurio serves a base64
//! descriptor back as it was given, which Confluent's Java deserializers cannot parse) before any record of it is
//! sent, its field numbers kept from the subject's latest version; confluent-kafka's `ProtobufDeserializer` reads
//! the values with a class compiled from it.
//!
//! Every value is written exactly or not at all: a null list or map (a repeated field has no null, it would read
//! back empty) or a null list item or map value fails the batch naming the row and field.

use std::collections::HashMap;

use arrow::buffer::NullBuffer;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    DurationMicrosecondType, DurationMillisecondType, DurationNanosecondType, DurationSecondType,
    Int8Type, Int16Type, Int32Type, Int64Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema, TimeUnit};
use connector_api::types::marks::{self, Mark};
use connector_api::{Error, ErrorKind, Phase, Result};
use prost_reflect::prost::Message;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, Value,
};
use schema_registry::{RegistrySettings, SchemaType};

use crate::protobuf_schema::{self, MESSAGE, PACKAGE};
use crate::registered_subject::RegisteredSubject;

/// The subject, and the schema registered last with its message.
pub(crate) struct ProtobufValues {
    subject: RegisteredSubject,
    registered: Option<Registered>,
}

struct Registered {
    fields: Fields,
    id: u32,
    row: MessageDescriptor,
}

impl ProtobufValues {
    /// Values of `topic` registered in the registry `settings` describe.
    ///
    /// # Errors
    /// As [`RegisteredSubject::new`].
    pub(crate) fn new(settings: &RegistrySettings, topic: &str) -> Result<Self> {
        Ok(Self {
            subject: RegisteredSubject::new(settings, topic)?,
            registered: None,
        })
    }

    /// Registers the Protobuf schema of `schema` under the subject unless it is the one registered last, its
    /// field numbers kept from the schema registered last (the subject's latest version, the first time).
    ///
    /// # Errors
    /// As [`RegisteredSubject::register`]; [`Retryable`](ErrorKind::Retryable) when the latest version cannot be
    /// fetched; [`Config`](ErrorKind::Config) when it is not a Protobuf schema Ratchet can read.
    pub(crate) async fn register(&mut self, schema: &Schema) -> Result<()> {
        if self
            .registered
            .as_ref()
            .is_some_and(|r| &r.fields == schema.fields())
        {
            return Ok(());
        }
        let previous = match &self.registered {
            Some(registered) => Some(registered.row.clone()),
            None => self.latest_row().await?,
        };
        let file = protobuf_schema::file(schema, previous.as_ref())
            .map_err(|why| Error::config(format!("the Kafka sink's Protobuf values: {why}")))?;
        let mut pool = DescriptorPool::global();
        pool.add_file_descriptor_proto(file.clone()).map_err(|e| {
            Error::config(format!(
                "the Kafka sink's Protobuf values: the columns do not make a valid Protobuf schema ({e}); rename \
                 the columns it names in a transform"
            ))
        })?;
        let row = pool
            .get_message_by_name(&format!("{PACKAGE}.{MESSAGE}"))
            .ok_or_else(|| Error::bug(Phase::Write, "the values' Protobuf schema has no Row"))?;
        let text = protobuf_schema::source(&file);
        let id = self.subject.register(&text, SchemaType::Protobuf).await?;
        self.registered = Some(Registered {
            fields: schema.fields().clone(),
            id,
            row,
        });
        Ok(())
    }

    /// The `Row` message of the subject's latest version, if it has one.
    async fn latest_row(&self) -> Result<Option<MessageDescriptor>> {
        let Some(latest) = self.subject.latest().await? else {
            return Ok(None);
        };
        let subject = self.subject.name();
        if latest.schema_type != SchemaType::Protobuf {
            return Err(Error::config(format!(
                "subject {subject} holds a {} schema; records.value_format = \"protobuf\" registers Protobuf \
                 (write to another topic, or pick the format the subject holds)",
                latest.schema_type
            )));
        }
        let file = schema_registry::protobuf::compile(self.subject.registry(), &latest)
            .await
            .map_err(|e| {
                let kind =
                    match &e {
                        schema_registry::protobuf::ProtobufSchemaError::Registry {
                            source, ..
                        } if !source.is_not_found() => ErrorKind::Retryable,
                        _ => ErrorKind::Config,
                    };
                Error::new(
                    kind,
                    Phase::Setup,
                    format!("the latest schema of subject {subject} cannot be read: {e}"),
                )
            })?;
        Ok(file
            .messages()
            .find(|m| m.full_name() == format!("{PACKAGE}.{MESSAGE}")))
    }

    /// Every row of `batch` as one Confluent-framed Protobuf message, with the schema registered last (which must
    /// be the batch's: [`register`](Self::register) first).
    pub(crate) fn encode(&self, batch: &RecordBatch) -> std::result::Result<Vec<Vec<u8>>, String> {
        let registered = self
            .registered
            .as_ref()
            .filter(|r| &r.fields == batch.schema().fields())
            .ok_or("the batch's schema is not registered")?;
        let fields: Vec<FieldDescriptor> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| {
                registered.row.get_field_by_name(f.name()).ok_or_else(|| {
                    format!("column {} has no field in the registered schema", f.name())
                })
            })
            .collect::<std::result::Result<_, _>>()?;
        let columns = fields
            .iter()
            .zip(batch.schema().fields())
            .zip(batch.columns())
            .map(|((descriptor, field), column)| {
                values(column, field, descriptor, None).map_err(|e| e.within(field.name()))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let mut message = DynamicMessage::new(registered.row.clone());
            for (descriptor, column) in fields.iter().zip(&columns) {
                if let Some(value) = &column[row] {
                    message.set_field(descriptor, value.clone());
                }
            }
            let mut value = Vec::with_capacity(message.encoded_len() + 6);
            value.push(0);
            value.extend(registered.id.to_be_bytes());
            value.push(0);
            message
                .encode(&mut value)
                .map_err(|e| format!("row {row} cannot be encoded: {e}"))?;
            out.push(value);
        }
        Ok(out)
    }
}

/// Why a value cannot be written: the field path (innermost first while it is built), the row, and why.
#[derive(Debug)]
struct ValueError {
    path: Vec<String>,
    row: usize,
    why: String,
}

impl ValueError {
    fn new(row: usize, why: impl Into<String>) -> Self {
        Self {
            path: Vec::new(),
            row,
            why: why.into(),
        }
    }

    fn within(mut self, name: &str) -> Self {
        self.path.push(name.to_string());
        self
    }

    /// This error of a list's item or a map's entry (`self.row` its index among all items) as the error of the row
    /// whose `offsets` hold it.
    fn of_row_holding(mut self, offsets: &[usize]) -> Self {
        self.row = offsets
            .partition_point(|o| *o <= self.row)
            .saturating_sub(1);
        self
    }
}

impl std::fmt::Display for ValueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path: Vec<&str> = self.path.iter().rev().map(String::as_str).collect();
        write!(
            f,
            "row {}: field `{}` {}",
            self.row,
            path.join("."),
            self.why
        )
    }
}

type Values = std::result::Result<Vec<Option<Value>>, ValueError>;

/// The rows where an enclosing struct is null (`None`: every row has its parents): a value there is not written,
/// whatever it is.
type Absent<'a> = Option<&'a NullBuffer>;

/// The Protobuf values of `array` (of Arrow field `field`, written as `descriptor`), one per row (`None` for a
/// null, left unset).
fn values(
    array: &ArrayRef,
    field: &Field,
    descriptor: &FieldDescriptor,
    absent: Absent<'_>,
) -> Values {
    if descriptor.is_map() {
        return map_values(array, descriptor, absent);
    }
    if descriptor.is_list() {
        return list_values(array, field, descriptor, absent);
    }
    item_values(array, field, &descriptor.kind(), absent)
}

/// Whether `row` of a column under `absent` has no parent struct.
fn parentless(absent: Absent<'_>, row: usize) -> bool {
    absent.is_some_and(|nulls| nulls.is_null(row))
}

fn list_values(
    array: &ArrayRef,
    field: &Field,
    descriptor: &FieldDescriptor,
    absent: Absent<'_>,
) -> Values {
    let (offsets, items, item_field): (Vec<usize>, ArrayRef, &Field) = match field.data_type() {
        DataType::List(item) => {
            let list = array.as_list::<i32>();
            let offsets = list.value_offsets().iter().map(|o| *o as usize).collect();
            (offsets, list.values().clone(), item)
        }
        DataType::LargeList(item) => {
            let list = array.as_list::<i64>();
            let offsets = list.value_offsets().iter().map(|o| *o as usize).collect();
            (offsets, list.values().clone(), item)
        }
        DataType::FixedSizeList(item, size) => {
            let list = array.as_fixed_size_list();
            let size = usize::try_from(*size).unwrap_or(0);
            let offsets = (0..=list.len())
                .map(|i| list.value_offset(0) as usize + i * size)
                .collect();
            (offsets, list.values().clone(), item)
        }
        other => return Err(ValueError::new(0, format!("is a {other}, not a list"))),
    };
    // Only the items the rows hold (a sliced list's values array holds others too), the offsets made theirs.
    let (first, last) = (offsets[0], offsets[offsets.len() - 1]);
    let items = items.slice(first, last - first);
    let offsets: Vec<usize> = offsets.iter().map(|o| o - first).collect();
    let items = item_values(&items, item_field, &descriptor.kind(), None)
        .map_err(|e| e.of_row_holding(&offsets))?;
    (0..array.len())
        .map(|row| {
            if parentless(absent, row) {
                return Ok(None);
            }
            if array.is_null(row) {
                return Err(not_null(row, "list", "a repeated field"));
            }
            let slice = &items[offsets[row]..offsets[row + 1]];
            let values = slice
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    item.clone().ok_or_else(|| {
                        ValueError::new(row, "has a null item, which a repeated field cannot hold")
                            .within(&format!("[{i}]"))
                    })
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok(Some(Value::List(values)))
        })
        .collect()
}

fn map_values(array: &ArrayRef, descriptor: &FieldDescriptor, absent: Absent<'_>) -> Values {
    let map = array.as_map();
    let Kind::Message(entry) = descriptor.kind() else {
        return Err(ValueError::new(0, "is a map without an entry message"));
    };
    let (key_field, value_field) = match map.entries().fields().iter().as_slice() {
        [k, v] => (k.clone(), v.clone()),
        _ => return Err(ValueError::new(0, "is a map without key and value")),
    };
    // Only the entries the rows hold (a sliced map's entries hold others too), the offsets made theirs.
    let offsets = map.value_offsets();
    let first = offsets[0] as usize;
    let count = offsets[offsets.len() - 1] as usize - first;
    let rows_of: Vec<usize> = offsets.iter().map(|o| *o as usize - first).collect();
    let (map_keys, map_values) = (
        map.keys().slice(first, count),
        map.values().slice(first, count),
    );
    let keys = item_values(
        &map_keys,
        &key_field,
        &entry.map_entry_key_field().kind(),
        None,
    )
    .map_err(|e| e.of_row_holding(&rows_of))?;
    let entries = item_values(
        &map_values,
        &value_field,
        &entry.map_entry_value_field().kind(),
        None,
    )
    .map_err(|e| e.of_row_holding(&rows_of))?;
    (0..array.len())
        .map(|row| {
            if parentless(absent, row) {
                return Ok(None);
            }
            if array.is_null(row) {
                return Err(not_null(row, "map", "a map field"));
            }
            let mut out = HashMap::new();
            for i in rows_of[row]..rows_of[row + 1] {
                let key = keys[i]
                    .as_ref()
                    .and_then(map_key)
                    .ok_or_else(|| ValueError::new(row, "has a null map key").within("{}"))?;
                let value = entries[i].clone().ok_or_else(|| {
                    ValueError::new(row, "has a null map value, which a map field cannot hold")
                        .within("{}")
                })?;
                out.insert(key, value);
            }
            Ok(Some(Value::Map(out)))
        })
        .collect()
}

fn not_null(row: usize, what: &str, holder: &str) -> ValueError {
    ValueError::new(
        row,
        format!(
            "is a null {what}, which {holder} cannot hold (it would read back empty): coalesce it in a transform"
        ),
    )
}

fn map_key(value: &Value) -> Option<MapKey> {
    Some(match value {
        Value::Bool(v) => MapKey::Bool(*v),
        Value::I32(v) => MapKey::I32(*v),
        Value::I64(v) => MapKey::I64(*v),
        Value::U32(v) => MapKey::U32(*v),
        Value::U64(v) => MapKey::U64(*v),
        Value::String(v) => MapKey::String(v.clone()),
        _ => return None,
    })
}

/// The values of a column of single values (a list's items, a map's keys or values) of Protobuf type `kind`.
fn item_values(array: &ArrayRef, field: &Field, kind: &Kind, absent: Absent<'_>) -> Values {
    let each = |value: &dyn Fn(usize) -> Value| -> Values {
        Ok((0..array.len())
            .map(|row| array.is_valid(row).then(|| value(row)))
            .collect())
    };
    match (field.data_type(), kind) {
        (DataType::Boolean, _) => {
            let a = array.as_boolean();
            each(&|i| Value::Bool(a.value(i)))
        }
        (DataType::Int8, _) => {
            let a = array.as_primitive::<Int8Type>();
            each(&|i| Value::I32(a.value(i).into()))
        }
        (DataType::Int16, _) => {
            let a = array.as_primitive::<Int16Type>();
            each(&|i| Value::I32(a.value(i).into()))
        }
        (DataType::Int32, _) => {
            let a = array.as_primitive::<Int32Type>();
            each(&|i| Value::I32(a.value(i)))
        }
        (DataType::Int64, _) => {
            let a = array.as_primitive::<Int64Type>();
            each(&|i| Value::I64(a.value(i)))
        }
        (DataType::UInt8, _) => {
            let a = array.as_primitive::<UInt8Type>();
            each(&|i| Value::U32(a.value(i).into()))
        }
        (DataType::UInt16, _) => {
            let a = array.as_primitive::<UInt16Type>();
            each(&|i| Value::U32(a.value(i).into()))
        }
        (DataType::UInt32, _) => {
            let a = array.as_primitive::<UInt32Type>();
            each(&|i| Value::U32(a.value(i)))
        }
        (DataType::UInt64, _) => {
            let a = array.as_primitive::<UInt64Type>();
            each(&|i| Value::U64(a.value(i)))
        }
        (DataType::Float32, _) => {
            let a = array.as_primitive::<arrow_array::types::Float32Type>();
            each(&|i| Value::F32(a.value(i)))
        }
        (DataType::Float64, _) => {
            let a = array.as_primitive::<arrow_array::types::Float64Type>();
            each(&|i| Value::F64(a.value(i)))
        }
        (DataType::Utf8, _) => {
            let a = array.as_string::<i32>();
            each(&|i| Value::String(a.value(i).to_string()))
        }
        (DataType::LargeUtf8, _) => {
            let a = array.as_string::<i64>();
            each(&|i| Value::String(a.value(i).to_string()))
        }
        (DataType::FixedSizeBinary(16), Kind::String) if marks::mark(field) == Some(Mark::Uuid) => {
            let a = array.as_fixed_size_binary();
            each(&|i| Value::String(marks::uuid_text(a.value(i))))
        }
        (DataType::Binary, _) => {
            let a = array.as_binary::<i32>();
            each(&|i| Value::Bytes(a.value(i).to_vec().into()))
        }
        (DataType::LargeBinary, _) => {
            let a = array.as_binary::<i64>();
            each(&|i| Value::Bytes(a.value(i).to_vec().into()))
        }
        (DataType::BinaryView, _) => {
            let a = array.as_binary_view();
            each(&|i| Value::Bytes(a.value(i).to_vec().into()))
        }
        (DataType::FixedSizeBinary(_), _) => {
            let a = array.as_fixed_size_binary();
            each(&|i| Value::Bytes(a.value(i).to_vec().into()))
        }
        (DataType::Timestamp(unit, Some(_)), Kind::Message(m)) => {
            let (ticks, per_second) = ticks(array, unit, false);
            each(&|i| seconds_and_nanos(m, ticks[i], per_second, false))
        }
        (DataType::Duration(unit), Kind::Message(m)) => {
            let (ticks, per_second) = ticks(array, unit, true);
            each(&|i| seconds_and_nanos(m, ticks[i], per_second, true))
        }
        (DataType::Struct(fields), Kind::Message(m)) => struct_values(array, fields, m, absent),
        (_, Kind::String) => {
            // Every other type as its exact text (decimals, dates, times, local timestamps, enums).
            let formatter = ArrayFormatter::try_new(array.as_ref(), &FormatOptions::default())
                .map_err(|e| ValueError::new(0, format!("cannot be written as text: {e}")))?;
            each(&|i| Value::String(formatter.value(i).to_string()))
        }
        (other, kind) => Err(ValueError::new(
            0,
            format!("has type {other}, which is not written as Protobuf {kind:?}"),
        )),
    }
}

fn struct_values(
    array: &ArrayRef,
    fields: &Fields,
    message: &MessageDescriptor,
    absent: Absent<'_>,
) -> Values {
    let array = array.as_struct();
    // The children of a null struct have no parent either.
    let children_absent = NullBuffer::union(absent, array.nulls());
    let descriptors: Vec<FieldDescriptor> = fields
        .iter()
        .map(|f| {
            message
                .get_field_by_name(f.name())
                .ok_or_else(|| ValueError::new(0, format!("has no Protobuf field {}", f.name())))
        })
        .collect::<std::result::Result<_, _>>()?;
    let children = fields
        .iter()
        .zip(&descriptors)
        .zip(array.columns())
        .map(|((field, descriptor), column)| {
            values(column, field, descriptor, children_absent.as_ref())
                .map_err(|e| e.within(field.name()))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((0..array.len())
        .map(|row| {
            array.is_valid(row).then(|| {
                let mut out = DynamicMessage::new(message.clone());
                for (descriptor, child) in descriptors.iter().zip(&children) {
                    if let Some(value) = &child[row] {
                        out.set_field(descriptor, value.clone());
                    }
                }
                Value::Message(out)
            })
        })
        .collect())
}

/// The raw values of a timestamp or duration column and how many of them make a second.
fn ticks(array: &ArrayRef, unit: &TimeUnit, duration: bool) -> (Vec<i64>, i64) {
    let per_second = match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    };
    let values = match (duration, unit) {
        (false, TimeUnit::Second) => array
            .as_primitive::<TimestampSecondType>()
            .values()
            .to_vec(),
        (false, TimeUnit::Millisecond) => array
            .as_primitive::<TimestampMillisecondType>()
            .values()
            .to_vec(),
        (false, TimeUnit::Microsecond) => array
            .as_primitive::<TimestampMicrosecondType>()
            .values()
            .to_vec(),
        (false, TimeUnit::Nanosecond) => array
            .as_primitive::<TimestampNanosecondType>()
            .values()
            .to_vec(),
        (true, TimeUnit::Second) => array.as_primitive::<DurationSecondType>().values().to_vec(),
        (true, TimeUnit::Millisecond) => array
            .as_primitive::<DurationMillisecondType>()
            .values()
            .to_vec(),
        (true, TimeUnit::Microsecond) => array
            .as_primitive::<DurationMicrosecondType>()
            .values()
            .to_vec(),
        (true, TimeUnit::Nanosecond) => array
            .as_primitive::<DurationNanosecondType>()
            .values()
            .to_vec(),
    };
    (values, per_second)
}

/// A `Timestamp` (nanos never negative) or `Duration` (nanos of the seconds' sign) message of `ticks`.
fn seconds_and_nanos(
    message: &MessageDescriptor,
    ticks: i64,
    per_second: i64,
    duration: bool,
) -> Value {
    let (seconds, rest) = if duration {
        (ticks / per_second, ticks % per_second)
    } else {
        (ticks.div_euclid(per_second), ticks.rem_euclid(per_second))
    };
    let nanos = rest * (1_000_000_000 / per_second);
    let mut out = DynamicMessage::new(message.clone());
    out.set_field_by_number(1, Value::I64(seconds));
    out.set_field_by_number(2, Value::I32(i32::try_from(nanos).unwrap_or(0)));
    Value::Message(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{Int64Builder, ListBuilder};
    use arrow_schema::Fields;

    use super::*;

    /// Values whose schema `schema` is registered (as id 5) without a registry being asked.
    fn registered(schema: &Schema) -> ProtobufValues {
        let mut values =
            ProtobufValues::new(&RegistrySettings::new("http://127.0.0.1:9/"), "t").unwrap();
        let mut pool = DescriptorPool::global();
        pool.add_file_descriptor_proto(protobuf_schema::file(schema, None).unwrap())
            .unwrap();
        values.registered = Some(Registered {
            fields: schema.fields().clone(),
            id: 5,
            row: pool.get_message_by_name("ratchet.Row").unwrap(),
        });
        values
    }

    #[test]
    fn rows_are_framed_messages_and_a_null_list_fails_naming_row_and_field() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("ns", DataType::new_list(DataType::Int64, true), true),
        ]));
        let values = registered(&schema);
        let mut lists = ListBuilder::new(Int64Builder::new());
        lists.values().append_value(7);
        lists.append(true);
        lists.append(false);
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(arrow_array::Int64Array::from(vec![Some(0), None])),
                Arc::new(lists.finish()),
            ],
        )
        .unwrap();
        let why = values.encode(&batch).unwrap_err();
        assert!(
            why.contains("row 1") && why.contains("field `ns`") && why.contains("null list"),
            "{why}"
        );
        let first = values.encode(&batch.slice(0, 1)).unwrap();
        // 0x00, id 5, message index [0], then id = 0 (an optional set to zero is written) and ns = [7].
        assert_eq!(first[0][..6], [0, 0, 0, 0, 5, 0]);
        let row = values.registered.as_ref().unwrap().row.clone();
        let message = DynamicMessage::decode(row, &first[0][6..]).unwrap();
        assert!(message.has_field_by_name("id"));
        assert_eq!(
            message.get_field_by_name("ns").unwrap().as_list().unwrap(),
            [Value::I64(7)]
        );
    }

    #[test]
    fn a_null_list_under_a_null_struct_is_no_error_and_item_errors_name_their_row() {
        let inner = Fields::from(vec![Field::new(
            "tags",
            DataType::new_list(DataType::Utf8, true),
            true,
        )]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Struct(inner.clone()), true),
            Field::new(
                "lines",
                DataType::new_list(DataType::Struct(inner.clone()), true),
                true,
            ),
        ]));
        let values = registered(&schema);
        let tags = |rows: &[Option<Vec<&str>>]| {
            let mut tags = ListBuilder::new(arrow_array::builder::StringBuilder::new());
            for row in rows {
                match row {
                    Some(items) => {
                        for item in items {
                            tags.values().append_value(item);
                        }
                        tags.append(true);
                    }
                    None => tags.append(false),
                }
            }
            Arc::new(tags.finish()) as ArrayRef
        };
        // Row 0: `s` null and its `tags` null (no error); row 1: `s.tags` ["a"].
        let s = arrow_array::StructArray::new(
            inner.clone(),
            vec![tags(&[None, Some(vec!["a"])])],
            Some(NullBuffer::from(vec![false, true])),
        );
        // `lines`: row 0 has three lines, row 1 one line whose `tags` is null: the error names row 1.
        let line_structs = arrow_array::StructArray::new(
            inner.clone(),
            vec![tags(&[Some(vec![]), Some(vec![]), Some(vec![]), None])],
            None,
        );
        let lines = arrow_array::ListArray::new(
            Arc::new(Field::new_list_field(DataType::Struct(inner), true)),
            arrow::buffer::OffsetBuffer::new(vec![0, 3, 4].into()),
            Arc::new(line_structs),
            None,
        );
        let batch = RecordBatch::try_new(schema, vec![Arc::new(s), Arc::new(lines)]).unwrap();
        let why = values.encode(&batch).unwrap_err();
        assert!(why.contains("row 1") && why.contains("null list"), "{why}");
        assert_eq!(values.encode(&batch.slice(0, 1)).unwrap().len(), 1);
    }
}
