//! The replacing half of a compaction's commit ([`crate::compaction`]): iceberg plans the checkpoint's snapshot
//! with the checkpoint's files and the compaction's outputs appended, then [`remove_data_files`] rewrites every
//! manifest naming one of the compaction's inputs with that entry `DELETED` by the new snapshot (the others carried
//! as `EXISTING`), writes a manifest list naming the rewritten manifests in their place, and counts the removed
//! files into the summary (operation `overwrite`: the snapshot adds rows and replaces files, as Iceberg's
//! `OverwriteFiles` records it). The guard and the catalog's compare-and-swap are unchanged: the outputs appear
//! and the inputs disappear in the checkpoint's snapshot, once.
//!
//! # Conflicts
//! Every input must be live in the snapshot the commit builds on. One that is not (a foreign rewrite, an overwrite
//! or a delete removed it since the pre-commit) makes [`remove_data_files`] answer `None`: the caller commits the
//! checkpoint without the compaction. Because the catalog's swap requires the table to be exactly the base that
//! was checked, a foreign commit landing in between makes the swap fail and the next attempt checks again.
//!
//! # Crash safety
//! Only new files are written (named after the planned list, which carries a fresh UUID); a kill before the swap
//! (drill step `after-replacing`) leaves orphans no metadata names.

use std::collections::{HashMap, HashSet};

use iceberg::Result;
use iceberg::spec::{
    ManifestContentType, ManifestFile, ManifestStatus, Operation, Snapshot, Summary,
};
use iceberg::table::Table;

use crate::ledger::SubtaskKey;
use crate::location::canonical;
use crate::manifest_merge::ManifestRewrite;
use crate::rewritten::{RewrittenSnapshot, write_list};
use crate::row_lineage::RowIdInheritance;

/// What the rewritten manifests removed, of one kind of file: files, or deletion vectors (a vector's bytes are
/// its blob's, as Iceberg counts them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Removed {
    files: u64,
    vectors: u64,
    records: u64,
    bytes: u64,
}

/// The files one compaction removes: data files and (an upsert table's) position-delete files, and where the
/// data files were listed when picked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Removal<'a> {
    pub(crate) data: &'a [String],
    pub(crate) deletes: &'a [String],
    pub(crate) hints: &'a [String],
}

/// Marks `removal`'s files deleted in `planned` (a snapshot planned on `base`, not yet committed, whose list
/// names `manifests`): `None` when one of them is not live in those manifests (nothing is left written), else the
/// snapshot naming the new list. The manifests in `hints` (those that listed the inputs when they were picked)
/// are read first; the others only when a file is still missing (delete manifests only when delete files are
/// removed). The list `planned` named is deleted (nothing else refers to it).
///
/// # Errors
/// A storage failure reading or writing a manifest or list (the attempt fails retryably, nothing committed).
pub(crate) async fn remove_data_files(
    base: &Table,
    planned: &Snapshot,
    manifests: Vec<ManifestFile>,
    removal: Removal<'_>,
) -> Result<Option<RewrittenSnapshot>> {
    let file_io = base.file_io();
    let hints = removal.hints;
    let wanted: HashSet<String> = removal
        .data
        .iter()
        .chain(removal.deletes)
        .map(|p| canonical(p))
        .collect();
    let list_path = planned.manifest_list();
    let stem = list_path.strip_suffix(".avro").unwrap_or(list_path);
    let (directory, name) = stem.rsplit_once('/').unwrap_or(("", stem));
    let mut found = HashSet::new();
    let mut removed = Removed::default();
    let mut removed_deletes = Removed::default();
    let mut written = Vec::new();
    let mut replaced: HashMap<usize, ManifestFile> = HashMap::new();
    let hinted = |m: &ManifestFile| hints.contains(&m.manifest_path);
    // The hinted manifests first, then (only while an input is missing) the rest.
    let order = (0..manifests.len())
        .filter(|&i| hinted(&manifests[i]))
        .chain((0..manifests.len()).filter(|&i| !hinted(&manifests[i])));
    for i in order {
        let manifest_file = &manifests[i];
        if found.len() == wanted.len() {
            break;
        }
        let skipped = match manifest_file.content {
            ManifestContentType::Data => false,
            ManifestContentType::Deletes => removal.deletes.is_empty(),
        };
        // A data manifest `planned` added lists only its own new files. A delete manifest it added may also carry
        // earlier entries (a deletion-vector commit rewrites the delete manifests whose vectors it supersedes):
        // searched, its own new entries never removed.
        let own = manifest_file.added_snapshot_id == planned.snapshot_id();
        if skipped || (own && manifest_file.content == ManifestContentType::Data) {
            continue;
        }
        let removable = |e: &iceberg::spec::ManifestEntry| {
            e.is_alive()
                && !(e.status() == ManifestStatus::Added
                    && e.snapshot_id() == Some(planned.snapshot_id()))
                && wanted.contains(&canonical(e.file_path()))
        };
        let manifest = manifest_file.load_manifest(file_io).await?;
        let hits = manifest.entries().iter().any(|e| removable(e));
        if !hits {
            continue;
        }
        let path = format!("{directory}/replaced-{name}-r{i}.avro");
        let mut rewriting = ManifestRewrite::open(base, planned, manifest_file, &path)?;
        let mut lineage = RowIdInheritance::of(manifest_file);
        for entry in manifest.entries() {
            let path = canonical(entry.file_path());
            let first_row_id = lineage.first_row_id(&entry.data_file);
            if removable(entry) {
                rewriting.delete(entry, first_row_id)?;
                found.insert(path);
                let removed = match manifest_file.content {
                    ManifestContentType::Data => &mut removed,
                    ManifestContentType::Deletes => &mut removed_deletes,
                };
                let file = &entry.data_file;
                match crate::deletion_vectors::is_deletion_vector(file) {
                    true => {
                        removed.vectors += 1;
                        removed.bytes += file.content_size_in_bytes().unwrap_or(0) as u64;
                    }
                    false => {
                        removed.files += 1;
                        removed.bytes += file.file_size_in_bytes();
                    }
                }
                removed.records += entry.record_count();
            } else {
                rewriting.carry(entry, first_row_id, &manifest_file.manifest_path)?;
            }
        }
        replaced.insert(i, rewriting.writer.write_manifest_file().await?);
        written.push(path);
    }
    if found.len() != wanted.len() {
        discard(base, &written).await;
        return Ok(None);
    }
    let manifests: Vec<ManifestFile> = manifests
        .into_iter()
        .enumerate()
        .map(|(i, m)| replaced.remove(&i).unwrap_or(m))
        .collect();
    let new_list = format!("{stem}-replaced.avro");
    let snapshot = match write_list(
        base,
        planned,
        &manifests,
        &new_list,
        replace_summary(planned.summary(), removed, removed_deletes),
    )
    .await
    {
        Ok(snapshot) => snapshot,
        Err(e) => {
            discard(base, &written).await;
            return Err(e);
        }
    };
    written.push(new_list);
    crate::retire::drill("after-replacing");
    if let Err(e) = file_io.delete(list_path).await {
        tracing::debug!(file = list_path, error = %e, "cannot delete the planned list a compaction replaced");
    }
    Ok(Some(RewrittenSnapshot {
        snapshot,
        manifests,
        written,
    }))
}

