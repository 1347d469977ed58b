//! PostgreSQL prepared transactions (`PREPARE TRANSACTION` / `COMMIT PREPARED` / `ROLLBACK PREPARED`).

use connector_api::postgres::PgConnectOptions;
use connector_api::{Error, ErrorKind, Phase, Result, SinkId, SubtaskId};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use crate::Xid;

/// The table whose rows record which checkpoints' transactions committed.
const MARKER_TABLE: &str = "ratchet_commits";
/// Advisory lock key serializing the marker table's creation.
const MARKER_TABLE_LOCK: i64 = 0x0072_6174_6368_6574; // "ratchet" in ASCII

/// What `commit_prepared` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// This call committed the prepared transaction.
    Committed,
    /// It had been committed before (a repeated commit): nothing to do.
    AlreadyCommitted,
}

/// Maps a PostgreSQL error to the driver's kind: connection and serialization trouble is retryable, the rest is
/// fatal.
fn classify(e: &tokio_postgres::Error) -> ErrorKind {
    if e.is_closed() {
        return ErrorKind::Retryable;
    }
    match e.code() {
        Some(code)
            if *code == SqlState::T_R_SERIALIZATION_FAILURE
                || *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::TOO_MANY_CONNECTIONS =>
        {
            ErrorKind::Retryable
        }
        None => ErrorKind::Retryable,
        _ => ErrorKind::Fatal,
    }
}

fn pg_error(phase: Phase, xid: Option<&Xid>, message: &str, e: tokio_postgres::Error) -> Error {
    let err = Error::new(classify(&e), phase, message).with_source(e);
    match xid {
        Some(xid) => err
            .with_sink(&xid.sink)
            .with_checkpoint(xid.checkpoint)
            .with_txn(xid.to_string()),
        None => err,
    }
}

/// A PostgreSQL connection that prepares, commits and inspects Ratchet's prepared transactions.
pub struct PgPreparedTransactions {
    client: Client,
}

