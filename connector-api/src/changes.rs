//! Change streams: batches whose rows are changes to a table (a CDC source such as Debezium), not facts to append.
//!
//! A source that decodes changes marks its change columns with the field metadata key [`CHANGE_COLUMN`]: the
//! operation column [`OP_COLUMN`] (`c` insert, `u` update, `r` snapshot read, `d` delete) and the change's
//! provenance (source position, timestamps). The other columns are the row: its state after the change, or
//! before it for a delete (at least the key).
//!
//! A sink that writes by key *applies* the changes ([`ChangeColumns::apply`]: within a batch the last change
//! per key wins, deletes by key, the rest upserted, the change columns dropped); a sink that appends writes the
//! batch as it is, a changelog a `MERGE` can apply later (every change once, in source order).

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Schema, SchemaRef};

use crate::{Error, ErrorKind, Phase, Result};

/// The field metadata key marking a change column (its value says which: `op` or `source`).
pub const CHANGE_COLUMN: &str = "ratchet.change";
/// The name of the operation column of a change stream (`c`, `u`, `r` or `d`).
pub const OP_COLUMN: &str = "__op";

/// The change columns of a schema, and the row columns beside them.
#[derive(Debug, Clone)]
pub struct ChangeColumns {
    op: usize,
    row: Vec<usize>,
    table: SchemaRef,
}

/// A batch of changes split into what a keyed sink does with it.
#[derive(Debug, Clone)]
pub struct AppliedChanges {
    /// The rows to insert or update: the last change of each key that is not a delete, in the table's columns
    /// (the change columns dropped), in source order.
    pub upserts: RecordBatch,
    /// The keys to delete: the last change of each key that is a delete, the key columns in the order given.
    pub deletes: RecordBatch,
}

