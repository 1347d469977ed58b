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
                        let matching = reader_fields.iter().find(|f| same_field(&field, f));
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

/// Whether the writer's record field `writer` is the reader's `reader`: their names and `aliases` overlap (the same
/// name, or a renamed field: either names the other, or both name an earlier name; arrow-avro's resolution matches
/// names and aliases both ways).
pub(crate) fn same_field(writer: &Value, reader: &Value) -> bool {
    let names = |f: &Value| -> Vec<String> {
        let own = f.get("name").and_then(Value::as_str).map(str::to_string);
        own.into_iter()
            .chain(
                f.get("aliases")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.as_str().map(str::to_string)),
            )
            .collect()
    };
    let (w, r) = (names(writer), names(reader));
    !w.is_empty() && !r.is_empty() && w.iter().any(|n| r.contains(n))
}

/// The writer's top-level fields that Avro's resolution would leave unread although they are a reader field by
/// name or alias ([`same_field`]): a field renamed while another writer field took its old name, so the reader's
/// field reads the other one. Such a writer is refused, naming them, instead of dropping their values.
///
/// The matching is arrow-avro's: a reader field takes the writer field of its name, else of one of its aliases,
/// else the writer field that has its name as an alias; each writer field is read once.
pub(crate) fn ambiguous_fields(writer: &Value, reader: &Value) -> Vec<String> {
    let fields = |schema: &Value| schema["fields"].as_array().cloned().unwrap_or_default();
    let (writer_fields, reader_fields) = (fields(writer), fields(reader));
    let name = |f: &Value| f["name"].as_str().unwrap_or_default().to_string();
    let aliases = |f: &Value| -> Vec<String> {
        f["aliases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect()
    };
    let mut lookup: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, w) in writer_fields.iter().enumerate() {
        lookup.insert(name(w), i);
    }
    for (i, w) in writer_fields.iter().enumerate() {
        for alias in aliases(w) {
            lookup.entry(alias).or_insert(i);
        }
    }
    let mut read = vec![false; writer_fields.len()];
    for r in &reader_fields {
        let found = lookup
            .get(&name(r))
            .or_else(|| aliases(r).iter().find_map(|a| lookup.get(a)));
        if let Some(&i) = found {
            read[i] = true;
        }
    }
    writer_fields
        .iter()
        .zip(read)
        .filter(|(w, read)| !read && reader_fields.iter().any(|r| same_field(w, r)))
        .map(|(w, _)| format!("`{}`", name(w)))
        .collect()
}

