//! Ratchet's own catalog commit for the SQL catalog: the commit iceberg-rust 0.10 cannot be asked to make
//! (`TableCommit`'s constructor is crate-private, so `Catalog::update_table` takes only what its own
//! `Transaction` actions build; a snapshot whose manifest list was merged is not one of them).
//!
//! # The protocol (Iceberg spec "Metastore Tables", the SQL catalog of Java, pyiceberg and iceberg-rust)
//! 1. The requirements the planned updates carry (table UUID, main branch still at the snapshot they were planned
//!    on) are checked on the base metadata; the updates are applied to it with iceberg's own
//!    `TableMetadataBuilder` (which also trims the metadata log by `write.metadata.previous-versions-max`).
//! 2. The new metadata is written as the next version (`<n+1>-<uuid>.metadata.json`, compressed as the table asks).
//! 3. One statement swaps the table's pointer, only if it still names the base version:
//!    `UPDATE iceberg_tables SET metadata_location = new, previous_metadata_location = base WHERE catalog_name,
//!    table_namespace, table_name match AND metadata_location = base`. One row: committed. No row: another
//!    writer moved the table first (a conflict: the new file is deleted, the caller replans on fresh metadata).
//!    Any error, a failed transaction commit or a timeout: the outcome is unknown (the file is kept; the caller's
//!    next attempt reloads the table and its ledger check finds a commit that landed).
//!
//! This is the exact statement iceberg-rust's and pyiceberg's SQL catalogs run, so all three can commit to the same
//! table: each one's swap fails when another moved the pointer.

use std::str::FromStr;
use std::sync::Arc;

use iceberg::spec::TableMetadataBuilder;
use iceberg::table::Table;
use iceberg::{Error, ErrorKind, MetadataLocation, Result, TableRequirement, TableUpdate};
use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

use crate::swap_outcome::SwapOutcome;

/// A compare-and-swap of a table's metadata location in a SQL catalog's `iceberg_tables`.
#[derive(Clone)]
pub(crate) struct SqlMetadataSwap {
    pool: AnyPool,
    catalog_name: String,
    statement: Arc<str>,
    select_statement: Arc<str>,
}

/// `sql` with its `?` placeholders numbered `$1`, `$2`, ... (PostgreSQL's style), as iceberg's SQL catalog does.
fn dollar_numbered(sql: &str) -> String {
    let mut n = 0;
    sql.split('?')
        .enumerate()
        .map(|(i, part)| {
            if i == 0 {
                part.to_string()
            } else {
                n += 1;
                format!("${n}{part}")
            }
        })
        .collect()
}

impl std::fmt::Debug for SqlMetadataSwap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlMetadataSwap")
            .field("catalog_name", &self.catalog_name)
            .finish_non_exhaustive()
    }
}

