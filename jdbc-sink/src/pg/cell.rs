//! PostgreSQL's half of the JDBC sink's type contract (docs/types.md): which column types take which kind of
//! Arrow value exactly ([`check`], at start and by `check-config`), and each cell in PostgreSQL's binary format
//! for the column's type ([`PgCell`], for binary COPY and the upsert statements' array parameters).
//!
//! | [`SqlType`] | column types that take it | |
//! |---|---|---|
//! | `Bool` | boolean | |
//! | `Int16` / `Int32` / `Int64` | smallint, integer, bigint wide enough; numeric with room for its digits | |
//! | `UInt64` | numeric with room for 20 digits | |
//! | `Float32` / `Float64` | real, double precision / double precision | |
//! | `Decimal(p, s)` | numeric, or numeric(P, S) with S ≥ s and P - S ≥ p - s | |
//! | `DecimalText` | numeric | a value that numeric(P, S) cannot hold exactly (more digits, or more fractional digits than S) is a bad record, never rounded |
//! | `Text` | text, varchar, char, name, citext, enum types | too long, or not a label of the enum: a bad record |
//! | `Json` | json, jsonb, text, varchar | |
//! | `Bytes` / `Uuid` | bytea / uuid, bytea | |
//! | `Date` | date | |
//! | `Time` | time | time(p): a value with more fractional digits than p is a bad record (PostgreSQL would round) |
//! | `Timestamp` / `TimestampTz` | timestamp / timestamptz | as time(p) |
//! | `List` | an array whose element type takes the items, json, jsonb | |
//! | `Nested` | json, jsonb | |
//!
//! A domain takes what its base type takes.

use bytes::{BufMut, BytesMut};
use chrono::Timelike;
use connector_api::types::Refusal;
use tokio_postgres::types::{IsNull, Kind, ToSql, Type, to_sql_checked};

use connector_api::types::decimal;

use crate::columns::{Cell, Columns, SqlType};

/// A column of the table: its type and type modifier (`atttypmod`: numeric's precision and scale, the fractional
/// digits of time and timestamps; -1 when none).
#[derive(Debug, Clone)]
pub(crate) struct PgColumn {
    pub(crate) ty: Type,
    pub(crate) typmod: i32,
}

impl PgColumn {
    /// numeric(P, S)'s precision and scale, when constrained.
    fn numeric(&self) -> Option<(u32, u32)> {
        (self.typmod >= 4).then(|| {
            let t = (self.typmod - 4) as u32;
            (t >> 16, t & 0xffff)
        })
    }

    /// time(p) / timestamp(p)'s fractional digits, when constrained below microseconds.
    fn fraction_digits(&self) -> Option<u32> {
        (0..6).contains(&self.typmod).then_some(self.typmod as u32)
    }

    /// The type without domains.
    fn base(&self) -> &Type {
        base(&self.ty)
    }
}

fn base(ty: &Type) -> &Type {
    match ty.kind() {
        Kind::Domain(inner) => base(inner),
        _ => ty,
    }
}

fn is_text(ty: &Type) -> bool {
    [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME].contains(ty) || ty.name() == "citext"
}

/// Decimal digits of every value of an integer kind.
fn integer_digits(sql: SqlType) -> Option<u32> {
    match sql {
        SqlType::Int16 => Some(5),
        SqlType::Int32 => Some(10),
        SqlType::Int64 => Some(19),
        SqlType::UInt64 => Some(20),
        _ => None,
    }
}

