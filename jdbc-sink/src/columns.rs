//! Arrow columns as SQL values, the Arrow side of the JDBC sink's type contract (docs/types.md): what kind of SQL
//! value each Arrow column holds ([`SqlType`]), the column type `create_table` gives it in each dialect, and
//! per-cell access. Which existing table columns take which kind, and how a cell is sent, is each dialect's part
//! ([`crate::pg::cell`], [`crate::mysql::target`]).
//!
//! | Arrow | [`SqlType`] | PostgreSQL (`create_table`) | MariaDB (`create_table`) |
//! |---|---|---|---|
//! | `Boolean` | `Bool` | boolean | BOOLEAN |
//! | `Int8`, `Int16`, `UInt8` / `Int32`, `UInt16` / `Int64`, `UInt32` | `Int16` / `Int32` / `Int64` | smallint / integer / bigint | SMALLINT / INT / BIGINT |
//! | `UInt64` | `UInt64` | numeric(20, 0) | BIGINT UNSIGNED |
//! | `Float16`, `Float32` / `Float64` | `Float32` / `Float64` | real / double precision | DOUBLE (FLOAT columns read back with 6 digits) / DOUBLE |
//! | `Decimal(p, s)` | `Decimal` | numeric(p, s) | DECIMAL(p, s) (p ≤ 65, s ≤ 38) |
//! | `Utf8` marked decimal text | `DecimalText` | numeric | DECIMAL(65, 30) |
//! | `Utf8`, `LargeUtf8`, `Utf8View`, `Dictionary(_, Utf8)` (enums) | `Text` | text | LONGTEXT (utf8mb4); a key: VARCHAR(768) utf8mb4, binary collation without padding |
//! | `Utf8` marked JSON | `Json` | jsonb | JSON |
//! | `Binary`, `LargeBinary`, `FixedSizeBinary(n)` | `Bytes` | bytea | LONGBLOB; a key: VARBINARY(3072) |
//! | `FixedSizeBinary(16)` marked UUID | `Uuid` | uuid | CHAR(36) ascii: the canonical text (MariaDB's UUID type refuses some variants) |
//! | `Date32` | `Date` | date | DATE |
//! | `Time32(s, ms)`, `Time64(µs)` | `Time` | time | TIME(0/3/6) |
//! | `Timestamp(s, ms, µs)` without / with a zone | `Timestamp` / `TimestampTz` | timestamp / timestamptz | DATETIME(0/3/6) (with a zone: the UTC instant) |
//! | `List` of any type above | `List` | an array of the element's type | JSON |
//! | `Struct`, `Map`, `List` of them | `Nested` | jsonb | JSON |
//!
//! Refused (at start and by `check-config`, naming the field): nanosecond times and timestamps (both databases
//! hold microseconds), unions, intervals, durations, `Date64`, `Null`.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal32Type, Decimal64Type, Decimal128Type, Decimal256Type, Float16Type,
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, Time32MillisecondType,
    Time32SecondType, Time64MicrosecondType, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_buffer::i256;
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Utc};
use connector_api::Result;
use connector_api::types::marks::{Mark, mark};
use connector_api::types::{Refusal, describe, exact, json};

use crate::config::{Dialect, config_error};

/// The kind of SQL value one Arrow column holds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SqlType {
    Bool,
    Int16,
    Int32,
    Int64,
    UInt64,
    Float32,
    Float64,
    /// A decimal of this precision and scale.
    Decimal {
        precision: u8,
        scale: i8,
    },
    /// A decimal of any scale, as text.
    DecimalText,
    Text,
    /// JSON text.
    Json,
    Bytes,
    Uuid,
    Date,
    Time(TimeUnit),
    Timestamp(TimeUnit),
    TimestampTz(TimeUnit),
    /// A list whose items are one of the kinds above.
    List,
    /// A struct, a map, or a list of them: JSON.
    Nested,
}

