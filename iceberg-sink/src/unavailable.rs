//! The upsert mode's values a change did not carry: a change stream's updates can leave columns out (Debezium's
//! unavailable-value placeholder for a TOASTed column an update did not touch, under PostgreSQL's default `REPLICA
//! IDENTITY`, named in the `__unavailable` change column). An Iceberg table has no "keep this column" write: the
//! row is rewritten whole, so the value the key holds is found and written again, in this order:
//!
//! 1. an earlier change of the key in the same checkpoint that carried it ([`connector_api::ChangeColumns::apply_all`]);
//! 2. the key's row in the previous checkpoint, which may not be committed to the table yet ([`PreviousRows`]);
//! 3. the key's current row in the table, read with a scan that applies the table's deletes.
//!
//! A key found nowhere (a primary-key change: the new key's row never existed) is refused: the value is nowhere
//! but in the source, which did not send it (REPLICA IDENTITY FULL makes it send it). Exactly once: the previous checkpoint's rows are remembered from its
//! pre-commit until the next one and forgotten when a checkpoint is aborted; recovery commits a decided
//! checkpoint before the next one begins, so the table then holds it.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, RecordBatchOptions, new_null_array};
use arrow_row::{OwnedRow, RowConverter, SortField};
use arrow_schema::SchemaRef;
use connector_api::types::exact;
use connector_api::{AppliedChanges, Error, ErrorKind, Phase, Result};
use futures::TryStreamExt;
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::Datum;
use iceberg::table::Table;

use crate::error::iceberg_error;

/// The rows the previous checkpoint upserted (the table's columns as the batches have them).
#[derive(Debug, Default)]
pub(crate) struct PreviousRows {
    rows: Vec<RecordBatch>,
}

impl PreviousRows {
    /// Remembers the rows `applied` upserts (after their own values were filled).
    pub(crate) fn remember(&mut self, applied: &[AppliedChanges]) {
        self.rows = applied
            .iter()
            .filter(|a| a.upserts.num_rows() > 0)
            .map(|a| a.upserts.clone())
            .collect();
    }

    /// Forgets them (their checkpoint was aborted).
    pub(crate) fn forget(&mut self) {
        self.rows.clear();
    }
}

/// Where a value comes from: a row of the previous checkpoint, or of the table scan.
#[derive(Debug, Clone, Copy)]
enum Source {
    Previous(usize, usize),
    Scanned(usize, usize),
}

fn bug(what: &str) -> impl FnOnce(arrow_schema::ArrowError) -> Error + '_ {
    move |e| Error::new(ErrorKind::Bug, Phase::PreCommit, what.to_string()).with_source(e)
}

