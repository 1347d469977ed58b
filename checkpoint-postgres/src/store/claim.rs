//! Claims of the PostgreSQL checkpoint store: raising the owner epoch, the guard session that holds off newer claims
//! while recovery runs (and can tell whether it still does), and waiting, naming the holder, while another
//! session holds it.

use std::time::Duration;

use async_trait::async_trait;

use tokio::time::Instant;

use connector_api::{
    Claim, ClaimGuard, Error, ErrorKind, HeldClaim, OwnerEpoch, Phase, Result, SubtaskId,
};

use super::{OwnerKey, PgCheckpointStore, pg_error};

fn lock_busy(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
}

/// This process, as the guard's `application_name` names it: host and pid.
fn this_process() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".to_string());
    format!("{host}:{}", std::process::id())
}

/// How a claim round ended without a claim.
pub(crate) enum Round {
    /// Another session holds the owner row's lock: wait another round.
    Busy,
    /// Any other failure, as the claim reports it.
    Failed(Error),
}

impl From<Error> for Round {
    fn from(e: Error) -> Self {
        Self::Failed(e)
    }
}

/// A claim guard: the open transaction share-locking the owner row, on a session of its own.
struct PgGuard {
    client: tokio_postgres::Client,
    key: OwnerKey,
    epoch: OwnerEpoch,
    call: Duration,
}

#[async_trait]
impl HeldClaim for PgGuard {
    async fn check(&self) -> Result<()> {
        let lapsed = |why: String| {
            Error::new(
                ErrorKind::Fenced,
                Phase::Recover,
                format!(
                    "the claim of job {:?} subtask {} (epoch {}) lapsed: {why}; another worker may own the subtask now",
                    self.key.job, self.key.subtask, self.epoch
                ),
            )
        };
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
            [&self.key.job, &self.key.subtask];
        let read = self.client.query_one(
            "SELECT epoch FROM ratchet_checkpoint_owners WHERE job = $1 AND subtask = $2",
            &params,
        );
        let outcome = tokio::time::timeout(self.call, read).await;
        match outcome {
            Err(_) => Err(lapsed(format!(
                "its guard session did not answer within {:?}",
                self.call
            ))),
            Ok(Err(e)) => Err(lapsed("its guard session ended (the server closed it, restarted, or the connection was reset)".to_string()).with_source(e)),
            Ok(Ok(row)) if row.get::<_, i64>(0) == self.epoch.0 as i64 => Ok(()),
            Ok(Ok(row)) => Err(lapsed(format!("the owner epoch is {} now", row.get::<_, i64>(0)))),
        }
    }
}

/// A claim guard session's `application_name`: [`PgCheckpointStore::guard_prefix`] and this process.
pub(crate) fn guard_name(job: &str, subtask: SubtaskId) -> String {
    format!(
        "{}{}",
        PgCheckpointStore::guard_prefix(job, subtask),
        this_process()
    )
}

impl PgCheckpointStore {
    /// Claims the subtask, waiting in rounds while another session holds its claim, logging who after each round.
    pub(crate) async fn claim_waiting(&self) -> Result<Claim> {
        let waiting_since = Instant::now();
        loop {
            match self.claim_round().await {
                Ok(claim) => return Ok(claim),
                Err(Round::Failed(e)) => return Err(e),
                Err(Round::Busy) => {
                    let holders = self.guard_holders().await;
                    tracing::warn!(job = %self.job, subtask = self.subtask,
                        waiting_s = waiting_since.elapsed().as_secs(), held_by = %holders,
                        "another session holds this subtask's claim (recovering, paused, or orphaned: the server \
                         ends an orphaned guard after guard_idle); waiting for it");
                }
            }
        }
    }

    /// The start of a claim guard's `application_name`, followed by its host and pid.
    fn guard_prefix(job: &str, subtask: SubtaskId) -> String {
        format!("ratchet guard {job}/{} ", subtask.0)
    }