impl ChangeColumns {
    /// The change columns of `schema`, or `None` when it is not a change stream (no column is marked
    /// [`CHANGE_COLUMN`]).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when change columns are marked but [`OP_COLUMN`] is not one of them, or is
    /// not a string.
    pub fn of(schema: &Schema) -> Result<Option<Self>> {
        let marked = |i: &usize| schema.field(*i).metadata().contains_key(CHANGE_COLUMN);
        if !(0..schema.fields().len()).any(|i| marked(&i)) {
            return Ok(None);
        }
        let op = schema
            .index_of(OP_COLUMN)
            .ok()
            .filter(|i| marked(i) && schema.field(*i).data_type() == &DataType::Utf8)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Config,
                    Phase::Setup,
                    format!("the batches have change columns but no string column {OP_COLUMN:?} marked as one"),
                )
            })?;
        let row: Vec<usize> = (0..schema.fields().len()).filter(|i| !marked(i)).collect();
        let table = Arc::new(Schema::new(
            row.iter()
                .map(|&i| schema.field(i).clone())
                .collect::<Vec<_>>(),
        ));
        Ok(Some(Self { op, row, table }))
    }

    /// The schema of `schema`'s table rows: without its change columns (as it is when it has none).
    ///
    /// # Errors
    /// As [`of`](Self::of).
    pub fn table_schema(schema: &SchemaRef) -> Result<SchemaRef> {
        Ok(match Self::of(schema)? {
            Some(changes) => changes.table,
            None => schema.clone(),
        })
    }

    /// Which rows of `batch` (of the schema these columns came from) are deletes (operation `d`).
    pub fn deletes(&self, batch: &RecordBatch) -> Vec<bool> {
        let ops = batch.column(self.op).as_string::<i32>();
        (0..batch.num_rows())
            .map(|i| ops.is_valid(i) && ops.value(i) == "d")
            .collect()
    }

    /// Splits `batch` (of the schema these columns came from) into the upserts and deletes a sink keyed by `key`
    /// (columns of the table) applies: per key only its last change counts (a key inserted then deleted in the
    /// batch is deleted; one deleted then inserted again is upserted), so the two parts share no key and may be
    /// applied in either order.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a key column the rows do not have; [`BadRecord`](ErrorKind::BadRecord)
    /// for a row whose operation is null or not one of `c`, `u`, `r`, `d` (naming it and its position in the
    /// batch).
    pub fn apply(&self, batch: &RecordBatch, key: &[String]) -> Result<AppliedChanges> {
        let mut applied = self.apply_all(std::slice::from_ref(batch), key)?;
        Ok(applied.remove(0))
    }

    /// Checks the operation of every row of `batch` (of the schema these columns came from) without applying
    /// anything, and returns its row columns (the change columns dropped, nothing copied).
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the first row whose operation is null or not one of `c`, `u`,
    /// `r`, `d`.
    pub fn checked_rows(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let ops = batch.column(self.op).as_string::<i32>();
        for i in 0..batch.num_rows() {
            is_delete(ops, i, None)?;
        }
        let columns = self.row.iter().map(|&i| batch.column(i).clone()).collect();
        RecordBatch::try_new(self.table.clone(), columns).map_err(|e| {
            Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "the change rows cannot be split",
            )
            .with_source(e)
        })
    }

    /// [`apply`](Self::apply) over `batches` in order, as if they were one batch (a key's last change in a later
    /// batch wins), without concatenating them: per batch, the upserts and deletes it holds that count. The
    /// parts share no key.
    ///
    /// # Errors
    /// As [`apply`](Self::apply); a bad operation is named by its batch and row.
    pub fn apply_all(
        &self,
        batches: &[RecordBatch],
        key: &[String],
    ) -> Result<Vec<AppliedChanges>> {
        let key_columns = key
            .iter()
            .map(|k| {
                self.table.index_of(k).map(|i| self.row[i]).map_err(|_| {
                    Error::new(
                        ErrorKind::Config,
                        Phase::Setup,
                        format!("the key column {k:?} is not a column of the change rows"),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let latest = last_rows_per_key(batches, &key_columns)?;
        batches
            .iter()
            .zip(latest)
            .enumerate()
            .map(|(n, (batch, latest))| {
                let ops = batch.column(self.op).as_string::<i32>();
                let (mut upserts, mut deletes) = (Vec::new(), Vec::new());
                for i in latest {
                    if is_delete(ops, i, (batches.len() > 1).then_some(n))? {
                        deletes.push(i as u32);
                    } else {
                        upserts.push(i as u32);
                    }
                }
                let upserts = take_columns(batch, &self.row, &upserts, self.table.clone())?;
                let key_schema = Arc::new(Schema::new(
                    key_columns
                        .iter()
                        .map(|&i| batch.schema().field(i).clone())
                        .collect::<Vec<_>>(),
                ));
                let deletes = take_columns(batch, &key_columns, &deletes, key_schema)?;
                Ok(AppliedChanges { upserts, deletes })
            })
            .collect()
    }
}

/// Whether change row `i` (of batch `batch`, when there are several) is a delete; `c`, `u` and `r` are upserts.
fn is_delete(ops: &arrow_array::StringArray, i: usize, batch: Option<usize>) -> Result<bool> {
    match (!ops.is_null(i)).then(|| ops.value(i)) {
        Some("c" | "u" | "r") => Ok(false),
        Some("d") => Ok(true),
        other => {
            let at = match batch {
                Some(n) => format!("change row {i} of batch {n}"),
                None => format!("change row {i} of the batch"),
            };
            Err(Error::new(
                ErrorKind::BadRecord,
                Phase::Write,
                format!(
                    "{at} has the operation {other:?}; a change is one of \"c\", \"u\", \"r\" or \"d\""
                ),
            ))
        }
    }
}

/// The rows of `batches` (not a change stream, in order, of one schema) a sink keyed by `key` writes: the last
/// row of each key, every row counting as an upsert of its key; per batch, its rows that count, in its order.
///
/// # Errors
/// [`Config`](ErrorKind::Config) for a key column the rows do not have.
pub fn last_rows_by_key(batches: &[RecordBatch], key: &[String]) -> Result<Vec<RecordBatch>> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let schema = first.schema();
    let key_columns = key
        .iter()
        .map(|k| {
            schema.index_of(k).map_err(|_| {
                Error::new(
                    ErrorKind::Config,
                    Phase::Setup,
                    format!("the key column {k:?} is not a column of the rows"),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let all: Vec<usize> = (0..schema.fields().len()).collect();
    batches
        .iter()
        .zip(last_rows_per_key(batches, &key_columns)?)
        .map(|(batch, latest)| {
            let rows: Vec<u32> = latest.into_iter().map(|i| i as u32).collect();
            take_columns(batch, &all, &rows, batch.schema())
        })
        .collect()
}

/// Per batch of `batches` (in order, of one schema), the indices of its rows that are the last of their value of
/// `key_columns` across all of them, ascending. Keys are compared in Arrow's row format, one converter for all.
fn last_rows_per_key(batches: &[RecordBatch], key_columns: &[usize]) -> Result<Vec<Vec<usize>>> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let uncomparable = |e| {
        Error::new(
            ErrorKind::Bug,
            Phase::Write,
            "the rows' keys cannot be compared",
        )
        .with_source(e)
    };
    let converter = arrow_row::RowConverter::new(
        key_columns
            .iter()
            .map(|&i| arrow_row::SortField::new(first.schema().field(i).data_type().clone()))
            .collect(),
    )
    .map_err(uncomparable)?;
    let keys = batches
        .iter()
        .map(|batch| {
            let columns: Vec<ArrayRef> = key_columns
                .iter()
                .map(|&i| batch.column(i).clone())
                .collect();
            converter.convert_columns(&columns)
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(uncomparable)?;
    // From the last row backwards: a key's first sighting is its last change.
    let mut seen: HashSet<arrow_row::Row<'_>> = HashSet::new();
    let mut latest: Vec<Vec<usize>> = vec![Vec::new(); batches.len()];
    for (n, rows) in keys.iter().enumerate().rev() {
        for i in (0..rows.num_rows()).rev() {
            if seen.insert(rows.row(i)) {
                latest[n].push(i);
            }
        }
        latest[n].reverse();
    }
    Ok(latest)
}

/// The rows `indices` of `batch`'s `columns`, as a batch of `schema`.
fn take_columns(
    batch: &RecordBatch,
    columns: &[usize],
    indices: &[u32],
    schema: SchemaRef,
) -> Result<RecordBatch> {
    let indices = UInt32Array::from(indices.to_vec());
    let taken = columns
        .iter()
        .map(|&i| arrow_select::take::take(batch.column(i), &indices, None))
        .collect::<std::result::Result<Vec<_>, _>>()
        .and_then(|columns| {
            RecordBatch::try_new_with_options(
                schema,
                columns,
                &arrow_array::RecordBatchOptions::new().with_row_count(Some(indices.len())),
            )
        });
    taken.map_err(|e| {
        Error::new(
            ErrorKind::Bug,
            Phase::Write,
            "the change rows cannot be split",
        )
        .with_source(e)
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow_array::{Int32Array, StringArray};
    use arrow_schema::Field;

    use super::*;

    fn changes(rows: &[(i32, &str, Option<&str>)]) -> RecordBatch {
        let op = Field::new(OP_COLUMN, DataType::Utf8, false).with_metadata(HashMap::from([(
            CHANGE_COLUMN.to_string(),
            "op".to_string(),
        )]));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, true),
            op,
            Field::new("name", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap()
    }

    fn ids(batch: &RecordBatch) -> Vec<i32> {
        batch
            .column(0)
            .as_primitive::<arrow_array::types::Int32Type>()
            .values()
            .to_vec()
    }

    #[test]
    fn a_schema_without_marked_columns_is_not_a_change_stream() {
        let schema = Schema::new(vec![Field::new(OP_COLUMN, DataType::Utf8, false)]);
        assert!(ChangeColumns::of(&schema).unwrap().is_none());
    }

    #[test]
    fn the_last_change_of_each_key_wins_and_the_change_columns_are_dropped() {
        let batch = changes(&[
            (1, "c", Some("a")),
            (2, "c", Some("b")),
            (1, "d", None),
            (3, "d", None),
            (3, "c", Some("c")),
            (2, "u", Some("b2")),
            (4, "r", Some("d")),
        ]);
        let columns = ChangeColumns::of(&batch.schema()).unwrap().unwrap();
        let applied = columns.apply(&batch, &["id".to_string()]).unwrap();
        assert_eq!(applied.upserts.schema().fields().len(), 2);
        assert_eq!(ids(&applied.upserts), vec![3, 2, 4]);
        let names = applied.upserts.column(1).as_string::<i32>();
        assert_eq!(names.value(1), "b2");
        assert_eq!(ids(&applied.deletes), vec![1]);
        assert_eq!(
            columns.deletes(&batch),
            [false, false, true, true, false, false, false]
        );
        assert_eq!(applied.deletes.schema().field(0).name(), "id");
    }

    #[test]
    fn an_unknown_operation_is_a_bad_record() {
        let batch = changes(&[(1, "t", None)]);
        let columns = ChangeColumns::of(&batch.schema()).unwrap().unwrap();
        let err = columns.apply(&batch, &["id".to_string()]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRecord);
        assert!(err.to_string().contains("\"t\""), "{err}");
        let err = columns.apply(&batch, &["nope".to_string()]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
    }

    #[test]
    fn plain_rows_keep_the_last_row_of_each_key_in_batch_order_across_batches() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![1, 2, 1, 3, 2])),
                Arc::new(StringArray::from(vec!["a", "b", "c", "d", "e"])),
            ],
        )
        .unwrap();
        let key = ["id".to_string()];
        let last = last_rows_by_key(std::slice::from_ref(&batch), &key).unwrap();
        assert_eq!(ids(&last[0]), vec![1, 3, 2]);
        let names: Vec<&str> = last[0]
            .column(1)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        assert_eq!(names, vec!["c", "d", "e"]);
        // Across batches, without concatenating them: a later batch's row of a key wins.
        let later = batch.slice(3, 1);
        let last = last_rows_by_key(&[batch.clone(), later], &key).unwrap();
        assert_eq!((ids(&last[0]), ids(&last[1])), (vec![1, 2], vec![3]));
        let missing = last_rows_by_key(&[batch], &["order_id".to_string()]).unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::Config);
        assert!(missing.to_string().contains("order_id"), "{missing}");
    }
}
