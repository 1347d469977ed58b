//! What the Iceberg sink stores in a checkpoint record (format version 1): the persisted types, their conversion
//! from and to iceberg's data files, and a golden-file test that this release still reads what it wrote
//! (`testdata/committable-v1.json`).

use connector_api::{CheckpointId, Error, ErrorKind, Phase, Result};
use iceberg::spec::{DataFile, deserialize_data_file_from_json, serialize_data_file_to_json};
use iceberg::table::Table;
use serde::{Deserialize, Serialize};

use crate::error::iceberg_error;

/// One data file of a pre-committed checkpoint, in a form any process can commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingFile {
    /// The file's location.
    pub path: String,
    /// The partition spec it was written for.
    pub spec_id: i32,
    /// iceberg's JSON form of the data file (statistics, partition values).
    pub data_file: String,
}

/// What commits one checkpoint of one subtask: every data file not yet in the table, up to this checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IcebergCommittable {
    /// The subtask that wrote the files.
    pub subtask: u32,
    /// The owner epoch of the instance that pre-committed it.
    pub epoch: u64,
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// The files: this checkpoint's and those carried from earlier checkpoints not committed yet.
    pub files: Vec<PendingFile>,
    /// `false` when the sink commits every K checkpoints and this one is carried into a later commit: the
    /// driver's commit of it does nothing, recovery commits it (its record is durable).
    pub commit: bool,
    /// The upsert mode's position deletes (`upsert_deletes = "position"`): the snapshot the key index showed when
    /// they were written (absent: a table with no snapshot yet, or no position deletes). A commit whose base has a
    /// snapshot since that removed data files (a rewrite) commits the checkpoint's equality-delete files instead:
    /// a row the positions name may have moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletes_based_on: Option<i64>,
    /// A compaction riding on this checkpoint's snapshot (`compact`, [`CompactedFiles`]): its outputs replace its
    /// inputs in the same snapshot, or the commit drops it when an input is no longer live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactedFiles>,
}

/// A compaction a checkpoint carries (`compact`): its commit replaces `inputs` by `outputs`, which hold exactly
/// their rows, or drops it when an input is no longer live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactedFiles {
    /// The live data files rewritten, as the table's manifests name them.
    pub inputs: Vec<String>,
    /// The rewritten files (same partition, the table's default spec).
    pub outputs: Vec<PendingFile>,
    /// The manifests that listed the inputs when they were picked: where the commit looks for them first (it
    /// reads the others only when one is not there, a merge having rewritten its manifest since).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifests: Vec<String>,
    /// An upsert table's compaction: the snapshot whose deletes the outputs apply. The commit drops the
    /// compaction when a delete that may reach an input was added since (`None`: an append table's, no deletes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<i64>,
    /// An upsert table's compaction: position-delete files that name no data file live after it (only its inputs
    /// and files already removed), removed by the same snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deletes: Vec<String>,
}

pub(crate) fn encode_files(table: &Table, files: Vec<DataFile>) -> Result<Vec<PendingFile>> {
    let metadata = table.metadata();
    // The writer opened every file for the table's default spec (DataFile has no public spec id accessor).
    let spec_id = metadata.default_partition_spec_id();
    files
        .into_iter()
        .map(|file| {
            let path = file.file_path().to_string();
            let spec = metadata.partition_spec_by_id(spec_id).ok_or_else(|| {
                Error::new(
                    ErrorKind::Bug,
                    Phase::PreCommit,
                    format!("unknown partition spec {spec_id}"),
                )
            })?;
            let partition_type = spec
                .partition_type(metadata.current_schema())
                .map_err(|e| {
                    iceberg_error(Phase::PreCommit, "cannot derive the partition type", e)
                })?;
            let data_file =
                serialize_data_file_to_json(file, &partition_type, metadata.format_version())
                    .map_err(|e| iceberg_error(Phase::PreCommit, "cannot encode a data file", e))?;
            Ok(PendingFile {
                path,
                spec_id,
                data_file,
            })
        })
        .collect()
}

pub(crate) fn decode_files(table: &Table, files: &[PendingFile]) -> Result<Vec<DataFile>> {
    let metadata = table.metadata();
    let schema = metadata.current_schema();
    files
        .iter()
        .map(|file| {
            let spec = metadata.partition_spec_by_id(file.spec_id).ok_or_else(|| {
                Error::new(
                    ErrorKind::Fatal,
                    Phase::Commit,
                    format!(
                        "the committable's file {} was written for partition spec {}, which table {} no longer \
                         has",
                        file.path,
                        file.spec_id,
                        table.identifier()
                    ),
                )
            })?;
            let partition_type = spec
                .partition_type(schema)
                .map_err(|e| iceberg_error(Phase::Commit, "cannot derive the partition type", e))?;
            // Written before a column was widened, its bounds are promoted first (crate::promoted_bounds).
            crate::promoted_bounds::promote_json(&file.data_file, schema)
                .and_then(|json| deserialize_data_file_from_json(&json, file.spec_id, &partition_type, schema))
                .map_err(|e| iceberg_error(Phase::Commit, format!("cannot decode data file {}", file.path), e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What this release writes, format version 1, kept as a file: if a change to the persisted types makes this
    /// fail, raise the sink's `committable_version`, teach its `decode_committable` to read version 1, and add the
    /// new version's golden file beside this one (checkpoints written by older releases must stay readable).
    const V1: &str = include_str!("../testdata/committable-v1.json");

    #[test]
    fn format_version_1_still_reads_and_writes_back_the_same() {
        let golden: Vec<IcebergCommittable> = serde_json::from_str(V1).unwrap();
        assert_eq!(
            serde_json::to_value(&golden).unwrap(),
            serde_json::from_str::<serde_json::Value>(V1).unwrap()
        );
        let carried = &golden[0];
        assert_eq!(
            (carried.subtask, carried.epoch, carried.checkpoint),
            (1, 4, CheckpointId(21))
        );
        assert!(!carried.commit);
        assert!(carried.files[0].data_file.contains("record_count"));
        assert!(golden[1].commit && golden[1].files.is_empty());
    }
}
