//! The writer's MariaDB / MySQL session: multi-row prepared INSERTs inside `XA START` .. `XA PREPARE` (xa mode)
//! or an ordinary transaction with `ON DUPLICATE KEY UPDATE` (upsert mode).

use arrow_array::RecordBatch;
use async_trait::async_trait;

use connector_api::{Error, ErrorKind, Phase, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Value};

use super::target::{COLUMNS_QUERY, ColumnRow, MyColumn};
use super::{check_xa_version, connect, my_error, server_code};
use crate::Xid;
use crate::columns::{Numeric, SqlType, TableShape, quote, quote_table};
use crate::config::{Dialect, JdbcSinkConfig, WriteMode, config_error};
use crate::database::{DedupCleanup, MARKERS_KEPT, MARKERS_TABLE, OWNERS_TABLE, Session};
use crate::error::fenced;
use crate::savepoint;

mod detach;
mod rows;

use self::rows::InsertStatements;

/// Expired dedup ids deleted per checkpoint at most (the rest go at the next cleanup).
const CLEANUP_BATCH: usize = 10_000;
/// See the module docs.
pub(crate) struct MySqlSession {
    opts: Opts,
    config: JdbcSinkConfig,
    shape: TableShape,
    /// The table's column of each batch column.
    targets: Vec<MyColumn>,
    /// Which columns are sent as JSON text (JSON, lists, nested values).
    as_json: Vec<bool>,
    conn: Option<Conn>,
    /// The multi-row INSERTs, by their row count.
    inserts: InsertStatements,
    /// The open transaction: its xid, and whether it is an XA one.
    open: Option<Xid>,
    /// The append mode's dedup table.
    dedup: Option<Dedup>,
    /// The upsert mode's delete by key (tombstones).
    delete: Option<KeyDelete>,
}

/// The upsert mode's delete by key: `DELETE FROM <table> WHERE (k1 = ? AND k2 = ?) OR (..) ..`, up to
/// [`MAX_KEYS_PER_DELETE`] keys per statement.
struct KeyDelete {
    /// `DELETE FROM <table> WHERE `.
    head: String,
    /// `(k1 = ? AND k2 = ?)`: one key.
    condition: String,
    /// The key columns' SQL types, in the mode's order (the order of the decoded keys' columns).
    types: Vec<SqlType>,
    /// The key columns of the table, in the same order.
    targets: Vec<MyColumn>,
}

/// The append mode: which column holds the message id, and the statements on the dedup table.
struct Dedup {
    column: usize,
    /// The dedup table's message id column.
    target: MyColumn,
    /// `INSERT IGNORE INTO <dedup> (message_id) VALUES `; with `RETURNING message_id` it names the ids that were
    /// new (MariaDB 10.5+), once each.
    claim: String,
    /// Selects (without locking) up to `CLEANUP_BATCH` ids older than the retention.
    expired: String,
    /// `DELETE FROM <dedup> WHERE message_id IN `: the expired ids are deleted by key. A range `DELETE` would scan
    /// (and wait to lock) rows other subtasks' open transactions just inserted.
    forget: String,
    create: String,
    schedule: DedupCleanup,
}

/// ` ON DUPLICATE KEY UPDATE ..` of the keyed modes: every column but the key's takes the new row's value.
fn on_duplicate_key(shape: &TableShape, key: &[String]) -> String {
    let d = Dialect::MySql;
    let updates: Vec<String> = shape
        .names
        .iter()
        .filter(|n| !key.contains(n))
        .map(|n| format!("{0} = VALUES({0})", quote(d, n)))
        .collect();
    match updates.is_empty() {
        // Every column is a key (or unchanged): a repeated row changes nothing.
        true => format!(" ON DUPLICATE KEY UPDATE {0} = {0}", quote(d, &key[0])),
        false => format!(" ON DUPLICATE KEY UPDATE {}", updates.join(", ")),
    }
}

/// The error for a statement when the connection was lost (and the transaction with it).
fn no_connection(sink: &connector_api::SinkId, phase: Phase) -> Error {
    Error::new(
        ErrorKind::Retryable,
        phase,
        "the connection to MariaDB was lost",
    )
    .with_sink(sink)
}

