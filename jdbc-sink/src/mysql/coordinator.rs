//! XA transactions and the owner row on MariaDB / MySQL, from a connection of their own.

use std::time::Duration;

use async_trait::async_trait;
use connector_api::{CheckpointId, Phase, Result, SinkScope, SubtaskId};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row};
use tokio::sync::{Mutex, MutexGuard};

use super::{ER_LOCK_WAIT_TIMEOUT, ER_XAER_NOTA, connect, my_error, server_code};
use crate::Xid;
use crate::database::{CommitOutcome, Coordinator, MARKERS_TABLE, OWNERS_TABLE, Prepared};
use crate::sink::lost_transaction;

/// How often an unknown xid without a marker is asked about before it counts as lost, and the first pause
/// between (doubling: 5 ms .. 640 ms, about 1.3 s in all). The session that prepared it usually lets go within
/// milliseconds (at-least-once commits right after the prepare).
const NOT_FOUND_CHECKS: u32 = 9;
const NOT_FOUND_PAUSE: Duration = Duration::from_millis(5);

/// See the module docs. Reconnects when its connection was lost.
pub(crate) struct MySqlCoordinator {
    opts: Opts,
    conn: Mutex<Option<Conn>>,
    lock_timeout: Duration,
}

impl MySqlCoordinator {
    /// A coordinator connecting with `opts` (lazily); recovery waits `lock_timeout` for the owner row.
    pub(crate) fn new(opts: Opts, lock_timeout: Duration) -> Self {
        Self {
            opts,
            conn: Mutex::new(None),
            lock_timeout,
        }
    }

    async fn conn(&self, phase: Phase) -> Result<MutexGuard<'_, Option<Conn>>> {
        let mut guard = self.conn.lock().await;
        if guard.is_none() {
            *guard = Some(
                connect(
                    &self.opts,
                    phase,
                    "the JDBC sink's commit connection to MariaDB",
                )
                .await?,
            );
        }
        Ok(guard)
    }
}

/// The connection of `guard`; a connection-level error drops it so the next call reconnects.
fn connected<'a>(guard: &'a mut MutexGuard<'_, Option<Conn>>) -> &'a mut Conn {
    guard.as_mut().expect("MySqlCoordinator::conn connected it")
}

fn forget_if_lost(guard: &mut MutexGuard<'_, Option<Conn>>, e: &mysql_async::Error) {
    if matches!(e, mysql_async::Error::Io(_) | mysql_async::Error::Driver(_)) {
        **guard = None;
    }
}

