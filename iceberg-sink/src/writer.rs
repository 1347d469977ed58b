//! Writing one checkpoint's Arrow batches into zstd Parquet data files of a table, following its partition spec
//! and rolling to a new file past a target size. The files are invisible until a snapshot references them.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Array, RecordBatch};
use connector_api::types::exact;
use connector_api::{Error, ErrorKind, Phase, Result};
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::spec::{DataFile, DataFileFormat, PartitionKey, Struct};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::DefaultFileNameGenerator;
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{CurrentFileStatus, IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::iceberg_error;
use crate::location::EscapedLocations;

type FileWriterBuilder =
    DataFileWriterBuilder<ParquetWriterBuilder, EscapedLocations, DefaultFileNameGenerator>;
type FileWriter = DataFileWriter<ParquetWriterBuilder, EscapedLocations, DefaultFileNameGenerator>;

/// Where rows written by [`CheckpointWriter::write_located`] went: row `i` of `rows` (the rows of one partition,
/// in the table's Arrow schema) is row `start + i` of data file `file`, of partition `partition`.
#[derive(Debug)]
pub(crate) struct Located {
    pub(crate) rows: RecordBatch,
    pub(crate) file: String,
    pub(crate) start: u64,
    pub(crate) partition: Struct,
}

/// The data files of one checkpoint attempt, being written.
pub struct CheckpointWriter {
    table_schema: arrow_schema::SchemaRef,
    builder: FileWriterBuilder,
    /// Splits a batch by the partition spec (`None`: an unpartitioned table).
    splitter: Option<RecordBatchPartitionSplitter>,
    /// The open file writer of each partition written so far (one for an unpartitioned table, under
    /// [`Struct::empty`]).
    open: HashMap<Struct, FileWriter>,
    table: String,
}

impl CheckpointWriter {
    /// Opens writers for `table`; files are named `<file_prefix>-<n>.parquet` (under the partition's directory).
    ///
    /// `file_prefix` must be unique per subtask and checkpoint attempt so two attempts never write the same path.
    pub async fn open(table: &Table, file_prefix: String, target_file_size: usize) -> Result<Self> {
        let schema = table.metadata().current_schema().clone();
        Self::open_with(table, schema, file_prefix, target_file_size).await
    }

    /// [`open`](Self::open) for a compaction of a format-version 3 table: the files also hold each row's
    /// `_row_id` and `_last_updated_sequence_number` (the spec's row lineage, which a moved row must keep: its
    /// batches carry both columns, by those names).
    pub(crate) async fn open_keeping_lineage(
        table: &Table,
        file_prefix: String,
        target_file_size: usize,
    ) -> Result<Self> {
        let current = table.metadata().current_schema();
        let mut fields: Vec<_> = current.as_struct().fields().to_vec();
        fields.push(iceberg::metadata_columns::row_id_field().clone());
        fields.push(iceberg::metadata_columns::last_updated_sequence_number_field().clone());
        let schema = iceberg::spec::Schema::builder()
            .with_schema_id(current.schema_id())
            .with_identifier_field_ids(current.identifier_field_ids())
            .with_fields(fields)
            .build()
            .map_err(|e| {
                iceberg_error(
                    Phase::PreCommit,
                    "cannot add the row lineage columns to the schema",
                    e,
                )
            })?;
        Self::open_with(table, Arc::new(schema), file_prefix, target_file_size).await
    }

    /// [`open`](Self::open) writing files of `schema` (the table's current one, or it with metadata columns).
    async fn open_with(
        table: &Table,
        schema: iceberg::spec::SchemaRef,
        file_prefix: String,
        target_file_size: usize,
    ) -> Result<Self> {
        let metadata = table.metadata();
        let name = table.identifier().to_string();
        let table_schema = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).map_err(
            |e| {
                iceberg_error(
                    Phase::Begin,
                    format!("cannot convert the schema of {name} to Arrow"),
                    e,
                )
            },
        )?);
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build();
        let locations = EscapedLocations::new(metadata);
        let names = DefaultFileNameGenerator::new(file_prefix, None, DataFileFormat::Parquet);
        let builder = DataFileWriterBuilder::new(RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(props, schema.clone()),
            target_file_size,
            table.file_io().clone(),
            locations,
            names,
        ));
        let spec = metadata.default_partition_spec();
        let splitter = match spec.is_unpartitioned() {
            true => None,
            false => Some(
                RecordBatchPartitionSplitter::try_new_with_computed_values(schema, spec.clone())
                    .map_err(|e| {
                        iceberg_error(
                            Phase::Begin,
                            format!("cannot follow the partition spec of {name}"),
                            e,
                        )
                    })?,
            ),
        };
        let mut writer = Self {
            table_schema,
            builder,
            splitter,
            open: HashMap::new(),
            table: name,
        };
        if writer.splitter.is_none() {
            // Opened now, as before a first write: a storage that refuses is reported at begin.
            writer.writer_for(None, Phase::Begin).await?;
        }
        Ok(writer)
    }

    /// Writes one batch.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the column when the batch does not fit the table's schema
    /// (nothing of the batch is written); retryable/fatal storage errors otherwise.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        for (key, part) in self.split(batch, Phase::Write)? {
            let writer = self.writer_for(key, Phase::Write).await?;
            writer
                .write(part)
                .await
                .map_err(|e| iceberg_error(Phase::Write, "cannot write a data file", e))?;
        }
        Ok(())
    }

    /// Writes one batch and returns where its rows went, per partition: each part's rows (in the table's types,
    /// the batch's order within the partition) and the file and position of its first row. A part never spans two
    /// files: iceberg's rolling writer rolls only before a batch, and the Parquet writer keeps the rows in order.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub(crate) async fn write_located(&mut self, batch: &RecordBatch) -> Result<Vec<Located>> {
        let mut located = Vec::new();
        for (key, part) in self.split(batch, Phase::PreCommit)? {
            if part.num_rows() == 0 {
                continue;
            }
            let partition = key
                .as_ref()
                .map_or_else(Struct::empty, |k| k.data().clone());
            let writer = self.writer_for(key, Phase::PreCommit).await?;
            writer
                .write(part.clone())
                .await
                .map_err(|e| iceberg_error(Phase::PreCommit, "cannot write a data file", e))?;
            let start = writer.current_row_num() - part.num_rows();
            located.push(Located {
                file: writer.current_file_path(),
                start: start as u64,
                rows: part,
                partition,
            });
        }
        Ok(located)
    }

    /// `batch` in the table's types, split by the partition spec (one part, no key, for an unpartitioned table).
    fn split(
        &self,
        batch: &RecordBatch,
        phase: Phase,
    ) -> Result<Vec<(Option<PartitionKey>, RecordBatch)>> {
        let batch = to_table_batch(&self.table, &self.table_schema, batch)?;
        let Some(splitter) = &self.splitter else {
            return Ok(vec![(None, batch)]);
        };
        let parts = splitter.split(&batch).map_err(|e| {
            Error::new(
                ErrorKind::BadRecord,
                phase,
                format!("cannot compute the partition of a batch for {}", self.table),
            )
            .with_source(e)
        })?;
        Ok(parts
            .into_iter()
            .map(|(key, part)| (Some(key), part))
            .collect())
    }

    /// The open writer of the partition `key` names (opened now if it is the partition's first rows).
    async fn writer_for(
        &mut self,
        key: Option<PartitionKey>,
        phase: Phase,
    ) -> Result<&mut FileWriter> {
        let partition = key
            .as_ref()
            .map_or_else(Struct::empty, |k| k.data().clone());
        if !self.open.contains_key(&partition) {
            let writer = self
                .builder
                .build(key)
                .await
                .map_err(|e| iceberg_error(phase, "cannot open a data file writer", e))?;
            self.open.insert(partition.clone(), writer);
        }
        Ok(self.open.get_mut(&partition).expect("opened above"))
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
        let mut files = Vec::new();
        for (_, mut writer) in self.open {
            files.extend(
                writer
                    .close()
                    .await
                    .map_err(|e| iceberg_error(Phase::PreCommit, "cannot close data files", e))?,
            );
        }
        Ok(files)
    }
}

