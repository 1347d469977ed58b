//! Reading the table into the key index ([`crate::key_index`]): a full rebuild from the current snapshot (at
//! recovery, and whenever a snapshot removed data files), and a catch-up with the data files other writers added
//! since the snapshot the index shows (before every pre-commit).
//!
//! # Rebuild
//! Every live data file of the current snapshot is read (its key columns only, matched by field id, in file
//! order: a row's position is its ordinal in the file) in ascending data sequence number, so a key's newest row
//! wins; rows the snapshot's position-delete files delete are skipped. Equality deletes (a table written with
//! `upsert_deletes = "equality"`, or by another engine) are not read: the row they delete is older than the key's
//! live row, which wins by its sequence number, and a key they deleted for good points at a deleted row, which a
//! later delete of it leaves deleted. Deletion vectors (format version 3) are read like position-delete files.
//!
//! # Catch-up
//! The snapshots between the current one and the one the index shows are walked back through their parents.
//! This subtask's own snapshots are skipped (their changes are in the index since their pre-commit), except one
//! that carries this subtask's compaction: its moves apply then ([`KeyIndex::apply_compaction`]). Each other
//! one adds its new data files' keys (minus the rows its own position deletes remove, as a Flink upsert writes
//! them). A snapshot that removed data files (a rewrite, an overwrite; an own compaction whose moves the index
//! does not hold) or a history that no longer reaches the shown snapshot (expired, rolled back) makes it a
//! rebuild.
//!
//! Every read is bounded by the caller (the sink's `commit_timeout` per rebuild or catch-up).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use connector_api::{CheckpointId, Error, ErrorKind, Phase, Result};
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::ArrowFileReader;
use iceberg::io::FileMetadata;
use iceberg::spec::{
    DataContentType, DataFileFormat, ManifestContentType, ManifestEntryRef, ManifestStatus,
    Operation, Snapshot,
};
use iceberg::table::Table;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::arrow::{PARQUET_FIELD_ID_META_KEY, ProjectionMask};

use crate::error::iceberg_error;
use crate::key_index::{IndexedFile, KeyIndex, Shown};
use crate::ledger::SubtaskKey;

/// How many data files a rebuild reads at once.
const READ_AHEAD: usize = 8;

/// Rows read per Arrow batch.
const BATCH_ROWS: usize = 8192;

/// How many `commit_timeout`s one rebuild or catch-up may take: it reads manifests and every data file it needs,
/// far more than one catalog call.
const TIMEOUT_FACTOR: u32 = 10;

