//! A compaction's look and rewrite inside the sink's commits, for append and upsert tables alike: at a
//! pre-commit, this subtask's small data files ([`crate::compaction`]'s choice and grouping) and one of its files
//! of any size whose deletes are due (`delete_ratio_threshold`, `delete_file_threshold`) are rewritten without their deleted rows, and the
//! checkpoint's snapshot replaces them by the outputs ([`crate::replace`]). Each rule below is a way to lose or
//! resurrect a row if skipped:
//!
//! 1. **The deletes are applied.** The inputs are read at the current snapshot (`read_at`) minus every row its
//!    position-delete files name (the sink's own on an upsert table, another writer's on any table: Spark's
//!    merge-on-read `DELETE` on an append table); an input an equality delete of a higher sequence number may
//!    reach is not taken (the rewrite would not apply it). A file all of whose rows are deleted is removed with no
//!    output.
//! 2. **No file a pending checkpoint deletes from** (upsert tables). The rows a decided checkpoint the table does
//!    not show yet deletes are not deleted at `read_at`: their files are left out
//!    ([`KeyIndex::busy_besides_staged`]), as are the files an earlier compaction not yet shown rewrites. The rows
//!    the checkpoint being pre-committed deletes are dropped from the outputs as well
//!    ([`KeyIndex::staged_deletes`]), since its delete file lands in the same snapshot (on a table of deletion
//!    vectors the commit leaves out its vectors of the files the snapshot removes instead of merging them with
//!    the files' own: `commit.rs`, `ChosenDeletes::without_vectors_of`).
//! 3. **Validated at the commit.** A delete file added since `read_at` that may reach an input (another subtask
//!    after a rescale, Spark's `DELETE`, an equality delete) drops the compaction, as does a history that no
//!    longer reaches `read_at` or a commit that falls back to equality deletes ([`crate::rewrite_conflicts`]).
//! 4. **The key index follows** (upsert tables). Each copied row's key and places are recorded ([`Moves`]); the
//!    index points the keys at the copies once the table shows the compaction, and until then a later
//!    checkpoint's position delete of a copied row also deletes its copy, so either end of the commit is right.
//! 5. **Dangling deletes go with their files.** A position-delete file that names only inputs and files no longer
//!    live is removed by the same snapshot, so delete files do not pile up as data files are rewritten.
//!
//! # Files with many deletes
//! A file of any size outside this look's groups is rewritten when at least `delete_ratio_threshold` of its rows
//! are deleted or at least `delete_file_threshold` delete files name it (the largest deleted share among those,
//! one per look). Without the second rule a small file's deletes would pile up until its size tier fills: an
//! upsert table at 1 s checkpoints gains a position-delete file per checkpoint, and every reader opens each. Which
//! files to check is decided without reading every delete file: on an upsert table by the key index (a file's rows
//! that no key points at any more), on an append table by the position-delete files whose bounds may name it; the
//! share and the count are then taken from the delete files themselves.
//!
//! # Failure cases
//! A rewrite that fails or outlasts `commit_timeout` is skipped with a warning ([`within_or_skip`]), an input or
//! removed delete file no longer live at the commit drops the compaction, a crash leaves it to recovery in the
//! checkpoint's committable.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use arrow_array::UInt32Array;
use connector_api::{Error, ErrorKind, Phase, Result};
use futures::TryStreamExt;
use iceberg::spec::{DataContentType, DataFile, FormatVersion};
use iceberg::table::Table;

use crate::commit::TableTarget;
use crate::committable::{CompactedFiles, encode_files};
use crate::compact_policy::CompactPolicy;
use crate::compaction::{OwnFile, OwnFileCache, groups, read, scan_task, within_or_skip};
use crate::compaction_lineage::InputLineage;
use crate::compaction_moves::Moves;
use crate::error::iceberg_error;
use crate::key_index::{IndexedFile, KeyIndex};
use crate::key_scan::positions_of;
use crate::ledger::SubtaskKey;
use crate::location::canonical;
use crate::rewrite_conflicts::may_name;
use crate::writer::{CheckpointWriter, key_columns};

/// A compaction: what the checkpoint's committable carries, and (an upsert table's) where the rows went.
#[derive(Debug)]
pub(crate) struct Compaction {
    pub(crate) files: CompactedFiles,
    pub(crate) moves: Moves,
}

