//! A JSON document that keeps its objects' keys in the order they are written: a schema's properties become
//! columns in the author's order (serde_json's `Value` sorts them).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// A JSON value whose objects keep their key order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Doc {
    /// An object's entries, in order.
    Object(Vec<(String, Doc)>),
    /// An array.
    Array(Vec<Doc>),
    /// A string, number, boolean or null.
    Scalar(Value),
}

impl Doc {
    /// The value of `key`, when this is an object that has it.
    pub(crate) fn get(&self, key: &str) -> Option<&Doc> {
        match self {
            Doc::Object(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// This as a `serde_json::Value` (objects' keys sorted; a key written twice: the last one).
    pub(crate) fn to_value(&self) -> Value {
        match self {
            Doc::Object(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_value()))
                    .collect(),
            ),
            Doc::Array(items) => Value::Array(items.iter().map(Doc::to_value).collect()),
            Doc::Scalar(value) => value.clone(),
        }
    }

    /// Whether this has the key `wanted` anywhere (itself or any value below it).
    pub(crate) fn has_key(&self, wanted: &str) -> bool {
        match self {
            Doc::Object(entries) => entries
                .iter()
                .any(|(key, value)| key == wanted || value.has_key(wanted)),
            Doc::Array(items) => items.iter().any(|item| item.has_key(wanted)),
            Doc::Scalar(_) => false,
        }
    }

    /// The first `$id` below the root (the root's own is not looked at) with a `$ref` under it: such a reference
    /// resolves against that `$id`'s resource, not against the document.
    pub(crate) fn nested_id_over_ref(&self) -> Option<&str> {
        fn under(doc: &Doc) -> Option<&str> {
            match doc {
                Doc::Object(entries) => {
                    let own = doc
                        .get("$id")
                        .and_then(Doc::as_str)
                        .filter(|_| doc.has_key("$ref"));
                    own.or_else(|| entries.iter().find_map(|(_, value)| under(value)))
                }
                Doc::Array(items) => items.iter().find_map(under),
                Doc::Scalar(_) => None,
            }
        }
        match self {
            Doc::Object(entries) => entries.iter().find_map(|(_, value)| under(value)),
            Doc::Array(items) => items.iter().find_map(under),
            Doc::Scalar(_) => None,
        }
    }

    /// The string this is.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Doc::Scalar(Value::String(s)) => Some(s),
            _ => None,
        }
    }

    /// The items of the array this is.
    pub(crate) fn as_array(&self) -> Option<&[Doc]> {
        match self {
            Doc::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The entries of the object this is.
    pub(crate) fn as_object(&self) -> Option<&[(String, Doc)]> {
        match self {
            Doc::Object(entries) => Some(entries),
            _ => None,
        }
    }

    /// The value at a JSON pointer (RFC 6901: `/definitions/Line`, `~1` for `/`, `~0` for `~`).
    pub(crate) fn pointer(&self, pointer: &str) -> Option<&Doc> {
        if pointer.is_empty() {
            return Some(self);
        }
        let mut here = self;
        for token in pointer.strip_prefix('/')?.split('/') {
            let token = token.replace("~1", "/").replace("~0", "~");
            here = match here {
                Doc::Object(_) => here.get(&token)?,
                Doc::Array(items) => items.get(token.parse::<usize>().ok()?)?,
                Doc::Scalar(_) => return None,
            };
        }
        Some(here)
    }

    /// The text of a scalar (a number as written: `0.01`).
    pub(crate) fn scalar_text(&self) -> Option<String> {
        match self {
            Doc::Scalar(Value::String(s)) => Some(s.clone()),
            Doc::Scalar(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DocVisitor)
    }
}

struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = Doc;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::Bool(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::from(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::String(v.to_string())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::String(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::Null))
    }

    fn visit_none<E: de::Error>(self) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Doc, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Doc::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
        let mut entries: Vec<(String, Doc)> = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Doc>()? {
            // A repeated key: the last one counts, as for serde_json's Value.
            entries.retain(|(k, _)| *k != key);
            entries.push((key, value));
        }
        Ok(Doc::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_order_and_pointers_resolve() {
        let doc: Doc =
            serde_json::from_str(r#"{"z": 1, "a": {"m~n": [true, {"x/y": 0.01}]}, "b": null}"#)
                .unwrap();
        let keys: Vec<&str> = doc
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(keys, ["z", "a", "b"]);
        let step = doc.pointer("/a/m~0n/1/x~1y").unwrap();
        assert_eq!(step.scalar_text().as_deref(), Some("0.01"));
        assert!(doc.pointer("/a/nothing").is_none());
    }
}
