//! The Protobuf schema of the Kafka sink's whole-row values (`records.value_format = "protobuf"`): one proto3 file,
//! package `ratchet`, message `Row`, derived from the batches' Arrow schema (docs/types.md, "Kafka Protobuf"):
//!
//! - integers as `int32` / `int64` / `uint32` / `uint64`, floats as `float` / `double`, `Boolean` as `bool`,
//!   strings and binary as `string` / `bytes`;
//! - instants (timestamps with a zone) as `google.protobuf.Timestamp`, `Duration` as `google.protobuf.Duration`
//!   (both exact in every unit);
//! - what Protobuf has no scalar for, as its exact text in a `string`: decimals (`12.30`), dates, times,
//!   timestamps without a zone, UUIDs (canonical text), enums (the symbol);
//! - structs as nested messages, lists as `repeated`, maps as `map<K, V>`;
//! - a nullable scalar as proto3 `optional` (null stays distinct from zero); a struct is a message field, which
//!   has presence.
//!
//! Field numbers are kept across versions: a column keeps the number the subject's latest schema gives its name
//! (when the type is unchanged), a new column takes the next free number, and numbers of columns that are gone
//! are `reserved`, never reused.
//!
//! Refused (by `check-config` and at start, naming the field): unions, intervals, `Date64`, `Float16`, `Null`,
//! lists of lists or maps, maps whose values are lists or maps, map keys that are not integers, strings or
//! booleans, and field names that are not Protobuf identifiers. Names that collide in a message's scope (a map's
//! entry message `<Field>Entry` named like a field, an `optional` field's oneof `_<field>` named like a field, two
//! fields with one JSON name) are refused when the schema is registered, naming them. A struct's nested message
//! takes its field's name in CamelCase, numbered on (`Address2`) where that is taken.

use std::collections::{BTreeSet, HashMap};

use arrow_schema::{DataType, Field, Fields, Schema};
use connector_api::types::marks::{self, Mark};
use connector_api::types::{Refusal, describe, refuse_nested};
use prost_reflect::prost_types::field_descriptor_proto::{Label, Type};
use prost_reflect::prost_types::{
    DescriptorProto, FieldDescriptorProto, FileDescriptorProto, MessageOptions,
    OneofDescriptorProto, descriptor_proto::ReservedRange,
};
use prost_reflect::{Cardinality, Kind, MessageDescriptor};

/// The package of the values' message.
pub(crate) const PACKAGE: &str = "ratchet";
/// The values' message.
pub(crate) const MESSAGE: &str = "Row";
/// The name of the values' file.
const FILE: &str = "ratchet/row.proto";

/// Why values of `ty` are not written as Protobuf, if they are not (the walk into nested types is
/// [`refuse_nested`]'s).
pub(crate) fn refusal(field: &Field) -> Result<(), Refusal> {
    if !is_identifier(field.name()) {
        return Err(Refusal::new(
            "",
            "is not a Protobuf field name (letters, digits and `_`, not starting with a digit): rename it in a \
             transform",
        ));
    }
    refuse_nested(field.data_type(), &|t| {
        use DataType::*;
        let why = match t {
            Union(..) => "which Protobuf values do not hold here (planned)",
            Interval(_) | Date64 | Float16 | Null => "which has no Protobuf form here",
            List(item) | LargeList(item) | FixedSizeList(item, _)
                if is_repeated(item.data_type()) =>
            {
                "a list of lists or maps, which a repeated field cannot hold (planned)"
            }
            Map(..) => {
                let (key, value) = map_types(t)?;
                if is_repeated(value) {
                    "a map whose values are lists or maps, which a map field cannot hold (planned)"
                } else if !matches!(
                    key,
                    Int8 | Int16
                        | Int32
                        | Int64
                        | UInt8
                        | UInt16
                        | UInt32
                        | UInt64
                        | Utf8
                        | LargeUtf8
                        | Boolean
                ) {
                    "a map whose keys are not integers, strings or booleans, which Protobuf map keys are"
                } else {
                    return None;
                }
            }
            Struct(fields) => {
                return fields
                    .iter()
                    .find(|f| !is_identifier(f.name()))
                    .map(|f| {
                        Refusal::new(
                            f.name(),
                            "is not a Protobuf field name (letters, digits and `_`, not starting with a digit)",
                        )
                    });
            }
            _ => return None,
        };
        Some(Refusal::new("", format!("has type {}, {why}", describe(t))))
    })
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_repeated(ty: &DataType) -> bool {
    matches!(
        ty,
        DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::Map(..)
    )
}

/// The key and value types of map type `ty`.
pub(crate) fn map_types(ty: &DataType) -> Option<(&DataType, &DataType)> {
    match ty {
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => Some((kv[0].data_type(), kv[1].data_type())),
            _ => None,
        },
        _ => None,
    }
}

