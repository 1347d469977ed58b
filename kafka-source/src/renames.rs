//! Renamed fields keep their columns across restarts. Every process reads with its subject's latest schema; a
//! field renamed in it (an Avro field whose `aliases` name its earlier name, a Protobuf field under a new name with
//! the same number) would come back after a restart as a new column (or a new field of its struct), and its column
//! would stop filling. So the column of a renamed field, at any depth (inside records and messages, through
//! unions, arrays and maps), keeps the name the field had in the oldest version of the subject that has it, looked
//! up in the registry when the decoding is made:
//!
//! - Avro: the reader schema's field takes that name and keeps its newer names among its `aliases`, which Avro's
//!   resolution matches (only when the latest schema has aliases somewhere: otherwise nothing is looked up);
//! - Protobuf: the column (or struct field) of that field number takes that name, the number followed back while
//!   each version has it with the same kind of value (a number reused for another field keeps its own name).
//!
//! Within a run, a writer's renamed field already reads into the reader's column (Avro: either side's aliases,
//! `avro_fields::same_field`; Protobuf: numbers). Every process computes the same names from the same registry,
//! so two processes on different versions write the same columns. Versions deleted from the subject are skipped: a
//! field's oldest name still there decides. A type referred to by name (an Avro named type used twice) is renamed
//! where it is defined.

use std::collections::BTreeMap;

use connector_api::{Error, ErrorKind, Phase, Result};
use schema_registry::{RegisteredSchema, SchemaRegistry, SchemaType};
use serde_json::Value;

/// The versions of `latest`'s subject older than it, newest first, each as the registry has it (deleted ones
/// skipped), with the subject's name.
async fn older_versions(
    registry: &SchemaRegistry,
    latest: &RegisteredSchema,
) -> Result<Vec<RegisteredSchema>> {
    let Some((subject, newest)) = &latest.version else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for version in (1..*newest).rev() {
        match registry.version(subject, &version.to_string()).await {
            Ok(schema) => out.push(schema),
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                return Err(Error::new(
                    ErrorKind::Retryable,
                    Phase::Setup,
                    format!(
                        "cannot read version {version} of subject {subject} (to keep renamed fields on their \
                         columns)"
                    ),
                )
                .with_source(e));
            }
        }
    }
    Ok(out)
}

/// Every name of a record field: its own and its aliases.
fn names_of(field: &Value) -> Vec<String> {
    let mut names: Vec<String> = field["name"]
        .as_str()
        .map(str::to_string)
        .into_iter()
        .collect();
    names.extend(
        field["aliases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string)),
    );
    names
}

/// The Avro reader schema `latest` (JSON) with each renamed field named as its column was first
/// ([`rename_fields`]); unchanged when it has no aliases.
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when an older version cannot be read.
pub(crate) async fn avro_reader(
    registry: &SchemaRegistry,
    latest: &RegisteredSchema,
) -> Result<String> {
    let Ok(mut reader) = serde_json::from_str::<Value>(&latest.schema) else {
        return Ok(latest.schema.clone());
    };
    if !has_aliases(&reader) {
        return Ok(latest.schema.clone());
    }
    let older: Vec<Value> = older_versions(registry, latest)
        .await?
        .into_iter()
        .filter(|s| s.schema_type == SchemaType::Avro)
        .filter_map(|s| serde_json::from_str(&s.schema).ok())
        .collect();
    let older: Vec<&Value> = older.iter().collect();
    let mut renamed = Vec::new();
    if let Some(record) = record_mut(&mut reader) {
        rename_fields(record, &older, "", &mut renamed);
    }
    if renamed.is_empty() {
        return Ok(latest.schema.clone());
    }
    for (field, column) in &renamed {
        tracing::info!(field = %field, column = %column,
            "a renamed field keeps its column: the name it had in the oldest version of its subject");
    }
    Ok(reader.to_string())
}

/// Whether a record field anywhere in `schema` has aliases.
fn has_aliases(schema: &Value) -> bool {
    match schema {
        Value::Array(branches) => branches.iter().any(has_aliases),
        Value::Object(o) => {
            o.get("fields")
                .and_then(Value::as_array)
                .is_some_and(|fields| {
                    fields
                        .iter()
                        .any(|f| names_of(f).len() > 1 || has_aliases(&f["type"]))
                })
                || ["items", "values"]
                    .iter()
                    .any(|k| o.get(*k).is_some_and(has_aliases))
        }
        _ => false,
    }
}

/// The record `schema` is or holds (through a union's branches, an array's items, a map's values).
fn record_in(schema: &Value) -> Option<&Value> {
    match schema {
        Value::Array(branches) => branches.iter().find_map(record_in),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("record") => Some(schema),
            Some("array") => record_in(o.get("items")?),
            Some("map") => record_in(o.get("values")?),
            _ => None,
        },
        _ => None,
    }
}

