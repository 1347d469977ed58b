//! [`JdbcSink`]: the two-phase protocol over a [`Session`] and a [`Coordinator`], for every dialect and mode.

use std::sync::Arc;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::{
    ChangeColumns, ChangeStep, CheckpointId, Error, ErrorKind, Phase, RecoveryPlan, Result, SinkId,
    SinkScope, SubtaskId, TwoPhaseCommit,
};

use crate::commit::JdbcCommitter;
use crate::committable::JdbcCommittable;
use crate::config::{Dialect, JdbcSinkConfig};
use crate::database::{Coordinator, Session};
use crate::keys::KeyDecoder;
use crate::{Xid, mysql, pg};

/// A relational table as an exactly-once sink; see the crate docs for the modes and the protocol.
pub struct JdbcSink {
    pub(crate) sink: SinkId,
    pub(crate) scope: SinkScope,
    pub(crate) subtask: SubtaskId,
    pub(crate) xa: bool,
    pub(crate) session: Box<dyn Session>,
    pub(crate) coordinator: Arc<dyn Coordinator>,
    /// The owner epoch this instance claimed in `recover`; `None` before.
    pub(crate) epoch: Option<u64>,
    /// The transaction the last `pre_commit` prepared, until the next `begin` (by then its checkpoint is decided):
    /// what `abort` rolls back when the driver abandons that checkpoint.
    pub(crate) prepared: Option<Xid>,
    /// Upsert mode: decodes tombstone keys into the key columns. `None` in the other modes, which cannot express
    /// a deletion.
    pub(crate) keys: Option<KeyDecoder>,
    /// The change columns of a change stream the mode applies by key (`upsert`, `xa_upsert`); `None` when the
    /// batches are not changes, or the mode appends them (then they are columns like any other: a changelog).
    pub(crate) changes: Option<ChangeColumns>,
    /// What the instance was built with (its schema updated by `evolve`).
    pub(crate) config: JdbcSinkConfig,
    /// The checkpoint whose transaction is open (begun, not yet pre-committed or aborted).
    pub(crate) open: Option<CheckpointId>,
}

impl std::fmt::Debug for JdbcSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JdbcSink")
            .field("sink", &self.sink)
            .field("subtask", &self.subtask)
            .field("xa", &self.xa)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl JdbcSink {
    /// Connects to the database of `config.connection` and checks it: that the server can prepare transactions
    /// (xa mode), that the table fits the batches' schema (or creates it with `create_table`), and creates
    /// Ratchet's owner and marker tables.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the setting, table or column that does not fit;
    /// [`Retryable`](ErrorKind::Retryable) when the server cannot be reached.
    pub async fn new(config: JdbcSinkConfig) -> Result<Self> {
        let coordinator: Arc<dyn Coordinator> = match Dialect::of_url(&config.connection.url)? {
            Dialect::Postgres => Arc::new(pg::PgCoordinator::new(
                pg::options(&config.connection)?,
                config.lock_timeout,
            )),
            Dialect::MySql => Arc::new(mysql::MySqlCoordinator::new(
                mysql::options(&config.connection)?,
                config.lock_timeout,
            )),
        };
        let table = table_config(&config)?;
        Ok(Self {
            keys: key_decoder(&table)?,
            session: session(&table).await?,
            changes: applied_changes(&config)?,
            sink: config.sink.clone(),
            scope: config.scope.clone(),
            subtask: config.subtask,
            xa: config.mode.prepares(),
            coordinator,
            epoch: None,
            prepared: None,
            config,
            open: None,
        })
    }

    fn xid(&self, checkpoint: CheckpointId) -> Xid {
        Xid {
            scope: self.scope.clone(),
            subtask: self.subtask,
            checkpoint,
        }
    }

    fn epoch(&self, phase: Phase) -> Result<u64> {
        self.epoch.ok_or_else(|| {
            Error::new(
                ErrorKind::Bug,
                phase,
                "recover must run before the first begin (it claims the owner row)",
            )
            .with_sink(&self.sink)
        })
    }
}

/// The writer session of `config`: connects, checks the table (adding the batches' columns it lacks with
/// `evolution = "add-columns"`) and prepares the dialect's statements.
async fn session(config: &JdbcSinkConfig) -> Result<Box<dyn Session>> {
    Ok(match Dialect::of_url(&config.connection.url)? {
        Dialect::Postgres => Box::new(
            pg::PgSession::connect(pg::options(&config.connection)?, config.clone()).await?,
        ),
        Dialect::MySql => Box::new(
            mysql::MySqlSession::connect(mysql::options(&config.connection)?, config.clone())
                .await?,
        ),
    })
}

