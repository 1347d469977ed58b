//! Compaction inside the sink's commits (the job file's `compact = { target_file_size = "128MB",
//! min_input_files = 8 }`): at a pre-commit, small data files this subtask wrote are rewritten into one larger file
//! per group, and the checkpoint's snapshot both adds the checkpoint's files and replaces the group's files by the
//! rewritten one ([`crate::replace`]), through the same guarded commit as every checkpoint. This module chooses
//! the files and reads them; [`crate::live_compaction`] rewrites them without their deleted rows.
//!
//! # Which files
//! Live data files of the current snapshot, in the table's default partition spec, named by this subtask
//! ([`SubtaskKey::file_stamp`]: another subtask's or another engine's files are never touched, so subtasks never
//! race each other for a file), smaller than ¾ of `target_file_size` (Iceberg's default `min-file-size-bytes`).
//! They are grouped by partition and by size tier (sizes within a factor `min_input_files` of each other): a tier
//! holding at least `min_input_files` files is rewritten, smallest first, up to `target_file_size` of input. So a
//! byte is rewritten about once per tier (a handful of times up to the target), never once per checkpoint, and a
//! partition holds at most about `min_input_files` files per tier. One pre-commit rewrites at most
//! `target_file_size` of input; a backlog is worked off over the following checkpoints. Besides, one file of this
//! subtask of any size whose deleted rows reach `delete_ratio_threshold`, or that `delete_file_threshold` delete
//! files name, is rewritten per look ([`crate::live_compaction`]).
//!
//! # Failure cases
//! - The rewrite fails or outlasts `commit_timeout` (storage down, a file gone): logged as a warning, the
//!   checkpoint goes on without compaction (its rows are unaffected); the partial outputs carry this subtask's
//!   name and are deleted by its next recovery's cleanup.
//! - A group's file is no longer live when the snapshot is committed (a foreign rewrite, Spark's
//!   `rewrite_data_files`, or an overwrite removed it since): that attempt drops the compaction and commits the
//!   checkpoint's files alone; the outputs are deleted. A row is never lost (the inputs stay until a snapshot
//!   replaces them all) nor doubled (the outputs are added only by the snapshot that removes every input).
//! - An output is gone before the commit (a foreign orphan removal with a short cut-off): the compaction is
//!   dropped the same way.
//! - A crash anywhere: the compaction rides in the checkpoint's committable; recovery commits it by the same rules
//!   or drops it.

use std::collections::{BTreeMap, HashMap, HashSet};

use connector_api::{CheckpointId, Phase, Result};
use iceberg::arrow::ArrowReaderBuilder;
use iceberg::scan::FileScanTask;
use iceberg::spec::{
    DataContentType, DataFile, DataFileFormat, ManifestContentType, ManifestEntryRef,
};
use iceberg::table::Table;

use crate::commit::TableTarget;
use crate::compact_policy::CompactPolicy;
use crate::error::iceberg_error;
use crate::ledger::SubtaskKey;
use crate::location::canonical;
use crate::row_lineage::RowIdInheritance;

/// A live data file this subtask wrote (in the default spec, Parquet), the manifest of the current snapshot that
/// lists it, its data sequence number and (format version 3) its `first_row_id`, inherited or its own.
#[derive(Debug, Clone)]
pub(crate) struct OwnFile {
    pub(crate) file: DataFile,
    pub(crate) manifest: String,
    pub(crate) sequence: i64,
    pub(crate) first_row_id: Option<i64>,
}

/// What one data manifest lists: this subtask's files of the default spec (with their data sequence numbers) and
/// every live data file's path.
#[derive(Debug, Default)]
struct ManifestFiles {
    /// This subtask's files: the file, its data sequence number and its `first_row_id`.
    own: Vec<(DataFile, i64, Option<i64>)>,
    live: Vec<String>,
}

/// This subtask's live files, split by [`CompactPolicy::small_below`], and every live delete file of the table.
#[derive(Debug, Default)]
pub(crate) struct OwnFiles {
    pub(crate) small: Vec<OwnFile>,
    pub(crate) large: Vec<OwnFile>,
    pub(crate) deletes: Vec<ManifestEntryRef>,
}

/// This subtask's files per data manifest and the live delete files per delete manifest, each manifest read once
/// (a manifest never changes once written): a look reads only the manifests committed since the last one.
#[derive(Debug, Default)]
pub(crate) struct OwnFileCache {
    by_manifest: HashMap<String, ManifestFiles>,
    deletes_by_manifest: HashMap<String, Vec<ManifestEntryRef>>,
}

