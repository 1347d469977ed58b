//! Manifest merging: bounding the manifests a snapshot's manifest list names, which iceberg-rust 0.10's
//! `fast_append` never does (one more manifest per commit, forever: 86 400 a day at 1 s checkpoints, and every
//! commit and every reader's scan planning reads them all).
//!
//! # The algorithm (Iceberg's, as Java's `ManifestMergeManager` and pyiceberg's `_MergingSnapshotProducer` do it)
//! Honours the table's standard properties: `commit.manifest-merge.enabled` (off unless the table sets it; the
//! tables the sink creates set it), `commit.manifest.min-count-to-merge` (default 100) and
//! `commit.manifest.target-size-bytes` (default 8 MiB). The manifests of the planned snapshot are grouped by content
//! (data, deletes) and partition spec; each group is packed into bins of the target size, packing from the oldest
//! so that the bin holding the new manifest is the one left short. A bin of one manifest is kept; the bin holding
//! the new manifest is kept while it has fewer than `min-count-to-merge` manifests; every other bin is rewritten
//! as one manifest of the new snapshot. Rewritten entries keep their snapshot id and sequence numbers (`EXISTING`,
//! Iceberg spec "Manifests"); entries this snapshot adds stay `ADDED` and inherit its sequence number; entries an
//! older snapshot deleted are dropped. In a format-version 3 table every carried entry that is not `ADDED` keeps
//! the `first_row_id` it had (inherited ones written out, [`crate::row_lineage`]), so every row keeps its
//! `_row_id` through a merge. The replaced manifests are not deleted here: older snapshots still name
//! them; they are deleted once no retained snapshot does ([`crate::retire`]).
//!
//! # Crash safety
//! Merging only writes new files under the table's `metadata/` directory (names derived from the planned manifest
//! list, which carries a fresh UUID) and never changes a file a committed snapshot names: until the catalog
//! accepts the snapshot, nothing refers to them. A kill before the swap (drill step `after-merging`) leaves
//! orphans, never a changed table.

use std::collections::BTreeMap;

use iceberg::spec::{
    DataFile, FormatVersion, ManifestContentType, ManifestEntry, ManifestFile, ManifestStatus,
    ManifestWriter, ManifestWriterBuilder, Snapshot, TableMetadata, UNASSIGNED_SEQUENCE_NUMBER,
};
use iceberg::table::Table;
use iceberg::{Error, ErrorKind, Result};

use crate::rewritten::{RewrittenSnapshot, write_list};
use crate::row_lineage::{RowIdInheritance, with_first_row_id};

/// Iceberg's standard property that turns manifest merging on.
pub const MANIFEST_MERGE_ENABLED: &str = "commit.manifest-merge.enabled";
/// Iceberg's standard property: the fewest manifests the bin holding the new manifest needs to be merged.
pub const MANIFEST_MIN_COUNT_TO_MERGE: &str = "commit.manifest.min-count-to-merge";
/// Iceberg's standard property: the size merged manifests aim at.
pub const MANIFEST_TARGET_SIZE_BYTES: &str = "commit.manifest.target-size-bytes";

const DEFAULT_MIN_COUNT_TO_MERGE: usize = 100;
const DEFAULT_TARGET_SIZE_BYTES: i64 = 8 * 1024 * 1024;

/// How a table asks its manifests to be merged (its standard properties).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MergePolicy {
    /// `commit.manifest.min-count-to-merge`.
    pub(crate) min_count: usize,
    /// `commit.manifest.target-size-bytes`.
    pub(crate) target_size: i64,
}