/// [`record_in`], mutable.
fn record_mut(schema: &mut Value) -> Option<&mut Value> {
    match schema {
        Value::Array(branches) => branches.iter_mut().find_map(record_mut),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("record") => Some(schema),
            Some("array") => record_mut(schema.get_mut("items")?),
            Some("map") => record_mut(schema.get_mut("values")?),
            _ => None,
        },
        _ => None,
    }
}

/// Renames the fields of `record` (at `path`) that `older` (its counterparts in the older versions, newest first)
/// knew under another name: each field followed back by its names and aliases to the name it had in the oldest;
/// then the same inside each field's record. A name another field of `record` has is not taken (the field keeps
/// its own). Each rename is listed in `renamed` (the field's path as the latest names it, and its column).
fn rename_fields(
    record: &mut Value,
    older: &[&Value],
    path: &str,
    renamed: &mut Vec<(String, String)>,
) {
    let Some(fields) = record.get_mut("fields").and_then(Value::as_array_mut) else {
        return;
    };
    let taken: Vec<String> = fields
        .iter()
        .filter_map(|f| f["name"].as_str().map(str::to_string))
        .collect();
    for field in fields.iter_mut() {
        let Some(name) = field["name"].as_str().map(str::to_string) else {
            continue;
        };
        let mut known = names_of(field);
        let mut column = name.clone();
        let mut counterparts: Vec<&Value> = Vec::new();
        for schema in older {
            let found = schema["fields"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|f| names_of(f).iter().any(|n| known.contains(n)));
            if let Some(found) = found {
                column = found["name"].as_str().unwrap_or(&name).to_string();
                known.extend(names_of(found));
                counterparts.extend(record_in(&found["type"]));
            }
        }
        let full = match path.is_empty() {
            true => name.clone(),
            false => format!("{path}.{name}"),
        };
        if column != name && !taken.contains(&column) {
            let mut aliases = names_of(field);
            aliases.retain(|n| n != &column);
            field["name"] = Value::from(column.clone());
            field["aliases"] = Value::from(aliases);
            renamed.push((full.clone(), column));
        }
        if let Some(inner) = record_mut(&mut field["type"]) {
            rename_fields(inner, &counterparts, &full, renamed);
        }
    }
}

/// The column names of message `current`'s renamed fields, at any depth, by path of field numbers: the name each
/// number had in the oldest version of `latest`'s subject that has it, where that differs from `current`'s (and no
/// other field of its message has it).
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when an older version cannot be read; a version that does not compile or
/// lacks the message is skipped (it says nothing about the columns).
pub(crate) async fn protobuf_column_names(
    registry: &SchemaRegistry,
    latest: &RegisteredSchema,
    current: &prost_reflect::MessageDescriptor,
) -> Result<BTreeMap<Vec<u32>, String>> {
    let mut older_messages = Vec::new();
    for older in older_versions(registry, latest).await? {
        if older.schema_type != SchemaType::Protobuf {
            continue;
        }
        let file = match schema_registry::protobuf::compile(registry, &older).await {
            Ok(file) => file,
            // A reference that could not be fetched: asked again at the next start, never skipped (the names
            // would differ from another process's).
            Err(schema_registry::protobuf::ProtobufSchemaError::Registry { source, .. })
                if !source.is_not_found() =>
            {
                return Err(Error::new(
                    ErrorKind::Retryable,
                    Phase::Setup,
                    format!(
                        "cannot read the references of schema id {} (to keep renamed fields on their columns)",
                        older.id
                    ),
                )
                .with_source(source));
            }
            // A version that does not compile here says nothing about the columns.
            Err(_) => continue,
        };
        older_messages.extend(file.parent_pool().get_message_by_name(current.full_name()));
    }
    Ok(protobuf_renames(current, &older_messages))
}

