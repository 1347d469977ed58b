//! A row delta: data files and delete files (position deletes, deletion vectors or equality deletes) in one
//! snapshot (the upsert mode's commit). iceberg-rust 0.10
//! commits data files only (`fast_append`), so the delete files ride on Ratchet's own commit: iceberg plans the
//! snapshot with the data files as always (guard, ledger, expiry), then [`add_delete_files`] writes a delete
//! manifest for it, a manifest list naming the planned manifests and the delete manifest, and the summary of a row
//! delta (Iceberg spec, "Snapshots": operation `overwrite`, or `delete` when no data file is added, with the
//! delete-file counts). The guard and the catalog's compare-and-swap are unchanged: the delete files become
//! visible exactly when the checkpoint's data files do, in the same snapshot, once.
//!
//! # Sequence numbers
//! The delete manifest's entries inherit the snapshot's sequence number, so its equality deletes remove the keys'
//! rows of every earlier snapshot and none of this snapshot's own data files (the spec's "strictly lower data
//! sequence number" rule): an upserted key keeps exactly its new row.
//!
//! # Crash safety
//! Everything is written before the swap under fresh names (`deletes-<planned list>.avro`,
//! `<planned list>-delta.avro`): a kill after writing them (drill step `after-row-delta`) or a lost swap leaves
//! orphans no metadata names, never a changed table.

use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, ManifestFile, ManifestWriterBuilder, Operation,
    Snapshot, Summary, UNASSIGNED_SEQUENCE_NUMBER,
};
use iceberg::table::Table;
use iceberg::{Error, ErrorKind, Result};

use crate::rewritten::{RewrittenSnapshot, write_list};

/// Adds `deletes` (position- or equality-delete files or deletion vectors written for the table's current
/// partition spec, each filed under its partition) to `planned`, a snapshot planned on `base` and not yet
/// committed, whose list names `planned_manifests`: writes their delete manifest and a manifest list naming it
/// first, then the planned manifests, and returns the snapshot naming that list with a row delta's summary, which
/// counts `removed` (deletion vectors the new ones superseded, [`crate::dv_commit`]) out. The list `planned` named
/// is deleted (nothing else refers to it).
///
/// # Errors
/// A storage failure writing the manifest or list (the commit attempt fails retryably, nothing committed);
/// [`DataInvalid`](ErrorKind::DataInvalid) when a delete file's partition does not fit the table's current spec
/// (the spec changed since the pre-commit).
pub(crate) async fn add_delete_files(
    base: &Table,
    planned: &Snapshot,
    planned_manifests: Vec<ManifestFile>,
    (deletes, removed): (&[DataFile], &[DataFile]),
) -> Result<RewrittenSnapshot> {
    let metadata = base.metadata();
    let file_io = base.file_io();
    let list_path = planned.manifest_list();
    let spec = metadata.default_partition_spec();
    if let Some(misfit) = deletes
        .iter()
        .find(|f| f.partition().fields().len() != spec.fields().len())
    {
        return Err(Error::new(
            ErrorKind::DataInvalid,
            format!(
                "table {}'s partition spec changed after delete file {} was written for the one before",
                base.identifier(),
                misfit.file_path()
            ),
        ));
    }
    let stem = list_path.strip_suffix(".avro").unwrap_or(list_path);
    let (directory, name) = stem.rsplit_once('/').unwrap_or(("", stem));
    let manifest_path = format!("{directory}/deletes-{name}.avro");
    let builder = ManifestWriterBuilder::new(
        file_io.new_output(&manifest_path)?,
        Some(planned.snapshot_id()),
        metadata.current_schema().clone(),
        spec.as_ref().clone(),
    );
    let mut writer = match metadata.format_version() {
        FormatVersion::V3 => builder.build_v3_deletes(),
        FormatVersion::V1 | FormatVersion::V2 => builder.build_v2_deletes(),
    };
    for file in deletes {
        // Unassigned: the entry inherits the snapshot's sequence number when the list is written.
        writer.add_file(file.clone(), UNASSIGNED_SEQUENCE_NUMBER)?;
    }
    let delete_manifest: ManifestFile = writer.write_manifest_file().await?;
    let mut manifests = vec![delete_manifest];
    manifests.extend(planned_manifests);
    let new_list = format!("{stem}-delta.avro");
    let snapshot = match write_list(
        base,
        planned,
        &manifests,
        &new_list,
        delta_summary(planned.summary(), deletes, removed),
    )
    .await
    {
        Ok(snapshot) => snapshot,
        Err(e) => {
            // Nothing names the delete manifest yet: the attempt fails without leaving it behind.
            if let Err(e) = file_io.delete(&manifest_path).await {
                tracing::debug!(file = %manifest_path, error = %e, "cannot delete the delete manifest of a failed row delta");
            }
            return Err(e);
        }
    };
    crate::retire::drill("after-row-delta");
    if let Err(e) = file_io.delete(list_path).await {
        tracing::debug!(file = list_path, error = %e, "cannot delete the planned list a row delta replaced");
    }
    Ok(RewrittenSnapshot {
        snapshot,
        manifests,
        written: vec![manifest_path, new_list],
    })
}