/// A new writer connection whose statements wait at most `lock_timeout` (whole seconds, at least 1) for a row
/// lock: the fencing update waiting for the previous checkpoint's commit, a row another writer (or a zombie's
/// prepared transaction) holds. Past it the statement fails retryable and the checkpoint is aborted and replayed.
async fn open(opts: &Opts, config: &JdbcSinkConfig, phase: Phase) -> Result<Conn> {
    let mut conn = connect(opts, phase, "the JDBC sink's connection to MariaDB").await?;
    let seconds = config.lock_timeout.as_secs().max(1);
    // innodb_lock_wait_timeout bounds row locks; lock_wait_timeout bounds metadata locks (an ALTER TABLE waiting
    // for another writer's prepared transaction).
    conn.query_drop(format!(
        "SET SESSION innodb_lock_wait_timeout = {seconds}, lock_wait_timeout = {seconds}"
    ))
    .await
    .map_err(|e| my_error(phase, None, "cannot set the lock wait timeouts", e))?;
    Ok(conn)
}

impl MySqlSession {
    /// Connects, checks the server and the table, creates what `config` asks for.
    pub(crate) async fn connect(opts: Opts, config: JdbcSinkConfig) -> Result<Self> {
        let d = Dialect::MySql;
        let shape = TableShape::of(&config.schema).map_err(|e| e.with_sink(&config.sink))?;
        shape
            .check_create(d)
            .map_err(|e| e.with_sink(&config.sink))?;
        let table = quote_table(d, &config.table);
        let columns = shape.column_list(d);
        let mut dedup_sql = None;
        let mut delete = None;
        let (key, insert_tail) = match &config.mode {
            WriteMode::Xa => (Vec::new(), String::new()),
            WriteMode::Upsert { key } | WriteMode::XaUpsert { key } => {
                if key.is_empty() {
                    return Err(config_error("mode upsert needs at least one key column"));
                }
                for k in key {
                    shape.index(k, "key")?;
                }
                let tail = on_duplicate_key(&shape, key);
                let mut types = Vec::with_capacity(key.len());
                for k in key {
                    types.push(shape.types[shape.index(k, "key")?]);
                }
                let equal: Vec<String> =
                    key.iter().map(|k| format!("{} = ?", quote(d, k))).collect();
                delete = Some(KeyDelete {
                    head: format!("DELETE FROM {table} WHERE "),
                    condition: format!("({})", equal.join(" AND ")),
                    types,
                    targets: Vec::new(),
                });
                (key.clone(), tail)
            }
            WriteMode::Append { dedup } => {
                let column = shape.index(&dedup.message_id, "message_id")?;
                let seen = quote_table(d, &dedup.table_for(&config.table));
                dedup_sql = Some(Dedup {
                    column,
                    target: MyColumn::from((
                        "message_id".to_string(),
                        String::new(),
                        String::new(),
                        None,
                        None,
                        None,
                        None,
                        None,
                    )),
                    claim: format!("INSERT IGNORE INTO {seen} (message_id) VALUES "),
                    expired: format!(
                        "SELECT message_id FROM {seen} WHERE seen_at < NOW(6) - INTERVAL {} SECOND LIMIT {CLEANUP_BATCH}",
                        dedup.retention.as_secs()
                    ),
                    forget: format!("DELETE FROM {seen} WHERE message_id IN "),
                    create: format!(
                        "CREATE TABLE IF NOT EXISTS {seen} (message_id {} PRIMARY KEY, \
                         seen_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB",
                        shape.types[column].ddl(d, true, None)
                    ),
                    schedule: DedupCleanup::default(),
                });
                (Vec::new(), String::new())
            }
        };
        let mut conn = open(&opts, &config, Phase::Setup).await?;
        let fail = |what: &'static str| move |e| my_error(Phase::Setup, None, what, e);
        if config.mode.prepares() {
            let version: String = conn
                .query_first("SELECT VERSION()")
                .await
                .map_err(fail("cannot read the server version"))?
                .unwrap_or_default();
            check_xa_version(&version)?;
            conn.query_drop("XA RECOVER").await.map_err(|e| {
                let err = my_error(Phase::Setup, None, "XA RECOVER failed", e);
                Error::new(
                    ErrorKind::Config,
                    Phase::Setup,
                    format!(
                        "{err}; the xa mode lists prepared transactions with XA RECOVER, which needs the SUPER \
                         (MariaDB) or XA_RECOVER_ADMIN (MySQL 8) privilege: GRANT it to the sink's user"
                    ),
                )
            })?;
        }
        let mut ddl = vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {OWNERS_TABLE} (sink VARCHAR(255) NOT NULL, subtask INT NOT NULL, \
                 epoch BIGINT NOT NULL, checkpoint BIGINT NULL, PRIMARY KEY (sink, subtask)) ENGINE=InnoDB"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {MARKERS_TABLE} (sink VARCHAR(255) NOT NULL, subtask INT NOT NULL, \
                 checkpoint BIGINT NOT NULL, committed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
                 PRIMARY KEY (sink, subtask, checkpoint)) ENGINE=InnoDB"
            ),
        ];
        if let Some(dedup) = &dedup_sql {
            ddl.push(dedup.create.clone());
        }
        if config.create_table {
            ddl.push(format!(
                "{} ENGINE=InnoDB",
                shape.create_table(d, &config.table, &key)
            ));
        }
        for statement in ddl {
            conn.query_drop(statement)
                .await
                .map_err(fail("cannot create Ratchet's tables"))?;
        }
        if config.evolution.adds_columns() {
            add_missing_columns(&mut conn, &config, &shape).await?;
        }
        if config.evolution.changes_columns() {
            change_columns(&mut conn, &config, &shape).await?;
        }
        conn.query_drop(format!("SELECT {columns} FROM {table} LIMIT 0"))
            .await
            .map_err(|e| {
                let hint = match server_code(&e) {
                    Some(1146) => {
                        " (create it, or set create_table = true to create it from the batches' schema)"
                    }
                    Some(1054) => " (every column of the batches must exist in the table, with the same name)",
                    _ => "",
                };
                my_error(
                    Phase::Setup,
                    None,
                    &format!("the table {} does not fit the batches{hint}", config.table),
                    e,
                )
                .with_sink(&config.sink)
                .with_kind(ErrorKind::Config)
            })?;
        let targets = table_columns(&mut conn, &config, &config.table, &shape, &key).await?;
        if let Some(delete) = &mut delete {
            delete.targets = key
                .iter()
                .filter_map(|k| shape.names.iter().position(|n| n == k))
                .map(|i| targets[i].clone())
                .collect();
        }
        if let (Some(dedup), WriteMode::Append { dedup: settings }) = (&mut dedup_sql, &config.mode)
        {
            dedup.target = dedup_column(
                &mut conn,
                &config,
                &settings.table_for(&config.table),
                shape.types[dedup.column],
            )
            .await?;
        }
        let as_json = shape
            .types
            .iter()
            .map(|t| t.is_json() || *t == SqlType::List)
            .collect();
        let inserts = InsertStatements::new(
            format!("INSERT INTO {table} ({columns}) VALUES "),
            insert_tail,
            shape.names.len(),
        );
        Ok(Self {
            opts,
            inserts,
            shape,
            targets,
            as_json,
            config,
            conn: Some(conn),
            open: None,
            dedup: dedup_sql,
            delete,
        })
    }

    fn error(&self, phase: Phase, xid: Option<&Xid>, what: &str, e: mysql_async::Error) -> Error {
        my_error(phase, xid, what, e).with_sink(&self.config.sink)
    }

    fn conn(&mut self, phase: Phase) -> Result<&mut Conn> {
        let sink = &self.config.sink;
        self.conn.as_mut().ok_or_else(|| no_connection(sink, phase))
    }

    /// Opens the write savepoint in the transaction `xid`: what follows until [`Self::close_savepoint`] is
    /// refused whole (the transaction goes on without it, so the driver can dead-letter it) or applied whole,
    /// across its statements, never half.
    async fn open_savepoint(&mut self, xid: Option<&Xid>) -> Result<()> {
        self.run(
            Phase::Write,
            xid,
            "SAVEPOINT failed",
            savepoint::OPEN.into(),
        )
        .await
    }

    /// Closes the write savepoint after `outcome`: released when it succeeded, rolled back to when it was refused
    /// ([`BadRecord`](ErrorKind::BadRecord), returned); any other error is returned as it is (the connection and
    /// its transaction are lost anyway).
    async fn close_savepoint(&mut self, xid: Option<&Xid>, outcome: Result<()>) -> Result<()> {
        let Some((statement, what)) = savepoint::closing(&outcome) else {
            return outcome;
        };
        self.run(Phase::Write, xid, what, statement.into()).await?;
        outcome
    }

    /// Runs `statement` on the session; a connection-level failure drops the connection (and with it the open
    /// transaction, which the server rolls back), so the next `begin` reconnects.
    async fn run(
        &mut self,
        phase: Phase,
        xid: Option<&Xid>,
        what: &str,
        statement: String,
    ) -> Result<()> {
        let result = self.conn(phase)?.query_drop(statement).await;
        result.map_err(|e| self.lost_on(phase, xid, what, e))
    }

    fn lost_on(
        &mut self,
        phase: Phase,
        xid: Option<&Xid>,
        what: &str,
        e: mysql_async::Error,
    ) -> Error {
        if matches!(e, mysql_async::Error::Io(_) | mysql_async::Error::Driver(_)) {
            self.conn = None;
            self.open = None;
        }
        self.error(phase, xid, what, e)
    }

    /// Updates the owner row where the epoch is still `epoch`; fenced (and rolled back) when it is not.
    async fn fence(&mut self, xid: &Xid, epoch: u64) -> Result<()> {
        let conn = self.conn(Phase::PreCommit)?;
        let result = conn
            .exec_drop(
                format!("UPDATE {OWNERS_TABLE} SET checkpoint = ? WHERE sink = ? AND subtask = ? AND epoch = ?"),
                (xid.checkpoint.0, xid.scope.as_str(), xid.subtask.0, epoch),
            )
            .await;
        let matched = conn.affected_rows();
        result
            .map_err(|e| self.lost_on(Phase::PreCommit, Some(xid), "the owner check failed", e))?;
        if matched == 0 {
            self.rollback().await?;
            return Err(fenced(xid, epoch));
        }
        Ok(())
    }
}

