//! Row lineage through a compaction of a format-version 3 table: a row a compaction moves keeps its `_row_id` and
//! `_last_updated_sequence_number`, so the rewrite writes both into the new file (the spec's rule for moved rows;
//! left null they would be inherited from the new file, giving the row a new identity).
//!
//! An input row's values are those written in its file (a row an earlier compaction moved) or else inherited:
//! its file's `first_row_id` plus its position, and its file's data sequence number.

use arrow_array::{Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use connector_api::{Error, ErrorKind, Phase, Result};
use iceberg::metadata_columns::{
    RESERVED_COL_NAME_LAST_UPDATED_SEQUENCE_NUMBER, RESERVED_COL_NAME_ROW_ID,
    RESERVED_FIELD_ID_LAST_UPDATED_SEQUENCE_NUMBER, RESERVED_FIELD_ID_ROW_ID,
};
use iceberg::table::Table;
use std::sync::Arc;

use crate::compaction::OwnFile;

/// The lineage of one input file's rows.
#[derive(Debug)]
pub(crate) struct InputLineage {
    first_row_id: i64,
    sequence: i64,
    /// The values written in the file, by position (`None`: the file has no such column).
    row_ids: Option<Vec<Option<i64>>>,
    sequences: Option<Vec<Option<i64>>>,
}

impl InputLineage {
    /// Reads the lineage of `input`'s rows.
    ///
    /// # Errors
    /// [`Fatal`](ErrorKind::Fatal) when the file has no `first_row_id` (a file added before the table's upgrade to
    /// version 3 has none: callers leave such files alone), a file that cannot be read.
    pub(crate) async fn read(table: &Table, input: &OwnFile) -> Result<Self> {
        let file = &input.file;
        let first_row_id = input.first_row_id.ok_or_else(|| {
            Error::new(
                ErrorKind::Fatal,
                Phase::PreCommit,
                format!(
                    "data file {} of format-version 3 table {} has no first_row_id",
                    file.file_path(),
                    table.identifier()
                ),
            )
        })?;
        let written = |id: i32| file.column_sizes().contains_key(&id);
        let read = async |id: i32, name: &str| -> Result<Option<Vec<Option<i64>>>> {
            if !written(id) {
                return Ok(None);
            }
            let batches = crate::key_scan::read_columns(
                table,
                file.file_path(),
                file.file_size_in_bytes(),
                &[id],
                &[name],
                Phase::PreCommit,
            )
            .await?;
            let mut values = Vec::with_capacity(file.record_count() as usize);
            for batch in &batches {
                let column = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .ok_or_else(|| {
                        Error::bug(
                            Phase::PreCommit,
                            format!("column {name} of {} is not a long", file.file_path()),
                        )
                    })?;
                values.extend(column.iter());
            }
            Ok(Some(values))
        };
        Ok(Self {
            first_row_id,
            sequence: input.sequence,
            row_ids: read(RESERVED_FIELD_ID_ROW_ID, RESERVED_COL_NAME_ROW_ID).await?,
            sequences: read(
                RESERVED_FIELD_ID_LAST_UPDATED_SEQUENCE_NUMBER,
                RESERVED_COL_NAME_LAST_UPDATED_SEQUENCE_NUMBER,
            )
            .await?,
        })
    }

    /// The `_row_id` and `_last_updated_sequence_number` of the row at `pos`.
    fn of(&self, pos: u64) -> (i64, i64) {
        let written = |values: &Option<Vec<Option<i64>>>| {
            values
                .as_ref()
                .and_then(|v| v.get(pos as usize).copied().flatten())
        };
        (
            written(&self.row_ids).unwrap_or(self.first_row_id + pos as i64),
            written(&self.sequences).unwrap_or(self.sequence),
        )
    }

    /// `batch` (rows of the input at positions `kept`, in order) with the two lineage columns appended.
    ///
    /// # Errors
    /// A bug: `kept` and `batch` of different lengths.
    pub(crate) fn append(&self, batch: &RecordBatch, kept: &[u64]) -> Result<RecordBatch> {
        let (row_ids, sequences): (Vec<i64>, Vec<i64>) = kept.iter().map(|p| self.of(*p)).unzip();
        let mut fields: Vec<Arc<Field>> = batch.schema().fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(
            RESERVED_COL_NAME_ROW_ID,
            DataType::Int64,
            true,
        )));
        fields.push(Arc::new(Field::new(
            RESERVED_COL_NAME_LAST_UPDATED_SEQUENCE_NUMBER,
            DataType::Int64,
            true,
        )));
        let mut columns = batch.columns().to_vec();
        columns.push(Arc::new(Int64Array::from(row_ids)));
        columns.push(Arc::new(Int64Array::from(sequences)));
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| {
            Error::bug(Phase::PreCommit, "cannot add the row lineage columns").with_source(e)
        })
    }
}
