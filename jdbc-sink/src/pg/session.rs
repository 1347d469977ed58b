//! The writer's PostgreSQL session: binary COPY into the table (xa mode) or into a staging table merged with one
//! `INSERT .. SELECT` per flush (upsert and append modes).

use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::postgres::PgConnectOptions;
use connector_api::{Error, ErrorKind, Phase, Result};
use futures_util::pin_mut;
use tokio_postgres::Client;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::cell::{PgCell, accepts};
use super::{pg_error, prepare_database};
use crate::Xid;
use crate::columns::{Cell, Columns, TableShape, quote, quote_table};
use crate::config::{Dialect, JdbcSinkConfig, WriteMode, config_error};
use crate::database::{MARKERS_KEPT, MARKERS_TABLE, OWNERS_TABLE, Session};
use crate::sink::{dedup_table, fenced};

/// The per-session staging table of the upsert and append modes (emptied at every commit).
const STAGE: &str = "ratchet_stage";
/// Staged rows beyond which a write merges them into the table before staging more.
const MERGE_EVERY_ROWS: u64 = 500_000;
/// How often expired ids are deleted from the dedup table, at most.
const DEDUP_CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// The SQL a session runs, built once from the config.
struct Statements {
    /// `COPY .. FROM STDIN (FORMAT binary)` into the table (xa) or the staging table.
    copy: String,
    /// The upsert or dedup-append `INSERT .. SELECT` from the staging table (not in xa mode).
    merge: Option<String>,
    /// The upsert as `MERGE` (PostgreSQL 15+): no speculative insertion, ~40% faster for new keys; it fails
    /// (unique violation) where a concurrent writer inserted one of the keys first, and then `merge` runs.
    fast_merge: Option<String>,
    /// Deletes expired dedup ids (`$1`: retention in seconds), append mode only.
    dedup_cleanup: Option<String>,
    /// Sets up the staging table in a new session.
    stage: Option<String>,
    /// `SELECT <columns> FROM <table>`, for the column types.
    probe: String,
}

