//! Comparing Avro schemas field by field (as JSON): the fields a writer schema has and a reader schema lacks, and
//! a reader schema widened with a writer's new top-level fields.

use serde_json::Value;

/// Paths of the fields `writer` has and `reader` lacks (by name or alias), in records nested through fields,
/// unions, arrays and maps. A type referred to by name is not followed (its definition was compared where it
/// appeared).
pub(crate) fn added_fields(writer: &Value, reader: &Value, path: &str, out: &mut Vec<String>) {
    match (writer, reader) {
        (Value::Array(branches), _) => {
            for branch in branches {
                if let Some(matching) = counterpart(branch, reader) {
                    added_fields(branch, matching, path, out);
                }
            }
        }
        (Value::Object(w), _) => {
            let Some(r) = counterpart(writer, reader).and_then(Value::as_object) else {
                return;
            };
            match w.get("type").and_then(Value::as_str) {
                Some("record") => {
                    let fields = |o: &serde_json::Map<String, Value>| {
                        o.get("fields")
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default()
                    };
                    let reader_fields = fields(r);
                    for field in fields(w) {
                        let Some(name) = field.get("name").and_then(Value::as_str) else {
                            continue;
                        };
                        let full = if path.is_empty() {
                            name.to_string()
                        } else {
                            format!("{path}.{name}")
                        };
                        let matching = reader_fields.iter().find(|f| {
                            f.get("name").and_then(Value::as_str) == Some(name)
                                || f.get("aliases")
                                    .and_then(Value::as_array)
                                    .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(name)))
                        });
                        match matching {
                            None => out.push(full),
                            Some(m) => added_fields(&field["type"], &m["type"], &full, out),
                        }
                    }
                }
                Some("array") => added_fields(&w["items"], &r["items"], &format!("{path}[]"), out),
                Some("map") => {
                    added_fields(&w["values"], &r["values"], &format!("{path}{{}}"), out)
                }
                _ => {}
            }
        }
        _ => {}
    }
}

/// The part of `reader` (itself, or a branch of a union) that corresponds to `writer`: the same complex type,
/// and for records the same name or, failing that, the only record.
fn counterpart<'r>(writer: &Value, reader: &'r Value) -> Option<&'r Value> {
    let kind = |v: &Value| v.get("type").and_then(Value::as_str).map(str::to_string);
    let name = |v: &Value| v.get("name").and_then(Value::as_str).map(str::to_string);
    let candidates: Vec<&Value> = match reader {
        Value::Array(branches) => branches.iter().collect(),
        other => vec![other],
    };
    let same_kind: Vec<&Value> = candidates
        .into_iter()
        .filter(|c| c.is_object() && kind(c) == kind(writer))
        .collect();
    same_kind
        .iter()
        .find(|c| name(c) == name(writer))
        .or_else(|| (same_kind.len() == 1).then(|| &same_kind[0]))
        .copied()
}

/// `reader` with the top-level fields `added` (names) of `writer` appended, each readable from records that lack
/// it: a field without a default becomes nullable with default null (its type a union led by `null`), a union
/// with `null` elsewhere gets it first. The reader's own fields are kept as they are.
///
/// # Errors
/// Why not, as the end of a sentence: an added field below the top level (a column holds a whole nested value), or
/// a schema that is not a record.
pub(crate) fn widened(reader: &Value, writer: &Value, added: &[String]) -> Result<Value, String> {
    if let Some(nested) = added.iter().find(|f| f.contains(['.', '['])) {
        return Err(format!(
            "adds the nested field `{nested}`; schema evolution adds top-level columns only"
        ));
    }
    let writer_fields = writer["fields"].as_array().ok_or("is not a record")?;
    let mut widened = reader.clone();
    let fields = widened["fields"]
        .as_array_mut()
        .ok_or("has a reader that is not a record")?;
    for name in added {
        let Some(field) = writer_fields
            .iter()
            .find(|f| f["name"].as_str() == Some(name))
        else {
            continue;
        };
        fields.push(optional(field));
    }
    Ok(widened)
}

/// `field` as a reader field that records without it can be read with.
fn optional(field: &Value) -> Value {
    let mut field = field.clone();
    if field.get("default").is_some() {
        return field;
    }
    let branches = match &field["type"] {
        Value::Array(branches) => {
            let mut rest: Vec<Value> = branches
                .iter()
                .filter(|b| b.as_str() != Some("null"))
                .cloned()
                .collect();
            rest.insert(0, Value::from("null"));
            rest
        }
        other => vec![Value::from("null"), other.clone()],
    };
    field["type"] = Value::Array(branches);
    field["default"] = Value::Null;
    field
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn added(writer: &str, reader: &str) -> Vec<String> {
        let mut out = Vec::new();
        added_fields(
            &serde_json::from_str(writer).unwrap(),
            &serde_json::from_str(reader).unwrap(),
            "",
            &mut out,
        );
        out
    }

    #[test]
    fn fields_the_reader_lacks_are_found_at_any_depth() {
        let reader = r#"{"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"customer","type":["null",{"type":"record","name":"C","fields":[{"name":"name","type":"string"}]}]},
            {"name":"lines","type":{"type":"array","items":{"type":"record","name":"L","fields":[{"name":"sku","type":"string"}]}}},
            {"name":"amount","type":"long","aliases":["total"]}]}"#;
        assert!(added(reader, reader).is_empty());
        let writer = r#"{"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"note","type":["null","string"],"default":null},
            {"name":"customer","type":["null",{"type":"record","name":"C","fields":[{"name":"name","type":"string"},{"name":"email","type":"string"}]}]},
            {"name":"lines","type":{"type":"array","items":{"type":"record","name":"L","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"int"}]}}},
            {"name":"total","type":"long"}]}"#;
        assert_eq!(
            added(writer, reader),
            ["note", "customer.email", "lines[].qty"]
        );
        // A writer lacking a reader field is Avro resolution's business (the default), not an added field.
        let fewer = r#"{"type":"record","name":"O","fields":[{"name":"id","type":"long"}]}"#;
        assert!(added(fewer, reader).is_empty());
    }

    #[test]
    fn a_widened_reader_reads_records_without_the_new_fields() {
        let reader = json!({"type":"record","name":"O","fields":[{"name":"id","type":"long"}]});
        let writer = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"qty","type":"int"},
            {"name":"note","type":["string","null"]},
            {"name":"tag","type":"string","default":"x"}]});
        let added: Vec<String> = ["qty", "note", "tag"].map(String::from).to_vec();
        let widened = widened(&reader, &writer, &added).unwrap();
        assert_eq!(
            widened["fields"],
            json!([
                {"name":"id","type":"long"},
                {"name":"qty","type":["null","int"],"default":null},
                {"name":"note","type":["null","string"],"default":null},
                {"name":"tag","type":"string","default":"x"}])
        );
        let err = super::widened(&reader, &writer, &["customer.email".to_string()]).unwrap_err();
        assert!(err.contains("top-level columns only"), "{err}");
    }
}
