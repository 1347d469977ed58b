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
/// # Errors
/// A storage failure writing the list; [`FeatureUnsupported`](ErrorKind::FeatureUnsupported) for a format-version
/// 3 table (its lists carry row lineage, which Ratchet does not assign).
pub(crate) async fn write_list(
    base: &Table,
    planned: &Snapshot,
    manifests: &[ManifestFile],
    path: &str,
    summary: Summary,
) -> Result<Snapshot> {
    let writer = base.file_io().new_output(path)?.writer().await?;
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
        FormatVersion::V3 => return Err(v3_refused()),
    };
    list.add_manifests(manifests.iter().cloned())?;
    list.close().await?;
    Ok(Snapshot::builder()
        .with_snapshot_id(planned.snapshot_id())
        .with_parent_snapshot_id(planned.parent_snapshot_id())
        .with_sequence_number(planned.sequence_number())
        .with_timestamp_ms(planned.timestamp_ms())
        .with_manifest_list(path.to_string())
        .with_summary(summary)
        .schema_id_opt(planned.schema_id())
        .with_encryption_key_id(planned.encryption_key_id().map(str::to_string))
        .build())
}

/// The refusal of a format-version 3 table.
pub(crate) fn v3_refused() -> Error {
    Error::new(
        ErrorKind::FeatureUnsupported,
        "Ratchet's own commit (manifest merging, row deltas) writes format-version 1 and 2 tables; this table is \
         version 3 (its manifest lists carry row lineage, which Ratchet does not assign): set \
         commit.manifest-merge.enabled = false and write it without upsert_key",
    )
}