/// The file of rows of `schema`, numbering fields as `previous` (the subject's latest `Row`, if any) does.
///
/// # Errors
/// A field [`refusal`] refuses (checked at start already), as a message.
pub(crate) fn file(
    schema: &Schema,
    previous: Option<&MessageDescriptor>,
) -> Result<FileDescriptorProto, String> {
    if let Some(refused) = schema
        .fields()
        .iter()
        .find_map(|f| refusal(f).err().map(|r| r.under(f.name())))
    {
        return Err(refused.to_string());
    }
    let mut dependencies = BTreeSet::new();
    let row = message(
        MESSAGE,
        &format!(".{PACKAGE}.{MESSAGE}"),
        schema.fields(),
        previous,
        &mut dependencies,
    )?;
    Ok(FileDescriptorProto {
        name: Some(FILE.into()),
        package: Some(PACKAGE.into()),
        dependency: dependencies.into_iter().map(String::from).collect(),
        message_type: vec![row],
        syntax: Some("proto3".into()),
        ..Default::default()
    })
}

/// The message `name` (full name `full`, with a leading dot) of `fields`.
///
/// # Errors
/// Names that collide in the message's scope (fields, nested messages and the `_<field>` oneofs of `optional`
/// fields share it; a map's entry message must be named `<Field>Entry`), as a message naming them.
fn message(
    name: &str,
    full: &str,
    fields: &Fields,
    previous: Option<&MessageDescriptor>,
    dependencies: &mut BTreeSet<&'static str>,
) -> Result<DescriptorProto, String> {
    let mut message = DescriptorProto {
        name: Some(name.into()),
        ..Default::default()
    };
    let mut numbers = Numbers::new(previous);
    // Fields and nested messages share the message's scope; map entries take protoc's names before structs pick.
    let mut nested_names = NestedNames::default();
    for field in fields {
        nested_names.0.insert(field.name().clone());
    }
    for field in fields.iter().filter(|f| map_types(f.data_type()).is_some()) {
        let entry = format!("{}Entry", camel(field.name()));
        if !nested_names.0.insert(entry.clone()) {
            return Err(format!(
                "field `{}` is a map, whose entry message {entry} is named like another field or map's: rename one \
                 in a transform",
                field.name()
            ));
        }
    }
    let mut optional = Vec::new();
    for field in fields {
        let old = previous.and_then(|p| p.get_field_by_name(field.name()));
        // No `json_name`: the compiler's default (lowerCamelCase), as the registered source compiles to.
        let mut proto = FieldDescriptorProto {
            name: Some(field.name().clone()),
            label: Some(Label::Optional as i32),
            ..Default::default()
        };
        let (item, repeated) = match field.data_type() {
            // The items named as the list (a list of structs is a repeated message named after the field).
            DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
                (item.as_ref().clone().with_name(field.name()), true)
            }
            _ => (field.as_ref().clone(), false),
        };
        let same;
        if let Some((key, value)) = map_types(field.data_type()) {
            let entry = format!("{}Entry", camel(field.name()));
            let entry_full = format!("{full}.{entry}");
            let old_value = old.as_ref().and_then(|o| match o.kind() {
                Kind::Message(m) if m.is_map_entry() => Some(m.map_entry_value_field()),
                _ => None,
            });
            // Named after the map: a struct value is a nested message `<Field>Value`.
            let value_field = Field::new(format!("{}_value", field.name()), value.clone(), false);
            let key_field = Field::new("key", key.clone(), false);
            let mut entry_message = DescriptorProto {
                name: Some(entry.clone()),
                options: Some(MessageOptions {
                    map_entry: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let mut key_proto = scalar_field("key", 1);
            set_type(
                &mut key_proto,
                &key_field,
                None,
                &mut nested_names,
                full,
                dependencies,
                &mut message,
            )?;
            let mut value_proto = scalar_field("value", 2);
            let value_previous = old_value.and_then(|v| match v.kind() {
                Kind::Message(m) => Some(m),
                _ => None,
            });
            set_type(
                &mut value_proto,
                &value_field,
                value_previous.as_ref(),
                &mut nested_names,
                full,
                dependencies,
                &mut message,
            )?;
            // The number is kept only when the key and value types are too.
            same = old.as_ref().is_some_and(|o| match o.kind() {
                Kind::Message(m) if m.is_map_entry() => {
                    kind_matches(&m.map_entry_key_field().kind(), &key_proto)
                        && kind_matches(&m.map_entry_value_field().kind(), &value_proto)
                }
                _ => false,
            });
            entry_message.field = vec![key_proto, value_proto];
            message.nested_type.push(entry_message);
            proto.label = Some(Label::Repeated as i32);
            proto.r#type = Some(Type::Message as i32);
            proto.type_name = Some(entry_full);
        } else {
            let old_message = old.as_ref().and_then(|o| match o.kind() {
                Kind::Message(m) => Some(m),
                _ => None,
            });
            set_type(
                &mut proto,
                &item,
                old_message.as_ref(),
                &mut nested_names,
                full,
                dependencies,
                &mut message,
            )?;
            if repeated {
                proto.label = Some(Label::Repeated as i32);
            } else if field.is_nullable() && proto.r#type != Some(Type::Message as i32) {
                proto.proto3_optional = Some(true);
                optional.push(message.field.len());
            }
            same = old.as_ref().is_some_and(|o| {
                !o.is_map()
                    && o.cardinality() == cardinality(&proto)
                    && kind_matches(&o.kind(), &proto)
            });
        }
        proto.number = Some(numbers.number(field.name(), same));
        message.field.push(proto);
    }
    for index in optional {
        let field = &mut message.field[index];
        let oneof = format!("_{}", field.name());
        if fields.iter().any(|f| f.name() == &oneof) {
            return Err(format!(
                "field `{}` is optional, whose oneof `{oneof}` is named like field `{oneof}`: rename one in a \
                 transform",
                field.name()
            ));
        }
        field.oneof_index = Some(i32::try_from(message.oneof_decl.len()).unwrap_or(i32::MAX));
        message.oneof_decl.push(OneofDescriptorProto {
            name: Some(oneof),
            ..Default::default()
        });
    }
    message.reserved_range = numbers.reserved();
    Ok(message)
}

fn scalar_field(name: &str, number: i32) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        label: Some(Label::Optional as i32),
        ..Default::default()
    }
}

