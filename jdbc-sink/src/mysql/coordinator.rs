//! XA transactions and the owner row on MariaDB / MySQL, from a connection of their own.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use connector_api::{CheckpointId, Error, ErrorKind, Phase, Result, SinkScope, SubtaskId};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row};
use tokio::sync::{Mutex, MutexGuard};

use super::{ER_LOCK_WAIT_TIMEOUT, ER_XAER_NOTA, connect, my_error, server_code};
use crate::Xid;
use crate::database::{CommitOutcome, Coordinator, MARKERS_TABLE, OWNERS_TABLE, Prepared};
use crate::error::lost_transaction;

/// How long `XA COMMIT` / `XA ROLLBACK` keep asking about a transaction MariaDB still keeps attached to the session
/// that prepared it ("unknown XID" to every other session, but listed by `XA RECOVER`) before failing retryable;
/// the pause between attempts doubles from `FIRST_PAUSE` up to `MAX_PAUSE`. The writer ends its own session right
/// after `XA PREPARE` (`KILL CONNECTION` when the server has not ended it), so this waits only for a session the
/// writer could not end: a process that is paused, or one that died before the server noticed.
const ATTACHED_WAIT: Duration = Duration::from_secs(8);
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const MAX_PAUSE: Duration = Duration::from_millis(500);

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

    /// What `XA RECOVER` lists: the global transaction id (gtrid) and the length of the branch qualifier of every
    /// prepared transaction, attached to a session or not.
    async fn recovered(&self, phase: Phase, xid: Option<&Xid>) -> Result<Vec<(String, usize)>> {
        let mut guard = self.conn(phase).await?;
        let rows: Vec<Row> = match connected(&mut guard).query("XA RECOVER").await {
            Ok(rows) => rows,
            Err(e) => {
                forget_if_lost(&mut guard, &e);
                return Err(my_error(phase, xid, "XA RECOVER failed", e));
            }
        };
        Ok(rows
            .into_iter()
            .filter_map(|row| {
                // formatID, gtrid_length, bqual_length, data (gtrid followed by bqual)
                let gtrid_length: usize = row.get(1)?;
                let bqual_length: usize = row.get(2)?;
                let data: Vec<u8> = row.get(3)?;
                let gtrid = std::str::from_utf8(data.get(..gtrid_length)?).ok()?;
                Some((gtrid.to_string(), bqual_length))
            })
            .collect())
    }

    /// Whether `xid` is prepared (`XA RECOVER` lists it), attached to a session or not.
    async fn is_listed(&self, xid: &Xid, phase: Phase) -> Result<bool> {
        let name = xid.mysql_gtrid();
        Ok(self
            .recovered(phase, Some(xid))
            .await?
            .iter()
            .any(|(gtrid, bqual_length)| *gtrid == name && *bqual_length == 0))
    }
}