/// The top-level fields both schemas have whose types are written differently: where to look when a writer
/// schema cannot be resolved to a reader schema.
pub(crate) fn retyped_fields(writer: &Value, reader: &Value) -> Vec<String> {
    let fields = |schema: &Value| schema["fields"].as_array().cloned().unwrap_or_default();
    let reader_fields = fields(reader);
    fields(writer)
        .iter()
        .filter_map(|w| {
            let name = w["name"].as_str()?;
            let r = reader_fields.iter().find(|r| same_field(w, r))?;
            (r["type"] != w["type"]).then(|| name.to_string())
        })
        .collect()
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

/// A primitive or fixed type's base, size, logical type, precision and scale ([`signature`]).
type Signature = (
    String,
    Option<u64>,
    Option<String>,
    Option<u64>,
    Option<u64>,
);

/// The logical signature of a primitive or fixed Avro type: its base (`long`, `bytes`, `fixed`), size, logical type,
/// precision and scale; `None` for records, arrays, maps, enums, unions and named references.
fn signature(ty: &Value) -> Option<Signature> {
    const PRIMITIVES: [&str; 8] = [
        "null", "boolean", "int", "long", "float", "double", "bytes", "string",
    ];
    match ty {
        Value::String(name) if PRIMITIVES.contains(&name.as_str()) => {
            Some((name.clone(), None, None, None, None))
        }
        Value::Object(o) => {
            let base = o.get("type")?.as_str()?;
            if !PRIMITIVES.contains(&base) && base != "fixed" {
                return None;
            }
            let text = |k: &str| o.get(k).and_then(Value::as_str).map(str::to_string);
            let number = |k: &str| o.get(k).and_then(Value::as_u64);
            Some((
                base.to_string(),
                number("size"),
                text("logicalType"),
                number("precision"),
                number("scale"),
            ))
        }
        _ => None,
    }
}

/// The reader schema a writer must be decoded with so that every value keeps its meaning: `reader` with each
/// primitive whose logical type (or decimal precision and scale, or time unit) differs from the writer's of the
/// same base type replaced by the writer's; `None` when nothing differs. arrow-avro resolves by base type only
/// and would decode a writer's `decimal(10,2)` bytes as the reader's `decimal(12,4)` (values off by 100), or
/// `timestamp-millis` as `timestamp-micros` (off by 1000); decoded as written, the values are then converted to
/// the reader's types exactly, or the writer is refused ([`connector_api::types::exact`]).
pub(crate) fn resolution_reader(reader: &Value, writer: &Value) -> Option<Value> {
    let mut variant = reader.clone();
    replace_logical(&mut variant, writer).then_some(variant)
}

/// Replaces, in `reader`, the types whose logical signature differs from `writer`'s; whether any did.
fn replace_logical(reader: &mut Value, writer: &Value) -> bool {
    if let (Some(r), Some(w)) = (signature(reader), signature(writer)) {
        if r.0 == w.0 && r != w {
            *reader = writer.clone();
            return true;
        }
        return false;
    }
    match reader {
        Value::Array(branches) => {
            let mut changed = false;
            for branch in branches.iter_mut() {
                let matching = match writer {
                    Value::Array(writer_branches) => writer_branches
                        .iter()
                        .find(|w| same_kind(branch, w))
                        .cloned(),
                    other => same_kind(branch, other).then(|| other.clone()),
                };
                if let Some(w) = matching {
                    changed |= replace_logical(branch, &w);
                }
            }
            changed
        }
        Value::Object(r) => {
            let writer = match writer {
                Value::Array(branches) => match branches
                    .iter()
                    .find(|w| same_kind(&Value::Object(r.clone()), w))
                {
                    Some(w) => w,
                    None => return false,
                },
                other => other,
            };
            let Some(w) = writer.as_object() else {
                return false;
            };
            match r.get("type").and_then(Value::as_str) {
                Some("record") => {
                    let writer_fields = w
                        .get("fields")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    let mut changed = false;
                    if let Some(fields) = r.get_mut("fields").and_then(Value::as_array_mut) {
                        for field in fields {
                            let matching = writer_fields.iter().find(|wf| same_field(wf, field));
                            if let Some(wf) = matching {
                                changed |= replace_logical(&mut field["type"], &wf["type"]);
                            }
                        }
                    }
                    changed
                }
                Some("array") => match (r.get_mut("items"), w.get("items")) {
                    (Some(items), Some(w)) => replace_logical(items, w),
                    _ => false,
                },
                Some("map") => match (r.get_mut("values"), w.get("values")) {
                    (Some(values), Some(w)) => replace_logical(values, w),
                    _ => false,
                },
                _ => false,
            }
        }
        _ => false,
    }
}

/// Whether two union branches are the same kind of type (a record of the same name, an array, a map, a primitive
/// of the same base).
fn same_kind(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (signature(a), signature(b)) {
        return x.0 == y.0;
    }
    let kind = |v: &Value| v.get("type").and_then(Value::as_str).map(str::to_string);
    let name = |v: &Value| v.get("name").and_then(Value::as_str).map(str::to_string);
    kind(a).is_some()
        && kind(a) == kind(b)
        && (kind(a).as_deref() != Some("record") || name(a) == name(b))
}

/// `reader` with every field `writer` has and it lacks (the `added` paths, [`added_fields`]) added where the writer
/// has it: at the top level or inside a nested record (through unions, arrays and maps), each readable from records
/// that lack it (its default) and nullable as a column: a field whose type is not a union with `null` gets one,
/// after its own type so its default still fits (`"long", default 0` becomes `["long", "null"], default 0`).
///
/// # Errors
/// Why not, as the end of a sentence: an added field without a default (records written before it have no value
/// for it: Avro calls that incompatible), or a schema that is not a record.
pub(crate) fn widened(reader: &Value, writer: &Value, added: &[String]) -> Result<Value, String> {
    if !writer.is_object() || writer["fields"].as_array().is_none() {
        return Err("is not a record".into());
    }
    if reader["fields"].as_array().is_none() {
        return Err("has a reader that is not a record".into());
    }
    let mut widened = reader.clone();
    merge_added(&mut widened, writer, "", added)?;
    Ok(widened)
}

/// Adds to `reader` the fields of `writer` it lacks whose paths are in `added` (see [`widened`]).
fn merge_added(
    reader: &mut Value,
    writer: &Value,
    path: &str,
    added: &[String],
) -> Result<(), String> {
    match writer {
        Value::Array(branches) => {
            for branch in branches {
                if let Some(matching) = counterpart_mut(branch, reader) {
                    merge_added(matching, branch, path, added)?;
                }
            }
        }
        Value::Object(w) => {
            let Some(r) = counterpart_mut(writer, reader) else {
                return Ok(());
            };
            match w.get("type").and_then(Value::as_str) {
                Some("record") => {
                    for field in w
                        .get("fields")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let Some(name) = field.get("name").and_then(Value::as_str) else {
                            continue;
                        };
                        let full = match path.is_empty() {
                            true => name.to_string(),
                            false => format!("{path}.{name}"),
                        };
                        let Some(fields) = r.get_mut("fields").and_then(Value::as_array_mut) else {
                            return Ok(());
                        };
                        let matching = fields.iter_mut().find(|f| same_field(field, f));
                        match matching {
                            Some(m) => merge_added(&mut m["type"], &field["type"], &full, added)?,
                            None if !added.contains(&full) => {}
                            None if field.get("default").is_none() => {
                                return Err(format!(
                                    "adds the field `{full}` without a default, so records written before it \
                                     cannot be read with it (an incompatible change: give it a default, e.g. null)"
                                ));
                            }
                            None => fields.push(nullable(field)),
                        }
                    }
                }
                Some("array") => {
                    merge_added(&mut r["items"], &w["items"], &format!("{path}[]"), added)?;
                }
                Some("map") => {
                    merge_added(
                        &mut r["values"],
                        &w["values"],
                        &format!("{path}{{}}"),
                        added,
                    )?;
                }
                _ => {}
            }
        }
        _ => {}
    }
    Ok(())
}

