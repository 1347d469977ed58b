//! The writer's PostgreSQL session: binary COPY into the table (xa mode), or one `MERGE` / `INSERT .. SELECT`
//! per batch from binary array parameters (upsert and append modes; see [`super::statements`]).

use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::{Error, ErrorKind, Phase, Result};
use connector_common::postgres::PgConnectOptions;
use futures_util::pin_mut;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use super::cell::{PgCell, PgColumn};
use super::statements::{self, BatchStatements, KeyDelete};
use super::{pg_error, prepare_database};
use crate::Xid;
use crate::columns::{Columns, TableShape};
use crate::config::{Dialect, JdbcSinkConfig, WriteMode};
use crate::database::{DedupCleanup, MARKERS_KEPT, MARKERS_TABLE, OWNERS_TABLE, Session};
use crate::error::fenced;
use crate::keeping::UpdateKeeping;
use crate::savepoint;

/// A batch statement prepared on the connection, and its `ON CONFLICT` fallback.
type Prepared = (Statement, Option<Statement>);

/// The writer's connection; see the module docs.
pub(crate) struct PgSession {
    options: PgConnectOptions,
    config: JdbcSinkConfig,
    shape: TableShape,
    /// The xa mode's COPY.
    copy: String,
    /// The upsert and append modes' per-batch statements.
    batch: Option<BatchStatements>,
    /// The upsert mode's delete by key (tombstones).
    delete: Option<KeyDelete>,
    client: Option<Client>,
    /// `batch` prepared on `client` (primary, fallback); prepared again after a reconnect.
    prepared: Option<Prepared>,
    /// The table's column types, in the batch schema's order.
    types: Vec<Type>,
    /// The table's columns (type and modifier), in the batch schema's order.
    columns: Vec<PgColumn>,
    /// Which columns are sent as JSON text: JSON and nested values, and lists unless COPY writes them into an
    /// array column.
    as_json: Vec<bool>,
    /// [`Self::as_json`] for statements that bind one row's values (arrays bound as arrays).
    row_as_json: Vec<bool>,
    /// The open transaction's id.
    open: Option<Xid>,
    dedup_cleanup: DedupCleanup,
}

impl PgSession {
    /// Connects, checks the server and the table, creates what `config` asks for.
    pub(crate) async fn connect(options: PgConnectOptions, config: JdbcSinkConfig) -> Result<Self> {
        let shape = TableShape::of(&config.schema)?;
        let mut session = Self {
            options,
            copy: statements::copy(&config, &shape),
            config,
            shape,
            batch: None,
            delete: None,
            client: None,
            prepared: None,
            types: Vec::new(),
            columns: Vec::new(),
            as_json: Vec::new(),
            row_as_json: Vec::new(),
            open: None,
            dedup_cleanup: DedupCleanup::default(),
        };
        let client = session.connect_only(Phase::Setup).await?;
        prepare_database(&client, &session.config).await?;
        session.columns = super::table::columns(&client, &session.config, &session.shape).await?;
        session.types = session.columns.iter().map(|c| c.ty.clone()).collect();
        let version: i32 = client
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .map_err(|e| session.error(Phase::Setup, None, "cannot read the server version", e))?
            .get(0);
        session.batch = BatchStatements::new(
            &session.config,
            &session.shape,
            &session.types,
            version >= 150_000,
        )?;
        session.delete = KeyDelete::new(&session.config, &session.shape, &session.columns)?;
        session.as_json = json_columns(&session.shape, &session.columns, session.batch.is_some());
        session.row_as_json = json_columns(&session.shape, &session.columns, false);
        session.client = Some(client);
        Ok(session)
    }