    /// One claim round: raise the epoch (waiting at most a round for the owner row's lock), then take the guard.
    async fn claim_round(&self) -> Result<Claim, Round> {
        let key = self.key();
        let round = self.limits.claim_round;
        let epoch = self
            .call_within(
                round + self.limits.call,
                "claiming the subtask",
                ErrorKind::Retryable,
                |client| Box::pin(async move {
                    let tx = client
                        .transaction()
                        .await
                        .map_err(|e| pg_error("cannot begin the claim", e))?;
                    tx.batch_execute(&format!("SET LOCAL lock_timeout = {}", round.as_millis()))
                        .await
                        .map_err(|e| pg_error("cannot set lock_timeout", e))?;
                    let epoch = match tx
                        .query_one(
                            "INSERT INTO ratchet_checkpoint_owners AS o (job, subtask, epoch) VALUES ($1, $2, 1) \
                             ON CONFLICT (job, subtask) DO UPDATE SET epoch = o.epoch + 1, claimed_at = now() \
                             RETURNING epoch",
                            &[&key.job, &key.subtask],
                        )
                        .await
                    {
                        Ok(row) => row.get::<_, i64>(0),
                        Err(e) if lock_busy(&e) => return Ok(None),
                        Err(e) => return Err(pg_error("cannot claim the subtask", e)),
                    };
                    tx.commit()
                        .await
                        .map_err(|e| pg_error("cannot commit the claim", e))?;
                    Ok(Some(epoch))
                }),
            )
            .await?;
        let Some(epoch) = epoch else {
            return Err(Round::Busy);
        };
        let epoch = OwnerEpoch(epoch as u64);
        let limit = round + self.limits.call;
        let guard = tokio::time::timeout(limit, self.take_guard(epoch))
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Retryable,
                    Phase::Checkpoint,
                    format!("taking the claim guard: the PostgreSQL checkpoint store did not answer within {limit:?}"),
                )
            })??;
        Ok(Claim { epoch, guard })
    }

    /// Opens the guard's session and share-locks the owner row in its open transaction, if `epoch` is still the
    /// newest.
    async fn take_guard(&self, epoch: OwnerEpoch) -> Result<ClaimGuard, Round> {
        let client = self
            .guard_options
            .connect("the claim guard's connection")
            .await
            .map_err(|e| Error::from(e).at_phase(Phase::Checkpoint))?;
        client
            .batch_execute(&format!(
                "BEGIN; SET LOCAL lock_timeout = {}",
                self.limits.claim_round.as_millis()
            ))
            .await
            .map_err(|e| pg_error("cannot begin the claim guard", e))?;
        let current: i64 = match client
            .query_one(
                "SELECT epoch FROM ratchet_checkpoint_owners WHERE job = $1 AND subtask = $2 FOR SHARE",
                &[&self.job, &self.subtask],
            )
            .await
        {
            Ok(row) => row.get(0),
            Err(e) if lock_busy(&e) => return Err(Round::Busy),
            Err(e) => return Err(pg_error("cannot lock the owner row", e).into()),
        };
        if current != epoch.0 as i64 {
            return Err(self.fenced(Some(current), epoch).into());
        }
        Ok(ClaimGuard::new(PgGuard {
            client,
            key: self.key(),
            epoch,
            call: self.limits.call,
        }))
    }

    /// The sessions that hold a claim guard of this subtask, as `pg_stat_activity` shows them, for the log line of
    /// a waiting claim. Best effort: an error is described, not returned.
    async fn guard_holders(&self) -> String {
        let prefix = Self::guard_prefix(&self.job, SubtaskId(self.subtask as u32));
        let outcome = self
            .call("looking up the claim's holder", ErrorKind::Retryable, |client| Box::pin(async move {
                client
                    .query(
                        "SELECT pid, application_name, coalesce(host(client_addr), 'local'), state, \
                                coalesce(extract(epoch FROM now() - xact_start)::bigint, 0), \
                                coalesce(extract(epoch FROM now() - state_change)::bigint, 0) \
                         FROM pg_stat_activity \
                         WHERE starts_with(application_name, left($1, 63)) AND pid <> pg_backend_pid()",
                        &[&prefix],
                    )
                    .await
                    .map_err(|e| pg_error("cannot read pg_stat_activity", e))
            }))
            .await;
        match outcome {
            Ok(rows) if rows.is_empty() => {
                "no claim guard session is listed (the lock is held by a save or claim in progress)"
                    .to_string()
            }
            Ok(rows) => rows
                .iter()
                .map(|row| {
                    format!(
                        "backend pid {} ({:?}) from {}, {} for {} s, in its transaction for {} s",
                        row.get::<_, i32>(0),
                        row.get::<_, String>(1),
                        row.get::<_, String>(2),
                        row.get::<_, Option<String>>(3).unwrap_or_default(),
                        row.get::<_, i64>(5),
                        row.get::<_, i64>(4),
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            Err(e) => format!("unknown ({})", connector_api::Report(&e)),
        }
    }
}
