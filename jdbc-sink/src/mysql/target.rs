//! MariaDB's half of the JDBC sink's type contract (docs/types.md): the target table's columns as
//! `information_schema` describes them, which take which kind of Arrow value exactly ([`MyColumn::check`], at start
//! and by `check-config`), and each cell as a parameter for its column ([`MyColumn::value`]), refused as a bad
//! record where MariaDB would round, cut or pad it.
//!
//! | [`SqlType`] | column types that take it | |
//! |---|---|---|
//! | `Bool` | any integer type (BOOLEAN is TINYINT(1)) | |
//! | `Int16` / `Int32` / `Int64` / `UInt64` | an integer type whose range holds every value of the Arrow type; DECIMAL with room for its digits | |
//! | `Float32` / `Float64` | FLOAT, DOUBLE / DOUBLE | |
//! | `Decimal(p, s)` | DECIMAL(P, S) with S ≥ s and P - S ≥ p - s | |
//! | `DecimalText` | DECIMAL | a value DECIMAL(P, S) cannot hold exactly is a bad record (MariaDB would round it) |
//! | `Text` | CHAR, VARCHAR, the TEXT types, ENUM, SET | longer than the column: a bad record; a character the column's character set lacks: a bad record |
//! | `Json` | JSON, the text types | |
//! | `Bytes` | BINARY(n) (values of exactly n bytes; MariaDB would pad shorter ones), VARBINARY, the BLOB types | longer: a bad record |
//! | `Uuid` | UUID, BINARY(16), CHAR/VARCHAR of 36 or more | |
//! | `Date` | DATE | a year outside 0..9999: a bad record |
//! | `Time` | TIME | TIME(fsp): more fractional digits than fsp is a bad record (MariaDB would round) |
//! | `Timestamp` / `TimestampTz` | DATETIME / DATETIME, TIMESTAMP | as TIME(fsp); the session's time zone is UTC, so a TIMESTAMP holds the instant |
//! | `List`, `Nested` | JSON, the text types | |
//!
//! Key columns (an upsert key, a dedup table's message id) must compare byte for byte: a text key with a
//! case- or accent-insensitive collation, or one that ignores trailing spaces (every `PAD SPACE` collation, `_bin`
//! ones included), would make two keys one; it is refused naming the collation ([`MyColumn::check_key`]).

use chrono::{Datelike, NaiveDateTime, Timelike};
use connector_api::types::{Refusal, describe};
use mysql_async::Value;

use connector_api::types::decimal;

use crate::columns::{Cell, SqlType, show};

/// One column of the table as `information_schema.COLUMNS` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MyColumn {
    pub(crate) name: String,
    /// `DATA_TYPE`, lower case (`varchar`, `decimal`, `datetime`, ...).
    pub(crate) data_type: String,
    /// `COLUMN_TYPE` (`int(10) unsigned`, `enum('a','b')`, ...).
    pub(crate) column_type: String,
    /// `CHARACTER_MAXIMUM_LENGTH`: characters of a text type, bytes of a binary one.
    pub(crate) max_length: Option<u64>,
    pub(crate) precision: Option<u64>,
    pub(crate) scale: Option<u64>,
    /// `DATETIME_PRECISION`: fractional digits of TIME, DATETIME, TIMESTAMP.
    pub(crate) fsp: Option<u64>,
    pub(crate) collation: Option<String>,
}

/// The query of [`MyColumn`]s: a table's columns by name (`?` the schema or NULL for the current database, `?`
/// the table name).
pub(crate) const COLUMNS_QUERY: &str = "SELECT COLUMN_NAME, LOWER(DATA_TYPE), COLUMN_TYPE, \
     CHARACTER_MAXIMUM_LENGTH, NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, COLLATION_NAME \
     FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
     ORDER BY ORDINAL_POSITION";

/// A row of [`COLUMNS_QUERY`].
pub(crate) type ColumnRow = (
    String,
    String,
    String,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    Option<String>,
);

impl From<ColumnRow> for MyColumn {
    fn from(row: ColumnRow) -> Self {
        let (name, data_type, column_type, max_length, precision, scale, fsp, collation) = row;
        Self {
            name,
            data_type,
            column_type,
            max_length,
            precision,
            scale,
            fsp,
            collation,
        }
    }
}