/// Fills every column `applied`'s rows did not carry (their `unchanged` names) from the previous checkpoint's rows
/// or the table (see the module docs), keyed by `key`, and clears the `unchanged` lists.
///
/// # Errors
/// Retryable or fatal catalog and storage errors of the scan.
pub(crate) async fn fill(
    table: &Table,
    key: &[String],
    previous: &PreviousRows,
    applied: &mut [AppliedChanges],
) -> Result<()> {
    let needed: Vec<(usize, usize)> = applied
        .iter()
        .enumerate()
        .flat_map(|(p, a)| {
            a.unchanged
                .iter()
                .enumerate()
                .filter(|(_, u)| !u.is_empty())
                .map(move |(r, _)| (p, r))
        })
        .collect();
    if needed.is_empty() {
        return Ok(());
    }
    let schema = applied[needed[0].0].upserts.schema();
    let key_types: Vec<SortField> = key
        .iter()
        .map(|k| {
            Ok(SortField::new(
                schema.field_with_name(k)?.data_type().clone(),
            ))
        })
        .collect::<std::result::Result<_, arrow_schema::ArrowError>>()
        .map_err(bug("the upsert key is not among the rows' columns"))?;
    let converter = RowConverter::new(key_types).map_err(bug("the keys cannot be compared"))?;
    let keys_of = |batch: &RecordBatch| -> Result<arrow_row::Rows> {
        let columns: Vec<ArrayRef> = key
            .iter()
            .map(|k| {
                batch
                    .column_by_name(k)
                    .cloned()
                    .unwrap_or_else(|| new_null_array(&arrow_schema::DataType::Null, 0))
            })
            .collect();
        converter
            .convert_columns(&columns)
            .map_err(bug("the keys cannot be compared"))
    };
    let mut found: HashMap<OwnedRow, Source> = HashMap::new();
    for (b, batch) in previous.rows.iter().enumerate() {
        let keys = keys_of(batch)?;
        for r in 0..batch.num_rows() {
            found.insert(keys.row(r).owned(), Source::Previous(b, r));
        }
    }
    let applied_keys: Vec<arrow_row::Rows> = applied
        .iter()
        .map(|a| keys_of(&a.upserts))
        .collect::<Result<_>>()?;
    let missing: Vec<(usize, usize)> = needed
        .iter()
        .copied()
        .filter(|(p, r)| !found.contains_key(&applied_keys[*p].row(*r).owned()))
        .collect();
    let mut columns: Vec<String> = needed
        .iter()
        .flat_map(|(p, r)| applied[*p].unchanged[*r].iter().cloned())
        .collect();
    columns.sort();
    columns.dedup();
    let scanned = match missing.is_empty() {
        true => Vec::new(),
        false => scan(table, key, &columns, &schema, &missing, applied).await?,
    };
    for (b, batch) in scanned.iter().enumerate() {
        let keys = keys_of(batch)?;
        for r in 0..batch.num_rows() {
            found
                .entry(keys.row(r).owned())
                .or_insert(Source::Scanned(b, r));
        }
    }
    for (p, part) in applied.iter_mut().enumerate() {
        if part.unchanged.iter().all(Vec::is_empty) {
            continue;
        }
        let schema = part.upserts.schema();
        let rows = part.upserts.num_rows();
        let mut new_columns = Vec::with_capacity(schema.fields().len());
        for (c, field) in schema.fields().iter().enumerate() {
            let own = part.upserts.column(c);
            if !part.unchanged.iter().any(|u| u.contains(field.name())) {
                new_columns.push(own.clone());
                continue;
            }
            // Sources: this part's column, then every previous batch's, then every scanned batch's.
            let mut arrays: Vec<ArrayRef> = vec![own.clone()];
            arrays.extend(
                previous
                    .rows
                    .iter()
                    .map(|b| column_or_null(b, field.name(), own)),
            );
            arrays.extend(scanned.iter().map(|b| column_or_null(b, field.name(), own)));
            let mut indices = Vec::with_capacity(rows);
            for r in 0..rows {
                let wanted = part.unchanged[r].contains(field.name());
                let at = match wanted
                    .then(|| found.get(&applied_keys[p].row(r).owned()).copied())
                    .flatten()
                {
                    Some(Source::Previous(b, row)) => (1 + b, row),
                    Some(Source::Scanned(b, row)) => (1 + previous.rows.len() + b, row),
                    None if wanted => {
                        return Err(Error::new(
                            ErrorKind::BadRecord,
                            Phase::PreCommit,
                            format!(
                                "a change of key row {r} does not carry column {:?} (the source did not send it: \
                                 Debezium's unavailable value, as PostgreSQL sends a TOASTed value an update does \
                                 not touch under REPLICA IDENTITY DEFAULT), and neither the checkpoint, the previous \
                                 one nor the table holds a row of the key to keep it from (a primary-key change): set \
                                 REPLICA IDENTITY FULL on the source table",
                                field.name()
                            ),
                        ));
                    }
                    None => (0, r),
                };
                indices.push(at);
            }
            let refs: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
            new_columns.push(
                arrow_select::interleave::interleave(&refs, &indices)
                    .map_err(bug("the carried values cannot be taken"))?,
            );
        }
        part.upserts = RecordBatch::try_new_with_options(
            schema,
            new_columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(bug("the filled rows do not fit their schema"))?;
        part.unchanged.iter_mut().for_each(Vec::clear);
    }
    Ok(())
}

/// `batch`'s column `name` in the type of `like`, or nulls.
fn column_or_null(batch: &RecordBatch, name: &str, like: &ArrayRef) -> ArrayRef {
    batch
        .column_by_name(name)
        .and_then(|c| exact::convert(c, like.data_type()).ok())
        .unwrap_or_else(|| new_null_array(like.data_type(), batch.num_rows()))
}

/// The table's current rows of the keys `missing` points at (in `applied`), with the key and `columns`, converted
/// to the rows' own types (`schema`).
async fn scan(
    table: &Table,
    key: &[String],
    columns: &[String],
    schema: &SchemaRef,
    missing: &[(usize, usize)],
    applied: &[AppliedChanges],
) -> Result<Vec<RecordBatch>> {
    if table.metadata().format_version() == iceberg::spec::FormatVersion::V3 {
        // iceberg-rust 0.10's reader opens every position-delete file as Parquet, so a table with deletion
        // vectors cannot be scanned with its deletes applied.
        return Err(Error::new(
            ErrorKind::Config,
            Phase::PreCommit,
            format!(
                "table {} is a format-version 3 table: the values changes left out (columns {columns:?}) would be \
                 read from the keys' current rows, and iceberg-rust cannot scan a table with deletion vectors; \
                 make the source send whole rows (PostgreSQL: REPLICA IDENTITY FULL) or upsert into a \
                 format-version 2 table",
                table.identifier()
            ),
        ));
    }
    let mut selected: Vec<String> = key.to_vec();
    selected.extend(columns.iter().filter(|c| !key.contains(c)).cloned());
    let mut scan = table.scan().select(selected.clone());
    if let [single] = key
        && let Some(datums) = datums(single, missing, applied)
    {
        scan = scan.with_filter(Predicate::and(
            Reference::new(single).is_not_null(),
            Reference::new(single).is_in(datums),
        ));
    }
    let scan_error = |e| {
        iceberg_error(
            Phase::PreCommit,
            "cannot read the upsert table's current rows",
            e,
        )
    };
    let stream = scan
        .build()
        .map_err(scan_error)?
        .to_arrow()
        .await
        .map_err(scan_error)?;
    let batches: Vec<RecordBatch> = stream.try_collect().await.map_err(scan_error)?;
    batches
        .into_iter()
        .map(|batch| {
            let columns = selected
                .iter()
                .map(|name| {
                    let target = schema.field_with_name(name).map_err(bug("a scanned column is not a row column"))?;
                    let column = batch.column_by_name(name).cloned().unwrap_or_else(|| new_null_array(target.data_type(), batch.num_rows()));
                    exact::convert(&column, target.data_type()).map_err(|e| {
                        Error::new(
                            ErrorKind::Fatal,
                            Phase::PreCommit,
                            format!("the table's column {name:?} does not convert back to the rows' type: {e}"),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let fields: Vec<arrow_schema::FieldRef> = selected
                .iter()
                .map(|n| Arc::new(schema.field_with_name(n).expect("checked above").clone()))
                .collect();
            RecordBatch::try_new_with_options(
                Arc::new(arrow_schema::Schema::new(fields)),
                columns,
                &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
            )
            .map_err(bug("the scanned rows do not fit their schema"))
        })
        .collect()
}

/// The values of a single integer or string key at `missing`, as Iceberg data for a filter.
fn datums(key: &str, missing: &[(usize, usize)], applied: &[AppliedChanges]) -> Option<Vec<Datum>> {
    use arrow_array::cast::AsArray;
    missing
        .iter()
        .map(|(p, r)| {
            let column = applied[*p].upserts.column_by_name(key)?;
            match column.data_type() {
                arrow_schema::DataType::Int32 => Some(Datum::int(
                    column
                        .as_primitive::<arrow_array::types::Int32Type>()
                        .value(*r),
                )),
                arrow_schema::DataType::Int64 => Some(Datum::long(
                    column
                        .as_primitive::<arrow_array::types::Int64Type>()
                        .value(*r),
                )),
                arrow_schema::DataType::Utf8 => {
                    Some(Datum::string(column.as_string::<i32>().value(*r)))
                }
                _ => None,
            }
        })
        .collect()
}
