//! The SQL of the writer's PostgreSQL session, built once per table.
//!
//! The upsert and append modes send each batch as one statement whose rows arrive as binary array parameters,
//! one array per column, unpacked with `unnest(..) WITH ORDINALITY` (the ordinal keeps arrival order, so the last
//! row of a key wins): no staging table to write and read back, and no row-by-row statements.

use connector_api::Result;
use tokio_postgres::types::{Kind, Type};

use super::cell::PgColumn;

use crate::columns::{SqlType, TableShape, quote, quote_table};
use crate::config::{Dialect, JdbcSinkConfig, WriteMode, config_error};

const D: Dialect = Dialect::Postgres;

/// `SELECT <columns> FROM <table> LIMIT 0`: prepared at start for the table's column types.
pub(crate) fn probe(config: &JdbcSinkConfig, shape: &TableShape) -> String {
    format!(
        "SELECT {} FROM {} LIMIT 0",
        shape.column_list(D),
        quote_table(D, &config.table)
    )
}

/// The xa mode's bulk path: binary COPY into the table.
pub(crate) fn copy(config: &JdbcSinkConfig, shape: &TableShape) -> String {
    format!(
        "COPY {} ({}) FROM STDIN (FORMAT binary)",
        quote_table(D, &config.table),
        shape.column_list(D)
    )
}

/// The statements of the upsert and append modes, one execution per batch.
#[derive(Debug, Clone)]
pub(crate) struct BatchStatements {
    /// The statement to run first: `MERGE` (upsert on PostgreSQL 15+), `INSERT .. ON CONFLICT` (upsert before
    /// 15), or the dedup append.
    pub(crate) primary: String,
    /// Run instead when `primary` (a `MERGE`) meets a key a concurrent writer inserted first: `MERGE` then fails
    /// with a unique violation where `INSERT .. ON CONFLICT` waits and updates.
    pub(crate) fallback: Option<String>,
    /// Deletes dedup ids older than `$1` seconds (append mode).
    pub(crate) dedup_cleanup: Option<String>,
}

