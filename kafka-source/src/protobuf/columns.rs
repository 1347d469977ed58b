//! What a Protobuf message's fields become as columns (docs/types.md, "Protobuf"): each field's [`ProtoType`], its
//! Arrow field, and whether a writer's field can be read into a reader's column.
//!
//! A column is found by field *number*, the identity Protobuf itself keeps across versions: a field renamed in a
//! later schema stays on its column (the column keeps the reader schema's name).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{DataType, Field, FieldRef, Fields, TimeUnit};
use connector_api::types::marks::{self, Mark};
use prost_reflect::{EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor};

/// The zone of decoded `google.protobuf.Timestamp` instants.
pub(crate) const UTC: &str = "UTC";

/// A field's value type as the decoding reads it.
#[derive(Debug, Clone)]
pub(crate) enum ProtoType {
    Bool,
    Int32,
    Int64,
    UInt32,
    UInt64,
    Float32,
    Float64,
    Utf8,
    Binary,
    /// An enum: its value names in declaration order make the dictionary, the numbers index them.
    Enum(EnumDescriptor),
    /// `google.protobuf.Timestamp`, in microseconds (a finer value is refused per record).
    Timestamp,
    /// `google.protobuf.Duration`, in nanoseconds (exact).
    Duration,
    /// `google.protobuf.Struct`, `Value` or `ListValue`: the value's JSON text.
    Json,
    /// A `google.protobuf.*Value` wrapper: the wrapped scalar, null when the field is unset.
    Wrapper(Box<ProtoType>),
    /// A message: its fields, by number.
    Message(Vec<ProtoColumn>),
    /// A repeated field: its items (never null).
    List(Box<ProtoType>),
    /// A map field: its keys and values (never null).
    Map(Box<ProtoType>, Box<ProtoType>),
}

/// One field of a message read as a column.
#[derive(Debug, Clone)]
pub(crate) struct ProtoColumn {
    /// The column's name: the reader's field's, or the name its number had when the column was first made (a
    /// renamed field keeps its column, [`crate::renames`]).
    pub(crate) name: String,
    /// The reader's field: its number finds the writer's field.
    pub(crate) field: FieldDescriptor,
    /// Null when the writer did not set it (the field has presence: a message, `optional`, a `oneof` member).
    pub(crate) nullable: bool,
    pub(crate) kind: ProtoType,
}

impl ProtoColumn {
    /// The column's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// Names the columns at the paths of field numbers in `names` (from `path`, inside message columns, their items
/// and map values) as it says.
pub(crate) fn rename(
    columns: &mut [ProtoColumn],
    names: &std::collections::BTreeMap<Vec<u32>, String>,
    path: &mut Vec<u32>,
) {
    for column in columns {
        path.push(column.field.number());
        if let Some(name) = names.get(path.as_slice()) {
            column.name = name.clone();
        }
        rename_within(&mut column.kind, names, path);
        path.pop();
    }
}

fn rename_within(
    kind: &mut ProtoType,
    names: &std::collections::BTreeMap<Vec<u32>, String>,
    path: &mut Vec<u32>,
) {
    match kind {
        ProtoType::Message(columns) => rename(columns, names, path),
        ProtoType::List(item) => rename_within(item, names, path),
        ProtoType::Map(_, value) => rename_within(value, names, path),
        _ => {}
    }
}

/// The columns of `message`'s fields, in declaration order.
///
/// # Errors
/// The dotted path of a field no column type holds (a recursive message, a message without fields, a group)
/// and why, as the end of a sentence.
pub(crate) fn columns(message: &MessageDescriptor) -> Result<Vec<ProtoColumn>, String> {
    message_columns(message, &mut vec![message.full_name().to_string()], "")
}

fn message_columns(
    message: &MessageDescriptor,
    within: &mut Vec<String>,
    prefix: &str,
) -> Result<Vec<ProtoColumn>, String> {
    message
        .fields()
        .map(|field| {
            let path = format!("{prefix}{}", field.name());
            let kind = field_type(&field, within, &path)?;
            Ok(ProtoColumn {
                name: field.name().to_string(),
                nullable: field.supports_presence() && !field.is_list() && !field.is_map(),
                field,
                kind,
            })
        })
        .collect()
}

fn field_type(
    field: &FieldDescriptor,
    within: &mut Vec<String>,
    path: &str,
) -> Result<ProtoType, String> {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return Err(format!("field `{path}` is a map without an entry message"));
        };
        let key = value_type(&entry.map_entry_key_field().kind(), within, path)?;
        let value = value_type(
            &entry.map_entry_value_field().kind(),
            within,
            &format!("{path}{{}}"),
        )?;
        return Ok(ProtoType::Map(Box::new(key), Box::new(value)));
    }
    let item = value_type(&field.kind(), within, path)?;
    Ok(if field.is_list() {
        ProtoType::List(Box::new(item))
    } else {
        item
    })
}