/// Runs `read` (a [`rebuild`] or [`catch_up`] of `table`'s key index) within `TIMEOUT_FACTOR` × `commit_timeout`.
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) naming the table and the bound when it takes longer (a storage that hangs;
/// a table too large for the bound: raise `commit_timeout`); `read`'s own errors.
pub(crate) async fn within(
    (commit_timeout, phase): (std::time::Duration, Phase),
    table: &Table,
    read: impl std::future::Future<Output = Result<()>>,
) -> Result<()> {
    let bound = commit_timeout * TIMEOUT_FACTOR;
    let timed_out = || {
        format!(
            "reading table {} into the upsert key index took longer than {bound:?} ({TIMEOUT_FACTOR} x \
             commit_timeout): check the storage, or raise commit_timeout for a table this large",
            table.identifier()
        )
    };
    connector_api::bounded(bound, (ErrorKind::Retryable, phase), timed_out, read).await
}

/// Brings `index` up to `table`'s current snapshot: a catch-up when it shows an ancestor and nothing since
/// removed data files, else a rebuild (module docs). `own` is this subtask, whose snapshots are skipped.
///
/// # Errors
/// Retryable storage errors reading manifests, delete files and data files; [`Config`](ErrorKind::Config) for a
/// position-delete file the index cannot read.
pub(crate) async fn catch_up(
    index: &mut KeyIndex,
    table: &Table,
    own: &SubtaskKey,
    phase: Phase,
) -> Result<()> {
    let metadata = table.metadata_ref();
    let committed = own.state(&metadata).checkpoint;
    let current = metadata.current_snapshot_id();
    let Shown::At(shown) = index.shown() else {
        return rebuild(index, table, own, phase).await;
    };
    if current == shown {
        index.caught_up(current, committed);
        return Ok(());
    }
    let steps = match history_since(&metadata, own, shown, Some(&|c| index.knows_compaction(c))) {
        History::Added(steps) => steps,
        History::RemovedDataFiles(_) | History::Unreached => {
            return rebuild(index, table, own, phase).await;
        }
    };
    for step in steps.iter().rev() {
        let snapshot = match step {
            Step::Foreign(snapshot) => snapshot,
            Step::Compacted(checkpoint) => {
                index.apply_compaction(*checkpoint);
                continue;
            }
        };
        let entries = entries_of(table, snapshot, Entries::AddedBySnapshot, phase).await?;
        let deleted = deleted_positions(table, &entries, phase).await?;
        let data = entries
            .iter()
            .filter(|(_, e)| e.content_type() == DataContentType::Data)
            .map(indexed)
            .collect();
        insert_files(index, table, data, &deleted, phase).await?;
    }
    tracing::debug!(table = %table.identifier(), snapshots = steps.len(), keys = index.len(), "key index caught up");
    index.caught_up(current, committed);
    Ok(())
}

/// Rebuilds `index` from `table`'s current snapshot (module docs), then applies this subtask's decided changes
/// the table does not show yet.
///
/// # Errors
/// As [`catch_up`].
pub(crate) async fn rebuild(
    index: &mut KeyIndex,
    table: &Table,
    own: &SubtaskKey,
    phase: Phase,
) -> Result<()> {
    let started = std::time::Instant::now();
    let metadata = table.metadata_ref();
    let committed = own.state(&metadata).checkpoint;
    index.clear();
    let Some(snapshot) = metadata.current_snapshot() else {
        index.finish_rebuild(None, committed);
        return Ok(());
    };
    let entries = entries_of(table, snapshot, Entries::Live, phase).await?;
    let deleted = deleted_positions(table, &entries, phase).await?;
    let mut data: Vec<&(i32, ManifestEntryRef)> = entries
        .iter()
        .filter(|(_, e)| e.content_type() == DataContentType::Data)
        .collect();
    // Oldest first: a key's row in a newer file replaces its row in an older one.
    data.sort_by_key(|(_, e)| e.sequence_number().unwrap_or(0));
    let files = data.len();
    let data = data.into_iter().map(indexed).collect();
    insert_files(index, table, data, &deleted, phase).await?;
    index.finish_rebuild(Some(snapshot.snapshot_id()), committed);
    tracing::info!(
        table = %table.identifier(),
        snapshot = snapshot.snapshot_id(),
        files,
        keys = index.len(),
        bytes = index.heap_bytes(),
        took = ?started.elapsed(),
        "key index rebuilt"
    );
    Ok(())
}

/// A snapshot the catch-up applies.
enum Step {
    /// Another writer's snapshot that added data files and no more.
    Foreign(iceberg::spec::SnapshotRef),
    /// This subtask's snapshot that committed the compaction of this checkpoint.
    Compacted(CheckpointId),
}

/// What the snapshots in a table's history since a snapshot did, as far as the key index is concerned.
enum History {
    /// Other writers' snapshots, none of which removed a data file, and this subtask's compactions whose moves the
    /// index holds, newest first.
    Added(Vec<Step>),
    /// Another writer's snapshot (this id) removed data files.
    RemovedDataFiles(i64),
    /// The history no longer reaches the snapshot (expired, or the table was rolled back).
    Unreached,
}

/// The snapshots of `metadata`'s current history after `since` (`None`: all of it) that `own` did not commit,
/// and, when `known` is given, `own`'s snapshots that removed data files (its compactions): a step when `known`
/// says the index holds that checkpoint's moves, else [`History::RemovedDataFiles`].
fn history_since(
    metadata: &iceberg::spec::TableMetadata,
    own: &SubtaskKey,
    since: Option<i64>,
    known: Option<&dyn Fn(CheckpointId) -> bool>,
) -> History {
    let mut steps = Vec::new();
    let mut cursor = metadata.current_snapshot();
    while let Some(snapshot) = cursor {
        if Some(snapshot.snapshot_id()) == since {
            return History::Added(steps);
        }
        let summary = &snapshot.summary().additional_properties;
        if !own.owns(summary) {
            if removes_data_files(snapshot) {
                return History::RemovedDataFiles(snapshot.snapshot_id());
            }
            steps.push(Step::Foreign(snapshot.clone()));
        } else if let Some(known) = known
            && removes_data_files(snapshot)
        {
            let checkpoint = summary
                .get(crate::ledger::CHECKPOINT_PROPERTY)
                .and_then(|c| c.parse().ok())
                .map(CheckpointId);
            match checkpoint {
                Some(checkpoint) if known(checkpoint) => steps.push(Step::Compacted(checkpoint)),
                _ => return History::RemovedDataFiles(snapshot.snapshot_id()),
            }
        }
        cursor = snapshot
            .parent_snapshot_id()
            .and_then(|parent| metadata.snapshot_by_id(parent));
    }
    match since {
        None => History::Added(steps),
        Some(_) => History::Unreached,
    }
}

/// Why rows located on snapshot `based_on` may no longer be where the key index found them in `base`: another
/// writer's snapshot since removed data files, or the history no longer reaches `based_on`. `None` when every row
/// is still where it was (commit-time check of the position deletes, `commit.rs`). This subtask's own
/// compactions are not such a move: a checkpoint located before one landed also deleted each row's copy
/// ([`crate::compaction_moves`]).
pub(crate) fn moved_rows_since(
    base: &Table,
    own: &SubtaskKey,
    based_on: Option<i64>,
) -> Option<String> {
    match history_since(base.metadata(), own, based_on, None) {
        History::Added(_) => None,
        History::RemovedDataFiles(snapshot) => Some(format!(
            "snapshot {snapshot} of table {} removed data files after the position deletes were written",
            base.identifier()
        )),
        History::Unreached => Some(format!(
            "the history of table {} no longer reaches snapshot {}, on which the position deletes were written",
            base.identifier(),
            based_on.unwrap_or_default()
        )),
    }
}

/// Whether `snapshot` removed data files (so rows may have moved to files the index does not know).
fn removes_data_files(snapshot: &Snapshot) -> bool {
    let summary = snapshot.summary();
    summary.operation == Operation::Replace
        || summary
            .additional_properties
            .get("deleted-data-files")
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n > 0)
}

