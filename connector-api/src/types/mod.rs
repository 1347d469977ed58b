//! The type contract's shared half: which Arrow values a sink can hold *exactly*, and converting them there.
//!
//! A value arrives as it was, or not at all: every sink owns one module that maps the batches' Arrow types to its
//! own (docs/types.md has the whole matrix), and uses it alike for `create_table`, the start-up check,
//! `check-config` and the writer. What the sinks share lives here:
//!
//! - [`exact`]: whether a column of one Arrow type can be stored as another without changing any value (a
//!   millisecond timestamp as microseconds, `decimal(10,2)` as `decimal(12,4)`, an enum's dictionary as text, a
//!   struct whose children carry a table's field ids), checked statically ([`exact::check`]) and carried out on
//!   arrays ([`exact::convert`]); everything else is refused, naming the field.
//! - [`marks`]: what a column *means* beyond its Arrow type (a UUID in 16 bytes, JSON text, a decimal of
//!   variable scale as text), carried in field metadata from the decoding to the sinks.
//! - [`Refusal`]: one field a sink cannot hold exactly, named by its path (`customer.address.zip`,
//!   `lines[].qty`, `attributes{}`), why, and what to do.
//! - [`decimal`]: decimals as their exact text, read and written.
//! - [`json`]: rows as JSON objects, the one encoding the Kafka sink's JSON values and the file sink's JSON
//!   lines share (decimals exact, bytes in base64, timestamps in RFC 3339 with their full precision).

pub mod decimal;
pub mod exact;
pub mod json;
pub mod marks;

use arrow_schema::DataType;

/// A field a sink cannot hold exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The field's path: `a.b` for a struct's child, `a[]` for a list's items, `a{}` for a map's values
    /// (`a{}.key` for its keys).
    pub path: String,
    /// Why, as the end of a sentence about the field ("has type Time64(ns); PostgreSQL's time holds microseconds").
    pub why: String,
}

impl Refusal {
    /// A refusal of the field at `path`.
    pub fn new(path: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            why: why.into(),
        }
    }

    /// This refusal one level down: the same reason, the path prefixed with `parent`'s (`parent` + `.` + path,
    /// or `parent` + path for `[]`/`{}` steps).
    pub fn under(mut self, parent: &str) -> Self {
        self.path = join(parent, &self.path);
        self
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "field `{}` {}", self.path, self.why)
    }
}

/// The first refusal of a column of type `ty`: `refuse` asked about `ty` and then about every type nested in it
/// (a dictionary's values, a list's items as `[]`, a struct's children by name, a map's keys as `{}.key` and values
/// as `{}`), each answer's path placed under where the type sits. The walk every sink's check shares; `refuse`
/// knows only what its format cannot hold.
///
/// # Errors
/// The first [`Refusal`] `refuse` gives, with its path from the column.
pub fn refuse_nested(
    ty: &DataType,
    refuse: &impl Fn(&DataType) -> Option<Refusal>,
) -> Result<(), Refusal> {
    if let Some(refusal) = refuse(ty) {
        return Err(refusal);
    }
    match ty {
        DataType::Dictionary(_, values) => refuse_nested(values, refuse),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            refuse_nested(f.data_type(), refuse).map_err(|r| r.under("[]"))
        }
        DataType::Struct(fields) => fields
            .iter()
            .try_for_each(|f| refuse_nested(f.data_type(), refuse).map_err(|r| r.under(f.name()))),
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                refuse_nested(kv[0].data_type(), refuse).map_err(|r| r.under("{}.key"))?;
                refuse_nested(kv[1].data_type(), refuse).map_err(|r| r.under("{}"))
            }
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

/// The key type of map type `ty`, when it is a map.
pub fn map_key(ty: &DataType) -> Option<&DataType> {
    match ty {
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => Some(kv[0].data_type()),
            _ => None,
        },
        _ => None,
    }
}

/// `parent` then `child` as a field path.
pub(crate) fn join(parent: &str, child: &str) -> String {
    match (parent.is_empty(), child.starts_with(['[', '{'])) {
        _ if child.is_empty() => parent.to_string(),
        (true, _) => child.to_string(),
        (false, true) => format!("{parent}{child}"),
        (false, false) => format!("{parent}.{child}"),
    }
}

/// Every refusal of `refusals` in one message for `what` (a sink and its table): one line per field.
pub fn refusals_message(what: &str, refusals: &[Refusal]) -> String {
    let lines: Vec<String> = refusals.iter().map(|r| format!("  {r}")).collect();
    format!(
        "{what} cannot hold {} field{} exactly (see docs/types.md):\n{}",
        refusals.len(),
        if refusals.len() == 1 { "" } else { "s" },
        lines.join("\n")
    )
}

/// A short name of `ty` for messages: `Timestamp(ms, UTC)`, `List(Int64)`, `Struct(3 fields)`.
pub fn describe(ty: &DataType) -> String {
    match ty {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            format!("List({})", describe(f.data_type()))
        }
        DataType::Struct(fields) => format!("Struct({} fields)", fields.len()),
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => format!(
                "Map({}, {})",
                describe(kv[0].data_type()),
                describe(kv[1].data_type())
            ),
            other => format!("Map({other})"),
        },
        DataType::Dictionary(_, values) => format!("Dictionary({})", describe(values)),
        DataType::Union(fields, _) => format!("Union({} branches)", fields.len()),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_as_users_write_them() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a.b");
        assert_eq!(join("lines", "[]"), "lines[]");
        assert_eq!(join("lines[]", "qty"), "lines[].qty");
        assert_eq!(Refusal::new("[]", "x").under("tags").path, "tags[]");
        let message = refusals_message(
            "sink lake (table db.orders)",
            &[Refusal::new("at", "is nanoseconds")],
        );
        assert!(
            message.contains("1 field exactly") && message.contains("field `at` is nanoseconds"),
            "{message}"
        );
    }
}
