//! Changes that did not carry some columns (Debezium's unavailable value, named in the change column
//! `__unavailable`): the keyed modes update the key's row without those columns, keeping the table's values, one
//! `UPDATE .. WHERE <key>` per change; a key with no row to keep them from is a bad record.

use connector_api::{Error, ErrorKind, Phase};

use crate::columns::{Columns, TableShape, quote, quote_table};
use crate::config::{Dialect, JdbcSinkConfig};

/// The update of a change that did not carry the `unchanged` columns: `UPDATE <table> SET <c> = <p>, .. WHERE
/// <k> = <p> AND ..`, and the batch columns its parameters take, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpdateKeeping {
    pub(crate) sql: String,
    pub(crate) params: Vec<usize>,
}

impl UpdateKeeping {
    /// The update of `table` by `key` for `dialect` (parameters `$1, $2, ..` on PostgreSQL, `?` on MariaDB).
    pub(crate) fn new(
        dialect: Dialect,
        table: &str,
        key: &[String],
        shape: &TableShape,
        unchanged: &[String],
    ) -> Self {
        let set: Vec<usize> = (0..shape.names.len())
            .filter(|&i| !key.contains(&shape.names[i]) && !unchanged.contains(&shape.names[i]))
            .collect();
        let keys: Vec<usize> = key
            .iter()
            .filter_map(|k| shape.names.iter().position(|n| n == k))
            .collect();
        let placeholder = |p: usize| match dialect {
            Dialect::Postgres => format!("${}", p + 1),
            Dialect::MySql => "?".to_string(),
        };
        let column = |i: usize| quote(dialect, &shape.names[i]);
        let assign: Vec<String> = match set.is_empty() {
            // Nothing but the key and the unchanged columns: the update only has to find the row.
            true => vec![format!("{0} = {0}", column(keys[0]))],
            false => set
                .iter()
                .enumerate()
                .map(|(p, &i)| format!("{} = {}", column(i), placeholder(p)))
                .collect(),
        };
        let condition: Vec<String> = keys
            .iter()
            .enumerate()
            .map(|(p, &i)| format!("{} = {}", column(i), placeholder(set.len() + p)))
            .collect();
        Self {
            sql: format!(
                "UPDATE {} SET {} WHERE {}",
                quote_table(dialect, table),
                assign.join(", "),
                condition.join(" AND ")
            ),
            params: set.into_iter().chain(keys).collect(),
        }
    }
}

/// The error of a change that did not carry the `unchanged` columns (Debezium's unavailable value) for a key the
/// table holds no row of (row `row` of `columns`): nothing to keep the values from.
pub(crate) fn nothing_to_keep(
    config: &JdbcSinkConfig,
    shape: &TableShape,
    columns: &Columns,
    row: usize,
    unchanged: &[String],
) -> Error {
    let key: Vec<String> = config
        .mode
        .key()
        .unwrap_or_default()
        .iter()
        .filter_map(|k| shape.names.iter().position(|n| n == k))
        .map(|i| format!("{} = {}", shape.names[i], columns.show(i, row)))
        .collect();
    Error::new(
        ErrorKind::BadRecord,
        Phase::Write,
        format!(
            "the change of the row with {} does not carry column(s) {} (the source did not send them: Debezium's \
             unavailable value, as PostgreSQL sends a TOASTed value an update does not touch under REPLICA \
             IDENTITY DEFAULT), and table {} holds no row of that key to keep them from (a primary-key change, or a \
             replica that missed the row): set REPLICA IDENTITY FULL on the source table",
            key.join(", "),
            unchanged.join(", "),
            config.table
        ),
    )
    .with_sink(&config.sink)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_update_sets_what_the_change_carried_and_finds_the_row_by_key() {
        let schema = arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("id", arrow_schema::DataType::Int64, false),
            arrow_schema::Field::new("body", arrow_schema::DataType::Utf8, true),
            arrow_schema::Field::new("n", arrow_schema::DataType::Int64, true),
        ]);
        let shape = TableShape::of(&std::sync::Arc::new(schema)).unwrap();
        let key = ["id".to_string()];
        let pg = UpdateKeeping::new(Dialect::Postgres, "t", &key, &shape, &["body".to_string()]);
        assert_eq!(pg.sql, r#"UPDATE "t" SET "n" = $1 WHERE "id" = $2"#);
        assert_eq!(pg.params, [2, 0]);
        let unchanged = ["body".to_string(), "n".to_string()];
        let my = UpdateKeeping::new(Dialect::MySql, "t", &key, &shape, &unchanged);
        assert_eq!(my.sql, "UPDATE `t` SET `id` = `id` WHERE `id` = ?");
        assert_eq!(my.params, [0]);
    }
}
