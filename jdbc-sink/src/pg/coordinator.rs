//! Prepared transactions and the owner row on PostgreSQL, from a connection of their own.

use std::time::Duration;

use async_trait::async_trait;
use connector_api::{CheckpointId, Error, Phase, Result, SinkScope, SubtaskId};
use connector_common::postgres::PgConnectOptions;
use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::pg_error;
use crate::Xid;
use crate::database::{CommitOutcome, Coordinator, MARKERS_TABLE, OWNERS_TABLE, Prepared};
use crate::error::lost_transaction;

/// See the module docs. Reconnects when its connection was lost.
pub(crate) struct PgCoordinator {
    options: PgConnectOptions,
    client: Mutex<Option<Client>>,
    lock_timeout: Duration,
}

impl PgCoordinator {
    /// A coordinator connecting with `options` (lazily); recovery waits `lock_timeout` for the owner row.
    pub(crate) fn new(options: PgConnectOptions, lock_timeout: Duration) -> Self {
        Self {
            options,
            client: Mutex::new(None),
            lock_timeout,
        }
    }

    async fn client(&self, phase: Phase) -> Result<MutexGuard<'_, Option<Client>>> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(Client::is_closed) {
            *guard = Some(
                self.options
                    .connect("the JDBC sink's commit connection to PostgreSQL")
                    .await
                    .map_err(|e| Error::from(e).at_phase(phase))?,
            );
        }
        Ok(guard)
    }
}

fn connected<'a>(guard: &'a mut MutexGuard<'_, Option<Client>>) -> &'a mut Client {
    guard.as_mut().expect("PgCoordinator::client connected it")
}

#[async_trait]
impl Coordinator for PgCoordinator {
    async fn commit_prepared(&self, xid: &Xid) -> Result<CommitOutcome> {
        let mut guard = self.client(Phase::Commit).await?;
        let client = connected(&mut guard);
        match client
            .batch_execute(&format!("COMMIT PREPARED '{xid}'"))
            .await
        {
            Ok(()) => Ok(CommitOutcome::Committed),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {
                drop(guard);
                if self.is_committed(xid).await? {
                    Ok(CommitOutcome::AlreadyCommitted)
                } else {
                    Err(lost_transaction(xid).with_source(e))
                }
            }
            Err(e) => Err(pg_error(
                Phase::Commit,
                Some(xid),
                "COMMIT PREPARED failed",
                e,
            )),
        }
    }

    async fn rollback_prepared(&self, xid: &Xid) -> Result<()> {
        let mut guard = self.client(Phase::Recover).await?;
        match connected(&mut guard)
            .batch_execute(&format!("ROLLBACK PREPARED '{xid}'"))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => Ok(()),
            Err(e) => Err(pg_error(
                Phase::Recover,
                Some(xid),
                "ROLLBACK PREPARED failed",
                e,
            )),
        }
    }

    async fn list_prepared(&self, sink: &SinkScope) -> Result<Vec<Prepared>> {
        let mut guard = self.client(Phase::Recover).await?;
        let pattern = format!("{}%", Xid::sink_prefix(sink).replace('_', "\\_"));
        let rows = connected(&mut guard)
            .query(
                "SELECT gid, extract(epoch FROM now() - prepared)::float8 FROM pg_prepared_xacts
                 WHERE database = current_database() AND gid LIKE $1",
                &[&pattern],
            )
            .await
            .map_err(|e| pg_error(Phase::Recover, None, "cannot list prepared transactions", e))?;
        let mut prepared: Vec<Prepared> = rows
            .iter()
            .filter_map(|row| {
                let xid = Xid::parse(row.get::<_, &str>(0))?;
                let age = std::time::Duration::try_from_secs_f64(row.get::<_, f64>(1)).ok();
                Some(Prepared { xid, age })
            })
            .filter(|p| &p.xid.scope == sink)
            .collect();
        prepared.sort_by_key(|p| (p.xid.checkpoint, p.xid.subtask));
        Ok(prepared)
    }

    async fn is_committed(&self, xid: &Xid) -> Result<bool> {
        let mut guard = self.client(Phase::Commit).await?;
        let row = connected(&mut guard)
            .query_opt(
                &format!(
                    "SELECT 1 FROM {MARKERS_TABLE} WHERE sink = $1 AND subtask = $2 AND checkpoint = $3"
                ),
                &[
                    &xid.scope.as_str(),
                    &(xid.subtask.0 as i32),
                    &(xid.checkpoint.0 as i64),
                ],
            )
            .await
            .map_err(|e| pg_error(Phase::Commit, Some(xid), "cannot read the commit marker", e))?;
        Ok(row.is_some())
    }

    async fn applied_through(
        &self,
        sink: &SinkScope,
        subtask: SubtaskId,
    ) -> Result<Option<CheckpointId>> {
        let mut guard = self.client(Phase::Commit).await?;
        let row = connected(&mut guard)
            .query_opt(
                &format!("SELECT checkpoint FROM {OWNERS_TABLE} WHERE sink = $1 AND subtask = $2"),
                &[&sink.as_str(), &(subtask.0 as i32)],
            )
            .await
            .map_err(|e| pg_error(Phase::Commit, None, "cannot read the owner row", e))?;
        Ok(row
            .and_then(|r| r.get::<_, Option<i64>>(0))
            .map(|c| CheckpointId(c as u64)))
    }

    async fn claim_owner(
        &self,
        sink: &SinkScope,
        subtask: SubtaskId,
        kept_through: Option<CheckpointId>,
    ) -> Result<Option<u64>> {
        let mut guard = self.client(Phase::Recover).await?;
        let client = connected(&mut guard);
        let fail = |e| pg_error(Phase::Recover, None, "cannot raise the owner epoch", e);
        let txn = client.transaction().await.map_err(fail)?;
        txn.batch_execute(&format!(
            "SET LOCAL lock_timeout = {}",
            self.lock_timeout.as_millis().max(1)
        ))
        .await
        .map_err(fail)?;
        let raised = txn
            .query_one(
                &format!(
                    "INSERT INTO {OWNERS_TABLE} (sink, subtask, epoch) VALUES ($1, $2, 1)
                     ON CONFLICT (sink, subtask) DO UPDATE SET epoch = {OWNERS_TABLE}.epoch + 1
                     RETURNING epoch"
                ),
                &[
                    &sink.as_str() as &(dyn tokio_postgres::types::ToSql + Sync),
                    &(subtask.0 as i32),
                ],
            )
            .await;
        let after = kept_through.map_or(-1, |c| c.0 as i64);
        let raised = match raised {
            Ok(row) => txn
                .execute(
                    &format!(
                        "DELETE FROM {MARKERS_TABLE} WHERE sink = $1 AND subtask = $2 AND checkpoint > $3"
                    ),
                    &[&sink.as_str(), &(subtask.0 as i32), &after],
                )
                .await
                .map(|_| row),
            Err(e) => Err(e),
        };
        match raised {
            Ok(row) => {
                txn.commit().await.map_err(fail)?;
                Ok(Some(row.get::<_, i64>(0) as u64))
            }
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(None),
            Err(e) => Err(fail(e)),
        }
    }
}