const TEXT_TYPES: [&str; 6] = [
    "char",
    "varchar",
    "tinytext",
    "text",
    "mediumtext",
    "longtext",
];
const BLOB_TYPES: [&str; 5] = ["varbinary", "tinyblob", "blob", "mediumblob", "longblob"];

/// The range of an integer column type.
fn integer_range(data_type: &str, unsigned: bool) -> Option<(i128, i128)> {
    let bits = match data_type {
        "tinyint" => 8,
        "smallint" => 16,
        "mediumint" => 24,
        "int" | "integer" => 32,
        "bigint" => 64,
        _ => return None,
    };
    Some(match unsigned {
        true => (0, (1i128 << bits) - 1),
        false => (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1),
    })
}

/// The range of an Arrow integer type.
fn arrow_range(ty: &arrow_schema::DataType) -> Option<(i128, i128)> {
    use arrow_schema::DataType::*;
    Some(match ty {
        Boolean => (0, 1),
        Int8 => (i8::MIN.into(), i8::MAX.into()),
        Int16 => (i16::MIN.into(), i16::MAX.into()),
        Int32 => (i32::MIN.into(), i32::MAX.into()),
        Int64 => (i64::MIN.into(), i64::MAX.into()),
        UInt8 => (0, u8::MAX.into()),
        UInt16 => (0, u16::MAX.into()),
        UInt32 => (0, u32::MAX.into()),
        UInt64 => (0, u64::MAX.into()),
        _ => return None,
    })
}

fn digits(max: i128) -> u64 {
    max.unsigned_abs().to_string().len() as u64
}

impl MyColumn {
    fn unsigned(&self) -> bool {
        self.column_type.contains("unsigned")
    }

    fn is_text(&self) -> bool {
        TEXT_TYPES.contains(&self.data_type.as_str())
            || ["enum", "set"].contains(&self.data_type.as_str())
    }

    /// `COLUMN_TYPE` for messages, with the collation of a text column.
    fn described(&self) -> String {
        match &self.collation {
            Some(collation) => format!("{} COLLATE {collation}", self.column_type),
            None => self.column_type.clone(),
        }
    }

    /// Whether this column takes the values of `field` (of kind `sql`) exactly.
    ///
    /// # Errors
    /// A [`Refusal`] (path relative to the column) saying why not.
    pub(crate) fn check(&self, sql: SqlType, field: &arrow_schema::Field) -> Result<(), Refusal> {
        let t = self.data_type.as_str();
        let decimal = t == "decimal" || t == "numeric";
        let (p, s) = (self.precision.unwrap_or(10), self.scale.unwrap_or(0));
        let takes = match sql {
            SqlType::Bool | SqlType::Int16 | SqlType::Int32 | SqlType::Int64 | SqlType::UInt64 => {
                let (min, max) = arrow_range(field.data_type()).unwrap_or((i128::MIN, i128::MAX));
                match integer_range(t, self.unsigned()) {
                    Some((lo, hi)) => lo <= min && max <= hi,
                    None => decimal && p - s >= digits(min).max(digits(max)),
                }
            }
            SqlType::Float32 => t == "float" || t == "double",
            SqlType::Float64 => t == "double",
            SqlType::Decimal { precision, scale } => {
                let (precision, scale) = (u64::from(precision), scale as u64);
                decimal && s >= scale && p - s >= precision - scale
            }
            SqlType::DecimalText => decimal,
            SqlType::Text => self.is_text(),
            SqlType::Json | SqlType::List | SqlType::Nested => t == "json" || self.is_text(),
            SqlType::Bytes => match t {
                "binary" => {
                    matches!(field.data_type(), arrow_schema::DataType::FixedSizeBinary(n) if Some(*n as u64) == self.max_length)
                }
                _ => BLOB_TYPES.contains(&t),
            },
            SqlType::Uuid => match t {
                "uuid" => true,
                "binary" => self.max_length == Some(16),
                "char" | "varchar" => self.max_length.is_some_and(|n| n >= 36),
                _ => false,
            },
            SqlType::Date => t == "date",
            SqlType::Time(_) => t == "time",
            SqlType::Timestamp(_) => t == "datetime",
            SqlType::TimestampTz(_) => t == "datetime" || t == "timestamp",
        };
        match takes {
            true => Ok(()),
            false => Err(Refusal::new(
                "",
                format!(
                    "has type {}, which a MariaDB column of type {} cannot hold exactly",
                    describe(field.data_type()),
                    self.column_type
                ),
            )),
        }
    }

