//! Which processes of a job are alive, whatever their membership: the one answer to "is any process of this job
//! running?" that `resolve`, `rescale` and a `run` that would rescale ask before they change anything.
//!
//! - Local store: the job's lock file (`worker.lock`, [`crate::membership::local::LocalLease`]) admits one process, and
//!   whoever holds it is the job's only process; an operation that cannot take it is refused.
//! - PostgreSQL store: every process of the job, in every membership mode (leases, static members, the Kafka
//!   group), and every operation that holds the job (`resolve`, `rescale`), keeps a row in
//!   `ratchet_job_processes` naming its mode, renewed every `lease / 5` and expiring `lease` after its last
//!   renewal in the database's clock. A process killed a moment ago counts as alive until its row expires; one
//!   that stopped gracefully deletes its row.
//!
//! Presence decides nothing about who runs what (membership does) and nothing about safety (the store's claims
//! do): it only keeps an operation that changes the job's layout from running under live processes.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::config::{JobConfig, StoreConfig};
use crate::jobstore::store_calls::BoundedSession;

/// Serializes creation of the table between processes starting at once.
const CREATE_LOCK: i64 = 0x0072_6174_7072_6573; // "ratpres"

const CREATE_TABLE: &str = "
    CREATE TABLE IF NOT EXISTS ratchet_job_processes (
        job text NOT NULL, process text NOT NULL, mode text NOT NULL, expires_at timestamptz NOT NULL,
        PRIMARY KEY (job, process));";

/// This process's row among the job's live processes (PostgreSQL store).
pub struct Presence {
    session: BoundedSession,
    job: String,
    process: String,
    mode: String,
    lease_secs: f64,
}

impl Presence {
    /// This process's row among `job`'s live processes, running in `mode`, on the PostgreSQL store (retried
    /// through an outage); `None` on the local store, whose lock already says who runs the job.
    ///
    /// # Errors
    /// The database cannot be reached (after retries).
    pub async fn of_process(job: &JobConfig, mode: &str) -> Result<Option<Self>> {
        let StoreConfig::Postgres { url } = &job.store else {
            return Ok(None);
        };
        let process = super::member_id();
        let joined =
            crate::jobstore::store_calls::retried("joining the job's live processes", || {
                Self::join(url, &job.job.name, process.clone(), mode, job.job.lease)
            })
            .await?;
        Ok(Some(joined))
    }

    /// Joins `job`'s live processes as `process`, running in `mode` (said to operators who find it alive), for
    /// `lease` at a time; creates the table if needed.
    ///
    /// # Errors
    /// The URL is malformed or the database cannot be reached (within half a lease).
    pub async fn join(
        url: &str,
        job: &str,
        process: String,
        mode: &str,
        lease: Duration,
    ) -> Result<Self> {
        let presence = Self {
            session: BoundedSession::new(
                url,
                &format!("ratchet presence {job} {process}"),
                lease / 2,
            )?,
            job: job.to_string(),
            process,
            mode: mode.to_string(),
            lease_secs: lease.as_secs_f64(),
        };
        presence
            .session
            .create_tables(CREATE_LOCK, CREATE_TABLE, "ratchet_job_processes")
            .await?;
        presence.renew().await?;
        Ok(presence)
    }

    /// Renews this process's row for another `lease`.
    ///
    /// # Errors
    /// The database cannot be reached (within half a lease).
    pub async fn renew(&self) -> Result<()> {
        self.session
            .bounded("renewing this process's presence", async {
                self.session
                    .client()
                    .await?
                    .execute(
                        "INSERT INTO ratchet_job_processes (job, process, mode, expires_at)
                         VALUES ($1, $2, $3, now() + make_interval(secs => $4))
                         ON CONFLICT (job, process) DO UPDATE SET expires_at = excluded.expires_at",
                        &[&self.job, &self.process, &self.mode, &self.lease_secs],
                    )
                    .await
                    .context("cannot renew this process's row in ratchet_job_processes")
            })
            .await?;
        Ok(())
    }

    /// The job's other live processes, each as `<process> (<mode>)`.
    ///
    /// # Errors
    /// The database cannot be reached (within half a lease).
    pub async fn others(&self) -> Result<Vec<String>> {
        self.session
            .bounded("listing the job's live processes", async {
                let rows = self
                    .session
                    .client()
                    .await?
                    .query(
                        "SELECT process, mode FROM ratchet_job_processes
                         WHERE job = $1 AND process <> $2 AND expires_at > now() ORDER BY process",
                        &[&self.job, &self.process],
                    )
                    .await
                    .context("cannot list the job's live processes")?;
                Ok(rows
                    .iter()
                    .map(|row| format!("{} ({})", row.get::<_, String>(0), row.get::<_, String>(1)))
                    .collect())
            })
            .await
    }

    /// Deletes this process's row: it no longer counts as alive.
    ///
    /// # Errors
    /// The database cannot be reached (the row then expires by itself).
    pub async fn leave(&self) -> Result<()> {
        self.session
            .bounded("leaving the job's live processes", async {
                self.session
                    .client()
                    .await?
                    .execute(
                        "DELETE FROM ratchet_job_processes WHERE job = $1 AND process = $2",
                        &[&self.job, &self.process],
                    )
                    .await
                    .context("cannot delete this process's row in ratchet_job_processes")
            })
            .await?;
        Ok(())
    }
}