impl OwnFileCache {
    /// The live data files of `table`'s current snapshot that `key`'s subtask wrote, in the default partition spec,
    /// each with its manifest, split into those `policy` calls small and the others; and every live delete file.
    ///
    /// # Errors
    /// A manifest list or manifest that cannot be read.
    pub(crate) async fn own_files(
        &mut self,
        table: &Table,
        key: &SubtaskKey,
        policy: &CompactPolicy,
    ) -> iceberg::Result<OwnFiles> {
        let metadata = table.metadata();
        let mut own = OwnFiles::default();
        let Some(snapshot) = metadata.current_snapshot() else {
            return Ok(own);
        };
        let spec_id = metadata.default_partition_spec_id();
        let list = table.manifest_list_reader(snapshot).load().await?;
        let mut current = HashSet::new();
        for manifest in list.entries() {
            let path = &manifest.manifest_path;
            current.insert(path.clone());
            if manifest.content == ManifestContentType::Deletes {
                if !self.deletes_by_manifest.contains_key(path) {
                    let loaded = manifest.load_manifest(table.file_io()).await?;
                    let live = loaded.entries().iter().filter(|e| e.is_alive()).cloned();
                    self.deletes_by_manifest
                        .insert(path.clone(), live.collect());
                }
                own.deletes
                    .extend(self.deletes_by_manifest[path].iter().cloned());
                continue;
            }
            if !self.by_manifest.contains_key(path) {
                let loaded = manifest.load_manifest(table.file_io()).await?;
                // Every entry, deleted ones too, takes its share of the inherited row ids.
                let mut row_ids = RowIdInheritance::of(manifest);
                let mut files = ManifestFiles::default();
                for entry in loaded.entries() {
                    let file = entry.data_file();
                    let first_row_id = row_ids.first_row_id(file);
                    if !entry.is_alive() {
                        continue;
                    }
                    files.live.push(canonical(file.file_path()));
                    if manifest.partition_spec_id == spec_id
                        && file.content_type() == DataContentType::Data
                        && file.file_format() == DataFileFormat::Parquet
                        && key.file_stamp(file.file_path()).is_some()
                    {
                        let sequence = entry.sequence_number().unwrap_or(0);
                        files.own.push((file.clone(), sequence, first_row_id));
                    }
                }
                self.by_manifest.insert(path.clone(), files);
            }
            for (file, sequence, first_row_id) in &self.by_manifest[path].own {
                let listed = OwnFile {
                    file: file.clone(),
                    manifest: path.clone(),
                    sequence: *sequence,
                    first_row_id: *first_row_id,
                };
                match file.file_size_in_bytes() < policy.small_below() {
                    true => own.small.push(listed),
                    false => own.large.push(listed),
                }
            }
        }
        self.by_manifest.retain(|path, _| current.contains(path));
        self.deletes_by_manifest
            .retain(|path, _| current.contains(path));
        Ok(own)
    }

    /// Every live data file's path (canonical) in the manifests the last [`own_files`](Self::own_files) read.
    pub(crate) fn live_paths(&self) -> HashSet<&str> {
        self.by_manifest
            .values()
            .flat_map(|m| m.live.iter().map(String::as_str))
            .collect()
    }
}

/// The groups of `files` (small data files of one spec) to rewrite now by `policy`: per partition and size tier,
/// the smallest files of a tier holding at least `min_input_files`, up to `target_file_size` of input per group
/// and in all. Lower tiers first.
pub(crate) fn groups(files: Vec<OwnFile>, policy: &CompactPolicy) -> Vec<Vec<OwnFile>> {
    let mut tiers: BTreeMap<(u32, String), Vec<OwnFile>> = BTreeMap::new();
    for small in files {
        let tier = policy.tier(small.file.file_size_in_bytes());
        // Struct is not Ord: its debug form orders partitions deterministically.
        let partition = format!("{:?}", small.file.partition());
        tiers.entry((tier, partition)).or_default().push(small);
    }
    let mut budget = policy.target_file_size;
    let mut chosen = Vec::new();
    for (_, mut files) in tiers {
        if files.len() < policy.min_input_files {
            continue;
        }
        let order = |s: &OwnFile| (s.file.file_size_in_bytes(), s.file.file_path().to_string());
        files.sort_by_key(order);
        let mut group = Vec::new();
        let mut size = 0;
        for small in files {
            let bytes = small.file.file_size_in_bytes();
            if size + bytes > budget {
                break;
            }
            size += bytes;
            group.push(small);
        }
        if group.len() < 2 {
            continue;
        }
        budget = budget.saturating_sub(size);
        chosen.push(group);
        if budget == 0 {
            break;
        }
    }
    chosen
}

/// A task reading every row of `file` (a Parquet data file of `table`) in file order, in the table's current
/// schema (columns added since the file was written read as nulls, widened ones widened, as every Iceberg
/// reader reads them), without applying any delete.
pub(crate) fn scan_task(table: &Table, file: &DataFile) -> FileScanTask {
    let schema = table.metadata().current_schema().clone();
    let field_ids: Vec<i32> = schema.as_struct().fields().iter().map(|f| f.id).collect();
    FileScanTask::builder()
        .with_file_size_in_bytes(file.file_size_in_bytes())
        .with_start(0)
        .with_length(file.file_size_in_bytes())
        .with_record_count(Some(file.record_count()))
        .with_data_file_path(file.file_path().to_string())
        .with_data_file_format(DataFileFormat::Parquet)
        .with_schema(schema)
        .with_project_field_ids(field_ids)
        .with_case_sensitive(true)
        .build()
}