    /// Refuses a key column whose values compare equal when they differ (see the module docs).
    ///
    /// # Errors
    /// A [`Refusal`] naming the collation and what to use instead.
    pub(crate) fn check_key(&self) -> Result<(), Refusal> {
        let Some(collation) = &self.collation else {
            return Ok(());
        };
        let exact = collation.contains("_nopad_bin") || collation.ends_with("_0900_bin");
        if exact || !TEXT_TYPES.contains(&self.data_type.as_str()) {
            return Ok(());
        }
        Err(Refusal::new(
            "",
            format!(
                "is a key column of type {}, whose collation compares keys that differ as equal ({}); make it \
                 `CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin` (or VARBINARY)",
                self.described(),
                if collation.ends_with("_bin") {
                    "trailing spaces are ignored"
                } else {
                    "case or accents are ignored"
                }
            ),
        ))
    }

    /// `cell` as the parameter for this column.
    ///
    /// # Errors
    /// Why the column cannot hold the value exactly (a bad record, never rounded, cut or padded).
    pub(crate) fn value(&self, cell: &Cell<'_>) -> Result<Value, String> {
        Ok(match cell {
            Cell::Null => Value::NULL,
            Cell::Bool(v) => Value::Int((*v).into()),
            Cell::Int16(v) => Value::Int((*v).into()),
            Cell::Int32(v) => Value::Int((*v).into()),
            Cell::Int64(v) => Value::Int(*v),
            Cell::UInt64(v) => Value::UInt(*v),
            Cell::Float32(v) if self.data_type == "double" => Value::Double(f64::from(*v)),
            Cell::Float32(v) => Value::Float(*v),
            Cell::Float64(v) => Value::Double(*v),
            Cell::Decimal(v, scale) => Value::Bytes(decimal::text(*v, *scale).into_bytes()),
            Cell::DecimalText(v) => {
                self.fits_decimal(v)?;
                Value::Bytes(v.as_bytes().to_vec())
            }
            Cell::Text(v) | Cell::Json(v) => {
                self.fits_length(v.chars().count(), "characters")?;
                Value::Bytes(v.as_bytes().to_vec())
            }
            Cell::Bytes(v) => {
                self.fits_length(v.len(), "bytes")?;
                Value::Bytes(v.to_vec())
            }
            Cell::Uuid(v) => match self.data_type.as_str() {
                "binary" => Value::Bytes(v.to_vec()),
                _ => Value::Bytes(connector_api::types::marks::uuid_text(v).into_bytes()),
            },
            Cell::Date(d) => {
                let year = year(d.year())?;
                Value::Date(year, d.month() as u8, d.day() as u8, 0, 0, 0, 0)
            }
            Cell::Time(t) => {
                self.fits_fraction(t.nanosecond())?;
                Value::Time(
                    false,
                    0,
                    t.hour() as u8,
                    t.minute() as u8,
                    t.second() as u8,
                    t.nanosecond() / 1_000,
                )
            }
            Cell::Timestamp(t) => self.datetime(*t)?,
            Cell::TimestampTz(t) => self.datetime(t.naive_utc())?,
            Cell::List(..) => {
                return Err("a list reached MariaDB without its JSON text".to_string());
            }
        })
    }

    fn datetime(&self, t: NaiveDateTime) -> Result<Value, String> {
        self.fits_fraction(t.nanosecond())?;
        Ok(Value::Date(
            year(t.year())?,
            t.month() as u8,
            t.day() as u8,
            t.hour() as u8,
            t.minute() as u8,
            t.second() as u8,
            t.nanosecond() / 1_000,
        ))
    }

    fn fits_fraction(&self, nanos: u32) -> Result<(), String> {
        let fsp = self.fsp.unwrap_or(0).min(6) as u32;
        match nanos % 10u32.pow(9 - fsp) {
            0 => Ok(()),
            _ => Err(format!(
                "has a finer fraction of a second than the {fsp} digits column `{}` ({}) keeps: MariaDB would \
                 round it",
                self.name, self.column_type
            )),
        }
    }

