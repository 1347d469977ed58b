//! Arrow cells as PostgreSQL binary values (for binary COPY).

use bytes::BytesMut;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use crate::columns::{Cell, SqlType};

/// A [`Cell`] as a PostgreSQL parameter: delegates to the Rust type's own encoding and type check.
#[derive(Debug)]
pub(crate) struct PgCell<'a>(pub(crate) Cell<'a>);

impl ToSql for PgCell<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self.0 {
            Cell::Null => Ok(IsNull::Yes),
            Cell::Bool(v) => v.to_sql_checked(ty, out),
            Cell::Int16(v) => v.to_sql_checked(ty, out),
            Cell::Int32(v) => v.to_sql_checked(ty, out),
            Cell::Int64(v) => v.to_sql_checked(ty, out),
            Cell::Float32(v) => v.to_sql_checked(ty, out),
            Cell::Float64(v) => v.to_sql_checked(ty, out),
            Cell::Text(v) => v.to_sql_checked(ty, out),
            Cell::Bytes(v) => v.to_sql_checked(ty, out),
            Cell::Date(v) => v.to_sql_checked(ty, out),
            Cell::Timestamp(v) => v.to_sql_checked(ty, out),
            Cell::TimestampTz(v) => v.to_sql_checked(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        // Checked per value in `to_sql` by the inner type; the table's types are checked at start by `accepts`.
        true
    }

    to_sql_checked!();
}

/// Whether a column of PostgreSQL type `ty` takes values of `sql`.
pub(crate) fn accepts(sql: SqlType, ty: &Type) -> bool {
    match sql {
        SqlType::Bool => <bool as ToSql>::accepts(ty),
        SqlType::Int16 => <i16 as ToSql>::accepts(ty),
        SqlType::Int32 => <i32 as ToSql>::accepts(ty),
        SqlType::Int64 => <i64 as ToSql>::accepts(ty),
        SqlType::Float32 => <f32 as ToSql>::accepts(ty),
        SqlType::Float64 => <f64 as ToSql>::accepts(ty),
        SqlType::Text => <&str as ToSql>::accepts(ty),
        SqlType::Bytes => <&[u8] as ToSql>::accepts(ty),
        SqlType::Date => <chrono::NaiveDate as ToSql>::accepts(ty),
        SqlType::Timestamp(_) => <chrono::NaiveDateTime as ToSql>::accepts(ty),
        SqlType::TimestampTz(_) => <chrono::DateTime<chrono::Utc> as ToSql>::accepts(ty),
    }
}
