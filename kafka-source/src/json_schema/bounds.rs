//! Bounds a JSON Schema puts on a top-level scalar property (`minimum`, `maximum`, `exclusiveMinimum`,
//! `exclusiveMaximum` on a number or integer, a whole `multipleOf` on an integer, `minLength`, `maxLength` on a
//! string), checked on the value the strict
//! decoding just read instead of validating the whole document ([`super::implied`]). The comparisons are exact:
//! an integer against a fractional bound compares with the bound's floor and ceiling, not through `f64`; a string's
//! length counts Unicode code points, as JSON Schema does.

use std::cmp::Ordering;

use serde_json::Number;

use super::doc::Doc;
use crate::json_rows::Read;

/// The bounds of one property (every one absent: no bound).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Bounds {
    minimum: Option<Number>,
    maximum: Option<Number>,
    exclusive_minimum: Option<Number>,
    exclusive_maximum: Option<Number>,
    /// A whole `multipleOf` (of an integer property; a fractional one is checked by the property's own
    /// validator, `implied::PropertyCheck::validated`).
    multiple_of: Option<u64>,
    min_length: Option<u64>,
    max_length: Option<u64>,
}

/// The keywords [`Bounds`] reads, by the JSON type they apply to.
pub(crate) const NUMBER_KEYWORDS: [&str; 4] =
    ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
pub(crate) const STRING_KEYWORDS: [&str; 2] = ["minLength", "maxLength"];
/// The keyword [`Bounds`] reads on an integer only.
pub(crate) const INTEGER_KEYWORD: &str = "multipleOf";

impl Bounds {
    /// The bounds `schema` states; `None` when a bound keyword's value is not what JSON Schema (draft 6 or later)
    /// allows there (the validator then judges the schema).
    pub(crate) fn of(schema: &Doc) -> Option<Self> {
        let number = |key: &str| -> Option<Option<Number>> {
            match schema.get(key) {
                None => Some(None),
                Some(Doc::Scalar(serde_json::Value::Number(n))) => Some(Some(n.clone())),
                Some(_) => None,
            }
        };
        let length = |key: &str| -> Option<Option<u64>> {
            match schema.get(key) {
                None => Some(None),
                Some(Doc::Scalar(serde_json::Value::Number(n))) => n.as_u64().map(Some),
                Some(_) => None,
            }
        };
        Some(Self {
            minimum: number("minimum")?,
            maximum: number("maximum")?,
            exclusive_minimum: number("exclusiveMinimum")?,
            exclusive_maximum: number("exclusiveMaximum")?,
            multiple_of: match schema.get(INTEGER_KEYWORD) {
                None => None,
                Some(Doc::Scalar(serde_json::Value::Number(n)))
                    if n.as_f64().is_some_and(|m| m > 0.0) =>
                {
                    n.as_u64()
                }
                Some(_) => return None,
            },
            min_length: length("minLength")?,
            max_length: length("maxLength")?,
        })
    }

    /// Whether a whole `multipleOf` is among the bounds.
    pub(crate) fn has_multiple_of(&self) -> bool {
        self.multiple_of.is_some()
    }

    /// Whether no bound is set.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// What `value` violates, as the validator would say it; `None` when it is within every bound.
    pub(crate) fn violation(&self, value: Read<'_>) -> Option<String> {
        let compare = |bound: &Number| -> Option<Ordering> {
            match value {
                Read::Integer(v) => Some(compare_integer(v, bound)),
                Read::Float(v) => v.partial_cmp(&bound.as_f64()?),
                Read::Null | Read::Text(_) => None,
            }
        };
        let shown = || match value {
            Read::Integer(v) => v.to_string(),
            Read::Float(v) => v.to_string(),
            Read::Text(v) => serde_json::Value::from(v).to_string(),
            Read::Null => "null".to_string(),
        };
        let checks: [NumberCheck<'_>; 4] = [
            (
                &self.minimum,
                |o| o == Ordering::Less,
                "less than the minimum of",
            ),
            (
                &self.maximum,
                |o| o == Ordering::Greater,
                "greater than the maximum of",
            ),
            (
                &self.exclusive_minimum,
                |o| o != Ordering::Greater,
                "less than or equal to the minimum of",
            ),
            (
                &self.exclusive_maximum,
                |o| o != Ordering::Less,
                "greater than or equal to the maximum of",
            ),
        ];
        for (bound, violates, what) in checks {
            if let Some(bound) = bound
                && compare(bound).is_some_and(violates)
            {
                return Some(format!("{} is {what} {bound}", shown()));
            }
        }
        if let (Read::Integer(v), Some(m)) = (value, self.multiple_of)
            && i128::from(v) % i128::from(m) != 0
        {
            return Some(format!("{v} is not a multiple of {m}"));
        }
        if let Read::Text(text) = value {
            let length = text.chars().count() as u64;
            if let Some(min) = self.min_length.filter(|min| length < *min) {
                return Some(format!(
                    "{} is shorter than {min} character{}",
                    shown(),
                    plural(min)
                ));
            }
            if let Some(max) = self.max_length.filter(|max| length > *max) {
                return Some(format!(
                    "{} is longer than {max} character{}",
                    shown(),
                    plural(max)
                ));
            }
        }
        None
    }
}