impl PgPreparedTransactions {
    /// Connects to `url` (a libpq URL with `sslmode` and friends, the password from the URL or `PGPASSWORD`: see
    /// [`PgConnectOptions`]) and makes sure the marker table exists.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a malformed URL or unusable TLS settings, and when the server has
    /// `max_prepared_transactions = 0`: PREPARE TRANSACTION would fail at the first checkpoint, so this fails at
    /// start instead, naming the setting. [`Retryable`](ErrorKind::Retryable) when the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = PgConnectOptions::parse(url)?
            .connect(Phase::Setup, "a connection to PostgreSQL")
            .await?;
        let max: String = client
            .query_one("SHOW max_prepared_transactions", &[])
            .await
            .map_err(|e| {
                pg_error(
                    Phase::Setup,
                    None,
                    "cannot read max_prepared_transactions",
                    e,
                )
            })?
            .get(0);
        if max.trim() == "0" {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "PostgreSQL has max_prepared_transactions = 0, so exactly-once (PREPARE TRANSACTION) cannot work; \
                 set max_prepared_transactions to at least the number of sink subtasks x 2 in postgresql.conf and \
                 restart the server, or run the sink at_least_once",
            ));
        }
        client
            // Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog: serialize it.
            .batch_execute(&format!(
                "BEGIN;
                 SELECT pg_advisory_xact_lock({MARKER_TABLE_LOCK});
                 CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (
                     sink text NOT NULL, subtask integer NOT NULL, checkpoint bigint NOT NULL,
                     committed_at timestamptz NOT NULL DEFAULT now(),
                     PRIMARY KEY (sink, subtask, checkpoint));
                 COMMIT;"
            ))
            .await
            .map_err(|e| {
                pg_error(
                    Phase::Setup,
                    None,
                    "cannot create the commit marker table",
                    e,
                )
            })?;
        Ok(Self { client })
    }

    /// The connection, for writing rows inside a transaction begun with [`Self::begin`].
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Starts the transaction for `xid` and records its marker row inside it.
    pub async fn begin(&self, xid: &Xid) -> Result<()> {
        self.client
            .batch_execute("BEGIN")
            .await
            .map_err(|e| pg_error(Phase::Begin, Some(xid), "BEGIN failed", e))?;
        self.client
            .execute(
                &format!(
                    "INSERT INTO {MARKER_TABLE} (sink, subtask, checkpoint) VALUES ($1, $2, $3)"
                ),
                &[
                    &xid.sink.as_str(),
                    &(xid.subtask.0 as i32),
                    &(xid.checkpoint.0 as i64),
                ],
            )
            .await
            .map_err(|e| pg_error(Phase::Begin, Some(xid), "cannot write the commit marker", e))?;
        Ok(())
    }

    /// `PREPARE TRANSACTION`: the transaction becomes durable and leaves this session; any session can finish it.
    pub async fn prepare(&self, xid: &Xid) -> Result<()> {
        self.client
            .batch_execute(&format!("PREPARE TRANSACTION '{xid}'"))
            .await
            .map_err(|e| pg_error(Phase::PreCommit, Some(xid), "PREPARE TRANSACTION failed", e))
    }

    /// `COMMIT PREPARED`, idempotently: a transaction that is no longer prepared but whose marker row is visible
    /// was committed before.
    ///
    /// # Errors
    /// [`Fatal`](ErrorKind::Fatal) when the transaction is neither prepared nor committed: it was rolled back
    /// (by an operator, or by a recovery that did not know the checkpoint was durable) and its rows are lost; the
    /// message names the checkpoint so the range can be replayed.
    pub async fn commit_prepared(&self, xid: &Xid) -> Result<CommitOutcome> {
        match self
            .client
            .batch_execute(&format!("COMMIT PREPARED '{xid}'"))
            .await
        {
            Ok(()) => Ok(CommitOutcome::Committed),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {
                if self.is_committed(xid).await? {
                    Ok(CommitOutcome::AlreadyCommitted)
                } else {
                    Err(Error::new(
                        ErrorKind::Fatal,
                        Phase::Commit,
                        "the prepared transaction is gone and was never committed (rolled back outside Ratchet?): \
                         the rows of this checkpoint are lost; replay the source from the previous checkpoint",
                    )
                    .with_sink(&xid.sink)
                    .with_checkpoint(xid.checkpoint)
                    .with_txn(xid.to_string())
                    .with_source(e))
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

    /// `ROLLBACK PREPARED`; a transaction that is not prepared (any more) is left alone.
    pub async fn rollback_prepared(&self, xid: &Xid) -> Result<()> {
        match self
            .client
            .batch_execute(&format!("ROLLBACK PREPARED '{xid}'"))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => Ok(()),
            Err(e) => Err(pg_error(
                Phase::Abort,
                Some(xid),
                "ROLLBACK PREPARED failed",
                e,
            )),
        }
    }

    /// The prepared transactions of `sink`/`subtask` in this database, oldest checkpoint first.
    pub async fn list_prepared(&self, sink: &SinkId, subtask: SubtaskId) -> Result<Vec<Xid>> {
        let pattern = format!("{}%", Xid::owner_prefix(sink, subtask).replace('_', "\\_"));
        let rows = self
            .client
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE $1",
                &[&pattern],
            )
            .await
            .map_err(|e| pg_error(Phase::Recover, None, "cannot list prepared transactions", e))?;
        let mut xids: Vec<Xid> = rows
            .iter()
            .filter_map(|row| Xid::parse(row.get::<_, &str>(0)))
            .filter(|xid| &xid.sink == sink && xid.subtask == subtask)
            .collect();
        xids.sort_by_key(|xid| xid.checkpoint);
        Ok(xids)
    }

    /// Whether the transaction of `xid` committed (its marker row is visible).
    pub async fn is_committed(&self, xid: &Xid) -> Result<bool> {
        let row = self
            .client
            .query_opt(
                &format!("SELECT 1 FROM {MARKER_TABLE} WHERE sink = $1 AND subtask = $2 AND checkpoint = $3"),
                &[
                    &xid.sink.as_str(),
                    &(xid.subtask.0 as i32),
                    &(xid.checkpoint.0 as i64),
                ],
            )
            .await
            .map_err(|e| pg_error(Phase::Commit, Some(xid), "cannot read the commit marker", e))?;
        Ok(row.is_some())
    }
}
