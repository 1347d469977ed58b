//! PostgreSQL: `PREPARE TRANSACTION` / `COMMIT PREPARED`, binary COPY, `INSERT .. ON CONFLICT`.

pub(crate) mod cell;
mod coordinator;
mod session;
mod statements;
pub(crate) mod table;

use connector_api::{Error, ErrorKind, Phase, Result};
use connector_common::postgres::PgConnectOptions;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

pub(crate) use coordinator::PgCoordinator;
pub(crate) use session::PgSession;

use crate::Xid;
use crate::columns::Numeric;
use crate::config::{ConnectionConfig, JdbcSinkConfig, WriteMode};
use crate::database::{MARKERS_TABLE, OWNERS_TABLE};

/// Advisory lock key serializing the creation of Ratchet's tables ("ratchet" in ASCII).
const SETUP_LOCK: i64 = 0x0072_6174_6368_6574;

/// Maps a PostgreSQL error to the driver's kind: connection, lock and serialization trouble is retryable, data the
/// table refuses is a bad record, the rest is fatal.
pub(crate) fn classify(e: &tokio_postgres::Error) -> ErrorKind {
    let value_refused = std::error::Error::source(e).is_some_and(|s| s.is::<cell::BadValue>());
    if value_refused {
        return ErrorKind::BadRecord;
    }
    if e.is_closed() {
        return ErrorKind::Retryable;
    }
    match e.code() {
        None => ErrorKind::Retryable,
        Some(code) if code.code().starts_with("08") || code.code().starts_with("57") => {
            ErrorKind::Retryable
        }
        Some(code)
            if *code == SqlState::T_R_SERIALIZATION_FAILURE
                || *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::LOCK_NOT_AVAILABLE
                || *code == SqlState::TOO_MANY_CONNECTIONS =>
        {
            ErrorKind::Retryable
        }
        // Class 22 (data exception) and 23 (integrity constraint violation): the rows, not the system.
        Some(code) if code.code().starts_with("22") || code.code().starts_with("23") => {
            ErrorKind::BadRecord
        }
        Some(_) => ErrorKind::Fatal,
    }
}

/// An error of `phase` about `what`, with `xid`'s coordinates. A server error's message, detail and column are
/// put in one line of the message, and the driver's error is not attached (its text would repeat them, over
/// several lines); any other error (the connection broke, a timeout) is attached as the source, not repeated.
pub(crate) fn pg_error(
    phase: Phase,
    xid: Option<&Xid>,
    what: &str,
    e: tokio_postgres::Error,
) -> Error {
    let kind = classify(&e);
    let error = match e.as_db_error() {
        Some(db) => {
            let mut text = format!("{what}: {}", db.message());
            if let Some(detail) = db.detail() {
                text.push_str(&format!(" ({detail})"));
            }
            if let Some(column) = db.column() {
                text.push_str(&format!(" [column {column}]"));
            }
            text.push_str(&format!(" [SQLSTATE {}]", db.code().code()));
            Error::new(kind, phase, text)
        }
        None => Error::new(kind, phase, what).with_source(e),
    };
    Xid::locate(error, xid)
}

/// Connection options for `connection`, the password from `password_env` when it names one.
pub(crate) fn options(connection: &ConnectionConfig) -> Result<PgConnectOptions> {
    let options = PgConnectOptions::parse(&connection.url)?;
    Ok(match connection.password()? {
        Some(password) => options.with_password(&password),
        None => options,
    })
}

/// Refuses `max_prepared_transactions = 0` (the server's default), with what to change.
pub(crate) fn check_max_prepared_transactions(value: &str) -> Result<()> {
    if value.trim() == "0" {
        return Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            "PostgreSQL has max_prepared_transactions = 0 (its default), so the xa mode (PREPARE TRANSACTION) \
             cannot work; set max_prepared_transactions to at least twice the number of sink subtasks in \
             postgresql.conf and restart the server, or use mode = upsert / append",
        ));
    }
    Ok(())
}