/// The change columns `config`'s mode applies (see [`JdbcSink::write`]).
fn applied_changes(config: &JdbcSinkConfig) -> Result<Option<ChangeColumns>> {
    if config.mode.key().is_none() {
        return Ok(None);
    }
    ChangeColumns::of(&config.schema).map_err(|e| e.with_sink(&config.sink))
}

/// `config` as the table sees it: without the change columns the mode applies (they are not table columns).
pub(crate) fn table_config(config: &JdbcSinkConfig) -> Result<JdbcSinkConfig> {
    let mut table = config.clone();
    if config.mode.key().is_some() {
        let rows =
            ChangeColumns::table_schema(&config.schema).map_err(|e| e.with_sink(&config.sink))?;
        table.schema = match Arc::ptr_eq(&rows, &config.schema) {
            true => rows,
            false => crate::columns::marked_change_stream(&rows),
        };
    }
    Ok(table)
}

/// The upsert modes' decoder of tombstone keys.
fn key_decoder(config: &JdbcSinkConfig) -> Result<Option<KeyDecoder>> {
    config
        .mode
        .key()
        .map(|key| KeyDecoder::new(&config.schema, key))
        .transpose()
}

#[async_trait]
impl TwoPhaseCommit for JdbcSink {
    type Committable = JdbcCommittable;
    type Committer = JdbcCommitter;

    fn sink_id(&self) -> &SinkId {
        &self.sink
    }

    /// In xa mode, the checkpoint the owner row records (set inside each checkpoint's prepared transaction, so
    /// visible once it committed). The upsert and append modes commit at pre-commit, before the record is durable,
    /// and replaying into them is harmless: they report nothing.
    async fn recorded_checkpoint(&mut self) -> Result<Option<CheckpointId>> {
        if !self.xa {
            return Ok(None);
        }
        self.coordinator
            .applied_through(&self.scope, self.subtask)
            .await
    }

    fn committer(&self) -> JdbcCommitter {
        JdbcCommitter {
            sink: self.sink.clone(),
            coordinator: self.coordinator.clone(),
        }
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        self.epoch(Phase::Begin)?;
        // The driver begins a checkpoint only once the previous one is decided: no abort can reach it any more.
        self.prepared = None;
        let xid = self.xid(checkpoint);
        self.session.begin(&xid).await?;
        self.open = Some(checkpoint);
        Ok(())
    }

    /// `evolution = "add-columns"`: adds the new columns to the table (`ALTER TABLE .. ADD COLUMN IF NOT
    /// EXISTS`); `"evolve"` also widens the numeric columns the batches widen and drops NOT NULL where they take
    /// nulls (`ALTER COLUMN .. TYPE` / `MODIFY COLUMN`). Both from a new writer connection, bounded by
    /// `lock_timeout`, after the open transaction, still empty, is rolled back; then the statements are prepared
    /// for the new schema and the checkpoint's transaction opened again.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a change `evolution` does not allow (naming the columns and the setting:
    /// [`SchemaChange::to_make`](connector_api::SchemaChange::to_make)); [`Retryable`](ErrorKind::Retryable) when
    /// the server cannot be reached or the table stayed locked (another writer's prepared transaction) for
    /// `lock_timeout`.
    async fn evolve(&mut self, schema: arrow_schema::SchemaRef) -> Result<()> {
        let target = format!("table {}", self.config.table);
        let change = connector_api::SchemaChange::to_make(
            &self.sink,
            self.config.evolution,
            &target,
            &self.config.schema,
            &schema,
        )?;
        if change.is_empty() {
            return Ok(());
        }
        self.session.rollback().await?;
        let mut config = self.config.clone();
        config.schema = schema;
        let table = table_config(&config)?;
        self.session = session(&table).await?;
        self.keys = key_decoder(&table)?;
        self.changes = applied_changes(&config)?;
        self.config = config;
        if let Some(checkpoint) = self.open {
            self.session.begin(&self.xid(checkpoint)).await?;
        }
        Ok(())
    }

