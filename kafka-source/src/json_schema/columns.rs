//! A registry's JSON Schema as the JSON decoding's columns ([`JsonField`]s): every property of the root object is
//! a column, decoded exactly as a declared JSON field of that type would be ([`crate::json_types`]).
//!
//! | JSON Schema | column type |
//! |---|---|
//! | `"type": "boolean"` | `boolean` |
//! | `"type": "integer"` | `int64` (`int8`, `int16`, `int32` with Kafka Connect's `"connect.type"`) |
//! | `"type": "number"` | `float64` (`float32` with `"connect.type": "float32"`) |
//! | `"type": "number"` with `"multipleOf"` a power of ten at most 1 (`0.01`) | `decimal(38, s)` (`s` digits after the point) |
//! | Kafka Connect's decimal (`"title": "org.apache.kafka.connect.data.Decimal"`, `"connect.parameters": {"scale": ..}`) | `decimal(p, s)` (`p` from `connect.decimal.precision`, else 38) |
//! | `"type": "string"` | `string`; with `"format"`: `date-time` `timestamptz(us)`, `date` `date`, `uuid` `uuid`; with `"contentEncoding": "base64"` `binary` |
//! | `"type": "object"` with `properties` | `struct` (its `required` properties not nullable) |
//! | `"type": "object"` with only `additionalProperties: {schema}` | `map` |
//! | `"type": "array"` with `items: {schema}` | `list` |
//! | `["T", "null"]`, or `oneOf` / `anyOf` of `{"type": "null"}` and one schema | `T`, nullable |
//! | anything else (no `type`, several types, a real union, `format: time`, tuples) | `json`: the value's JSON text, or `string` |
//!
//! A property is nullable unless the object lists it in `required` and its type does not admit `null`. Local
//! `$ref`s (`#/definitions/..`, `#/$defs/..`, any `#/` pointer) are followed; a recursive one is refused, as are
//! references to other documents (the registry's schema references) and references under a nested `$id` (they
//! resolve against that `$id`, not the document).

use super::doc::Doc;
use crate::json_types::{JsonField, JsonItem};

/// How deep `$ref`s may nest before the schema counts as recursive.
const MAX_REF_DEPTH: usize = 32;

/// The columns of `schema` (a JSON Schema document whose root is an object); why not, as the end of a sentence
/// about the schema ("..., whose ...").
pub(crate) fn columns(schema: &Doc) -> Result<Vec<JsonField>, String> {
    if let Some(id) = schema.nested_id_over_ref() {
        return Err(format!(
            "`$id` {id:?} below the root has `$ref`s under it, which resolve against that `$id` rather than the \
             document (not followed here): register the schema with its definitions at the root and no nested `$id`"
        ));
    }
    let walk = Walk { root: schema };
    let root = walk.follow(schema, 0)?;
    if !is_object_schema(root) {
        return Err(
            "root is not an object with `properties` (each property is a column)".to_string(),
        );
    }
    walk.properties(root, "", 0)
}

struct Walk<'a> {
    root: &'a Doc,
}

fn is_object_schema(schema: &Doc) -> bool {
    schema
        .get("properties")
        .is_some_and(|p| p.as_object().is_some())
}

/// A schema with what its `null` admits taken out: the schema of the non-null values, and whether `null` is allowed.
struct Unwrapped<'a> {
    schema: Option<&'a Doc>,
    /// A single `type` from a `type` array (`["string", "null"]`), which overrides the schema's own `type`.
    kind: Option<&'a str>,
    nullable: bool,
}