/// A data file's entry (with its manifest's partition spec) as the index files it, and its size.
fn indexed((spec_id, entry): &(i32, ManifestEntryRef)) -> (Arc<IndexedFile>, u64) {
    let file = IndexedFile {
        path: entry.file_path().to_string(),
        spec_id: *spec_id,
        partition: entry.data_file().partition().clone(),
    };
    (Arc::new(file), entry.file_size_in_bytes())
}

/// Which manifest entries of a snapshot [`entries_of`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entries {
    /// Every live entry (a rebuild).
    Live,
    /// The entries the snapshot itself added, from the manifests it wrote (a catch-up).
    AddedBySnapshot,
    /// The delete files the snapshot itself added (a compaction's check at its commit).
    DeletesAddedBySnapshot,
}

/// The manifest entries of `snapshot` that `which` says, each with its manifest's partition spec.
pub(crate) async fn entries_of(
    table: &Table,
    snapshot: &iceberg::spec::SnapshotRef,
    which: Entries,
    phase: Phase,
) -> Result<Vec<(i32, ManifestEntryRef)>> {
    let read_error = |e| {
        iceberg_error(
            phase,
            format!("cannot read the manifests of table {}", table.identifier()),
            e,
        )
    };
    let id = snapshot.snapshot_id();
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(read_error)?;
    let mut entries = Vec::new();
    for manifest in list.entries().iter().filter(|m| match which {
        Entries::Live => true,
        Entries::AddedBySnapshot => m.added_snapshot_id == id,
        Entries::DeletesAddedBySnapshot => {
            m.content == ManifestContentType::Deletes && m.added_snapshot_id == id
        }
    }) {
        let manifest = manifest
            .load_manifest(table.file_io())
            .await
            .map_err(read_error)?;
        let spec_id = manifest.metadata().partition_spec().spec_id();
        entries.extend(
            manifest
                .entries()
                .iter()
                .filter(|e| match which {
                    Entries::Live => e.is_alive(),
                    Entries::AddedBySnapshot | Entries::DeletesAddedBySnapshot => {
                        e.status() == ManifestStatus::Added && e.snapshot_id() == Some(id)
                    }
                })
                .map(|e| (spec_id, e.clone())),
        );
    }
    Ok(entries)
}

