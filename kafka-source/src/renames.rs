//! Renamed fields keep their columns across restarts. Every process reads with its subject's latest schema; a
//! field renamed in it (an Avro field whose `aliases` name its earlier name, a Protobuf field under a new name with
//! the same number) would come back after a restart as a new column, and its column would stop filling. So the
//! column of a renamed top-level field keeps the name the field had in the oldest version of the subject that has
//! it, looked up in the registry when the decoding is made:
//!
//! - Avro: the reader schema's field takes that name and keeps its newer names among its `aliases`, which Avro's
//!   resolution matches (only when the latest schema has top-level aliases: otherwise nothing is looked up);
//! - Protobuf: the column of that field number takes that name.
//!
//! Within a run, a writer's renamed field already reads into the reader's column (Avro: either side's aliases,
//! `avro_fields::same_field`; Protobuf: numbers). Every process computes the same names from the same registry,
//! so two processes on different versions write the same columns. Versions deleted from the subject are skipped: a
//! field's oldest name still there decides. Fields renamed inside nested records or messages are not kept this
//! way (planned): after a restart such a field is a new field of its struct.

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

/// The Avro reader schema `latest` (JSON) with each renamed top-level field named as its column was first
/// ([`avro_column_names`]); unchanged when it has no top-level aliases.
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
    let has_aliases = reader["fields"]
        .as_array()
        .is_some_and(|fields| fields.iter().any(|f| names_of(f).len() > 1));
    if !has_aliases {
        return Ok(latest.schema.clone());
    }
    let older: Vec<Value> = older_versions(registry, latest)
        .await?
        .into_iter()
        .filter(|s| s.schema_type == SchemaType::Avro)
        .filter_map(|s| serde_json::from_str(&s.schema).ok())
        .collect();
    let renamed = avro_column_names(&reader, &older);
    if renamed.is_empty() {
        return Ok(latest.schema.clone());
    }
    let fields = reader["fields"].as_array_mut().expect("checked above");
    for field in fields.iter_mut() {
        let Some(column) = field["name"].as_str().and_then(|n| renamed.get(n)).cloned() else {
            continue;
        };
        let mut aliases = names_of(field);
        aliases.retain(|n| n != &column);
        tracing::info!(field = %aliases[0], column = %column,
            "a renamed field keeps its column: the name it had in the oldest version of its subject");
        field["name"] = Value::from(column);
        field["aliases"] = Value::from(aliases);
    }
    Ok(reader.to_string())
}

/// The column names of `reader`'s renamed top-level fields, by their name in `reader`: each field followed back
/// through `older` (newest first) by its names and aliases, to the name it had in the oldest. A name another
/// field of `reader` has is not taken (the field keeps its own).
fn avro_column_names(reader: &Value, older: &[Value]) -> BTreeMap<String, String> {
    let fields = reader["fields"].as_array().cloned().unwrap_or_default();
    let taken: Vec<String> = fields
        .iter()
        .filter_map(|f| f["name"].as_str().map(str::to_string))
        .collect();
    let mut out = BTreeMap::new();
    for field in fields.iter().filter(|f| names_of(f).len() > 1) {
        let Some(name) = field["name"].as_str() else {
            continue;
        };
        let mut known = names_of(field);
        let mut column = name.to_string();
        for schema in older {
            let found = schema["fields"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|f| names_of(f).iter().any(|n| known.contains(n)));
            if let Some(found) = found {
                column = found["name"].as_str().unwrap_or(name).to_string();
                known.extend(names_of(found));
            }
        }
        if column != name && !taken.contains(&column) {
            out.insert(name.to_string(), column);
        }
    }
    out
}

/// The column names of message `message`'s renamed top-level fields, by field number: the name each number had
/// in the oldest version of `latest`'s subject that has it, where that differs from `latest`'s (and no other
/// field of `latest` has it).
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when an older version cannot be read; a version that does not compile or
/// lacks the message is skipped (it says nothing about the columns).
pub(crate) async fn protobuf_column_names(
    registry: &SchemaRegistry,
    latest: &RegisteredSchema,
    current: &prost_reflect::MessageDescriptor,
) -> Result<BTreeMap<u32, String>> {
    let mut first: BTreeMap<u32, String> = BTreeMap::new();
    for older in older_versions(registry, latest).await? {
        if older.schema_type != SchemaType::Protobuf {
            continue;
        }
        let Ok(file) = schema_registry::protobuf::compile(registry, &older).await else {
            continue;
        };
        let Some(message) = file.parent_pool().get_message_by_name(current.full_name()) else {
            continue;
        };
        // Newest first: an older version's name replaces a newer one's.
        for field in message.fields() {
            first.insert(field.number(), field.name().to_string());
        }
    }
    let taken: Vec<String> = current.fields().map(|f| f.name().to_string()).collect();
    Ok(current
        .fields()
        .filter_map(|field| {
            let column = first.get(&field.number())?;
            (column != field.name() && !taken.contains(column))
                .then(|| (field.number(), column.clone()))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_field_renamed_twice_keeps_its_first_name() {
        let v1 = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},{"name":"qty","type":"long"}]});
        let v2 = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},{"name":"quantity","type":"long","aliases":["qty"]}]});
        let v3 = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},{"name":"amount","type":"long","aliases":["quantity"]}]});
        let names = avro_column_names(&v3, &[v2.clone(), v1.clone()]);
        assert_eq!(names, BTreeMap::from([("amount".into(), "qty".into())]));
        // Versions deleted: the oldest left decides.
        let names = avro_column_names(&v3, &[v2]);
        assert_eq!(
            names,
            BTreeMap::from([("amount".into(), "quantity".into())])
        );
        // A field whose aliases name nothing older keeps its name.
        assert!(avro_column_names(&v3, &[]).is_empty());
    }

    #[test]
    fn a_name_another_field_has_now_is_not_taken() {
        let v1 = json!({"type":"record","name":"O","fields":[{"name":"qty","type":"long"}]});
        let v2 = json!({"type":"record","name":"O","fields":[
            {"name":"quantity","type":"long","aliases":["qty"]},{"name":"qty","type":["null","string"],"default":null}]});
        assert!(avro_column_names(&v2, &[v1]).is_empty());
    }
}