/// [`protobuf_column_names`] given the message in the older versions, newest first. Each field of `current` (by
/// its path of numbers) is followed back version by version while the number is there with the same kind of value;
/// the name it had in the last of them is its column's. A number that went missing in between, or changed kind, is
/// not followed further (a number reused for another field keeps its own name).
fn protobuf_renames(
    current: &prost_reflect::MessageDescriptor,
    older: &[prost_reflect::MessageDescriptor],
) -> BTreeMap<Vec<u32>, String> {
    let mut now = BTreeMap::new();
    fields_by_number(current, &mut Vec::new(), &mut now);
    let mut out = BTreeMap::new();
    for (path, field) in &now {
        let mut column = field.name().to_string();
        for message in older {
            match field_at(message, path) {
                Some(found) if same_kind(&found.kind(), &field.kind()) => {
                    column = found.name().to_string();
                }
                _ => break,
            }
        }
        let parent = &path[..path.len() - 1];
        let taken = now.iter().any(|(p, f)| {
            p.len() == path.len() && &p[..p.len() - 1] == parent && f.name() == column
        });
        if column != field.name() && !taken {
            out.insert(path.clone(), column);
        }
    }
    out
}

/// Every field of `message` (a message the decoding reads, so not recursive), inside message fields, items and map
/// values too, by its path of numbers.
fn fields_by_number(
    message: &prost_reflect::MessageDescriptor,
    path: &mut Vec<u32>,
    out: &mut BTreeMap<Vec<u32>, prost_reflect::FieldDescriptor>,
) {
    for field in message.fields() {
        path.push(field.number());
        if let Some(inner) = inner_message(&field) {
            fields_by_number(&inner, path, out);
        }
        out.insert(path.clone(), field);
        path.pop();
    }
}

/// The message a field's values are (or, for a map, its values are), unless a well-known type.
fn inner_message(
    field: &prost_reflect::FieldDescriptor,
) -> Option<prost_reflect::MessageDescriptor> {
    let prost_reflect::Kind::Message(m) = field.kind() else {
        return None;
    };
    let m = match m.is_map_entry() {
        true => match m.map_entry_value_field().kind() {
            prost_reflect::Kind::Message(v) => v,
            _ => return None,
        },
        false => m,
    };
    (!m.full_name().starts_with("google.protobuf.")).then_some(m)
}

/// The field of `message` at `path` (numbers through message fields and map values), if it has one.
fn field_at(
    message: &prost_reflect::MessageDescriptor,
    path: &[u32],
) -> Option<prost_reflect::FieldDescriptor> {
    let (last, within) = path.split_last()?;
    let mut at = message.clone();
    for number in within {
        at = inner_message(&at.get_field(*number)?)?;
    }
    at.get_field(*last)
}

