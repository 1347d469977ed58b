//! Equality-delete files of the upsert mode (`upsert_key`): Parquet files holding the key columns of every key a
//! checkpoint upserted or deleted. Committed in the same snapshot as the checkpoint's data files (a row delta,
//! [`crate::row_delta`]), they remove the keys' rows from every data file of an *earlier* sequence number, and
//! only those (Iceberg spec, "Scan Planning": an equality delete applies to data files whose data sequence number
//! is strictly lower), so the checkpoint's own new rows stay.

use std::sync::Arc;

use arrow_array::RecordBatch;
use connector_api::{Error, ErrorKind, Phase, Result};
use iceberg::spec::{
    DataFile, DataFileFormat, FormatVersion, PartitionKey, PrimitiveType, Schema, Type,
};
use iceberg::table::Table;
use iceberg::writer::base_writer::equality_delete_writer::{
    EqualityDeleteFileWriterBuilder, EqualityDeleteWriterConfig,
};
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::DefaultFileNameGenerator;
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::iceberg_error;
use crate::location::EscapedLocations;
use crate::writer::key_columns;

/// The suffix of an equality-delete file's name: `<data file prefix>-<n>-eqdel.parquet`.
const FILE_SUFFIX: &str = "eqdel";

/// How one table takes equality deletes by a key: the key's field ids and their schema.
#[derive(Debug)]
pub(crate) struct EqualityDeletes {
    ids: Vec<i32>,
    schema: Arc<Schema>,
    arrow: arrow_schema::SchemaRef,
}

impl EqualityDeletes {
    /// Refuses a partitioned `table` for `upsert_deletes = "equality"`: an equality delete reaches only the rows
    /// of its own partition, so a key whose row changes partition would keep its old row.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the table and what to change.
    pub(crate) fn refuse_partitioned(table: &Table) -> Result<()> {
        if table.metadata().default_partition_spec().is_unpartitioned() {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "upsert_key: table {} is partitioned, and equality deletes (upsert_deletes = \"equality\") reach \
                 only their own partition's rows: delete by position (upsert_deletes = \"position\", the \
                 default), or use an unpartitioned table",
                table.identifier()
            ),
        ))
    }

    /// The equality deletes of `table` by the columns `key`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the table and what to change when the table cannot take them: a
    /// format-version 1 table (no delete files), a key column the
    /// table does not have, or one that is not a primitive, non floating-point column (the spec's rule for
    /// equality fields).
    pub(crate) fn of(table: &Table, key: &[String]) -> Result<Self> {
        let metadata = table.metadata();
        let name = table.identifier();
        let refuse = |why: String| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("upsert_key: table {name} {why}"),
            )
        };
        if metadata.format_version() == FormatVersion::V1 {
            return Err(refuse(
                "is an Iceberg format-version 1 table, which has no delete files: upgrade it to version 2 \
                 (format-version = 2) or write without upsert_key (a changelog)"
                    .into(),
            ));
        }
        if key.is_empty() {
            return Err(refuse("was given no key column".into()));
        }
        let current = metadata.current_schema();
        let mut fields = Vec::with_capacity(key.len());
        for column in key {
            let field = current.field_by_name(column).ok_or_else(|| {
                refuse(format!(
                    "has no column {column:?}: name the table's key columns"
                ))
            })?;
            match field.field_type.as_ref() {
                Type::Primitive(PrimitiveType::Float | PrimitiveType::Double) => {
                    return Err(refuse(format!(
                        "has key column {column:?} of a floating-point type, which Iceberg does not allow in \
                         equality deletes: key by other columns"
                    )));
                }
                Type::Primitive(_) => fields.push(field.clone()),
                _ => {
                    return Err(refuse(format!(
                        "has key column {column:?} of a nested type: key by primitive columns"
                    )));
                }
            }
        }
        let ids = fields.iter().map(|f| f.id).collect();
        let schema = Schema::builder()
            .with_schema_id(current.schema_id())
            .with_fields(fields)
            .build()
            .map_err(|e| iceberg_error(Phase::Setup, "cannot build the key's schema", e))?;
        let arrow = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(&schema).map_err(|e| {
                iceberg_error(Phase::Setup, "cannot convert the key's schema to Arrow", e)
            })?,
        );
        Ok(Self {
            ids,
            schema: Arc::new(schema),
            arrow,
        })
    }

    /// Writes the keys of `batches` (each holding at least the key columns, by name) into equality-delete files
    /// named `<file_prefix>-<n>-eqdel.parquet` in the table's data directory, filed under `partition` (`None`:
    /// unpartitioned; it reaches only that partition's rows); nothing when they hold no row.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) when a key column's type does not fit the table; retryable/fatal
    /// storage errors otherwise (the files written so far are unreferenced: recovery's cleanup deletes them).
    pub(crate) async fn write(
        &self,
        table: &Table,
        file_prefix: String,
        target_file_size: usize,
        partition: Option<PartitionKey>,
        batches: &[&RecordBatch],
    ) -> Result<Vec<DataFile>> {
        if batches.iter().all(|b| b.num_rows() == 0) {
            return Ok(Vec::new());
        }
        let name = table.identifier().to_string();
        let config = EqualityDeleteWriterConfig::new(self.ids.clone(), self.schema.clone())
            .map_err(|e| iceberg_error(Phase::PreCommit, "cannot set up equality deletes", e))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build();
        let files = RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(props, self.schema.clone()),
            target_file_size,
            table.file_io().clone(),
            EscapedLocations::new(table.metadata()),
            DefaultFileNameGenerator::new(
                file_prefix,
                Some(FILE_SUFFIX.into()),
                DataFileFormat::Parquet,
            ),
        );
        let mut writer = EqualityDeleteFileWriterBuilder::new(files, config)
            .build(partition)
            .await
            .map_err(|e| {
                iceberg_error(Phase::PreCommit, "cannot open an equality-delete file", e)
            })?;
        for batch in batches.iter().filter(|b| b.num_rows() > 0) {
            let keys = key_columns(&name, &self.arrow, batch)?;
            writer.write(keys).await.map_err(|e| {
                iceberg_error(Phase::PreCommit, "cannot write an equality-delete file", e)
            })?;
        }
        writer
            .close()
            .await
            .map_err(|e| iceberg_error(Phase::PreCommit, "cannot close equality-delete files", e))
    }
}