#[async_trait]
impl Session for MySqlSession {
    async fn begin(&mut self, xid: &Xid) -> Result<()> {
        if self.conn.is_none() {
            self.conn = Some(open(&self.opts, &self.config, Phase::Begin).await?);
        }
        let statement = match self.config.mode.prepares() {
            true => format!("XA START '{}'", xid.mysql_gtrid()),
            false => "START TRANSACTION".to_string(),
        };
        self.run(
            Phase::Begin,
            Some(xid),
            "cannot open the transaction",
            statement,
        )
        .await?;
        self.open = Some(xid.clone());
        Ok(())
    }

    async fn write(&mut self, batch: &RecordBatch, unchanged: &[String]) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }

        let xid = self.open.clone();
        self.open_savepoint(xid.as_ref()).await?;
        let written = match unchanged.is_empty() {
            true => self.insert(batch).await,
            false => self.update_keeping(batch, unchanged).await,
        };
        self.close_savepoint(xid.as_ref(), written).await
    }

    async fn delete(&mut self, keys: &[RecordBatch]) -> Result<()> {
        if keys.iter().all(|k| k.num_rows() == 0) {
            return Ok(());
        }
        if self.conn.is_none() {
            return Err(no_connection(&self.config.sink, Phase::Write));
        }
        let Some(xid) = self.open.clone() else {
            return Err(Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "tombstones written outside a transaction (before begin)",
            )
            .with_sink(&self.config.sink));
        };
        // Behind a savepoint like a batch: the deletes of one call are refused whole, across their statements.
        self.open_savepoint(Some(&xid)).await?;
        let deleted = self.delete_keys(keys).await;
        self.close_savepoint(Some(&xid), deleted).await
    }

    async fn delete_all(&mut self) -> Result<()> {
        let Some(xid) = self.open.clone() else {
            return Err(Error::bug(
                Phase::Write,
                "a truncate applied outside a transaction (before begin)",
            )
            .with_sink(&self.config.sink));
        };
        let what = format!(
            "the table {} refused to delete every row (a truncate)",
            self.config.table
        );
        let statement = format!(
            "DELETE FROM {}",
            quote_table(Dialect::MySql, &self.config.table)
        );
        self.open_savepoint(Some(&xid)).await?;
        let deleted = self.run(Phase::Write, Some(&xid), &what, statement).await;
        self.close_savepoint(Some(&xid), deleted).await
    }

    async fn prepare(&mut self, xid: &Xid, epoch: u64) -> Result<()> {
        self.fence(xid, epoch).await?;
        let conn = self.conn(Phase::PreCommit)?;
        let marker = conn
            .exec_drop(
                format!("INSERT INTO {MARKERS_TABLE} (sink, subtask, checkpoint) VALUES (?, ?, ?)"),
                (xid.scope.as_str(), xid.subtask.0, xid.checkpoint.0),
            )
            .await;
        marker.map_err(|e| {
            self.lost_on(
                Phase::PreCommit,
                Some(xid),
                "cannot write the commit marker",
                e,
            )
        })?;
        if xid.checkpoint.0.is_multiple_of(100) && xid.checkpoint.0 > MARKERS_KEPT {
            let prune = self
                .conn(Phase::PreCommit)?
                .exec_drop(
                    format!("DELETE FROM {MARKERS_TABLE} WHERE sink = ? AND subtask = ? AND checkpoint < ?"),
                    (xid.scope.as_str(), xid.subtask.0, xid.checkpoint.0 - MARKERS_KEPT),
                )
                .await;
            prune.map_err(|e| {
                self.lost_on(Phase::PreCommit, Some(xid), "cannot prune old markers", e)
            })?;
        }
        self.run(
            Phase::PreCommit,
            Some(xid),
            "XA END failed",
            format!("XA END '{}'", xid.mysql_gtrid()),
        )
        .await?;
        self.run(
            Phase::PreCommit,
            Some(xid),
            "XA PREPARE failed",
            format!("XA PREPARE '{}'", xid.mysql_gtrid()),
        )
        .await?;
        self.open = None;
        self.detach(xid).await;
        Ok(())
    }

    async fn apply(&mut self, xid: &Xid, epoch: u64) -> Result<()> {
        if let Some(dedup) = &self.dedup
            && dedup.schedule.due()
        {
            let (expired, forget) = (dedup.expired.clone(), dedup.forget.clone());
            let conn = self.conn(Phase::PreCommit)?;
            let cleaned: std::result::Result<usize, mysql_async::Error> = async {
                let ids: Vec<Value> = conn.exec_map(expired, (), |(id,): (Value,)| id).await?;
                let count = ids.len();
                if count > 0 {
                    let list = vec!["?"; count].join(", ");
                    conn.exec_drop(format!("{forget}({list})"), ids).await?;
                }
                Ok(count)
            }
            .await;
            let count = cleaned.map_err(|e| {
                self.lost_on(Phase::PreCommit, Some(xid), "dedup table cleanup failed", e)
            })?;
            // A full batch means more expired ids wait: clean again at the next checkpoint.
            if let Some(dedup) = &mut self.dedup
                && count < CLEANUP_BATCH
            {
                dedup.schedule.done();
            }
        }
        self.fence(xid, epoch).await?;
        self.open = None;
        // A lost reply leaves the outcome unknown; the replay re-applies the rows with the same effect.
        self.run(
            Phase::PreCommit,
            Some(xid),
            "COMMIT failed",
            "COMMIT".to_string(),
        )
        .await
    }

    async fn rollback(&mut self) -> Result<()> {
        let Some(xid) = self.open.take() else {
            return Ok(());
        };
        if self.conn.is_none() {
            return Ok(());
        }
        if !self.config.mode.prepares() {
            return self
                .run(
                    Phase::Abort,
                    Some(&xid),
                    "ROLLBACK failed",
                    "ROLLBACK".to_string(),
                )
                .await;
        }
        // XA END fails when the transaction already ended (XA END ran, then PREPARE failed): roll back anyway.
        let _ended = self
            .conn(Phase::Abort)?
            .query_drop(format!("XA END '{}'", xid.mysql_gtrid()))
            .await;
        match self
            .conn(Phase::Abort)?
            .query_drop(format!("XA ROLLBACK '{}'", xid.mysql_gtrid()))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if server_code(&e) == Some(super::ER_XAER_NOTA) => Ok(()),
            Err(e) => Err(self.lost_on(Phase::Abort, Some(&xid), "XA ROLLBACK failed", e)),
        }
    }
}

