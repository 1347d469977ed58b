//! Position-delete files of the upsert mode (`upsert_deletes = "position"`, format-version 2 tables; version 3
//! tables get deletion vectors instead, [`crate::deletion_vectors`]): Parquet
//! files of (`file_path`, `pos`) rows, the data file and position of every row a checkpoint's upserts and deletes
//! replace ([`crate::key_index`]), sorted by path then position as the spec requires. Committed in the snapshot
//! that adds the checkpoint's new rows (a row delta, [`crate::row_delta`]); a position delete applies to data
//! files of a sequence number up to its own, and names rows of earlier snapshots only, so the new rows stay.
//!
//! The file's `file_path` bounds are written untruncated, so a reader that sees both bounds equal (one data file)
//! can match the file to its data file by path alone; such a file also records it as `referenced_data_file`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use connector_api::{Phase, Result};
use iceberg::metadata_columns::{delete_file_path_field, delete_file_pos_field};
use iceberg::spec::{
    DataContentType, DataFile, DataFileFormat, FormatVersion, PartitionKey, Schema, Struct,
};
use iceberg::table::Table;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::DefaultFileNameGenerator;
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::deletion_vectors::Target;
use crate::error::iceberg_error;
use crate::key_index::IndexedFile;
use crate::location::EscapedLocations;

/// The suffix of a position-delete file's name: `<data file prefix>-<n>-posdel.parquet`.
const FILE_SUFFIX: &str = "posdel";

/// The suffix of a checkpoint's deletion vectors' Puffin file: `<data file prefix>-dv.puffin`.
const VECTORS_SUFFIX: &str = "dv";

/// The rows to delete: data file → positions (any order, no duplicates needed).
pub(crate) type DeletedRows = HashMap<Arc<IndexedFile>, Vec<u64>>;

/// Writes `deleted` as position-delete files named `<file_prefix>-<n>-posdel.parquet`, one per partition of the
/// data files they name (under that partition's directory, filed under it), rolling past `target_file_size`; on
/// a format-version 3 table as deletion vectors instead, one per data file, in one Puffin file
/// `<file_prefix>-dv.puffin` in the table's data directory; nothing when empty.
///
/// # Errors
/// [`Config`](connector_api::ErrorKind::Config) naming the data file when a row to delete lives in a file of a
/// partition spec other than the table's current one; retryable/fatal storage errors (the files written so far
/// are unreferenced: recovery's cleanup deletes them).
pub(crate) async fn write_position_deletes(
    table: &Table,
    file_prefix: String,
    target_file_size: usize,
    deleted: DeletedRows,
) -> Result<Vec<DataFile>> {
    let metadata = table.metadata();
    let spec = metadata.default_partition_spec();
    let mut by_partition: HashMap<&Struct, BTreeMap<&str, Vec<u64>>> = HashMap::new();
    let mut vectors = Vec::new();
    for (file, positions) in deleted.iter().filter(|(_, p)| !p.is_empty()) {
        if file.spec_id != spec.spec_id() {
            return Err(connector_api::Error::new(
                connector_api::ErrorKind::Config,
                Phase::PreCommit,
                format!(
                    "table {}: a row the upsert replaces lives in data file {} of partition spec {}, not the \
                     table's current spec {}; position deletes are written for the current spec only: rewrite the \
                     older files into it (Spark's rewrite_data_files) and restart",
                    table.identifier(),
                    file.path,
                    file.spec_id,
                    spec.spec_id()
                ),
            ));
        }
        if metadata.format_version() == FormatVersion::V3 {
            let target = Target {
                data_file: file.path.clone(),
                spec_id: file.spec_id,
                partition: file.partition.clone(),
            };
            vectors.push((target, positions.iter().copied().collect()));
            continue;
        }
        by_partition
            .entry(&file.partition)
            .or_default()
            .insert(&file.path, positions.clone());
    }
    if !vectors.is_empty() {
        let path = format!(
            "{}/{file_prefix}-{VECTORS_SUFFIX}.puffin",
            crate::location::data_location(metadata)
        );
        return crate::deletion_vectors::write(table, &path, &vectors)
            .await
            .map_err(|e| iceberg_error(Phase::PreCommit, "cannot write deletion vectors", e));
    }
    let mut files = Vec::new();
    for (partition, rows) in by_partition {
        let key = (!spec.is_unpartitioned()).then(|| {
            PartitionKey::new(
                spec.as_ref().clone(),
                metadata.current_schema().clone(),
                partition.clone(),
            )
        });
        files.extend(
            write_partition(table, file_prefix.clone(), target_file_size, key, rows).await?,
        );
    }
    Ok(files)
}

/// One partition's position-delete file: `rows` (path → positions) sorted by path then position.
async fn write_partition(
    table: &Table,
    file_prefix: String,
    target_file_size: usize,
    partition: Option<PartitionKey>,
    rows: BTreeMap<&str, Vec<u64>>,
) -> Result<Vec<DataFile>> {
    let error = |what: &str, e| iceberg_error(Phase::PreCommit, what.to_string(), e);
    let schema = Arc::new(
        Schema::builder()
            .with_fields(vec![
                delete_file_path_field().clone(),
                delete_file_pos_field().clone(),
            ])
            .build()
            .map_err(|e| error("cannot build the position-delete schema", e))?,
    );
    let arrow = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(&schema)
            .map_err(|e| error("cannot convert the position-delete schema", e))?,
    );
    let only_file = (rows.len() == 1)
        .then(|| rows.keys().next().map(|p| p.to_string()))
        .flatten();
    let mut paths = Vec::new();
    let mut positions = Vec::new();
    for (path, mut named) in rows {
        named.sort_unstable();
        named.dedup();
        paths.extend(std::iter::repeat_n(path, named.len()));
        positions.extend(named.into_iter().map(|p| p as i64));
    }
    let batch = RecordBatch::try_new(
        arrow,
        vec![
            Arc::new(StringArray::from(paths)),
            Arc::new(Int64Array::from(positions)),
        ],
    )
    .map_err(|e| {
        connector_api::Error::bug(Phase::PreCommit, "cannot build the position deletes")
            .with_source(e)
    })?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        // Exact `file_path` bounds: readers match a one-file delete to its data file by them.
        .set_statistics_truncate_length(None)
        .build();
    let mut writer = RollingFileWriterBuilder::new(
        ParquetWriterBuilder::new(props, schema),
        target_file_size,
        table.file_io().clone(),
        EscapedLocations::new(table.metadata()),
        DefaultFileNameGenerator::new(
            file_prefix,
            Some(FILE_SUFFIX.into()),
            DataFileFormat::Parquet,
        ),
    )
    .build();
    writer
        .write(&partition, &batch)
        .await
        .map_err(|e| error("cannot write a position-delete file", e))?;
    let spec_id = table.metadata().default_partition_spec_id();
    let data = partition
        .as_ref()
        .map_or_else(Struct::empty, |k| k.data().clone());
    writer
        .close()
        .await
        .map_err(|e| error("cannot close a position-delete file", e))?
        .into_iter()
        .map(|mut file| {
            file.content(DataContentType::PositionDeletes)
                .partition(data.clone())
                .partition_spec_id(spec_id)
                .referenced_data_file(only_file.clone());
            file.build().map_err(|e| {
                connector_api::Error::bug(
                    Phase::PreCommit,
                    "cannot describe a position-delete file",
                )
                .with_source(e)
            })
        })
        .collect()
}