    fn fits_length(&self, length: usize, unit: &str) -> Result<(), String> {
        match self.max_length {
            Some(max)
                if length as u64 > max && self.data_type != "enum" && self.data_type != "set" =>
            {
                Err(format!(
                    "is {length} {unit} long, and column `{}` ({}) holds {max}: MariaDB would refuse or cut it",
                    self.name, self.column_type
                ))
            }
            Some(max) if self.data_type == "binary" && (length as u64) < max => Err(format!(
                "is {length} bytes long, and column `{}` ({}) pads shorter values with zero bytes",
                self.name, self.column_type
            )),
            _ => Ok(()),
        }
    }

    fn fits_decimal(&self, text: &str) -> Result<(), String> {
        let (p, s) = (self.precision.unwrap_or(10), self.scale.unwrap_or(0));
        let Some((_, digits, scale)) = decimal::parse(text) else {
            return Err(format!("{text:?} is not a decimal number"));
        };
        let (int, frac) = decimal::digits_needed(&digits, scale);
        let (int, frac) = (u64::from(int), u64::from(frac));
        match int > p - s || frac > s {
            true => Err(format!(
                "{text} does not fit column `{}` ({}) exactly: MariaDB would round it or refuse it",
                self.name, self.column_type
            )),
            false => Ok(()),
        }
    }
}

fn year(year: i32) -> Result<u16, String> {
    u16::try_from(year)
        .ok()
        .filter(|y| *y <= 9999)
        .ok_or_else(|| {
            format!("has the year {year}, which MariaDB's dates (0 to 9999) cannot hold")
        })
}

/// A bad value's message, naming the column and showing the value.
pub(crate) fn bad_value(column: &MyColumn, cell: &Cell<'_>, why: &str) -> String {
    format!("the value {} of column `{}` {why}", show(cell), column.name)
}

#[cfg(test)]
mod tests {
    use arrow_schema::{DataType, Field, TimeUnit};
    use chrono::NaiveTime;

    use super::*;

    fn column(data_type: &str, column_type: &str) -> MyColumn {
        MyColumn {
            name: "c".into(),
            data_type: data_type.into(),
            column_type: column_type.into(),
            max_length: None,
            precision: None,
            scale: None,
            fsp: None,
            collation: None,
        }
    }

    #[test]
    fn integers_go_where_their_range_fits() {
        let int = Field::new("c", DataType::Int32, true);
        assert!(column("int", "int(11)").check(SqlType::Int32, &int).is_ok());
        assert!(
            column("smallint", "smallint(6)")
                .check(SqlType::Int32, &int)
                .is_err()
        );
        assert!(
            column("int", "int(10) unsigned")
                .check(SqlType::Int32, &int)
                .is_err()
        );
        let mut decimal = column("decimal", "decimal(12,2)");
        decimal.precision = Some(12);
        decimal.scale = Some(2);
        assert!(decimal.check(SqlType::Int32, &int).is_ok());
        let wide = Field::new("c", DataType::Decimal128(10, 3), true);
        assert!(
            decimal
                .check(
                    SqlType::Decimal {
                        precision: 10,
                        scale: 3
                    },
                    &wide
                )
                .is_err()
        );
        assert!(decimal.fits_decimal("1234567890.12").is_ok());
        assert!(decimal.fits_decimal("1.125").is_err());
    }

    #[test]
    fn values_that_would_be_rounded_cut_or_merged_are_refused() {
        let mut time = column("time", "time(3)");
        time.fsp = Some(3);
        let fine = NaiveTime::from_hms_micro_opt(1, 2, 3, 456_000).unwrap();
        assert!(time.value(&Cell::Time(fine)).is_ok());
        let finer = NaiveTime::from_hms_micro_opt(1, 2, 3, 456_789).unwrap();
        assert!(time.value(&Cell::Time(finer)).is_err());
        let mut key = column("varchar", "varchar(255)");
        key.max_length = Some(3);
        key.collation = Some("utf8mb4_general_ci".into());
        assert!(key.check_key().unwrap_err().why.contains("case or accents"));
        key.collation = Some("utf8mb4_bin".into());
        assert!(key.check_key().unwrap_err().why.contains("trailing spaces"));
        key.collation = Some("utf8mb4_nopad_bin".into());
        assert!(key.check_key().is_ok());
        assert!(key.value(&Cell::Text("abcd")).is_err());
        let stamp = Field::new("c", DataType::Timestamp(TimeUnit::Microsecond, None), true);
        assert!(
            column("timestamp", "timestamp(6)")
                .check(SqlType::Timestamp(TimeUnit::Microsecond), &stamp)
                .is_err()
        );
    }
}