impl SqlMetadataSwap {
    /// Connects to the catalog database at `uri` (the one iceberg's SQL catalog uses), for the catalog named
    /// `catalog_name`. `dollar_numeric` picks `$1` placeholders (PostgreSQL) over `?` (SQLite).
    ///
    /// The pool connects lazily: an unreachable database fails the first commit (retryably), not the setup.
    pub(crate) fn connect(uri: &str, catalog_name: &str, dollar_numeric: bool) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(2)
            .connect_lazy(uri)
            .map_err(|e| {
                Error::new(
                    ErrorKind::DataInvalid,
                    "cannot open the SQL catalog's database for Ratchet's own commit",
                )
                .with_source(e)
            })?;
        let mut select = String::from(
            "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND table_name = ? \
             AND table_namespace = ? AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
        );
        let mut statement = String::from(
            "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
             WHERE catalog_name = ? AND table_name = ? AND table_namespace = ? \
             AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL) AND metadata_location = ?",
        );
        if dollar_numeric {
            statement = dollar_numbered(&statement);
            select = dollar_numbered(&select);
        }
        Ok(Self {
            pool,
            catalog_name: catalog_name.to_string(),
            statement: statement.into(),
            select_statement: select.into(),
        })
    }

    /// Commits `updates` planned on `base` under `requirements` (steps 1-3 of the module docs).
    ///
    /// # Errors
    /// Requirements `base` does not meet, or updates the builder refuses, are returned as iceberg returns them
    /// (`DataInvalid`/`PreconditionFailed`: the plan is wrong, retrying would not help). A failed write or a
    /// failed statement is `Unexpected`: the outcome is unknown.
    pub(crate) async fn commit(
        &self,
        base: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<SwapOutcome> {
        for requirement in &requirements {
            requirement.check(Some(base.metadata()))?;
        }
        let base_location = base.metadata_location_result()?.to_string();
        let mut builder: TableMetadataBuilder = base
            .metadata()
            .clone()
            .into_builder(Some(base_location.clone()));
        for update in updates {
            builder = update.apply(builder)?;
        }
        let metadata = builder.build()?.metadata;
        let location = MetadataLocation::from_str(&base_location)?
            .with_next_version()
            .with_new_metadata(&metadata);
        metadata.write_to(base.file_io(), &location).await?;
        let location = location.to_string();
        let ident = base.identifier();
        let swapped = sqlx::query(&self.statement)
            .bind(location.clone())
            .bind(base_location.clone())
            .bind(self.catalog_name.clone())
            .bind(ident.name().to_string())
            .bind(ident.namespace().join("."))
            .bind(base_location)
            .execute(&self.pool)
            .await
            .map_err(|e| {
                Error::new(
                    ErrorKind::Unexpected,
                    format!("the metadata swap of table {ident} failed; its outcome is unknown"),
                )
                .with_source(e)
            })?;
        match swapped.rows_affected() {
            1 => Ok(SwapOutcome::Committed(Box::new(
                Table::builder()
                    .file_io(base.file_io().clone())
                    .identifier(ident.clone())
                    .metadata_location(location)
                    .metadata(metadata)
                    .runtime(iceberg::Runtime::try_current()?)
                    .build()?,
            ))),
            0 => {
                if let Err(e) = base.file_io().delete(&location).await {
                    tracing::debug!(file = %location, error = %e, "cannot delete the metadata file of a lost swap");
                }
                self.check_row(base).await?;
                Ok(SwapOutcome::Conflict)
            }
            n => Err(Error::new(
                ErrorKind::Unexpected,
                format!(
                    "the metadata swap of table {ident} changed {n} rows of iceberg_tables (catalog {}): the \
                     catalog's table has duplicate rows",
                    self.catalog_name
                ),
            )),
        }
    }

    /// After a swap that changed no row: `Ok` when the table's row exists and names another metadata file (another
    /// writer moved it: a conflict); an error naming the catalog, namespace and table when there is no such row
    /// (a wrong `catalog_name`, or the table was dropped or is a view), which no retry would change.
    async fn check_row(&self, base: &Table) -> Result<()> {
        let ident = base.identifier();
        let select = self.select_statement.as_ref();
        let row: Option<(Option<String>,)> = sqlx::query_as(select)
            .bind(self.catalog_name.clone())
            .bind(ident.name().to_string())
            .bind(ident.namespace().join("."))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| {
                Error::new(
                ErrorKind::Unexpected,
                format!(
                    "the metadata swap of table {ident} changed no row, and reading its row failed"
                ),
            )
            .with_source(e)
            })?;
        match row {
            Some((Some(location),)) if Some(location.as_str()) != base.metadata_location() => {
                Ok(())
            }
            Some(_) => Err(Error::new(
                ErrorKind::Unexpected,
                format!(
                    "the metadata swap of table {ident} changed no row although its row names the metadata it was \
                     planned on; retrying"
                ),
            )),
            None => Err(Error::new(
                ErrorKind::DataInvalid,
                format!(
                    "the SQL catalog has no table {ident} in catalog {:?} (iceberg_tables has no such row of type \
                     TABLE): was it dropped, or does the sink's catalog_name differ from the catalog's?",
                    self.catalog_name
                ),
            )),
        }
    }
}
