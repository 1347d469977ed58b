//! Writing Arrow batches into Parquet data files of a table (not yet visible: a snapshot makes them visible).

use std::sync::Arc;

use arrow_array::RecordBatch;
use connector_api::{Error, ErrorKind, Phase, Result};
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::iceberg_error;

/// Re-labels `batch` with the table's Arrow schema (which carries the Iceberg field ids), checking each column.
fn to_table_batch(
    table_schema: &arrow_schema::SchemaRef,
    batch: &RecordBatch,
) -> Result<RecordBatch> {
    let mut columns = Vec::with_capacity(table_schema.fields().len());
    for field in table_schema.fields() {
        let column = batch.column_by_name(field.name()).ok_or_else(|| {
            Error::new(
                ErrorKind::BadRecord,
                Phase::Write,
                format!(
                    "batch has no column {:?}, which the table's schema requires",
                    field.name()
                ),
            )
        })?;
        if column.data_type() != field.data_type() {
            return Err(Error::new(
                ErrorKind::BadRecord,
                Phase::Write,
                format!(
                    "column {:?} has type {} but the table's schema says {}",
                    field.name(),
                    column.data_type(),
                    field.data_type()
                ),
            ));
        }
        columns.push(column.clone());
    }
    RecordBatch::try_new(table_schema.clone(), columns).map_err(|e| {
        Error::new(
            ErrorKind::BadRecord,
            Phase::Write,
            "batch does not fit the table's schema (nulls in a required column?)",
        )
        .with_source(e)
    })
}

/// Writes `batches` into zstd-compressed Parquet data files under the table's data location, named
/// `<file_prefix>-<n>.parquet`. The files are invisible until a snapshot references them.
///
/// `file_prefix` must be unique per sink, subtask and checkpoint attempt so two attempts never write the same path.
pub async fn write_data_files(
    table: &Table,
    file_prefix: &str,
    batches: &[RecordBatch],
) -> Result<Vec<DataFile>> {
    let metadata = table.metadata();
    let arrow_schema = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(metadata.current_schema()).map_err(|e| {
            iceberg_error(Phase::Write, "cannot convert the table schema to Arrow", e)
        })?,
    );
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let locations = DefaultLocationGenerator::new(metadata)
        .map_err(|e| iceberg_error(Phase::Write, "cannot derive the table's data location", e))?;
    let names =
        DefaultFileNameGenerator::new(file_prefix.to_string(), None, DataFileFormat::Parquet);
    let rolling = RollingFileWriterBuilder::new_with_default_file_size(
        ParquetWriterBuilder::new(props, metadata.current_schema().clone()),
        table.file_io().clone(),
        locations,
        names,
    );
    let mut writer = DataFileWriterBuilder::new(rolling)
        .build(None)
        .await
        .map_err(|e| iceberg_error(Phase::Write, "cannot open a data file writer", e))?;
    for batch in batches {
        let batch = to_table_batch(&arrow_schema, batch)?;
        writer
            .write(batch)
            .await
            .map_err(|e| iceberg_error(Phase::Write, "cannot write a data file", e))?;
    }
    writer
        .close()
        .await
        .map_err(|e| iceberg_error(Phase::PreCommit, "cannot close data files", e))
}
