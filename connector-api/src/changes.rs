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

use std::collections::{HashMap, HashSet};
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
    /// [`UNAVAILABLE_COLUMN`], when the stream has it.
    unavailable: Option<usize>,
    row: Vec<usize>,
    table: SchemaRef,
}

/// One step of a batch of changes applied in source order ([`ChangeColumns::in_order`]).
#[derive(Debug, Clone)]
pub enum ChangeStep {
    /// Rows to insert or update (the table's columns, the change columns dropped), no key twice.
    Upserts {
        /// The rows.
        rows: RecordBatch,
        /// Columns whose value these changes did not carry ([`UNAVAILABLE_COLUMN`]'s names): an existing row keeps
        /// its value there (a new row gets null).
        unchanged: Vec<String>,
    },
    /// Keys to delete (the key columns in the order given), no key twice.
    Deletes(RecordBatch),
    /// Every row of the table deleted (a truncate).
    Truncate,
}

/// The change column naming, per change, the columns whose value it did not carry (a list of strings; null when
/// none): a CDC source's unavailable values, such as Debezium's TOAST placeholder.
pub const UNAVAILABLE_COLUMN: &str = "__unavailable";

/// A batch of changes split into what a keyed sink does with it.
#[derive(Debug, Clone)]
pub struct AppliedChanges {
    /// The rows to insert or update: the last change of each key that is not a delete, in the table's columns
    /// (the change columns dropped), in source order. A column the last change did not carry
    /// ([`UNAVAILABLE_COLUMN`]) holds the value of the key's latest earlier change that did, when there is one.
    pub upserts: RecordBatch,
    /// The keys to delete: the last change of each key that is a delete, the key columns in the order given.
    pub deletes: RecordBatch,
    /// Per row of `upserts`, the columns whose value neither its change nor an earlier one of the batches carried
    /// (sorted; empty for most rows): the sink must take them from what it holds for the key.
    pub unchanged: Vec<Vec<String>>,
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
        let unavailable = schema
            .index_of(UNAVAILABLE_COLUMN)
            .ok()
            .filter(|i| marked(i) && matches!(schema.field(*i).data_type(), DataType::List(_)));
        Ok(Some(Self {
            op,
            unavailable,
            row,
            table,
        }))
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

