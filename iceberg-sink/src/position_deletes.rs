//! Position-delete files of the upsert mode (`upsert_deletes = "position"`, format-version 2 tables): Parquet
//! files of (`file_path`, `pos`) rows, the data file and position of every row a checkpoint's upserts and deletes
//! replace ([`crate::key_index`]), sorted by path then position as the spec requires. Committed in the snapshot
//! that adds the checkpoint's new rows (a row delta, [`crate::row_delta`]); a position delete applies to data
//! files of a sequence number up to its own, and names rows of earlier snapshots only, so the new rows stay.
//!
//! The file's `file_path` bounds are written untruncated, so a reader that sees both bounds equal (one data file)
//! can match the file to its data file by path alone; such a file also records it as `referenced_data_file`.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use connector_api::{Phase, Result};
use iceberg::metadata_columns::{delete_file_path_field, delete_file_pos_field};
use iceberg::spec::{DataContentType, DataFile, DataFileFormat, Schema, Struct};
use iceberg::table::Table;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::DefaultFileNameGenerator;
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::iceberg_error;
use crate::location::EscapedLocations;

/// The suffix of a position-delete file's name: `<data file prefix>-<n>-posdel.parquet`.
const FILE_SUFFIX: &str = "posdel";

/// The rows to delete: data file path → positions (any order, no duplicates needed).
pub(crate) type DeletedRows = BTreeMap<Arc<str>, Vec<u64>>;

/// Writes `deleted` as position-delete files named `<file_prefix>-<n>-posdel.parquet` in the table's data
/// directory (unpartitioned tables: the upsert mode's), rolling past `target_file_size`; nothing when empty.
///
/// # Errors
/// Retryable/fatal storage errors (the files written so far are unreferenced: recovery's cleanup deletes them).
pub(crate) async fn write_position_deletes(
    table: &Table,
    file_prefix: String,
    target_file_size: usize,
    mut deleted: DeletedRows,
) -> Result<Vec<DataFile>> {
    deleted.retain(|_, positions| !positions.is_empty());
    if deleted.is_empty() {
        return Ok(Vec::new());
    }
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
    let mut paths = Vec::new();
    let mut positions = Vec::new();
    for (path, mut rows) in deleted.iter().map(|(p, r)| (p, r.clone())) {
        rows.sort_unstable();
        rows.dedup();
        paths.extend(std::iter::repeat_n(path.as_ref(), rows.len()));
        positions.extend(rows.into_iter().map(|p| p as i64));
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
        .write(&None, &batch)
        .await
        .map_err(|e| error("cannot write a position-delete file", e))?;
    let spec_id = table.metadata().default_partition_spec_id();
    let only_file = (deleted.len() == 1)
        .then(|| deleted.keys().next().map(|p| p.to_string()))
        .flatten();
    writer
        .close()
        .await
        .map_err(|e| error("cannot close a position-delete file", e))?
        .into_iter()
        .map(|mut file| {
            file.content(DataContentType::PositionDeletes)
                .partition(Struct::empty())
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
