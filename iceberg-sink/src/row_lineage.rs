//! Row lineage (Iceberg format version 3) through manifests Ratchet rewrites.
//!
//! In a v3 table every row has a `_row_id`: its data file's `first_row_id` plus its position in the file. A data
//! file added by a snapshot is written with a null `first_row_id` and inherits one when its manifest is read: the
//! manifest's `first_row_id` (assigned when the manifest list is written, [`crate::rewritten::write_list`]) plus
//! the record counts of the files listed before it whose `first_row_id` was null too (spec, "First Row ID
//! Inheritance"). Moving an entry into another manifest (manifest merging, a compaction's replacing) would change
//! that sum, and with it the row ids every engine shows, so the spec requires the inherited value to be written
//! into every entry that is not `ADDED`. iceberg-rust 0.10 does not apply the inheritance when it reads a
//! manifest; [`RowIdInheritance`] does, and [`with_first_row_id`] writes the value into the carried file.

use iceberg::spec::{
    DataFile, FormatVersion, ManifestContentType, ManifestFile, Schema, StructType,
    deserialize_data_file_from_json, serialize_data_file_to_json,
};
use iceberg::{Error, ErrorKind, Result};

/// The `first_row_id`s a reader assigns to the data files of one manifest, in the order they are listed.
#[derive(Debug, Clone)]
pub(crate) struct RowIdInheritance {
    /// What the next file with a null `first_row_id` inherits; `None` for a manifest without lineage (a delete
    /// manifest, a table before v3).
    next: Option<i64>,
}

impl RowIdInheritance {
    /// The inheritance of `manifest`'s entries.
    pub(crate) fn of(manifest: &ManifestFile) -> Self {
        let next = match manifest.content {
            ManifestContentType::Data => {
                manifest.first_row_id.and_then(|id| i64::try_from(id).ok())
            }
            ManifestContentType::Deletes => None,
        };
        Self { next }
    }

    /// The `first_row_id` of `file`, the next entry of the manifest (call it for every entry, in order, deleted
    /// ones too): its own when set, else the inherited one; `None` when the manifest has no lineage.
    pub(crate) fn first_row_id(&mut self, file: &DataFile) -> Option<i64> {
        if let Some(own) = file.first_row_id() {
            return Some(own);
        }
        let inherited = self.next?;
        self.next = Some(inherited + i64::try_from(file.record_count()).unwrap_or(i64::MAX));
        Some(inherited)
    }
}

/// `file` carrying `first_row_id` (the value [`RowIdInheritance`] gave it) when its own is null: what an entry
/// moved into a rewritten manifest must hold. `file` itself when it has one or there is none to write.
///
/// # Errors
/// As iceberg's JSON form of data files (a file that does not fit `partition_type`).
pub(crate) fn with_first_row_id(
    file: DataFile,
    first_row_id: Option<i64>,
    (spec_id, partition_type): (i32, &StructType),
    schema: &Schema,
) -> Result<DataFile> {
    let Some(id) = first_row_id.filter(|_| file.first_row_id().is_none()) else {
        return Ok(file);
    };
    // iceberg-rust 0.10 has no setter on a built DataFile; its JSON form carries the field.
    let json = serialize_data_file_to_json(file, partition_type, FormatVersion::V3)?;
    let mut value: serde_json::Value = serde_json::from_str(&json).map_err(|e| {
        Error::new(
            ErrorKind::Unexpected,
            "iceberg wrote a data file as JSON it cannot parse",
        )
        .with_source(e)
    })?;
    value["first_row_id"] = serde_json::Value::from(id);
    deserialize_data_file_from_json(&value.to_string(), spec_id, partition_type, schema)
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{
        DataContentType, DataFileBuilder, DataFileFormat, NestedField, PrimitiveType, Struct, Type,
    };

    use super::*;

    fn file(path: &str, records: u64, first_row_id: Option<i64>) -> DataFile {
        DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_path(path.to_string())
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::empty())
            .record_count(records)
            .file_size_in_bytes(100)
            .first_row_id(first_row_id)
            .build()
            .unwrap()
    }

    fn manifest(content: ManifestContentType, first_row_id: Option<u64>) -> ManifestFile {
        ManifestFile {
            manifest_path: "m.avro".into(),
            manifest_length: 1,
            partition_spec_id: 0,
            content,
            sequence_number: 1,
            min_sequence_number: 1,
            added_snapshot_id: 1,
            added_files_count: Some(3),
            existing_files_count: Some(1),
            deleted_files_count: Some(0),
            added_rows_count: Some(30),
            existing_rows_count: Some(5),
            deleted_rows_count: Some(0),
            partitions: None,
            key_metadata: None,
            first_row_id,
        }
    }

    #[test]
    fn null_first_row_ids_inherit_the_manifests_plus_the_earlier_null_files_records() {
        // The spec's example: a manifest at 1 000 lists an existing file with its own id, then two added files of
        // 50 rows each: they inherit 1 000 and 1 050.
        let mut lineage = RowIdInheritance::of(&manifest(ManifestContentType::Data, Some(1000)));
        assert_eq!(lineage.first_row_id(&file("a", 5, Some(10))), Some(10));
        assert_eq!(lineage.first_row_id(&file("b", 50, None)), Some(1000));
        assert_eq!(lineage.first_row_id(&file("c", 50, None)), Some(1050));
        assert_eq!(lineage.first_row_id(&file("d", 7, Some(20))), Some(20));
    }

    #[test]
    fn manifests_without_lineage_assign_none() {
        for manifest in [
            manifest(ManifestContentType::Data, None),
            manifest(ManifestContentType::Deletes, None),
        ] {
            let mut lineage = RowIdInheritance::of(&manifest);
            assert_eq!(lineage.first_row_id(&file("a", 5, None)), None);
        }
    }

    #[test]
    fn the_inherited_id_is_written_into_a_file_without_one_and_nothing_else_changes() {
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            ])
            .build()
            .unwrap();
        let unpartitioned = StructType::new(vec![]);
        let written =
            with_first_row_id(file("a", 5, None), Some(1000), (0, &unpartitioned), &schema)
                .unwrap();
        assert_eq!(written.first_row_id(), Some(1000));
        assert_eq!(written.file_path(), "a");
        assert_eq!(written.record_count(), 5);
        let kept = with_first_row_id(
            file("b", 5, Some(7)),
            Some(1000),
            (0, &unpartitioned),
            &schema,
        )
        .unwrap();
        assert_eq!(kept.first_row_id(), Some(7));
        let none =
            with_first_row_id(file("c", 5, None), None, (0, &unpartitioned), &schema).unwrap();
        assert_eq!(none.first_row_id(), None);
    }
}
