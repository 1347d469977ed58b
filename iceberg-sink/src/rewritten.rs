//! A snapshot iceberg planned, given a new manifest list by Ratchet's own commit (merged manifests, a row delta's
//! delete manifests) before it is committed.

use iceberg::spec::{
    FormatVersion, ManifestFile, ManifestList, ManifestListWriter, Snapshot, Summary,
};
use iceberg::table::Table;
use iceberg::{Error, ErrorKind, Result};

/// A planned snapshot whose manifest list was rewritten.
#[derive(Debug)]
pub(crate) struct RewrittenSnapshot {
    /// The snapshot, naming the new manifest list.
    pub(crate) snapshot: Snapshot,
    /// The manifests the new list names (what a further rewrite starts from, without reading the list back).
    pub(crate) manifests: Vec<ManifestFile>,
    /// The files written (manifests, the new list): orphans unless the snapshot is committed.
    pub(crate) written: Vec<String>,
}

/// The manifests `planned`'s list names, as iceberg wrote it for `base`'s format.
///
/// # Errors
/// A storage failure reading the list, or a list that does not parse.
pub(crate) async fn read_list(base: &Table, planned: &Snapshot) -> Result<Vec<ManifestFile>> {
    let bytes = base
        .file_io()
        .new_input(planned.manifest_list())?
        .read()
        .await?;
    Ok(
        ManifestList::parse_with_version(&bytes, base.metadata().format_version())?
            .consume_entries()
            .into_iter()
            .collect(),
    )
}

/// Writes `manifests` as the manifest list `path` of `planned` (planned on `base`) and returns `planned` naming it
/// with `summary`: same id, parent, sequence number, time and schema. Manifests whose sequence numbers are not
/// assigned yet (written for this snapshot) get the snapshot's.
///
/// Row lineage (format version 3): iceberg planned `planned` with the row ids from its `first-row-id` (the table's
/// `next-row-id`) on, and gave its new data manifest that `first_row_id`. Manifests that already have one keep it
/// (the planned one too, when it was not merged); each data manifest written since (a merged or replacing
/// manifest) gets a fresh range after the planned rows, as large as its live rows (spec, "First Row ID
/// Assignment"), and the snapshot's `added-rows` grows to cover them, so the table's `next-row-id` moves past every
/// id any manifest can hand out. The planned range of a merged new manifest goes unused.
///
/// # Errors
/// A storage failure writing the list; `DataInvalid` for a v3 `planned` without a row range (iceberg always gives
/// one).
pub(crate) async fn write_list(
    base: &Table,
    planned: &Snapshot,
    manifests: &[ManifestFile],
    path: &str,
    summary: Summary,
) -> Result<Snapshot> {
    let writer = base.file_io().new_output(path)?.writer().await?;
    let planned_rows = match base.metadata().format_version() {
        FormatVersion::V3 => Some(planned.row_range().ok_or_else(|| {
            Error::new(
                ErrorKind::DataInvalid,
                format!(
                    "snapshot {} of a format-version 3 table was planned without a first-row-id",
                    planned.snapshot_id()
                ),
            )
        })?),
        FormatVersion::V1 | FormatVersion::V2 => None,
    };
    let mut list = match base.metadata().format_version() {
        FormatVersion::V1 => {
            ManifestListWriter::v1(writer, planned.snapshot_id(), planned.parent_snapshot_id())
        }
        FormatVersion::V2 => ManifestListWriter::v2(
            writer,
            planned.snapshot_id(),
            planned.parent_snapshot_id(),
            planned.sequence_number(),
        ),
        FormatVersion::V3 => {
            let (first, added) = planned_rows.unwrap_or_default();
            ManifestListWriter::v3(
                writer,
                planned.snapshot_id(),
                planned.parent_snapshot_id(),
                planned.sequence_number(),
                Some(first + added),
            )
        }
    };
    list.add_manifests(manifests.iter().cloned())?;
    let next_row_id = list.next_row_id();
    list.close().await?;
    let snapshot = Snapshot::builder()
        .with_snapshot_id(planned.snapshot_id())
        .with_parent_snapshot_id(planned.parent_snapshot_id())
        .with_sequence_number(planned.sequence_number())
        .with_timestamp_ms(planned.timestamp_ms())
        .with_manifest_list(path.to_string())
        .with_summary(summary)
        .schema_id_opt(planned.schema_id())
        .with_encryption_key_id(planned.encryption_key_id().map(str::to_string));
    Ok(match (planned_rows, next_row_id) {
        (Some((first, _)), Some(next)) => snapshot.with_row_range(first, next - first).build(),
        _ => snapshot.build(),
    })
}
