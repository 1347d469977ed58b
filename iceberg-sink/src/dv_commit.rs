//! The commit half of deletion vectors ([`crate::deletion_vectors`]): a format-version 3 table may hold at most
//! one live vector per data file, so before a checkpoint's vectors join its snapshot ([`crate::row_delta`]) they
//! are merged with the vectors the base holds for the same data files: [`merge_with_table`] finds those in the
//! base's delete manifests, marks them `DELETED` by the new snapshot in rewritten manifests (the others carried as
//! `EXISTING`), and writes the union of each pair as a new vector. A table upgraded from format version 2 may
//! still hold position-delete files naming those data files: a reader ignores them for a data file that has a
//! vector, so their positions for it go into the union too (the files stay: they may name other data files). Whoever wrote the base's vector (this subtask's
//! previous checkpoint, another subtask after a rescale, Spark's `DELETE` or `MERGE`), its deletes stay deleted:
//! a union of deleted positions never brings a row back.
//!
//! Done on every attempt against the base that attempt builds on, so a vector another writer committed between
//! two attempts is merged too; the catalog's swap requires that exact base.
//!
//! # Crash safety
//! Only new files are written: rewritten manifests (named after the planned list, which carries a fresh UUID) and
//! `<checkpoint's Puffin file>-s<planned snapshot id>.puffin` (the checkpoint's file stamp, so recovery's cleanup
//! deletes one a failed attempt left). A kill before the swap leaves orphans no metadata names; after it, the
//! checkpoint's own Puffin file, when every vector in it was merged, is named by nothing and goes with cleanup.
//!
//! # Superseded files
//! A superseded vector's Puffin file that no live entry names any more is read only by the snapshots before the
//! superseding one: the committer deletes it once the sink's expiry has retired all of them (as a compaction's
//! inputs). One that a restart forgot stays until the orphan sweep (`sweep_orphans_after`) or another engine's
//! expiry deletes it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use connector_api::Phase;
use iceberg::Result;
use iceberg::io::FileIO;
use iceberg::spec::{
    DataContentType, DataFile, Manifest, ManifestContentType, ManifestFile, Snapshot,
};
use iceberg::table::Table;
use roaring::RoaringTreemap;

use crate::deletion_vectors::{self, Target, is_deletion_vector};
use crate::location::canonical;
use crate::manifest_merge::ManifestRewrite;

/// A checkpoint's delete files merged with the base's deletion vectors.
#[derive(Debug, Default)]
pub(crate) struct MergedVectors {
    /// The delete files the snapshot adds: the checkpoint's own where the base held no vector for their data file
    /// (and its other delete files), the merged vectors for the rest.
    pub(crate) deletes: Vec<DataFile>,
    /// The planned snapshot's manifests, with those that listed a superseded vector rewritten.
    pub(crate) manifests: Vec<ManifestFile>,
    /// The base's vectors the merged ones supersede (marked deleted), for the snapshot's summary.
    pub(crate) removed: Vec<DataFile>,
    /// What the merge wrote (rewritten manifests, the merged vectors' Puffin file): discarded when the attempt
    /// is not committed.
    pub(crate) written: Vec<String>,
    /// The checkpoint's own Puffin files no added entry names (every vector in them was merged): deleted once the
    /// commit landed.
    pub(crate) unused: Vec<String>,
    /// The Puffin files of superseded vectors that no live entry names once this snapshot lands: only the
    /// snapshots before it read them, so they are deleted once those are expired (as a compaction's inputs are,
    /// [`crate::replace::due_inputs`]).
    pub(crate) retired: Vec<String>,
}

/// Merges the deletion vectors among `deletes` with the live vectors of `planned`'s manifests (module docs).
/// `deletes` without vectors (a format-version 2 table's position deletes, equality deletes) pass through, and
/// then no manifest is read.
///
/// # Errors
/// Storage failures reading manifests or vectors or writing the merged files (what was written is discarded);
/// [`DataInvalid`](iceberg::ErrorKind::DataInvalid) for a vector that does not decode.
pub(crate) async fn merge_with_table(
    base: &Table,
    planned: &Snapshot,
    (manifests, cache): (Vec<ManifestFile>, &DeleteManifestCache),
    deletes: &[DataFile],
) -> Result<MergedVectors> {
    let ours: HashMap<String, usize> = deletes
        .iter()
        .enumerate()
        .filter(|(_, f)| is_deletion_vector(f))
        .filter_map(|(i, f)| Some((canonical(&f.referenced_data_file()?), i)))
        .collect();
    if ours.is_empty() {
        return Ok(MergedVectors {
            deletes: deletes.to_vec(),
            manifests,
            ..MergedVectors::default()
        });
    }
    let mut merged = MergedVectors::default();
    match supersede(
        base,
        planned,
        (manifests, cache),
        &ours,
        deletes,
        &mut merged,
    )
    .await
    {
        Ok(()) => Ok(merged),
        Err(e) => {
            discard(base, &merged.written).await;
            Err(e)
        }
    }
}