impl SqlType {
    /// The kind of `field`'s values.
    ///
    /// # Errors
    /// A [`Refusal`] (path relative to the column) for a type neither database holds exactly.
    pub(crate) fn of(field: &Field) -> std::result::Result<Self, Refusal> {
        use DataType::*;
        let refuse = |why: String| Err(Refusal::new("", why));
        Ok(match field.data_type() {
            Boolean => SqlType::Bool,
            Int8 | Int16 | UInt8 => SqlType::Int16,
            Int32 | UInt16 => SqlType::Int32,
            Int64 | UInt32 => SqlType::Int64,
            UInt64 => SqlType::UInt64,
            Float16 | Float32 => SqlType::Float32,
            Float64 => SqlType::Float64,
            Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s) | Decimal256(p, s) => {
                if *s < 0 {
                    return refuse(format!(
                        "has a negative scale ({s}); convert it to a scale of 0 or more"
                    ));
                }
                SqlType::Decimal {
                    precision: *p,
                    scale: *s,
                }
            }
            Utf8 | LargeUtf8 | Utf8View => match mark(field) {
                Some(Mark::Json) => SqlType::Json,
                Some(Mark::DecimalText) => SqlType::DecimalText,
                _ => SqlType::Text,
            },
            Dictionary(_, values) if matches!(values.as_ref(), Utf8 | LargeUtf8 | Utf8View) => {
                SqlType::Text
            }
            FixedSizeBinary(16) if mark(field) == Some(Mark::Uuid) => SqlType::Uuid,
            Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => SqlType::Bytes,
            Date32 => SqlType::Date,
            Time32(unit) => SqlType::Time(*unit),
            Time64(TimeUnit::Microsecond) => SqlType::Time(TimeUnit::Microsecond),
            Time64(_) | Timestamp(TimeUnit::Nanosecond, _) => {
                return refuse(format!(
                    "has type {}: nanoseconds, and PostgreSQL and MariaDB hold microseconds",
                    describe(field.data_type())
                ));
            }
            Timestamp(unit, None) => SqlType::Timestamp(*unit),
            Timestamp(unit, Some(_)) => SqlType::TimestampTz(*unit),
            List(item) | LargeList(item) | FixedSizeList(item, _) => {
                match SqlType::of(item).map_err(|r| r.under("[]"))? {
                    SqlType::List | SqlType::Nested => nested(field)?,
                    _ => SqlType::List,
                }
            }
            Struct(_) | Map(..) => nested(field)?,
            other => {
                return refuse(format!(
                    "has type {}, which no PostgreSQL or MariaDB column holds exactly",
                    describe(other)
                ));
            }
        })
    }

    /// Whether values of this kind are sent as JSON text (a list is, unless its column is a PostgreSQL array).
    pub(crate) fn is_json(self) -> bool {
        matches!(self, SqlType::Json | SqlType::Nested)
    }

    /// The column type `create_table` gives it in `dialect` (see the module docs); `key` for a column of a key or
    /// of the dedup table; `item` is the list item's kind (for a PostgreSQL array).
    pub(crate) fn ddl(self, dialect: Dialect, key: bool, item: Option<SqlType>) -> String {
        use SqlType::*;
        let unit_digits = |unit: TimeUnit| match unit {
            TimeUnit::Second => 0,
            TimeUnit::Millisecond => 3,
            _ => 6,
        };
        match dialect {
            Dialect::Postgres => match self {
                Bool => "boolean".into(),
                Int16 => "smallint".into(),
                Int32 => "integer".into(),
                Int64 => "bigint".into(),
                UInt64 => "numeric(20, 0)".into(),
                Float32 => "real".into(),
                Float64 => "double precision".into(),
                Decimal { precision, scale } => format!("numeric({precision}, {scale})"),
                DecimalText => "numeric".into(),
                Text => "text".into(),
                Json | Nested => "jsonb".into(),
                Bytes => "bytea".into(),
                Uuid => "uuid".into(),
                Date => "date".into(),
                Time(_) => "time".into(),
                Timestamp(_) => "timestamp".into(),
                TimestampTz(_) => "timestamptz".into(),
                List => match item {
                    Some(item) => format!("{}[]", item.ddl(dialect, false, None)),
                    None => "jsonb".into(),
                },
            },
            Dialect::MySql => match self {
                Bool => "BOOLEAN".into(),
                Int16 => "SMALLINT".into(),
                Int32 => "INT".into(),
                Int64 => "BIGINT".into(),
                UInt64 => "BIGINT UNSIGNED".into(),
                // DOUBLE holds every float exactly, and MariaDB's text protocol reads FLOAT back with 6 digits.
                Float32 => "DOUBLE".into(),
                Float64 => "DOUBLE".into(),
                Decimal { precision, scale } => format!("DECIMAL({precision}, {scale})"),
                DecimalText => "DECIMAL(65, 30)".into(),
                // Keys compare byte for byte: `abc` and `ABC`, `a` and `a ` are different keys.
                Text if key => {
                    "VARCHAR(768) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin".into()
                }
                Text => "LONGTEXT CHARACTER SET utf8mb4".into(),
                Json | Nested | List => "JSON".into(),
                Bytes if key => "VARBINARY(3072)".into(),
                Bytes => "LONGBLOB".into(),
                // Not MariaDB's UUID type: it refuses UUIDs of some variants, which PostgreSQL and Avro hold.
                Uuid => "CHAR(36) CHARACTER SET ascii COLLATE ascii_bin".into(),
                Date => "DATE".into(),
                Time(unit) => format!("TIME({})", unit_digits(unit)),
                Timestamp(unit) | TimestampTz(unit) => format!("DATETIME({})", unit_digits(unit)),
            },
        }
    }
}