    /// A new connection whose statements wait at most `lock_timeout` for a lock: the fencing update waiting for
    /// the previous checkpoint's commit, a row another writer (or a zombie's prepared transaction) holds. Past
    /// it the statement fails retryable and the checkpoint is aborted and replayed, rather than hang.
    async fn connect_only(&self, phase: Phase) -> Result<Client> {
        let client = self
            .options
            .connect("the JDBC sink's connection to PostgreSQL")
            .await
            .map_err(|e| Error::from(e).at_phase(phase).with_sink(&self.config.sink))?;
        client
            .batch_execute(&format!(
                "SET lock_timeout = {}",
                self.config.lock_timeout.as_millis().max(1)
            ))
            .await
            .map_err(|e| self.error(phase, None, "cannot set lock_timeout", e))?;
        Ok(client)
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

    /// Binary COPY of `batch` into the table; a refused row is named by its line, mapped back to the batch
    /// row's first column.
    async fn copy(&self, batch: &RecordBatch) -> Result<()> {
        let client = self.client(Phase::Write)?;
        let sink = client
            .copy_in(&self.copy)
            .await
            .map_err(|e| self.error(Phase::Write, None, "COPY failed to start", e))?;
        let writer = BinaryCopyInWriter::new(sink, &self.types);
        pin_mut!(writer);
        let columns = Columns::new(batch, &self.shape.types, &self.as_json)?;
        let mut cells = Vec::with_capacity(columns.len());
        for row in 0..batch.num_rows() {
            cells.extend((0..columns.len()).map(|c| self.cell(&columns, c, row)));
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
        Ok(())
    }

    /// The upsert or append statement for `batch`, its columns as binary arrays; when a `MERGE` meets a key a
    /// concurrent writer inserted first, the `ON CONFLICT` statement instead (back at the write's savepoint).
    async fn write_rows(&mut self, batch: &RecordBatch, unchanged: &[String]) -> Result<()> {
        if !unchanged.is_empty() {
            return self.update_keeping(batch, unchanged).await;
        }
        let (primary, fallback) = self.prepared_batch().await?;
        let columns = Columns::new(batch, &self.shape.types, &self.as_json)?;
        let arrays: Vec<Vec<PgCell<'_>>> = (0..columns.len())
            .map(|c| {
                (0..batch.num_rows())
                    .map(|row| self.cell(&columns, c, row))
                    .collect()
            })
            .collect();
        let params: Vec<&(dyn ToSql + Sync)> =
            arrays.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        let client = self.client(Phase::Write)?;
        let refused = |e| {
            let first = format!("{} = {}", self.shape.names[0], columns.show(0, 0));
            self.error(
                Phase::Write,
                self.open.as_ref(),
                &format!(
                    "the table {} refused a row of the batch starting at the row with {first}",
                    self.config.table
                ),
                e,
            )
        };
        match client.execute(&primary, &params).await {
            Ok(_) => Ok(()),
            Err(e)
                if fallback.is_some()
                    && (e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                        || e.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE)) =>
            {
                tracing::debug!(error = %e, "MERGE met a concurrent writer; upserting with ON CONFLICT");
                client
                    .batch_execute("ROLLBACK TO SAVEPOINT ratchet_write")
                    .await
                    .map_err(|e| {
                        self.error(Phase::Write, None, "ROLLBACK TO SAVEPOINT failed", e)
                    })?;
                let fallback = fallback.expect("checked above");
                client
                    .execute(&fallback, &params)
                    .await
                    .map(|_| ())
                    .map_err(refused)
            }
            Err(e) => Err(refused(e)),
        }
    }

    /// The batch statements prepared on the current connection.
    async fn prepared_batch(&mut self) -> Result<(Statement, Option<Statement>)> {
        if let Some(prepared) = &self.prepared {
            return Ok(prepared.clone());
        }
        let batch = self.batch.clone().ok_or_else(|| {
            Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "no batch statements in xa mode",
            )
        })?;
        let client = self.client(Phase::Write)?;
        let fail = |e| self.error(Phase::Write, None, "cannot prepare the write statement", e);
        let primary = client.prepare(&batch.primary).await.map_err(fail)?;
        let fallback = match &batch.fallback {
            Some(sql) => Some(client.prepare(sql).await.map_err(fail)?),
            None => None,
        };
        self.prepared = Some((primary.clone(), fallback.clone()));
        Ok((primary, fallback))
    }

    /// Keyed modes: each change of `batch` that did not carry the `unchanged` columns updates its key's row,
    /// keeping them ([`UpdateKeeping`]).
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the key when the table holds no row of it: the value the change
    /// did not carry is nowhere to keep it from.
    async fn update_keeping(&mut self, batch: &RecordBatch, unchanged: &[String]) -> Result<()> {
        let key = self.config.mode.key().unwrap_or_default();
        let update = UpdateKeeping::new(
            Dialect::Postgres,
            &self.config.table,
            key,
            &self.shape,
            unchanged,
        );
        let columns = Columns::new(batch, &self.shape.types, &self.row_as_json)?;
        let client = self.client(Phase::Write)?;
        let statement = client
            .prepare(&update.sql)
            .await
            .map_err(|e| self.error(Phase::Write, None, "cannot prepare the update", e))?;
        for row in 0..batch.num_rows() {
            let cells: Vec<PgCell<'_>> = update
                .params
                .iter()
                .map(|&c| self.cell(&columns, c, row))
                .collect();
            let values: Vec<&(dyn ToSql + Sync)> =
                cells.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
            let updated = self
                .client(Phase::Write)?
                .execute(&statement, &values)
                .await
                .map_err(|e| self.row_error(&columns, row, e))?;
            if updated == 0 {
                return Err(crate::keeping::nothing_to_keep(
                    &self.config,
                    &self.shape,
                    &columns,
                    row,
                    unchanged,
                ));
            }
        }
        Ok(())
    }

    /// Opens the write savepoint: what follows until [`Self::close_savepoint`] is refused whole (the transaction
    /// goes on without it, so the driver can dead-letter it) or applied whole, never half.
    async fn open_savepoint(&self) -> Result<()> {
        self.client(Phase::Write)?
            .batch_execute(savepoint::OPEN)
            .await
            .map_err(|e| pg_error(Phase::Write, None, "SAVEPOINT failed", e))
    }

