//! Whether a writer's JSON Schema says nothing the strict decoding of the columns does not already enforce: then
//! every document the schema refuses, the decoding refuses too (naming the field), and validating each record
//! against the schema first would only repeat the work.
//!
//! Only *structural* schemas qualify, checked keyword by keyword, nothing assumed (but for the bounds of top-level
//! scalars, below): objects with `properties`,
//! `required` and `additionalProperties` (absent, `true`, or `false` with `unknown_fields = "fail"`), arrays with
//! `items`, `boolean`, `integer`, `number` (without `multipleOf`), `string` (without `format` or
//! `contentEncoding`), `null` only beside one other type (`["T", "null"]`, or `anyOf` / `oneOf` of `{"type":
//! "null"}` and one schema of a single type), and annotations (`title`, `description`, `$id`, `default`,
//! `examples`, Kafka Connect's `connect.type`, `connect.index`, `connect.version`; `$schema` when it names draft 6
//! or later, whose `integer` is any number without a fraction, as the decoding's is). Each property must be
//! `required` exactly when it does not admit `null` (the decoding reads a missing key and a `null` alike: a required
//! property that admits null, or an optional one that does not, is enforced by the validator only), and `required`
//! must name properties only. The decoding must refuse undeclared keys (`unknown_fields = "fail"`, the default: an
//! ignored key's value is not checked at all). The columns must be the ones the schema itself gives. Anything else
//! (`format`, `pattern`, `enum`, `const`, `allOf`, maps, decimals, bounds below the top level, ...) keeps
//! the validator. Local `$ref`s are judged written out ([`super::inline`]): a `$ref` that cannot be written out
//! exactly keeps the validator too. A top-level `integer` or `number` property may also have `minimum`, `maximum`,
//! `exclusiveMinimum`, `exclusiveMaximum`, a top-level `integer` a whole `multipleOf`, and a top-level `string`
//! `minLength`, `maxLength`: those bounds are returned, and the decoding checks each record's value against them
//! right after reading it ([`super::bounds`]). So are a top-level string's `pattern`, `enum` and `const`, an
//! integer's or number's `enum` and `const`, and an integer's fractional `multipleOf` (`enum` and `const` only on a
//! property that does not admit null): they are returned as a schema of their own, and each record's decoded value
//! is validated against it alone, which is far cheaper than parsing and validating the whole document.
//!
//! Why this holds for what qualifies: the strict decoding refuses a value of another JSON type than its column's
//! (`boolean` takes `true`/`false` only, integers take numbers with no fraction, which JSON Schema's `integer` also
//! is, floats take numbers only, strings take strings only, structs objects and lists arrays), refuses `null` and
//! a missing key where the column is not nullable, and refuses undeclared keys with `unknown_fields = "fail"`. The
//! decoding may refuse more (an integer beyond `int64`, a key twice): those records are bad either way.

use super::bounds::{Bounds, INTEGER_KEYWORD, NUMBER_KEYWORDS, STRING_KEYWORDS};
use super::doc::Doc;
use crate::json_rows::UnknownFields;
use crate::json_types::JsonField;

/// Keywords that annotate and constrain nothing.
const ANNOTATIONS: [&str; 8] = [
    "title",
    "description",
    "$id",
    "default",
    "examples",
    "connect.type",
    "connect.index",
    "connect.version",
];

/// Keywords of a top-level string property checked by a validator of that property alone, on the decoded value.
const STRING_VALIDATED: [&str; 3] = ["pattern", "enum", "const"];
/// The same for an integer (a fractional `multipleOf`; a whole one is a [`Bounds`]) or a number property.
const NUMBER_VALIDATED: [&str; 3] = ["enum", "const", "multipleOf"];
/// Validated keywords that also judge `null`, so they qualify only on a property that does not admit it (the
/// decoding reads a missing key and `null` alike, and only `null` would be judged).
const JUDGE_NULL: [&str; 2] = ["enum", "const"];

/// What is checked on one top-level property's decoded value instead of validating the whole document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PropertyCheck {
    /// The property.
    pub(crate) name: String,
    /// Its bounds, checked exactly.
    pub(crate) bounds: Bounds,
    /// A schema of its keywords that only a validator checks (`pattern`, `enum`, `const`, a fractional
    /// `multipleOf`), for a validator of the value alone; `None`: none.
    pub(crate) validated: Option<serde_json::Value>,
}