/// Looks for this subtask's small files and files with many deleted rows in the table as committed now, leaving
/// out `index`'s busy files (an upsert table's key index; `None` for an append table), and rewrites those due
/// without their deleted rows into files named `<file_prefix><g>-<n>.parquet`, within `commit_timeout` (`None`
/// when nothing is due, and when anything fails: logged as a warning).
pub(crate) async fn compact(
    target: &TableTarget,
    key: &SubtaskKey,
    (policy, cache): (&CompactPolicy, &mut OwnFileCache),
    index: Option<&KeyIndex>,
    file_prefix: String,
) -> Option<Compaction> {
    let work = async {
        let table = target.load(Phase::PreCommit).await?;
        let Some(snapshot) = table.metadata().current_snapshot() else {
            return Ok(None);
        };
        let lineage = table.metadata().format_version() == FormatVersion::V3;
        let own = cache
            .own_files(&table, key, policy)
            .await
            .map_err(|e| iceberg_error(Phase::PreCommit, "cannot list this subtask's files", e))?;
        let newest_equality = own
            .deletes
            .iter()
            .filter(|e| e.content_type() == DataContentType::EqualityDeletes)
            .filter_map(|e| e.sequence_number())
            .max();
        // The rows the checkpoint being pre-committed deletes. A file only that checkpoint deletes from may be
        // taken: the rewrite drops those rows too, so the checkpoint's delete file, committed by the same snapshot,
        // deletes nothing the outputs hold (its deletion vector of the file is left out by the commit). Otherwise a
        // file every checkpoint deletes from (keys replaced in the order they were written) would never be
        // rewritten while its delete files pile up.
        let (busy, staged) = match index {
            Some(index) => (index.busy_besides_staged(), index.staged_deletes()),
            None => (HashSet::new(), HashMap::new()),
        };
        let busy: HashSet<String> = busy.iter().map(|p| canonical(p)).collect();
        // On a version 3 table a file without a first_row_id (added before the upgrade) is left alone: its rows'
        // lineage is not known.
        let takeable = |s: &OwnFile| {
            !busy.contains(&canonical(s.file.file_path()))
                && newest_equality.is_none_or(|equality| s.sequence >= equality)
                && (!lineage || s.first_row_id.is_some())
        };
        let candidates: Vec<OwnFile> = own.small.iter().filter(|s| takeable(s)).cloned().collect();
        let position_deletes: Vec<&DataFile> = own
            .deletes
            .iter()
            .map(|e| e.data_file())
            .filter(|f| f.content_type() == DataContentType::PositionDeletes)
            .collect();
        let with_deletes = maybe_deleted_from(
            own.small
                .into_iter()
                .chain(own.large)
                .filter(takeable)
                .collect(),
            index,
            &position_deletes,
        );
        if candidates.is_empty() && with_deletes.is_empty() {
            return Ok(None);
        }
        let paths: BTreeSet<String> = candidates
            .iter()
            .chain(&with_deletes)
            .map(|s| canonical(s.file.file_path()))
            .collect();
        // The positions deleted in the files looked at, and the data files each delete file naming one names. A
        // Puffin file holds the deletion vectors of several data files, one entry each: every entry of such a file
        // counts (it is removed whole or not at all), read or not.
        let mut deleted: HashMap<String, Vec<u64>> = HashMap::new();
        let mut delete_files: HashMap<String, usize> = HashMap::new();
        let mut naming: BTreeMap<String, Vec<String>> = BTreeMap::new();
        // The data files a delete file may still name: the live ones, and those about to be (a pending
        // compaction's outputs).
        let live: BTreeSet<String> = cache
            .live_paths()
            .into_iter()
            .map(str::to_string)
            .chain(busy.iter().cloned())
            .collect();
        for file in &position_deletes {
            let names = naming.entry(file.file_path().to_string()).or_default();
            if !may_name(file, &paths) {
                if crate::deletion_vectors::is_deletion_vector(file) {
                    names.extend(file.referenced_data_file().map(|p| canonical(&p)));
                } else if may_name(file, &live) {
                    names.push(String::new());
                }
                // Otherwise its bounds hold no live file: every file it named is gone (rewritten by a compaction
                // that committed it, or removed by another writer), it deletes nothing, and it goes unread.
                continue;
            }
            let mut named = BTreeSet::new();
            for (path, positions) in positions_of(&table, file, Phase::PreCommit).await? {
                let path = canonical(&path);
                if paths.contains(&path) {
                    deleted.entry(path.clone()).or_default().extend(positions);
                    if named.insert(path.clone()) {
                        *delete_files.entry(path.clone()).or_default() += 1;
                    }
                }
                names.push(path);
            }
        }
        for (path, positions) in staged {
            let path = canonical(&path);
            if paths.contains(&path) {
                deleted.entry(path).or_default().extend(positions);
            }
        }
        for positions in deleted.values_mut() {
            positions.sort_unstable();
            positions.dedup();
        }
        let deleted_rows = |s: &OwnFile| {
            deleted
                .get(&canonical(s.file.file_path()))
                .map_or(0, Vec::len) as u64
        };
        let delete_files_of = |s: &OwnFile| {
            delete_files
                .get(&canonical(s.file.file_path()))
                .copied()
                .unwrap_or(0)
        };
        let mut chosen = groups(candidates, policy);
        let grouped: HashSet<String> = chosen
            .iter()
            .flatten()
            .map(|s| s.file.file_path().to_string())
            .collect();
        let ungrouped = with_deletes
            .into_iter()
            .filter(|s| !grouped.contains(s.file.file_path()));
        // A file whose every row is deleted is removed whatever its size or tier (nothing to rewrite); of the
        // others, the one with the largest deleted share among those due is rewritten.
        let (dead, deleted_from): (Vec<OwnFile>, Vec<OwnFile>) =
            ungrouped.partition(|s| deleted_rows(s) >= s.file.record_count());
        let share = |s: &OwnFile| deleted_rows(s) as f64 / s.file.record_count().max(1) as f64;
        let heaviest = deleted_from
            .into_iter()
            .filter(|s| {
                policy.deletes_due(s.file.record_count(), deleted_rows(s), delete_files_of(s))
            })
            .max_by(|a, b| {
                share(a)
                    .total_cmp(&share(b))
                    .then(delete_files_of(a).cmp(&delete_files_of(b)))
            });
        chosen.extend(heaviest.map(|s| vec![s]));
        if chosen.is_empty() && dead.is_empty() {
            return Ok(None);
        }
        let inputs: BTreeSet<String> = chosen
            .iter()
            .flatten()
            .chain(&dead)
            .map(|s| canonical(s.file.file_path()))
            .collect();
        // Delete files that name only inputs and files no longer live (nor about to be) go with the inputs; one
        // not read that may name a live file (an empty name) stays.
        let dangling: Vec<String> = naming
            .into_iter()
            .filter(|(_, names)| {
                names
                    .iter()
                    .all(|p| !p.is_empty() && (inputs.contains(p) || !live.contains(p)))
            })
            .map(|(path, _)| path)
            .collect();
        let mut moves = Moves::default();
        let mut outputs = Vec::new();
        let mut manifests: BTreeSet<String> = dead.iter().map(|s| s.manifest.clone()).collect();
        for file in &dead {
            moves.input(file.file.file_path());
        }
        for (g, group) in chosen.into_iter().enumerate() {
            outputs.extend(
                rewrite_live(
                    (&table, lineage),
                    index,
                    &group,
                    &deleted,
                    (format!("{file_prefix}{g}"), policy.target_file_size),
                    &mut moves,
                )
                .await?,
            );
            manifests.extend(group.into_iter().map(|s| s.manifest));
        }
        crate::retire::drill("after-compacting");
        tracing::debug!(
            table = %target.table,
            subtask = %key.subtask,
            inputs = moves.inputs().len(),
            rows = moves.len(),
            dangling_deletes = dangling.len(),
            "compacted this subtask's files"
        );
        Ok::<_, Error>(Some(Compaction {
            files: CompactedFiles {
                inputs: moves.inputs().to_vec(),
                outputs: encode_files(&table, outputs)?,
                manifests: manifests.into_iter().collect(),
                read_at: Some(snapshot.snapshot_id()),
                deletes: dangling,
            },
            moves,
        }))
    };
    within_or_skip(target, key, work).await
}

