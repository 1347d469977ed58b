//! Arrow columns as SQL values: which Arrow types the sink writes, the SQL type each becomes (the table is in the
//! crate docs), and per-cell access.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use connector_api::Result;

use crate::config::{Dialect, config_error};

/// The SQL shape of one Arrow column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SqlType {
    Bool,
    Int16,
    Int32,
    Int64,
    Float32,
    Float64,
    Text,
    Bytes,
    Date,
    Timestamp(TimeUnit),
    TimestampTz(TimeUnit),
}

impl SqlType {
    /// The SQL type of `field`.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming the column for an Arrow type the sink cannot write.
    pub(crate) fn of(field: &Field) -> Result<Self> {
        Ok(match field.data_type() {
            DataType::Boolean => SqlType::Bool,
            DataType::Int8 | DataType::Int16 | DataType::UInt8 => SqlType::Int16,
            DataType::Int32 | DataType::UInt16 => SqlType::Int32,
            DataType::Int64 | DataType::UInt32 => SqlType::Int64,
            DataType::Float32 => SqlType::Float32,
            DataType::Float64 => SqlType::Float64,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => SqlType::Text,
            DataType::Binary | DataType::LargeBinary => SqlType::Bytes,
            DataType::Date32 => SqlType::Date,
            DataType::Timestamp(unit, None) => SqlType::Timestamp(*unit),
            DataType::Timestamp(unit, Some(_)) => SqlType::TimestampTz(*unit),
            other => {
                return Err(config_error(format!(
                    "column {:?} has Arrow type {other}, which the JDBC sink cannot write; cast it to one of the \
                     types in the jdbc-sink docs (e.g. a decimal to Float64 or Utf8) before the sink",
                    field.name()
                )));
            }
        })
    }

    /// The column type for `CREATE TABLE` in `dialect`; `key` for columns in a key or unique index.
    pub(crate) fn ddl(self, dialect: Dialect, key: bool) -> &'static str {
        match (dialect, self) {
            (Dialect::Postgres, SqlType::Bool) => "boolean",
            (Dialect::Postgres, SqlType::Int16) => "smallint",
            (Dialect::Postgres, SqlType::Int32) => "integer",
            (Dialect::Postgres, SqlType::Int64) => "bigint",
            (Dialect::Postgres, SqlType::Float32) => "real",
            (Dialect::Postgres, SqlType::Float64) => "double precision",
            (Dialect::Postgres, SqlType::Text) => "text",
            (Dialect::Postgres, SqlType::Bytes) => "bytea",
            (Dialect::Postgres, SqlType::Date) => "date",
            (Dialect::Postgres, SqlType::Timestamp(_)) => "timestamp",
            (Dialect::Postgres, SqlType::TimestampTz(_)) => "timestamptz",
            (Dialect::MySql, SqlType::Bool) => "BOOLEAN",
            (Dialect::MySql, SqlType::Int16) => "SMALLINT",
            (Dialect::MySql, SqlType::Int32) => "INT",
            (Dialect::MySql, SqlType::Int64) => "BIGINT",
            (Dialect::MySql, SqlType::Float32) => "FLOAT",
            (Dialect::MySql, SqlType::Float64) => "DOUBLE",
            (Dialect::MySql, SqlType::Text) if key => "VARCHAR(255)",
            (Dialect::MySql, SqlType::Text) => "LONGTEXT",
            (Dialect::MySql, SqlType::Bytes) if key => "VARBINARY(255)",
            (Dialect::MySql, SqlType::Bytes) => "LONGBLOB",
            (Dialect::MySql, SqlType::Date) => "DATE",
            (Dialect::MySql, SqlType::Timestamp(_) | SqlType::TimestampTz(_)) => "DATETIME(6)",
        }
    }
}