/// Whether `column` takes the values of `field` (of kind `sql`) exactly.
///
/// # Errors
/// A [`Refusal`] (path relative to the column) saying why not.
pub(crate) fn check(
    sql: SqlType,
    field: &arrow_schema::Field,
    column: &PgColumn,
) -> Result<(), Refusal> {
    let ty = column.base();
    let takes = match (sql, ty) {
        (SqlType::Bool, t) => *t == Type::BOOL,
        (SqlType::Int16, t) if [Type::INT2, Type::INT4, Type::INT8].contains(t) => true,
        (SqlType::Int32, t) if [Type::INT4, Type::INT8].contains(t) => true,
        (SqlType::Int64, t) if *t == Type::INT8 => true,
        (s, t) if *t == Type::NUMERIC && integer_digits(s).is_some() => {
            let digits = integer_digits(s).unwrap_or_default();
            column.numeric().is_none_or(|(p, s)| p - s >= digits)
        }
        (SqlType::Float32, t) => [Type::FLOAT4, Type::FLOAT8].contains(t),
        (SqlType::Float64, t) => *t == Type::FLOAT8,
        (SqlType::Decimal { precision, scale }, t) if *t == Type::NUMERIC => column
            .numeric()
            .is_none_or(|(p, s)| s >= scale as u32 && p - s >= u32::from(precision) - scale as u32),
        (SqlType::DecimalText, t) => *t == Type::NUMERIC,
        (SqlType::Text, t) => is_text(t) || matches!(t.kind(), Kind::Enum(_)),
        (SqlType::Json, t) => is_text(t) || [Type::JSON, Type::JSONB].contains(t),
        (SqlType::Bytes, t) => *t == Type::BYTEA,
        (SqlType::Uuid, t) => [Type::UUID, Type::BYTEA].contains(t),
        (SqlType::Date, t) => *t == Type::DATE,
        (SqlType::Time(_), t) => *t == Type::TIME,
        (SqlType::Timestamp(_), t) => *t == Type::TIMESTAMP,
        (SqlType::TimestampTz(_), t) => *t == Type::TIMESTAMPTZ,
        (SqlType::List, t) if [Type::JSON, Type::JSONB].contains(t) => true,
        (SqlType::List, t) => match t.kind() {
            Kind::Array(element) => {
                let item = match field.data_type() {
                    arrow_schema::DataType::List(item)
                    | arrow_schema::DataType::LargeList(item)
                    | arrow_schema::DataType::FixedSizeList(item, _) => item,
                    _ => return Err(Refusal::new("", "is not a list")),
                };
                let item_sql = SqlType::of(item).map_err(|r| r.under("[]"))?;
                let element = PgColumn {
                    ty: element.clone(),
                    typmod: column.typmod,
                };
                return check(item_sql, item, &element).map_err(|r| r.under("[]"));
            }
            _ => false,
        },
        (SqlType::Nested, t) => [Type::JSON, Type::JSONB].contains(t),
        _ => false,
    };
    match takes {
        true => Ok(()),
        false => Err(Refusal::new(
            "",
            format!(
                "has type {}, which a PostgreSQL column of type {}{} cannot hold exactly",
                connector_api::types::describe(field.data_type()),
                column.ty,
                match (column.numeric(), column.fraction_digits()) {
                    (Some((p, s)), _) if *ty == Type::NUMERIC => format!("({p}, {s})"),
                    _ => String::new(),
                }
            ),
        )),
    }
}

/// A value the column's type cannot hold exactly: a bad record, never rounded or cut.
#[derive(Debug)]
pub(crate) struct BadValue(pub(crate) String);

impl std::fmt::Display for BadValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadValue {}

type ToSqlResult = Result<IsNull, Box<dyn std::error::Error + Sync + Send>>;

/// A [`Cell`] as a PostgreSQL parameter of its column's type (checked by [`check`] at start), with the column's
/// type modifier for the values' own checks.
#[derive(Debug)]
pub(crate) struct PgCell<'a> {
    pub(crate) cell: Cell<'a>,
    pub(crate) typmod: i32,
}

impl ToSql for PgCell<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> ToSqlResult {
        let column = PgColumn {
            ty: ty.clone(),
            typmod: self.typmod,
        };
        let ty = base(ty);
        let bad = |why: String| -> ToSqlResult { Err(Box::new(BadValue(why))) };
        match &self.cell {
            Cell::Null => Ok(IsNull::Yes),
            Cell::Bool(v) => v.to_sql(ty, out),
            Cell::Int16(v) => integer(i64::from(*v), ty, out),
            Cell::Int32(v) => integer(i64::from(*v), ty, out),
            Cell::Int64(v) => integer(*v, ty, out),
            Cell::UInt64(v) => numeric(&v.to_string(), &column, out),
            Cell::Float32(v) if *ty == Type::FLOAT8 => f64::from(*v).to_sql(ty, out),
            Cell::Float32(v) => v.to_sql(ty, out),
            Cell::Float64(v) => v.to_sql(ty, out),
            Cell::Decimal(v, scale) => {
                let (negative, digits, scale_of) = decimal::parts(*v, *scale);
                numeric_parts(
                    negative,
                    &digits,
                    scale_of,
                    || decimal::text(*v, *scale),
                    &column,
                    out,
                )
            }
            Cell::DecimalText(v) => numeric(v, &column, out),
            Cell::Text(v) | Cell::Json(v) => {
                if *ty == Type::JSONB {
                    out.put_u8(1);
                }
                out.put_slice(v.as_bytes());
                Ok(IsNull::No)
            }
            Cell::Bytes(v) | Cell::Uuid(v) => {
                out.put_slice(v);
                Ok(IsNull::No)
            }
            Cell::Date(v) => v.to_sql(ty, out),
            Cell::Time(v) => {
                fits_fraction(v.nanosecond(), &column).map_err(BadValue)?;
                v.to_sql(ty, out)
            }
            Cell::Timestamp(v) => {
                fits_fraction(v.nanosecond(), &column).map_err(BadValue)?;
                v.to_sql(ty, out)
            }
            Cell::TimestampTz(v) => {
                fits_fraction(v.nanosecond(), &column).map_err(BadValue)?;
                v.to_sql(ty, out)
            }
            Cell::List(values, item) => {
                let Kind::Array(element) = ty.kind() else {
                    return bad(format!("a list cannot be written as {ty}"));
                };
                let items =
                    Columns::items(values.clone(), item).map_err(|e| BadValue(e.to_string()))?;
                array(&items, values.len(), element, self.typmod, out)
            }
        }
    }

    fn accepts(_: &Type) -> bool {
        // Checked at start per column by `check`; each value is encoded for its column's type.
        true
    }

    to_sql_checked!();
}