/// The error for a transaction that is prepared (`XA RECOVER` lists it) but that MariaDB still keeps attached to
/// the session that prepared it, so that no other session can commit or roll it back: retryable, it is resolved
/// once that session ends.
fn still_attached(xid: &Xid, phase: Phase, waited: Duration) -> Error {
    let (what, outcome) = match phase {
        Phase::Commit => (
            "commit",
            "its checkpoint is decided and the transaction stays prepared: it is committed once that session \
             ends (the commit is retried, and the next recovery commits it)",
        ),
        _ => (
            "roll back",
            "no durable checkpoint holds it and the transaction stays prepared, holding its rows and the owner \
             row: it is rolled back once that session ends (the next recovery does)",
        ),
    };
    Error::new(
        ErrorKind::Retryable,
        phase,
        format!(
            "cannot {what} the prepared transaction {xid} yet: it is still attached to the session that prepared \
             it (XA RECOVER lists it; MariaDB answers 'unknown XID' to every other session until that session \
             ends), waited {:.1} s; {outcome}. When the process that prepared it is gone and the server has not \
             noticed, end its session with KILL CONNECTION <id> (an idle session of the sink's user in \
             information_schema.PROCESSLIST; the sink logs the id when it cannot end it itself): the transaction \
             stays prepared",
            waited.as_secs_f64()
        ),
    )
    .with_checkpoint(xid.checkpoint)
    .with_txn(xid.to_string())
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
    /// `XA COMMIT`. MariaDB answers "unknown XID" (`XAER_NOTA`) both for a transaction that is gone and for one
    /// that is prepared but still attached to the session that prepared it; `XA RECOVER` tells them apart (it
    /// lists the attached one). Listed: asked again, backing off, for up to [`ATTACHED_WAIT`], then retryable
    /// (the checkpoint is decided: never given up). Not listed: committed before when its marker is visible,
    /// otherwise lost.
    async fn commit_prepared(&self, xid: &Xid) -> Result<CommitOutcome> {
        let started = Instant::now();
        let mut pause = FIRST_PAUSE;
        loop {
            let mut guard = self.conn(Phase::Commit).await?;
            let unknown = match connected(&mut guard)
                .query_drop(format!("XA COMMIT '{}'", xid.mysql_gtrid()))
                .await
            {
                Ok(()) => return Ok(CommitOutcome::Committed),
                Err(e) if server_code(&e) == Some(ER_XAER_NOTA) => e,
                Err(e) => {
                    forget_if_lost(&mut guard, &e);
                    return Err(my_error(Phase::Commit, Some(xid), "XA COMMIT failed", e));
                }
            };
            drop(guard);
            // The list first, then the marker: a transaction another session commits meanwhile leaves the list
            // only once its commit is visible, so "not listed", then "no marker" means it is really gone.
            if !self.is_listed(xid, Phase::Commit).await? {
                if self.is_committed(xid).await? {
                    return Ok(CommitOutcome::AlreadyCommitted);
                }
                return Err(lost_transaction(xid).with_source(unknown));
            }
            if started.elapsed() >= ATTACHED_WAIT {
                return Err(
                    still_attached(xid, Phase::Commit, started.elapsed()).with_source(unknown)
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// `XA ROLLBACK`. "Unknown XID" for a transaction `XA RECOVER` does not list means it is gone (nothing to
    /// do); for one it lists, that it is still attached to the session that prepared it: asked again for up to
    /// [`ATTACHED_WAIT`], then retryable. It is never left prepared silently (it would hold its rows and the
    /// owner row, and recovery would wait for the owner row in vain).
    async fn rollback_prepared(&self, xid: &Xid) -> Result<()> {
        let started = Instant::now();
        let mut pause = FIRST_PAUSE;
        loop {
            let mut guard = self.conn(Phase::Recover).await?;
            let unknown = match connected(&mut guard)
                .query_drop(format!("XA ROLLBACK '{}'", xid.mysql_gtrid()))
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) if server_code(&e) == Some(ER_XAER_NOTA) => e,
                Err(e) => {
                    forget_if_lost(&mut guard, &e);
                    return Err(my_error(Phase::Recover, Some(xid), "XA ROLLBACK failed", e));
                }
            };
            drop(guard);
            if !self.is_listed(xid, Phase::Recover).await? {
                return Ok(());
            }
            if started.elapsed() >= ATTACHED_WAIT {
                return Err(
                    still_attached(xid, Phase::Recover, started.elapsed()).with_source(unknown)
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    async fn list_prepared(&self, sink: &SinkScope) -> Result<Vec<Prepared>> {
        let mut xids: Vec<Xid> = self
            .recovered(Phase::Recover, None)
            .await?
            .iter()
            .filter_map(|(gtrid, _)| Xid::from_mysql_gtrid(gtrid, sink))
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
        kept_through: Option<CheckpointId>,
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
                    (sink.as_str(), subtask.0, kept_through.map_or(-1, |c| c.0 as i64)),
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
            Ok(None) => Err(Error::new(
                ErrorKind::Bug,
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