impl MergePolicy {
    /// The table's policy, or `None` when it does not ask for merging.
    ///
    /// # Errors
    /// `DataInvalid` naming the property when a value is not a number.
    pub(crate) fn of(metadata: &TableMetadata) -> Result<Option<Self>> {
        let properties = metadata.properties();
        let enabled = properties
            .get(MANIFEST_MERGE_ENABLED)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if !enabled {
            return Ok(None);
        }
        let number = |key: &str, default: i64| -> Result<i64> {
            match properties.get(key) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::DataInvalid,
                            format!("table property {key} = {v:?} is not a positive whole number"),
                        )
                    }),
            }
        };
        Ok(Some(Self {
            min_count: number(
                MANIFEST_MIN_COUNT_TO_MERGE,
                DEFAULT_MIN_COUNT_TO_MERGE as i64,
            )? as usize,
            target_size: number(MANIFEST_TARGET_SIZE_BYTES, DEFAULT_TARGET_SIZE_BYTES)?,
        }))
    }

    /// Which of `manifests` (the entries of a planned manifest list, in any order; `recency` ranks them, higher
    /// is newer) to rewrite together: the bins the policy merges, each as indexes into `manifests`, newest first.
    pub(crate) fn bins_to_merge(
        &self,
        manifests: &[ManifestFile],
        recency: &dyn Fn(&ManifestFile) -> i64,
    ) -> Vec<Vec<usize>> {
        let mut groups: BTreeMap<(bool, i32), Vec<usize>> = BTreeMap::new();
        for (i, m) in manifests.iter().enumerate() {
            let deletes = m.content == ManifestContentType::Deletes;
            groups
                .entry((deletes, m.partition_spec_id))
                .or_default()
                .push(i);
        }
        // Newest first (iceberg's fast append lists the existing manifests first and its new one last).
        for group in groups.values_mut() {
            group.sort_by_key(|&i| std::cmp::Reverse(recency(&manifests[i])));
        }
        let mut merged = Vec::new();
        for group in groups.values() {
            for bin in self.pack_from_end(manifests, group) {
                let holds_newest = bin.contains(&group[0]);
                if bin.len() == 1 || (holds_newest && bin.len() < self.min_count) {
                    continue;
                }
                merged.push(bin);
            }
        }
        merged
    }

    /// Greedy bins of at most `target_size` bytes (a manifest larger than it gets a bin of its own), filled from
    /// the end of `group` (the oldest manifests), so the bin left short is the one with the newest.
    fn pack_from_end(&self, manifests: &[ManifestFile], group: &[usize]) -> Vec<Vec<usize>> {
        let mut bins: Vec<Vec<usize>> = Vec::new();
        let mut size = 0i64;
        for &i in group.iter().rev() {
            let length = manifests[i].manifest_length;
            match bins.last_mut() {
                Some(bin) if size + length <= self.target_size => {
                    bin.push(i);
                    size += length;
                }
                _ => {
                    bins.push(vec![i]);
                    size = length;
                }
            }
        }
        for bin in &mut bins {
            bin.reverse();
        }
        bins.reverse();
        bins
    }
}

/// How recent a manifest of a list planned for snapshot `planned` of `metadata` is: newest of all when `planned`
/// wrote it (its sequence number may be unassigned yet); else its sequence number, or in format v1 (whose lists
/// carry none) the timestamp of the snapshot that added it (0 when that snapshot is gone).
fn recency(metadata: &TableMetadata, planned: i64) -> impl Fn(&ManifestFile) -> i64 + '_ {
    move |manifest| {
        if manifest.added_snapshot_id == planned
            || manifest.sequence_number == UNASSIGNED_SEQUENCE_NUMBER
        {
            i64::MAX
        } else if metadata.format_version() == FormatVersion::V1 {
            metadata
                .snapshot_by_id(manifest.added_snapshot_id)
                .map_or(0, |s| s.timestamp_ms())
        } else {
            manifest.sequence_number
        }
    }
}