/// A numeric bound, what comparison of the value with it violates it, and how the violation reads.
type NumberCheck<'b> = (&'b Option<Number>, fn(Ordering) -> bool, &'static str);

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `value` against `bound` exactly: an integral bound compares as an integer, a fractional one by its floor.
fn compare_integer(value: i64, bound: &Number) -> Ordering {
    if let Some(bound) = bound.as_i64() {
        return value.cmp(&bound);
    }
    if bound.as_u64().is_some() {
        return Ordering::Less; // beyond i64::MAX
    }
    let Some(bound) = bound.as_f64() else {
        return Ordering::Equal;
    };
    // Beyond i64's range (2^63 is exact as an f64): every value is below, or above.
    const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
    if bound >= TWO_TO_63 {
        return Ordering::Less;
    }
    if bound < -TWO_TO_63 {
        return Ordering::Greater;
    }
    let floor = bound.floor();
    match value.cmp(&(floor as i64)) {
        Ordering::Equal if floor != bound => Ordering::Less,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(schema: &str) -> Bounds {
        Bounds::of(&serde_json::from_str(schema).unwrap()).unwrap()
    }

    /// Each bound agrees with the jsonschema validator, value by value (integers, floats, strings at the edges).
    #[test]
    fn bounds_judge_as_the_validator_does() {
        let schemas = [
            r#"{"type": "integer", "minimum": 0}"#,
            r#"{"type": "integer", "minimum": 0.5, "maximum": 10.5}"#,
            r#"{"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 7}"#,
            r#"{"type": "integer", "maximum": -2.5}"#,
            r#"{"type": "integer", "maximum": 18446744073709551615}"#,
            r#"{"type": "integer", "exclusiveMinimum": -9.25e18, "exclusiveMaximum": 9.25e18}"#,
            r#"{"type": "integer", "multipleOf": 1}"#,
            r#"{"type": "integer", "multipleOf": 5, "minimum": -9}"#,
            r#"{"type": "number", "minimum": 0.1, "exclusiveMaximum": 2}"#,
            r#"{"type": "string", "minLength": 2, "maxLength": 3}"#,
        ];
        let integers = [i64::MIN, -9, -4, -3, -2, 0, 1, 7, 10, 11, i64::MAX];
        let floats = [-1.0, 0.0, 0.1, 0.10000000000000002, 1.5, 2.0, 3.0];
        let texts = [
            "",
            "a",
            "ab",
            "abc",
            "abcd",
            "é",
            "éé",
            "日本語",
            "😀😀😀😀",
        ];
        for schema in schemas {
            let json: serde_json::Value = serde_json::from_str(schema).unwrap();
            let validator = jsonschema::validator_for(&json).unwrap();
            let bounds = bounds(schema);
            let mut values: Vec<(serde_json::Value, Read<'_>)> = Vec::new();
            match json["type"].as_str().unwrap() {
                "integer" => values.extend(
                    integers
                        .iter()
                        .map(|v| (serde_json::json!(v), Read::Integer(*v))),
                ),
                "number" => values.extend(
                    floats
                        .iter()
                        .map(|v| (serde_json::json!(v), Read::Float(*v))),
                ),
                _ => values.extend(texts.iter().map(|v| (serde_json::json!(v), Read::Text(v)))),
            }
            for (value, read) in values {
                let refused = bounds.violation(read);
                assert_eq!(
                    refused.is_some(),
                    !validator.is_valid(&value),
                    "{schema} on {value}: {refused:?}"
                );
            }
        }
        assert!(bounds(r#"{"type": "integer"}"#).is_empty());
        assert!(Bounds::of(&serde_json::from_str(r#"{"minLength": -1}"#).unwrap()).is_none());
        assert!(Bounds::of(&serde_json::from_str(r#"{"multipleOf": 0}"#).unwrap()).is_none());
        for fractional in [r#"{"multipleOf": 0.5}"#, r#"{"multipleOf": 2.0}"#] {
            assert!(
                bounds(fractional).is_empty(),
                "{fractional} is the validator's"
            );
        }
        let message = bounds(r#"{"multipleOf": 5}"#)
            .violation(Read::Integer(12))
            .unwrap();
        assert_eq!(message, "12 is not a multiple of 5");
        // Exact where the validator divides in floating point (-2^63 / (2^63 - 1) rounds to -1 there).
        let huge = bounds(r#"{"multipleOf": 9223372036854775807}"#);
        assert!(huge.violation(Read::Integer(i64::MIN)).is_some());
        assert!(huge.violation(Read::Integer(i64::MAX)).is_none());
        assert!(huge.violation(Read::Integer(0)).is_none());
        let beyond = bounds(r#"{"multipleOf": 18446744073709551615}"#);
        assert!(beyond.violation(Read::Integer(i64::MAX)).is_some());
        let message = bounds(r#"{"minimum": 0}"#)
            .violation(Read::Integer(-5))
            .unwrap();
        assert_eq!(message, "-5 is less than the minimum of 0");
    }
}
