//! A checkpoint store in PostgreSQL tables, shared by every worker of a job.

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};

use super::record::newest_intact;
use super::{CheckpointRecord, CheckpointStore, Claim, ClaimGuard, Loaded, OwnerEpoch};
use crate::postgres::PgConnectOptions;
use crate::{CheckpointId, Error, ErrorKind, Phase, Result, SubtaskId};

/// How long a claim waits for another instance's claim guard (PostgreSQL `lock_timeout`).
const LOCK_WAIT: &str = "30s";

/// Serializes creation of the tables between workers starting at once.
const CREATE_LOCK: i64 = 0x0072_6174_6368_6563; // "ratchec"

const CREATE_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS ratchet_checkpoint_owners (
        job text NOT NULL, subtask integer NOT NULL, epoch bigint NOT NULL, committed_through bigint,
        claimed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job, subtask));
    CREATE TABLE IF NOT EXISTS ratchet_checkpoint_records (
        job text NOT NULL, subtask integer NOT NULL, id bigint NOT NULL, record bytea NOT NULL,
        owner_epoch bigint NOT NULL, saved_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job, subtask, id));";

/// Keeps the checkpoint records of one subtask of a job in `ratchet_checkpoint_records`, with its claim in
/// `ratchet_checkpoint_owners` (one row per job and subtask: owner epoch, committed mark).
///
/// - `claim` raises the owner row's epoch and commits (`INSERT .. ON CONFLICT DO UPDATE .. RETURNING`), then, on a
///   connection of its own, opens a transaction that share-locks the owner row (`SELECT .. FOR SHARE`) if the
///   epoch is still its own: that open transaction is the [`ClaimGuard`]. It blocks the next claim's `UPDATE`,
///   not saves (which share-lock the row too, and are fenced by the committed epoch anyway). Dropping the guard closes the connection, which
///   ends the transaction; so does the death of the process. Claims wait at most [`LOCK_WAIT`] for another
///   claimer's guard (`lock_timeout`).
/// - `save` runs one transaction: `SELECT epoch .. FOR SHARE` on the owner row (a concurrent claim waits for it,
///   and it waits for a concurrent claim), refuse unless the epoch is ours, insert the record unless its id is
///   taken, and refuse a different record under a taken id. A lost reply to `COMMIT` is
///   [`InDoubt`](ErrorKind::InDoubt); a retried save of the identical record then succeeds.
/// - Connections come from a small pool that replaces closed connections, so a restarted server or a dropped
///   connection costs one failed attempt, not the rest of the run.
/// - The newest `retain` records are kept; pruning runs after the save and its failure is only logged.
///
/// Several jobs can share the database: each names itself with `job`.
pub struct PgCheckpointStore {
    options: PgConnectOptions,
    pool: Pool,
    job: String,
    subtask: i32,
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

fn pool_error(e: PoolError) -> Error {
    Error::new(
        ErrorKind::Retryable,
        Phase::Checkpoint,
        "cannot get a connection to the PostgreSQL checkpoint store",
    )
    .with_source(e)
}

impl PgCheckpointStore {
    /// Connects to `url` (a libpq URL or key-value string with libpq's `sslmode`, `sslrootcert`, `sslcert`,
    /// `sslkey`; the password from the URL or `PGPASSWORD`: see [`PgConnectOptions`]) and creates the tables if
    /// needed; records are kept under `job` and `subtask`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a malformed URL or unusable TLS settings; [`Retryable`](ErrorKind::Retryable)
    /// when the server cannot be reached.
    pub async fn connect(url: &str, job: &str, subtask: SubtaskId, retain: usize) -> Result<Self> {
        let store = Self::with_pool(url, job, subtask, retain)?;
        let client = store.pool.get().await.map_err(pool_error)?;
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({CREATE_LOCK}); {CREATE_TABLES} COMMIT;"
            ))
            .await
            .map_err(|e| pg_error("cannot create the checkpoint tables", e))?;
        Ok(store)
    }

    /// Connects to `url` like [`connect`](Self::connect), creating nothing: `None` when the database has no
    /// checkpoint tables yet (no job ever ran there). For read-only tools (`ratchet check-config`).
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_existing(
        url: &str,
        job: &str,
        subtask: SubtaskId,
        retain: usize,
    ) -> Result<Option<Self>> {
        let store = Self::with_pool(url, job, subtask, retain)?;
        let client = store.pool.get().await.map_err(pool_error)?;
        let exists: bool = client
            .query_one(
                "SELECT to_regclass('ratchet_checkpoint_records') IS NOT NULL
                    AND to_regclass('ratchet_checkpoint_owners') IS NOT NULL",
                &[],
            )
            .await
            .map_err(|e| pg_error("cannot look for the checkpoint tables", e))?
            .get(0);
        drop(client);
        Ok(exists.then_some(store))
    }

    fn with_pool(url: &str, job: &str, subtask: SubtaskId, retain: usize) -> Result<Self> {
        let options = PgConnectOptions::parse(url)?;
        let manager = Manager::from_config(
            options.config().clone(),
            options.tls(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager).max_size(2).build().map_err(|e| {
            Error::new(
                ErrorKind::Bug,
                Phase::Setup,
                "cannot build the connection pool",
            )
            .with_source(e)
        })?;
        let subtask = i32::try_from(subtask.0).map_err(|_| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("subtask {subtask} is out of range"),
            )
        })?;
        Ok(Self {
            options,
            pool,
            job: job.to_string(),
            subtask,
            retain: retain.max(2) as i64,
        })
    }

    fn fenced(&self, current: Option<i64>, owner: OwnerEpoch) -> Error {
        Error::new(
            ErrorKind::Fenced,
            Phase::Checkpoint,
            format!(
                "job {:?} subtask {} is owned by epoch {} since this instance claimed epoch {owner}: another \
                 worker took it over; this one must stop",
                self.job,
                self.subtask,
                current.map_or("none".to_string(), |e| e.to_string())
            ),
        )
    }

    /// The insert transaction; `Err` before `COMMIT` means not stored.
    async fn insert(&self, owner: OwnerEpoch, id: i64, bytes: &[u8]) -> Result<()> {
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| pg_error("cannot begin the checkpoint transaction", e))?;
        let current: Option<i64> = tx
            .query_opt(
                "SELECT epoch FROM ratchet_checkpoint_owners WHERE job = $1 AND subtask = $2 FOR SHARE",
                &[&self.job, &self.subtask],
            )
            .await
            .map_err(|e| pg_error("cannot read the owner epoch", e))?
            .map(|row| row.get(0));
        if current != Some(owner.0 as i64) {
            return Err(self.fenced(current, owner));
        }
        let inserted = tx
            .execute(
                "INSERT INTO ratchet_checkpoint_records (job, subtask, id, record, owner_epoch) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[&self.job, &self.subtask, &id, &bytes, &(owner.0 as i64)],
            )
            .await
            .map_err(|e| pg_error("cannot insert the checkpoint record", e))?;
        if inserted == 0 {
            let stored: Vec<u8> = tx
                .query_one(
                    "SELECT record FROM ratchet_checkpoint_records WHERE job = $1 AND subtask = $2 AND id = $3",
                    &[&self.job, &self.subtask, &id],
                )
                .await
                .map_err(|e| pg_error("cannot read back the checkpoint record", e))?
                .get(0);
            if stored != bytes {
                return Err(Error::new(
                    ErrorKind::Fenced,
                    Phase::Checkpoint,
                    format!(
                        "job {:?} subtask {} already has a different record for this checkpoint: another worker \
                         decided it first; this one must stop",
                        self.job, self.subtask
                    ),
                ));
            }
        }
        tx.commit().await.map_err(|e| {
            Error::new(
                ErrorKind::InDoubt,
                Phase::Checkpoint,
                "COMMIT of the checkpoint record got no answer: the record may or may not be stored",
            )
            .with_source(e)
        })
    }

    /// Deletes records beyond the newest `retain`; failures are logged, never returned.
    async fn prune(&self, newest: i64) {
        let outcome = match self.pool.get().await {
            Ok(client) => client
                .execute(
                    "DELETE FROM ratchet_checkpoint_records \
                     WHERE job = $1 AND subtask = $2 AND id <= $3::bigint - $4::bigint",
                    &[&self.job, &self.subtask, &newest, &self.retain],
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = outcome {
            tracing::warn!(job = %self.job, subtask = self.subtask, error = %e,
                "cannot prune old checkpoint records; they are kept until the next save");
        }
    }
}

#[async_trait]
impl CheckpointStore for PgCheckpointStore {
    async fn claim(&self) -> Result<Claim> {
        let busy = |what: &str, e: tokio_postgres::Error| {
            if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
                Error::new(
                    ErrorKind::Retryable,
                    Phase::Checkpoint,
                    format!(
                        "job {:?} subtask {}: another worker has been recovering it for {LOCK_WAIT} (or is paused \
                         while recovering); stop it, or wait",
                        self.job, self.subtask
                    ),
                )
                .with_source(e)
            } else {
                pg_error(what, e)
            }
        };
        let epoch = {
            let mut client = self.pool.get().await.map_err(pool_error)?;
            let tx = client
                .transaction()
                .await
                .map_err(|e| pg_error("cannot begin the claim", e))?;
            tx.batch_execute(&format!("SET LOCAL lock_timeout = '{LOCK_WAIT}'"))
                .await
                .map_err(|e| pg_error("cannot set lock_timeout", e))?;
            let epoch: i64 = tx
                .query_one(
                    "INSERT INTO ratchet_checkpoint_owners AS o (job, subtask, epoch) VALUES ($1, $2, 1) \
                     ON CONFLICT (job, subtask) DO UPDATE SET epoch = o.epoch + 1, claimed_at = now() \
                     RETURNING epoch",
                    &[&self.job, &self.subtask],
                )
                .await
                .map_err(|e| busy("cannot claim the subtask", e))?
                .get(0);
            tx.commit()
                .await
                .map_err(|e| pg_error("cannot commit the claim", e))?;
            epoch
        };
        let guard = self
            .options
            .connect(Phase::Checkpoint, "the claim guard's connection")
            .await?;
        guard
            .batch_execute(&format!("BEGIN; SET LOCAL lock_timeout = '{LOCK_WAIT}'"))
            .await
            .map_err(|e| pg_error("cannot begin the claim guard", e))?;
        let current: i64 = guard
            .query_one(
                "SELECT epoch FROM ratchet_checkpoint_owners WHERE job = $1 AND subtask = $2 FOR SHARE",
                &[&self.job, &self.subtask],
            )
            .await
            .map_err(|e| busy("cannot lock the owner row", e))?
            .get(0);
        let epoch = OwnerEpoch(epoch as u64);
        if current != epoch.0 as i64 {
            return Err(self.fenced(Some(current), epoch));
        }
        Ok(Claim {
            epoch,
            guard: ClaimGuard::new(guard),
        })
    }

    async fn save(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<()> {
        let id = record.id.0 as i64;
        self.insert(owner, id, &record.encode())
            .await
            .map_err(|e| e.with_checkpoint(record.id))?;
        self.prune(id).await;
        Ok(())
    }

    async fn mark_committed(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let updated = client
            .execute(
                "UPDATE ratchet_checkpoint_owners \
                 SET committed_through = GREATEST(coalesce(committed_through, 0), $3) \
                 WHERE job = $1 AND subtask = $2 AND epoch = $4",
                &[
                    &self.job,
                    &self.subtask,
                    &(checkpoint.0 as i64),
                    &(owner.0 as i64),
                ],
            )
            .await
            .map_err(|e| pg_error("cannot update the committed mark", e))?;
        if updated == 0 {
            return Err(self.fenced(None, owner).with_checkpoint(checkpoint));
        }
        Ok(())
    }

    async fn load(&self) -> Result<Loaded> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let rows = client
            .query(
                "SELECT id, record FROM ratchet_checkpoint_records WHERE job = $1 AND subtask = $2 \
                 ORDER BY id DESC",
                &[&self.job, &self.subtask],
            )
            .await
            .map_err(|e| pg_error("cannot read checkpoint records", e))?;
        let committed_through: Option<i64> = client
            .query_opt(
                "SELECT committed_through FROM ratchet_checkpoint_owners WHERE job = $1 AND subtask = $2",
                &[&self.job, &self.subtask],
            )
            .await
            .map_err(|e| pg_error("cannot read the committed mark", e))?
            .and_then(|row| row.get(0));
        let candidates: Vec<_> = rows
            .iter()
            .map(|row| {
                let id: i64 = row.get(0);
                (
                    CheckpointId(id as u64),
                    format!(
                        "ratchet_checkpoint_records(job={:?}, subtask={}, id={id})",
                        self.job, self.subtask
                    ),
                    row.get::<_, Vec<u8>>(1),
                )
            })
            .collect();
        let highest_id = candidates.first().map(|(id, _, _)| *id);
        let store = format!(
            "ratchet_checkpoint_records (job {:?}, subtask {})",
            self.job, self.subtask
        );
        Ok(Loaded {
            record: newest_intact(&store, candidates)?,
            highest_id,
            committed_through: committed_through.map(|c| CheckpointId(c as u64)),
        })
    }
}