    /// Writes `batch` into the open transaction: appended (`xa`, `append`) or upserted by key (`upsert`,
    /// `xa_upsert`). A change stream's batch (change columns marked by the source: [`ChangeColumns`]) in a keyed
    /// mode is applied in source order ([`ChangeColumns::in_order`]): deletes (operation `d`) delete the key's row,
    /// the other changes are upserted without the change columns, so unique indexes besides the key see what the
    /// source saw. In the appending modes a change stream's batch is appended whole, change columns included (a
    /// changelog table).
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) for a row the table refuses, a change whose operation is not `c`,
    /// `u`, `r` or `d`, or whose key holds a null: nothing of the batch is applied, except that a change batch's
    /// steps are refused each whole, so a step refused (a foreign key) leaves the steps before it applied (applied
    /// again, with the same effect, when the batch is split to find the refused row);
    /// [`Retryable`](ErrorKind::Retryable) when the connection was lost.
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let (Some(changes), Some(key)) = (&self.changes, self.config.mode.key()) else {
            return self.session.write(batch, &[]).await;
        };
        let steps = changes
            .in_order(batch, key)
            .map_err(|e| e.with_sink(&self.sink))?;
        for step in steps {
            match step {
                ChangeStep::Upserts { rows, unchanged } => {
                    self.session.write(&rows, &unchanged).await?
                }
                ChangeStep::Deletes(keys) => self.session.delete(&[keys]).await?,
                ChangeStep::Truncate => self.session.delete_all().await?,
            }
        }
        Ok(())
    }

    /// Upsert modes (`upsert`, `xa_upsert`): deletes the rows of `keys` inside the open transaction, after the rows written before (so a
    /// key upserted then deleted in one checkpoint ends deleted, and one deleted then upserted ends present). Each
    /// key is decoded into the key columns (the rule is in the crate docs, "Tombstones"); a key that is `None` (a
    /// tombstone without a key) deletes nothing. Returns `true`, also when no key was given.
    ///
    /// The xa mode (its tables have no key) and the append mode (it only appends) cannot express a deletion:
    /// `false`, nothing written.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the key, the key column and what it takes for a key that does
    /// not fit, or naming the table when it refuses a deletion (a foreign key): nothing of the call is applied
    /// (every key is decoded before anything is deleted, and the deletes run behind a savepoint).
    async fn write_tombstones(&mut self, keys: &[Option<Vec<u8>>]) -> Result<bool> {
        let Some(decoder) = &self.keys else {
            return Ok(false);
        };
        let rows = decoder
            .decode(keys.iter().flatten().map(Vec::as_slice))
            .map_err(|e| e.with_sink(&self.sink))?;
        if !rows.is_empty() {
            self.session.delete(&rows).await?;
        }
        Ok(true)
    }

    /// xa mode: fences, writes the marker and prepares (`PREPARE TRANSACTION` / `XA PREPARE`). Upsert and
    /// append modes: merges, fences, records the checkpoint in the owner row and commits.
    ///
    /// # Errors
    /// [`Fenced`](ErrorKind::Fenced) when a newer instance of this subtask recovered (the transaction is rolled
    /// back); any other error leaves nothing prepared or applied.
    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<JdbcCommittable> {
        let epoch = self.epoch(Phase::PreCommit)?;
        let xid = self.xid(checkpoint);
        self.open = None;
        if self.xa {
            self.session.prepare(&xid, epoch).await?;
            self.prepared = Some(xid.clone());
        } else {
            self.session.apply(&xid, epoch).await?;
        }
        Ok(JdbcCommittable {
            xid: xid.to_string(),
            prepared: self.xa,
        })
    }

    /// Rolls back the open transaction, and the one the last `pre_commit` prepared if its checkpoint was
    /// abandoned (another sink failed its pre-commit, or the record could not be saved): it would otherwise hold
    /// its rows and the owner row until the next recovery.
    async fn abort(&mut self) -> Result<()> {
        self.open = None;
        self.session.rollback().await?;
        if let Some(xid) = self.prepared.take() {
            self.coordinator
                .rollback_prepared(&xid)
                .await
                .map_err(|e| e.at_phase(Phase::Abort).or_sink(&self.sink))?;
        }
        Ok(())
    }

    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<JdbcCommittable>)>,
    ) -> Result<RecoveryPlan<JdbcCommittable>> {
        self.plan(restored).await
    }

    async fn execute_recovery(&mut self, plan: RecoveryPlan<JdbcCommittable>) -> Result<()> {
        self.execute_plan(plan).await
    }
}