/// [`counterpart`], mutable.
fn counterpart_mut<'r>(writer: &Value, reader: &'r mut Value) -> Option<&'r mut Value> {
    if reader.is_array() {
        let index = {
            let found = counterpart(writer, reader)?;
            reader
                .as_array()?
                .iter()
                .position(|b| std::ptr::eq(b, found))?
        };
        return reader.as_array_mut()?.get_mut(index);
    }
    counterpart(writer, reader)?;
    Some(reader)
}

/// A type and whether it admits null: a union of `null` and one other type is that type, nullable; `None` for
/// other unions.
fn nullable_part(ty: &Value) -> Option<(bool, &Value)> {
    match ty {
        Value::Array(branches) => {
            let others: Vec<&Value> = branches
                .iter()
                .filter(|b| b.as_str() != Some("null"))
                .collect();
            match (others.as_slice(), branches.len()) {
                ([only], 2) => Some((true, *only)),
                ([only], 1) => Some((false, *only)),
                _ => None,
            }
        }
        other => Some((false, other)),
    }
}

/// Whether values of Avro type `writer` read into a column of `reader`'s type only once the column is widened:
/// `int` to `long`, `float` to `double`, a decimal of greater precision at the same scale (the promotions every
/// sink makes in place); `Some(false)` when the types are the same, `None` when neither widens the other.
fn widens(reader: &Value, writer: &Value) -> Option<bool> {
    if reader == writer {
        return Some(false);
    }
    let (r, w) = (signature(reader)?, signature(writer)?);
    match (r.0.as_str(), w.0.as_str(), r.2.as_deref(), w.2.as_deref()) {
        ("int", "long", None, None) | ("float", "double", None, None) => Some(true),
        (_, _, Some("decimal"), Some("decimal")) if r.4.unwrap_or(0) == w.4.unwrap_or(0) => {
            let (rp, wp) = (r.3?, w.3?);
            (wp >= rp).then_some(wp > rp)
        }
        _ => None,
    }
}

/// The fields both schemas have whose reader type must change to take `writer`'s values, by dotted path: a type
/// widened ([`widens`]) or a required field made optional (a union with `null`), possibly both; at the top level or
/// inside records (through unions, arrays and maps, as [`added_fields`] walks them).
pub(crate) fn promoted_fields(reader: &Value, writer: &Value) -> Vec<String> {
    let mut out = Vec::new();
    promoted_in(reader, writer, "", &mut out);
    out
}