fn integer(v: i64, ty: &Type, out: &mut BytesMut) -> ToSqlResult {
    match *ty {
        Type::INT2 => i16::try_from(v)?.to_sql(ty, out),
        Type::INT4 => i32::try_from(v)?.to_sql(ty, out),
        Type::NUMERIC => numeric(
            &v.to_string(),
            &PgColumn {
                ty: ty.clone(),
                typmod: -1,
            },
            out,
        ),
        _ => v.to_sql(ty, out),
    }
}

/// Refuses a time or timestamp with more fractional digits than the column keeps.
fn fits_fraction(nanos: u32, column: &PgColumn) -> Result<(), String> {
    let Some(digits) = column.fraction_digits() else {
        return Ok(());
    };
    let unit = 10u32.pow(9 - digits);
    match nanos % unit {
        0 => Ok(()),
        _ => Err(format!(
            "has a finer fraction of a second than the {digits} digits its column ({}({digits})) keeps: \
             PostgreSQL would round it",
            column.ty
        )),
    }
}

/// A decimal's text in PostgreSQL's binary numeric ([`numeric_parts`]).
fn numeric(text: &str, column: &PgColumn, out: &mut BytesMut) -> ToSqlResult {
    let Some((negative, digits, scale)) = decimal::parse(text) else {
        return Err(Box::new(BadValue(format!(
            "{text:?} is not a decimal number"
        ))));
    };
    numeric_parts(negative, &digits, scale, || text.to_string(), column, out)
}