/// Whether the strict decoding of `columns` (read with `unknown`), with the checks returned run on each record's
/// top-level values, refuses every document `schema` (whose own columns are `writer`) refuses: the checks by
/// property when it does, `None` when the validator must judge the whole document.
pub(crate) fn implied(
    schema: &Doc,
    writer: &[JsonField],
    columns: &[JsonField],
    unknown: UnknownFields,
) -> Option<Vec<PropertyCheck>> {
    let draft_6_or_later = match schema.get("$schema") {
        None => true,
        Some(draft) => draft.as_str().is_some_and(|uri| {
            ["draft-06", "draft-07", "2019-09", "2020-12"]
                .iter()
                .any(|d| uri.contains(d))
        }),
    };
    if writer != columns || unknown != UnknownFields::Fail || !draft_6_or_later {
        return None;
    }
    let mut bounds = Vec::new();
    object_with(schema, unknown, |key| key == "$schema", Some(&mut bounds)).then_some(bounds)
}

/// Whether `schema` is an object schema that qualifies, its properties too (no bounds: it is not the root).
fn object(schema: &Doc, unknown: UnknownFields) -> bool {
    object_with(schema, unknown, |_| false, None)
}

/// [`object`], with the keys `also` admits besides (the root's `$schema`); with `bounds` (the root), its scalar
/// properties may have bounds, gathered there.
fn object_with(
    schema: &Doc,
    unknown: UnknownFields,
    also: impl Fn(&str) -> bool,
    mut bounds: Option<&mut Vec<PropertyCheck>>,
) -> bool {
    let allowed = |key: &str| {
        ANNOTATIONS.contains(&key)
            || also(key)
            || matches!(
                key,
                "type" | "properties" | "required" | "additionalProperties"
            )
    };
    if !keys_in(schema, allowed) || non_null_type(schema) != Some("object") {
        return false;
    }
    match schema.get("additionalProperties") {
        None => {}
        Some(Doc::Scalar(serde_json::Value::Bool(true))) => {}
        Some(Doc::Scalar(serde_json::Value::Bool(false))) if unknown == UnknownFields::Fail => {}
        Some(_) => return false,
    }
    let Some(properties) = schema.get("properties").and_then(Doc::as_object) else {
        return false;
    };
    let required: Vec<&str> = match schema.get("required") {
        None => Vec::new(),
        Some(names) => match names.as_array() {
            Some(names) => names.iter().filter_map(Doc::as_str).collect(),
            None => return false,
        },
    };
    // A required name that is no property: only the validator refuses its absence.
    if !required
        .iter()
        .all(|name| properties.iter().any(|(p, _)| p == name))
    {
        return false;
    }
    for (name, property) in properties {
        let Some((admits_null, value)) = without_null(property) else {
            return false;
        };
        let bounded = bounds
            .as_deref_mut()
            .map(|b| (name.as_str(), admits_null, b));
        if required.contains(&name.as_str()) == admits_null
            || !value_schema(value, unknown, bounded)
        {
            return false;
        }
    }
    true
}

/// Whether the schema of a non-null value qualifies; with `bounds` (a top-level property's name, whether it admits
/// null, and where its checks go), a scalar's bounds and validated keywords qualify too.
fn value_schema(
    schema: &Doc,
    unknown: UnknownFields,
    bounds: Option<(&str, bool, &mut Vec<PropertyCheck>)>,
) -> bool {
    match non_null_type(schema) {
        Some("object") => object(schema, unknown),
        Some("array") => {
            let allowed = |key: &str| ANNOTATIONS.contains(&key) || matches!(key, "type" | "items");
            keys_in(schema, allowed)
                && schema.get("items").is_some_and(|items| {
                    // An item is null only where its schema admits null: the decoding's item nullability is the same.
                    without_null(items).is_some_and(|(_, item)| value_schema(item, unknown, None))
                })
        }
        Some(ty @ ("boolean" | "integer" | "number" | "string")) => {
            let (bound_keys, validated_keys): (&[&str], &[&str]) = match (ty, &bounds) {
                (_, None) => (&[], &[]),
                ("integer", Some(_)) => (&NUMBER_KEYWORDS, &NUMBER_VALIDATED),
                // A number's multipleOf makes its column a decimal (a power of ten), whose values are not read
                // back for a check: the validator's.
                ("number", Some(_)) => (&NUMBER_KEYWORDS, &NUMBER_VALIDATED[..2]),
                ("string", Some(_)) => (&STRING_KEYWORDS, &STRING_VALIDATED),
                _ => (&[], &[]),
            };
            let admits_null = bounds.as_ref().is_some_and(|(_, null, _)| *null);
            let validated = |key: &str| {
                validated_keys.contains(&key) && !(admits_null && JUDGE_NULL.contains(&key))
            };
            if !keys_in(schema, |key| {
                ANNOTATIONS.contains(&key)
                    || key == "type"
                    || bound_keys.contains(&key)
                    || validated(key)
            }) {
                return false;
            }
            let Some((name, _, gathered)) = bounds else {
                return true;
            };
            let Some(found) = Bounds::of(schema) else {
                return false;
            };
            // A whole multipleOf is a bound; any other, the property's validator's.
            let whole = |key: &str| key == INTEGER_KEYWORD && found.has_multiple_of();
            let keywords: serde_json::Map<String, serde_json::Value> = match schema {
                Doc::Object(entries) => entries
                    .iter()
                    .filter(|(key, _)| validated(key) && !whole(key))
                    .map(|(key, value)| (key.clone(), value.to_value()))
                    .collect(),
                _ => serde_json::Map::new(),
            };
            let validated = (!keywords.is_empty()).then_some(serde_json::Value::Object(keywords));
            if !found.is_empty() || validated.is_some() {
                gathered.push(PropertyCheck {
                    name: name.to_string(),
                    bounds: found,
                    validated,
                });
            }
            true
        }
        _ => false,
    }
}