/// The positions the position-delete files and deletion vectors among `entries` delete, per data file path
/// (sorted).
///
/// # Errors
/// [`Config`](ErrorKind::Config) for a position-delete file in a format other than Parquet and Puffin; storage
/// errors; a deletion vector that does not decode.
pub(crate) async fn deleted_positions(
    table: &Table,
    entries: &[(i32, ManifestEntryRef)],
    phase: Phase,
) -> Result<HashMap<String, Vec<u64>>> {
    let mut deleted: HashMap<String, Vec<u64>> = HashMap::new();
    for (_, entry) in entries
        .iter()
        .filter(|(_, e)| e.content_type() == DataContentType::PositionDeletes)
    {
        for (path, positions) in positions_of(table, entry.data_file(), phase).await? {
            deleted.entry(path).or_default().extend(positions);
        }
    }
    for positions in deleted.values_mut() {
        positions.sort_unstable();
    }
    Ok(deleted)
}

/// The positions one position-delete file or deletion vector deletes, per data file path (unsorted).
///
/// # Errors
/// As [`deleted_positions`].
pub(crate) async fn positions_of(
    table: &Table,
    file: &iceberg::spec::DataFile,
    phase: Phase,
) -> Result<HashMap<String, Vec<u64>>> {
    let mut deleted: HashMap<String, Vec<u64>> = HashMap::new();
    if crate::deletion_vectors::is_deletion_vector(file)
        && let Some(data_file) = file.referenced_data_file()
    {
        let positions = crate::deletion_vectors::read(table, file)
            .await
            .map_err(|e| {
                iceberg_error(
                    phase,
                    format!("cannot read deletion vector {}", file.file_path()),
                    e,
                )
            })?;
        deleted.entry(data_file).or_default().extend(positions);
        return Ok(deleted);
    }
    if file.file_format() != DataFileFormat::Parquet {
        return Err(Error::new(
            ErrorKind::Config,
            phase,
            format!(
                "table {} has a {:?} position-delete file ({}), which the key index cannot read; set \
                 upsert_deletes = \"equality\"",
                table.identifier(),
                file.file_format(),
                file.file_path()
            ),
        ));
    }
    let path_id = iceberg::metadata_columns::RESERVED_FIELD_ID_DELETE_FILE_PATH;
    let pos_id = iceberg::metadata_columns::RESERVED_FIELD_ID_DELETE_FILE_POS;
    let batches = read_columns(
        table,
        file.file_path(),
        file.file_size_in_bytes(),
        &[path_id, pos_id],
        &["file_path", "pos"],
        phase,
    )
    .await?;
    for batch in batches {
        let paths =
            arrow_cast::cast(batch.column(0), &arrow_schema::DataType::Utf8).map_err(|e| {
                Error::bug(phase, "cannot read a position-delete file's paths").with_source(e)
            })?;
        let paths = paths
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("cast to Utf8");
        let positions = batch
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Fatal,
                    phase,
                    format!(
                        "position-delete file {} has a `pos` column that is not a long",
                        file.file_path()
                    ),
                )
            })?;
        for (path, pos) in paths.iter().zip(positions.iter()) {
            if let (Some(path), Some(pos)) = (path, pos) {
                deleted
                    .entry(path.to_string())
                    .or_default()
                    .push(pos as u64);
            }
        }
    }
    Ok(deleted)
}

