//! The JSON decoding's declared columns: a job file's `fields = [{ name, type, nullable }]` as Arrow fields. Every
//! type is read exactly ([`crate::json_rows`]): a value that does not fit its type is a bad record, never cut,
//! rounded or converted.
//!
//! | `type` | Arrow | JSON values it takes |
//! |---|---|---|
//! | `string` | `Utf8` | strings |
//! | `boolean` | `Boolean` | `true`, `false` |
//! | `int8`, `int16`, `int32`, `int64`, `uint8` .. `uint64` | the integer type | integers in range (`1.0` and `1e3` are integers; `1.5` is not) |
//! | `float32`, `float64` | the float type | numbers (an integer beyond the float's exact range is refused) |
//! | `decimal(p, s)` | `Decimal128(p, s)` (`Decimal256` past 38 digits) | numbers or strings of at most `p` digits, `s` of them after the point (trailing zeros aside) |
//! | `decimal` | `Utf8` marked decimal text | numbers or strings of any scale, kept as their exact text |
//! | `uuid` | `FixedSizeBinary(16)` marked UUID | strings in UUID form |
//! | `binary` | `Binary` | base64 strings (Kafka Connect's JsonConverter convention) |
//! | `fixed(n)` | `FixedSizeBinary(n)` | base64 strings of exactly `n` bytes |
//! | `json` | `Utf8` marked JSON | any JSON value, kept as its text |
//! | `date` | `Date32` | `YYYY-MM-DD` strings, or days since 1970-01-01 |
//! | `time`, `time(s)`, `time(ms)`, `time(us)`, `time(ns)` | `Time64(µs)` for `time`, else that unit | `HH:MM:SS[.fraction]` strings (no finer than the unit), or integers in the unit |
//! | `timestamp`, `timestamp(s)` .. `timestamp(ns)` | `Timestamp(µs or the unit)`, no zone | local date-times without an offset (`2024-05-01T12:00:00.123`), or integers in the unit since the epoch |
//! | `timestamptz`, `timestamptz(s)` .. `timestamptz(ns)`; `timestamp_micros` (= `timestamptz(us)`) | `Timestamp(µs or the unit, UTC)` | RFC 3339 date-times (an offset is applied; none means UTC), or integers in the unit since the epoch |
//! | `struct` with `fields = [..]` | `Struct` | objects |
//! | `list` with `items = { type = .. }` | `List` | arrays |
//! | `map` with `values = { type = .. }` | `Map(Utf8, ..)` | objects (keys are strings) |
//!
//! `nullable` (default true) also applies to nested fields, list items and map values: a `null` (or a missing
//! field) where it is false is a bad record.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use connector_api::types::marks::{Mark, marked};
use connector_api::{Error, ErrorKind, Phase, Result};
use serde::Deserialize;

use crate::json_rows::UnknownFields;

/// The JSON decoding: the declared columns and what undeclared keys mean.
#[derive(Debug, Clone)]
pub struct JsonDecoding {
    schema: SchemaRef,
    unknown_fields: UnknownFields,
}

impl JsonDecoding {
    /// Objects decoded into `schema`'s columns; undeclared keys ignored.
    pub fn new(schema: SchemaRef) -> Self {
        Self {
            schema,
            unknown_fields: UnknownFields::Ignore,
        }
    }

    /// The decoding of `fields` (a job file's declaration).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming a field of an unknown or incomplete type.
    pub fn declared(fields: &[JsonField], unknown_fields: UnknownFields) -> Result<Self> {
        let fields = fields
            .iter()
            .map(JsonField::field)
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::new(Arc::new(Schema::new(fields))).with_unknown_fields(unknown_fields))
    }

    /// What undeclared keys mean.
    pub fn with_unknown_fields(mut self, unknown_fields: UnknownFields) -> Self {
        self.unknown_fields = unknown_fields;
        self
    }

    /// The columns.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// What undeclared keys mean.
    pub fn unknown_fields(&self) -> UnknownFields {
        self.unknown_fields
    }
}

impl From<SchemaRef> for JsonDecoding {
    fn from(schema: SchemaRef) -> Self {
        Self::new(schema)
    }
}