fn value_type(kind: &Kind, within: &mut Vec<String>, path: &str) -> Result<ProtoType, String> {
    Ok(match kind {
        Kind::Bool => ProtoType::Bool,
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => ProtoType::Int32,
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => ProtoType::Int64,
        Kind::Uint32 | Kind::Fixed32 => ProtoType::UInt32,
        Kind::Uint64 | Kind::Fixed64 => ProtoType::UInt64,
        Kind::Float => ProtoType::Float32,
        Kind::Double => ProtoType::Float64,
        Kind::String => ProtoType::Utf8,
        Kind::Bytes => ProtoType::Binary,
        Kind::Enum(e) => ProtoType::Enum(e.clone()),
        Kind::Message(m) => match m.full_name() {
            "google.protobuf.Timestamp" => ProtoType::Timestamp,
            "google.protobuf.Duration" => ProtoType::Duration,
            "google.protobuf.Struct" | "google.protobuf.Value" | "google.protobuf.ListValue" => {
                ProtoType::Json
            }
            "google.protobuf.DoubleValue" => wrapper(ProtoType::Float64),
            "google.protobuf.FloatValue" => wrapper(ProtoType::Float32),
            "google.protobuf.Int64Value" => wrapper(ProtoType::Int64),
            "google.protobuf.UInt64Value" => wrapper(ProtoType::UInt64),
            "google.protobuf.Int32Value" => wrapper(ProtoType::Int32),
            "google.protobuf.UInt32Value" => wrapper(ProtoType::UInt32),
            "google.protobuf.BoolValue" => wrapper(ProtoType::Bool),
            "google.protobuf.StringValue" => wrapper(ProtoType::Utf8),
            "google.protobuf.BytesValue" => wrapper(ProtoType::Binary),
            name => {
                if within.iter().any(|w| w == name) {
                    return Err(format!(
                        "field `{path}` is message {name}, which contains itself: a recursive message has no \
                         column type (declare it google.protobuf.Struct to keep it as JSON)"
                    ));
                }
                if m.fields().len() == 0 {
                    return Err(format!(
                        "field `{path}` is message {name}, which has no fields: no column type holds it"
                    ));
                }
                within.push(name.to_string());
                let fields = message_columns(m, within, &format!("{path}."));
                within.pop();
                ProtoType::Message(fields?)
            }
        },
    })
}

fn wrapper(inner: ProtoType) -> ProtoType {
    ProtoType::Wrapper(Box::new(inner))
}

/// The Arrow field of `column`.
pub(crate) fn arrow_field(column: &ProtoColumn) -> Field {
    typed_field(column.name(), &column.kind, column.nullable)
}

/// The Arrow fields of `columns`.
pub(crate) fn arrow_fields(columns: &[ProtoColumn]) -> Fields {
    columns.iter().map(arrow_field).collect()
}

fn typed_field(name: &str, kind: &ProtoType, nullable: bool) -> Field {
    let field = Field::new(name, arrow_type(kind), nullable);
    match kind {
        ProtoType::Json => marks::marked(field, Mark::Json),
        ProtoType::Enum(e) => {
            let names: Vec<String> = e.values().map(|v| v.name().to_string()).collect();
            field.with_metadata(HashMap::from([(
                marks::ENUM_SYMBOLS.to_string(),
                serde_json::to_string(&names).unwrap_or_default(),
            )]))
        }
        _ => field,
    }
}