/// The files of `files` some of whose rows may be deleted: those with fewer rows than `index`'s keys point at (an
/// upsert table), or, without an index, those some position-delete file of `position_deletes` may name. The
/// caller counts the deleted rows and the delete files naming each from the delete files themselves.
fn maybe_deleted_from(
    files: Vec<OwnFile>,
    index: Option<&KeyIndex>,
    position_deletes: &[&DataFile],
) -> Vec<OwnFile> {
    if files.is_empty() || position_deletes.is_empty() {
        return Vec::new();
    }
    match index {
        Some(index) => {
            let live = index.rows_per_file();
            files
                .into_iter()
                .filter(|s| {
                    let indexed = live.get(&canonical(s.file.file_path())).copied();
                    indexed.unwrap_or(0) < s.file.record_count()
                })
                .collect()
        }
        None => files
            .into_iter()
            .filter(|s| {
                let path = BTreeSet::from([canonical(s.file.file_path())]);
                position_deletes.iter().any(|d| may_name(d, &path))
            })
            .collect(),
    }
}

/// Rewrites `group` (live data files of one partition of the default spec) without the rows `deleted` names
/// (sorted positions per canonical path) into files named `<prefix>-<n>.parquet` of about `target_file_size`,
/// recording every input in `moves` and, with `index` (an upsert table's), every copied row; with `lineage` (a
/// format-version 3 table) each row keeps its `_row_id` and `_last_updated_sequence_number`
/// ([`InputLineage`]). Returns the files written.
///
/// # Errors
/// A file that cannot be read or written, or a row count that does not add up (the caller drops the compaction).
async fn rewrite_live(
    (table, lineage): (&Table, bool),
    index: Option<&KeyIndex>,
    group: &[OwnFile],
    deleted: &HashMap<String, Vec<u64>>,
    (file_prefix, target_file_size): (String, u64),
    moves: &mut Moves,
) -> Result<Vec<DataFile>> {
    let name = table.identifier().to_string();
    let spec_id = table.metadata().default_partition_spec_id();
    let size = usize::try_from(target_file_size).unwrap_or(usize::MAX);
    let mut writer = match lineage {
        true => CheckpointWriter::open_keeping_lineage(table, file_prefix, size).await?,
        false => CheckpointWriter::open(table, file_prefix, size).await?,
    };
    let mut outputs: HashMap<String, Arc<IndexedFile>> = HashMap::new();
    let mut expected = 0u64;
    let read_error = |e| iceberg_error(Phase::PreCommit, "cannot read a file to compact", e);
    for small in group {
        let path = small.file.file_path();
        let input = moves.input(path);
        let gone = deleted
            .get(&canonical(path))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let rows = small.file.record_count();
        if gone.len() as u64 >= rows {
            continue;
        }
        expected += rows - gone.len() as u64;
        let input_lineage = match lineage {
            true => Some(InputLineage::read(table, small).await?),
            false => None,
        };
        let mut batches = read(table, vec![Ok(scan_task(table, &small.file))])?;
        let mut pos = 0u64;
        while let Some(batch) = batches.try_next().await.map_err(read_error)? {
            let n = batch.num_rows() as u64;
            let kept: Vec<u64> = (pos..pos + n)
                .filter(|p| gone.binary_search(p).is_err())
                .collect();
            let batch = match kept.len() as u64 == n {
                true => batch,
                false => {
                    let take = UInt32Array::from_iter_values(kept.iter().map(|p| (p - pos) as u32));
                    arrow_select::take::take_record_batch(&batch, &take).map_err(|e| {
                        Error::bug(Phase::PreCommit, "cannot drop the deleted rows").with_source(e)
                    })?
                }
            };
            pos += n;
            let batch = match &input_lineage {
                Some(lineage) => lineage.append(&batch, &kept)?,
                None => batch,
            };
            let mut from = kept.into_iter();
            if batch.num_rows() == 0 {
                continue;
            }
            let Some(index) = index else {
                writer.write(&batch).await?;
                continue;
            };
            for located in writer.write_located(&batch).await? {
                let file = outputs
                    .entry(located.file.clone())
                    .or_insert_with(|| {
                        Arc::new(IndexedFile {
                            path: located.file.clone(),
                            spec_id,
                            partition: located.partition.clone(),
                        })
                    })
                    .clone();
                let keys = index.encode(&key_columns(&name, index.key_schema(), &located.rows)?)?;
                for (i, key) in keys.iter().enumerate() {
                    let from = from.next().ok_or_else(|| {
                        Error::bug(
                            Phase::PreCommit,
                            "a compaction wrote more rows than it read",
                        )
                    })?;
                    moves.record(
                        key.as_ref(),
                        (input, from),
                        (&file, located.start + i as u64),
                    );
                }
            }
        }
        if pos != rows {
            return Err(Error::new(
                ErrorKind::Bug,
                Phase::PreCommit,
                format!(
                    "data file {path} lists {rows} rows but {pos} were read; the compaction is dropped"
                ),
            ));
        }
    }
    let written = writer.close().await?;
    let out: u64 = written.iter().map(DataFile::record_count).sum();
    if out != expected {
        return Err(Error::new(
            ErrorKind::Bug,
            Phase::PreCommit,
            format!(
                "compacting {} files with {expected} live rows wrote {out} rows; the compaction is dropped",
                group.len()
            ),
        ));
    }
    Ok(written)
}