/// One declared column (or nested field) of the JSON decoding.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonField {
    /// The JSON key and column name.
    pub name: String,
    /// Its type (the table in the module docs).
    #[serde(rename = "type")]
    pub kind: String,
    /// Whether it may be null or absent (default true).
    #[serde(default = "yes")]
    pub nullable: bool,
    /// `struct`: its fields.
    #[serde(default)]
    pub fields: Vec<JsonField>,
    /// `list`: the items' type.
    #[serde(default)]
    pub items: Option<Box<JsonItem>>,
    /// `map`: the values' type.
    #[serde(default)]
    pub values: Option<Box<JsonItem>>,
}

/// The type of a list's items or a map's values.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonItem {
    /// Its type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Whether it may be null (default true).
    #[serde(default = "yes")]
    pub nullable: bool,
    /// `struct`: its fields.
    #[serde(default)]
    pub fields: Vec<JsonField>,
    /// `list`: the items' type.
    #[serde(default)]
    pub items: Option<Box<JsonItem>>,
    /// `map`: the values' type.
    #[serde(default)]
    pub values: Option<Box<JsonItem>>,
}

fn yes() -> bool {
    true
}

fn config(message: String) -> Error {
    Error::new(ErrorKind::Config, Phase::Setup, message)
}

impl JsonField {
    /// A field of `kind` (a scalar type of the table).
    pub fn new(name: impl Into<String>, kind: impl Into<String>, nullable: bool) -> Self {
        Self {
            name: name.into(),
            kind: kind.into(),
            nullable,
            fields: Vec::new(),
            items: None,
            values: None,
        }
    }

    /// The Arrow field.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the field for an unknown type or one without what it needs.
    pub fn field(&self) -> Result<Field> {
        let item = JsonItem {
            kind: self.kind.clone(),
            nullable: self.nullable,
            fields: self.fields.clone(),
            items: self.items.clone(),
            values: self.values.clone(),
        };
        item.field(&self.name)
            .map_err(|why| config(format!("field {:?}: {why}", self.name)))
    }
}