/// The Arrow type of values of `kind`.
pub(crate) fn arrow_type(kind: &ProtoType) -> DataType {
    match kind {
        ProtoType::Bool => DataType::Boolean,
        ProtoType::Int32 => DataType::Int32,
        ProtoType::Int64 => DataType::Int64,
        ProtoType::UInt32 => DataType::UInt32,
        ProtoType::UInt64 => DataType::UInt64,
        ProtoType::Float32 => DataType::Float32,
        ProtoType::Float64 => DataType::Float64,
        ProtoType::Utf8 | ProtoType::Json => DataType::Utf8,
        ProtoType::Binary => DataType::Binary,
        ProtoType::Enum(_) => {
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
        }
        ProtoType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
        ProtoType::Duration => DataType::Duration(TimeUnit::Nanosecond),
        ProtoType::Wrapper(inner) => arrow_type(inner),
        ProtoType::Message(fields) => DataType::Struct(arrow_fields(fields)),
        ProtoType::List(item) => DataType::List(list_item(item)),
        ProtoType::Map(key, value) => DataType::Map(map_entries(key, value), false),
    }
}

/// The item field of a list of `item`s (never null: Protobuf has no null items).
pub(crate) fn list_item(item: &ProtoType) -> FieldRef {
    Arc::new(typed_field(Field::LIST_FIELD_DEFAULT_NAME, item, false))
}

/// The entries field of a map of `key`s to `value`s.
pub(crate) fn map_entries(key: &ProtoType, value: &ProtoType) -> FieldRef {
    Arc::new(Field::new(
        "entries",
        DataType::Struct(Fields::from(vec![
            typed_field("key", key, false),
            typed_field("value", value, false),
        ])),
        false,
    ))
}

/// Why values of the writer's `writer` type cannot be read into a column of the reader's `reader` type, if they
/// cannot: the same type, an exact widening (`int32` into `int64`, `uint32` into `uint64` or `int64`, `float`
/// into `double`), any enum into an enum (by number), and messages whose common fields (by number) read.
/// The writer's fields the reader lacks are listed in `added` by dotted path.
pub(crate) fn readable(
    writer: &ProtoType,
    reader: &ProtoType,
    path: &str,
    added: &mut Vec<String>,
) -> Result<(), String> {
    use ProtoType as P;
    match (writer, reader) {
        (P::Bool, P::Bool)
        | (P::Int32, P::Int32 | P::Int64)
        | (P::Int64, P::Int64)
        | (P::UInt32, P::UInt32 | P::UInt64 | P::Int64)
        | (P::UInt64, P::UInt64)
        | (P::Float32, P::Float32 | P::Float64)
        | (P::Float64, P::Float64)
        | (P::Utf8, P::Utf8)
        | (P::Binary, P::Binary)
        | (P::Enum(_), P::Enum(_))
        | (P::Timestamp, P::Timestamp)
        | (P::Duration, P::Duration)
        | (P::Json, P::Json) => Ok(()),
        (P::Wrapper(w), P::Wrapper(r)) => readable(w, r, path, added),
        (P::List(w), P::List(r)) => readable(w, r, &format!("{path}[]"), added),
        (P::Map(wk, wv), P::Map(rk, rv)) => {
            readable(wk, rk, path, added)?;
            readable(wv, rv, &format!("{path}{{}}"), added)
        }
        (P::Message(w), P::Message(r)) => {
            let prefix = if path.is_empty() {
                String::new()
            } else {
                format!("{path}.")
            };
            fields_readable(w, r, &prefix, added)
        }
        _ => Err(format!(
            "field `{path}` is {} in the writer's schema and {} in the reader's",
            describe(writer),
            describe(reader)
        )),
    }
}

/// [`readable`] for the fields of two messages, matched by number.
pub(crate) fn fields_readable(
    writer: &[ProtoColumn],
    reader: &[ProtoColumn],
    prefix: &str,
    added: &mut Vec<String>,
) -> Result<(), String> {
    for w in writer {
        let path = format!("{prefix}{}", w.name());
        match reader.iter().find(|r| r.field.number() == w.field.number()) {
            None => added.push(path),
            Some(r) => readable(&w.kind, &r.kind, &path, added)?,
        }
    }
    Ok(())
}

/// How a writer changes the reader's columns ([`evolved_columns`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// A top-level field the reader lacks: a new nullable column.
    Added,
    /// A field the reader lacks inside a message column: the struct gains a nullable field.
    AddedNested,
    /// A scalar wider than the reader's (`int32` to `int64`, `float` to `double`).
    Widened,
    /// A field with presence (`optional`, a `oneof` member) where the reader's has none: the column takes nulls.
    Optional,
}

