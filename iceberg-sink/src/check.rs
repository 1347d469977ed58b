//! `ratchet check-config` for an Iceberg sink: the catalog answers, the table is there (or would be created with
//! `create_table`), every column has an exact Iceberg type in it ([`crate::types`]), and an `upsert_key` fits the
//! settings and the table. Changes nothing: a SQL catalog is only opened through iceberg-rust once its tables exist
//! (opening it creates them), no namespace, table or snapshot is created.

use std::str::FromStr;

use connector_api::{Error, ErrorKind, Phase, Result, SinkCheck};
use iceberg::TableIdent;
use sqlx::Connection;

use crate::UpsertDeletes;
use crate::config::{CatalogConfig, IcebergSinkConfig};
use crate::equality_deletes::EqualityDeletes;
use crate::error::{iceberg_error, within};
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
    if let Some(policy) = config.compact.explicit() {
        policy.check(&config.sink, &config.upsert_key, config.upsert_deletes)?;
    }
    config.layout.check_settings(
        &config.sink,
        config.create_table,
        &config.upsert_key,
        config.upsert_deletes,
    )?;
    let ident = table_ident(config)?;
    let created = config.compact.resolve_created(config.upsert_mode());
    let existing = existing_table(config, &ident).await?;
    let (catalog, found, compacts) = match existing {
        Existing::NoCatalogTables => (
            "the SQL catalog has no tables yet (the first run creates them)",
            None,
            created,
        ),
        Existing::Missing => ("the catalog answers", None, created),
        Existing::Table(table) => {
            let changed = match config.evolution.changes_columns() {
                true => {
                    crate::evolve::changed_columns(&table, &*crate::upsert::table_schema(config)?)
                }
                false => Vec::new(),
            };
            crate::sink::check_columns(config, &table, &changed)?;
            if let Some(keyed) = &keyed {
                EqualityDeletes::of(&table, keyed.key()).map_err(|e| e.with_sink(&config.sink))?;
                if config.upsert_deletes == UpsertDeletes::Equality {
                    EqualityDeletes::refuse_partitioned(&table)
                        .map_err(|e| e.with_sink(&config.sink))?;
                }
            }
            (
                "the catalog answers",
                Some(format!(
                    "table {ident} exists ({} snapshot(s)){}{}",
                    table.metadata().snapshots().count(),
                    match config.layout.is_default() {
                        true => "",
                        false => {
                            "; it keeps its own layout (partition_by, sort_by and properties shape only a \
                             table the sink creates)"
                        }
                    },
                    match changed.is_empty() {
                        true => String::new(),
                        false => format!(
                            "; the first run widens (or makes optional) column(s) {}",
                            changed.join(", ")
                        ),
                    }
                )),
                config.compact.resolve(&table, config.upsert_mode()),
            )
        }
    };
    let table = match (found, config.create_table) {
        (Some(found), _) => found,
        (None, true) => {
            crate::table_creation::created_table(config)?;
            let layout = &config.layout;
            let shaped = [
                ("partitioned by", &layout.partition_by),
                ("sorted by", &layout.sort_by),
            ]
            .iter()
            .filter(|(_, terms)| !terms.is_empty())
            .map(|(how, terms)| format!(" {how} {}", terms.join(", ")))
            .chain(
                layout
                    .format_version
                    .map(|version| format!(" as format version {version}")),
            )
            .collect::<Vec<_>>()
            .join(",");
            format!("table {ident} does not exist yet: the first run creates it{shaped}")
        }
        (None, false) => {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "table {ident} does not exist in the catalog: create it, or set create_table = true to \
                     create it from the input schema"
                ),
            ));
        }
    };
    let mode = match &keyed {
        Some(keyed) => format!(
            "; upserts by key ({}) as row deltas, {}",
            keyed.key().join(", "),
            match config.upsert_deletes {
                UpsertDeletes::Position => {
                    "deleting replaced rows by position (a key index of the whole table per subtask, in \
                     memory, rebuilt at each start)"
                }
                UpsertDeletes::Equality =>
                    "deleting replaced rows by equality deletes of their keys",
            }
        ),
        None => String::new(),
    };
    let compaction = match compacts {
        Some(policy) => format!(
            "; compacts its small files and files with many deleted rows inside the commits ({})",
            policy.describe()
        ),
        None => "; no compaction".to_string(),
    };
    Ok(SinkCheck {
        summary: format!("settings valid; {catalog}; {table}{mode}{compaction}"),
        transaction_timeout: None,
    })
}

/// What the catalog holds of the sink's table.
enum Existing {
    /// A SQL catalog whose database has no catalog tables yet: nothing exists (opening it would create them).
    NoCatalogTables,
    /// The catalog answers and has no such table.
    Missing,
    /// The table as loaded.
    Table(Box<iceberg::table::Table>),
}

/// Looks `ident` up in `config`'s catalog, read only, within `commit_timeout` (the longest one catalog call may
/// take): a catalog that hangs instead of answering is reported, not waited on.
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when the lookup took longer than `commit_timeout`; as [`check`] otherwise.
async fn existing_table(config: &IcebergSinkConfig, ident: &TableIdent) -> Result<Existing> {
    within(
        config.commit_timeout,
        &format!("a lookup of table {ident}"),
        look_up(config, ident),
    )
    .await
    .map_err(|e| e.with_sink(&config.sink))
}

/// [`existing_table`], unbounded.
async fn look_up(config: &IcebergSinkConfig, ident: &TableIdent) -> Result<Existing> {
    if let CatalogConfig::Sql { uri, .. } = &config.catalog
        && !sql_catalog_has_tables(uri).await?
    {
        return Ok(Existing::NoCatalogTables);
    }
    let catalog = config
        .catalog
        .open(&config.catalog_name, &config.s3)
        .await?;
    let exists = catalog
        .table_exists(ident)
        .await
        .map_err(|e| iceberg_error(Phase::Setup, format!("cannot look up table {ident}"), e))?;
    if !exists {
        return Ok(Existing::Missing);
    }
    let table = catalog
        .load_table(ident)
        .await
        .map_err(|e| iceberg_error(Phase::Setup, format!("cannot load table {ident}"), e))?;
    Ok(Existing::Table(Box::new(table)))
}

/// The batches' columns that `config`'s table lacks (none when it does not exist yet: the first run creates it
/// with every column): what `evolution = "ignore"` leaves out. Read only.
///
/// # Errors
/// As [`check`], for a catalog that cannot be opened or read, or a malformed table name.
pub(crate) async fn lacking_columns(config: &IcebergSinkConfig) -> Result<Vec<String>> {
    let ident = table_ident(config)?;
    let Existing::Table(table) = existing_table(config, &ident).await? else {
        return Ok(Vec::new());
    };
    let current = table.metadata().current_schema();
    Ok(crate::upsert::table_schema(config)?
        .fields()
        .iter()
        .map(|f| f.name())
        .filter(|name| current.field_by_name(name).is_none())
        .cloned()
        .collect())
}

/// The table's identifier, `namespace.name`.
fn table_ident(config: &IcebergSinkConfig) -> Result<TableIdent> {
    TableIdent::from_strs(config.table.split('.')).map_err(|_| {
        Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!("table {:?} is not `namespace.name`", config.table),
        )
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