/// `evolution = "add-columns"`: adds the batches' columns the table lacks (nothing when it has them all). A table
/// that does not exist is left to the fit check to report.
async fn add_missing_columns(
    conn: &mut Conn,
    config: &JdbcSinkConfig,
    shape: &TableShape,
) -> Result<()> {
    let d = Dialect::MySql;
    let Ok(result) = conn
        .query_iter(format!(
            "SELECT * FROM {} LIMIT 0",
            quote_table(d, &config.table)
        ))
        .await
    else {
        return Ok(());
    };
    let existing: Vec<String> = result
        .columns_ref()
        .iter()
        .map(|c| c.name_str().into_owned())
        .collect();
    result
        .drop_result()
        .await
        .map_err(|e| my_error(Phase::Setup, None, "cannot read the table's columns", e))?;
    for alter in shape.add_missing(d, &config.table, &existing) {
        tracing::info!(sink = %config.sink, table = %config.table, statement = %alter, "adding a column");
        conn.query_drop(&alter).await.map_err(|e| {
            my_error(
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

/// What `MODIFY COLUMN` must restate of a column to leave it as it is (MariaDB replaces the whole definition).
const RESTATED_QUERY: &str = "SELECT COLUMN_NAME, LOWER(DATA_TYPE), COLUMN_TYPE, NUMERIC_PRECISION, \
     NUMERIC_SCALE, IS_NULLABLE, COLUMN_DEFAULT, COLUMN_COMMENT, EXTRA, CHARACTER_SET_NAME, COLLATION_NAME, \
     COLUMN_KEY FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?";

/// A row of [`RESTATED_QUERY`].
type RestatedRow = (
    String,
    String,
    String,
    Option<u64>,
    Option<u64>,
    String,
    Option<String>,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
);

/// A MariaDB column type (`DATA_TYPE`, `COLUMN_TYPE`, precision, scale) as far as widening it goes: signed integers,
/// FLOAT and DOUBLE, DECIMAL.
fn numeric_of(
    data_type: &str,
    column_type: &str,
    precision: Option<u64>,
    scale: Option<u64>,
) -> Option<Numeric> {
    if column_type.contains("unsigned") {
        return None;
    }
    Some(match data_type {
        "tinyint" => Numeric::Integer(1),
        "smallint" => Numeric::Integer(2),
        "mediumint" => Numeric::Integer(3),
        "int" => Numeric::Integer(4),
        "bigint" => Numeric::Integer(8),
        "float" => Numeric::Float(4),
        "double" => Numeric::Float(8),
        "decimal" => Numeric::Decimal(precision?, scale?),
        _ => return None,
    })
}

/// `evolution = "evolve"`: widens the table's numeric columns whose batches' type is wider ([`Numeric`]) and makes
/// nullable the columns whose batches take nulls (not the key's or the primary key's, and not for a change
/// stream's rows, which are all nullable), in one `ALTER TABLE .. MODIFY COLUMN ..` that
/// restates each changed column's character set, collation, default and comment (nothing when the table fits). A
/// table that does not exist is left to the fit check to report.
///
/// # Errors
/// As [`column_changes`]; retryable when the statement fails (a lock held past `lock_wait_timeout`).
async fn change_columns(
    conn: &mut Conn,
    config: &JdbcSinkConfig,
    shape: &TableShape,
) -> Result<()> {
    let changes = column_changes(conn, config, shape).await?;
    if changes.is_empty() {
        return Ok(());
    }
    let clauses: Vec<&str> = changes.iter().map(|(_, clause)| clause.as_str()).collect();
    let alter = format!(
        "ALTER TABLE {} {}",
        quote_table(Dialect::MySql, &config.table),
        clauses.join(", ")
    );
    tracing::info!(sink = %config.sink, table = %config.table, statement = %alter, "widening columns");
    conn.query_drop(&alter).await.map_err(|e| {
        my_error(
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

/// What `evolution = "evolve"` changes in the table for `shape` (read only): each changed column's name and
/// `MODIFY COLUMN` clause (see [`change_columns`]). Nothing when the table does not exist.
///
/// # Errors
/// [`Config`](ErrorKind::Config) naming a column that must change but has `EXTRA` attributes (auto-increment,
/// generated, `ON UPDATE`) MODIFY would have to restate: the message gives the statement to run by hand.
pub(crate) async fn column_changes(
    conn: &mut Conn,
    config: &JdbcSinkConfig,
    shape: &TableShape,
) -> Result<Vec<(String, String)>> {
    let d = Dialect::MySql;
    let (schema, name) = schema_and_name(&config.table);
    let rows: Vec<RestatedRow> = conn
        .exec(RESTATED_QUERY, (schema, name))
        .await
        .map_err(|e| {
            my_error(
                Phase::Setup,
                None,
                "cannot read the table's column types",
                e,
            )
        })?;
    // MariaDB gives a column's default as an SQL expression (`'abc'`, `NULL`), MySQL as the bare literal (`abc`,
    // no row for none): restated as MySQL's string literal there.
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(|e| my_error(Phase::Setup, None, "cannot read the server version", e))?
        .unwrap_or_default();
    let mariadb = version.contains("MariaDB");
    let key = config.mode.key().unwrap_or_default();
    let relaxes = !crate::columns::is_change_stream(&config.schema);
    let mut changes = Vec::new();
    for (i, name) in shape.names.iter().enumerate() {
        let Some(row) = rows.iter().find(|r| r.0.eq_ignore_ascii_case(name)) else {
            continue;
        };
        let (
            _,
            data_type,
            column_type,
            precision,
            scale,
            nullable,
            default,
            comment,
            extra,
            charset,
            collation,
            column_key,
        ) = row;
        let widened = match (
            numeric_of(data_type, column_type, *precision, *scale),
            Numeric::of(shape.types[i]),
        ) {
            (Some(now), Some(wanted)) if now.widens_to(wanted) => {
                Some(shape.types[i].ddl(d, false, None))
            }
            _ => None,
        };
        let relaxed = relaxes
            && nullable == "NO"
            && shape.fields[i].is_nullable()
            && column_key != "PRI"
            && !key.contains(name);
        if widened.is_none() && !relaxed {
            continue;
        }
        let ty = widened.unwrap_or_else(|| column_type.clone());
        let mut clause = format!("MODIFY COLUMN {} {ty}", quote(d, name));
        if let (Some(charset), Some(collation)) = (charset, collation) {
            clause.push_str(&format!(" CHARACTER SET {charset} COLLATE {collation}"));
        }
        clause.push_str(if nullable == "YES" || relaxed {
            " NULL"
        } else {
            " NOT NULL"
        });
        match default.as_deref() {
            Some("NULL") if mariadb => {}
            Some(default) if mariadb => clause.push_str(&format!(" DEFAULT {default}")),
            Some(default) => clause.push_str(&format!(" DEFAULT {}", string_literal(default))),
            None => {}
        }
        if !comment.is_empty() {
            clause.push_str(&format!(" COMMENT {}", string_literal(comment)));
        }
        if !extra.is_empty() {
            return Err(config_error(format!(
                "column {name:?} of table {} must change for the batches' schema, but it is {extra}, which MariaDB \
                 would have to restate: run `ALTER TABLE {} {clause} {extra}` yourself, or set evolution = \
                 \"add-columns\"",
                config.table,
                quote_table(d, &config.table)
            ))
            .with_sink(&config.sink));
        }
        changes.push((name.clone(), clause));
    }
    Ok(changes)
}

/// A table name's schema (`None`: the connection's database) and name, as `information_schema` queries take them.
pub(crate) fn schema_and_name(table: &str) -> (Option<String>, String) {
    match table.split_once('.') {
        Some((schema, name)) => (Some(schema.to_string()), name.to_string()),
        None => (None, table.to_string()),
    }
}

/// `text` as a MariaDB/MySQL string literal.
fn string_literal(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// The table's column of each batch column (`information_schema`), each checked against the type contract
/// ([`MyColumn::check`]) and, for the `key` columns, compared byte for byte ([`MyColumn::check_key`]).
///
/// # Errors
/// [`Config`](ErrorKind::Config) naming every column that does not fit.
pub(crate) async fn table_columns(
    conn: &mut Conn,
    config: &JdbcSinkConfig,
    table: &str,
    shape: &TableShape,
    key: &[String],
) -> Result<Vec<MyColumn>> {
    let found = described_columns(conn, table).await?;
    let mut targets = Vec::with_capacity(shape.names.len());
    let mut refusals = Vec::new();
    for (i, name) in shape.names.iter().enumerate() {
        let Some(column) = found.iter().find(|c| c.name.eq_ignore_ascii_case(name)) else {
            return Err(config_error(format!(
                "the table {table} has no column {name:?} (every column of the batches must exist in the table, \
                 with the same name)"
            ))
            .with_sink(&config.sink));
        };
        let checked = column
            .check(shape.types[i], &shape.fields[i])
            .and_then(|()| match key.contains(name) {
                true => column.check_key(),
                false => Ok(()),
            });
        if let Err(refusal) = checked {
            refusals.push(refusal.under(name));
        }
        targets.push(column.clone());
    }
    if !refusals.is_empty() {
        return Err(config_error(connector_api::types::refusals_message(
            &format!("MariaDB table {table}"),
            &refusals,
        ))
        .with_sink(&config.sink));
    }
    Ok(targets)
}

/// The columns of `table` as `information_schema` describes them.
async fn described_columns(conn: &mut Conn, table: &str) -> Result<Vec<MyColumn>> {
    let (schema, name) = schema_and_name(table);
    let rows: Vec<ColumnRow> = conn
        .exec(COLUMNS_QUERY, (schema, name))
        .await
        .map_err(|e| {
            my_error(
                Phase::Setup,
                None,
                "cannot read the table's column types",
                e,
            )
        })?;
    Ok(rows.into_iter().map(MyColumn::from).collect())
}

/// The dedup table's message id column, made to compare ids byte for byte first if it does not (a dedup table
/// created before Ratchet made its keys binary-collated merged ids that differ in case, accents or trailing
/// spaces): it is Ratchet's own table, so it is altered rather than refused.
async fn dedup_column(
    conn: &mut Conn,
    config: &JdbcSinkConfig,
    table: &str,
    sql: SqlType,
) -> Result<MyColumn> {
    let find = |columns: Vec<MyColumn>| {
        columns
            .into_iter()
            .find(|c| c.name.eq_ignore_ascii_case("message_id"))
            .ok_or_else(|| {
                config_error(format!("the dedup table {table} has no column message_id"))
            })
    };
    let column = find(described_columns(conn, table).await?)?;
    if column.check_key().is_ok() {
        return Ok(column);
    }
    let alter = format!(
        "ALTER TABLE {} MODIFY message_id {} NOT NULL",
        quote_table(Dialect::MySql, table),
        sql.ddl(Dialect::MySql, true, None)
    );
    tracing::warn!(sink = %config.sink, table, statement = %alter,
        "the dedup table's message ids compared case- or space-insensitively: making them compare byte for byte");
    conn.query_drop(&alter).await.map_err(|e| {
        my_error(
            Phase::Setup,
            None,
            &format!("cannot make the dedup table {table} compare ids exactly"),
            e,
        )
        .with_sink(&config.sink)
    })?;
    find(described_columns(conn, table).await?)
}
