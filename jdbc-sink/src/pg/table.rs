//! The target table as the sink finds it: each batch column's PostgreSQL column (type, type modifier), checked
//! against the type contract ([`super::cell::check`]) at start and by `check-config`.

use connector_api::types::{Refusal, refusals_message};
use connector_api::{ErrorKind, Phase, Result};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::cell::{PgColumn, check};
use super::{pg_error, statements};
use crate::columns::{TableShape, quote_table};
use crate::config::{Dialect, JdbcSinkConfig, config_error};

/// The table's column of each batch column, in the batches' order.
///
/// # Errors
/// [`Config`](ErrorKind::Config) when the table or a column is missing, or naming every column that cannot hold
/// its batch column's values exactly; retryable when the server cannot be read.
pub(crate) async fn columns(
    client: &Client,
    config: &JdbcSinkConfig,
    shape: &TableShape,
) -> Result<Vec<PgColumn>> {
    let probe = statements::probe(config, shape);
    let statement = client.prepare(&probe).await.map_err(|e| {
        let hint = match e.code() {
            Some(c) if *c == SqlState::UNDEFINED_TABLE => {
                " (create it, or set create_table = true to create it from the batches' schema)"
            }
            Some(c) if *c == SqlState::UNDEFINED_COLUMN => {
                " (every column of the batches must exist in the table, with the same name)"
            }
            _ => "",
        };
        let what = format!("the table {} does not fit the batches{hint}", config.table);
        pg_error(Phase::Setup, None, &what, e)
            .with_sink(&config.sink)
            .with_kind(ErrorKind::Config)
    })?;
    let modifiers = client
        .query(
            "SELECT attname::text, atttypmod FROM pg_attribute \
             WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped",
            &[&quote_table(Dialect::Postgres, &config.table)],
        )
        .await
        .map_err(|e| {
            pg_error(
                Phase::Setup,
                None,
                "cannot read the table's column types",
                e,
            )
            .with_sink(&config.sink)
        })?;
    let typmod = |name: &str| {
        modifiers
            .iter()
            .find(|row| row.get::<_, &str>(0) == name)
            .map_or(-1, |row| row.get::<_, i32>(1))
    };
    let mut columns = Vec::with_capacity(shape.names.len());
    let mut refusals: Vec<Refusal> = Vec::new();
    for (i, column) in statement.columns().iter().enumerate() {
        let target = PgColumn {
            ty: column.type_().clone(),
            typmod: typmod(&shape.names[i]),
        };
        if let Err(refusal) = check(shape.types[i], &shape.fields[i], &target) {
            refusals.push(refusal.under(&shape.names[i]));
        }
        columns.push(target);
    }
    if !refusals.is_empty() {
        return Err(config_error(refusals_message(
            &format!("PostgreSQL table {}", config.table),
            &refusals,
        ))
        .with_sink(&config.sink));
    }
    Ok(columns)
}