/// One value of one row, borrowed from its Arrow array.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Cell<'a> {
    Null,
    Bool(bool),
    Int16(i16),
    Int32(i32),
    Int64(i64),
    Float32(f32),
    Float64(f64),
    Text(&'a str),
    Bytes(&'a [u8]),
    Date(NaiveDate),
    Timestamp(NaiveDateTime),
    TimestampTz(DateTime<Utc>),
}

/// The columns of one batch, in the schema's order, readable cell by cell.
pub(crate) struct Columns<'a> {
    columns: Vec<(&'a dyn Array, SqlType)>,
}

impl<'a> Columns<'a> {
    /// Reads `batch`, whose columns have the SQL types `types` (from [`TableShape`]).
    pub(crate) fn new(batch: &'a RecordBatch, types: &[SqlType]) -> Self {
        Self {
            columns: batch
                .columns()
                .iter()
                .zip(types)
                .map(|(a, t)| (a.as_ref(), *t))
                .collect(),
        }
    }

    /// Number of columns.
    pub(crate) fn len(&self) -> usize {
        self.columns.len()
    }

    /// The value of column `column` in row `row`.
    pub(crate) fn cell(&self, column: usize, row: usize) -> Cell<'a> {
        let (array, sql) = self.columns[column];
        if array.is_null(row) {
            return Cell::Null;
        }
        match (array.data_type(), sql) {
            (DataType::Boolean, _) => Cell::Bool(array.as_boolean().value(row)),
            (DataType::Int8, _) => Cell::Int16(array.as_primitive::<Int8Type>().value(row).into()),
            (DataType::UInt8, _) => {
                Cell::Int16(array.as_primitive::<UInt8Type>().value(row).into())
            }
            (DataType::Int16, _) => Cell::Int16(array.as_primitive::<Int16Type>().value(row)),
            (DataType::UInt16, _) => {
                Cell::Int32(array.as_primitive::<UInt16Type>().value(row).into())
            }
            (DataType::Int32, _) => Cell::Int32(array.as_primitive::<Int32Type>().value(row)),
            (DataType::UInt32, _) => {
                Cell::Int64(array.as_primitive::<UInt32Type>().value(row).into())
            }
            (DataType::Int64, _) => Cell::Int64(array.as_primitive::<Int64Type>().value(row)),
            (DataType::Float32, _) => Cell::Float32(array.as_primitive::<Float32Type>().value(row)),
            (DataType::Float64, _) => Cell::Float64(array.as_primitive::<Float64Type>().value(row)),
            (DataType::Utf8, _) => Cell::Text(array.as_string::<i32>().value(row)),
            (DataType::LargeUtf8, _) => Cell::Text(array.as_string::<i64>().value(row)),
            (DataType::Utf8View, _) => Cell::Text(array.as_string_view().value(row)),
            (DataType::Binary, _) => Cell::Bytes(array.as_binary::<i32>().value(row)),
            (DataType::LargeBinary, _) => Cell::Bytes(array.as_binary::<i64>().value(row)),
            (DataType::Date32, _) => match array.as_primitive::<Date32Type>().value_as_date(row) {
                Some(date) => Cell::Date(date),
                None => Cell::Null,
            },
            (DataType::Timestamp(unit, _), sql) => {
                let instant = match unit {
                    TimeUnit::Second => array
                        .as_primitive::<TimestampSecondType>()
                        .value_as_datetime(row),
                    TimeUnit::Millisecond => array
                        .as_primitive::<TimestampMillisecondType>()
                        .value_as_datetime(row),
                    TimeUnit::Microsecond => array
                        .as_primitive::<TimestampMicrosecondType>()
                        .value_as_datetime(row),
                    TimeUnit::Nanosecond => array
                        .as_primitive::<TimestampNanosecondType>()
                        .value_as_datetime(row),
                };
                match (instant, sql) {
                    (Some(t), SqlType::TimestampTz(_)) => Cell::TimestampTz(t.and_utc()),
                    (Some(t), _) => Cell::Timestamp(t),
                    (None, _) => Cell::Null,
                }
            }
            // `SqlType::of` refused every other type when the sink was built.
            (other, _) => unreachable!("column type {other} passed SqlType::of"),
        }
    }

    /// A short rendering of row `row`'s value in column `column`, for error messages (keys).
    pub(crate) fn show(&self, column: usize, row: usize) -> String {
        match self.cell(column, row) {
            Cell::Null => "NULL".into(),
            Cell::Bool(v) => v.to_string(),
            Cell::Int16(v) => v.to_string(),
            Cell::Int32(v) => v.to_string(),
            Cell::Int64(v) => v.to_string(),
            Cell::Float32(v) => v.to_string(),
            Cell::Float64(v) => v.to_string(),
            Cell::Text(v) => format!("{:?}", v.chars().take(64).collect::<String>()),
            Cell::Bytes(v) => format!("<{} bytes>", v.len()),
            Cell::Date(v) => v.to_string(),
            Cell::Timestamp(v) => v.to_string(),
            Cell::TimestampTz(v) => v.to_string(),
        }
    }
}

