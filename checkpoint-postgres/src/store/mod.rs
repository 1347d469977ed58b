//! The store itself: tables, saves, loads and the committed mark.

mod claim;

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod};
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use connector_api::checkpoint::newest_intact;
use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, Claim, Error, ErrorKind, Loaded, OwnerEpoch,
    Phase, Result, SubtaskId,
};
use connector_common::postgres::PgConnectOptions;

/// Serializes creation of the tables between workers starting at once.
const CREATE_LOCK: i64 = 0x0072_6174_6368_6563; // "ratchec"

const CREATE_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS ratchet_checkpoint_owners (
        job text NOT NULL, subtask integer NOT NULL, epoch bigint NOT NULL, committed_through bigint,
        claimed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job, subtask));
    CREATE TABLE IF NOT EXISTS ratchet_checkpoint_records (
        job text NOT NULL, subtask integer NOT NULL, id bigint NOT NULL, record bytea NOT NULL,
        owner_epoch bigint NOT NULL, saved_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job, subtask, id));";

/// How long the store's calls and sessions may take: every call is bounded, and a session the client lost is ended
/// by the server. See [`PgCheckpointStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgStoreLimits {
    /// The longest one call may take, connecting included (a claim: per round, on top of `claim_round`). A call
    /// that takes longer fails ([`InDoubt`](ErrorKind::InDoubt) for a save, [`Retryable`](ErrorKind::Retryable)
    /// otherwise) and its connection is discarded, never reused. The server ends a pooled session that stays idle
    /// inside a transaction this long (the client vanished mid-save), releasing its lock on the owner row.
    pub call: Duration,
    /// How long one round of a claim waits for the owner row's lock (PostgreSQL `lock_timeout`) before it looks up
    /// who holds it, logs that, and waits another round.
    pub claim_round: Duration,
    /// The server ends a claim guard's session once it is idle inside its transaction this long
    /// (`idle_in_transaction_session_timeout`): the longest an orphaned guard (its process lost power or network
    /// without closing the connection) holds off the next claim, and the longest recovery may go between two
    /// claim checks ([`connector_api::ensure_claim_held`]) before its claim lapses.
    pub guard_idle: Duration,
}

impl Default for PgStoreLimits {
    /// 15 s per call, 10 s claim rounds, 60 s guard idle time.
    fn default() -> Self {
        Self {
            call: Duration::from_secs(15),
            claim_round: Duration::from_secs(10),
            guard_idle: Duration::from_secs(60),
        }
    }
}

/// Keeps the checkpoint records of one subtask of a job in `ratchet_checkpoint_records`, with its claim in
/// `ratchet_checkpoint_owners` (one row per job and subtask: owner epoch, committed mark).
///
/// - `claim` raises the owner row's epoch and commits (`INSERT .. ON CONFLICT DO UPDATE .. RETURNING`), then, on a
///   connection of its own, opens a transaction that share-locks the owner row (`SELECT .. FOR SHARE`) if the
///   epoch is still its own: that open transaction is the [`ClaimGuard`](connector_api::ClaimGuard). It blocks the next claim's `UPDATE`,
///   not saves (which share-lock the row too, and are fenced by the committed epoch anyway). Dropping the guard
///   closes the connection, which ends the transaction; so does the death of the process, and the server ends a
///   guard session idle for [`PgStoreLimits::guard_idle`] (an orphan). While another session holds the lock, a
///   claim waits in rounds of [`PgStoreLimits::claim_round`], logging who holds it (the guard's
///   `application_name` names the job, subtask, host and process), for as long as it takes: a live holder is
///   recovering, and an orphan is ended by the server. [`ClaimGuard::check`](connector_api::ClaimGuard::check) asks the guard's own session
///   whether it still holds the lock and the epoch.
/// - `save` runs one transaction: `SELECT epoch .. FOR SHARE` on the owner row (a concurrent claim waits for it,
///   and it waits for a concurrent claim), refuse unless the epoch is ours, insert the record unless its id is
///   taken, and refuse a different record under a taken id. A lost reply to `COMMIT`, or a save that does not
///   finish within [`PgStoreLimits::call`], is [`InDoubt`](ErrorKind::InDoubt); a retried save of the identical
///   record then succeeds.
/// - Connections come from a small pool that replaces closed connections, so a restarted server or a dropped
///   connection costs one failed attempt, not the rest of the run. A connection whose call timed out is taken out
///   of the pool and closed. Every connection has a connect timeout, TCP keepalives and a TCP user timeout
///   ([`connector_common::postgres`]).
/// - The newest `retain` records are kept; pruning runs after the save and its failure is only logged.
///
/// Several jobs can share the database: each names itself with `job`.
pub struct PgCheckpointStore {
    pub(crate) guard_options: PgConnectOptions,
    pool: Pool,
    pub(crate) job: String,
    pub(crate) subtask: i32,
    retain: i64,
    pub(crate) limits: PgStoreLimits,
}

