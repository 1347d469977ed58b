//! The write path: rows bound into multi-row prepared statements within the protocol's placeholder limit, deletes
//! by key for tombstones, and the dedup table's fresh ids.

use arrow_array::RecordBatch;
use connector_api::{Error, ErrorKind, Phase, Result};
use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::{MySqlSession, no_connection};
use crate::columns::Columns;
use crate::mysql::target::{MyColumn, bad_value};

/// Placeholders per statement at most (the protocol allows 65535).
pub(super) const MAX_PLACEHOLDERS: usize = 60_000;

/// Rows per multi-row INSERT at most.
pub(super) const MAX_ROWS_PER_STATEMENT: usize = 2_000;

/// Tombstone keys per DELETE at most.
pub(super) const MAX_KEYS_PER_DELETE: usize = 1_000;

/// Row `row`'s value of column `column` for `target`.
///
/// # Errors
/// A bad record naming the column and the value, when `target` cannot hold it exactly.
pub(super) fn value(
    columns: &Columns,
    column: usize,
    row: usize,
    target: &MyColumn,
) -> Result<Value> {
    let cell = columns.cell(column, row);
    target.value(&cell).map_err(|why| {
        Error::new(
            ErrorKind::BadRecord,
            Phase::Write,
            bad_value(target, &cell, &why),
        )
    })
}

/// `<head>(?, ..), (?, ..) .. <tail>` for `rows` rows of `columns` placeholders.
pub(super) fn insert_statement(head: &str, tail: &str, columns: usize, rows: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(", "));
    let mut sql = String::with_capacity(head.len() + rows * (row.len() + 2) + tail.len());
    sql.push_str(head);
    sql.push_str(&vec![row; rows].join(", "));
    sql.push_str(tail);
    sql
}

impl MySqlSession {
    /// Multi-row INSERTs of `batch`, up to `rows_per_statement` rows each.
    pub(super) async fn insert(&mut self, batch: &RecordBatch) -> Result<()> {
        let columns = Columns::new(batch, &self.shape.types, &self.as_json)?;
        let mut start = 0;
        while start < batch.num_rows() {
            let rows = (batch.num_rows() - start).min(self.rows_per_statement);
            let fresh = self.fresh_rows(&columns, start..start + rows).await?;
            if fresh.is_empty() {
                start += rows;
                continue;
            }
            let mut params = Vec::with_capacity(fresh.len() * columns.len());
            for &row in &fresh {
                for c in 0..columns.len() {
                    params.push(
                        value(&columns, c, row, &self.targets[c])
                            .map_err(|e| e.with_sink(&self.config.sink))?,
                    );
                }
            }
            // The full-size statement is built once; only a shorter last one per call.
            // The full-size statement is built once; only a shorter last one per call.
            let statement = if fresh.len() == self.rows_per_statement {
                std::borrow::Cow::Borrowed(self.full_statement.as_str())
            } else {
                std::borrow::Cow::Owned(insert_statement(
                    &self.insert_head,
                    &self.insert_tail,
                    self.shape.names.len(),
                    fresh.len(),
                ))
            };
            let result = match self.conn.as_mut() {
                Some(conn) => conn.exec_drop(statement.as_ref(), params).await,
                None => return Err(no_connection(&self.config.sink, Phase::Write)),
            };
            if let Err(e) = result {
                let first = format!("{} = {}", self.shape.names[0], columns.show(0, start));
                let what = format!(
                    "the table {} refused a row among the {rows} starting at the row with {first}",
                    self.config.table
                );
                return Err(self.lost_on(Phase::Write, self.open.clone().as_ref(), &what, e));
            }
            start += rows;
        }
        Ok(())
    }

