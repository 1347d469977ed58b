//! The write path: rows bound into multi-row prepared statements within the protocol's placeholder limit, deletes
//! by key for tombstones, and the dedup table's fresh ids.

use arrow_array::RecordBatch;
use connector_api::{Error, ErrorKind, Phase, Result};
use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::{MySqlSession, no_connection};
use crate::columns::Columns;
use crate::keeping::UpdateKeeping;
use crate::mysql::target::{MyColumn, bad_value};

/// Placeholders per statement at most (the protocol allows 65535).
const MAX_PLACEHOLDERS: usize = 60_000;

/// Rows per multi-row INSERT at most.
const MAX_ROWS_PER_STATEMENT: usize = 2_000;

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

/// The multi-row INSERTs of a table: `<head>(?, ..), (?, ..) .. <tail>`. A run of rows is sent in statements of
/// at most [`Self::rows_per_statement`] rows, the rest in power-of-two sizes, so a session prepares at most a dozen
/// different statements however its batches are cut (preparing a statement of thousands of placeholders costs
/// the server and the client more than running it; mysql_async keeps the prepared ones by their text).
#[derive(Debug)]
pub(super) struct InsertStatements {
    head: String,
    tail: String,
    columns: usize,
    /// Rows per statement at most, within [`MAX_PLACEHOLDERS`] and [`MAX_ROWS_PER_STATEMENT`].
    rows_per_statement: usize,
    /// The statements made so far, by row count.
    made: std::collections::HashMap<usize, String>,
}

impl InsertStatements {
    pub(super) fn new(head: String, tail: String, columns: usize) -> Self {
        Self {
            head,
            tail,
            columns,
            rows_per_statement: (MAX_PLACEHOLDERS / columns.max(1))
                .clamp(1, MAX_ROWS_PER_STATEMENT),
            made: std::collections::HashMap::new(),
        }
    }

    /// Rows per run: the most one statement takes.
    pub(super) fn rows_per_statement(&self) -> usize {
        self.rows_per_statement
    }

    /// How many of `remaining` rows (at least 1) the next statement takes.
    fn next_rows(&self, remaining: usize) -> usize {
        match remaining >= self.rows_per_statement {
            true => self.rows_per_statement,
            false => 1 << remaining.ilog2(),
        }
    }

    /// The INSERT of `rows` rows.
    fn statement(&mut self, rows: usize) -> &str {
        let (head, tail, columns) = (&self.head, &self.tail, self.columns);
        self.made.entry(rows).or_insert_with(|| {
            let row = format!("({})", vec!["?"; columns].join(", "));
            let mut sql = String::with_capacity(head.len() + rows * (row.len() + 2) + tail.len());
            sql.push_str(head);
            sql.push_str(&vec![row; rows].join(", "));
            sql.push_str(tail);
            sql
        })
    }
}

impl MySqlSession {
    /// Multi-row INSERTs of `batch` ([`InsertStatements`]); in the append mode with a dedup table, of the rows
    /// whose ids are fresh.
    pub(super) async fn insert(&mut self, batch: &RecordBatch) -> Result<()> {
        let columns = Columns::new(batch, &self.shape.types, &self.as_json)?;
        let mut start = 0;
        while start < batch.num_rows() {
            let rows = (batch.num_rows() - start).min(self.inserts.rows_per_statement());
            let fresh = self.fresh_rows(&columns, start..start + rows).await?;
            let mut sent = 0;
            while sent < fresh.len() {
                let part = &fresh[sent..sent + self.inserts.next_rows(fresh.len() - sent)];
                let mut params = Vec::with_capacity(part.len() * columns.len());
                for &row in part {
                    for c in 0..columns.len() {
                        params.push(
                            value(&columns, c, row, &self.targets[c])
                                .map_err(|e| e.with_sink(&self.config.sink))?,
                        );
                    }
                }
                let statement = self.inserts.statement(part.len());
                let result = match self.conn.as_mut() {
                    Some(conn) => conn.exec_drop(statement, params).await,
                    None => return Err(no_connection(&self.config.sink, Phase::Write)),
                };
                if let Err(e) = result {
                    let first = format!("{} = {}", self.shape.names[0], columns.show(0, part[0]));
                    let what = format!(
                        "the table {} refused a row among the {} starting at the row with {first}",
                        self.config.table,
                        part.len()
                    );
                    return Err(self.lost_on(Phase::Write, self.open.clone().as_ref(), &what, e));
                }
                sent += part.len();
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
        let key = self.config.mode.key().unwrap_or_default();
        let update = UpdateKeeping::new(
            crate::config::Dialect::MySql,
            &self.config.table,
            key,
            &self.shape,
            unchanged,
        );
        let columns = Columns::new(batch, &self.shape.types, &self.as_json)?;
        for row in 0..batch.num_rows() {
            let params = update
                .params
                .iter()
                .map(|&c| value(&columns, c, row, &self.targets[c]))
                .collect::<Result<Vec<_>>>()
                .map_err(|e| e.with_sink(&self.config.sink))?;
            let Some(conn) = self.conn.as_mut() else {
                return Err(no_connection(&self.config.sink, Phase::Write));
            };
            let result = conn.exec_drop(update.sql.as_str(), params).await;
            let matched = conn.affected_rows();
            if let Err(e) = result {
                let what = format!("the table {} refused an update", self.config.table);
                return Err(self.lost_on(Phase::Write, self.open.clone().as_ref(), &what, e));
            }
            if matched == 0 {
                return Err(crate::keeping::nothing_to_keep(
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

#[cfg(test)]
mod tests {
    use super::InsertStatements;

    #[test]
    fn runs_of_rows_go_in_a_dozen_statement_sizes_at_most() {
        let mut inserts =
            InsertStatements::new("INSERT INTO t (a, b) VALUES ".into(), String::new(), 2);
        assert_eq!(inserts.rows_per_statement(), 2_000);
        let mut sizes = std::collections::BTreeSet::new();
        for remaining in 1..=2_000 {
            let mut left = remaining;
            while left > 0 {
                let rows = inserts.next_rows(left);
                assert!(rows >= 1 && rows <= left);
                sizes.insert(rows);
                left -= rows;
            }
        }
        assert_eq!(sizes.len(), 12, "{sizes:?}");
        assert_eq!(
            inserts.statement(2),
            "INSERT INTO t (a, b) VALUES (?, ?), (?, ?)"
        );
    }
}
