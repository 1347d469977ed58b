//! `ratchet check-config` for an Iceberg sink: the catalog answers, the table is there (or would be created with
//! `create_table`), every column has an exact Iceberg type in it ([`crate::types`]), and an `upsert_key` fits the
//! settings and the table. Changes nothing: a SQL catalog is only opened through iceberg-rust once its tables exist
//! (opening it creates them), no namespace, table or snapshot is created.

use std::str::FromStr;

use connector_api::{Error, ErrorKind, Phase, Result, SinkCheck};
use iceberg::TableIdent;
use sqlx::Connection;

use crate::config::{CatalogConfig, IcebergSinkConfig};
use crate::equality_deletes::EqualityDeletes;
use crate::error::iceberg_error;
use crate::types;
use crate::upsert::KeyedRows;

/// The SQL catalog's table of tables (iceberg-rust's and pyiceberg's `SqlCatalog`).
const CATALOG_TABLE: &str = "iceberg_tables";

/// Checks `config`.
///
/// # Errors
/// [`Config`](ErrorKind::Config) for a catalog that cannot be opened or a missing table without `create_table`;
/// retryable when the catalog's database cannot be read.
pub(crate) async fn check(config: &IcebergSinkConfig) -> Result<SinkCheck> {
    let keyed = KeyedRows::of_config(config)?;
    let ident = TableIdent::from_strs(config.table.split('.')).map_err(|_| {
        Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!("table {:?} is not `namespace.name`", config.table),
        )
    })?;
    let (catalog, found) = match &config.catalog {
        CatalogConfig::Sql { uri, .. } if !sql_catalog_has_tables(uri).await? => (
            "the SQL catalog has no tables yet (the first run creates them)",
            None,
        ),
        _ => {
            let catalog = config
                .catalog
                .open(&config.catalog_name, &config.s3)
                .await?;
            let exists = catalog.table_exists(&ident).await.map_err(|e| {
                iceberg_error(Phase::Setup, format!("cannot look up table {ident}"), e)
            })?;
            if exists {
                let table = catalog.load_table(&ident).await.map_err(|e| {
                    iceberg_error(Phase::Setup, format!("cannot load table {ident}"), e)
                })?;
                let changed = match config.evolution.changes_columns() {
                    true => {
                        crate::evolve::changed_columns(&table, &*crate::sink::table_schema(config)?)
                    }
                    false => Vec::new(),
                };
                crate::sink::check_columns(config, &table, &changed)?;
                if let Some(keyed) = &keyed {
                    EqualityDeletes::of(&table, keyed.key())
                        .map_err(|e| e.with_sink(&config.sink))?;
                }
                (
                    "the catalog answers",
                    Some(format!(
                        "table {ident} exists ({} snapshot(s)){}",
                        table.metadata().snapshots().count(),
                        match changed.is_empty() {
                            true => String::new(),
                            false => format!(
                                "; the first run widens (or makes optional) column(s) {}",
                                changed.join(", ")
                            ),
                        }
                    )),
                )
            } else {
                ("the catalog answers", None)
            }
        }
    };
    let table = match (found, config.create_table) {
        (Some(found), _) => found,
        (None, true) => {
            types::table_schema(crate::sink::table_schema(config)?.as_ref())
                .map_err(|refusals| types::refused(&config.sink, &config.table, &refusals))?;
            format!("table {ident} does not exist yet: the first run creates it")
        }
        (None, false) => {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "table {ident} does not exist in the catalog: create it, or set create_table = true to \
                     create an unpartitioned table from the input schema"
                ),
            ));
        }
    };
    let mode = match &keyed {
        Some(keyed) => format!(
            "; upserts by key ({}) as row deltas",
            keyed.key().join(", ")
        ),
        None => String::new(),
    };
    Ok(SinkCheck {
        summary: format!("settings valid; {catalog}; {table}{mode}"),
        transaction_timeout: None,
    })
}

/// Whether the SQL catalog at `uri` has its tables (a SQLite file that does not exist has none), read-only.
async fn sql_catalog_has_tables(uri: &str) -> Result<bool> {
    let unreadable = |e: sqlx::Error| {
        Error::new(
            ErrorKind::Retryable,
            Phase::Setup,
            "cannot read the SQL catalog's database",
        )
        .with_source(e)
    };
    if let Some(rest) = uri.strip_prefix("sqlite:") {
        let path = rest.trim_start_matches("//");
        let path = path.split('?').next().unwrap_or_default();
        if !std::path::Path::new(path).exists() {
            return Ok(false);
        }
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&format!("sqlite://{path}"))
            .map_err(unreadable)?
            .read_only(true);
        let mut conn = sqlx::sqlite::SqliteConnection::connect_with(&options)
            .await
            .map_err(unreadable)?;
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
        )
        .bind(CATALOG_TABLE)
        .fetch_one(&mut conn)
        .await
        .map_err(unreadable)?;
        return Ok(count > 0);
    }
    let mut conn = sqlx::postgres::PgConnection::connect(uri)
        .await
        .map_err(unreadable)?;
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(CATALOG_TABLE)
        .fetch_one(&mut conn)
        .await
        .map_err(unreadable)
}