/// The rows of `tasks`, read by iceberg's Arrow reader.
///
/// # Errors
/// A file that cannot be opened.
pub(crate) fn read(
    table: &Table,
    tasks: Vec<iceberg::Result<FileScanTask>>,
) -> Result<iceberg::scan::ArrowRecordBatchStream> {
    let reader =
        ArrowReaderBuilder::new(table.file_io().clone(), iceberg::Runtime::current()).build();
    Ok(reader
        .read(Box::pin(futures::stream::iter(tasks)))
        .map_err(|e| iceberg_error(Phase::PreCommit, "cannot read the files to compact", e))?
        .stream())
}

/// Runs `work` (a compaction's pre-commit) within the target's `commit_timeout`; `None` when it finds nothing to
/// do, fails or outlasts the bound (logged as a warning: the checkpoint goes on without compaction; what was
/// written carries the checkpoint's stamp, and recovery's cleanup deletes it).
pub(crate) async fn within_or_skip<T>(
    target: &TableTarget,
    key: &SubtaskKey,
    work: impl std::future::Future<Output = Result<Option<T>>>,
) -> Option<T> {
    match tokio::time::timeout(target.commit_timeout, work).await {
        Ok(Ok(compacted)) => compacted,
        Ok(Err(e)) => {
            tracing::warn!(
                table = %target.table,
                subtask = %key.subtask,
                error = %e,
                "compacting small files failed; this checkpoint is committed without compaction"
            );
            None
        }
        Err(_) => {
            tracing::warn!(
                table = %target.table,
                subtask = %key.subtask,
                timeout = ?target.commit_timeout,
                "compacting small files took longer than commit_timeout; this checkpoint is committed without \
                 compaction"
            );
            None
        }
    }
}

/// The prefix of the files compacting at `checkpoint` under `epoch` writes: this subtask's checkpoint stamp, so
/// cleanup and abort treat them as the checkpoint's files.
pub(crate) fn file_prefix(key: &SubtaskKey, epoch: u64, checkpoint: CheckpointId) -> String {
    format!("{}e{epoch}.c{checkpoint}-compacted", key.file_prefix())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, size: u64, partition: i32) -> OwnFile {
        let file = iceberg::spec::DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_path(format!("file:///t/data/{name}.parquet"))
            .file_format(DataFileFormat::Parquet)
            .partition(iceberg::spec::Struct::from_iter([Some(
                iceberg::spec::Literal::int(partition),
            )]))
            .record_count(10)
            .file_size_in_bytes(size)
            .build()
            .unwrap();
        OwnFile {
            file,
            manifest: "m.avro".into(),
            sequence: 1,
            first_row_id: None,
        }
    }

    fn policy(target: u64, min: usize) -> CompactPolicy {
        CompactPolicy {
            target_file_size: target,
            min_input_files: min,
            ..CompactPolicy::default()
        }
    }

    fn names(groups: &[Vec<OwnFile>]) -> Vec<Vec<String>> {
        groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|s| {
                        let name = s.file.file_path().rsplit('/').next().unwrap();
                        name.trim_end_matches(".parquet").to_string()
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_tier_is_rewritten_once_it_holds_min_input_files_smallest_first() {
        let p = policy(1 << 20, 4);
        let three: Vec<OwnFile> = (0..3).map(|i| file(&format!("a{i}"), 1000, 1)).collect();
        assert!(groups(three.clone(), &p).is_empty());
        let mut four = three;
        four.push(file("a3", 900, 1));
        assert_eq!(names(&groups(four, &p)), [["a3", "a0", "a1", "a2"]]);
    }

    #[test]
    fn a_rewritten_file_waits_for_its_own_tier_instead_of_joining_every_rewrite() {
        // 4 KB files and one earlier output of 64 KB: the small ones are rewritten without the big one.
        let p = policy(1 << 20, 4);
        let mut files: Vec<OwnFile> = (0..4).map(|i| file(&format!("s{i}"), 4000, 1)).collect();
        files.push(file("big", 64_000, 1));
        assert_eq!(names(&groups(files, &p)), [["s0", "s1", "s2", "s3"]]);
    }

    #[test]
    fn partitions_are_grouped_apart_and_the_input_stays_within_the_target() {
        let p = policy(10_000, 2);
        let files = vec![
            file("p1a", 3000, 1),
            file("p2a", 3000, 2),
            file("p1b", 3000, 1),
            file("p2b", 3000, 2),
            file("p1c", 3000, 1),
        ];
        // Partition 1's tier fills the budget with three files (9 000 of 10 000); partition 2 waits.
        assert_eq!(names(&groups(files, &p)), [["p1a", "p1b", "p1c"]]);
    }
}
