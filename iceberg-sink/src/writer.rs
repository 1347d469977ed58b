//! Writing one checkpoint's Arrow batches into zstd Parquet data files of a table, following its partition spec
//! and rolling to a new file past a target size. The files are invisible until a snapshot references them.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use connector_api::{Error, ErrorKind, Phase, Result};
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::DefaultFileNameGenerator;
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::partitioning::PartitioningWriter;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::iceberg_error;
use crate::location::EscapedLocations;

type FileWriterBuilder =
    DataFileWriterBuilder<ParquetWriterBuilder, EscapedLocations, DefaultFileNameGenerator>;

enum Layout {
    Unpartitioned(Box<dyn IcebergWriter>),
    Partitioned(Box<Partitioned>),
}

struct Partitioned {
    splitter: RecordBatchPartitionSplitter,
    fanout: FanoutWriter<FileWriterBuilder>,
}

/// The data files of one checkpoint attempt, being written.
pub struct CheckpointWriter {
    table_schema: arrow_schema::SchemaRef,
    layout: Layout,
    table: String,
}

impl CheckpointWriter {
    /// Opens writers for `table`; files are named `<file_prefix>-<n>.parquet` (under the partition's directory).
    ///
    /// `file_prefix` must be unique per subtask and checkpoint attempt so two attempts never write the same path.
    pub async fn open(table: &Table, file_prefix: String, target_file_size: usize) -> Result<Self> {
        let metadata = table.metadata();
        let name = table.identifier().to_string();
        let table_schema = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(metadata.current_schema()).map_err(|e| {
                iceberg_error(
                    Phase::Begin,
                    format!("cannot convert the schema of {name} to Arrow"),
                    e,
                )
            })?,
        );
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build();
        let locations = EscapedLocations::new(metadata);
        let names = DefaultFileNameGenerator::new(file_prefix, None, DataFileFormat::Parquet);
        let builder = DataFileWriterBuilder::new(RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(props, metadata.current_schema().clone()),
            target_file_size,
            table.file_io().clone(),
            locations,
            names,
        ));
        let spec = metadata.default_partition_spec();
        let layout = if spec.is_unpartitioned() {
            let writer = builder
                .build(None)
                .await
                .map_err(|e| iceberg_error(Phase::Begin, "cannot open a data file writer", e))?;
            Layout::Unpartitioned(Box::new(writer))
        } else {
            let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(
                metadata.current_schema().clone(),
                spec.clone(),
            )
            .map_err(|e| {
                iceberg_error(
                    Phase::Begin,
                    format!("cannot follow the partition spec of {name}"),
                    e,
                )
            })?;
            Layout::Partitioned(Box::new(Partitioned {
                splitter,
                fanout: FanoutWriter::new(builder),
            }))
        };
        Ok(Self {
            table_schema,
            layout,
            table: name,
        })
    }

    /// Writes one batch.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the column when the batch does not fit the table's schema
    /// (nothing of the batch is written); retryable/fatal storage errors otherwise.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let batch = to_table_batch(&self.table, &self.table_schema, batch)?;
        let write_error = |e| iceberg_error(Phase::Write, "cannot write a data file", e);
        match &mut self.layout {
            Layout::Unpartitioned(writer) => writer.write(batch).await.map_err(write_error),
            Layout::Partitioned(partitioned) => {
                let Partitioned { splitter, fanout } = partitioned.as_mut();
                let parts = splitter.split(&batch).map_err(|e| {
                    Error::new(
                        ErrorKind::BadRecord,
                        Phase::Write,
                        format!("cannot compute the partition of a batch for {}", self.table),
                    )
                    .with_source(e)
                })?;
                for (key, part) in parts {
                    fanout.write(key, part).await.map_err(write_error)?;
                }
                Ok(())
            }
        }
    }

    /// Checks that `batch` fits the table's schema, writing nothing (the upsert mode checks its rows when they
    /// arrive and writes them at pre-commit).
    ///
    /// # Errors
    /// As [`write`](Self::write)'s [`BadRecord`](ErrorKind::BadRecord).
    pub fn check(&self, batch: &RecordBatch) -> Result<()> {
        to_table_batch(&self.table, &self.table_schema, batch).map(drop)
    }

    /// Closes every open file and returns the data files written.
    pub async fn close(self) -> Result<Vec<DataFile>> {
        let close_error = |e| iceberg_error(Phase::PreCommit, "cannot close data files", e);
        match self.layout {
            Layout::Unpartitioned(mut writer) => writer.close().await.map_err(close_error),
            Layout::Partitioned(partitioned) => {
                partitioned.fanout.close().await.map_err(close_error)
            }
        }
    }
}