/// A committed compaction's inputs and the sequence number of the snapshot that replaced them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Replaced {
    pub(crate) sequence: i64,
    pub(crate) inputs: Vec<String>,
}

/// The compactions `key`'s subtask committed that `table` still retains, as [`due_inputs`] takes them: per
/// retained snapshot of the subtask that replaced data files, its sequence number and the files its own manifests
/// mark deleted by it. Recovery seeds the target with them (the list of a process that ended is gone).
///
/// # Errors
/// A manifest list or manifest that cannot be read.
pub(crate) async fn retained_replacements(
    table: &Table,
    key: &SubtaskKey,
) -> Result<Vec<Replaced>> {
    let mut found = Vec::new();
    for snapshot in table.metadata().snapshots() {
        let summary = &snapshot.summary().additional_properties;
        if !key.owns(summary) || !summary.contains_key("deleted-data-files") {
            continue;
        }
        let id = snapshot.snapshot_id();
        let list = table.manifest_list_reader(snapshot).load().await?;
        let mut inputs = Vec::new();
        // Data manifests name the replaced inputs, delete manifests an upsert compaction's removed delete files.
        for manifest in list
            .entries()
            .iter()
            .filter(|m| m.added_snapshot_id == id && m.deleted_files_count != Some(0))
        {
            let manifest = manifest.load_manifest(table.file_io()).await?;
            inputs.extend(
                manifest
                    .entries()
                    .iter()
                    .filter(|e| {
                        e.status() == ManifestStatus::Deleted && e.snapshot_id() == Some(id)
                    })
                    .map(|e| e.file_path().to_string()),
            );
        }
        if !inputs.is_empty() {
            found.push(Replaced {
                sequence: snapshot.sequence_number(),
                inputs,
            });
        }
    }
    Ok(found)
}

/// The inputs of committed compactions (taken out of `replaced`) that no snapshot `committed` retains can read any more: every snapshot before the replacing one was
/// expired. (The replacing snapshot and later ones name them only as deleted entries, which no reader reads.)
pub(crate) fn due_inputs(replaced: &mut Vec<Replaced>, committed: &Table) -> Vec<String> {
    let Some(oldest) = committed
        .metadata()
        .snapshots()
        .map(|s| s.sequence_number())
        .min()
    else {
        return Vec::new();
    };
    let (due, kept): (Vec<_>, Vec<_>) = std::mem::take(replaced)
        .into_iter()
        .partition(|r| r.sequence <= oldest);
    *replaced = kept;
    due.into_iter().flat_map(|r| r.inputs).collect()
}