/// The work of [`merge_with_table`], recording in `merged` what it wrote as it goes.
async fn supersede(
    base: &Table,
    planned: &Snapshot,
    (manifests, cache): (Vec<ManifestFile>, &DeleteManifestCache),
    ours: &HashMap<String, usize>,
    deletes: &[DataFile],
    merged: &mut MergedVectors,
) -> Result<()> {
    let file_io = base.file_io();
    let list_path = planned.manifest_list();
    let stem = list_path.strip_suffix(".avro").unwrap_or(list_path);
    let (directory, name) = stem.rsplit_once('/').unwrap_or(("", stem));
    let mut superseded: HashMap<usize, Vec<DataFile>> = HashMap::new();
    let mut rewritten: HashMap<usize, ManifestFile> = HashMap::new();
    // The files live entries name after this snapshot (every delete manifest is read: entries of one Puffin
    // file may sit in several manifests once another writer rewrote them).
    let mut still_live: HashSet<String> = HashSet::new();
    // Position-delete files (a table upgraded from version 2) that may name one of the checkpoint's data files:
    // a reader ignores them for a data file with a vector, so their positions must go into it.
    let mut legacy_files = Vec::new();
    for (i, manifest_file) in manifests.iter().enumerate() {
        if manifest_file.content != ManifestContentType::Deletes
            || manifest_file.added_snapshot_id == planned.snapshot_id()
        {
            continue;
        }
        let manifest = cache.load(file_io, manifest_file).await?;
        let ours_of = |file: &DataFile| {
            is_deletion_vector(file)
                .then(|| file.referenced_data_file())
                .flatten()
                .and_then(|data_file| ours.get(&canonical(&data_file)).copied())
        };
        still_live.extend(
            manifest
                .entries()
                .iter()
                .filter(|e| e.is_alive() && ours_of(e.data_file()).is_none())
                .map(|e| canonical(e.file_path())),
        );
        legacy_files.extend(
            manifest
                .entries()
                .iter()
                .filter(|e| {
                    e.is_alive()
                        && e.content_type() == DataContentType::PositionDeletes
                        && !is_deletion_vector(e.data_file())
                        && e.data_file()
                            .referenced_data_file()
                            .is_none_or(|data_file| ours.contains_key(&canonical(&data_file)))
                })
                .map(|e| (manifest_file.partition_spec_id, e.clone())),
        );
        if !manifest
            .entries()
            .iter()
            .any(|e| e.is_alive() && ours_of(e.data_file()).is_some())
        {
            continue;
        }
        let path = format!("{directory}/superseded-{name}-d{i}.avro");
        let mut rewriting = ManifestRewrite::open(base, planned, manifest_file, &path)?;
        merged.written.push(path);
        for entry in manifest.entries() {
            match ours_of(entry.data_file()).filter(|_| entry.is_alive()) {
                Some(own) => {
                    rewriting.delete(entry, None)?;
                    superseded
                        .entry(own)
                        .or_default()
                        .push(entry.data_file().clone());
                }
                None => rewriting.carry(entry, None, &manifest_file.manifest_path)?,
            }
        }
        rewritten.insert(i, rewriting.writer.write_manifest_file().await?);
    }
    cache.keep_only(manifests.iter().map(|m| m.manifest_path.as_str()));
    merged.manifests = manifests
        .into_iter()
        .enumerate()
        .map(|(i, m)| rewritten.remove(&i).unwrap_or(m))
        .collect();
    let mut legacy: HashMap<usize, Vec<u64>> = HashMap::new();
    if !legacy_files.is_empty() {
        let named = crate::key_scan::deleted_positions(base, &legacy_files, Phase::Commit)
            .await
            .map_err(|e| {
                iceberg::Error::new(
                    iceberg::ErrorKind::Unexpected,
                    format!(
                        "cannot read the position-delete files of table {} to merge them into deletion vectors",
                        base.identifier()
                    ),
                )
                .with_source(e)
            })?;
        for (data_file, positions) in named {
            if let Some(&own) = ours.get(&canonical(&data_file)) {
                legacy.entry(own).or_default().extend(positions);
            }
        }
    }
    let merging: HashSet<usize> = superseded.keys().chain(legacy.keys()).copied().collect();
    if merging.is_empty() {
        merged.deletes = deletes.to_vec();
        return Ok(());
    }
    let spec_id = base.metadata().default_partition_spec_id();
    let mut vectors = Vec::with_capacity(merging.len());
    let mut own_files = Vec::new();
    for &own in &merging {
        let file = &deletes[own];
        let mut positions: RoaringTreemap = deletion_vectors::read(base, file).await?;
        let before = superseded.get(&own).map_or(&[][..], Vec::as_slice);
        for earlier in before {
            positions |= deletion_vectors::read(base, earlier).await?;
        }
        positions.extend(legacy.remove(&own).unwrap_or_default());
        let target = Target {
            data_file: file.referenced_data_file().unwrap_or_default(),
            spec_id,
            partition: file.partition().clone(),
        };
        vectors.push((target, positions));
        own_files.push(file.file_path().to_string());
        merged.removed.extend(before.iter().cloned());
    }
    let first = &own_files[0];
    let path = format!(
        "{}-s{}.puffin",
        first.strip_suffix(".puffin").unwrap_or(first),
        planned.snapshot_id()
    );
    merged.written.push(path.clone());
    let written = deletion_vectors::write(base, &path, &vectors).await?;
    let merged_away = merging;
    merged.deletes = deletes
        .iter()
        .enumerate()
        .filter(|(i, _)| !merged_away.contains(i))
        .map(|(_, f)| f.clone())
        .chain(written)
        .collect();
    let still_named: HashSet<&str> = merged.deletes.iter().map(DataFile::file_path).collect();
    let mut unused: Vec<String> = own_files
        .into_iter()
        .filter(|f| !still_named.contains(f.as_str()))
        .collect();
    unused.sort();
    unused.dedup();
    merged.unused = unused;
    still_live.extend(still_named.iter().map(|path| canonical(path)));
    let mut retired: Vec<String> = merged
        .removed
        .iter()
        .map(|f| f.file_path().to_string())
        .filter(|path| !still_live.contains(&canonical(path)))
        .collect();
    retired.sort();
    retired.dedup();
    merged.retired = retired;
    Ok(())
}