/// Whether `a` and `b` are timestamps of one unit in zones that both mean UTC (`UTC`, `+00:00`, ...): the Kafka
/// source and the JSON decoding say `UTC`, iceberg-rust's schemas `+00:00`. The values are the same instants.
fn utc_alike(a: &DataType, b: &DataType) -> bool {
    const UTC: [&str; 6] = ["UTC", "+00:00", "Z", "Etc/UTC", "+0000", "00:00"];
    match (a, b) {
        (DataType::Timestamp(unit_a, Some(a)), DataType::Timestamp(unit_b, Some(b))) => {
            unit_a == unit_b && a != b && UTC.contains(&a.as_ref()) && UTC.contains(&b.as_ref())
        }
        _ => false,
    }
}

/// `column` with the data type `to`, of the same physical layout (a time zone label changed).
fn relabel(column: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    let data = column
        .to_data()
        .into_builder()
        .data_type(to.clone())
        .build()
        .map_err(|e| {
            Error::bug(Phase::Write, "cannot relabel a timestamp column").with_source(e)
        })?;
    Ok(arrow_array::make_array(data))
}

/// Re-labels `batch` with the table's Arrow schema (which carries the Iceberg field ids), checking each column.
pub(crate) fn to_table_batch(
    table: &str,
    table_schema: &arrow_schema::SchemaRef,
    batch: &RecordBatch,
) -> Result<RecordBatch> {
    let bad = |message: String| Error::new(ErrorKind::BadRecord, Phase::Write, message);
    let mut columns = Vec::with_capacity(table_schema.fields().len());
    for field in table_schema.fields() {
        let Some(column) = batch.column_by_name(field.name()) else {
            if field.is_nullable() {
                columns.push(arrow_array::new_null_array(
                    field.data_type(),
                    batch.num_rows(),
                ));
                continue;
            }
            return Err(bad(format!(
                "the batch has no column {:?}, which table {table} requires",
                field.name()
            )));
        };
        let column = if utc_alike(column.data_type(), field.data_type()) {
            relabel(column, field.data_type())?
        } else {
            column.clone()
        };
        if column.data_type() != field.data_type() {
            return Err(bad(format!(
                "column {:?} has type {} but table {table} says {}: convert it upstream or change the table",
                field.name(),
                column.data_type(),
                field.data_type()
            )));
        }
        if !field.is_nullable() && column.null_count() > 0 {
            return Err(bad(format!(
                "column {:?} holds {} null(s) but table {table} declares it required",
                field.name(),
                column.null_count()
            )));
        }
        columns.push(column);
    }
    if let Some(extra) = batch
        .schema()
        .fields()
        .iter()
        .find(|f| table_schema.field_with_name(f.name()).is_err())
    {
        return Err(bad(format!(
            "the batch has a column {:?} that table {table} does not have: add it to the table or drop it upstream",
            extra.name()
        )));
    }
    RecordBatch::try_new(table_schema.clone(), columns).map_err(|e| {
        bad(format!(
            "the batch does not fit the schema of table {table}"
        ))
        .with_source(e)
    })
}

#[cfg(test)]
mod tests {
    use arrow_array::TimestampMicrosecondArray;
    use arrow_schema::{Field, Schema, TimeUnit};

    use super::*;

    #[test]
    fn a_utc_timestamp_fits_a_table_that_says_plus_zero() {
        let micros = |tz: &str| DataType::Timestamp(TimeUnit::Microsecond, Some(tz.into()));
        let table = Arc::new(Schema::new(vec![Field::new("at", micros("+00:00"), true)]));
        let column = TimestampMicrosecondArray::from(vec![1_000_000]).with_timezone("UTC");
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("at", micros("UTC"), true)])),
            vec![Arc::new(column)],
        )
        .unwrap();
        let fitted = to_table_batch("t", &table, &batch).unwrap();
        assert_eq!(fitted.column(0).data_type(), &micros("+00:00"));
        let berlin = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                "at",
                micros("Europe/Berlin"),
                true,
            )])),
            vec![Arc::new(
                TimestampMicrosecondArray::from(vec![1]).with_timezone("Europe/Berlin"),
            )],
        )
        .unwrap();
        assert!(to_table_batch("t", &table, &berlin).is_err());
    }
}