/// The reader's columns `reader` changed to read `writer` (by field number, as [`fields_readable`]): the writer's
/// fields the reader lacks appended (nullable), at the top level or inside message columns; a scalar the writer
/// widens given the writer's wider type; with `presence`, a field the writer gives presence made nullable (without,
/// a presence the reader lacks reads as the field's default, as before). Every change is listed in `changes` by
/// dotted path.
///
/// # Errors
/// A field whose type neither reads as the reader's nor widens it, as [`readable`] says.
pub(crate) fn evolved_columns(
    writer: &[ProtoColumn],
    reader: &[ProtoColumn],
    prefix: &str,
    presence: bool,
    changes: &mut Vec<(String, Change)>,
) -> Result<Vec<ProtoColumn>, String> {
    let mut columns = Vec::with_capacity(reader.len());
    for r in reader {
        let path = format!("{prefix}{}", r.name());
        match writer.iter().find(|w| w.field.number() == r.field.number()) {
            None => columns.push(r.clone()),
            Some(w) => {
                let kind = evolved_kind(&w.kind, &r.kind, &path, presence, changes)?;
                let nullable = r.nullable || (presence && w.nullable);
                if nullable && !r.nullable {
                    changes.push((path, Change::Optional));
                }
                columns.push(ProtoColumn {
                    kind,
                    nullable,
                    ..r.clone()
                });
            }
        }
    }
    for w in writer {
        if reader.iter().all(|r| r.field.number() != w.field.number()) {
            if let Some(r) = columns.iter().find(|c| c.name() == w.name()) {
                return Err(format!(
                    "adds field `{prefix}{}` (number {}), whose name the column of number {} has (a field renamed \
                     from it): the two would share one column; give the new field another name",
                    w.name(),
                    w.field.number(),
                    r.field.number()
                ));
            }
            let change = match prefix.is_empty() {
                true => Change::Added,
                false => Change::AddedNested,
            };
            changes.push((format!("{prefix}{}", w.name()), change));
            columns.push(ProtoColumn {
                nullable: true,
                ..w.clone()
            });
        }
    }
    Ok(columns)
}

/// The reader's column type `reader` changed to read the writer's `writer` type (see [`evolved_columns`]).
fn evolved_kind(
    writer: &ProtoType,
    reader: &ProtoType,
    path: &str,
    presence: bool,
    changes: &mut Vec<(String, Change)>,
) -> Result<ProtoType, String> {
    use ProtoType as P;
    match (writer, reader) {
        (P::Int64, P::Int32) | (P::Float64, P::Float32) => {
            changes.push((path.to_string(), Change::Widened));
            Ok(writer.clone())
        }
        (P::Wrapper(w), P::Wrapper(r)) => Ok(P::Wrapper(Box::new(evolved_kind(
            w, r, path, presence, changes,
        )?))),
        (P::List(w), P::List(r)) => Ok(P::List(Box::new(evolved_kind(
            w,
            r,
            &format!("{path}[]"),
            presence,
            changes,
        )?))),
        (P::Map(wk, wv), P::Map(rk, rv)) => {
            readable(wk, rk, path, &mut Vec::new())?;
            Ok(P::Map(
                rk.clone(),
                Box::new(evolved_kind(
                    wv,
                    rv,
                    &format!("{path}{{}}"),
                    presence,
                    changes,
                )?),
            ))
        }
        (P::Message(w), P::Message(r)) => Ok(P::Message(evolved_columns(
            w,
            r,
            &format!("{path}."),
            presence,
            changes,
        )?)),
        _ => {
            readable(writer, reader, path, &mut Vec::new())?;
            Ok(reader.clone())
        }
    }
}