pub(crate) fn pg_error(message: &str, e: tokio_postgres::Error) -> Error {
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
    /// needed; records are kept under `job` and `subtask`; every call is bounded by `limits`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a malformed URL or unusable TLS settings; [`Retryable`](ErrorKind::Retryable)
    /// when the server cannot be reached or does not answer within the call limit.
    pub async fn connect(
        url: &str,
        job: &str,
        subtask: SubtaskId,
        retain: usize,
        limits: PgStoreLimits,
    ) -> Result<Self> {
        let store = Self::with_pool(url, job, subtask, retain, limits)?;
        store
            .call("creating the checkpoint tables", ErrorKind::Retryable, |client| Box::pin(async move {
                client
                    .batch_execute(&format!(
                        "BEGIN; SELECT pg_advisory_xact_lock({CREATE_LOCK}); {CREATE_TABLES} COMMIT;"
                    ))
                    .await
                    .map_err(|e| pg_error("cannot create the checkpoint tables", e))
            }))
            .await?;
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
        limits: PgStoreLimits,
    ) -> Result<Option<Self>> {
        let store = Self::with_pool(url, job, subtask, retain, limits)?;
        let exists = store
            .call(
                "looking for the checkpoint tables",
                ErrorKind::Retryable,
                |client| {
                    Box::pin(async move {
                        Ok(client
                            .query_one(
                                "SELECT to_regclass('ratchet_checkpoint_records') IS NOT NULL
                            AND to_regclass('ratchet_checkpoint_owners') IS NOT NULL",
                                &[],
                            )
                            .await
                            .map_err(|e| pg_error("cannot look for the checkpoint tables", e))?
                            .get::<_, bool>(0))
                    })
                },
            )
            .await?;
        Ok(exists.then_some(store))
    }

    fn with_pool(
        url: &str,
        job: &str,
        subtask: SubtaskId,
        retain: usize,
        limits: PgStoreLimits,
    ) -> Result<Self> {
        let options = PgConnectOptions::parse(url)?;
        let pooled = options
            .clone()
            .with_session_limits(limits.call, &format!("ratchet store {job}/{}", subtask.0));
        let manager = Manager::from_config(
            pooled.config().clone(),
            pooled.tls(),
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
        let subtask_number = i32::try_from(subtask.0).map_err(|_| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("subtask {subtask} is out of range"),
            )
        })?;
        Ok(Self {
            guard_options: options
                .with_session_limits(limits.guard_idle, &claim::guard_name(job, subtask)),
            pool,
            job: job.to_string(),
            subtask: subtask_number,
            retain: retain.max(2) as i64,
            limits,
        })
    }

    /// Runs `op` on a pooled connection, all of it (getting the connection included) within
    /// [`PgStoreLimits::call`]. On time-out the connection is taken out of the pool and closed, and the call fails
    /// with `timeout_kind` ([`InDoubt`](ErrorKind::InDoubt) where the call may have taken effect).
    pub(crate) async fn call<T, F>(&self, what: &str, timeout_kind: ErrorKind, op: F) -> Result<T>
    where
        F: for<'c> FnOnce(&'c mut Object) -> BoxFuture<'c, Result<T>>,
    {
        self.call_within(self.limits.call, what, timeout_kind, op)
            .await
    }

    pub(crate) async fn call_within<T, F>(
        &self,
        limit: Duration,
        what: &str,
        timeout_kind: ErrorKind,
        op: F,
    ) -> Result<T>
    where
        F: for<'c> FnOnce(&'c mut Object) -> BoxFuture<'c, Result<T>>,
    {
        let deadline = Instant::now() + limit;
        let timed_out = || {
            Error::new(
                timeout_kind,
                Phase::Checkpoint,
                format!(
                    "{what}: the PostgreSQL checkpoint store did not answer within {limit:?} (the store's call \
                     limit, max_call_time); its connection is discarded"
                ),
            )
        };
        let mut client = match tokio::time::timeout_at(deadline, self.pool.get()).await {
            Ok(client) => client.map_err(pool_error)?,
            Err(_) => return Err(timed_out()),
        };
        match tokio::time::timeout_at(deadline, op(&mut client)).await {
            Ok(outcome) => outcome,
            Err(_) => {
                drop(Object::take(client));
                Err(timed_out())
            }
        }
    }

    pub(crate) fn fenced(&self, current: Option<i64>, owner: OwnerEpoch) -> Error {
        fenced(&self.job, self.subtask, current, owner)
    }

    /// The insert transaction; `Err` before `COMMIT` means not stored.
    async fn insert(
        client: &mut Object,
        key: &OwnerKey,
        owner: OwnerEpoch,
        id: i64,
        bytes: &[u8],
    ) -> Result<()> {
        let tx = client
            .transaction()
            .await
            .map_err(|e| pg_error("cannot begin the checkpoint transaction", e))?;
        let current: Option<i64> = tx
            .query_opt(
                "SELECT epoch FROM ratchet_checkpoint_owners WHERE job = $1 AND subtask = $2 FOR SHARE",
                &[&key.job, &key.subtask],
            )
            .await
            .map_err(|e| pg_error("cannot read the owner epoch", e))?
            .map(|row| row.get(0));
        if current != Some(owner.0 as i64) {
            return Err(fenced(&key.job, key.subtask, current, owner));
        }
        let inserted = tx
            .execute(
                "INSERT INTO ratchet_checkpoint_records (job, subtask, id, record, owner_epoch) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[&key.job, &key.subtask, &id, &bytes, &(owner.0 as i64)],
            )
            .await
            .map_err(|e| pg_error("cannot insert the checkpoint record", e))?;
        if inserted == 0 {
            let stored: Vec<u8> = tx
                .query_one(
                    "SELECT record FROM ratchet_checkpoint_records WHERE job = $1 AND subtask = $2 AND id = $3",
                    &[&key.job, &key.subtask, &id],
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
                        key.job, key.subtask
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
        let key = self.key();
        let retain = self.retain;
        let outcome = self
            .call(
                "pruning old checkpoint records",
                ErrorKind::Retryable,
                |client| {
                    Box::pin(async move {
                        client
                            .execute(
                                "DELETE FROM ratchet_checkpoint_records \
                         WHERE job = $1 AND subtask = $2 AND id <= $3::bigint - $4::bigint",
                                &[&key.job, &key.subtask, &newest, &retain],
                            )
                            .await
                            .map(|_| ())
                            .map_err(|e| pg_error("cannot prune old checkpoint records", e))
                    })
                },
            )
            .await;
        if let Err(e) = outcome {
            tracing::warn!(job = %self.job, subtask = self.subtask, error = %connector_api::Report(&e),
                "cannot prune old checkpoint records; they are kept until the next save");
        }
    }

    pub(crate) fn key(&self) -> OwnerKey {
        OwnerKey {
            job: self.job.clone(),
            subtask: self.subtask,
        }
    }
}

/// Which owner row a store or guard works on.
#[derive(Clone)]
pub(crate) struct OwnerKey {
    pub(crate) job: String,
    pub(crate) subtask: i32,
}

fn fenced(job: &str, subtask: i32, current: Option<i64>, owner: OwnerEpoch) -> Error {
    Error::new(
        ErrorKind::Fenced,
        Phase::Checkpoint,
        format!(
            "job {job:?} subtask {subtask} is owned by epoch {} since this instance claimed epoch {owner}: another \
             worker took it over; this one must stop",
            current.map_or("none".to_string(), |e| e.to_string())
        ),
    )
}

#[async_trait]
impl CheckpointStore for PgCheckpointStore {
    async fn claim(&self) -> Result<Claim> {
        self.claim_waiting().await
    }

    async fn save(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<()> {
        let id = record.id.0 as i64;
        let key = self.key();
        let bytes = record.encode();
        self.call(
            "saving the checkpoint record",
            ErrorKind::InDoubt,
            |client| Box::pin(async move { Self::insert(client, &key, owner, id, &bytes).await }),
        )
        .await
        .map_err(|e| e.with_checkpoint(record.id))?;
        self.prune(id).await;
        Ok(())
    }

    async fn mark_committed(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()> {
        let key = self.key();
        let updated = self
            .call(
                "noting the checkpoint committed",
                ErrorKind::Retryable,
                |client| {
                    Box::pin(async move {
                        client
                            .execute(
                                "UPDATE ratchet_checkpoint_owners \
                         SET committed_through = GREATEST(coalesce(committed_through, 0), $3) \
                         WHERE job = $1 AND subtask = $2 AND epoch = $4",
                                &[
                                    &key.job,
                                    &key.subtask,
                                    &(checkpoint.0 as i64),
                                    &(owner.0 as i64),
                                ],
                            )
                            .await
                            .map_err(|e| pg_error("cannot update the committed mark", e))
                    })
                },
            )
            .await?;
        if updated == 0 {
            return Err(self.fenced(None, owner).with_checkpoint(checkpoint));
        }
        Ok(())
    }

    async fn owner(&self) -> Result<Option<OwnerEpoch>> {
        let key = self.key();
        self.call("reading the owner epoch", ErrorKind::Retryable, |client| {
            Box::pin(async move {
                Ok(client
                .query_opt(
                    "SELECT epoch FROM ratchet_checkpoint_owners WHERE job = $1 AND subtask = $2",
                    &[&key.job, &key.subtask],
                )
                .await
                .map_err(|e| pg_error("cannot read the owner epoch", e))?
                .map(|row| OwnerEpoch(row.get::<_, i64>(0) as u64)))
            })
        })
        .await
    }

    async fn load(&self) -> Result<Loaded> {
        let key = self.key();
        let (rows, committed_through) = self
            .call("loading the checkpoint records", ErrorKind::Retryable, |client| Box::pin(async move {
                let rows = client
                    .query(
                        "SELECT id, record FROM ratchet_checkpoint_records WHERE job = $1 AND subtask = $2 \
                         ORDER BY id DESC",
                        &[&key.job, &key.subtask],
                    )
                    .await
                    .map_err(|e| pg_error("cannot read checkpoint records", e))?;
                let committed_through: Option<i64> = client
                    .query_opt(
                        "SELECT committed_through FROM ratchet_checkpoint_owners WHERE job = $1 AND subtask = $2",
                        &[&key.job, &key.subtask],
                    )
                    .await
                    .map_err(|e| pg_error("cannot read the committed mark", e))?
                    .and_then(|row| row.get(0));
                Ok((rows, committed_through))
            }))
            .await?;
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
