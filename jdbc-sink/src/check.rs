//! `ratchet check-config` for a JDBC sink: connects, reads what the mode needs from the server and whether the
//! table is there, and checks every column against the type contract (the table's columns when it exists, the
//! types `create_table` would give them otherwise). Columns the sink's `evolution` would add or change when it
//! opens are named in the summary instead of checked. Changes nothing: no table (Ratchet's or the target), no
//! transaction.

use connector_api::{Error, ErrorKind, Phase, Result, SinkCheck};
use mysql_async::prelude::Queryable;

use crate::columns::TableShape;
use crate::config::{Dialect, JdbcSinkConfig};

/// Checks `config`.
///
/// # Errors
/// [`Config`](ErrorKind::Config) for a server that cannot do what the mode needs (PostgreSQL without prepared
/// transactions, MariaDB too old for XA or without the privilege for `XA RECOVER`) or a missing table without
/// `create_table`; retryable when the server cannot be reached (named).
pub(crate) async fn check(config: &JdbcSinkConfig) -> Result<SinkCheck> {
    let dialect = Dialect::of_url(&config.connection.url)?;
    let config = &crate::sink::table_config(config)?;
    let shape = TableShape::of(&config.schema).map_err(|e| e.with_sink(&config.sink))?;
    shape
        .check_create(dialect)
        .map_err(|e| e.with_sink(&config.sink))?;
    let mut server = Server::connect(dialect, config).await?;
    let checked = match &mut server {
        Server::Postgres(client) => postgres(client, config, &shape).await,
        Server::MySql(conn) => mysql(conn, config, &shape).await,
    };
    server.close().await;
    let (server, exists, evolved) = checked?;
    let table = match (exists, config.create_table) {
        (true, _) => format!("table {} exists{}", config.table, evolved.summary()),
        (false, true) => format!(
            "table {} does not exist yet: the first run creates it",
            config.table
        ),
        (false, false) => {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "table {} does not exist: create it, or set create_table = true",
                    config.table
                ),
            ));
        }
    };
    Ok(SinkCheck {
        summary: format!("settings valid; {server} answers; {table}"),
        transaction_timeout: None,
    })
}

/// What the sink's `evolution` would change in an existing table when it opens: the columns it adds, and the ones
/// it widens or makes nullable.
#[derive(Debug, Default)]
struct Evolved {
    added: Vec<String>,
    changed: Vec<String>,
}

impl Evolved {
    /// The columns `existing` lacks (with `add-columns` or more) and the changes `changes` plans (`evolve`).
    fn of(
        dialect: Dialect,
        config: &JdbcSinkConfig,
        shape: &TableShape,
        existing: &[String],
        changes: Vec<(String, String)>,
    ) -> Self {
        let added = match config.evolution.adds_columns() {
            true => missing(dialect, shape, existing),
            false => Vec::new(),
        };
        let mut changed: Vec<String> = changes.into_iter().map(|(name, _)| name).collect();
        changed.dedup();
        Self { added, changed }
    }

    /// The shape whose columns must fit the table as it is.
    fn checked(&self, shape: &TableShape) -> TableShape {
        shape.without(&[self.added.clone(), self.changed.clone()].concat())
    }

    /// The end of the summary: what the first run changes.
    fn summary(&self) -> String {
        let mut out = String::new();
        if !self.added.is_empty() {
            out.push_str(&format!(
                "; the first run adds column(s) {}",
                self.added.join(", ")
            ));
        }
        if !self.changed.is_empty() {
            out.push_str(&format!(
                "; the first run widens (or makes nullable) column(s) {}",
                self.changed.join(", ")
            ));
        }
        out
    }
}

/// The columns of `shape` that a table of `existing` columns lacks, names compared as `dialect` compares the
/// sink's identifiers: exactly on PostgreSQL (the sink quotes them), without case on MariaDB (whose column names
/// never are case-sensitive).
fn missing(dialect: Dialect, shape: &TableShape, existing: &[String]) -> Vec<String> {
    let has = |name: &str| match dialect {
        Dialect::Postgres => existing.iter().any(|e| e == name),
        Dialect::MySql => existing.iter().any(|e| e.eq_ignore_ascii_case(name)),
    };
    shape.names.iter().filter(|n| !has(n)).cloned().collect()
}

/// The batches' columns that `config`'s table lacks (none when it does not exist yet: the first run creates it
/// with every column): what `evolution = "ignore"` leaves out. Read only.
///
/// # Errors
/// Retryable when the server cannot be reached (named); [`Config`](ErrorKind::Config) for a batch column the
/// sink cannot write.
pub(crate) async fn lacking_columns(config: &JdbcSinkConfig) -> Result<Vec<String>> {
    let dialect = Dialect::of_url(&config.connection.url)?;
    let config = &crate::sink::table_config(config)?;
    let shape = TableShape::of(&config.schema).map_err(|e| e.with_sink(&config.sink))?;
    let mut server = Server::connect(dialect, config).await?;
    let existing = match &mut server {
        Server::Postgres(client) => pg_columns(client, &config.table).await,
        Server::MySql(conn) => mysql_columns(conn, &config.table).await,
    };
    server.close().await;
    Ok(existing?
        .map(|existing| missing(dialect, &shape, &existing))
        .unwrap_or_default())
}

/// A connection to the sink's server for the read-only checks.
enum Server {
    Postgres(tokio_postgres::Client),
    MySql(mysql_async::Conn),
}