/// Sets `proto`'s type to `field`'s (its items' for a list): a scalar, a well-known message, or a nested message
/// added to `parent` (full name `parent_full`).
///
/// # Errors
/// As [`message`], for a nested message.
fn set_type(
    proto: &mut FieldDescriptorProto,
    field: &Field,
    previous: Option<&MessageDescriptor>,
    names: &mut NestedNames,
    parent_full: &str,
    dependencies: &mut BTreeSet<&'static str>,
    parent: &mut DescriptorProto,
) -> Result<(), String> {
    use DataType::*;
    let (scalar, type_name) = match field.data_type() {
        Boolean => (Type::Bool, None),
        Int8 | Int16 | Int32 => (Type::Int32, None),
        Int64 => (Type::Int64, None),
        UInt8 | UInt16 | UInt32 => (Type::Uint32, None),
        UInt64 => (Type::Uint64, None),
        Float32 => (Type::Float, None),
        Float64 => (Type::Double, None),
        FixedSizeBinary(16) if marks::mark(field) == Some(Mark::Uuid) => (Type::String, None),
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => (Type::Bytes, None),
        Timestamp(_, Some(_)) => {
            dependencies.insert("google/protobuf/timestamp.proto");
            (
                Type::Message,
                Some(".google.protobuf.Timestamp".to_string()),
            )
        }
        Duration(_) => {
            dependencies.insert("google/protobuf/duration.proto");
            (Type::Message, Some(".google.protobuf.Duration".to_string()))
        }
        Struct(fields) => {
            let name = names.take(&camel(field.name()));
            let full = format!("{parent_full}.{name}");
            parent
                .nested_type
                .push(message(&name, &full, fields, previous, dependencies)?);
            (Type::Message, Some(full))
        }
        // Utf8 and every type written as its exact text.
        _ => (Type::String, None),
    };
    proto.r#type = Some(scalar as i32);
    proto.type_name = type_name;
    Ok(())
}