impl BatchStatements {
    /// The statements for `config`'s mode (`None` in xa mode), given the table's column `types` (in the batch
    /// schema's order) and whether the server has `MERGE`.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) for key or message-id columns the batches do not have.
    pub(crate) fn new(
        config: &JdbcSinkConfig,
        shape: &TableShape,
        types: &[Type],
        has_merge: bool,
    ) -> Result<Option<Self>> {
        let table = quote_table(D, &config.table);
        let columns = shape.column_list(D);
        // One array parameter per column; an array column's values travel as JSON (a parameter cannot be an
        // array of arrays of different lengths) and are turned back into arrays of the element type.
        let arrays: Vec<String> = types
            .iter()
            .enumerate()
            .map(|(i, ty)| match ty.kind() {
                Kind::Array(_) => format!("${}::pg_catalog.jsonb[]", i + 1),
                _ => format!(
                    "${}::{}.{}[]",
                    i + 1,
                    quote(D, ty.schema()),
                    quote(D, ty.name())
                ),
            })
            .collect();
        let unnested = format!(
            "unnest({}) WITH ORDINALITY AS u({columns}, ratchet_seq)",
            arrays.join(", ")
        );
        let converted: Vec<String> = shape
            .names
            .iter()
            .zip(types)
            .map(|(name, ty)| match ty.kind() {
                Kind::Array(element) => json_array(name, element),
                _ => format!("u.{}", quote(D, name)),
            })
            .collect();
        let rows = format!(
            "(SELECT {}, u.ratchet_seq FROM {unnested}) AS s",
            converted.join(", ")
        );
        let prefixed = |prefix: &str| {
            shape
                .names
                .iter()
                .map(|n| format!("{prefix}.{}", quote(D, n)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        Ok(Some(match &config.mode {
            WriteMode::Xa => return Ok(None),
            WriteMode::Upsert { key } | WriteMode::XaUpsert { key } => {
                if key.is_empty() {
                    return Err(config_error("mode upsert needs at least one key column"));
                }
                for k in key {
                    shape.index(k, "key")?;
                }
                let keys = key
                    .iter()
                    .map(|k| quote(D, k))
                    .collect::<Vec<_>>()
                    .join(", ");
                let others: Vec<&String> =
                    shape.names.iter().filter(|n| !key.contains(n)).collect();
                let latest = format!(
                    "SELECT DISTINCT ON ({keys}) {columns} FROM {rows} ORDER BY {keys}, ratchet_seq DESC"
                );
                let on_conflict = if others.is_empty() {
                    "DO NOTHING".to_string()
                } else {
                    let set: Vec<String> = others
                        .iter()
                        .map(|n| format!("{0} = EXCLUDED.{0}", quote(D, n)))
                        .collect();
                    format!("DO UPDATE SET {}", set.join(", "))
                };
                let insert = format!(
                    "INSERT INTO {table} ({columns}) {latest} ON CONFLICT ({keys}) {on_conflict}"
                );
                if !has_merge {
                    return Ok(Some(Self {
                        primary: insert,
                        fallback: None,
                        dedup_cleanup: None,
                    }));
                }
                let on: Vec<String> = key
                    .iter()
                    .map(|k| format!("t.{0} = s.{0}", quote(D, k)))
                    .collect();
                let when_matched = if others.is_empty() {
                    "DO NOTHING".to_string()
                } else {
                    let set: Vec<String> = others
                        .iter()
                        .map(|n| format!("{0} = s.{0}", quote(D, n)))
                        .collect();
                    format!("UPDATE SET {}", set.join(", "))
                };
                Self {
                    primary: format!(
                        "MERGE INTO {table} t USING ({latest}) s ON {} WHEN MATCHED THEN {when_matched} \
                         WHEN NOT MATCHED THEN INSERT ({columns}) VALUES ({})",
                        on.join(" AND "),
                        prefixed("s")
                    ),
                    fallback: Some(insert),
                    dedup_cleanup: None,
                }
            }
            WriteMode::Append { dedup } => {
                shape.index(&dedup.message_id, "message_id")?;
                let id = quote(D, &dedup.message_id);
                let seen = quote_table(D, &dedup.table_for(&config.table));
                Self {
                    primary: format!(
                        "WITH s AS (SELECT * FROM {rows}), \
                         fresh AS (INSERT INTO {seen} (message_id) SELECT DISTINCT {id} FROM s \
                         ON CONFLICT DO NOTHING RETURNING message_id) \
                         INSERT INTO {table} ({columns}) SELECT DISTINCT ON (s.{id}) {} FROM s \
                         JOIN fresh f ON f.message_id = s.{id} ORDER BY s.{id}, s.ratchet_seq",
                        prefixed("s")
                    ),
                    fallback: None,
                    dedup_cleanup: Some(format!(
                        "DELETE FROM {seen} WHERE seen_at < now() - make_interval(secs => $1)"
                    )),
                }
            }
        }))
    }
}

/// Keyed modes: every row deleted (a truncate).
pub(crate) fn delete_all(config: &JdbcSinkConfig) -> String {
    format!("DELETE FROM {}", quote_table(D, &config.table))
}

/// The upsert mode's delete by key (tombstones): one execution per call, the keys arriving as binary array
/// parameters like the batches' rows.
#[derive(Debug, Clone)]
pub(crate) struct KeyDelete {
    /// `DELETE FROM <table> t USING unnest($1::<type>[], ..) AS s(<k1>, ..) WHERE t.<k1> = s.<k1> AND ..`.
    pub(crate) sql: String,
    /// The key columns' SQL types, in the mode's order (the order of the decoded keys' columns).
    pub(crate) types: Vec<SqlType>,
    /// Their type modifiers.
    pub(crate) typmods: Vec<i32>,
}

impl KeyDelete {
    /// The delete of `config`'s upsert mode (`None` in the other modes), given the table's column `types` (in the
    /// batch schema's order).
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) for key columns the batches do not have.
    pub(crate) fn new(
        config: &JdbcSinkConfig,
        shape: &TableShape,
        columns: &[PgColumn],
    ) -> Result<Option<Self>> {
        let Some(key) = config.mode.key() else {
            return Ok(None);
        };
        let mut arrays = Vec::with_capacity(key.len());
        let mut key_types = Vec::with_capacity(key.len());
        let mut typmods = Vec::with_capacity(key.len());
        let mut on = Vec::with_capacity(key.len());
        for (i, k) in key.iter().enumerate() {
            let at = shape.index(k, "key")?;
            let ty = &columns[at].ty;
            typmods.push(columns[at].typmod);
            arrays.push(format!(
                "${}::{}.{}[]",
                i + 1,
                quote(D, ty.schema()),
                quote(D, ty.name())
            ));
            key_types.push(shape.types[at]);
            on.push(format!("t.{0} = s.{0}", quote(D, k)));
        }
        let names = key
            .iter()
            .map(|k| quote(D, k))
            .collect::<Vec<_>>()
            .join(", ");
        Ok(Some(Self {
            sql: format!(
                "DELETE FROM {} t USING unnest({}) AS s({names}) WHERE {}",
                quote_table(D, &config.table),
                arrays.join(", "),
                on.join(" AND ")
            ),
            types: key_types,
            typmods,
        }))
    }
}

/// `s.<name>` from the JSON array it travelled as, back into an array of `element` (items in order; a null
/// list stays null, an empty one stays empty; bytea items travel in base64).
fn json_array(name: &str, element: &Type) -> String {
    let column = format!("u.{}", quote(D, name));
    let item = match *element {
        Type::BYTEA => "decode(e.v, 'base64')".to_string(),
        _ => format!(
            "e.v::{}.{}",
            quote(D, element.schema()),
            quote(D, element.name())
        ),
    };
    format!(
        "CASE WHEN {column} IS NULL THEN NULL ELSE ARRAY(SELECT {item} FROM \
         jsonb_array_elements_text({column}) WITH ORDINALITY AS e(v, o) ORDER BY e.o) END AS {}",
        quote(D, name)
    )
}