/// The table's columns as the sink writes them: names and SQL types, from the batch schema.
#[derive(Debug, Clone)]
pub(crate) struct TableShape {
    pub(crate) names: Vec<String>,
    pub(crate) types: Vec<SqlType>,
}

impl TableShape {
    /// The shape of `schema`.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming the first column of an unsupported type.
    pub(crate) fn of(schema: &Schema) -> Result<Self> {
        let mut names = Vec::new();
        let mut types = Vec::new();
        for field in schema.fields() {
            names.push(field.name().clone());
            types.push(SqlType::of(field)?);
        }
        Ok(Self { names, types })
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

    /// `CREATE TABLE IF NOT EXISTS` for this shape, with `key` as primary key when given.
    pub(crate) fn create_table(&self, dialect: Dialect, table: &str, key: &[String]) -> String {
        let mut columns: Vec<String> = self
            .names
            .iter()
            .zip(&self.types)
            .map(|(name, sql)| {
                format!(
                    "{} {}",
                    quote(dialect, name),
                    sql.ddl(dialect, key.contains(name))
                )
            })
            .collect();
        if !key.is_empty() {
            let key: Vec<String> = key.iter().map(|k| quote(dialect, k)).collect();
            columns.push(format!("PRIMARY KEY ({})", key.join(", ")));
        }
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({})",
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
        self.names
            .iter()
            .zip(&self.types)
            .filter(|(name, _)| !existing.contains(name))
            .map(|(name, sql)| {
                format!(
                    "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}",
                    quote_table(dialect, table),
                    quote(dialect, name),
                    sql.ddl(dialect, false)
                )
            })
            .collect()
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
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray, TimestampMicrosecondArray};

    use super::*;

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
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![7])),
                Arc::new(StringArray::from(vec![None::<&str>])),
                Arc::new(TimestampMicrosecondArray::from(vec![1_000_000]).with_timezone("UTC")),
            ],
        )
        .unwrap();
        let shape = TableShape::of(&schema).unwrap();
        let columns = Columns::new(&batch, &shape.types);
        assert_eq!(columns.cell(0, 0), Cell::Int64(7));
        assert_eq!(columns.cell(1, 0), Cell::Null);
        assert_eq!(
            columns.cell(2, 0),
            Cell::TimestampTz(DateTime::from_timestamp(1, 0).unwrap())
        );
        assert_eq!(
            shape.create_table(Dialect::MySql, "db.t", &["id".into(), "name".into()]),
            "CREATE TABLE IF NOT EXISTS `db`.`t` (`id` BIGINT, `name` VARCHAR(255), `at` DATETIME(6), \
             PRIMARY KEY (`id`, `name`))"
        );
        let decimal = Field::new("price", DataType::Decimal128(10, 2), false);
        let err = SqlType::of(&decimal).unwrap_err();
        assert!(err.to_string().contains("\"price\""), "{err}");
    }
}