/// Merges `manifests`, those `planned`'s list names (a snapshot planned on `base`, not yet committed), by `policy`: `None` when no
/// bin is due (the planned snapshot stands as it is). Otherwise writes the merged manifests and a new manifest list
/// and returns the snapshot naming it (same id, parent, sequence number, summary). The manifest list `planned`
/// named, and the manifests it added that were merged, are deleted (nothing else refers to them).
///
/// # Errors
/// Any read or write failure of a manifest or list (storage unreachable, a manifest an expiry just deleted): the
/// commit attempt fails retryably, nothing committed.
pub(crate) async fn merge_manifests(
    base: &Table,
    planned: &Snapshot,
    manifests: Vec<ManifestFile>,
    policy: MergePolicy,
) -> Result<Option<RewrittenSnapshot>> {
    let metadata = base.metadata();
    let file_io = base.file_io();
    let list_path = planned.manifest_list();
    let recency = recency(metadata, planned.snapshot_id());
    let bins = policy.bins_to_merge(&manifests, &recency);
    if bins.is_empty() {
        return Ok(None);
    }
    // Named after the planned list (which carries a fresh UUID): `snap-<id>-<attempt>-<uuid>-merged.avro` for the
    // list, `merged-snap-<id>-<attempt>-<uuid>-m<n>.avro` beside it for the manifests.
    let stem = list_path.strip_suffix(".avro").unwrap_or(list_path);
    let (directory, name) = stem.rsplit_once('/').unwrap_or(("", stem));
    let mut written = Vec::new();
    let mut replaced = vec![false; manifests.len()];
    let mut merged = Vec::new();
    for (n, bin) in bins.iter().enumerate() {
        let path = format!("{directory}/merged-{name}-m{n}.avro");
        let rewritten = rewrite_bin(base, planned, &manifests, bin, &path).await?;
        written.push(path);
        merged.push(rewritten);
        for &i in bin {
            replaced[i] = true;
        }
    }
    // This attempt's own manifests that were merged: nothing but the planned list ever named them.
    let unused: Vec<String> = manifests
        .iter()
        .zip(&replaced)
        .filter(|(m, replaced)| **replaced && m.added_snapshot_id == planned.snapshot_id())
        .map(|(m, _)| m.manifest_path.clone())
        .collect();
    // Newest first (Java's order): the merged manifests (this snapshot's), then the kept ones by sequence number.
    let mut ordered = merged;
    ordered.extend(
        manifests
            .into_iter()
            .zip(&replaced)
            .filter(|(_, replaced)| !**replaced)
            .map(|(m, _)| m),
    );
    ordered.sort_by_key(|m| std::cmp::Reverse(recency(m)));
    let new_list = format!("{stem}-merged.avro");
    let snapshot = write_list(
        base,
        planned,
        &ordered,
        &new_list,
        planned.summary().clone(),
    )
    .await?;
    written.push(new_list);
    crate::retire::drill("after-merging");
    for file in unused.iter().map(String::as_str).chain([list_path]) {
        if let Err(e) = file_io.delete(file).await {
            tracing::debug!(file, error = %e, "cannot delete a planned file the merge replaced");
        }
    }
    Ok(Some(RewrittenSnapshot {
        snapshot,
        manifests: ordered,
        written,
    }))
}

/// Rewrites the manifests `bin` names as one manifest of `planned` at `path`.
async fn rewrite_bin(
    base: &Table,
    planned: &Snapshot,
    manifests: &[ManifestFile],
    bin: &[usize],
    path: &str,
) -> Result<ManifestFile> {
    let mut rewriting = ManifestRewrite::open(base, planned, &manifests[bin[0]], path)?;
    for &i in bin {
        let manifest = manifests[i].load_manifest(base.file_io()).await?;
        let mut lineage = RowIdInheritance::of(&manifests[i]);
        for entry in manifest.entries() {
            let first_row_id = lineage.first_row_id(&entry.data_file);
            rewriting.carry(entry, first_row_id, &manifests[i].manifest_path)?;
        }
    }
    rewriting.writer.write_manifest_file().await
}

/// A manifest of snapshot `planned` being written at a new path from the entries of manifests like `like` (same
/// content and partition spec): what merging and a compaction's replacing ([`crate::replace`]) write.
pub(crate) struct ManifestRewrite<'a> {
    pub(crate) writer: ManifestWriter,
    planned: &'a Snapshot,
    base: &'a Table,
    spec: iceberg::spec::PartitionSpecRef,
    partition_type: iceberg::spec::StructType,
}