impl<'a> Walk<'a> {
    /// `schema` with its local `$ref` followed.
    fn follow(&self, mut schema: &'a Doc, mut depth: usize) -> Result<&'a Doc, String> {
        while let Some(reference) = schema.get("$ref").and_then(Doc::as_str) {
            depth += 1;
            if depth > MAX_REF_DEPTH {
                return Err(format!("`$ref` {reference:?} is recursive"));
            }
            let pointer = reference.strip_prefix('#').ok_or_else(|| {
                format!(
                    "`$ref` {reference:?} points into another document (schema references are not resolved: \
                     register the schema with its definitions inlined)"
                )
            })?;
            schema = self
                .root
                .pointer(pointer)
                .ok_or_else(|| format!("`$ref` {reference:?} points nowhere"))?;
        }
        Ok(schema)
    }

    /// `schema` without `null`: from a `type` array, or a `oneOf` / `anyOf` of `null` and one schema.
    fn unwrap_null(&self, schema: &'a Doc, depth: usize) -> Result<Unwrapped<'a>, String> {
        let schema = self.follow(schema, depth)?;
        if let Some(types) = schema.get("type").and_then(Doc::as_array) {
            let named: Vec<&str> = types.iter().filter_map(Doc::as_str).collect();
            let nullable = named.contains(&"null");
            let others: Vec<&str> = named.into_iter().filter(|t| *t != "null").collect();
            return Ok(match others.as_slice() {
                [one] => Unwrapped {
                    schema: Some(schema),
                    kind: Some(one),
                    nullable,
                },
                [] => Unwrapped {
                    schema: None,
                    kind: None,
                    nullable,
                },
                _ => Unwrapped {
                    schema: None, // several types: kept as JSON
                    kind: Some("json"),
                    nullable,
                },
            });
        }
        for union in ["oneOf", "anyOf"] {
            let Some(branches) = schema.get(union).and_then(Doc::as_array) else {
                continue;
            };
            let mut nullable = false;
            let mut others = Vec::new();
            for branch in branches {
                let branch = self.follow(branch, depth)?;
                if branch.get("type").and_then(Doc::as_str) == Some("null") {
                    nullable = true;
                } else {
                    others.push(branch);
                }
            }
            return Ok(match others.as_slice() {
                [one] => {
                    let inner = self.unwrap_null(one, depth)?;
                    Unwrapped {
                        nullable: nullable || inner.nullable,
                        ..inner
                    }
                }
                _ => Unwrapped {
                    schema: None,
                    kind: Some("json"),
                    nullable,
                },
            });
        }
        Ok(Unwrapped {
            schema: Some(schema),
            kind: schema.get("type").and_then(Doc::as_str),
            nullable: schema.get("type").is_none(),
        })
    }

    /// The columns of an object schema's properties; `path` names the object in errors.
    fn properties(
        &self,
        object: &'a Doc,
        path: &str,
        depth: usize,
    ) -> Result<Vec<JsonField>, String> {
        let properties = object
            .get("properties")
            .and_then(Doc::as_object)
            .unwrap_or_default();
        let required: Vec<&str> = object
            .get("required")
            .and_then(Doc::as_array)
            .map(|names| names.iter().filter_map(Doc::as_str).collect())
            .unwrap_or_default();
        properties
            .iter()
            .map(|(name, schema)| {
                let at = format!("{path}{name}");
                let item = self.item(schema, &at, depth)?;
                Ok(JsonField {
                    name: name.clone(),
                    kind: item.kind,
                    nullable: item.nullable || !required.contains(&name.as_str()),
                    fields: item.fields,
                    items: item.items,
                    values: item.values,
                })
            })
            .collect()
    }

    /// The column type of `schema`, at `path`.
    fn item(&self, schema: &'a Doc, path: &str, depth: usize) -> Result<JsonItem, String> {
        let unwrapped = self.unwrap_null(schema, depth)?;
        let nullable = unwrapped.nullable;
        let scalar = |kind: &str| JsonItem {
            kind: kind.to_string(),
            nullable,
            fields: Vec::new(),
            items: None,
            values: None,
        };
        let (Some(schema), Some(kind)) = (unwrapped.schema, unwrapped.kind) else {
            return match unwrapped.kind {
                Some(kind) => Ok(scalar(kind)),
                None if unwrapped.schema.is_some() => Ok(scalar("json")),
                None => Err(format!("property `{path}` only admits null")),
            };
        };
        let connect_type = schema.get("connect.type").and_then(Doc::as_str);
        Ok(match kind {
            "boolean" => scalar("boolean"),
            "integer" => scalar(match connect_type {
                Some(t @ ("int8" | "int16" | "int32")) => t,
                _ => "int64",
            }),
            "number" => match decimal(schema) {
                Some(decimal) => scalar(&decimal),
                None if connect_type == Some("float32") => scalar("float32"),
                None => scalar("float64"),
            },
            "string" => {
                let base64 = schema.get("contentEncoding").and_then(Doc::as_str) == Some("base64");
                scalar(match schema.get("format").and_then(Doc::as_str) {
                    _ if base64 => "binary",
                    Some("date-time") => "timestamptz(us)",
                    Some("date") => "date",
                    Some("uuid") => "uuid",
                    _ => "string",
                })
            }
            "object" if is_object_schema(schema) => JsonItem {
                kind: "struct".to_string(),
                nullable,
                fields: self.properties(schema, &format!("{path}."), depth + 1)?,
                items: None,
                values: None,
            },
            "object" => match schema.get("additionalProperties") {
                Some(values @ Doc::Object(_)) => JsonItem {
                    kind: "map".to_string(),
                    nullable,
                    fields: Vec::new(),
                    items: None,
                    values: Some(Box::new(self.item(
                        values,
                        &format!("{path}.*"),
                        depth + 1,
                    )?)),
                },
                _ => scalar("json"),
            },
            "array" => match schema.get("items") {
                Some(items @ Doc::Object(_)) if schema.get("prefixItems").is_none() => JsonItem {
                    kind: "list".to_string(),
                    nullable,
                    fields: Vec::new(),
                    items: Some(Box::new(self.item(
                        items,
                        &format!("{path}[]"),
                        depth + 1,
                    )?)),
                    values: None,
                },
                _ => scalar("json"),
            },
            "null" => return Err(format!("property `{path}` only admits null")),
            _ => scalar("json"),
        })
    }
}

/// The decimal type of a `number` schema: Kafka Connect's decimal annotation, or a `multipleOf` that is a power of
/// ten at most 1.
fn decimal(schema: &Doc) -> Option<String> {
    let parameters = schema.get("connect.parameters");
    let parameter = |name: &str| {
        parameters
            .and_then(|p| p.get(name))
            .and_then(Doc::scalar_text)
            .and_then(|v| v.parse::<u8>().ok())
    };
    if schema.get("title").and_then(Doc::as_str) == Some("org.apache.kafka.connect.data.Decimal") {
        let scale = parameter("scale")?;
        let precision = parameter("connect.decimal.precision")
            .unwrap_or(38)
            .max(scale);
        return Some(format!("decimal({precision}, {scale})"));
    }
    let text = schema.get("multipleOf")?.scalar_text()?;
    let scale = match text.as_str() {
        "1" | "1.0" => 0,
        _ => {
            let digits = text.strip_prefix("0.")?;
            let (zeros, one) = digits.split_at(digits.len().checked_sub(1)?);
            if one != "1" || zeros.chars().any(|c| c != '0') {
                return None;
            }
            u8::try_from(digits.len()).ok()?
        }
    };
    Some(format!("decimal(38, {scale})"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn doc(value: serde_json::Value) -> Doc {
        serde_json::from_value(value).unwrap()
    }

    fn kinds(schema: serde_json::Value) -> Vec<(String, String, bool)> {
        columns(&doc(schema))
            .unwrap()
            .into_iter()
            .map(|f| (f.name, f.kind, f.nullable))
            .collect()
    }

    #[test]
    fn scalar_properties_become_exact_columns() {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "required": ["id", "amount", "at"],
            "properties": {
                "id": {"type": "integer"},
                "small": {"type": "integer", "connect.type": "int16"},
                "amount": {"type": "number", "multipleOf": 0.01},
                "price": {"type": "number", "title": "org.apache.kafka.connect.data.Decimal",
                          "connect.parameters": {"scale": "3", "connect.decimal.precision": "12"}},
                "ratio": {"type": "number"},
                "at": {"type": "string", "format": "date-time"},
                "day": {"type": ["string", "null"], "format": "date"},
                "ref": {"type": "string", "format": "uuid"},
                "blob": {"type": "string", "contentEncoding": "base64"},
                "note": {"oneOf": [{"type": "null"}, {"type": "string"}]},
                "any": {},
                "either": {"type": ["string", "integer"]},
            }
        });
        let got = kinds(schema);
        let want = [
            ("id", "int64", false),
            ("small", "int16", true),
            ("amount", "decimal(38, 2)", false),
            ("price", "decimal(12, 3)", true),
            ("ratio", "float64", true),
            ("at", "timestamptz(us)", false),
            ("day", "date", true),
            ("ref", "uuid", true),
            ("blob", "binary", true),
            ("note", "string", true),
            ("any", "json", true),
            ("either", "json", true),
        ];
        for (name, kind, nullable) in want {
            let found = got
                .iter()
                .find(|(n, ..)| n == name)
                .unwrap_or_else(|| panic!("{name}"));
            assert_eq!((found.1.as_str(), found.2), (kind, nullable), "{name}");
        }
    }

    #[test]
    fn columns_follow_the_properties_as_written() {
        let schema: Doc = serde_json::from_str(
            r#"{"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}"#,
        )
        .unwrap();
        let names: Vec<String> = columns(&schema)
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(names, ["zeta", "alpha"]);
    }

    #[test]
    fn nested_objects_arrays_maps_and_local_references() {
        let schema = json!({
            "type": "object",
            "definitions": {"Line": {"type": "object", "required": ["qty"],
                                     "properties": {"qty": {"type": "integer"}}}},
            "properties": {
                "customer": {"type": "object", "properties": {"email": {"type": "string"}}},
                "lines": {"type": "array", "items": {"$ref": "#/definitions/Line"}},
                "tags": {"type": "object", "additionalProperties": {"type": "string"}},
            }
        });
        let fields = columns(&doc(schema)).unwrap();
        let lines = fields.iter().find(|f| f.name == "lines").unwrap();
        assert_eq!(lines.kind, "list");
        let item = lines.items.as_ref().unwrap();
        assert_eq!(
            (
                item.kind.as_str(),
                item.fields[0].kind.as_str(),
                item.fields[0].nullable
            ),
            ("struct", "int64", false)
        );
        let tags = fields.iter().find(|f| f.name == "tags").unwrap();
        assert_eq!(tags.values.as_ref().unwrap().kind, "string");
        for field in &fields {
            field.field().unwrap();
        }
    }

    #[test]
    fn what_has_no_columns_is_refused_naming_it() {
        let err = columns(&doc(json!({"type": "string"}))).unwrap_err();
        assert!(err.contains("root"), "{err}");
        let err = columns(&doc(
            json!({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}),
        ))
        .unwrap_err();
        assert!(err.contains("other.json"), "{err}");
        let recursive = json!({"type": "object", "definitions": {"A": {"$ref": "#/definitions/A"}},
                               "properties": {"a": {"$ref": "#/definitions/A"}}});
        assert!(columns(&doc(recursive)).unwrap_err().contains("recursive"));
        // A reference under a nested `$id` resolves against it (here to a string, not the root's integer).
        let rebased = json!({"type": "object",
            "definitions": {"c": {"type": "integer"},
                            "w": {"$id": "http://example.com/w.json",
                                  "definitions": {"c": {"type": "string"}, "a": {"$ref": "#/definitions/c"}}}},
            "properties": {"b": {"$ref": "#/definitions/w/definitions/a"}}});
        let err = columns(&doc(rebased)).unwrap_err();
        assert!(err.contains("http://example.com/w.json"), "{err}");
        // A nested `$id` with no reference under it changes nothing.
        let named = json!({"type": "object", "$id": "http://example.com/root.json",
            "properties": {"a": {"$id": "http://example.com/a.json", "type": "integer"}}});
        assert_eq!(columns(&doc(named)).unwrap().len(), 1);
        let err = columns(&doc(
            json!({"type": "object", "properties": {"z": {"type": "null"}}}),
        ))
        .unwrap_err();
        assert!(err.contains("`z`"), "{err}");
    }
}
