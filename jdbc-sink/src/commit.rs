//! The commit half of the JDBC sink: `COMMIT PREPARED` / `XA COMMIT` on a connection of its own, with the commit
//! marker that makes it idempotent; upsert and append modes only note progress (their rows are in at pre-commit).

use std::sync::Arc;

use async_trait::async_trait;
use connector_api::{Committer, Result, SinkId};

use crate::committable::JdbcCommittable;
use crate::database::Coordinator;

/// The commit half of a [`JdbcSink`](crate::JdbcSink): `COMMIT PREPARED` / `XA COMMIT` on its own connection.
#[derive(Clone)]
pub struct JdbcCommitter {
    pub(crate) sink: SinkId,
    pub(crate) coordinator: Arc<dyn Coordinator>,
}

#[async_trait]
impl Committer for JdbcCommitter {
    type Committable = JdbcCommittable;

    /// Commits every prepared transaction, oldest first; one committed before is skipped (its marker is visible).
    ///
    /// # Errors
    /// [`Fatal`](connector_api::ErrorKind::Fatal) for a transaction that is gone without having committed (rolled back outside
    /// Ratchet): its checkpoint is named, its rows are lost.
    async fn commit(&self, committables: Vec<JdbcCommittable>) -> Result<()> {
        for committable in committables.iter().filter(|c| c.prepared) {
            let xid = committable.xid()?;
            let outcome = self
                .coordinator
                .commit_prepared(&xid)
                .await
                .map_err(|e| e.or_sink(&self.sink))?;
            tracing::debug!(%xid, ?outcome, "committed");
        }
        Ok(())
    }

    async fn is_committed(&self, committable: &JdbcCommittable) -> Result<bool> {
        let xid = committable.xid()?;
        if committable.prepared {
            return self.coordinator.is_committed(&xid).await;
        }
        let applied = self
            .coordinator
            .applied_through(&xid.scope, xid.subtask)
            .await?;
        Ok(applied.is_some_and(|applied| applied >= xid.checkpoint))
    }
}