fn cardinality(proto: &FieldDescriptorProto) -> Cardinality {
    if proto.label == Some(Label::Repeated as i32) {
        Cardinality::Repeated
    } else {
        Cardinality::Optional
    }
}

/// Whether a field of the previous schema of `kind` is read as `proto`'s type (the same scalar type, or both
/// messages of the same well-known type or both nested messages).
fn kind_matches(kind: &Kind, proto: &FieldDescriptorProto) -> bool {
    let ty = proto.r#type;
    match kind {
        Kind::Message(m) => match proto.type_name.as_deref() {
            Some(name) if name.starts_with(".google.protobuf.") => {
                name.trim_start_matches('.') == m.full_name()
            }
            Some(_) => {
                ty == Some(Type::Message as i32) && !m.full_name().starts_with("google.protobuf.")
            }
            None => false,
        },
        Kind::Bool => ty == Some(Type::Bool as i32),
        Kind::Int32 => ty == Some(Type::Int32 as i32),
        Kind::Int64 => ty == Some(Type::Int64 as i32),
        Kind::Uint32 => ty == Some(Type::Uint32 as i32),
        Kind::Uint64 => ty == Some(Type::Uint64 as i32),
        Kind::Float => ty == Some(Type::Float as i32),
        Kind::Double => ty == Some(Type::Double as i32),
        Kind::String => ty == Some(Type::String as i32),
        Kind::Bytes => ty == Some(Type::Bytes as i32),
        _ => false,
    }
}

/// `file` as `.proto` source, the form registries store and Confluent's Java deserializers read (a map field
/// written `map<K, V>`, its entry message left implicit).
pub(crate) fn source(file: &FileDescriptorProto) -> String {
    let mut out = format!("syntax = \"proto3\";\npackage {};\n", file.package());
    for dependency in &file.dependency {
        out.push_str(&format!("import \"{dependency}\";\n"));
    }
    for message in &file.message_type {
        out.push('\n');
        message_source(message, 0, &mut out);
    }
    out
}

fn message_source(message: &DescriptorProto, depth: usize, out: &mut String) {
    let indent = "  ".repeat(depth);
    out.push_str(&format!("{indent}message {} {{\n", message.name()));
    let entries: HashMap<&str, &DescriptorProto> = message
        .nested_type
        .iter()
        .filter(|m| m.options.as_ref().is_some_and(|o| o.map_entry()))
        .map(|m| (m.name(), m))
        .collect();
    for nested in message
        .nested_type
        .iter()
        .filter(|m| !entries.contains_key(m.name()))
    {
        message_source(nested, depth + 1, out);
    }
    for field in &message.field {
        let entry = field
            .type_name
            .as_deref()
            .and_then(|t| t.rsplit('.').next())
            .and_then(|name| entries.get(name));
        let declared = match entry {
            Some(entry) if field.label() == Label::Repeated => format!(
                "map<{}, {}>",
                type_source(&entry.field[0]),
                type_source(&entry.field[1])
            ),
            _ => {
                let label = match field.label() {
                    Label::Repeated => "repeated ",
                    _ if field.proto3_optional() => "optional ",
                    _ => "",
                };
                format!("{label}{}", type_source(field))
            }
        };
        out.push_str(&format!(
            "{indent}  {declared} {} = {};\n",
            field.name(),
            field.number()
        ));
    }
    if !message.reserved_range.is_empty() {
        let ranges: Vec<String> = message
            .reserved_range
            .iter()
            .map(|r| match r.end() - r.start() {
                1 => r.start().to_string(),
                _ => format!("{} to {}", r.start(), r.end() - 1),
            })
            .collect();
        out.push_str(&format!("{indent}  reserved {};\n", ranges.join(", ")));
    }
    out.push_str(&format!("{indent}}}\n"));
}