/// Checks that the server can do what `config`'s mode needs and creates Ratchet's tables (and the target table
/// and dedup table when asked).
///
/// # Errors
/// [`Config`](ErrorKind::Config) for `max_prepared_transactions = 0` in XA mode (naming the setting and how to
/// change it), for a target table that is missing without `create_table`.
pub(crate) async fn prepare_database(client: &Client, config: &JdbcSinkConfig) -> Result<()> {
    if config.mode.prepares() {
        let max: String = client
            .query_one("SHOW max_prepared_transactions", &[])
            .await
            .map_err(|e| {
                pg_error(
                    Phase::Setup,
                    None,
                    "cannot read max_prepared_transactions",
                    e,
                )
            })?
            .get(0);
        check_max_prepared_transactions(&max).map_err(|e| e.with_sink(&config.sink))?;
    }
    let shape = crate::columns::TableShape::of(&config.schema)?;
    let dialect = crate::config::Dialect::Postgres;
    let mut ddl = format!(
        "BEGIN;
         SELECT pg_advisory_xact_lock({SETUP_LOCK});
         CREATE TABLE IF NOT EXISTS {OWNERS_TABLE} (
             sink text NOT NULL, subtask integer NOT NULL, epoch bigint NOT NULL, checkpoint bigint,
             PRIMARY KEY (sink, subtask));
         CREATE TABLE IF NOT EXISTS {MARKERS_TABLE} (
             sink text NOT NULL, subtask integer NOT NULL, checkpoint bigint NOT NULL,
             committed_at timestamptz NOT NULL DEFAULT now(),
             PRIMARY KEY (sink, subtask, checkpoint));"
    );
    if config.create_table {
        let key = config.mode.key().unwrap_or_default().to_vec();
        ddl.push_str(&shape.create_table(dialect, &config.table, &key));
        ddl.push(';');
    }
    if let WriteMode::Append { dedup } = &config.mode {
        let column = shape.index(&dedup.message_id, "message_id")?;
        ddl.push_str(&format!(
            "CREATE TABLE IF NOT EXISTS {} (message_id {} PRIMARY KEY, seen_at timestamptz NOT NULL DEFAULT now());",
            crate::columns::quote_table(dialect, &dedup.table_for(&config.table)),
            shape.types[column].ddl(dialect, true, None)
        ));
    }
    ddl.push_str("COMMIT;");
    client.batch_execute(&ddl).await.map_err(|e| {
        pg_error(Phase::Setup, None, "cannot create Ratchet's tables", e).with_sink(&config.sink)
    })?;
    if config.evolution.adds_columns() {
        add_missing_columns(client, config, &shape).await?;
    }
    if config.evolution.changes_columns() {
        change_columns(client, config, &shape).await?;
    }
    Ok(())
}

/// A PostgreSQL column type (as `format_type` names it) as far as widening it goes.
fn numeric_of(type_name: &str) -> Option<Numeric> {
    Some(match type_name {
        "smallint" => Numeric::Integer(2),
        "integer" => Numeric::Integer(4),
        "bigint" => Numeric::Integer(8),
        "real" => Numeric::Float(4),
        "double precision" => Numeric::Float(8),
        other => {
            let (precision, scale) = other
                .strip_prefix("numeric(")?
                .strip_suffix(')')?
                .split_once(',')?;
            Numeric::Decimal(precision.trim().parse().ok()?, scale.trim().parse().ok()?)
        }
    })
}

/// `evolution = "evolve"`: widens the table's numeric columns, and arrays of numbers, whose batches' type is wider
/// ([`Numeric`]; `ALTER COLUMN .. TYPE`, which rewrites the table) and drops NOT NULL from the columns whose batches take nulls (not
/// the key's or the primary key's, and not for a change stream's rows, which are all nullable), in one `ALTER TABLE` (nothing when the table fits, so no lock is taken then). A table that does not
/// exist is left to the fit check to report. Another instance changing the same column at once is harmless: the
/// statement is idempotent in effect, and the second waits for the first's lock (bounded by `lock_timeout`).
async fn change_columns(
    client: &Client,
    config: &JdbcSinkConfig,
    shape: &crate::columns::TableShape,
) -> Result<()> {
    let changes = column_changes(client, config, shape).await?;
    if changes.is_empty() {
        return Ok(());
    }
    let clauses: Vec<&str> = changes.iter().map(|(_, clause)| clause.as_str()).collect();
    let alter = format!(
        "ALTER TABLE {} {}",
        crate::columns::quote_table(crate::config::Dialect::Postgres, &config.table),
        clauses.join(", ")
    );
    tracing::info!(sink = %config.sink, table = %config.table, statement = %alter, "widening columns");
    client.batch_execute(&alter).await.map_err(|e| {
        pg_error(
            Phase::Setup,
            None,
            &format!(
                "cannot widen the columns of {} for the batches' schema",
                config.table
            ),
            e,
        )
        .with_sink(&config.sink)
    })?;
    Ok(())
}