impl<'a> ManifestRewrite<'a> {
    /// Opens the writer at `path`.
    ///
    /// # Errors
    /// A spec the table does not have; storage failures.
    pub(crate) fn open(
        base: &'a Table,
        planned: &'a Snapshot,
        like: &ManifestFile,
        path: &str,
    ) -> Result<Self> {
        let metadata = base.metadata();
        let spec = metadata
            .partition_spec_by_id(like.partition_spec_id)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::DataInvalid,
                    format!(
                        "manifest {} names partition spec {}, which the table does not have",
                        like.manifest_path, like.partition_spec_id
                    ),
                )
            })?
            .clone();
        let builder = ManifestWriterBuilder::new(
            base.file_io().new_output(path)?,
            Some(planned.snapshot_id()),
            metadata.current_schema().clone(),
            spec.as_ref().clone(),
        );
        let writer = match (metadata.format_version(), &like.content) {
            (FormatVersion::V1, _) => builder.build_v1(),
            (FormatVersion::V2, ManifestContentType::Data) => builder.build_v2_data(),
            (FormatVersion::V2, ManifestContentType::Deletes) => builder.build_v2_deletes(),
            (FormatVersion::V3, ManifestContentType::Data) => builder.build_v3_data(),
            (FormatVersion::V3, ManifestContentType::Deletes) => builder.build_v3_deletes(),
        };
        let partition_type = spec.partition_type(metadata.current_schema())?;
        Ok(Self {
            writer,
            planned,
            base,
            spec,
            partition_type,
        })
    }

    /// `entry`'s file in the table's current types: an entry of a manifest written before a column was widened
    /// has its bounds in the wider type.
    pub(crate) fn promoted(&self, entry: &ManifestEntry) -> Result<DataFile> {
        let metadata = self.base.metadata();
        crate::promoted_bounds::promote_file(
            entry.data_file.clone(),
            self.spec.spec_id(),
            metadata.current_schema(),
            &self.partition_type,
            metadata.format_version(),
        )
    }

    /// `entry`'s file as a rewritten manifest lists it when the entry is not `ADDED`: promoted, and carrying
    /// `first_row_id` (what [`RowIdInheritance`] gave it in its manifest; `None` before format version 3).
    fn lineaged(&self, entry: &ManifestEntry, first_row_id: Option<i64>) -> Result<DataFile> {
        let metadata = self.base.metadata();
        with_first_row_id(
            self.promoted(entry)?,
            first_row_id,
            (self.spec.spec_id(), &self.partition_type),
            metadata.current_schema(),
        )
    }

    /// Carries `entry` (of manifest `from`; `first_row_id` is what it inherits there) as it is: an entry
    /// `planned` added or deleted stays so, an earlier deleted entry is dropped (its snapshot's manifests keep
    /// it), any other live entry becomes existing. Entries `planned` adds are not committed yet: in a v3 table
    /// they inherit their row ids from the rewritten manifest; every other entry keeps its own.
    ///
    /// # Errors
    /// An entry lacking its snapshot id or sequence numbers.
    pub(crate) fn carry(
        &mut self,
        entry: &ManifestEntry,
        first_row_id: Option<i64>,
        from: &str,
    ) -> Result<()> {
        let ours = entry.snapshot_id == Some(self.planned.snapshot_id());
        match entry.status {
            ManifestStatus::Added if ours => self.writer.add_file(self.promoted(entry)?, -1),
            // A deleted entry keeps the file's own data sequence number (spec "Manifests").
            ManifestStatus::Deleted if ours => self.writer.add_delete_file(
                self.lineaged(entry, first_row_id)?,
                entry
                    .sequence_number
                    .unwrap_or(self.planned.sequence_number()),
                entry.file_sequence_number,
            ),
            ManifestStatus::Deleted => Ok(()),
            ManifestStatus::Added | ManifestStatus::Existing => {
                let missing = |what: &str| {
                    Error::new(
                        ErrorKind::DataInvalid,
                        format!(
                            "an entry of manifest {from} has no {what}: it cannot be carried into a rewritten \
                             manifest"
                        ),
                    )
                };
                self.writer.add_existing_file(
                    self.lineaged(entry, first_row_id)?,
                    entry.snapshot_id.ok_or_else(|| missing("snapshot id"))?,
                    entry
                        .sequence_number
                        .ok_or_else(|| missing("sequence number"))?,
                    Some(
                        entry
                            .file_sequence_number
                            .ok_or_else(|| missing("file sequence number"))?,
                    ),
                )
            }
        }
    }

    /// Writes `entry`'s live file as deleted by `planned` (a compaction replaced it), keeping its sequence numbers
    /// and, in a v3 table, its `first_row_id` (inherited in its manifest, as for [`carry`](Self::carry)).
    ///
    /// # Errors
    /// An entry lacking its sequence number.
    pub(crate) fn delete(
        &mut self,
        entry: &ManifestEntry,
        first_row_id: Option<i64>,
    ) -> Result<()> {
        let data_file = self.lineaged(entry, first_row_id)?;
        let sequence = entry.sequence_number.ok_or_else(|| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("the entry of {} has no sequence number", entry.file_path()),
            )
        })?;
        self.writer
            .add_delete_file(data_file, sequence, entry.file_sequence_number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(snapshot: i64, length: i64, deletes: bool) -> ManifestFile {
        ManifestFile {
            manifest_path: format!("m-{snapshot}.avro"),
            manifest_length: length,
            partition_spec_id: 0,
            content: if deletes {
                ManifestContentType::Deletes
            } else {
                ManifestContentType::Data
            },
            sequence_number: snapshot,
            min_sequence_number: snapshot,
            added_snapshot_id: snapshot,
            added_files_count: Some(1),
            existing_files_count: Some(0),
            deleted_files_count: Some(0),
            added_rows_count: Some(1),
            existing_rows_count: Some(0),
            deleted_rows_count: Some(0),
            partitions: None,
            key_metadata: None,
            first_row_id: None,
        }
    }

    /// Manifests of snapshots `newest` down to 1, newest first (manifest-list order).
    fn list(newest: i64, length: i64) -> Vec<ManifestFile> {
        (1..=newest)
            .rev()
            .map(|s| manifest(s, length, false))
            .collect()
    }

    /// Ranks as the merge does on a v2 table whose planned snapshot is not among the manifests.
    fn by_sequence(m: &ManifestFile) -> i64 {
        if m.sequence_number == UNASSIGNED_SEQUENCE_NUMBER {
            i64::MAX
        } else {
            m.sequence_number
        }
    }

    fn policy(min_count: usize, target_size: i64) -> MergePolicy {
        MergePolicy {
            min_count,
            target_size,
        }
    }

    #[test]
    fn the_bin_with_the_new_manifest_waits_for_min_count() {
        assert!(
            policy(4, 1000)
                .bins_to_merge(&list(3, 10), &by_sequence)
                .is_empty()
        );
        assert_eq!(
            policy(4, 1000).bins_to_merge(&list(4, 10), &by_sequence),
            vec![vec![0, 1, 2, 3]]
        );
    }

    #[test]
    fn full_bins_of_old_manifests_merge_and_the_short_bin_holds_the_newest() {
        // 5 manifests of 10 bytes, bins of 20 bytes packed from the oldest: [4,3] [2,1] [0].
        let bins = policy(100, 20).bins_to_merge(&list(5, 10), &by_sequence);
        assert_eq!(bins, vec![vec![1, 2], vec![3, 4]]);
    }

    #[test]
    fn the_order_of_the_list_does_not_matter() {
        // iceberg's fast append lists the new manifest last.
        let mut oldest_first = list(5, 10);
        oldest_first.reverse();
        let bins = policy(100, 20).bins_to_merge(&oldest_first, &by_sequence);
        assert_eq!(bins, vec![vec![3, 2], vec![1, 0]]);
        let mut planned = list(3, 10);
        planned.reverse();
        planned[2].sequence_number = UNASSIGNED_SEQUENCE_NUMBER;
        assert!(
            policy(4, 1000)
                .bins_to_merge(&planned, &by_sequence)
                .is_empty()
        );
        planned.push(manifest(0, 10, false));
        assert_eq!(
            policy(4, 1000).bins_to_merge(&planned, &by_sequence),
            vec![vec![2, 1, 0, 3]]
        );
    }

    #[test]
    fn in_a_v1_table_manifests_rank_by_their_snapshots_time() {
        // v1 manifest lists carry no sequence numbers (every manifest reads back as 0), and lists come in either
        // order (iceberg lists its new manifest last, a merge newest first). Ranked by their snapshots' times,
        // with the planned snapshot's (3) newest: the full bin of the two older ones merges, 3's waits.
        let mut v1 = vec![
            manifest(2, 5, false),
            manifest(1, 15, false),
            manifest(3, 5, false),
        ];
        for m in &mut v1 {
            m.sequence_number = 0;
        }
        let by_snapshot_time = |m: &ManifestFile| {
            if m.added_snapshot_id == 3 {
                i64::MAX
            } else {
                1_000 * m.added_snapshot_id
            }
        };
        assert_eq!(
            policy(100, 20).bins_to_merge(&v1, &by_snapshot_time),
            vec![vec![0, 1]]
        );
    }

    #[test]
    fn a_manifest_alone_in_its_bin_is_kept() {
        // Each manifest fills a bin by itself.
        assert!(
            policy(1, 10)
                .bins_to_merge(&list(4, 10), &by_sequence)
                .is_empty()
        );
    }

    #[test]
    fn data_and_delete_manifests_merge_separately() {
        let mut manifests = list(2, 10);
        manifests.push(manifest(7, 10, true));
        let bins = policy(2, 1000).bins_to_merge(&manifests, &by_sequence);
        assert_eq!(bins, vec![vec![0, 1]]);
    }

    #[test]
    fn a_table_asks_for_merging_with_its_standard_properties() {
        let with = |props: &[(&str, &str)]| {
            let mut metadata = serde_json::json!({
                "format-version": 2, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
                "location": "file:///t", "last-sequence-number": 0, "last-updated-ms": 1,
                "last-column-id": 1, "current-schema-id": 0,
                "schemas": [{"type": "struct", "schema-id": 0, "fields": [
                    {"id": 1, "name": "id", "required": true, "type": "long"}]}],
                "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": []}],
                "last-partition-id": 999, "default-sort-order-id": 0,
                "sort-orders": [{"order-id": 0, "fields": []}], "properties": {}
            });
            for (k, v) in props {
                metadata["properties"][k] = serde_json::json!(v);
            }
            MergePolicy::of(&serde_json::from_value(metadata).unwrap())
        };
        assert_eq!(with(&[]).unwrap(), None);
        assert_eq!(
            with(&[(MANIFEST_MERGE_ENABLED, "true")]).unwrap(),
            Some(policy(100, 8 * 1024 * 1024))
        );
        assert_eq!(
            with(&[
                (MANIFEST_MERGE_ENABLED, "true"),
                (MANIFEST_MIN_COUNT_TO_MERGE, "3"),
                (MANIFEST_TARGET_SIZE_BYTES, "4096")
            ])
            .unwrap(),
            Some(policy(3, 4096))
        );
        let refused = with(&[
            (MANIFEST_MERGE_ENABLED, "true"),
            (MANIFEST_MIN_COUNT_TO_MERGE, "x"),
        ])
        .unwrap_err();
        assert!(
            refused.to_string().contains(MANIFEST_MIN_COUNT_TO_MERGE),
            "{refused}"
        );
    }
}