    /// The first row of `batch` that is a truncate (operation `t`), if any.
    pub fn first_truncate(&self, batch: &RecordBatch) -> Option<usize> {
        let ops = batch.column(self.op).as_string::<i32>();
        (0..batch.num_rows()).find(|&i| ops.is_valid(i) && ops.value(i) == "t")
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
            kind(ops, i, None)?;
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

    /// The changes of `batch` (of the schema these columns came from) as a sink keyed by `key` applies them in
    /// source order: runs of upserts and runs of deletes, as they came, a run ending before a change of a key it
    /// already holds. Applied one after the other they have the effect of every change applied one by one, so a
    /// table with other unique indexes than the key sees no conflict the source did not have (a primary-key change
    /// arrives as the old key's delete, then the new key's insert).
    ///
    /// # Errors
    /// As [`apply`](Self::apply); a change whose key holds a null is a [`BadRecord`](ErrorKind::BadRecord) naming
    /// the row and the key column (it would delete nothing, or upsert a row no later change can find).
    pub fn in_order(&self, batch: &RecordBatch, key: &[String]) -> Result<Vec<ChangeStep>> {
        let key_columns = self.key_columns(key)?;
        let ops = batch.column(self.op).as_string::<i32>();
        let kinds = (0..batch.num_rows())
            .map(|i| kind(ops, i, None))
            .collect::<Result<Vec<_>>>()?;
        check_keys(batch, &key_columns, None, &kinds)?;
        let keys = key_rows(std::slice::from_ref(batch), &key_columns)?;
        let rows = &keys[0];
        let key_schema = self.key_schema(batch, &key_columns);
        let mut steps = Vec::new();
        let mut run: Vec<u32> = Vec::new();
        let mut run_kind = (Kind::Upsert, Vec::new());
        let mut seen: HashSet<arrow_row::Row<'_>> = HashSet::new();
        let mut flush = |run: &mut Vec<u32>,
                         (kind, unchanged): &(Kind, Vec<String>)|
         -> Result<()> {
            if run.is_empty() {
                return Ok(());
            }
            steps.push(match kind {
                Kind::Delete => {
                    ChangeStep::Deletes(take_columns(batch, &key_columns, run, key_schema.clone())?)
                }
                Kind::Upsert => ChangeStep::Upserts {
                    rows: take_columns(batch, &self.row, run, self.table.clone())?,
                    unchanged: unchanged.clone(),
                },
                Kind::Truncate => ChangeStep::Truncate,
            });
            run.clear();
            Ok(())
        };
        for (i, kind) in kinds.into_iter().enumerate() {
            let this = (kind, self.unchanged(batch, i));
            let repeated = kind != Kind::Truncate && seen.contains(&rows.row(i));
            if this != run_kind || repeated || kind == Kind::Truncate {
                flush(&mut run, &run_kind)?;
                seen.clear();
                run_kind = this;
            }
            if kind != Kind::Truncate {
                seen.insert(rows.row(i));
            }
            run.push(i as u32);
        }
        flush(&mut run, &run_kind)?;
        Ok(steps)
    }

    /// The columns change row `i` of `batch` did not carry ([`UNAVAILABLE_COLUMN`]), sorted: those of the table's
    /// rows only (a name of a column the batches do not have, one a sink left out, says nothing about them).
    pub fn unchanged(&self, batch: &RecordBatch, i: usize) -> Vec<String> {
        let Some(column) = self.unavailable else {
            return Vec::new();
        };
        let lists = batch.column(column).as_list::<i32>();
        if lists.is_null(i) {
            return Vec::new();
        }
        let names = lists.value(i);
        let mut names: Vec<String> = names
            .as_string::<i32>()
            .iter()
            .flatten()
            .filter(|name| self.table.index_of(name).is_ok())
            .map(str::to_string)
            .collect();
        names.sort();
        names
    }

    /// For each last change of a key (`latest`) that did not carry some columns: the columns an earlier change
    /// of the key in `batches` carried, with where (batch, row) their latest value is, and the columns left
    /// (no earlier change since the key's last delete carried them). Keyed by (batch, row).
    #[allow(clippy::type_complexity)]
    fn carried(
        &self,
        batches: &[RecordBatch],
        key_columns: &[usize],
        latest: &[Vec<usize>],
    ) -> Result<HashMap<(usize, usize), (Vec<String>, Vec<(usize, (usize, usize))>)>> {
        let mut out = HashMap::new();
        let Some(unavailable) = self.unavailable else {
            return Ok(out);
        };
        if batches
            .iter()
            .all(|b| b.column(unavailable).null_count() == b.num_rows())
        {
            return Ok(out);
        }
        let last: HashSet<(usize, usize)> = latest
            .iter()
            .enumerate()
            .flat_map(|(n, rows)| rows.iter().map(move |&i| (n, i)))
            .collect();
        let keys = key_rows(batches, key_columns)?;
        // Per key, per column, where its latest carried value is (since the key's last delete).
        let mut state: HashMap<arrow_row::OwnedRow, HashMap<usize, (usize, usize)>> =
            HashMap::new();
        for (n, batch) in batches.iter().enumerate() {
            let ops = batch.column(self.op).as_string::<i32>();
            for i in 0..batch.num_rows() {
                let key = keys[n].row(i).owned();
                if kind(ops, i, None)? == Kind::Delete {
                    state.remove(&key);
                    continue;
                }
                let missing = self.unchanged(batch, i);
                let columns = state.entry(key).or_default();
                if last.contains(&(n, i)) && !missing.is_empty() {
                    let (mut left, mut from) = (Vec::new(), Vec::new());
                    for name in missing {
                        let column = self.table.index_of(&name).map(|c| self.row[c]).ok();
                        match column.and_then(|c| columns.get(&c).map(|at| (c, *at))) {
                            Some(found) => from.push(found),
                            None => left.push(name),
                        }
                    }
                    out.insert((n, i), (left, from));
                }
                for &c in &self.row {
                    let name = batch.schema().field(c).name().clone();
                    if !self.unchanged(batch, i).contains(&name) {
                        columns.insert(c, (n, i));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The table columns of upsert rows whose values come from `sources` (per table column, per row: the batch
    /// and row of its value).
    fn take_carried(
        &self,
        batches: &[RecordBatch],
        sources: &[Vec<(usize, usize)>],
        rows: usize,
    ) -> Result<RecordBatch> {
        let columns = self
            .row
            .iter()
            .zip(sources)
            .map(|(&c, at)| {
                let arrays: Vec<&dyn Array> =
                    batches.iter().map(|b| b.column(c).as_ref()).collect();
                arrow_select::interleave::interleave(&arrays, at)
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .and_then(|columns| {
                RecordBatch::try_new_with_options(
                    self.table.clone(),
                    columns,
                    &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows)),
                )
            });
        columns.map_err(|e| {
            Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "the carried values cannot be taken",
            )
            .with_source(e)
        })
    }

    /// The indices of the key columns `key` among the batches' columns.
    fn key_columns(&self, key: &[String]) -> Result<Vec<usize>> {
        key.iter()
            .map(|k| {
                self.table.index_of(k).map(|i| self.row[i]).map_err(|_| {
                    Error::new(
                        ErrorKind::Config,
                        Phase::Setup,
                        format!("the key column {k:?} is not a column of the change rows"),
                    )
                })
            })
            .collect()
    }

    /// The schema of the key columns of `batch`.
    fn key_schema(&self, batch: &RecordBatch, key_columns: &[usize]) -> SchemaRef {
        Arc::new(Schema::new(
            key_columns
                .iter()
                .map(|&i| batch.schema().field(i).clone())
                .collect::<Vec<_>>(),
        ))
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
        let key_columns = self.key_columns(key)?;
        for (n, batch) in batches.iter().enumerate() {
            let at = (batches.len() > 1).then_some(n);
            let ops = batch.column(self.op).as_string::<i32>();
            let kinds = (0..batch.num_rows())
                .map(|i| match kind(ops, i, at)? {
                    Kind::Truncate => Err(Error::new(
                        ErrorKind::BadRecord,
                        Phase::Write,
                        format!(
                            "change row {i} is a truncate, which this sink cannot apply: let it go to the \
                             dead-letter topic, or refuse truncates in the source (truncate = \"refuse\")"
                        ),
                    )),
                    other => Ok(other),
                })
                .collect::<Result<Vec<_>>>()?;
            check_keys(batch, &key_columns, at, &kinds)?;
        }
        let latest = last_rows_per_key(batches, &key_columns)?;
        let mut carried = self.carried(batches, &key_columns, &latest)?;
        batches
            .iter()
            .zip(latest)
            .enumerate()
            .map(|(n, (batch, latest))| {
                let ops = batch.column(self.op).as_string::<i32>();
                let (mut upserts, mut deletes) = (Vec::new(), Vec::new());
                for i in latest {
                    if kind(ops, i, (batches.len() > 1).then_some(n))? == Kind::Delete {
                        deletes.push(i as u32);
                    } else {
                        upserts.push(i as u32);
                    }
                }
                let mut unchanged = Vec::with_capacity(upserts.len());
                let mut sources: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.row.len()];
                let mut filled = false;
                for &i in &upserts {
                    let (left, from) = carried.remove(&(n, i as usize)).unwrap_or_default();
                    unchanged.push(left);
                    for (c, sources) in sources.iter_mut().enumerate() {
                        let source = from
                            .iter()
                            .find(|(column, _)| *column == self.row[c])
                            .map(|(_, at)| *at);
                        filled |= source.is_some();
                        sources.push(source.unwrap_or((n, i as usize)));
                    }
                }
                let upserts = match filled {
                    false => take_columns(batch, &self.row, &upserts, self.table.clone())?,
                    true => self.take_carried(batches, &sources, upserts.len())?,
                };
                let deletes = take_columns(
                    batch,
                    &key_columns,
                    &deletes,
                    self.key_schema(batch, &key_columns),
                )?;
                Ok(AppliedChanges {
                    upserts,
                    deletes,
                    unchanged,
                })
            })
            .collect()
    }
}

/// What a change does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Upsert,
    Delete,
    Truncate,
}

/// What change row `i` (of batch `batch`, when there are several) does: `c`, `u` and `r` upsert, `d` deletes, `t`
/// truncates.
fn kind(ops: &arrow_array::StringArray, i: usize, batch: Option<usize>) -> Result<Kind> {
    match (!ops.is_null(i)).then(|| ops.value(i)) {
        Some("c" | "u" | "r") => Ok(Kind::Upsert),
        Some("d") => Ok(Kind::Delete),
        Some("t") => Ok(Kind::Truncate),
        other => {
            let at = match batch {
                Some(n) => format!("change row {i} of batch {n}"),
                None => format!("change row {i} of the batch"),
            };
            Err(Error::new(
                ErrorKind::BadRecord,
                Phase::Write,
                format!(
                    "{at} has the operation {other:?}; a change is one of \"c\", \"u\", \"r\", \"d\" or \"t\""
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

/// Refuses a change of `batch` (the `n`th of several) whose key holds a null (a truncate has none), naming the row
/// and the column.
fn check_keys(
    batch: &RecordBatch,
    key_columns: &[usize],
    n: Option<usize>,
    kinds: &[Kind],
) -> Result<()> {
    for &c in key_columns {
        let column = batch.column(c);
        if column.null_count() == 0 {
            continue;
        }
        let Some(row) =
            (0..column.len()).find(|&i| column.is_null(i) && kinds[i] != Kind::Truncate)
        else {
            continue;
        };
        let at = match n {
            Some(n) => format!("change row {row} of batch {n}"),
            None => format!("change row {row} of the batch"),
        };
        return Err(Error::new(
            ErrorKind::BadRecord,
            Phase::Write,
            format!(
                "{at} has no value in the key column {:?}: a change without its key can be applied to no row",
                batch.schema().field(c).name()
            ),
        ));
    }
    Ok(())
}

/// The keys (`key_columns`) of every row of `batches` in Arrow's row format, one converter for all.
fn key_rows(batches: &[RecordBatch], key_columns: &[usize]) -> Result<Vec<arrow_row::Rows>> {
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
    batches
        .iter()
        .map(|batch| {
            let columns: Vec<ArrayRef> = key_columns
                .iter()
                .map(|&i| batch.column(i).clone())
                .collect();
            converter.convert_columns(&columns)
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(uncomparable)
}

/// Per batch of `batches` (in order, of one schema), the indices of its rows that are the last of their value of
/// `key_columns` across all of them, ascending.
fn last_rows_per_key(batches: &[RecordBatch], key_columns: &[usize]) -> Result<Vec<Vec<usize>>> {
    let keys = key_rows(batches, key_columns)?;
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
    fn changes_in_source_order_run_until_the_kind_changes_or_a_key_comes_again() {
        let batch = changes(&[
            (1, "d", None),
            (2, "c", Some("a")),
            (3, "c", Some("b")),
            (2, "u", Some("a2")),
            (4, "d", None),
            (5, "d", None),
        ]);
        let columns = ChangeColumns::of(&batch.schema()).unwrap().unwrap();
        let steps = columns.in_order(&batch, &["id".to_string()]).unwrap();
        let shape: Vec<(bool, Vec<i32>)> = steps
            .iter()
            .map(|s| match s {
                ChangeStep::Upserts { rows, .. } => (false, ids(rows)),
                ChangeStep::Deletes(b) => (true, ids(b)),
                ChangeStep::Truncate => (true, vec![]),
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (true, vec![1]),
                (false, vec![2, 3]),
                (false, vec![2]),
                (true, vec![4, 5])
            ]
        );
    }

    #[test]
    fn a_value_a_change_did_not_carry_comes_from_the_keys_earlier_change() {
        let op = Field::new(OP_COLUMN, DataType::Utf8, false).with_metadata(HashMap::from([(
            CHANGE_COLUMN.to_string(),
            "op".to_string(),
        )]));
        let unavailable = Field::new(
            UNAVAILABLE_COLUMN,
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        )
        .with_metadata(HashMap::from([(
            CHANGE_COLUMN.to_string(),
            "unavailable".to_string(),
        )]));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("body", DataType::Utf8, true),
            op,
            unavailable,
        ]));
        let mut lists =
            arrow_array::builder::ListBuilder::new(arrow_array::builder::StringBuilder::new());
        for missing in [None, Some("body"), Some("body"), Some("body")] {
            match missing {
                Some(name) => {
                    lists.values().append_value(name);
                    lists.append(true);
                }
                None => lists.append_null(),
            }
        }
        // id 1: inserted with its body, then updated without it; id 2: updated without it (body unknown here);
        // id 3: deleted, then updated without it.
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![1, 1, 2, 3])),
                Arc::new(StringArray::from(vec![Some("long text"), None, None, None])),
                Arc::new(StringArray::from(vec!["c", "u", "u", "u"])),
                Arc::new(lists.finish()),
            ],
        )
        .unwrap();
        let columns = ChangeColumns::of(&batch.schema()).unwrap().unwrap();
        let applied = columns.apply(&batch, &["id".to_string()]).unwrap();
        assert_eq!(ids(&applied.upserts), vec![1, 2, 3]);
        assert_eq!(
            applied.upserts.column(1).as_string::<i32>().value(0),
            "long text"
        );
        assert_eq!(
            applied.unchanged,
            vec![vec![], vec!["body".to_string()], vec!["body".to_string()]]
        );
    }

    #[test]
    fn a_change_without_its_key_is_a_bad_record() {
        let op = Field::new(OP_COLUMN, DataType::Utf8, false).with_metadata(HashMap::from([(
            CHANGE_COLUMN.to_string(),
            "op".to_string(),
        )]));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, true),
            op,
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![Some(1), None])),
                Arc::new(StringArray::from(vec!["c", "d"])),
            ],
        )
        .unwrap();
        let columns = ChangeColumns::of(&batch.schema()).unwrap().unwrap();
        for err in [
            columns.in_order(&batch, &["id".to_string()]).unwrap_err(),
            columns.apply(&batch, &["id".to_string()]).unwrap_err(),
        ] {
            assert_eq!(err.kind(), ErrorKind::BadRecord);
            assert!(
                err.to_string().contains("change row 1") && err.to_string().contains("\"id\""),
                "{err}"
            );
        }
    }

    #[test]
    fn an_unknown_operation_is_a_bad_record() {
        let batch = changes(&[(1, "x", None)]);
        let columns = ChangeColumns::of(&batch.schema()).unwrap().unwrap();
        let err = columns.apply(&batch, &["id".to_string()]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRecord);
        assert!(err.to_string().contains("\"x\""), "{err}");
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
