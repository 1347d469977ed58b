//! A writer's JSON Schema with its local `$ref`s replaced by what they point at, for [`super::implied`]: schema
//! generators (Kafka Connect's, Jackson's, pydantic's) name a record's pieces in `definitions` / `$defs` and refer
//! to them, and such a schema says no more than the same schema written out. Inlined, it may qualify as
//! structural, and its records are then checked by the strict decoding instead of being validated whole.
//!
//! Only what keeps the meaning exactly is inlined, else nothing is (and the validator judges the records):
//! - a `$ref` must be the only key of its object (from draft 2019-09 on, keywords beside a `$ref` apply as well;
//!   before, they are ignored: either way, that schema is not the target alone);
//! - it must be a pointer into this document (`#/...`, without percent-encoding), resolved against the root: no
//!   `$id` anywhere below the root (on the way to a target, or in it) may move the base a pointer is resolved
//!   against;
//! - references that nest deeper than [`MAX_DEPTH`] (a recursive schema) or would write out more than
//!   [`MAX_NODES`] values are not inlined;
//! - the values of `enum`, `const`, `default` and `examples` are data, not schemas: they are kept as written.
//!
//! The root's `definitions` and `$defs` are left out of the result: a validator never applies them by themselves,
//! and every reference into them has been replaced.

use super::doc::Doc;

/// How deep `$ref`s may nest (a reference in what a reference points at, ...) before the schema counts as recursive.
const MAX_DEPTH: usize = 32;
/// How many values inlining may write out: references used many times over would otherwise grow the schema without
/// bound.
const MAX_NODES: usize = 10_000;

/// Keywords whose values are data (an instance), never a schema.
const DATA_KEYWORDS: [&str; 4] = ["enum", "const", "default", "examples"];

/// `schema` with every local `$ref` replaced by what it points at and the root's definitions left out; `None` when
/// it has no `$ref` or one cannot be inlined exactly (see the module's rules).
pub(crate) fn inlined(schema: &Doc) -> Option<Doc> {
    if !schema.has_key("$ref") || nested_id(schema) {
        return None;
    }
    let mut budget = MAX_NODES;
    let Doc::Object(entries) = inline(schema, schema, 0, &mut budget)? else {
        return None;
    };
    Some(Doc::Object(
        entries
            .into_iter()
            .filter(|(key, _)| key != "definitions" && key != "$defs")
            .collect(),
    ))
}

/// Whether any value below the root has an `$id` (a property named so counts too: refusing is safe).
fn nested_id(root: &Doc) -> bool {
    match root {
        Doc::Object(entries) => entries.iter().any(|(_, value)| value.has_key("$id")),
        Doc::Array(items) => items.iter().any(|item| item.has_key("$id")),
        Doc::Scalar(_) => false,
    }
}

/// `here` (a schema, or a value holding schemas) inlined against `root`, `depth` references deep.
fn inline(root: &Doc, here: &Doc, depth: usize, budget: &mut usize) -> Option<Doc> {
    *budget = budget.checked_sub(1)?;
    match here {
        Doc::Object(entries) => {
            if let Some(reference) = here.get("$ref") {
                let pointer = reference.as_str()?.strip_prefix('#')?;
                if entries.len() != 1 || depth >= MAX_DEPTH || pointer.contains('%') {
                    return None;
                }
                return inline(root, root.pointer(pointer)?, depth + 1, budget);
            }
            let mut out = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                let value = match DATA_KEYWORDS.contains(&key.as_str()) {
                    true => value.clone(),
                    false => inline(root, value, depth, budget)?,
                };
                out.push((key.clone(), value));
            }
            Some(Doc::Object(out))
        }
        Doc::Array(items) => items
            .iter()
            .map(|item| inline(root, item, depth, budget))
            .collect::<Option<Vec<_>>>()
            .map(Doc::Array),
        Doc::Scalar(_) => Some(here.clone()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn doc(value: serde_json::Value) -> Doc {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn local_references_are_written_out_and_the_definitions_left_out() {
        let schema = doc(json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "definitions": {
                "id": {"type": "integer", "minimum": 0},
                "line": {"type": "object", "properties": {"sku": {"$ref": "#/$defs/sku"}}},
            },
            "$defs": {"sku": {"type": "string"}},
            "properties": {
                "id": {"$ref": "#/definitions/id"},
                "lines": {"type": "array", "items": {"$ref": "#/definitions/line"}},
                "kind": {"type": "string", "enum": [{"$ref": "#/definitions/id"}], "default": {"$ref": "x"}},
            },
        }));
        let expected = doc(json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 0},
                "lines": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}}}},
                "kind": {"type": "string", "enum": [{"$ref": "#/definitions/id"}], "default": {"$ref": "x"}},
            },
        }));
        assert_eq!(inlined(&schema), Some(expected));
    }

    #[test]
    fn what_cannot_be_inlined_exactly_is_not_inlined_at_all() {
        let plain = json!({"type": "object", "properties": {"id": {"type": "integer"}}});
        assert_eq!(inlined(&doc(plain)), None, "nothing to inline");
        let with = |id: serde_json::Value, defs: serde_json::Value| {
            doc(json!({"type": "object", "definitions": defs, "properties": {"id": id}}))
        };
        let cases = [
            // Keywords beside the reference.
            with(
                json!({"$ref": "#/definitions/a", "minimum": 1}),
                json!({"a": {"type": "integer"}}),
            ),
            // Another document.
            with(json!({"$ref": "other.json#/a"}), json!({})),
            // Nowhere.
            with(json!({"$ref": "#/definitions/b"}), json!({})),
            // Recursive.
            with(
                json!({"$ref": "#/definitions/a"}),
                json!({"a": {"type": "object", "properties": {"next": {"$ref": "#/definitions/a"}}}}),
            ),
            // A base moved by an `$id` below the root.
            with(
                json!({"$id": "http://example.com/x", "type": "object",
                       "properties": {"a": {"$ref": "#/definitions/a"}}}),
                json!({"a": {"type": "integer"}}),
            ),
            // An `$id` on the way to the target: the validator resolves the target's own `$ref` against it.
            with(
                json!({"$ref": "#/definitions/w/definitions/a"}),
                json!({"c": {"type": "integer"},
                       "w": {"$id": "http://example.com/w.json",
                             "definitions": {"c": {"type": "string"}, "a": {"$ref": "#/definitions/c"}}}}),
            ),
            // Percent-encoded pointers.
            with(
                json!({"$ref": "#/definitions/a%20b"}),
                json!({"a b": {"type": "integer"}, "a%20b": {"type": "string"}}),
            ),
        ];
        for schema in cases {
            assert_eq!(inlined(&schema), None, "{schema:?}");
        }
        // References used twice at every level: the written-out schema would double per level.
        let mut defs = serde_json::Map::new();
        defs.insert("d0".into(), json!({"type": "integer"}));
        for level in 1..=20 {
            let below = format!("#/definitions/d{}", level - 1);
            defs.insert(
                format!("d{level}"),
                json!({"type": "object", "properties": {"a": {"$ref": below}, "b": {"$ref": below}}}),
            );
        }
        let wide = with(json!({"$ref": "#/definitions/d20"}), json!(defs));
        assert_eq!(inlined(&wide), None);
    }
}