/// The summary of a row delta: `planned`'s (an append's) with the delete files counted in and the superseded
/// deletion vectors `removed` counted out, operation `overwrite` (`delete` when it adds no data file), as
/// Iceberg's `RowDelta` writes it (deletion vectors count as `dvs`, not as position-delete files, and their
/// positions as position deletes).
fn delta_summary(planned: &Summary, deletes: &[DataFile], removed: &[DataFile]) -> Summary {
    let mut properties = planned.additional_properties.clone();
    let count = |properties: &std::collections::HashMap<String, String>, key: &str| -> u64 {
        properties
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let added = Counted::of(deletes);
    let gone = Counted::of(removed);
    for (key, added) in [
        ("added-delete-files", added.files),
        ("added-equality-delete-files", added.equality_files),
        ("added-equality-deletes", added.equality_records),
        ("added-position-delete-files", added.position_files),
        ("added-dvs", added.vectors),
        ("added-position-deletes", added.position_records),
        ("added-files-size", added.size),
        ("removed-delete-files", gone.files),
        ("removed-dvs", gone.vectors),
        ("removed-position-deletes", gone.position_records),
        ("removed-files-size", gone.size),
    ]
    .into_iter()
    .filter(|(_, added)| *added > 0)
    {
        let value = count(&properties, key) + added;
        properties.insert(key.to_string(), value.to_string());
    }
    for (key, added, removed) in [
        ("total-delete-files", added.files, gone.files),
        ("total-equality-deletes", added.equality_records, 0),
        (
            "total-position-deletes",
            added.position_records,
            gone.position_records,
        ),
        ("total-files-size", added.size, gone.size),
    ]
    .into_iter()
    .filter(|(_, added, removed)| *added > 0 || *removed > 0)
    {
        let value = (count(&properties, key) + added).saturating_sub(removed);
        properties.insert(key.to_string(), value.to_string());
    }
    let operation = if count(&properties, "added-data-files") > 0 {
        Operation::Overwrite
    } else {
        Operation::Delete
    };
    Summary {
        operation,
        additional_properties: properties,
    }
}

/// Delete files counted by kind, for a summary.
#[derive(Debug, Default, Clone, Copy)]
struct Counted {
    files: u64,
    size: u64,
    equality_files: u64,
    equality_records: u64,
    position_files: u64,
    vectors: u64,
    position_records: u64,
}

impl Counted {
    fn of(files: &[DataFile]) -> Self {
        let mut counted = Self::default();
        for file in files {
            counted.files += 1;
            counted.size += file.file_size_in_bytes();
            match file.content_type() {
                DataContentType::EqualityDeletes => {
                    counted.equality_files += 1;
                    counted.equality_records += file.record_count();
                }
                DataContentType::PositionDeletes => {
                    if crate::deletion_vectors::is_deletion_vector(file) {
                        counted.vectors += 1;
                    } else {
                        counted.position_files += 1;
                    }
                    counted.position_records += file.record_count();
                }
                DataContentType::Data => {}
            }
        }
        counted
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_row_delta_counts_its_delete_files_into_an_appends_summary() {
        let planned = Summary {
            operation: Operation::Append,
            additional_properties: HashMap::from([
                ("added-data-files".to_string(), "1".to_string()),
                ("total-delete-files".to_string(), "2".to_string()),
                ("total-equality-deletes".to_string(), "7".to_string()),
                ("ratchet.checkpoint".to_string(), "4".to_string()),
            ]),
        };
        let deletes = [equality_delete(3, 100), equality_delete(4, 50)];
        let summary = delta_summary(&planned, &deletes, &[]);
        assert_eq!(summary.operation, Operation::Overwrite);
        let property = |key: &str| summary.additional_properties[key].as_str();
        assert_eq!(property("added-delete-files"), "2");
        assert_eq!(property("added-equality-delete-files"), "2");
        assert_eq!(property("added-equality-deletes"), "7");
        assert_eq!(property("added-files-size"), "150");
        assert_eq!(property("total-delete-files"), "4");
        assert_eq!(property("total-equality-deletes"), "14");
        assert_eq!(property("ratchet.checkpoint"), "4");
        let positions = [position_delete(5, 10)];
        let summary = delta_summary(&planned, &positions, &[]);
        let property = |key: &str| summary.additional_properties.get(key).map(String::as_str);
        assert_eq!(property("added-position-delete-files"), Some("1"));
        assert_eq!(property("added-position-deletes"), Some("5"));
        assert_eq!(property("total-position-deletes"), Some("5"));
        assert_eq!(property("total-delete-files"), Some("3"));
        assert_eq!(property("added-equality-delete-files"), None);
        assert_eq!(property("total-equality-deletes"), Some("7"));
        let deletes_only = Summary {
            operation: Operation::Append,
            additional_properties: HashMap::new(),
        };
        assert_eq!(
            delta_summary(&deletes_only, &deletes, &[]).operation,
            Operation::Delete
        );
    }

    #[test]
    fn deletion_vectors_count_as_dvs_and_superseded_ones_are_counted_out() {
        let planned = Summary {
            operation: Operation::Append,
            additional_properties: HashMap::from([
                ("added-data-files".to_string(), "1".to_string()),
                ("total-delete-files".to_string(), "3".to_string()),
                ("total-position-deletes".to_string(), "9".to_string()),
                ("total-files-size".to_string(), "1000".to_string()),
            ]),
        };
        let summary = delta_summary(
            &planned,
            &[deletion_vector(6, 40), deletion_vector(2, 40)],
            &[deletion_vector(4, 30)],
        );
        let property = |key: &str| summary.additional_properties.get(key).map(String::as_str);
        assert_eq!(property("added-dvs"), Some("2"));
        assert_eq!(property("added-position-delete-files"), None);
        assert_eq!(property("added-position-deletes"), Some("8"));
        assert_eq!(property("removed-dvs"), Some("1"));
        assert_eq!(property("removed-delete-files"), Some("1"));
        assert_eq!(property("removed-position-deletes"), Some("4"));
        assert_eq!(property("total-delete-files"), Some("4"));
        assert_eq!(property("total-position-deletes"), Some("13"));
        assert_eq!(property("total-files-size"), Some("1050"));
    }

    fn deletion_vector(records: u64, size: u64) -> DataFile {
        iceberg::spec::DataFileBuilder::default()
            .content(DataContentType::PositionDeletes)
            .file_path(format!("file:///t/data/v-{records}.puffin"))
            .file_format(iceberg::spec::DataFileFormat::Puffin)
            .partition(iceberg::spec::Struct::empty())
            .record_count(records)
            .file_size_in_bytes(size)
            .referenced_data_file(Some("file:///t/data/d.parquet".into()))
            .content_offset(Some(4))
            .content_size_in_bytes(Some(size as i64))
            .build()
            .unwrap()
    }

    fn position_delete(records: u64, size: u64) -> DataFile {
        iceberg::spec::DataFileBuilder::default()
            .content(DataContentType::PositionDeletes)
            .file_path(format!("file:///t/data/p-{records}.parquet"))
            .file_format(iceberg::spec::DataFileFormat::Parquet)
            .partition(iceberg::spec::Struct::empty())
            .record_count(records)
            .file_size_in_bytes(size)
            .build()
            .unwrap()
    }

    fn equality_delete(records: u64, size: u64) -> DataFile {
        iceberg::spec::DataFileBuilder::default()
            .content(DataContentType::EqualityDeletes)
            .file_path(format!("file:///t/data/d-{records}.parquet"))
            .file_format(iceberg::spec::DataFileFormat::Parquet)
            .partition(iceberg::spec::Struct::empty())
            .record_count(records)
            .file_size_in_bytes(size)
            .equality_ids(Some(vec![1]))
            .build()
            .unwrap()
    }
}
