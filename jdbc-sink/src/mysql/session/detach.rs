//! Getting a prepared XA transaction detached from the session that prepared it: MariaDB keeps it attached (and
//! answers "unknown XID" to a commit from elsewhere) until the server ends that session; the writer ends it
//! itself, waits, and kills it if it lingers.

use connector_api::Phase;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::{MySqlSession, open};
use crate::Xid;
use crate::mysql::server_code;

/// How long `prepare` waits for the server to end the session that prepared, once the writer ended it itself.
pub(super) const DETACH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Unknown thread id (`KILL` of a session that is gone already).
pub(super) const ER_NO_SUCH_THREAD: u16 = 1094;

/// Whether session `old`, which this writer just closed, is still on the server, looked up from its `fresh`
/// connection: `None` when it is gone; `Some(true)` when it is still there and ours; `Some(false)` when the id now
/// belongs to someone else: another user's session, or the server restarted since (connection ids only grow within
/// one server run, so a fresh connection whose id is not above `old` means a new run, and ours is gone).
pub(super) async fn closed_session(
    fresh: &mut Conn,
    old: u32,
) -> std::result::Result<Option<bool>, mysql_async::Error> {
    let sessions: Vec<(u64, Option<String>)> = fresh
        .exec(
            "SELECT ID, USER FROM information_schema.PROCESSLIST WHERE ID IN (?, CONNECTION_ID())",
            (old,),
        )
        .await?;
    let me = fresh.id();
    let user = |id: u32| {
        sessions
            .iter()
            .find(|(session, _)| *session == u64::from(id))
            .map(|(_, user)| user)
    };
    let Some(theirs) = user(old) else {
        return Ok(None);
    };
    Ok(Some(me > old && user(me) == Some(theirs)))
}

/// Ends this writer's own session `id` with `KILL CONNECTION` (a prepared XA transaction stays prepared); a
/// session that is gone already is fine.
pub(super) async fn kill(fresh: &mut Conn, id: u32) -> std::result::Result<(), mysql_async::Error> {
    match fresh.query_drop(format!("KILL CONNECTION {id}")).await {
        Err(e) if server_code(&e) == Some(ER_NO_SUCH_THREAD) => Ok(()),
        other => other,
    }
}

impl MySqlSession {
    /// Ends the session that prepared `xid` and opens the next one. MariaDB keeps a prepared transaction attached
    /// to its session (no other session can commit or roll it back, though `XA RECOVER` lists it; the session can
    /// start nothing new) until the server has ended that session, and the server may end it long after the
    /// client closed it (it may learn only much later that the connection is gone). So the writer closes the
    /// session, opens the next one, and ends the old one itself with `KILL CONNECTION` when it is still on the
    /// server: that detaches the transaction and leaves it prepared (a killed session neither commits nor rolls
    /// back a prepared XA transaction). Then it waits (up to [`DETACH_WAIT`]) until the old session is gone from
    /// the process list, so the commit, on another connection, finds the transaction. Best effort: the
    /// transaction is prepared whatever happens here; a failure leaves the reconnect to the next `begin`, and the
    /// committer waits (a while, then fails retryable) for a session still attached.
    pub(super) async fn detach(&mut self, xid: &Xid) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let old = conn.id();
        if let Err(e) = conn.disconnect().await {
            tracing::warn!(%xid, session = old, error = %e, "closing the session after XA PREPARE failed; the transaction is prepared");
        }
        let mut fresh = match open(&self.opts, &self.config, Phase::PreCommit).await {
            Ok(fresh) => fresh,
            Err(e) => {
                tracing::warn!(
                    %xid, session = old, error = %connector_api::Report(&e),
                    "reconnecting after XA PREPARE failed: cannot end the session that prepared; its transaction \
                     stays prepared, and its commit waits until the server ends that session"
                );
                return;
            }
        };
        let deadline = std::time::Instant::now() + DETACH_WAIT;
        let mut killed = false;
        loop {
            match closed_session(&mut fresh, old).await {
                // Gone, or the id is no longer ours (then ours is gone).
                Ok(None | Some(false)) => break,
                Ok(Some(true)) if !killed => {
                    killed = true;
                    if let Err(e) = kill(&mut fresh, old).await {
                        tracing::warn!(
                            %xid, session = old, error = %e,
                            "cannot end the session that prepared with KILL CONNECTION; its transaction stays \
                             prepared, and its commit waits until the server ends that session"
                        );
                        break;
                    }
                    tracing::debug!(%xid, session = old, "ended the session that prepared with KILL CONNECTION");
                }
                Ok(Some(true)) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                Ok(Some(true)) => {
                    tracing::warn!(
                        %xid, session = old,
                        "the session that prepared is still on the server after KILL CONNECTION; the commit waits \
                         for it"
                    );
                    break;
                }
                Err(e) => {
                    tracing::warn!(%xid, session = old, error = %e, "cannot look for the session that prepared");
                    break;
                }
            }
        }
        self.conn = Some(fresh);
    }
}