impl Server {
    /// Connects to `config`'s server, as the sink connects (timeouts, TLS, session settings).
    ///
    /// # Errors
    /// Retryable when the server cannot be reached (named); [`Config`](ErrorKind::Config) for a refused login or a
    /// malformed URL.
    async fn connect(dialect: Dialect, config: &JdbcSinkConfig) -> Result<Self> {
        Ok(match dialect {
            Dialect::Postgres => Self::Postgres(
                crate::pg::options(&config.connection)?
                    .connect("the JDBC sink's PostgreSQL database")
                    .await?,
            ),
            Dialect::MySql => Self::MySql(
                crate::mysql::connect(
                    &crate::mysql::options(&config.connection)?,
                    Phase::Setup,
                    "the JDBC sink's MySQL/MariaDB database",
                )
                .await?,
            ),
        })
    }

    /// Ends the session (a MariaDB connection says goodbye; a PostgreSQL client closes when dropped).
    async fn close(self) {
        if let Self::MySql(conn) = self {
            let _ = conn.disconnect().await;
        }
    }
}

/// The columns of PostgreSQL table `table` (named as the sink names it: quoted, so its case is kept), `None` when
/// it does not exist.
async fn pg_columns(client: &tokio_postgres::Client, table: &str) -> Result<Option<Vec<String>>> {
    let table = crate::columns::quote_table(Dialect::Postgres, table);
    let read = |what: &'static str| {
        move |e: tokio_postgres::Error| crate::pg::pg_error(Phase::Setup, None, what, e)
    };
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .map_err(read("cannot look up the table"))?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let columns = client
        .query(
            "SELECT attname::text FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
            &[&table],
        )
        .await
        .map_err(read("cannot read the table's columns"))?
        .iter()
        .map(|row| row.get(0))
        .collect();
    Ok(Some(columns))
}

/// The columns of MySQL/MariaDB table `table` (`name` or `schema.name`), `None` when it does not exist.
async fn mysql_columns(conn: &mut mysql_async::Conn, table: &str) -> Result<Option<Vec<String>>> {
    let read = |what: &'static str| {
        move |e: mysql_async::Error| crate::mysql::my_error(Phase::Setup, None, what, e)
    };
    let (schema, name) = crate::mysql::schema_and_name(table);
    let count: Option<u64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?",
            (schema.clone(), name.clone()),
        )
        .await
        .map_err(read("cannot look up the table"))?;
    if count.unwrap_or(0) == 0 {
        return Ok(None);
    }
    let columns = conn
        .exec(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
            (schema, name),
        )
        .await
        .map_err(read("cannot read the table's columns"))?;
    Ok(Some(columns))
}

/// The server's name for messages, whether the table exists, and what evolution would change in it.
async fn postgres(
    client: &tokio_postgres::Client,
    config: &JdbcSinkConfig,
    shape: &TableShape,
) -> Result<(String, bool, Evolved)> {
    let read = |what: &'static str| {
        move |e: tokio_postgres::Error| crate::pg::pg_error(Phase::Setup, None, what, e)
    };
    if config.mode.prepares() {
        let max: String = client
            .query_one("SHOW max_prepared_transactions", &[])
            .await
            .map_err(read("cannot read max_prepared_transactions"))?
            .get(0);
        crate::pg::check_max_prepared_transactions(&max)?;
    }
    let existing = pg_columns(client, &config.table).await?;
    let exists = existing.is_some();
    let mut evolved = Evolved::default();
    if let Some(existing) = existing {
        let changes = match config.evolution.changes_columns() {
            true => crate::pg::column_changes(client, config, shape).await?,
            false => Vec::new(),
        };
        evolved = Evolved::of(Dialect::Postgres, config, shape, &existing, changes);
        crate::pg::table::columns(client, config, &evolved.checked(shape)).await?;
    }
    Ok(("PostgreSQL".to_string(), exists, evolved))
}

/// [`postgres`], for MySQL/MariaDB.
async fn mysql(
    conn: &mut mysql_async::Conn,
    config: &JdbcSinkConfig,
    shape: &TableShape,
) -> Result<(String, bool, Evolved)> {
    let read = |what: &'static str| {
        move |e: mysql_async::Error| crate::mysql::my_error(Phase::Setup, None, what, e)
    };
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(read("cannot read the server version"))?
        .unwrap_or_default();
    if config.mode.prepares() {
        crate::mysql::check_xa_version(&version)?;
        conn.query_drop("XA RECOVER").await.map_err(|e| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "XA RECOVER failed: the xa mode lists prepared transactions with it, which needs the SUPER \
                 privilege (MySQL: XA_RECOVER_ADMIN)",
            )
            .with_source(e)
        })?;
    }
    let existing = mysql_columns(conn, &config.table).await?;
    let exists = existing.is_some();
    let mut evolved = Evolved::default();
    if let Some(existing) = existing {
        let changes = match config.evolution.changes_columns() {
            true => crate::mysql::column_changes(conn, config, shape).await?,
            false => Vec::new(),
        };
        evolved = Evolved::of(Dialect::MySql, config, shape, &existing, changes);
        let key = config.mode.key().unwrap_or_default();
        crate::mysql::table_columns(conn, config, &config.table, &evolved.checked(shape), key)
            .await?;
    }
    Ok((format!("MySQL/MariaDB {version}"), exists, evolved))
}