/// Whether a property's schema admits `null`, and the schema of its other values: a single type, `["T", "null"]`,
/// or an `anyOf` / `oneOf` of `{"type": "null"}` and one schema. `None` for any other shape.
fn without_null(schema: &Doc) -> Option<(bool, &Doc)> {
    if let Some(types) = schema.get("type").and_then(Doc::as_array) {
        let named: Vec<&str> = types.iter().filter_map(Doc::as_str).collect();
        return match named.as_slice() {
            [_] => Some((false, schema)),
            [a, "null"] | ["null", a] if *a != "null" => Some((true, schema)),
            _ => None,
        };
    }
    for union in ["anyOf", "oneOf"] {
        let Some(branches) = schema.get(union).and_then(Doc::as_array) else {
            continue;
        };
        let others = |key: &str| ANNOTATIONS.contains(&key) || key == union;
        if !keys_in(schema, others) {
            return None;
        }
        let is_null = |b: &Doc| {
            b.get("type").and_then(Doc::as_str) == Some("null")
                && keys_in(b, |key| ANNOTATIONS.contains(&key) || key == "type")
        };
        // The other branch names one type, so it does not admit null too (`oneOf` would then refuse a null that
        // both branches take).
        let single = |b: &Doc| {
            b.get("type")
                .and_then(Doc::as_str)
                .is_some_and(|t| t != "null")
        };
        return match branches {
            [a, b] if is_null(a) && single(b) => Some((true, b)),
            [a, b] if is_null(b) && single(a) => Some((true, a)),
            _ => None,
        };
    }
    schema
        .get("type")
        .and_then(Doc::as_str)
        .map(|_| (false, schema))
}

/// The one type other than `null` that `schema`'s `type` names (a string, or an array of it and maybe `null`).
fn non_null_type(schema: &Doc) -> Option<&str> {
    match schema.get("type")? {
        Doc::Array(types) => {
            let others: Vec<&str> = types
                .iter()
                .filter_map(Doc::as_str)
                .filter(|t| *t != "null")
                .collect();
            match others.as_slice() {
                [one] if types.len() <= 2 => Some(one),
                _ => None,
            }
        }
        other => other.as_str(),
    }
}

/// Whether every key of object `schema` is `allowed`.
fn keys_in(schema: &Doc, allowed: impl Fn(&str) -> bool) -> bool {
    schema
        .as_object()
        .is_some_and(|entries| entries.iter().all(|(key, _)| allowed(key)))
}

#[cfg(test)]
mod tests {
    use super::super::columns::columns;
    use super::*;
    use crate::json_rows::{JsonRows, RowContext};
    use crate::json_types::JsonDecoding;

    fn qualifies(schema: &str, unknown: UnknownFields) -> bool {
        let doc: Doc = serde_json::from_str(schema).unwrap();
        let fields = columns(&doc).unwrap();
        implied(&doc, &fields, &fields, unknown).is_some()
    }