/// Whether two fields' values are of the same kind (a message counts as one kind: its fields are compared one by
/// one).
fn same_kind(a: &prost_reflect::Kind, b: &prost_reflect::Kind) -> bool {
    use prost_reflect::Kind::Message;
    matches!((a, b), (Message(_), Message(_)))
        || std::mem::discriminant(a) == std::mem::discriminant(b)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The names `reader` takes, renamed as the `older` versions (newest first) say.
    fn renamed(reader: &Value, older: &[Value]) -> (Value, Vec<(String, String)>) {
        let mut reader = reader.clone();
        let older: Vec<&Value> = older.iter().collect();
        let mut renamed = Vec::new();
        rename_fields(&mut reader, &older, "", &mut renamed);
        (reader, renamed)
    }

    #[test]
    fn a_field_renamed_twice_keeps_its_first_name() {
        let v1 = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},{"name":"qty","type":"long"}]});
        let v2 = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},{"name":"quantity","type":"long","aliases":["qty"]}]});
        let v3 = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},{"name":"amount","type":"long","aliases":["quantity"]}]});
        let (reader, names) = renamed(&v3, &[v2.clone(), v1.clone()]);
        assert_eq!(names, [("amount".to_string(), "qty".to_string())]);
        assert_eq!(
            reader["fields"][1],
            json!({"name":"qty","type":"long","aliases":["amount","quantity"]})
        );
        // Versions deleted: the oldest left decides.
        let (_, names) = renamed(&v3, &[v2]);
        assert_eq!(names, [("amount".to_string(), "quantity".to_string())]);
        // A field whose aliases name nothing older keeps its name.
        assert!(renamed(&v3, &[]).1.is_empty());
        assert!(has_aliases(&v3) && !has_aliases(&v1));
    }

    #[test]
    fn a_name_another_field_has_now_is_not_taken() {
        let v1 = json!({"type":"record","name":"O","fields":[{"name":"qty","type":"long"}]});
        let v2 = json!({"type":"record","name":"O","fields":[
            {"name":"quantity","type":"long","aliases":["qty"]},{"name":"qty","type":["null","string"],"default":null}]});
        assert!(renamed(&v2, &[v1]).1.is_empty());
    }

    #[test]
    fn fields_renamed_inside_nested_records_keep_their_names_at_any_depth() {
        let v1 = json!({"type":"record","name":"O","fields":[
            {"name":"customer","type":["null",{"type":"record","name":"C","fields":[{"name":"mail","type":"string"}]}]},
            {"name":"lines","type":{"type":"array","items":{"type":"record","name":"L","fields":[{"name":"qty","type":"int"}]}}}]});
        let v2 = json!({"type":"record","name":"O","fields":[
            {"name":"client","aliases":["customer"],"type":["null",{"type":"record","name":"C","fields":[
                {"name":"email","aliases":["mail"],"type":"string"}]}]},
            {"name":"lines","type":{"type":"array","items":{"type":"record","name":"L","fields":[
                {"name":"count","aliases":["qty"],"type":"int"}]}}}]});
        assert!(has_aliases(&v2));
        let (reader, names) = renamed(&v2, &[v1]);
        assert_eq!(
            names,
            [
                ("client".to_string(), "customer".to_string()),
                ("client.email".to_string(), "mail".to_string()),
                ("lines.count".to_string(), "qty".to_string()),
            ]
        );
        assert_eq!(reader["fields"][0]["type"][1]["fields"][0]["name"], "mail");
        assert_eq!(
            reader["fields"][1]["type"]["items"]["fields"][0]["name"],
            "qty"
        );
    }

    #[tokio::test]
    async fn protobuf_fields_keep_the_name_their_number_had_first_at_any_depth() {
        use crate::protobuf::test_files::compiled;
        let v1 = r#"syntax = "proto3"; package shop;
            message Customer { string mail = 1; }
            message Order { int64 id = 1; int64 qty = 2; Customer customer = 3; map<string, Customer> by_name = 4;
                            string label = 6; string gone = 7; }"#;
        let between = r#"syntax = "proto3"; package shop;
            message Customer { string mail = 1; }
            message Order { int64 id = 1; int64 qty = 2; Customer customer = 3; map<string, Customer> by_name = 4;
                            string label = 6; }"#;
        let v2 = r#"syntax = "proto3"; package shop;
            message Customer { string email = 1; string phone = 2; }
            message Order { int64 id = 1; int64 quantity = 2; Customer client = 3; map<string, Customer> by_name = 4;
                            int64 qty = 5; int64 count = 6; string back = 7; }"#;
        let message = |file: prost_reflect::FileDescriptor| {
            file.parent_pool()
                .get_message_by_name("shop.Order")
                .unwrap()
        };
        let file = compiled(v2).await;
        let (old, new) = (message(compiled(v1).await), message(file.clone()));
        let names = protobuf_renames(&new, &[message(compiled(between).await), old]);
        assert_eq!(
            names,
            BTreeMap::from([
                // `quantity` (2) would take `qty`, which field 5 has now: it keeps its name. Number 6 changed
                // kind (a string `label`, now an int64 `count`) and number 7 was gone in between (`gone`, now
                // `back`): numbers reused for other fields keep their own names.
                (vec![3], "customer".to_string()),
                (vec![3, 1], "mail".to_string()),
                (vec![4, 1], "mail".to_string()),
            ])
        );
        // The decoding's columns and struct fields take them.
        let decoding = crate::ProtobufDecoding::from_registry(
            crate::protobuf::test_files::registry(),
            crate::ReaderSchema::latest(&crate::protobuf::test_files::registered(1, v2)),
            &file,
            Some("shop.Order"),
            connector_api::Evolution::None,
        )
        .unwrap()
        .keeping_column_names(&names);
        let schema = decoding.schema();
        let top: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            top,
            [
                "id", "quantity", "customer", "by_name", "qty", "count", "back"
            ]
        );
        let arrow_schema::DataType::Struct(customer) = schema.field(2).data_type() else {
            panic!("{schema:?}");
        };
        assert_eq!(customer[0].name(), "mail");
    }
}