/// [`promoted_fields`] below `path`.
fn promoted_in(reader: &Value, writer: &Value, path: &str, out: &mut Vec<String>) {
    match writer {
        Value::Array(branches) => {
            for branch in branches {
                if let Some(matching) = counterpart(branch, reader) {
                    promoted_in(matching, branch, path, out);
                }
            }
        }
        Value::Object(w) => {
            let Some(r) = counterpart(writer, reader) else {
                return;
            };
            match w.get("type").and_then(Value::as_str) {
                Some("record") => {
                    let reader_fields = r.get("fields").and_then(Value::as_array);
                    for field in w
                        .get("fields")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let Some(name) = field["name"].as_str() else {
                            continue;
                        };
                        let Some(known) = reader_fields
                            .and_then(|fields| fields.iter().find(|f| same_field(field, f)))
                        else {
                            continue;
                        };
                        let full = match path.is_empty() {
                            true => name.to_string(),
                            false => format!("{path}.{name}"),
                        };
                        if promotes(&known["type"], &field["type"]) {
                            out.push(full);
                        } else {
                            promoted_in(&known["type"], &field["type"], &full, out);
                        }
                    }
                }
                Some("array") => promoted_in(&r["items"], &w["items"], &format!("{path}[]"), out),
                Some("map") => promoted_in(&r["values"], &w["values"], &format!("{path}{{}}"), out),
                _ => {}
            }
        }
        _ => {}
    }
}

/// Whether a field typed `reader` must become `writer` to take its values: widened, or made optional.
fn promotes(reader: &Value, writer: &Value) -> bool {
    let (Some((r_null, r_type)), Some((w_null, w_type))) =
        (nullable_part(reader), nullable_part(writer))
    else {
        return false;
    };
    let Some(wider) = widens(r_type, w_type) else {
        return false;
    };
    w_null >= r_null && (wider || (w_null && !r_null))
}

/// `reader` with each of the fields at `paths` ([`promoted_fields`]) typed as `writer` types it: its default the
/// writer's, or else the reader's where that still fits (not for a union, whose default must fit its first branch).
pub(crate) fn promoted(reader: &Value, writer: &Value, paths: &[String]) -> Value {
    let mut promoted = reader.clone();
    promote_in(&mut promoted, writer, "", paths);
    promoted
}

/// [`promoted`] below `path`.
fn promote_in(reader: &mut Value, writer: &Value, path: &str, paths: &[String]) {
    match writer {
        Value::Array(branches) => {
            for branch in branches {
                if let Some(matching) = counterpart_mut(branch, reader) {
                    promote_in(matching, branch, path, paths);
                }
            }
        }
        Value::Object(w) => {
            let Some(r) = counterpart_mut(writer, reader) else {
                return;
            };
            match w.get("type").and_then(Value::as_str) {
                Some("record") => {
                    for written in w
                        .get("fields")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let Some(name) = written["name"].as_str() else {
                            continue;
                        };
                        let full = match path.is_empty() {
                            true => name.to_string(),
                            false => format!("{path}.{name}"),
                        };
                        let Some(field) = r
                            .get_mut("fields")
                            .and_then(Value::as_array_mut)
                            .and_then(|fields| fields.iter_mut().find(|f| same_field(written, f)))
                        else {
                            continue;
                        };
                        if !paths.contains(&full) {
                            promote_in(&mut field["type"], &written["type"], &full, paths);
                            continue;
                        }
                        field["type"] = written["type"].clone();
                        let Some(object) = field.as_object_mut() else {
                            continue;
                        };
                        match written.get("default") {
                            Some(default) => {
                                object.insert("default".into(), default.clone());
                            }
                            None if written["type"].is_array() => {
                                object.remove("default");
                            }
                            None => {}
                        }
                    }
                }
                Some("array") => {
                    promote_in(&mut r["items"], &w["items"], &format!("{path}[]"), paths)
                }
                Some("map") => promote_in(
                    &mut r["values"],
                    &w["values"],
                    &format!("{path}{{}}"),
                    paths,
                ),
                _ => {}
            }
        }
        _ => {}
    }
}