/// A struct, map or list of them: JSON, if the JSON encoding writes it exactly.
fn nested(field: &Field) -> std::result::Result<SqlType, Refusal> {
    json::check(&Schema::new(vec![field.clone().with_name("")]))
        .map(|()| SqlType::Nested)
        .map_err(|r| Refusal::new(r.path.trim_start_matches('.').to_string(), r.why))
}

/// One value of one row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cell<'a> {
    Null,
    Bool(bool),
    Int16(i16),
    Int32(i32),
    Int64(i64),
    UInt64(u64),
    Float32(f32),
    Float64(f64),
    /// The unscaled value and the scale.
    Decimal(i256, i8),
    /// A decimal of any scale as text.
    DecimalText(&'a str),
    Text(&'a str),
    Json(&'a str),
    Bytes(&'a [u8]),
    Uuid(&'a [u8]),
    Date(NaiveDate),
    Time(NaiveTime),
    Timestamp(NaiveDateTime),
    TimestampTz(DateTime<Utc>),
    /// A list's items and their field (for a PostgreSQL array).
    List(ArrayRef, &'a FieldRef),
}

/// The columns of one batch, in the schema's order, readable cell by cell: dictionaries unpacked, and the columns
/// sent as JSON rendered once.
pub(crate) struct Columns {
    columns: Vec<(ArrayRef, SqlType, Option<FieldRef>)>,
    /// Per column, its values as JSON text (the columns sent as JSON), rendered once per batch.
    json: Vec<Option<Vec<Option<String>>>>,
}

impl Columns {
    /// Reads `batch`, whose columns have the kinds `types`; `as_json` says which columns are sent as JSON text.
    pub(crate) fn new(batch: &RecordBatch, types: &[SqlType], as_json: &[bool]) -> Result<Self> {
        let schema = batch.schema();
        Self::of(
            batch
                .columns()
                .iter()
                .zip(schema.fields())
                .map(|(c, f)| (c.clone(), Some(f.clone())))
                .collect(),
            types,
            as_json,
        )
    }

    /// One column of items: a list's values, whose field is `item`.
    pub(crate) fn items(values: ArrayRef, item: &FieldRef) -> Result<Self> {
        let sql = SqlType::of(item).map_err(|r| config_error(r.to_string()))?;
        Self::of(vec![(values, Some(item.clone()))], &[sql], &[sql.is_json()])
    }

    fn of(
        arrays: Vec<(ArrayRef, Option<FieldRef>)>,
        types: &[SqlType],
        as_json: &[bool],
    ) -> Result<Self> {
        let mut columns = Vec::with_capacity(arrays.len());
        let mut json = Vec::with_capacity(arrays.len());
        for (i, ((array, field), sql)) in arrays.into_iter().zip(types).enumerate() {
            let array = match array.data_type() {
                DataType::Dictionary(_, _) => exact::convert(&array, &DataType::Utf8)
                    .map_err(|e| config_error(format!("cannot unpack a dictionary column: {e}")))?,
                _ => array,
            };
            let rendered = match as_json.get(i).copied().unwrap_or(false) {
                true if !matches!(
                    array.data_type(),
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                ) =>
                {
                    let field = field.clone().unwrap_or_else(|| {
                        Arc::new(Field::new("item", array.data_type().clone(), true))
                    });
                    Some(json::values(&array, &field).map_err(config_error)?)
                }
                _ => None,
            };
            json.push(rendered);
            columns.push((array, *sql, field));
        }
        Ok(Self { columns, json })
    }

    /// Number of columns.
    pub(crate) fn len(&self) -> usize {
        self.columns.len()
    }

    /// The value of column `column` in row `row`.
    pub(crate) fn cell(&self, column: usize, row: usize) -> Cell<'_> {
        let (array, sql, _) = &self.columns[column];
        if array.is_null(row) {
            return Cell::Null;
        }
        if let Some(rendered) = &self.json[column] {
            return match &rendered[row] {
                Some(text) => Cell::Json(text),
                None => Cell::Null,
            };
        }
        let text = |row| match array.data_type() {
            DataType::LargeUtf8 => array.as_string::<i64>().value(row),
            DataType::Utf8View => array.as_string_view().value(row),
            _ => array.as_string::<i32>().value(row),
        };
        let bytes = |row| match array.data_type() {
            DataType::LargeBinary => array.as_binary::<i64>().value(row),
            DataType::BinaryView => array.as_binary_view().value(row),
            DataType::FixedSizeBinary(_) => array.as_fixed_size_binary().value(row),
            _ => array.as_binary::<i32>().value(row),
        };
        match (sql, array.data_type()) {
            (SqlType::Bool, _) => Cell::Bool(array.as_boolean().value(row)),
            (_, DataType::Int8) => Cell::Int16(array.as_primitive::<Int8Type>().value(row).into()),
            (_, DataType::UInt8) => {
                Cell::Int16(array.as_primitive::<UInt8Type>().value(row).into())
            }
            (_, DataType::Int16) => Cell::Int16(array.as_primitive::<Int16Type>().value(row)),
            (_, DataType::UInt16) => {
                Cell::Int32(array.as_primitive::<UInt16Type>().value(row).into())
            }
            (_, DataType::Int32) => Cell::Int32(array.as_primitive::<Int32Type>().value(row)),
            (_, DataType::UInt32) => {
                Cell::Int64(array.as_primitive::<UInt32Type>().value(row).into())
            }
            (_, DataType::Int64) => Cell::Int64(array.as_primitive::<Int64Type>().value(row)),
            (_, DataType::UInt64) => Cell::UInt64(array.as_primitive::<UInt64Type>().value(row)),
            (_, DataType::Float16) => {
                Cell::Float32(array.as_primitive::<Float16Type>().value(row).to_f32())
            }
            (_, DataType::Float32) => Cell::Float32(array.as_primitive::<Float32Type>().value(row)),
            (_, DataType::Float64) => Cell::Float64(array.as_primitive::<Float64Type>().value(row)),
            (_, DataType::Decimal32(_, s)) => Cell::Decimal(
                i256::from(array.as_primitive::<Decimal32Type>().value(row)),
                *s,
            ),
            (_, DataType::Decimal64(_, s)) => Cell::Decimal(
                i256::from(array.as_primitive::<Decimal64Type>().value(row)),
                *s,
            ),
            (_, DataType::Decimal128(_, s)) => Cell::Decimal(
                i256::from_i128(array.as_primitive::<Decimal128Type>().value(row)),
                *s,
            ),
            (_, DataType::Decimal256(_, s)) => {
                Cell::Decimal(array.as_primitive::<Decimal256Type>().value(row), *s)
            }
            (SqlType::DecimalText, _) => Cell::DecimalText(text(row)),
            (SqlType::Json, _) => Cell::Json(text(row)),
            (SqlType::Uuid, _) => Cell::Uuid(bytes(row)),
            (_, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => Cell::Text(text(row)),
            (
                _,
                DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::FixedSizeBinary(_),
            ) => Cell::Bytes(bytes(row)),
            (_, DataType::Date32) => match array.as_primitive::<Date32Type>().value_as_date(row) {
                Some(date) => Cell::Date(date),
                None => Cell::Null,
            },
            (_, DataType::Time32(TimeUnit::Second)) => {
                time(array.as_primitive::<Time32SecondType>().value_as_time(row))
            }
            (_, DataType::Time32(_)) => time(
                array
                    .as_primitive::<Time32MillisecondType>()
                    .value_as_time(row),
            ),
            (_, DataType::Time64(_)) => time(
                array
                    .as_primitive::<Time64MicrosecondType>()
                    .value_as_time(row),
            ),
            (sql, DataType::Timestamp(unit, _)) => {
                let instant = match unit {
                    TimeUnit::Second => array
                        .as_primitive::<TimestampSecondType>()
                        .value_as_datetime(row),
                    TimeUnit::Millisecond => array
                        .as_primitive::<TimestampMillisecondType>()
                        .value_as_datetime(row),
                    _ => array
                        .as_primitive::<TimestampMicrosecondType>()
                        .value_as_datetime(row),
                };
                match (instant, sql) {
                    (Some(t), SqlType::TimestampTz(_)) => Cell::TimestampTz(t.and_utc()),
                    (Some(t), _) => Cell::Timestamp(t),
                    (None, _) => Cell::Null,
                }
            }
            (_, DataType::List(item)) => Cell::List(array.as_list::<i32>().value(row), item),
            (_, DataType::LargeList(item)) => Cell::List(array.as_list::<i64>().value(row), item),
            (_, DataType::FixedSizeList(item, _)) => {
                Cell::List(array.as_fixed_size_list().value(row), item)
            }
            // `SqlType::of` refused every other type when the sink was built.
            (_, other) => unreachable!("column type {other} passed SqlType::of"),
        }
    }

    /// A short rendering of row `row`'s value in column `column`, for error messages (keys).
    pub(crate) fn show(&self, column: usize, row: usize) -> String {
        show(&self.cell(column, row))
    }
}

fn time(t: Option<NaiveTime>) -> Cell<'static> {
    t.map_or(Cell::Null, Cell::Time)
}

/// A short rendering of `cell` for messages.
pub(crate) fn show(cell: &Cell<'_>) -> String {
    let text = |v: &str| format!("{:?}", v.chars().take(64).collect::<String>());
    match cell {
        Cell::Null => "NULL".into(),
        Cell::Bool(v) => v.to_string(),
        Cell::Int16(v) => v.to_string(),
        Cell::Int32(v) => v.to_string(),
        Cell::Int64(v) => v.to_string(),
        Cell::UInt64(v) => v.to_string(),
        Cell::Float32(v) => v.to_string(),
        Cell::Float64(v) => v.to_string(),
        Cell::Decimal(v, scale) => connector_api::types::decimal::text(*v, *scale),
        Cell::DecimalText(v) | Cell::Text(v) | Cell::Json(v) => text(v),
        Cell::Bytes(v) => format!("<{} bytes>", v.len()),
        Cell::Uuid(v) => connector_api::types::marks::uuid_text(v),
        Cell::Date(v) => v.to_string(),
        Cell::Time(v) => v.to_string(),
        Cell::Timestamp(v) => v.to_string(),
        Cell::TimestampTz(v) => v.to_string(),
        Cell::List(v, _) => format!("<list of {}>", v.len()),
    }
}

/// The table's columns as the sink writes them: names, kinds and fields, from the batch schema.
#[derive(Debug, Clone)]
pub(crate) struct TableShape {
    pub(crate) names: Vec<String>,
    pub(crate) types: Vec<SqlType>,
    pub(crate) fields: Vec<FieldRef>,
}

impl TableShape {
    /// The shape of `schema`.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming every column neither database holds exactly.
    pub(crate) fn of(schema: &Schema) -> Result<Self> {
        let mut names = Vec::new();
        let mut types = Vec::new();
        let mut refusals = Vec::new();
        for field in schema.fields() {
            names.push(field.name().clone());
            match SqlType::of(field) {
                Ok(sql) => types.push(sql),
                Err(r) => {
                    types.push(SqlType::Nested);
                    refusals.push(r.under(field.name()));
                }
            }
        }
        if !refusals.is_empty() {
            return Err(config_error(connector_api::types::refusals_message(
                "the JDBC sink",
                &refusals,
            )));
        }
        Ok(Self {
            names,
            types,
            fields: schema.fields().iter().cloned().collect(),
        })
    }

    /// Refuses columns `create_table` could not create exactly in `dialect` (MariaDB's DECIMAL holds 65 digits, 38
    /// of them after the point).
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming every such column.
    pub(crate) fn check_create(&self, dialect: Dialect) -> Result<()> {
        let refusals: Vec<Refusal> = self
            .names
            .iter()
            .zip(&self.types)
            .filter_map(|(name, sql)| match (dialect, sql) {
                (Dialect::MySql, SqlType::Decimal { precision, scale }) if *precision > 65 || *scale > 38 => {
                    Some(Refusal::new(
                        name.as_str(),
                        format!(
                            "has type decimal({precision}, {scale}); MariaDB's DECIMAL holds at most 65 digits, 38 \
                             after the point"
                        ),
                    ))
                }
                _ => None,
            })
            .collect();
        match refusals.is_empty() {
            true => Ok(()),
            false => Err(config_error(connector_api::types::refusals_message(
                "the JDBC sink's MariaDB table",
                &refusals,
            ))),
        }
    }

    /// The index of column `name`.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) when the batches have no such column.
    pub(crate) fn index(&self, name: &str, role: &str) -> Result<usize> {
        self.names.iter().position(|n| n == name).ok_or_else(|| {
            config_error(format!(
                "the {role} column {name:?} is not in the batches' schema (columns: {})",
                self.names.join(", ")
            ))
        })
    }

    /// The kind of column `i`'s list items, if it is a list.
    pub(crate) fn item(&self, i: usize) -> Option<SqlType> {
        match self.fields[i].data_type() {
            DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
                SqlType::of(item).ok()
            }
            _ => None,
        }
    }

    /// Column `i`'s type in `CREATE TABLE` / `ADD COLUMN` / `ALTER COLUMN .. TYPE` for `dialect`.
    pub(crate) fn column_ddl(&self, dialect: Dialect, i: usize, key: bool) -> String {
        self.types[i].ddl(dialect, key, self.item(i))
    }

    /// `CREATE TABLE IF NOT EXISTS` for this shape, with `key` as primary key when given (MariaDB: utf8mb4).
    pub(crate) fn create_table(&self, dialect: Dialect, table: &str, key: &[String]) -> String {
        let mut columns: Vec<String> = (0..self.names.len())
            .map(|i| {
                let name = &self.names[i];
                format!(
                    "{} {}",
                    quote(dialect, name),
                    self.column_ddl(dialect, i, key.contains(name))
                )
            })
            .collect();
        if !key.is_empty() {
            let key: Vec<String> = key.iter().map(|k| quote(dialect, k)).collect();
            columns.push(format!("PRIMARY KEY ({})", key.join(", ")));
        }
        let options = match dialect {
            Dialect::Postgres => "",
            Dialect::MySql => " DEFAULT CHARSET = utf8mb4",
        };
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({}){options}",
            quote_table(dialect, table),
            columns.join(", ")
        )
    }

    /// `ALTER TABLE .. ADD COLUMN IF NOT EXISTS` for each column of this shape the table's `existing` columns
    /// lack (nullable, typed as `create_table` types them); `IF NOT EXISTS` because another instance may add the
    /// same column meanwhile.
    pub(crate) fn add_missing(
        &self,
        dialect: Dialect,
        table: &str,
        existing: &[String],
    ) -> Vec<String> {
        (0..self.names.len())
            .filter(|i| !existing.contains(&self.names[*i]))
            .map(|i| {
                format!(
                    "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}",
                    quote_table(dialect, table),
                    quote(dialect, &self.names[i]),
                    self.column_ddl(dialect, i, false)
                )
            })
            .collect()
    }

    /// This shape without the columns `names`.
    pub(crate) fn without(&self, names: &[String]) -> Self {
        let kept: Vec<usize> = (0..self.names.len())
            .filter(|i| !names.contains(&self.names[*i]))
            .collect();
        Self {
            names: kept.iter().map(|i| self.names[*i].clone()).collect(),
            types: kept.iter().map(|i| self.types[*i]).collect(),
            fields: kept.iter().map(|i| self.fields[*i].clone()).collect(),
        }
    }

    /// The column list, quoted.
    pub(crate) fn column_list(&self, dialect: Dialect) -> String {
        self.names
            .iter()
            .map(|n| quote(dialect, n))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The schema metadata key that marks a keyed sink's table schema as a change stream's rows (its change columns
/// taken off): every column of such rows is nullable (a delete's row may hold only the key), which says nothing
/// about the source table's columns.
const CHANGE_STREAM: &str = "ratchet.jdbc.change_stream";

/// `table` (a change stream's rows without the change columns) marked as such ([`is_change_stream`]).
pub(crate) fn marked_change_stream(table: &SchemaRef) -> SchemaRef {
    let mut metadata = table.metadata().clone();
    metadata.insert(CHANGE_STREAM.to_string(), "true".to_string());
    Arc::new(table.as_ref().clone().with_metadata(metadata))
}

/// Whether batches of `schema` are a change stream's rows: their nullability is no reason to drop a table's NOT
/// NULL (`evolution = "evolve"` relaxes columns only for rows that are not).
pub(crate) fn is_change_stream(schema: &Schema) -> bool {
    schema.metadata().contains_key(CHANGE_STREAM)
        || schema
            .fields()
            .iter()
            .any(|f| f.metadata().contains_key(connector_api::CHANGE_COLUMN))
}

/// A numeric column type as far as widening it goes: the three families whose columns `evolution = "evolve"`
/// widens in place (an integer to a wider one, a float to a double, a decimal to one with as many digits on both
/// sides of the point).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Numeric {
    /// A signed integer of this many bytes.
    Integer(u8),
    /// A floating-point number of this many bytes.
    Float(u8),
    /// A decimal of this precision and scale.
    Decimal(u64, u64),
}

impl Numeric {
    /// The narrowest numeric column type that holds `sql`'s values in `dialect`.
    pub(crate) fn of(sql: SqlType) -> Option<Self> {
        Some(match sql {
            SqlType::Int16 => Numeric::Integer(2),
            SqlType::Int32 => Numeric::Integer(4),
            SqlType::Int64 => Numeric::Integer(8),
            // A float32 needs no more than FLOAT (MariaDB's DDL gives it DOUBLE, but a FLOAT column holds it).
            SqlType::Float32 => Numeric::Float(4),
            SqlType::Float64 => Numeric::Float(8),
            SqlType::Decimal { precision, scale } => {
                Numeric::Decimal(u64::from(precision), scale.max(0) as u64)
            }
            _ => return None,
        })
    }

    /// Whether a column of this type widened to `wanted` keeps every value it holds, and holds more.
    pub(crate) fn widens_to(self, wanted: Numeric) -> bool {
        match (self, wanted) {
            (Numeric::Integer(a), Numeric::Integer(b)) | (Numeric::Float(a), Numeric::Float(b)) => {
                a < b
            }
            (Numeric::Decimal(p1, s1), Numeric::Decimal(p2, s2)) => {
                s2 >= s1 && p2.saturating_sub(s2) >= p1.saturating_sub(s1) && (p1, s1) != (p2, s2)
            }
            _ => false,
        }
    }
}

/// `name` as a quoted SQL identifier.
pub(crate) fn quote(dialect: Dialect, name: &str) -> String {
    match dialect {
        Dialect::Postgres => format!("\"{}\"", name.replace('"', "\"\"")),
        Dialect::MySql => format!("`{}`", name.replace('`', "``")),
    }
}

/// `schema.table` or `table`, each part quoted.
pub(crate) fn quote_table(dialect: Dialect, table: &str) -> String {
    table
        .split('.')
        .map(|part| quote(dialect, part))
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use arrow_array::{Decimal128Array, Int64Array, StringArray, TimestampMicrosecondArray};

    use super::*;

    #[test]
    fn numeric_columns_widen_only_without_losing_values() {
        let int = Numeric::of(SqlType::Int32).unwrap();
        let long = Numeric::of(SqlType::Int64).unwrap();
        assert!(int.widens_to(long) && !long.widens_to(int) && !int.widens_to(int));
        let real = Numeric::of(SqlType::Float32).unwrap();
        let double = Numeric::of(SqlType::Float64).unwrap();
        assert!(real.widens_to(double));
        assert_eq!(Numeric::of(SqlType::Float32), Some(real));
        assert!(!int.widens_to(double));
        let decimal =
            |precision, scale| Numeric::of(SqlType::Decimal { precision, scale }).unwrap();
        assert!(decimal(9, 2).widens_to(decimal(12, 2)));
        assert!(decimal(9, 2).widens_to(decimal(12, 4)));
        assert!(!decimal(9, 2).widens_to(decimal(10, 4)));
        assert!(!decimal(12, 2).widens_to(decimal(9, 2)));
        assert!(Numeric::of(SqlType::Text).is_none());
    }

    #[test]
    fn cells_and_ddl_follow_the_type_table() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("price", DataType::Decimal128(10, 2), true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![7])),
                Arc::new(StringArray::from(vec![None::<&str>])),
                Arc::new(TimestampMicrosecondArray::from(vec![1_000_000]).with_timezone("UTC")),
                Arc::new(
                    Decimal128Array::from(vec![-5])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
            ],
        )
        .unwrap();
        let shape = TableShape::of(&schema).unwrap();
        let columns = Columns::new(&batch, &shape.types, &[false; 4]).unwrap();
        assert_eq!(columns.cell(0, 0), Cell::Int64(7));
        assert_eq!(columns.cell(1, 0), Cell::Null);
        assert_eq!(
            columns.cell(2, 0),
            Cell::TimestampTz(DateTime::from_timestamp(1, 0).unwrap())
        );
        assert_eq!(columns.show(3, 0), "-0.05");
        assert_eq!(
            shape.create_table(Dialect::MySql, "db.t", &["id".into(), "name".into()]),
            "CREATE TABLE IF NOT EXISTS `db`.`t` (`id` BIGINT, `name` VARCHAR(768) CHARACTER SET utf8mb4 COLLATE \
             utf8mb4_nopad_bin, `at` DATETIME(6), `price` DECIMAL(10, 2), PRIMARY KEY (`id`, `name`)) DEFAULT \
             CHARSET = utf8mb4"
        );
        assert!(
            shape
                .create_table(Dialect::Postgres, "t", &[])
                .contains("\"price\" numeric(10, 2)")
        );
        let nanos = Field::new("at", DataType::Time64(TimeUnit::Nanosecond), false);
        let err = TableShape::of(&Schema::new(vec![nanos])).unwrap_err();
        assert!(err.to_string().contains("field `at`"), "{err}");
    }
}