    /// Closes the write savepoint after `outcome`: released when it succeeded, rolled back to when it was refused
    /// ([`BadRecord`](ErrorKind::BadRecord), returned); any other error is returned as it is (the transaction is
    /// lost anyway).
    async fn close_savepoint(&self, outcome: Result<()>) -> Result<()> {
        let Some((statement, what)) = savepoint::closing(&outcome) else {
            return outcome;
        };
        self.client(Phase::Write)?
            .batch_execute(statement)
            .await
            .map_err(|e| pg_error(Phase::Write, None, what, e))?;
        outcome
    }

    /// Row `row`'s value of column `c`, for the table's column `c`.
    fn cell<'c>(&self, columns: &'c Columns, c: usize, row: usize) -> PgCell<'c> {
        PgCell {
            cell: columns.cell(c, row),
            typmod: self.columns[c].typmod,
        }
    }

    fn row_error(&self, columns: &Columns, row: usize, e: tokio_postgres::Error) -> Error {
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
            self.prepared = None;
            self.client = Some(self.connect_only(Phase::Begin).await?);
        }
        self.client(Phase::Begin)?
            .batch_execute("BEGIN")
            .await
            .map_err(|e| self.error(Phase::Begin, Some(xid), "BEGIN failed", e))?;
        self.open = Some(xid.clone());
        Ok(())
    }

    async fn write(&mut self, batch: &RecordBatch, unchanged: &[String]) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.open_savepoint().await?;
        let written = match self.batch {
            None => self.copy(batch).await,
            Some(_) => self.write_rows(batch, unchanged).await,
        };
        self.close_savepoint(written).await
    }

    /// One `DELETE .. USING unnest(..)` for every key, behind the write savepoint.
    async fn delete(&mut self, keys: &[RecordBatch]) -> Result<()> {
        let Some(delete) = &self.delete else {
            return Err(Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "tombstones reached the PostgreSQL session outside the upsert mode",
            )
            .with_sink(&self.config.sink));
        };
        if keys.iter().all(|k| k.num_rows() == 0) {
            return Ok(());
        }
        if self.open.is_none() {
            return Err(Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "tombstones written outside a transaction (before begin)",
            )
            .with_sink(&self.config.sink));
        }
        let plain = vec![false; delete.types.len()];
        let columns: Vec<Columns> = keys
            .iter()
            .map(|k| Columns::new(k, &delete.types, &plain))
            .collect::<Result<_>>()?;
        let arrays: Vec<Vec<PgCell<'_>>> = (0..delete.types.len())
            .map(|c| {
                let typmod = delete.typmods[c];
                columns
                    .iter()
                    .zip(keys)
                    .flat_map(|(cells, batch)| {
                        (0..batch.num_rows()).map(move |row| PgCell {
                            cell: cells.cell(c, row),
                            typmod,
                        })
                    })
                    .collect()
            })
            .collect();
        let params: Vec<&(dyn ToSql + Sync)> =
            arrays.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        self.open_savepoint().await?;
        let deleted = match self
            .client(Phase::Write)?
            .execute(delete.sql.as_str(), &params)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                let what = format!(
                    "the table {} refused to delete the rows of {}",
                    self.config.table,
                    crate::keys::describe(keys, &delete.types)
                );
                Err(self.error(Phase::Write, self.open.as_ref(), &what, e))
            }
        };
        self.close_savepoint(deleted).await
    }

    async fn delete_all(&mut self) -> Result<()> {
        if self.open.is_none() {
            return Err(Error::bug(
                Phase::Write,
                "a truncate applied outside a transaction (before begin)",
            )
            .with_sink(&self.config.sink));
        }
        let what = format!(
            "the table {} refused to delete every row (a truncate)",
            self.config.table
        );
        self.open_savepoint().await?;
        let deleted = match self
            .client(Phase::Write)?
            .batch_execute(&statements::delete_all(&self.config))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => Err(self.error(Phase::Write, self.open.as_ref(), &what, e)),
        };
        self.close_savepoint(deleted).await
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
        let cleanup = self.batch.as_ref().and_then(|b| b.dedup_cleanup.clone());
        if let (Some(cleanup), WriteMode::Append { dedup }) = (cleanup, &self.config.mode)
            && self.dedup_cleanup.due()
        {
            let seconds = dedup.retention.as_secs_f64();
            self.client(Phase::PreCommit)?
                .execute(cleanup.as_str(), &[&seconds])
                .await
                .map_err(|e| {
                    self.error(Phase::PreCommit, Some(xid), "dedup table cleanup failed", e)
                })?;
            self.dedup_cleanup.done();
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

/// Which batch columns are bound as JSON text: JSON columns, and lists whose table column is no array (`jsonb`)
/// or that a batch statement unnests (PostgreSQL has no array of arrays: each row's list goes as a `jsonb`
/// element and is turned back into the column's array in SQL).
fn json_columns(shape: &TableShape, columns: &[PgColumn], unnests: bool) -> Vec<bool> {
    shape
        .types
        .iter()
        .zip(columns)
        .map(|(sql, column)| {
            sql.is_json()
                || (*sql == crate::columns::SqlType::List
                    && (unnests
                        || !matches!(column.ty.kind(), tokio_postgres::types::Kind::Array(_))))
        })
        .collect()
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