fn describe(kind: &ProtoType) -> String {
    match kind {
        ProtoType::Enum(e) => format!("enum {}", e.full_name()),
        ProtoType::Message(_) => "a message".into(),
        ProtoType::List(item) => format!("a list of {}", describe(item)),
        ProtoType::Map(..) => "a map".into(),
        ProtoType::Wrapper(inner) => format!("a wrapped {}", describe(inner)),
        other => format!("{}", arrow_type(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn message(source: &str, name: &str) -> MessageDescriptor {
        let file = super::super::test_files::compiled(source).await;
        file.parent_pool().get_message_by_name(name).unwrap()
    }

    #[tokio::test]
    async fn each_protobuf_type_has_its_column_type() {
        let order = message(
            r#"syntax = "proto3"; package s;
            import "google/protobuf/timestamp.proto"; import "google/protobuf/duration.proto";
            import "google/protobuf/wrappers.proto"; import "google/protobuf/struct.proto";
            message Order {
              int64 id = 1; optional int32 qty = 2; uint64 big = 3; float ratio = 4; bytes raw = 5;
              enum Status { NEW = 0; PAID = 1; } Status status = 6;
              google.protobuf.Timestamp at = 7; google.protobuf.Duration took = 8;
              google.protobuf.StringValue note = 9; google.protobuf.Struct attrs = 10;
              message Line { string sku = 1; } repeated Line lines = 11; map<string, sint64> tags = 12;
              oneof pay { string card = 13; }
            }"#,
            "s.Order",
        )
        .await;
        let fields = arrow_fields(&columns(&order).unwrap());
        let line = Fields::from(vec![Field::new("sku", DataType::Utf8, false)]);
        let tags = Fields::from(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("value", DataType::Int64, false),
        ]);
        let want = [
            ("id", DataType::Int64, false),
            ("qty", DataType::Int32, true),
            ("big", DataType::UInt64, false),
            ("ratio", DataType::Float32, false),
            ("raw", DataType::Binary, false),
            (
                "status",
                arrow_type(&ProtoType::Enum(
                    order
                        .parent_pool()
                        .get_enum_by_name("s.Order.Status")
                        .unwrap(),
                )),
                false,
            ),
            (
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
                true,
            ),
            ("took", DataType::Duration(TimeUnit::Nanosecond), true),
            ("note", DataType::Utf8, true),
            ("attrs", DataType::Utf8, true),
            (
                "lines",
                DataType::new_list(DataType::Struct(line), false),
                false,
            ),
            (
                "tags",
                DataType::Map(
                    Arc::new(Field::new("entries", DataType::Struct(tags), false)),
                    false,
                ),
                false,
            ),
            ("card", DataType::Utf8, true),
        ];
        assert_eq!(fields.len(), want.len());
        for (field, (name, data_type, nullable)) in fields.iter().zip(want) {
            assert_eq!(
                (
                    field.name().as_str(),
                    field.data_type(),
                    field.is_nullable()
                ),
                (name, &data_type, nullable)
            );
        }
        assert_eq!(marks::mark(&fields[9]), Some(Mark::Json));
        assert_eq!(
            marks::enum_symbols(&fields[5]).unwrap(),
            ["NEW".to_string(), "PAID".to_string()]
        );
    }

    #[tokio::test]
    async fn recursive_and_empty_messages_are_refused_naming_the_field() {
        let tree = message(
            r#"syntax = "proto3"; message Tree { string name = 1; repeated Tree kids = 2; }"#,
            "Tree",
        )
        .await;
        let why = columns(&tree).unwrap_err();
        assert!(
            why.contains("`kids`") && why.contains("contains itself"),
            "{why}"
        );
        let empty = message(
            r#"syntax = "proto3"; message E {} message A { int32 id = 1; E e = 2; }"#,
            "A",
        )
        .await;
        assert!(columns(&empty).unwrap_err().contains("`e`"));
    }

    #[tokio::test]
    async fn writers_read_by_field_number_with_exact_widening_only() {
        let reader = message(
            r#"syntax = "proto3"; message A { int64 id = 1; string name = 2; message B { int32 x = 1; } B b = 3; }"#,
            "A",
        )
        .await;
        let writer = message(
            r#"syntax = "proto3"; message A { int32 id = 1; string title = 2; message B { int32 x = 1; int32 y = 2; } B b = 3; bool new = 4; }"#,
            "A",
        )
        .await;
        let (r, w) = (columns(&reader).unwrap(), columns(&writer).unwrap());
        let mut added = Vec::new();
        fields_readable(&w, &r, "", &mut added).unwrap();
        assert_eq!(added, ["b.y", "new"]);
        let mut added = Vec::new();
        let why = fields_readable(&r, &w, "", &mut added).unwrap_err();
        assert!(why.contains("`id`") && why.contains("Int64"), "{why}");
    }
}
