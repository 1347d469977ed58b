//! Committing one checkpoint as one snapshot, idempotently.

use std::collections::HashMap;

use connector_api::{CheckpointId, Error, ErrorKind, Phase, Result, SinkId};
use iceberg::spec::DataFile;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::util::snapshot::ancestors_of;
use iceberg::{Catalog, TableIdent};

use crate::error::iceberg_error;

/// Snapshot summary key holding the sink id.
pub const SINK_PROPERTY: &str = "ratchet.sink-id";
/// Snapshot summary key holding the checkpoint id.
pub const CHECKPOINT_PROPERTY: &str = "ratchet.checkpoint-id";

/// What `commit_checkpoint` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// A new snapshot was committed.
    Committed,
    /// The table's history already holds this checkpoint (or a later one) of this sink: nothing was done.
    AlreadyCommitted,
}

/// The newest checkpoint of `sink` in the ancestry of the table's current snapshot.
pub fn last_committed_checkpoint(table: &Table, sink: &SinkId) -> Option<CheckpointId> {
    let metadata = table.metadata_ref();
    let current = metadata.current_snapshot_id()?;
    ancestors_of(&metadata, current).find_map(|snapshot| {
        let props = &snapshot.summary().additional_properties;
        (props.get(SINK_PROPERTY).map(String::as_str) == Some(sink.as_str()))
            .then(|| {
                props
                    .get(CHECKPOINT_PROPERTY)?
                    .parse()
                    .ok()
                    .map(CheckpointId)
            })
            .flatten()
    })
}

/// Commits `files` as one snapshot for `checkpoint` of `sink`, unless the table already has it.
///
/// # Idempotence
/// Reloads the table first; if its history holds this checkpoint, returns [`CommitOutcome::AlreadyCommitted`].
/// iceberg's duplicate-file check is a second backstop.
///
/// # Errors
/// A commit conflict (another writer committed first) is [`Retryable`](ErrorKind::Retryable): calling again
/// reloads and re-checks.
pub async fn commit_checkpoint(
    catalog: &dyn Catalog,
    table: &TableIdent,
    sink: &SinkId,
    checkpoint: CheckpointId,
    files: Vec<DataFile>,
) -> Result<CommitOutcome> {
    let context = |e: Error| {
        e.with_sink(sink)
            .with_checkpoint(checkpoint)
            .with_txn(table.to_string())
    };
    let current = catalog
        .load_table(table)
        .await
        .map_err(|e| context(iceberg_error(Phase::Commit, "cannot load the table", e)))?;
    if last_committed_checkpoint(&current, sink).is_some_and(|last| last >= checkpoint) {
        return Ok(CommitOutcome::AlreadyCommitted);
    }
    let properties = HashMap::from([
        (SINK_PROPERTY.to_string(), sink.to_string()),
        (CHECKPOINT_PROPERTY.to_string(), checkpoint.to_string()),
    ]);
    let tx = Transaction::new(&current);
    let tx = tx
        .fast_append()
        .add_data_files(files)
        .set_snapshot_properties(properties)
        .apply(tx)
        .map_err(|e| context(iceberg_error(Phase::Commit, "cannot build the append", e)))?;
    tx.commit(catalog).await.map_err(|e| {
        let err = iceberg_error(Phase::Commit, "the catalog refused the snapshot", e);
        context(if err.kind() == ErrorKind::Retryable {
            err
        } else {
            Error::new(
                ErrorKind::Fatal,
                Phase::Commit,
                "the catalog commit failed; its outcome may be unknown: restart to let recovery reload the table \
                 and check its history",
            )
            .with_source(err)
        })
    })?;
    Ok(CommitOutcome::Committed)
}