fn type_source(field: &FieldDescriptorProto) -> String {
    match field.r#type() {
        Type::Message | Type::Enum => field.type_name().to_string(),
        Type::Bool => "bool".into(),
        Type::Int32 => "int32".into(),
        Type::Int64 => "int64".into(),
        Type::Uint32 => "uint32".into(),
        Type::Uint64 => "uint64".into(),
        Type::Float => "float".into(),
        Type::Double => "double".into(),
        Type::Bytes => "bytes".into(),
        _ => "string".into(),
    }
}

/// Field numbers of one message: the previous version's where a field keeps its name and type, the next free
/// one otherwise; the previous numbers not kept are reserved.
struct Numbers {
    previous: HashMap<String, i32>,
    /// Every number the previous version used or reserved, and every number given out.
    taken: BTreeSet<i32>,
    kept: BTreeSet<i32>,
    reserved: Vec<ReservedRange>,
}

impl Numbers {
    fn new(previous: Option<&MessageDescriptor>) -> Self {
        let mut numbers = Self {
            previous: HashMap::new(),
            taken: BTreeSet::new(),
            kept: BTreeSet::new(),
            reserved: Vec::new(),
        };
        if let Some(previous) = previous {
            for field in previous.fields() {
                let number = i32::try_from(field.number()).unwrap_or(i32::MAX);
                numbers.previous.insert(field.name().to_string(), number);
                numbers.taken.insert(number);
            }
            for range in &previous.descriptor_proto().reserved_range {
                numbers.reserved.push(*range);
                let (start, end) = (range.start.unwrap_or(0), range.end.unwrap_or(0));
                numbers
                    .taken
                    .extend(start..end.min(start.saturating_add(10_000)));
            }
        }
        numbers
    }

    /// The number of field `name`: its previous one when `same` (name and type unchanged).
    fn number(&mut self, name: &str, same: bool) -> i32 {
        if let Some(number) = self.previous.get(name).filter(|_| same) {
            self.kept.insert(*number);
            return *number;
        }
        // 19000..=19999 are reserved for Protobuf's own use.
        let mut next = self.taken.last().map_or(1, |last| last + 1);
        if (19_000..20_000).contains(&next) {
            next = 20_000;
        }
        self.taken.insert(next);
        self.kept.insert(next);
        next
    }

    /// The reserved ranges: the previous version's, and its numbers this version does not keep.
    fn reserved(mut self) -> Vec<ReservedRange> {
        for number in self.previous.values() {
            if !self.kept.contains(number) {
                self.reserved.push(ReservedRange {
                    start: Some(*number),
                    end: Some(number + 1),
                });
            }
        }
        self.reserved.sort_by_key(|r| r.start);
        self.reserved
    }
}

/// Nested message names of one message, made unique.
#[derive(Default)]
struct NestedNames(BTreeSet<String>);

impl NestedNames {
    fn take(&mut self, wanted: &str) -> String {
        let mut name = wanted.to_string();
        let mut n = 2;
        while !self.0.insert(name.clone()) {
            name = format!("{wanted}{n}");
            n += 1;
        }
        name
    }
}