/// `field` with `null` among its type's branches (after the first, which its default must fit).
fn nullable(field: &Value) -> Value {
    let mut field = field.clone();
    let branches = match &field["type"] {
        Value::Array(branches) if branches.iter().any(|b| b.as_str() == Some("null")) => {
            return field;
        }
        Value::Array(branches) => branches.clone(),
        other => vec![other.clone()],
    };
    let mut branches = branches;
    branches.push(Value::from("null"));
    field["type"] = Value::Array(branches);
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
    fn a_field_renamed_twice_matches_through_a_shared_alias() {
        // After a restart the reader keeps the column's first name with the newer ones as aliases.
        let reader = r#"{"type":"record","name":"O","fields":[{"name":"qty","type":"long","aliases":["quantity"]}]}"#;
        let writer = r#"{"type":"record","name":"O","fields":[
            {"name":"amount","type":"long","aliases":["quantity"]}]}"#;
        assert!(added(writer, reader).is_empty());
        // A writer that renamed the field and reuses its old name for a new one: ambiguous, refused.
        let reused = r#"{"type":"record","name":"O","fields":[
            {"name":"amount","type":"long","aliases":["quantity"]},{"name":"qty","type":["null","long"],"default":null}]}"#;
        let ambiguous = ambiguous_fields(
            &serde_json::from_str(reused).unwrap(),
            &serde_json::from_str(reader).unwrap(),
        );
        assert_eq!(ambiguous, ["`amount`"]);
        // A schema with a renamed field beside a field of its old name reads itself: both fields are read.
        let both = r#"{"type":"record","name":"O","fields":[
            {"name":"quantity","type":"long","aliases":["qty"]},{"name":"qty","type":["null","long"],"default":null}]}"#;
        let both: Value = serde_json::from_str(both).unwrap();
        assert!(ambiguous_fields(&both, &both).is_empty());
    }

    #[test]
    fn a_field_renamed_by_either_side_s_aliases_is_not_added() {
        let reader = r#"{"type":"record","name":"O","fields":[{"name":"qty","type":"long"}]}"#;
        let renamed = r#"{"type":"record","name":"O","fields":[
            {"name":"quantity","type":"long","aliases":["qty"]}]}"#;
        assert!(added(renamed, reader).is_empty());
        assert!(added(reader, renamed).is_empty());
        let unrelated = r#"{"type":"record","name":"O","fields":[
            {"name":"quantity","type":"long","aliases":["amount"]}]}"#;
        assert_eq!(added(unrelated, reader), ["quantity"]);
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
    fn writers_whose_logical_types_differ_get_a_reader_of_their_own() {
        let reader = json!({"type":"record","name":"O","fields":[
            {"name":"amount","type":["null",{"type":"bytes","logicalType":"decimal","precision":12,"scale":4}]},
            {"name":"at","type":{"type":"long","logicalType":"timestamp-micros"}},
            {"name":"id","type":"long"}]});
        let writer = json!({"type":"record","name":"O","fields":[
            {"name":"amount","type":["null",{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}]},
            {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
            {"name":"id","type":"int"}]});
        let variant = resolution_reader(&reader, &writer).unwrap();
        assert_eq!(variant["fields"][0]["type"][1]["scale"], 2);
        assert_eq!(
            variant["fields"][1]["type"]["logicalType"],
            "timestamp-millis"
        );
        assert_eq!(
            variant["fields"][2]["type"], "long",
            "a promotion stays arrow-avro's"
        );
        assert!(resolution_reader(&reader, &reader).is_none());
    }

    #[test]
    fn widened_and_optional_fields_are_promoted_and_others_left_to_resolution() {
        let reader = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"qty","type":"int","default":0},
            {"name":"ratio","type":["null","float"],"default":null},
            {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
            {"name":"note","type":"string"},
            {"name":"code","type":"long"}]});
        let writer = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"qty","type":["null","long"],"default":null},
            {"name":"ratio","type":["null","double"],"default":null},
            {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
            {"name":"note","type":["null","string"]},
            {"name":"code","type":"int"}]});
        let names = promoted_fields(&reader, &writer);
        assert_eq!(
            names,
            ["qty", "ratio", "price", "note"],
            "code narrows: resolution's"
        );
        let promoted = promoted(&reader, &writer, &names);
        assert_eq!(
            promoted["fields"][1],
            json!({"name":"qty","type":["null","long"],"default":null})
        );
        assert_eq!(promoted["fields"][3]["type"]["precision"], 12);
        assert_eq!(
            promoted["fields"][4],
            json!({"name":"note","type":["null","string"]})
        );
        assert_eq!(promoted["fields"][5], json!({"name":"code","type":"long"}));
        // Nested: a field widened inside a record (Debezium's row images) is found by path and promoted there.
        let row = |qty: &str| {
            json!({"type":"record","name":"E","fields":[
                {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
                    {"name":"id","type":"int"},{"name":"qty","type":["null",qty],"default":null}]}],"default":null},
                {"name":"after","type":["null","Value"],"default":null},
                {"name":"op","type":"string"}]})
        };
        let names = promoted_fields(&row("int"), &row("long"));
        assert_eq!(names, ["before.qty"]);
        let widened = super::promoted(&row("int"), &row("long"), &names);
        assert_eq!(
            widened["fields"][0]["type"][1]["fields"][1]["type"],
            json!(["null", "long"])
        );
        assert_eq!(
            widened["fields"][1],
            row("int")["fields"][1],
            "`after` names the same record"
        );
        // Neither way a widening: a scale change, a string to a number, optional to required.
        let other = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"string"},
            {"name":"qty","type":"int"},
            {"name":"ratio","type":"double"},
            {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":3}}]});
        assert!(promoted_fields(&reader, &other).is_empty());
        assert!(promoted_fields(&reader, &reader).is_empty());
    }

    #[test]
    fn a_widened_reader_reads_records_without_the_new_fields() {
        let reader = json!({"type":"record","name":"O","fields":[{"name":"id","type":"long"}]});
        let writer = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"qty","type":"int","default":0},
            {"name":"note","type":["null","string"],"default":null},
            {"name":"tag","type":"string"}]});
        let added: Vec<String> = ["qty", "note"].map(String::from).to_vec();
        let widened = widened(&reader, &writer, &added).unwrap();
        assert_eq!(
            widened["fields"],
            json!([
                {"name":"id","type":"long"},
                {"name":"qty","type":["int","null"],"default":0},
                {"name":"note","type":["null","string"],"default":null}])
        );
        let err = super::widened(&reader, &writer, &["tag".to_string()]).unwrap_err();
        assert!(err.contains("`tag` without a default"), "{err}");
    }

    #[test]
    fn nested_fields_are_added_where_the_writer_has_them() {
        let customer = |fields: Value| json!(["null", {"type": "record", "name": "Customer", "fields": fields}]);
        let line = |fields: Value| json!({"type": "array", "items": {"type": "record", "name": "Line", "fields": fields}});
        let reader = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"customer","type":customer(json!([{"name":"name","type":"string"}])),"default":null},
            {"name":"lines","type":line(json!([{"name":"sku","type":"string"}]))}]});
        let writer = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"customer","type":customer(json!([
                {"name":"name","type":"string"},
                {"name":"email","type":["null","string"],"default":null}])),"default":null},
            {"name":"lines","type":line(json!([
                {"name":"sku","type":"string"},
                {"name":"qty","type":"int","default":1}]))}]});
        let mut added = Vec::new();
        added_fields(&writer, &reader, "", &mut added);
        assert_eq!(added, ["customer.email", "lines[].qty"]);
        let widened = widened(&reader, &writer, &added).unwrap();
        assert_eq!(
            widened["fields"][1]["type"][1]["fields"][1],
            json!({"name":"email","type":["null","string"],"default":null})
        );
        assert_eq!(
            widened["fields"][2]["type"]["items"]["fields"][1],
            json!({"name":"qty","type":["int","null"],"default":1})
        );
        // Only the paths asked for are added; one without a default is refused by path.
        let only = super::widened(&reader, &writer, &["customer.email".to_string()]).unwrap();
        assert_eq!(only["fields"][2], reader["fields"][2]);
        let strict = json!({"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"customer","type":customer(json!([
                {"name":"name","type":"string"},
                {"name":"email","type":"string"}])),"default":null},
            {"name":"lines","type":line(json!([{"name":"sku","type":"string"}]))}]});
        let err = super::widened(&reader, &strict, &["customer.email".to_string()]).unwrap_err();
        assert!(err.contains("`customer.email` without a default"), "{err}");
    }
}
