//! Debezium events written by an Avro converter, decoded by arrow-avro as envelope records, made rows: per event
//! the row image its operation needs, each column in the type its semantic type says ([`super::semantic`]),
//! placeholders of unavailable values made nulls named in `__unavailable`.

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, StructArray, new_null_array};
use arrow_schema::{DataType, Field};
use connector_api::{Error, Phase, Result};

use super::{ChangeBuilders, ChangeValues, DebeziumDecoding, Op, bad, semantic};

impl DebeziumDecoding {
    /// One row per envelope of `decoded` (a batch of the Avro envelope's schema).
    ///
    /// # Errors
    /// [`BadRecord`](connector_api::ErrorKind::BadRecord) when an envelope's operation is refused or lacks the row
    /// image it needs, or a value does not convert to its column, naming what; the reader then sorts the batch
    /// out record by record.
    pub(crate) fn rows(&self, decoded: &RecordBatch) -> Result<RecordBatch> {
        let (table_columns, schema) = self.columns_of(&decoded.schema());
        let envelope = StructArray::from(decoded.clone());
        let op = envelope
            .column_by_name("op")
            .ok_or_else(|| bad("has no `op`"))?;
        let op = arrow_cast::cast(op, &DataType::Utf8)
            .map_err(|e| bad("has an unreadable `op`").with_source(e))?;
        let ops = op.as_string::<i32>();
        let image = |name: &str| {
            envelope
                .column_by_name(name)
                .and_then(|c| c.as_struct_opt())
        };
        let (before, after) = (image("before"), image("after"));
        let present = |image: Option<&StructArray>, i: usize| image.is_some_and(|s| s.is_valid(i));
        let rows = envelope.len();
        let mut deleted = Vec::with_capacity(rows);
        for i in 0..rows {
            let op = (!ops.is_null(i)).then(|| ops.value(i));
            match self
                .operation(op, present(before, i), present(after, i))
                .map_err(|why| bad(&why))?
            {
                Op::Delete => deleted.push(true),
                Op::Upsert | Op::Truncate => deleted.push(false),
            }
        }
        let deleted = BooleanArray::from(deleted);
        let mut unavailable: Vec<Vec<String>> = vec![Vec::new(); rows];
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for field in table_columns.fields() {
            let side = |image: Option<&StructArray>| -> Result<ArrayRef> {
                let (Some(image), DataType::Struct(fields)) =
                    (image, image.map_or(&DataType::Null, |i| i.data_type()))
                else {
                    return Ok(new_null_array(field.data_type(), rows));
                };
                let (Some(column), Some(source)) = (
                    image.column_by_name(field.name()),
                    fields.iter().find(|f| f.name() == field.name()),
                ) else {
                    return Ok(new_null_array(field.data_type(), rows));
                };
                semantic::column(column, source, field).map_err(|why| {
                    bad(&format!(
                        "has a value of column {:?} that {why}",
                        field.name()
                    ))
                })
            };
            let picked = arrow_select::zip::zip(&deleted, &side(before)?, &side(after)?)
                .map_err(|e| bad("has row images of different types").with_source(e))?;
            columns.push(self.without_placeholders(picked, field, &mut unavailable)?);
        }
        let number = |name: &str, from: Option<&ArrayRef>| -> Result<Option<ArrayRef>> {
            from.map(|c| {
                arrow_cast::cast(c, &DataType::Int64).map_err(|e| {
                    bad(&format!("has a field {name:?} that is not a number")).with_source(e)
                })
            })
            .transpose()
        };
        let text = |name: &str, from: Option<&ArrayRef>| -> Result<Option<ArrayRef>> {
            from.map(|c| {
                arrow_cast::cast(c, &DataType::Utf8).map_err(|e| {
                    bad(&format!("has a field {name:?} that is not text")).with_source(e)
                })
            })
            .transpose()
        };
        let source = envelope
            .column_by_name("source")
            .and_then(|c| c.as_struct_opt());
        let source_field = |name: &str| source.and_then(|s| s.column_by_name(name));
        let ts_ms = number("ts_ms", envelope.column_by_name("ts_ms"))?;
        let source_ts = number("source.ts_ms", source_field("ts_ms"))?;
        let db = text("source.db", source_field("db"))?;
        let table = text("source.table", source_field("table"))?;
        let lsn = number("source.lsn", source_field("lsn"))?;
        let tx_id = number("source.txId", source_field("txId"))?;
        let int = |a: &Option<ArrayRef>, i: usize| {
            a.as_ref()
                .filter(|a| a.is_valid(i))
                .map(|a| a.as_primitive::<Int64Type>().value(i))
        };
        let string = |a: &Option<ArrayRef>, i: usize| -> Option<String> {
            a.as_ref()
                .filter(|a| a.is_valid(i))
                .map(|a| a.as_string::<i32>().value(i).to_string())
        };
        let mut changes = ChangeBuilders::new(rows);
        for (i, unavailable) in unavailable.iter().enumerate() {
            let (db, table) = (string(&db, i), string(&table, i));
            changes.append(&ChangeValues {
                op: ops.value(i),
                ts_ms: int(&ts_ms, i),
                source_ts_ms: int(&source_ts, i),
                db: db.as_deref(),
                table: table.as_deref(),
                lsn: int(&lsn, i),
                tx_id: int(&tx_id, i),
                unavailable,
            });
        }
        columns.extend(changes.finish());
        RecordBatch::try_new(schema, columns).map_err(|e| {
            Error::bug(Phase::Write, "the change rows do not match their schema").with_source(e)
        })
    }

    /// `column` with every value that is the placeholder made null, its row's `unavailable` naming the column.
    fn without_placeholders(
        &self,
        column: ArrayRef,
        field: &Field,
        unavailable: &mut [Vec<String>],
    ) -> Result<ArrayRef> {
        let placeholder = self.placeholder.as_bytes();
        let is_placeholder: Vec<bool> = match column.data_type() {
            DataType::Utf8 => column
                .as_string::<i32>()
                .iter()
                .map(|v| v.is_some_and(|v| v.as_bytes() == placeholder))
                .collect(),
            DataType::Binary => column
                .as_binary::<i32>()
                .iter()
                .map(|v| v.is_some_and(|v| v == placeholder))
                .collect(),
            _ => return Ok(column),
        };
        if !is_placeholder.contains(&true) {
            return Ok(column);
        }
        for (i, hit) in is_placeholder.iter().enumerate() {
            if *hit {
                unavailable[i].push(field.name().clone());
            }
        }
        arrow_select::nullif::nullif(&column, &BooleanArray::from(is_placeholder))
            .map_err(|e| Error::bug(Phase::Write, "cannot null the placeholders").with_source(e))
    }
}