/// `field_name` in CamelCase as protoc names a map's entry message: the first letter upper case, each letter after
/// an `_` upper case, the `_`s dropped.
fn camel(field_name: &str) -> String {
    let mut out = String::with_capacity(field_name.len());
    let mut upper = true;
    for c in field_name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::TimeUnit;
    use prost_reflect::DescriptorPool;

    use super::*;

    fn row(schema: &Schema, previous: Option<&MessageDescriptor>) -> MessageDescriptor {
        let mut pool = DescriptorPool::global();
        pool.add_file_descriptor_proto(file(schema, previous).unwrap())
            .unwrap();
        pool.get_message_by_name("ratchet.Row").unwrap()
    }

    fn schema(fields: Vec<Field>) -> Schema {
        Schema::new(fields)
    }

    #[test]
    fn each_arrow_type_has_its_protobuf_type_and_nullable_scalars_are_optional() {
        let map = DataType::Map(
            Arc::new(Field::new(
                "entries",
                DataType::Struct(
                    vec![
                        Field::new("key", DataType::Utf8, false),
                        Field::new("value", DataType::Int64, true),
                    ]
                    .into(),
                ),
                false,
            )),
            false,
        );
        let row = row(
            &schema(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("note", DataType::Utf8, true),
                Field::new("amount", DataType::Decimal128(12, 2), true),
                Field::new(
                    "at",
                    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                    true,
                ),
                Field::new(
                    "customer",
                    DataType::Struct(vec![Field::new("email", DataType::Utf8, true)].into()),
                    true,
                ),
                Field::new("tags", DataType::new_list(DataType::Utf8, true), false),
                Field::new("counts", map, false),
            ]),
            None,
        );
        let field = |name: &str| row.get_field_by_name(name).unwrap();
        assert_eq!(field("id").kind(), Kind::Int64);
        assert!(!field("id").supports_presence());
        assert_eq!(field("note").kind(), Kind::String);
        assert!(field("note").supports_presence());
        assert_eq!(field("amount").kind(), Kind::String);
        assert_eq!(
            field("at").kind().as_message().unwrap().full_name(),
            "google.protobuf.Timestamp"
        );
        assert_eq!(
            field("customer").kind().as_message().unwrap().full_name(),
            "ratchet.Row.Customer"
        );
        assert!(field("tags").is_list());
        assert!(field("counts").is_map());
        let numbers: Vec<u32> = row.fields().map(|f| f.number()).collect();
        assert_eq!(numbers, [1, 2, 3, 4, 5, 6, 7]);
    }

    #[tokio::test]
    async fn the_source_compiles_to_the_same_message() {
        let map = DataType::Map(
            Arc::new(Field::new(
                "entries",
                DataType::Struct(
                    vec![
                        Field::new("key", DataType::Int32, false),
                        Field::new(
                            "value",
                            DataType::Struct(vec![Field::new("n", DataType::Int64, true)].into()),
                            false,
                        ),
                    ]
                    .into(),
                ),
                false,
            )),
            false,
        );
        let schema = schema(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                true,
            ),
            Field::new("note", DataType::Utf8, true),
            Field::new(
                "lines",
                DataType::new_list(
                    DataType::Struct(vec![Field::new("sku", DataType::Utf8, false)].into()),
                    false,
                ),
                false,
            ),
            Field::new("by_day", map, false),
        ]);
        let v1 = row(&schema, None);
        let mut file = file(&schema, Some(&v1)).unwrap();
        file.message_type[0].reserved_range.push(ReservedRange {
            start: Some(9),
            end: Some(12),
        });
        let text = source(&file);
        let registry = schema_registry::SchemaRegistry::new(
            &schema_registry::RegistrySettings::new("http://127.0.0.1:9/"),
        )
        .unwrap();
        let registered = schema_registry::RegisteredSchema {
            id: 1,
            schema: text.clone(),
            schema_type: schema_registry::SchemaType::Protobuf,
            references: Vec::new(),
            version: None,
        };
        let compiled = schema_registry::protobuf::compile(&registry, &registered)
            .await
            .unwrap();
        let again = compiled.messages().next().unwrap();
        let fields = |m: &MessageDescriptor| -> Vec<(String, u32, bool, bool, bool)> {
            m.fields()
                .map(|f| {
                    (
                        f.name().into(),
                        f.number(),
                        f.is_list(),
                        f.is_map(),
                        f.supports_presence(),
                    )
                })
                .collect()
        };
        assert_eq!(fields(&again), fields(&v1), "{text}");
        assert!(text.contains("reserved 9 to 11;"), "{text}");
        assert!(
            text.contains("map<int32, .ratchet.Row.ByDayValue> by_day = 5;"),
            "{text}"
        );
    }

    #[test]
    fn numbers_are_kept_across_versions_and_never_reused() {
        let v1 = row(
            &schema(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("note", DataType::Utf8, true),
                Field::new("qty", DataType::Int32, true),
            ]),
            None,
        );
        // `note` is gone, `qty` changed type, `extra` is new.
        let v2 = row(
            &schema(vec![
                Field::new("extra", DataType::Boolean, true),
                Field::new("id", DataType::Int64, false),
                Field::new("qty", DataType::Utf8, true),
            ]),
            Some(&v1),
        );
        let number =
            |m: &MessageDescriptor, name: &str| m.get_field_by_name(name).unwrap().number();
        assert_eq!(number(&v2, "id"), 1);
        assert_eq!(number(&v2, "extra"), 4);
        assert_eq!(number(&v2, "qty"), 5);
        let reserved: Vec<(i32, i32)> = v2
            .descriptor_proto()
            .reserved_range
            .iter()
            .map(|r| (r.start(), r.end()))
            .collect();
        assert_eq!(reserved, [(2, 3), (3, 4)]);
        let v3 = row(
            &schema(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("later", DataType::Int64, true),
            ]),
            Some(&v2),
        );
        assert_eq!(number(&v3, "later"), 6);
    }

    #[test]
    fn what_protobuf_cannot_hold_is_refused_naming_the_field() {
        let lists = Field::new(
            "grid",
            DataType::new_list(DataType::new_list(DataType::Int64, true), true),
            true,
        );
        assert!(
            refusal(&lists)
                .unwrap_err()
                .to_string()
                .contains("list of lists")
        );
        let bad_name = Field::new("ratchet.error", DataType::Utf8, true);
        assert!(
            refusal(&bad_name)
                .unwrap_err()
                .to_string()
                .contains("field name")
        );
    }

    #[test]
    fn names_that_collide_in_protobuf_are_refused_and_a_retyped_map_takes_a_new_number() {
        let map = |value: DataType| {
            DataType::Map(
                Arc::new(Field::new(
                    "entries",
                    DataType::Struct(
                        vec![
                            Field::new("key", DataType::Utf8, false),
                            Field::new("value", value, true),
                        ]
                        .into(),
                    ),
                    false,
                )),
                false,
            )
        };
        let struct_named = |name: &str| {
            Field::new(
                name,
                DataType::Struct(vec![Field::new("n", DataType::Int64, true)].into()),
                true,
            )
        };
        for (fields, part) in [
            (
                vec![
                    Field::new("foo", map(DataType::Int64), false),
                    Field::new("FooEntry", DataType::Int64, false),
                ],
                "FooEntry",
            ),
            (
                vec![
                    Field::new("foo", DataType::Int64, true),
                    Field::new("_foo", DataType::Int64, false),
                ],
                "_foo",
            ),
        ] {
            let why = file(&schema(fields), None).unwrap_err();
            assert!(why.contains(part), "{why}");
        }
        // A struct takes a name beside a field of its own name, and the map's entry keeps protoc's name.
        let v1 = row(
            &schema(vec![
                struct_named("Address"),
                struct_named("foo_entry"),
                Field::new("foo", map(DataType::Int64), false),
            ]),
            None,
        );
        assert_eq!(
            v1.get_field_by_name("foo")
                .unwrap()
                .kind()
                .as_message()
                .unwrap()
                .name(),
            "FooEntry"
        );
        let v2 = row(
            &schema(vec![Field::new("foo", map(DataType::Utf8), false)]),
            Some(&v1),
        );
        assert_eq!(v2.get_field_by_name("foo").unwrap().number(), 4);
    }
}