/// Deletes compacted inputs [`due_inputs`] named, after the commit that expired their last reader's snapshot
/// landed. Best effort: one that cannot be deleted stays on storage, and the subtask's next recovery deletes it
/// once no retained manifest names it.
pub(crate) async fn delete_inputs(committed: &Table, inputs: &[String]) {
    for file in inputs {
        if let Err(e) = committed.file_io().delete(file).await {
            tracing::warn!(file, error = %e, "cannot delete a compacted data file no snapshot reads any more");
        }
    }
}

/// Deletes files of an attempt nothing names; one that cannot be deleted stays an orphan.
async fn discard(base: &Table, written: &[String]) {
    for file in written {
        if let Err(e) = base.file_io().delete(file).await {
            tracing::debug!(file, error = %e, "cannot delete a file of an abandoned compaction");
        }
    }
}

/// `planned`'s summary (an append's or a row delta's) with the replaced data files and removed position-delete
/// files counted out, operation `overwrite`.
fn replace_summary(planned: &Summary, removed: Removed, deletes: Removed) -> Summary {
    let mut properties = planned.additional_properties.clone();
    let count = |properties: &HashMap<String, String>, key: &str| -> u64 {
        properties
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    for (key, value) in [
        ("deleted-data-files", removed.files),
        ("deleted-records", removed.records),
        ("removed-files-size", removed.bytes + deletes.bytes),
        ("removed-delete-files", deletes.files + deletes.vectors),
        ("removed-position-delete-files", deletes.files),
        ("removed-dvs", deletes.vectors),
        ("removed-position-deletes", deletes.records),
    ] {
        if value == 0 && !properties.contains_key(key) {
            continue;
        }
        let value = count(&properties, key) + value;
        properties.insert(key.to_string(), value.to_string());
    }
    for (key, value) in [
        ("total-data-files", removed.files),
        ("total-records", removed.records),
        ("total-files-size", removed.bytes + deletes.bytes),
        ("total-delete-files", deletes.files + deletes.vectors),
        ("total-position-deletes", deletes.records),
    ] {
        if let Some(total) = properties.get(key).and_then(|v| v.parse::<u64>().ok()) {
            properties.insert(key.to_string(), total.saturating_sub(value).to_string());
        }
    }
    Summary {
        operation: Operation::Overwrite,
        additional_properties: properties,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replace_counts_the_removed_files_out_of_an_appends_summary() {
        let planned = Summary {
            operation: Operation::Append,
            additional_properties: HashMap::from([
                ("added-data-files".to_string(), "2".to_string()),
                ("added-records".to_string(), "60".to_string()),
                ("total-data-files".to_string(), "10".to_string()),
                ("total-records".to_string(), "500".to_string()),
                ("total-files-size".to_string(), "9000".to_string()),
                ("ratchet.checkpoint".to_string(), "7".to_string()),
            ]),
        };
        let summary = replace_summary(
            &planned,
            Removed {
                files: 4,
                records: 40,
                bytes: 4000,
                ..Removed::default()
            },
            Removed::default(),
        );
        assert_eq!(summary.operation, Operation::Overwrite);
        let property = |key: &str| summary.additional_properties[key].as_str();
        assert_eq!(property("deleted-data-files"), "4");
        assert_eq!(property("deleted-records"), "40");
        assert_eq!(property("removed-files-size"), "4000");
        assert_eq!(property("total-data-files"), "6");
        assert_eq!(property("total-records"), "460");
        assert_eq!(property("total-files-size"), "5000");
        assert_eq!(property("added-data-files"), "2");
        assert_eq!(property("ratchet.checkpoint"), "7");
        assert!(!summary.additional_properties.contains_key("removed-dvs"));
    }

    #[test]
    fn removed_deletion_vectors_are_counted_apart_from_position_delete_files() {
        let planned = Summary {
            operation: Operation::Overwrite,
            additional_properties: HashMap::from([
                ("added-dvs".to_string(), "1".to_string()),
                ("total-delete-files".to_string(), "9".to_string()),
                ("total-position-deletes".to_string(), "90".to_string()),
            ]),
        };
        let deletes = Removed {
            files: 1,
            vectors: 3,
            records: 30,
            bytes: 300,
        };
        let summary = replace_summary(&planned, Removed::default(), deletes);
        let property = |key: &str| summary.additional_properties[key].as_str();
        assert_eq!(property("removed-dvs"), "3");
        assert_eq!(property("removed-position-delete-files"), "1");
        assert_eq!(property("removed-delete-files"), "4");
        assert_eq!(property("removed-position-deletes"), "30");
        assert_eq!(property("total-delete-files"), "5");
        assert_eq!(property("total-position-deletes"), "60");
    }
}