/// `batch` in the table's Arrow schema (which carries the Iceberg field ids): each column converted exactly
/// ([`exact::convert`]: a millisecond timestamp widened to microseconds, an enum's dictionary as text, `Binary` as
/// the table's `LargeBinary`, nested fields relabelled with their ids), or refused naming the field.
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
        let source = batch.schema();
        let source = source.field_with_name(field.name()).ok();
        let text;
        let column = match source.is_some_and(crate::types::uuid_as_text)
            && field.data_type() == &arrow_schema::DataType::Utf8
        {
            true => {
                text = uuid_text(column);
                &text
            }
            false => column,
        };
        let column = exact::convert(column, field.data_type()).map_err(|refusal| {
            let refusal =
                connector_api::types::Refusal::new(refusal.path, refusal.why).under(field.name());
            bad(format!(
                "table {table} refuses the batch: {refusal} (docs/types.md)"
            ))
        })?;
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

/// The columns of `key_schema` taken from `batch` by name and converted exactly into their table types
/// ([`to_table_batch`]).
///
/// # Errors
/// [`BadRecord`](ErrorKind::BadRecord) naming a key column the batch lacks, one that does not convert, or a null
/// key.
pub(crate) fn key_columns(
    table: &str,
    key_schema: &arrow_schema::SchemaRef,
    batch: &RecordBatch,
) -> Result<RecordBatch> {
    let columns = key_schema
        .fields()
        .iter()
        .map(|field| {
            batch.column_by_name(field.name()).cloned().ok_or_else(|| {
                Error::new(
                    ErrorKind::BadRecord,
                    Phase::PreCommit,
                    format!("the rows have no key column {:?}", field.name()),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let plain = arrow_schema::Schema::new(
        key_schema
            .fields()
            .iter()
            .zip(&columns)
            .map(|(f, c)| arrow_schema::Field::new(f.name(), c.data_type().clone(), true))
            .collect::<Vec<_>>(),
    );
    let keys = RecordBatch::try_new(Arc::new(plain), columns).map_err(|e| {
        Error::bug(Phase::PreCommit, "cannot collect the key columns").with_source(e)
    })?;
    to_table_batch(table, key_schema, &keys)
}

/// A UUID column's values as their canonical text.
fn uuid_text(column: &arrow_array::ArrayRef) -> arrow_array::ArrayRef {
    use arrow_array::cast::AsArray;
    let bytes = column.as_fixed_size_binary();
    let texts: arrow_array::StringArray = bytes
        .iter()
        .map(|v| v.map(connector_api::types::marks::uuid_text))
        .collect();
    std::sync::Arc::new(texts)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::TimestampMicrosecondType;
    use arrow_array::{TimestampMicrosecondArray, TimestampMillisecondArray};
    use arrow_schema::{DataType, Field, Schema, TimeUnit};

    use super::*;

    fn one_column(field: Field, column: arrow_array::ArrayRef) -> RecordBatch {
        RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![column]).unwrap()
    }

    #[test]
    fn instants_in_any_zone_and_unit_fit_a_timestamptz_column_exactly() {
        let micros = |tz: &str| DataType::Timestamp(TimeUnit::Microsecond, Some(tz.into()));
        let table = Arc::new(Schema::new(vec![Field::new("at", micros("+00:00"), true)]));
        for (tz, value) in [("UTC", 1_000_000), ("Europe/Berlin", 1)] {
            let batch = one_column(
                Field::new("at", micros(tz), true),
                Arc::new(TimestampMicrosecondArray::from(vec![value]).with_timezone(tz)),
            );
            let fitted = to_table_batch("t", &table, &batch).unwrap();
            assert_eq!(fitted.column(0).data_type(), &micros("+00:00"));
            assert_eq!(
                fitted
                    .column(0)
                    .as_primitive::<TimestampMicrosecondType>()
                    .value(0),
                value
            );
        }
        let millis = DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into()));
        let batch = one_column(
            Field::new("at", millis, true),
            Arc::new(TimestampMillisecondArray::from(vec![-1]).with_timezone("+00:00")),
        );
        let fitted = to_table_batch("t", &table, &batch).unwrap();
        assert_eq!(
            fitted
                .column(0)
                .as_primitive::<TimestampMicrosecondType>()
                .value(0),
            -1000
        );
        let local = one_column(
            Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Arc::new(TimestampMicrosecondArray::from(vec![1])),
        );
        let err = to_table_batch("t", &table, &local).unwrap_err();
        assert!(err.to_string().contains("field `at`"), "{err}");
    }
}
