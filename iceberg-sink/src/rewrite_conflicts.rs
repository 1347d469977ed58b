//! Which delete files can reach the files an upsert table's compaction rewrites ([`crate::live_compaction`]),
//! at its pre-commit (the deletes to apply while rewriting) and at its commit (a delete added since the rewrite
//! read the table, which the outputs would not carry: the compaction is dropped, as Iceberg's `RewriteFiles`
//! validation drops a rewrite).
//!
//! A position-delete file or deletion vector reaches the data files it names: its `referenced_data_file`, or
//! else, when its `file_path` bounds do not rule an input out, the paths it holds (read). An equality-delete
//! file may reach any data file of a lower sequence number, so one added since the read always conflicts.

use std::collections::BTreeSet;

use connector_api::{Phase, Result};
use iceberg::spec::{DataContentType, DataFile, Operation, PrimitiveLiteral};
use iceberg::table::Table;

use crate::key_scan::{Entries, entries_of, positions_of};
use crate::location::canonical;

/// Whether position-delete file `file` may name one of `paths` (canonical), judged by its metadata alone: its
/// referenced data file, else its `file_path` bounds (a file without them may name anything).
pub(crate) fn may_name(file: &DataFile, paths: &BTreeSet<String>) -> bool {
    if let Some(referenced) = file.referenced_data_file() {
        return paths.contains(&canonical(&referenced));
    }
    let id = iceberg::metadata_columns::RESERVED_FIELD_ID_DELETE_FILE_PATH;
    let bound = |bounds: &std::collections::HashMap<i32, iceberg::spec::Datum>| match bounds
        .get(&id)
        .map(|d| d.literal())
    {
        Some(PrimitiveLiteral::String(s)) => Some(canonical(s)),
        _ => None,
    };
    match (bound(file.lower_bounds()), bound(file.upper_bounds())) {
        (Some(lower), Some(upper)) if lower <= upper => paths.range(lower..=upper).next().is_some(),
        _ => true,
    }
}

/// Why a compaction of `inputs` that read the table at snapshot `read_at` must not be committed on `base`: a
/// delete file added since that may reach an input (an equality delete; a position delete or deletion vector
/// naming one), or a history that no longer reaches `read_at` (expired, rolled back). `None`: nothing reaches
/// them.
///
/// # Errors
/// A manifest list, manifest or position-delete file that cannot be read (the commit attempt fails retryably).
pub(crate) async fn added_since(
    base: &Table,
    read_at: i64,
    inputs: &[String],
) -> Result<Option<String>> {
    let metadata = base.metadata_ref();
    let inputs: BTreeSet<String> = inputs.iter().map(|p| canonical(p)).collect();
    let mut cursor = metadata.current_snapshot();
    while let Some(snapshot) = cursor {
        if snapshot.snapshot_id() == read_at {
            return Ok(None);
        }
        // An append adds no delete files (the spec's operations).
        if snapshot.summary().operation != Operation::Append {
            let added = entries_of(
                base,
                snapshot,
                Entries::DeletesAddedBySnapshot,
                Phase::Commit,
            )
            .await?;
            for (_, entry) in &added {
                let file = entry.data_file();
                let reaches = match file.content_type() {
                    DataContentType::EqualityDeletes => true,
                    DataContentType::PositionDeletes if may_name(file, &inputs) => {
                        positions_of(base, file, Phase::Commit)
                            .await?
                            .keys()
                            .any(|path| inputs.contains(&canonical(path)))
                    }
                    _ => false,
                };
                if reaches {
                    return Ok(Some(format!(
                        "snapshot {} of table {} added delete file {}, which may delete rows of the files the \
                         compaction rewrote",
                        snapshot.snapshot_id(),
                        base.identifier(),
                        file.file_path()
                    )));
                }
            }
        }
        cursor = snapshot
            .parent_snapshot_id()
            .and_then(|parent| metadata.snapshot_by_id(parent));
    }
    Ok(Some(format!(
        "the history of table {} no longer reaches snapshot {read_at}, at which the compaction read its files",
        base.identifier()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{DataFileBuilder, DataFileFormat, Datum};

    fn delete_file(referenced: Option<&str>, bounds: Option<(&str, &str)>) -> DataFile {
        let id = iceberg::metadata_columns::RESERVED_FIELD_ID_DELETE_FILE_PATH;
        let mut builder = DataFileBuilder::default();
        builder
            .content(DataContentType::PositionDeletes)
            .file_path("file:///t/data/d.parquet".to_string())
            .file_format(DataFileFormat::Parquet)
            .partition(iceberg::spec::Struct::empty())
            .record_count(1)
            .file_size_in_bytes(10)
            .referenced_data_file(referenced.map(str::to_string));
        if let Some((lower, upper)) = bounds {
            builder
                .lower_bounds([(id, Datum::string(lower))].into())
                .upper_bounds([(id, Datum::string(upper))].into());
        }
        builder.build().unwrap()
    }

    #[test]
    fn a_delete_file_may_name_an_input_by_its_reference_or_within_its_path_bounds() {
        let inputs: BTreeSet<String> = ["file:///t/data/b.parquet".to_string()].into();
        assert!(may_name(
            &delete_file(Some("file:///t/data/b.parquet"), None),
            &inputs
        ));
        assert!(!may_name(
            &delete_file(Some("file:///t/data/a.parquet"), None),
            &inputs
        ));
        let bounded = |lower, upper| delete_file(None, Some((lower, upper)));
        assert!(may_name(
            &bounded("file:///t/data/a.parquet", "file:///t/data/c.parquet"),
            &inputs
        ));
        assert!(may_name(
            &bounded("file:///t/data/b.parquet", "file:///t/data/b.parquet"),
            &inputs
        ));
        assert!(!may_name(
            &bounded("file:///t/data/c.parquet", "file:///t/data/d.parquet"),
            &inputs
        ));
        assert!(!may_name(
            &bounded("file:///t/data/a.parquet", "file:///t/data/a.parquet"),
            &inputs
        ));
        assert!(
            may_name(&delete_file(None, None), &inputs),
            "no bounds: anything"
        );
    }
}
