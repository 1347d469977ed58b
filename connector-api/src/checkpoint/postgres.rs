//! A checkpoint store in a PostgreSQL table, shared by several workers.

use async_trait::async_trait;
use tokio_postgres::{Client, NoTls};

use super::record::newest_intact;
use super::{CheckpointRecord, CheckpointStore};
use crate::{Error, ErrorKind, Phase, Result};

/// Serializes creation of the table between workers starting at once.
const CREATE_LOCK: i64 = 0x0072_6174_6368_6563; // "ratchec"

/// Keeps checkpoint records in `ratchet_checkpoints(job, id, record, saved_at)`, one row per checkpoint of a job.
///
/// Several workers (of one job, or of many jobs, each with its own `job` name) can share one database. A record
/// is inserted, never updated: the first record stored for a checkpoint id wins, and a different record for the
/// same id is refused with [`Fenced`](ErrorKind::Fenced), so a zombie worker can never overwrite a decision.
/// The row holds the same checksummed document as the local store; damaged rows are refused and the previous
/// intact one is used. The newest `retain` rows of a job are kept.
pub struct PgCheckpointStore {
    client: Client,
    job: String,
    retain: i64,
}

fn pg_error(message: &str, e: tokio_postgres::Error) -> Error {
    let kind = if e.is_closed() || e.code().is_none() {
        ErrorKind::Retryable
    } else {
        ErrorKind::Fatal
    };
    Error::new(kind, Phase::Checkpoint, message).with_source(e)
}

impl PgCheckpointStore {
    /// Connects to `url` and creates the table if needed; records are kept under `job`.
    pub async fn connect(url: &str, job: &str, retain: usize) -> Result<Self> {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(|e| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Setup,
                "cannot connect to the PostgreSQL checkpoint store",
            )
            .with_source(e)
        })?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "checkpoint store connection ended");
            }
        });
        client
            .batch_execute(&format!(
                "BEGIN;
                 SELECT pg_advisory_xact_lock({CREATE_LOCK});
                 CREATE TABLE IF NOT EXISTS ratchet_checkpoints (
                     job text NOT NULL, id bigint NOT NULL, record bytea NOT NULL,
                     saved_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job, id));
                 COMMIT;"
            ))
            .await
            .map_err(|e| pg_error("cannot create table ratchet_checkpoints", e))?;
        Ok(Self {
            client,
            job: job.to_string(),
            retain: retain.max(2) as i64,
        })
    }
}

#[async_trait]
impl CheckpointStore for PgCheckpointStore {
    async fn save(&self, record: &CheckpointRecord) -> Result<()> {
        let id = record.id.0 as i64;
        let bytes = record.encode();
        let inserted = self
            .client
            .execute(
                "INSERT INTO ratchet_checkpoints (job, id, record) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                &[&self.job, &id, &bytes],
            )
            .await
            .map_err(|e| pg_error("cannot insert the checkpoint record", e).with_checkpoint(record.id))?;
        if inserted == 0 {
            let stored: Vec<u8> = self
                .client
                .query_one(
                    "SELECT record FROM ratchet_checkpoints WHERE job = $1 AND id = $2",
                    &[&self.job, &id],
                )
                .await
                .map_err(|e| {
                    pg_error("cannot read back the checkpoint record", e).with_checkpoint(record.id)
                })?
                .get(0);
            if stored != bytes {
                return Err(Error::new(
                    ErrorKind::Fenced,
                    Phase::Checkpoint,
                    format!(
                        "job {:?} already has a different record for this checkpoint: another worker of this job \
                         (a zombie, or a second worker with the same job name) decided it first; this one must stop",
                        self.job
                    ),
                )
                .with_checkpoint(record.id));
            }
        }
        self.client
            .execute(
                "DELETE FROM ratchet_checkpoints WHERE job = $1 AND id <= $2::bigint - $3::bigint",
                &[&self.job, &id, &self.retain],
            )
            .await
            .map_err(|e| {
                pg_error("cannot prune old checkpoint records", e).with_checkpoint(record.id)
            })?;
        Ok(())
    }

    async fn load_latest(&self) -> Result<Option<CheckpointRecord>> {
        let rows = self
            .client
            .query(
                "SELECT id, record FROM ratchet_checkpoints WHERE job = $1 ORDER BY id DESC",
                &[&self.job],
            )
            .await
            .map_err(|e| pg_error("cannot read checkpoint records", e))?;
        let candidates = rows.iter().map(|row| {
            let id: i64 = row.get(0);
            (
                crate::CheckpointId(id as u64),
                format!("ratchet_checkpoints(job={:?}, id={id})", self.job),
                row.get::<_, Vec<u8>>(1),
            )
        });
        newest_intact(
            &format!("ratchet_checkpoints (job {:?})", self.job),
            candidates,
        )
    }
}
