//! The upsert mode's input (`upsert_key`): one checkpoint's rows, applied by key when the checkpoint is
//! pre-committed. A change stream's rows ([`ChangeColumns`]) are changes (`d` deletes its key, the others upsert
//! it); any other rows upsert their key. Within the checkpoint the last change of a key wins, so the checkpoint
//! writes at most one row per key: the snapshot's equality deletes remove the keys' older rows, and a key changed
//! twice in one checkpoint never shows twice.
//!
//! # Memory
//! The checkpoint's rows are held until its pre-commit (the last change of a key may come in its last batch):
//! memory grows with the rows between two checkpoints, as the sink's own writers' row groups do.

use std::sync::Arc;

use arrow_array::RecordBatch;
use connector_api::{AppliedChanges, ChangeColumns, Error, Result, last_rows_by_key};

use crate::config::IcebergSinkConfig;

/// One checkpoint's rows of the upsert mode, until its pre-commit.
#[derive(Debug)]
pub(crate) struct KeyedRows {
    key: Vec<String>,
    changes: Option<ChangeColumns>,
    /// Whether the change stream names the columns a change did not carry.
    schema_has_unavailable: bool,
    batches: Vec<RecordBatch>,
}

impl KeyedRows {
    /// The upsert mode's rows of a sink configured by `config`, when its `upsert_key` names a key.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming the sink with `commit_every` > 1 (checkpoints carried
    /// into one snapshot would share its sequence number: equality deletes, and the position deletes' fallback to
    /// them after a rewrite, could not order a key's changes in two of them), or for a change stream without an
    /// operation column.
    pub(crate) fn of_config(config: &IcebergSinkConfig) -> Result<Option<Self>> {
        if config.upsert_key.is_empty() {
            return Ok(None);
        }
        if config.commit_every > 1 {
            return Err(Error::config(format!(
                "upsert_key commits every checkpoint: commit_every = {} would put several checkpoints' changes of \
                 a key into one snapshot, where equality deletes (upsert_deletes = \"equality\", and the \
                 fallback of position deletes after another writer's rewrite) cannot order them; set \
                 commit_every = 1 (a longer checkpoint interval makes fewer snapshots)",
                config.commit_every
            ))
            .with_sink(&config.sink));
        }
        Self::new(config.upsert_key.clone(), &config.schema)
            .map(Some)
            .map_err(|e| e.with_sink(&config.sink))
    }

    /// Rows keyed by `key` of batches of `schema` (a change stream when the source marked change columns).
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) for marked change columns without an operation column, or a
    /// key column the rows do not have.
    pub(crate) fn new(key: Vec<String>, schema: &arrow_schema::Schema) -> Result<Self> {
        let changes = ChangeColumns::of(schema)?;
        let rows = ChangeColumns::table_schema(&Arc::new(schema.clone()))?;
        if let Some(missing) = key.iter().find(|k| rows.index_of(k).is_err()) {
            return Err(Error::config(format!(
                "upsert_key: the input rows have no column {missing:?}; name key columns of the rows"
            )));
        }
        Ok(Self {
            key,
            changes,
            schema_has_unavailable: schema.index_of(connector_api::UNAVAILABLE_COLUMN).is_ok(),
            batches: Vec::new(),
        })
    }

    /// Whether the rows can leave columns out (a change stream with an `__unavailable` column).
    pub(crate) fn carries_unavailable(&self) -> bool {
        self.changes.is_some() && self.schema_has_unavailable
    }

    /// The key columns.
    pub(crate) fn key(&self) -> &[String] {
        &self.key
    }

    /// Checks `batch` for what applying it would refuse (a key column the rows lack, an unknown operation) and
    /// returns the rows it holds (a change stream's row columns) for the table's own checks; applies nothing.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) for a key column the rows lack;
    /// [`BadRecord`](connector_api::ErrorKind::BadRecord) naming a row whose operation is not a change.
    pub(crate) fn checked(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let rows = match &self.changes {
            Some(changes) => {
                if let Some(row) = changes.first_truncate(batch) {
                    return Err(Error::new(
                        connector_api::ErrorKind::BadRecord,
                        connector_api::Phase::Write,
                        format!(
                            "change row {row} of the batch is a truncate, which an Iceberg table kept by key cannot \
                             apply (planned): let it go to the dead-letter topic, or refuse truncates in the \
                             source (truncate = \"refuse\")"
                        ),
                    ));
                }
                changes.checked_rows(batch)?
            }
            None => batch.clone(),
        };
        if let Some(missing) = self.key.iter().find(|k| rows.schema().index_of(k).is_err()) {
            return Err(Error::config(format!(
                "upsert_key: the rows have no key column {missing:?}"
            )));
        }
        Ok(rows)
    }

    /// `batches` applied as one (a key's last change wins), per batch.
    fn apply(&self, batches: &[RecordBatch]) -> Result<Vec<AppliedChanges>> {
        match &self.changes {
            Some(changes) => changes.apply_all(batches, &self.key),
            None => Ok(last_rows_by_key(batches, &self.key)?
                .into_iter()
                .map(|upserts| AppliedChanges {
                    unchanged: vec![Vec::new(); upserts.num_rows()],
                    upserts,
                    deletes: RecordBatch::new_empty(Arc::new(arrow_schema::Schema::empty())),
                })
                .collect()),
        }
    }

    /// Keeps `batch` for the checkpoint's pre-commit.
    pub(crate) fn push(&mut self, batch: &RecordBatch) {
        self.batches.push(batch.clone());
    }

    /// Drops the rows kept (the checkpoint aborted, or a new one begins).
    pub(crate) fn clear(&mut self) {
        self.batches.clear();
    }

    /// The checkpoint's rows applied by key (the last change of each key wins), per batch as it came (never
    /// concatenated: a checkpoint may hold more than one Arrow array can), and forgotten.
    ///
    /// # Errors
    /// As [`checked`](Self::checked).
    pub(crate) fn take(&mut self) -> Result<Vec<AppliedChanges>> {
        let batches = std::mem::take(&mut self.batches);
        self.apply(&batches)
    }
}

/// The table's columns for the input schema: in the upsert mode a change stream's rows without their change
/// columns (the table holds the rows, not the changes); otherwise every column (a changelog keeps them).
pub(crate) fn table_schema(config: &IcebergSinkConfig) -> Result<arrow_schema::SchemaRef> {
    table_columns(&config.upsert_key, &config.schema).map_err(|e| e.with_sink(&config.sink))
}

/// [`table_schema`] of batches of `schema` with `upsert_key`.
pub(crate) fn table_columns(
    upsert_key: &[String],
    schema: &arrow_schema::SchemaRef,
) -> Result<arrow_schema::SchemaRef> {
    if upsert_key.is_empty() {
        Ok(schema.clone())
    } else {
        ChangeColumns::table_schema(schema)
    }
}