#[async_trait]
impl Coordinator for MySqlCoordinator {
    /// `XA COMMIT`. MariaDB answers "unknown xid" also for a prepared transaction still attached to a session
    /// that is closing (the writer ends its session right after `XA PREPARE`), so "unknown and no marker" is
    /// asked again, backing off, for about a second before the transaction counts as lost.
    async fn commit_prepared(&self, xid: &Xid) -> Result<CommitOutcome> {
        for attempt in 1..=NOT_FOUND_CHECKS {
            let mut guard = self.conn(Phase::Commit).await?;
            match connected(&mut guard)
                .query_drop(format!("XA COMMIT '{xid}'"))
                .await
            {
                Ok(()) => return Ok(CommitOutcome::Committed),
                Err(e) if server_code(&e) == Some(ER_XAER_NOTA) => {
                    drop(guard);
                    if self.is_committed(xid).await? {
                        return Ok(CommitOutcome::AlreadyCommitted);
                    }
                    if attempt == NOT_FOUND_CHECKS {
                        return Err(lost_transaction(xid).with_source(e));
                    }
                    tokio::time::sleep(NOT_FOUND_PAUSE * 2u32.pow(attempt - 1)).await;
                }
                Err(e) => {
                    forget_if_lost(&mut guard, &e);
                    return Err(my_error(Phase::Commit, Some(xid), "XA COMMIT failed", e));
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    async fn rollback_prepared(&self, xid: &Xid) -> Result<()> {
        let mut guard = self.conn(Phase::Recover).await?;
        match connected(&mut guard)
            .query_drop(format!("XA ROLLBACK '{xid}'"))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if server_code(&e) == Some(ER_XAER_NOTA) => Ok(()),
            Err(e) => {
                forget_if_lost(&mut guard, &e);
                Err(my_error(Phase::Recover, Some(xid), "XA ROLLBACK failed", e))
            }
        }
    }

    async fn list_prepared(&self, sink: &SinkScope) -> Result<Vec<Prepared>> {
        let mut guard = self.conn(Phase::Recover).await?;
        let rows: Vec<Row> = match connected(&mut guard).query("XA RECOVER").await {
            Ok(rows) => rows,
            Err(e) => {
                forget_if_lost(&mut guard, &e);
                return Err(my_error(Phase::Recover, None, "XA RECOVER failed", e));
            }
        };
        let mut xids: Vec<Xid> = rows
            .into_iter()
            .filter_map(|row| {
                // formatID, gtrid_length, bqual_length, data (gtrid followed by bqual)
                let gtrid_length: usize = row.get(1)?;
                let data: Vec<u8> = row.get(3)?;
                let gtrid = std::str::from_utf8(data.get(..gtrid_length)?).ok()?;
                Xid::parse(gtrid)
            })
            .filter(|xid| &xid.scope == sink)
            .collect();
        xids.sort_by_key(|xid| (xid.checkpoint, xid.subtask));
        // XA RECOVER says nothing of when a transaction was prepared.
        Ok(xids
            .into_iter()
            .map(|xid| Prepared { xid, age: None })
            .collect())
    }

    async fn is_committed(&self, xid: &Xid) -> Result<bool> {
        let mut guard = self.conn(Phase::Commit).await?;
        let found: std::result::Result<Option<u8>, _> = connected(&mut guard)
            .exec_first(
                format!("SELECT 1 FROM {MARKERS_TABLE} WHERE sink = ? AND subtask = ? AND checkpoint = ?"),
                (xid.scope.as_str(), xid.subtask.0, xid.checkpoint.0),
            )
            .await;
        found.map(|row| row.is_some()).map_err(|e| {
            forget_if_lost(&mut guard, &e);
            my_error(Phase::Commit, Some(xid), "cannot read the commit marker", e)
        })
    }

    async fn applied_through(
        &self,
        sink: &SinkScope,
        subtask: SubtaskId,
    ) -> Result<Option<CheckpointId>> {
        let mut guard = self.conn(Phase::Commit).await?;
        let found: std::result::Result<Option<Option<u64>>, _> = connected(&mut guard)
            .exec_first(
                format!("SELECT checkpoint FROM {OWNERS_TABLE} WHERE sink = ? AND subtask = ?"),
                (sink.as_str(), subtask.0),
            )
            .await;
        found
            .map(|row| row.flatten().map(CheckpointId))
            .map_err(|e| {
                forget_if_lost(&mut guard, &e);
                my_error(Phase::Commit, None, "cannot read the owner row", e)
            })
    }

    async fn claim_owner(
        &self,
        sink: &SinkScope,
        subtask: SubtaskId,
        restored: Option<CheckpointId>,
    ) -> Result<Option<u64>> {
        let mut guard = self.conn(Phase::Recover).await?;
        let conn = connected(&mut guard);
        let seconds = self.lock_timeout.as_secs().max(1);
        let raised: std::result::Result<Option<u64>, mysql_async::Error> = async {
            conn.query_drop(format!("SET SESSION innodb_lock_wait_timeout = {seconds}"))
                .await?;
            conn.query_drop("START TRANSACTION").await?;
            conn.exec_drop(
                format!(
                    "INSERT INTO {OWNERS_TABLE} (sink, subtask, epoch) VALUES (?, ?, 1) \
                     ON DUPLICATE KEY UPDATE epoch = epoch + 1"
                ),
                (sink.as_str(), subtask.0),
            )
            .await?;
            let epoch: Option<u64> = conn
                .exec_first(
                    format!("SELECT epoch FROM {OWNERS_TABLE} WHERE sink = ? AND subtask = ?"),
                    (sink.as_str(), subtask.0),
                )
                .await?;
            // By key, not by range: a range DELETE reads (and waits to lock) the index record after the range,
            // which may be another subtask's marker inside its prepared transaction.
            let stale: Vec<u64> = conn
                .exec(
                    format!("SELECT checkpoint FROM {MARKERS_TABLE} WHERE sink = ? AND subtask = ? AND checkpoint > ?"),
                    (sink.as_str(), subtask.0, restored.map_or(-1, |c| c.0 as i64)),
                )
                .await?;
            if !stale.is_empty() {
                let list = stale.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
                conn.exec_drop(
                    format!("DELETE FROM {MARKERS_TABLE} WHERE sink = ? AND subtask = ? AND checkpoint IN ({list})"),
                    (sink.as_str(), subtask.0),
                )
                .await?;
            }
            conn.query_drop("COMMIT").await?;
            Ok(epoch)
        }
        .await;
        match raised {
            Ok(Some(epoch)) => Ok(Some(epoch)),
            Ok(None) => Err(connector_api::Error::new(
                connector_api::ErrorKind::Bug,
                Phase::Recover,
                format!("the owner row of {sink} vanished right after it was raised"),
            )),
            Err(e) if server_code(&e) == Some(ER_LOCK_WAIT_TIMEOUT) => {
                connected(&mut guard)
                    .query_drop("ROLLBACK")
                    .await
                    .map_err(|e| my_error(Phase::Recover, None, "ROLLBACK failed", e))?;
                Ok(None)
            }
            Err(e) => {
                // Closing the connection ends the transaction it may have left open.
                *guard = None;
                Err(my_error(
                    Phase::Recover,
                    None,
                    &format!("cannot raise the owner epoch of {sink}"),
                    e,
                ))
            }
        }
    }
}