/// Reads the key columns of `files` (path, size), [`READ_AHEAD`] at a time, and inserts each row not in
/// `deleted`, in the order given.
async fn insert_files(
    index: &mut KeyIndex,
    table: &Table,
    files: Vec<(Arc<IndexedFile>, u64)>,
    deleted: &HashMap<String, Vec<u64>>,
    phase: Phase,
) -> Result<()> {
    let key_schema = index.key_schema().clone();
    let ids: Vec<i32> = key_schema
        .fields()
        .iter()
        .map(|f| field_id(f).unwrap_or(-1))
        .collect();
    let names: Vec<&str> = key_schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    let mut reads = futures::stream::iter(files.into_iter().map(|(file, size)| {
        let (ids, names) = (&ids, &names);
        async move {
            let batches = read_columns(table, &file.path, size, ids, names, phase).await?;
            Ok::<_, Error>((file, batches))
        }
    }))
    .buffered(READ_AHEAD);
    while let Some((file, batches)) = reads.try_next().await? {
        let path = file.path.as_str();
        let gone = deleted.get(path).map(Vec::as_slice).unwrap_or_default();
        let mut pos = 0u64;
        for batch in batches {
            let columns = batch
                .columns()
                .iter()
                .zip(key_schema.fields())
                .map(|(column, field)| {
                    arrow_cast::cast(column, field.data_type()).map_err(|e| {
                        Error::new(
                            ErrorKind::Fatal,
                            phase,
                            format!("data file {path} holds key column {:?} in a type the table's cannot take", field.name()),
                        )
                        .with_source(e)
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let keys = RecordBatch::try_new(key_schema.clone(), columns).map_err(|e| {
                Error::new(
                    ErrorKind::Fatal,
                    phase,
                    format!("data file {path} holds a null key"),
                )
                .with_source(e)
            })?;
            let rows = index.encode(&keys)?;
            for row in rows.iter() {
                if gone.binary_search(&pos).is_err() {
                    index.insert(row.as_ref(), &file, pos);
                }
                pos += 1;
            }
        }
    }
    Ok(())
}

/// The Iceberg field id an Arrow field of the table's schema carries.
fn field_id(field: &arrow_schema::Field) -> Option<i32> {
    field
        .metadata()
        .get(PARQUET_FIELD_ID_META_KEY)?
        .parse()
        .ok()
}

/// The top-level columns of Parquet file `path` with field ids `ids` (by `names` in a file without field ids), in
/// that order, every row in file order.
pub(crate) async fn read_columns(
    table: &Table,
    path: &str,
    size: u64,
    ids: &[i32],
    names: &[&str],
    phase: Phase,
) -> Result<Vec<RecordBatch>> {
    let read_error = |e: parquet::errors::ParquetError| {
        Error::new(
            ErrorKind::Retryable,
            phase,
            format!("cannot read data file {path}"),
        )
        .with_source(e)
    };
    let input = table
        .file_io()
        .new_input(path)
        .map_err(|e| iceberg_error(phase, format!("cannot open {path}"), e))?;
    let reader = input
        .reader()
        .await
        .map_err(|e| iceberg_error(phase, format!("cannot open {path}"), e))?;
    let builder =
        ParquetRecordBatchStreamBuilder::new(ArrowFileReader::new(FileMetadata { size }, reader))
            .await
            .map_err(read_error)?;
    let schema = builder.parquet_schema();
    let leaf_of = |id: i32, name: &str| {
        let top_level = |i: &usize| schema.column(*i).path().parts().len() == 1;
        (0..schema.num_columns())
            .filter(top_level)
            .find(|i| {
                let info = schema.column(*i).self_type().get_basic_info().clone();
                info.has_id() && info.id() == id
            })
            .or_else(|| {
                (0..schema.num_columns())
                    .filter(top_level)
                    .find(|i| schema.column(*i).name() == name)
            })
    };
    let leaves = ids
        .iter()
        .zip(names)
        .map(|(id, name)| {
            leaf_of(*id, name).ok_or_else(|| {
                Error::new(
                    ErrorKind::Fatal,
                    phase,
                    format!("file {path} has no column {name:?} (field id {id})"),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mask = ProjectionMask::leaves(schema, leaves.iter().copied());
    let stream = builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(read_error)?;
    let batches: Vec<RecordBatch> = stream.try_collect().await.map_err(read_error)?;
    // The projection yields the columns in file order; put them in the order asked for.
    let mut sorted = leaves.clone();
    sorted.sort_unstable();
    let order: Vec<usize> = leaves
        .iter()
        .map(|leaf| sorted.binary_search(leaf).expect("a projected leaf"))
        .collect();
    batches
        .into_iter()
        .map(|batch| {
            let columns = order.iter().map(|&i| batch.column(i).clone()).collect();
            let fields: Vec<_> = order
                .iter()
                .map(|&i| batch.schema().field(i).clone())
                .collect();
            RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), columns)
                .map_err(|e| Error::bug(phase, "cannot reorder the columns read").with_source(e))
        })
        .collect()
}