    const ORDER: &str = r#"{"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order",
        "type": "object", "required": ["id", "tags", "customer"], "additionalProperties": false,
        "properties": {
          "id": {"type": "integer", "connect.type": "int64"},
          "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
          "score": {"type": ["number", "null"]},
          "paid": {"oneOf": [{"type": "boolean"}, {"type": "null"}]},
          "tags": {"type": "array", "items": {"type": "string"}},
          "customer": {"type": "object", "properties": {"email": {"type": ["string", "null"]}}},
          "extra": {"type": ["object", "null"], "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        }}"#;

    #[test]
    fn structural_schemas_qualify_and_constraints_keep_the_validator() {
        assert!(qualifies(ORDER, UnknownFields::Fail));
        // The decoding must refuse undeclared keys (an ignored key's value is not read).
        assert!(!qualifies(ORDER, UnknownFields::Ignore));
        for (from, to) in [
            // A bound below the top level.
            (
                r#""email": {"type": ["string", "null"]}"#,
                r#""email": {"type": ["string", "null"], "minLength": 1}"#,
            ),
            (
                r#""type": "integer", "connect.type""#,
                r#""type": "integer", "minimum": "zero", "connect.type""#,
            ),
            (
                r#"{"type": "string"}}"#,
                r#"{"type": "string", "format": "email"}}"#,
            ),
            (
                r#"{"type": "string"}}"#,
                r#"{"type": "string", "maxLength": 3}}"#,
            ),
            // A required property that admits null, an optional one that does not.
            (
                r#""required": ["id", "tags", "customer"]"#,
                r#""required": ["id", "tags", "customer", "note"]"#,
            ),
            (
                r#""required": ["id", "tags", "customer"]"#,
                r#""required": ["id", "customer"]"#,
            ),
            (
                r#""items": {"type": "string"}"#,
                r#""items": {"type": "string", "enum": ["a"]}"#,
            ),
            (
                r#""additionalProperties": false"#,
                r#""additionalProperties": {"type": "string"}"#,
            ),
            // A required name that is no property; a oneOf whose other branch admits null too; draft 4, whose
            // integers have no point.
            (
                r#""required": ["id", "tags", "customer"]"#,
                r#""required": ["id", "tags", "customer", "ghost"]"#,
            ),
            (
                r#"{"oneOf": [{"type": "boolean"}, {"type": "null"}]}"#,
                r#"{"oneOf": [{"type": ["boolean", "null"]}, {"type": "null"}]}"#,
            ),
            ("draft-07", "draft-04"),
        ] {
            assert!(ORDER.contains(from), "{from}");
            let changed = ORDER.replacen(from, to, 1);
            assert!(!qualifies(&changed, UnknownFields::Fail), "{to}");
        }
        // Bounds of top-level scalars qualify, returned to be checked after decoding.
        let bounded = ORDER.replacen(
            r#""type": "integer", "connect.type""#,
            r#""type": "integer", "minimum": 0, "maximum": 10, "connect.type""#,
            1,
        );
        let doc: Doc = serde_json::from_str(&bounded).unwrap();
        let fields = columns(&doc).unwrap();
        let bounds = implied(&doc, &fields, &fields, UnknownFields::Fail).unwrap();
        assert_eq!(bounds.len(), 1);
        assert_eq!(bounds[0].name, "id");
    }

    /// Every document the validator refuses, the decoding refuses (the documents probe each keyword).
    #[test]
    fn what_the_validator_refuses_the_decoding_refuses() {
        let doc: Doc = serde_json::from_str(ORDER).unwrap();
        let fields = columns(&doc).unwrap();
        assert_eq!(
            implied(&doc, &fields, &fields, UnknownFields::Fail),
            Some(Vec::new())
        );
        let validator = jsonschema::validator_for(&serde_json::from_str(ORDER).unwrap()).unwrap();
        let decoding = JsonDecoding::declared(&fields, UnknownFields::Fail).unwrap();
        let base = serde_json::json!({"id": 1, "note": "n", "score": 1.5, "paid": true, "tags": ["a"],
                                      "customer": {"email": "e"}});
        let mut documents = vec![base.clone()];
        let probes = [
            serde_json::json!(null),
            serde_json::json!(true),
            serde_json::json!(1),
            serde_json::json!(1.0),
            serde_json::json!(1.5),
            serde_json::json!(-7),
            serde_json::json!("1"),
            serde_json::json!("text"),
            serde_json::json!([]),
            serde_json::json!([null]),
            serde_json::json!(["a", 1]),
            serde_json::json!({}),
            serde_json::json!({"email": null}),
            serde_json::json!({"email": 3}),
            serde_json::json!({"email": "e", "other": 1}),
            serde_json::json!({"n": 1}),
            serde_json::json!({"n": null}),
            serde_json::json!({"n": "1"}),
        ];
        for key in ["id", "note", "score", "paid", "tags", "customer", "extra"] {
            let mut missing = base.clone();
            missing.as_object_mut().unwrap().remove(key);
            documents.push(missing);
            for probe in &probes {
                let mut changed = base.clone();
                changed[key] = probe.clone();
                documents.push(changed);
            }
        }
        let mut extra = base.clone();
        extra["undeclared"] = serde_json::json!(1);
        documents.push(extra);
        let mut refused = 0;
        for document in documents {
            let text = document.to_string();
            let mut rows = JsonRows::new(decoding.schema().fields(), UnknownFields::Fail, 1);
            let decoded = rows
                .append(text.as_bytes(), &mut RowContext::default())
                .is_ok();
            if !validator.is_valid(&document) {
                refused += 1;
                assert!(
                    !decoded,
                    "the validator refuses {text}, the decoding takes it"
                );
            }
        }
        assert!(refused > 40, "{refused}");
    }
}