/// What `evolution = "evolve"` changes in the table for `shape` (read only): each column's name and `ALTER TABLE`
/// clause, a column once per clause (see [`change_columns`]). Nothing when the table does not exist.
pub(crate) async fn column_changes(
    client: &Client,
    config: &JdbcSinkConfig,
    shape: &crate::columns::TableShape,
) -> Result<Vec<(String, String)>> {
    let dialect = crate::config::Dialect::Postgres;
    let table = crate::columns::quote_table(dialect, &config.table);
    let existing = client
        .query(
            "SELECT attname::text, format_type(atttypid, atttypmod), attnotnull, \
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = attrelid AND i.indisprimary \
                            AND attnum = ANY (i.indkey)) \
             FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
            &[&table],
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
    let key = config.mode.key().unwrap_or_default();
    let relaxes = !crate::columns::is_change_stream(&config.schema);
    let mut changes = Vec::new();
    for (i, name) in shape.names.iter().enumerate() {
        let Some(row) = existing.iter().find(|r| r.get::<_, &str>(0) == name) else {
            continue;
        };
        let column = crate::columns::quote(dialect, name);
        // A numeric column, or an array of numbers (`integer[]` to `bigint[]`: PostgreSQL casts each item).
        let now: &str = row.get(1);
        let widened = match (
            Numeric::of(shape.types[i]),
            shape.item(i).and_then(Numeric::of),
        ) {
            (Some(wanted), _) => numeric_of(now).is_some_and(|n| n.widens_to(wanted)),
            (None, Some(item)) => now
                .strip_suffix("[]")
                .and_then(numeric_of)
                .is_some_and(|n| n.widens_to(item)),
            (None, None) => false,
        };
        if widened {
            let clause = format!(
                "ALTER COLUMN {column} TYPE {}",
                shape.column_ddl(dialect, i, false)
            );
            changes.push((name.clone(), clause));
        }
        let primary = row.get::<_, bool>(3);
        if relaxes
            && row.get::<_, bool>(2)
            && shape.fields[i].is_nullable()
            && !primary
            && !key.contains(name)
        {
            changes.push((name.clone(), format!("ALTER COLUMN {column} DROP NOT NULL")));
        }
    }
    Ok(changes)
}

/// `evolution = "add-columns"`: adds the batches' columns the table lacks (nothing when it has them all, so no
/// lock is taken then). A table that does not exist is left to the fit check to report.
async fn add_missing_columns(
    client: &Client,
    config: &JdbcSinkConfig,
    shape: &crate::columns::TableShape,
) -> Result<()> {
    let dialect = crate::config::Dialect::Postgres;
    let table = crate::columns::quote_table(dialect, &config.table);
    let Ok(statement) = client
        .prepare(&format!("SELECT * FROM {table} LIMIT 0"))
        .await
    else {
        return Ok(());
    };
    let existing: Vec<String> = statement
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    for alter in shape.add_missing(dialect, &config.table, &existing) {
        tracing::info!(sink = %config.sink, table = %config.table, statement = %alter, "adding a column");
        client.batch_execute(&alter).await.map_err(|e| {
            pg_error(
                Phase::Setup,
                None,
                &format!("cannot add the batches' new columns to {}", config.table),
                e,
            )
            .with_sink(&config.sink)
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn numeric_column_types_are_read_from_format_type() {
        use crate::columns::Numeric;
        assert_eq!(super::numeric_of("integer"), Some(Numeric::Integer(4)));
        assert_eq!(
            super::numeric_of("double precision"),
            Some(Numeric::Float(8))
        );
        assert_eq!(
            super::numeric_of("numeric(12,2)"),
            Some(Numeric::Decimal(12, 2))
        );
        assert_eq!(super::numeric_of("numeric"), None);
        assert_eq!(super::numeric_of("text"), None);
    }

    #[test]
    fn a_server_that_cannot_prepare_is_refused_with_the_fix() {
        let err = super::check_max_prepared_transactions("0").unwrap_err();
        assert_eq!(err.kind(), connector_api::ErrorKind::Config);
        assert!(
            err.to_string().contains("max_prepared_transactions"),
            "{err}"
        );
        assert!(super::check_max_prepared_transactions("128").is_ok());
    }
}