impl JsonItem {
    fn field(&self, name: &str) -> std::result::Result<Field, String> {
        let kind = self.kind.trim().to_ascii_lowercase();
        let plain = |ty: DataType| Ok(Field::new(name, ty, self.nullable));
        let (base, args) = match kind.split_once('(') {
            Some((base, rest)) => (
                base.trim(),
                Some(
                    rest.strip_suffix(')')
                        .ok_or_else(|| format!("type {:?} lacks its closing `)`", self.kind))?
                        .trim(),
                ),
            ),
            None => (kind.as_str(), None),
        };
        let unit = |args: Option<&str>| -> std::result::Result<TimeUnit, String> {
            match args {
                None | Some("us") => Ok(TimeUnit::Microsecond),
                Some("s") => Ok(TimeUnit::Second),
                Some("ms") => Ok(TimeUnit::Millisecond),
                Some("ns") => Ok(TimeUnit::Nanosecond),
                Some(other) => Err(format!("unknown time unit {other:?} (s, ms, us or ns)")),
            }
        };
        if (!self.fields.is_empty() && base != "struct")
            || (self.items.is_some() && base != "list")
            || (self.values.is_some() && base != "map")
        {
            return Err(format!(
                "`fields` go with type struct, `items` with list, `values` with map; not with {:?}",
                self.kind
            ));
        }
        match (base, args) {
            ("string", None) => plain(DataType::Utf8),
            ("boolean", None) => plain(DataType::Boolean),
            ("int8", None) => plain(DataType::Int8),
            ("int16", None) => plain(DataType::Int16),
            ("int32", None) => plain(DataType::Int32),
            ("int64", None) => plain(DataType::Int64),
            ("uint8", None) => plain(DataType::UInt8),
            ("uint16", None) => plain(DataType::UInt16),
            ("uint32", None) => plain(DataType::UInt32),
            ("uint64", None) => plain(DataType::UInt64),
            ("float32", None) => plain(DataType::Float32),
            ("float64", None) => plain(DataType::Float64),
            ("decimal", None) => Ok(marked(
                Field::new(name, DataType::Utf8, self.nullable),
                Mark::DecimalText,
            )),
            ("decimal", Some(args)) => {
                let (p, s) = args
                    .split_once(',')
                    .and_then(|(p, s)| {
                        Some((p.trim().parse::<u8>().ok()?, s.trim().parse::<i8>().ok()?))
                    })
                    .ok_or_else(|| format!("decimal({args}) is not decimal(precision, scale)"))?;
                if p == 0 || p > 76 || s < 0 || s as u8 > p {
                    return Err(format!(
                        "decimal({p}, {s}): precision 1 to 76, scale 0 to the precision"
                    ));
                }
                plain(if p <= 38 {
                    DataType::Decimal128(p, s)
                } else {
                    DataType::Decimal256(p, s)
                })
            }
            ("uuid", None) => Ok(marked(
                Field::new(name, DataType::FixedSizeBinary(16), self.nullable),
                Mark::Uuid,
            )),
            ("binary", None) => plain(DataType::Binary),
            ("fixed", Some(n)) => {
                let n: i32 = n
                    .parse()
                    .map_err(|_| format!("fixed({n}) needs a byte count"))?;
                plain(DataType::FixedSizeBinary(n))
            }
            ("json", None) => Ok(marked(
                Field::new(name, DataType::Utf8, self.nullable),
                Mark::Json,
            )),
            ("date", None) => plain(DataType::Date32),
            ("time", args) => plain(match unit(args)? {
                u @ (TimeUnit::Second | TimeUnit::Millisecond) => DataType::Time32(u),
                u => DataType::Time64(u),
            }),
            ("timestamp", args) => plain(DataType::Timestamp(unit(args)?, None)),
            ("timestamptz", args) => plain(DataType::Timestamp(unit(args)?, Some("UTC".into()))),
            ("timestamp_micros", None) => plain(DataType::Timestamp(
                TimeUnit::Microsecond,
                Some("UTC".into()),
            )),
            ("struct", None) => {
                if self.fields.is_empty() {
                    return Err("type struct needs `fields`".into());
                }
                let fields = self
                    .fields
                    .iter()
                    .map(|f| f.field().map_err(|e| e.to_string()))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                plain(DataType::Struct(Fields::from(fields)))
            }
            ("list", None) => {
                let items = self.items.as_ref().ok_or("type list needs `items`")?;
                plain(DataType::List(Arc::new(items.field("item")?)))
            }
            ("map", None) => {
                let values = self.values.as_ref().ok_or("type map needs `values`")?;
                let entries = Field::new(
                    "entries",
                    DataType::Struct(Fields::from(vec![
                        Field::new("key", DataType::Utf8, false),
                        values.field("value")?,
                    ])),
                    false,
                );
                plain(DataType::Map(Arc::new(entries), false))
            }
            _ => Err(format!(
                "unknown type {:?}: string, boolean, int8..int64, uint8..uint64, float32, float64, decimal(p, s), \
                 decimal, uuid, binary, fixed(n), json, date, time(unit), timestamp(unit), timestamptz(unit), \
                 struct, list, map",
                self.kind
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use connector_api::types::marks::mark;

    use super::*;

    fn parsed(toml_text: &str) -> Result<Field> {
        #[derive(Deserialize)]
        struct Holder {
            field: JsonField,
        }
        let holder: Holder = toml::from_str(toml_text).unwrap();
        holder.field.field()
    }

    #[test]
    fn declared_types_become_exact_arrow_fields() {
        let f = parsed(r#"field = { name = "amount", type = "decimal(18, 4)", nullable = false }"#)
            .unwrap();
        assert_eq!(f.data_type(), &DataType::Decimal128(18, 4));
        assert!(!f.is_nullable());
        let f = parsed(r#"field = { name = "at", type = "timestamptz(ms)" }"#).unwrap();
        assert_eq!(
            f.data_type(),
            &DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
        );
        let f = parsed(r#"field = { name = "id", type = "uuid" }"#).unwrap();
        assert_eq!(mark(&f), Some(Mark::Uuid));
        let f = parsed(
            r#"field = { name = "lines", type = "list", items = { type = "struct", fields = [ { name = "qty", type = "int32" } ] } }"#,
        )
        .unwrap();
        let DataType::List(item) = f.data_type() else {
            panic!("{f:?}")
        };
        assert!(matches!(item.data_type(), DataType::Struct(fields) if fields[0].name() == "qty"));
        let err = parsed(r#"field = { name = "x", type = "decimal(10)" }"#).unwrap_err();
        assert!(err.to_string().contains("field \"x\""), "{err}");
        let err = parsed(r#"field = { name = "x", type = "list" }"#).unwrap_err();
        assert!(err.to_string().contains("items"), "{err}");
    }
}