    /// Keyed modes: each change of `batch` that did not carry the `unchanged` columns updates its key's row,
    /// keeping them.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the key when the table holds no row of it.
    pub(super) async fn update_keeping(
        &mut self,
        batch: &RecordBatch,
        unchanged: &[String],
    ) -> Result<()> {
        let key = self.config.mode.key().unwrap_or_default().to_vec();
        let d = crate::config::Dialect::MySql;
        let set: Vec<usize> = (0..self.shape.names.len())
            .filter(|&i| {
                !key.contains(&self.shape.names[i]) && !unchanged.contains(&self.shape.names[i])
            })
            .collect();
        let keys: Vec<usize> = key
            .iter()
            .filter_map(|k| self.shape.names.iter().position(|n| n == k))
            .collect();
        let quoted = |i: usize| crate::columns::quote(d, &self.shape.names[i]);
        let assign: Vec<String> = match set.is_empty() {
            true => vec![format!("{0} = {0}", quoted(keys[0]))],
            false => set.iter().map(|&i| format!("{} = ?", quoted(i))).collect(),
        };
        let condition: Vec<String> = keys.iter().map(|&i| format!("{} = ?", quoted(i))).collect();
        let statement = format!(
            "UPDATE {} SET {} WHERE {}",
            crate::columns::quote_table(d, &self.config.table),
            assign.join(", "),
            condition.join(" AND ")
        );
        let columns = Columns::new(batch, &self.shape.types, &self.as_json)?;
        for row in 0..batch.num_rows() {
            let params = set
                .iter()
                .chain(&keys)
                .map(|&c| value(&columns, c, row, &self.targets[c]))
                .collect::<Result<Vec<_>>>()
                .map_err(|e| e.with_sink(&self.config.sink))?;
            let Some(conn) = self.conn.as_mut() else {
                return Err(no_connection(&self.config.sink, Phase::Write));
            };
            let result = conn.exec_drop(statement.as_str(), params).await;
            let matched = conn.affected_rows();
            if let Err(e) = result {
                let what = format!("the table {} refused an update", self.config.table);
                return Err(self.lost_on(Phase::Write, self.open.clone().as_ref(), &what, e));
            }
            if matched == 0 {
                return Err(crate::keys::nothing_to_keep(
                    &self.config,
                    &self.shape,
                    &columns,
                    row,
                    unchanged,
                ));
            }
        }
        Ok(())
    }

    /// Deletes the rows of `keys`, up to [`MAX_KEYS_PER_DELETE`] keys per statement.
    pub(super) async fn delete_keys(&mut self, keys: &[RecordBatch]) -> Result<()> {
        let Some(delete) = &self.delete else {
            return Err(Error::new(
                ErrorKind::Bug,
                Phase::Write,
                "tombstones reached the MariaDB session outside the upsert mode",
            )
            .with_sink(&self.config.sink));
        };
        let (head, condition, types, targets) = (
            delete.head.clone(),
            delete.condition.clone(),
            delete.types.clone(),
            delete.targets.clone(),
        );
        let per_statement = (MAX_PLACEHOLDERS / types.len().max(1)).clamp(1, MAX_KEYS_PER_DELETE);
        let mut pending: Vec<(usize, usize)> = Vec::new();
        for (b, batch) in keys.iter().enumerate() {
            for row in 0..batch.num_rows() {
                pending.push((b, row));
            }
        }
        let plain = vec![false; types.len()];
        let columns: Vec<Columns> = keys
            .iter()
            .map(|k| Columns::new(k, &types, &plain))
            .collect::<Result<_>>()?;
        for chunk in pending.chunks(per_statement) {
            let mut params = Vec::with_capacity(chunk.len() * types.len());
            for &(b, row) in chunk {
                for (c, target) in targets.iter().enumerate() {
                    params.push(
                        value(&columns[b], c, row, target)
                            .map_err(|e| e.with_sink(&self.config.sink))?,
                    );
                }
            }
            let statement = format!(
                "{head}{}",
                vec![condition.as_str(); chunk.len()].join(" OR ")
            );
            let result = match self.conn.as_mut() {
                Some(conn) => conn.exec_drop(statement, params).await,
                None => return Err(no_connection(&self.config.sink, Phase::Write)),
            };
            if let Err(e) = result {
                let what = format!(
                    "the table {} refused to delete the rows of {}",
                    self.config.table,
                    crate::keys::describe(keys, &types)
                );
                return Err(self.lost_on(Phase::Write, self.open.clone().as_ref(), &what, e));
            }
        }
        Ok(())
    }

    /// The rows of `range` to insert: all of them, or in the append mode those whose message id the dedup
    /// table did not hold yet (recorded there in the same transaction), the first of each id.
    pub(super) async fn fresh_rows(
        &mut self,
        columns: &Columns,
        range: std::ops::Range<usize>,
    ) -> Result<Vec<usize>> {
        let Some(dedup) = &self.dedup else {
            return Ok(range.collect());
        };
        let ids: Vec<Value> = range
            .clone()
            .map(|row| value(columns, dedup.column, row, &dedup.target))
            .collect::<Result<_>>()
            .map_err(|e| e.with_sink(&self.config.sink))?;
        let statement = format!(
            "{}{} RETURNING message_id",
            dedup.claim,
            vec!["(?)"; ids.len()].join(", ")
        );
        let xid = self.open.clone();
        let claimed: std::result::Result<Vec<Value>, _> = self
            .conn(Phase::Write)?
            .exec_map(statement, ids.clone(), |(id,): (Value,)| id)
            .await;
        let mut new_ids = claimed.map_err(|e| {
            self.lost_on(
                Phase::Write,
                xid.as_ref(),
                "the dedup table refused the ids",
                e,
            )
        })?;
        let mut fresh = Vec::with_capacity(new_ids.len());
        for (row, id) in range.zip(ids) {
            if let Some(found) = new_ids.iter().position(|new| *new == id) {
                new_ids.swap_remove(found);
                fresh.push(row);
            }
        }
        Ok(fresh)
    }
}