impl Statements {
    fn new(config: &JdbcSinkConfig, shape: &TableShape) -> Result<Self> {
        let d = Dialect::Postgres;
        let table = quote_table(d, &config.table);
        let columns = shape.column_list(d);
        let probe = format!("SELECT {columns} FROM {table} LIMIT 0");
        // work_mem: the merge sorts a flush (up to MERGE_EVERY_ROWS rows) by key; in memory rather than on disk.
        let stage = format!(
            "CREATE TEMP TABLE {STAGE} ON COMMIT DELETE ROWS AS {probe};
             ALTER TABLE {STAGE} ADD COLUMN ratchet_seq bigint;
             SET work_mem = '64MB'"
        );
        let copy_into =
            |target: &str| format!("COPY {target} ({columns}) FROM STDIN (FORMAT binary)");
        // Staged rows carry their order (the later row of a key wins), numbered by the session.
        let copy_stage =
            format!("COPY {STAGE} ({columns}, ratchet_seq) FROM STDIN (FORMAT binary)");
        let prefixed = |prefix: &str| {
            shape
                .names
                .iter()
                .map(|n| format!("{prefix}.{}", quote(d, n)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        Ok(match &config.mode {
            WriteMode::Xa => Self {
                copy: copy_into(&table),
                merge: None,
                fast_merge: None,
                dedup_cleanup: None,
                stage: None,
                probe,
            },
            WriteMode::Upsert { key } => {
                for k in key {
                    shape.index(k, "key")?;
                }
                if key.is_empty() {
                    return Err(config_error("mode upsert needs at least one key column"));
                }
                let keys = key
                    .iter()
                    .map(|k| quote(d, k))
                    .collect::<Vec<_>>()
                    .join(", ");
                let updates: Vec<String> = shape
                    .names
                    .iter()
                    .filter(|n| !key.contains(n))
                    .map(|n| format!("{0} = EXCLUDED.{0}", quote(d, n)))
                    .collect();
                let action = if updates.is_empty() {
                    "DO NOTHING".to_string()
                } else {
                    format!("DO UPDATE SET {}", updates.join(", "))
                };
                let latest = format!(
                    "SELECT DISTINCT ON ({keys}) {columns} FROM {STAGE} ORDER BY {keys}, ratchet_seq DESC"
                );
                let on: Vec<String> = key
                    .iter()
                    .map(|k| format!("t.{0} = s.{0}", quote(d, k)))
                    .collect();
                let matched: Vec<String> = shape
                    .names
                    .iter()
                    .filter(|n| !key.contains(n))
                    .map(|n| format!("{0} = s.{0}", quote(d, n)))
                    .collect();
                let when_matched = if matched.is_empty() {
                    "DO NOTHING".to_string()
                } else {
                    format!("UPDATE SET {}", matched.join(", "))
                };
                Self {
                    copy: copy_stage,
                    merge: Some(format!(
                        "INSERT INTO {table} ({columns}) {latest} ON CONFLICT ({keys}) {action}"
                    )),
                    fast_merge: Some(format!(
                        "MERGE INTO {table} t USING ({latest}) s ON {} WHEN MATCHED THEN {when_matched} \
                         WHEN NOT MATCHED THEN INSERT ({columns}) VALUES ({})",
                        on.join(" AND "),
                        prefixed("s")
                    )),
                    dedup_cleanup: None,
                    stage: Some(stage),
                    probe,
                }
            }
            WriteMode::Append { dedup } => {
                shape.index(&dedup.message_id, "message_id")?;
                let id = quote(d, &dedup.message_id);
                let seen = quote_table(d, &dedup_table(config, dedup));
                Self {
                    copy: copy_stage,
                    fast_merge: None,
                    merge: Some(format!(
                        "WITH fresh AS (INSERT INTO {seen} (message_id) SELECT DISTINCT {id} FROM {STAGE} \
                         ON CONFLICT DO NOTHING RETURNING message_id) \
                         INSERT INTO {table} ({columns}) SELECT DISTINCT ON (s.{id}) {} FROM {STAGE} s \
                         JOIN fresh f ON f.message_id = s.{id} ORDER BY s.{id}, s.ratchet_seq",
                        prefixed("s")
                    )),
                    dedup_cleanup: Some(format!(
                        "DELETE FROM {seen} WHERE seen_at < now() - make_interval(secs => $1)"
                    )),
                    stage: Some(stage),
                    probe,
                }
            }
        })
    }
}

/// The writer's connection; see the module docs.
pub(crate) struct PgSession {
    options: PgConnectOptions,
    config: JdbcSinkConfig,
    shape: TableShape,
    sql: Statements,
    client: Option<Client>,
    /// The table's column types, in the batch schema's order.
    types: Vec<Type>,
    /// The open transaction's id.
    open: Option<Xid>,
    /// Rows in the staging table not merged yet.
    staged: u64,
    /// The order number of the next staged row.
    next_seq: i64,
    /// Whether the server has `MERGE` (PostgreSQL 15+).
    has_merge: bool,
    last_dedup_cleanup: Option<Instant>,
}

impl PgSession {
    /// Connects, checks the server and the table, creates what `config` asks for.
    pub(crate) async fn connect(options: PgConnectOptions, config: JdbcSinkConfig) -> Result<Self> {
        let shape = TableShape::of(&config.schema)?;
        let sql = Statements::new(&config, &shape)?;
        let mut session = Self {
            options,
            config,
            shape,
            sql,
            client: None,
            types: Vec::new(),
            open: None,
            staged: 0,
            next_seq: 0,
            has_merge: false,
            last_dedup_cleanup: None,
        };
        let client = session.connect_only(Phase::Setup).await?;
        prepare_database(&client, &session.config).await?;
        session.types = session.table_types(&client).await?;
        let version: i32 = client
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .map_err(|e| session.error(Phase::Setup, None, "cannot read the server version", e))?
            .get(0);
        session.has_merge = version >= 150_000;
        session.create_stage(&client, Phase::Setup).await?;
        session.client = Some(client);
        Ok(session)
    }

    /// A new connection whose statements wait at most `lock_timeout` for a lock: the fencing update waiting for
    /// the previous checkpoint's commit, a row another writer (or a zombie's prepared transaction) holds. Past
    /// it the statement fails retryable and the checkpoint is aborted and replayed, rather than hang.
    async fn connect_only(&self, phase: Phase) -> Result<Client> {
        let client = self
            .options
            .connect(phase, "the JDBC sink's connection to PostgreSQL")
            .await
            .map_err(|e| e.with_sink(&self.config.sink))?;
        client
            .batch_execute(&format!(
                "SET lock_timeout = {}",
                self.config.lock_timeout.as_millis().max(1)
            ))
            .await
            .map_err(|e| self.error(phase, None, "cannot set lock_timeout", e))?;
        Ok(client)
    }

    /// Creates the session's staging table (upsert and append modes).
    async fn create_stage(&self, client: &Client, phase: Phase) -> Result<()> {
        if let Some(stage) = &self.sql.stage {
            client
                .batch_execute(stage)
                .await
                .map_err(|e| self.error(phase, None, "cannot create the staging table", e))?;
        }
        Ok(())
    }

    /// A new connection with its staging table.
    async fn open_connection(&self, phase: Phase) -> Result<Client> {
        let client = self.connect_only(phase).await?;
        self.create_stage(&client, phase).await?;
        Ok(client)
    }

    /// The table's types for the batch columns, checked against the Arrow types.
    async fn table_types(&self, client: &Client) -> Result<Vec<Type>> {
        let statement = client.prepare(&self.sql.probe).await.map_err(|e| {
            let hint = match e.code() {
                Some(c) if *c == SqlState::UNDEFINED_TABLE => {
                    " (create it, or set create_table = true to create it from the batches' schema)"
                }
                Some(c) if *c == SqlState::UNDEFINED_COLUMN => {
                    " (every column of the batches must exist in the table, with the same name)"
                }
                _ => "",
            };
            let what = format!(
                "the table {} does not fit the batches{hint}",
                self.config.table
            );
            let err = pg_error(Phase::Setup, None, &what, e).with_sink(&self.config.sink);
            Error::new(ErrorKind::Config, Phase::Setup, err.to_string())
                .with_sink(&self.config.sink)
        })?;
        let mut types = Vec::new();
        for (i, column) in statement.columns().iter().enumerate() {
            let sql = self.shape.types[i];
            if !accepts(sql, column.type_()) {
                return Err(config_error(format!(
                    "column {:?} of table {} has type {}, which cannot hold the batches' {} values; \
                     see the type table in the jdbc-sink docs",
                    self.shape.names[i],
                    self.config.table,
                    column.type_(),
                    self.config.schema.field(i).data_type()
                ))
                .with_sink(&self.config.sink));
            }
            types.push(column.type_().clone());
        }
        Ok(types)
    }

    fn error(
        &self,
        phase: Phase,
        xid: Option<&Xid>,
        what: &str,
        e: tokio_postgres::Error,
    ) -> Error {
        pg_error(phase, xid, what, e).with_sink(&self.config.sink)
    }

    fn client(&self, phase: Phase) -> Result<&Client> {
        self.client.as_ref().ok_or_else(|| {
            Error::new(
                ErrorKind::Retryable,
                phase,
                "the connection to PostgreSQL was lost",
            )
            .with_sink(&self.config.sink)
        })
    }

    /// Binary COPY of `batch` (into the staging table with each row's order number); a refused row is named by
    /// its line, mapped back to the batch row's first column.
    async fn copy(&mut self, batch: &RecordBatch) -> Result<()> {
        let staging = self.sql.merge.is_some();
        let mut types = self.types.clone();
        if staging {
            types.push(Type::INT8);
        }
        let first_seq = self.next_seq;
        let client = self.client(Phase::Write)?;
        let sink = client
            .copy_in(&self.sql.copy)
            .await
            .map_err(|e| self.error(Phase::Write, None, "COPY failed to start", e))?;
        let writer = BinaryCopyInWriter::new(sink, &types);
        pin_mut!(writer);
        let columns = Columns::new(batch, &self.shape.types);
        let mut cells = Vec::with_capacity(types.len());
        for row in 0..batch.num_rows() {
            cells.extend((0..columns.len()).map(|c| PgCell(columns.cell(c, row))));
            if staging {
                cells.push(PgCell(Cell::Int64(first_seq + row as i64)));
            }
            if let Err(e) = writer.as_mut().write_raw(cells.drain(..)).await {
                return Err(self.row_error(&columns, row, e));
            }
        }
        writer.as_mut().finish().await.map_err(|e| {
            let row = e
                .as_db_error()
                .and_then(|db| db.where_())
                .and_then(copy_line)
                .map(|line| line.saturating_sub(1));
            match row {
                Some(row) if row < batch.num_rows() => self.row_error(&columns, row, e),
                _ => self.error(Phase::Write, None, "COPY failed", e),
            }
        })?;
        self.next_seq += batch.num_rows() as i64;
        Ok(())
    }

    fn row_error(&self, columns: &Columns<'_>, row: usize, e: tokio_postgres::Error) -> Error {
        let key = self
            .shape
            .names
            .first()
            .map(|name| format!("{name} = {}", columns.show(0, row)))
            .unwrap_or_default();
        self.error(
            Phase::Write,
            None,
            &format!("the table {} refused the row with {key}", self.config.table),
            e,
        )
    }

    async fn merge(&mut self, xid: &Xid) -> Result<()> {
        if self.staged == 0 {
            return Ok(());
        }
        if let Some(merge) = &self.sql.merge {
            let client = self.client(Phase::PreCommit)?;
            let fail = |what| move |e| pg_error(Phase::PreCommit, Some(xid), what, e);
            let fast = match (&self.sql.fast_merge, self.has_merge) {
                (Some(fast), true) => {
                    client
                        .batch_execute("SAVEPOINT ratchet_merge")
                        .await
                        .map_err(fail("SAVEPOINT failed"))?;
                    match client.execute(fast.as_str(), &[]).await {
                        Ok(_) => true,
                        Err(e)
                            if e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                                || e.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE) =>
                        {
                            tracing::debug!(error = %e, "MERGE met a concurrent writer; merging with ON CONFLICT");
                            client
                                .batch_execute("ROLLBACK TO SAVEPOINT ratchet_merge")
                                .await
                                .map_err(fail("ROLLBACK TO SAVEPOINT failed"))?;
                            false
                        }
                        Err(e) => {
                            return Err(fail("merging the staged rows failed")(e)
                                .with_sink(&self.config.sink));
                        }
                    }
                }
                _ => false,
            };
            if !fast {
                client.execute(merge.as_str(), &[]).await.map_err(|e| {
                    self.error(
                        Phase::PreCommit,
                        Some(xid),
                        "merging the staged rows failed",
                        e,
                    )
                })?;
            }
            client
                .batch_execute(&format!("TRUNCATE {STAGE}"))
                .await
                .map_err(|e| {
                    self.error(
                        Phase::PreCommit,
                        Some(xid),
                        "TRUNCATE of the stage failed",
                        e,
                    )
                })?;
        }
        self.staged = 0;
        Ok(())
    }

    /// Updates the owner row where the epoch is still `epoch`; fenced (and rolled back) when it is not.
    async fn fence(&mut self, xid: &Xid, epoch: u64) -> Result<()> {
        let updated = self
            .client(Phase::PreCommit)?
            .execute(
                &format!(
                    "UPDATE {OWNERS_TABLE} SET checkpoint = $4 WHERE sink = $1 AND subtask = $2 AND epoch = $3"
                ),
                &[
                    &xid.scope.as_str(),
                    &(xid.subtask.0 as i32),
                    &(epoch as i64),
                    &(xid.checkpoint.0 as i64),
                ],
            )
            .await
            .map_err(|e| self.error(Phase::PreCommit, Some(xid), "the owner check failed", e))?;
        if updated == 0 {
            self.rollback().await?;
            return Err(fenced(xid, epoch));
        }
        Ok(())
    }
}

/// The line number in a COPY error context (`COPY t, line 5, column id: ..`).
fn copy_line(context: &str) -> Option<usize> {
    let rest = context.split(", line ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[async_trait]
impl Session for PgSession {
    async fn begin(&mut self, xid: &Xid) -> Result<()> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            self.client = Some(self.open_connection(Phase::Begin).await?);
        }
        self.client(Phase::Begin)?
            .batch_execute("BEGIN")
            .await
            .map_err(|e| self.error(Phase::Begin, Some(xid), "BEGIN failed", e))?;
        self.open = Some(xid.clone());
        self.staged = 0;
        Ok(())
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        // A savepoint makes a refused batch refused whole: the transaction goes on without it (the driver can
        // dead-letter the batch), and a batch is never half written.
        let fail = |what| move |e| pg_error(Phase::Write, None, what, e);
        self.client(Phase::Write)?
            .batch_execute("SAVEPOINT ratchet_write")
            .await
            .map_err(fail("SAVEPOINT failed"))?;
        let copied = self.copy(batch).await;
        let client = self.client(Phase::Write)?;
        match copied {
            Ok(()) => client
                .batch_execute("RELEASE SAVEPOINT ratchet_write")
                .await
                .map_err(fail("RELEASE SAVEPOINT failed"))?,
            Err(e) if e.kind() == ErrorKind::BadRecord => {
                client
                    .batch_execute("ROLLBACK TO SAVEPOINT ratchet_write")
                    .await
                    .map_err(fail("ROLLBACK TO SAVEPOINT failed"))?;
                return Err(e);
            }
            Err(e) => return Err(e),
        }
        if self.sql.merge.is_some() {
            self.staged += batch.num_rows() as u64;
            if self.staged >= MERGE_EVERY_ROWS {
                let xid = self.open.clone().ok_or_else(|| {
                    Error::new(ErrorKind::Bug, Phase::Write, "write without begin")
                })?;
                self.merge(&xid)
                    .await
                    .map_err(|e| e.at_phase(Phase::Write))?;
            }
        }
        Ok(())
    }

    async fn prepare(&mut self, xid: &Xid, epoch: u64) -> Result<()> {
        self.fence(xid, epoch).await?;
        let client = self.client(Phase::PreCommit)?;
        let (sink, subtask, checkpoint) = (
            xid.scope.as_str(),
            xid.subtask.0 as i32,
            xid.checkpoint.0 as i64,
        );
        client
            .execute(
                &format!(
                    "INSERT INTO {MARKERS_TABLE} (sink, subtask, checkpoint) VALUES ($1, $2, $3)"
                ),
                &[&sink, &subtask, &checkpoint],
            )
            .await
            .map_err(|e| {
                self.error(
                    Phase::PreCommit,
                    Some(xid),
                    "cannot write the commit marker",
                    e,
                )
            })?;
        if xid.checkpoint.0.is_multiple_of(100) && xid.checkpoint.0 > MARKERS_KEPT {
            let oldest = (xid.checkpoint.0 - MARKERS_KEPT) as i64;
            client
                .execute(
                    &format!(
                        "DELETE FROM {MARKERS_TABLE} WHERE sink = $1 AND subtask = $2 AND checkpoint < $3"
                    ),
                    &[&sink, &subtask, &oldest],
                )
                .await
                .map_err(|e| self.error(Phase::PreCommit, Some(xid), "cannot prune old markers", e))?;
        }
        // PREPARE ends the transaction in this session whether it succeeds or not.
        self.open = None;
        self.client(Phase::PreCommit)?
            .batch_execute(&format!("PREPARE TRANSACTION '{xid}'"))
            .await
            .map_err(|e| self.error(Phase::PreCommit, Some(xid), "PREPARE TRANSACTION failed", e))
    }

    async fn apply(&mut self, xid: &Xid, epoch: u64) -> Result<()> {
        self.merge(xid).await?;
        if let (Some(cleanup), WriteMode::Append { dedup }) =
            (&self.sql.dedup_cleanup, &self.config.mode)
            && self
                .last_dedup_cleanup
                .is_none_or(|at| at.elapsed() >= DEDUP_CLEANUP_EVERY)
        {
            let seconds = dedup.retention.as_secs_f64();
            self.client(Phase::PreCommit)?
                .execute(cleanup.as_str(), &[&seconds])
                .await
                .map_err(|e| {
                    self.error(Phase::PreCommit, Some(xid), "dedup table cleanup failed", e)
                })?;
            self.last_dedup_cleanup = Some(Instant::now());
        }
        self.fence(xid, epoch).await?;
        self.open = None;
        self.client(Phase::PreCommit)?
            .batch_execute("COMMIT")
            .await
            // A lost reply leaves the outcome unknown; the replay re-applies the rows with the same effect.
            .map_err(|e| self.error(Phase::PreCommit, Some(xid), "COMMIT failed", e))
    }

    async fn rollback(&mut self) -> Result<()> {
        if self.open.take().is_none() {
            return Ok(());
        }
        self.staged = 0;
        match &self.client {
            // The transaction ended with the connection.
            None => Ok(()),
            Some(client) if client.is_closed() => Ok(()),
            Some(client) => match client.batch_execute("ROLLBACK").await {
                Ok(()) => Ok(()),
                Err(e) if e.is_closed() => Ok(()),
                Err(e) => Err(self.error(Phase::Abort, None, "ROLLBACK failed", e)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_error_contexts_give_the_line() {
        assert_eq!(
            super::copy_line("COPY orders, line 17, column id: \"x\""),
            Some(17)
        );
        assert_eq!(super::copy_line("COPY orders, line 3"), Some(3));
        assert_eq!(super::copy_line("SQL statement"), None);
    }
}