/// The delete manifests earlier merges read, by path (a manifest never changes once written): each commit reads
/// only the delete manifests written since the last one, not every one of the table's. Holds what the last
/// merge's base named (every live vector of the table, as manifest entries).
#[derive(Debug, Default)]
pub(crate) struct DeleteManifestCache {
    manifests: Mutex<HashMap<String, Arc<Manifest>>>,
}

impl DeleteManifestCache {
    /// `file`'s manifest, read unless an earlier merge read it.
    async fn load(&self, file_io: &FileIO, file: &ManifestFile) -> Result<Arc<Manifest>> {
        if let Some(known) = self.lock().get(&file.manifest_path) {
            return Ok(known.clone());
        }
        let manifest = Arc::new(file.load_manifest(file_io).await?);
        self.lock()
            .insert(file.manifest_path.clone(), manifest.clone());
        Ok(manifest)
    }

    /// Forgets every manifest but `paths` (those of the base just merged with).
    fn keep_only<'a>(&self, paths: impl Iterator<Item = &'a str>) {
        let keep: HashSet<&str> = paths.collect();
        self.lock().retain(|path, _| keep.contains(path.as_str()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Manifest>>> {
        self.manifests.lock().expect("delete manifest cache lock")
    }
}

/// Deletes the files of an abandoned merge (one already gone, or one that cannot be deleted now, stays an orphan
/// nothing references).
async fn discard(base: &Table, written: &[String]) {
    for file in written {
        if let Err(e) = base.file_io().delete(file).await {
            tracing::debug!(file, error = %e, "cannot delete a file of an abandoned deletion-vector merge");
        }
    }
}