/// A decimal (`digits` without leading zeros × 10^-`scale`) in PostgreSQL's binary numeric: base-10000 digit
/// groups, the weight of the first, the sign, the display scale. A value that numeric(P, S) cannot hold exactly is
/// a [`BadValue`] showing `shown()`.
fn numeric_parts(
    negative: bool,
    digits: &str,
    scale: u32,
    shown: impl Fn() -> String,
    column: &PgColumn,
    out: &mut BytesMut,
) -> ToSqlResult {
    if let Some((p, s)) = column.numeric() {
        let (int, frac) = decimal::digits_needed(digits, scale);
        if int > p - s || frac > s {
            return Err(Box::new(BadValue(format!(
                "{} does not fit numeric({p}, {s}) exactly (PostgreSQL would round it or refuse it)",
                shown()
            ))));
        }
    }
    let digits = digits.as_bytes();
    if digits.is_empty() {
        out.put_i16(0);
        out.put_i16(0);
        out.put_u16(0);
        out.put_i16(scale as i16);
        return Ok(IsNull::No);
    }
    // Each digit's power of ten; a group holds the powers 4g .. 4g + 3.
    let top = digits.len() as i64 - 1 - i64::from(scale);
    let weight = top.div_euclid(4);
    let lowest = (-i64::from(scale)).div_euclid(4);
    let mut groups = vec![0i16; (weight - lowest + 1) as usize];
    for (k, digit) in digits.iter().enumerate() {
        let power = top - k as i64;
        let group = (weight - power.div_euclid(4)) as usize;
        groups[group] += i16::from(digit - b'0') * 10i16.pow(power.rem_euclid(4) as u32);
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    out.put_i16(groups.len() as i16);
    out.put_i16(weight as i16);
    out.put_u16(if negative { 0x4000 } else { 0 });
    out.put_i16(scale as i16);
    for g in groups {
        out.put_i16(g);
    }
    Ok(IsNull::No)
}

/// A one-dimensional array in PostgreSQL's binary format, each item encoded for `element`.
fn array(
    items: &Columns,
    len: usize,
    element: &Type,
    typmod: i32,
    out: &mut BytesMut,
) -> ToSqlResult {
    let has_nulls = (0..len).any(|i| items.cell(0, i) == Cell::Null);
    out.put_i32(i32::from(len > 0));
    out.put_i32(i32::from(has_nulls));
    out.put_u32(element.oid());
    if len > 0 {
        out.put_i32(len as i32);
        out.put_i32(1);
    }
    for i in 0..len {
        let at = out.len();
        out.put_i32(0);
        let cell = PgCell {
            cell: items.cell(0, i),
            typmod,
        };
        match cell.to_sql(element, out)? {
            IsNull::Yes => {
                out.truncate(at);
                out.put_i32(-1);
            }
            IsNull::No => {
                let written = (out.len() - at - 4) as i32;
                out[at..at + 4].copy_from_slice(&written.to_be_bytes());
            }
        }
    }
    Ok(IsNull::No)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(text: &str, typmod: i32) -> Result<Vec<u8>, String> {
        let mut out = BytesMut::new();
        let column = PgColumn {
            ty: Type::NUMERIC,
            typmod,
        };
        numeric(text, &column, &mut out).map_err(|e| e.to_string())?;
        Ok(out.to_vec())
    }

    fn words(bytes: &[u8]) -> Vec<i16> {
        bytes
            .chunks(2)
            .map(|w| i16::from_be_bytes([w[0], w[1]]))
            .collect()
    }

    #[test]
    fn decimals_become_postgres_numeric_digits() {
        // ndigits, weight, sign, dscale, digits...
        assert_eq!(
            words(&encoded("123.45", -1).unwrap()),
            [2, 0, 0, 2, 123, 4500]
        );
        assert_eq!(
            words(&encoded("-0.005", -1).unwrap()),
            [1, -1, 0x4000, 3, 50]
        );
        assert_eq!(words(&encoded("10000", -1).unwrap()), [1, 1, 0, 0, 1]);
        assert_eq!(words(&encoded("0.00", -1).unwrap()), [0, 0, 0, 2]);
        assert_eq!(words(&encoded("1.5E+3", -1).unwrap()), [1, 0, 0, 0, 1500]);
        assert_eq!(
            words(&encoded("12.3400", -1).unwrap()),
            [2, 0, 0, 4, 12, 3400]
        );
        assert_eq!(
            words(&encoded("-123456789.000000001", -1).unwrap()),
            [6, 2, 0x4000, 9, 1, 2345, 6789, 0, 0, 1000]
        );
        // A Decimal cell encodes as its text does, without going through text.
        for (unscaled, scale) in [
            (12345i128, 2i8),
            (-5, 3),
            (0, 2),
            (7, -2),
            (i128::MIN + 1, 10),
        ] {
            let v = arrow_buffer::i256::from_i128(unscaled);
            let mut direct = BytesMut::new();
            let cell = PgCell {
                cell: Cell::Decimal(v, scale),
                typmod: -1,
            };
            cell.to_sql(&Type::NUMERIC, &mut direct).unwrap();
            assert_eq!(
                direct.to_vec(),
                encoded(&decimal::text(v, scale), -1).unwrap(),
                "{unscaled} scale {scale}"
            );
        }
        let typmod = |p: i32, s: i32| ((p << 16) | s) + 4;
        assert!(encoded("123.45", typmod(5, 2)).is_ok());
        assert!(
            encoded("123.450", typmod(5, 2)).is_ok(),
            "trailing zeros fit"
        );
        let err = encoded("123.456", typmod(6, 2)).unwrap_err();
        assert!(err.contains("numeric(6, 2)"), "{err}");
        assert!(encoded("1234.5", typmod(5, 2)).is_err());
        assert!(encoded("12a", -1).is_err());
    }

    #[test]
    fn finer_fractions_than_the_column_keeps_are_refused() {
        let ms = PgColumn {
            ty: Type::TIMESTAMP,
            typmod: 3,
        };
        assert!(fits_fraction(123_000_000, &ms).is_ok());
        assert!(fits_fraction(123_456_000, &ms).is_err());
        let any = PgColumn {
            ty: Type::TIMESTAMP,
            typmod: -1,
        };
        assert!(fits_fraction(123_456_000, &any).is_ok());
    }
}
