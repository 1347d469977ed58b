//! Leases in the PostgreSQL store ([`PgLeases`], `[job] membership = "leases"`, the default there).
//!
//! Every process is a row in `ratchet_worker_members` and holds its subtasks as rows in `ratchet_subtask_leases`,
//! each with an expiry in the database's clock (no clock skew between machines). Every `lease / 5` a process renews
//! its rows, and computes its quota from the live members ordered by id (N subtasks over M members: the first
//! `N % M` get `N / M + 1`, the others `N / M`); it hands over subtasks above its quota (stopping them gracefully
//! first, then deleting the lease) and takes free or expired ones up to it. A killed or paused process stops
//! renewing: its leases expire after `lease`, and the others take its subtasks at their next renewal, so a subtask
//! is picked up again within `lease + lease / 5` plus its recovery.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;

use super::{Assignment, Membership};
use crate::jobstore::store_calls::BoundedSession;

/// Serializes creation of the lease tables between processes starting at once.
const CREATE_LOCK: i64 = 0x0072_6174_6c65_6173; // "ratleas"

const CREATE_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS ratchet_worker_members (
        job text NOT NULL, member text NOT NULL, expires_at timestamptz NOT NULL, PRIMARY KEY (job, member));
    CREATE TABLE IF NOT EXISTS ratchet_subtask_leases (
        job text NOT NULL, subtask integer NOT NULL, member text NOT NULL, expires_at timestamptz NOT NULL,
        PRIMARY KEY (job, subtask));";

/// Leases in PostgreSQL; see the module docs.
pub struct PgLeases {
    session: BoundedSession,
    job: String,
    member: String,
    subtasks: u32,
    lease_secs: f64,
}

impl PgLeases {
    /// Joins `job` (of `subtasks` subtasks) as `member` in the database at `url`, creating the tables if needed.
    ///
    /// # Errors
    /// The URL is malformed or the database cannot be reached.
    pub async fn join(
        url: &str,
        job: &str,
        member: String,
        subtasks: u32,
        lease: Duration,
    ) -> Result<Self> {
        // Every call bounded to half a lease (see `BoundedSession`).
        let leases = Self {
            session: BoundedSession::new(
                url,
                &format!("ratchet leases {job} {member}"),
                lease / 2,
            )?,
            job: job.to_string(),
            member,
            subtasks,
            lease_secs: lease.as_secs_f64(),
        };
        leases
            .session
            .create_tables(CREATE_LOCK, CREATE_TABLES, "the lease tables")
            .await?;
        Ok(leases)
    }

    async fn renew_on(&self, client: &tokio_postgres::Client) -> Result<Assignment> {
        let subtasks = i32::try_from(self.subtasks).context("subtasks out of range")?;
        client
            .execute(
                "INSERT INTO ratchet_worker_members (job, member, expires_at)
                 VALUES ($1, $2, now() + make_interval(secs => $3))
                 ON CONFLICT (job, member) DO UPDATE SET expires_at = excluded.expires_at",
                &[&self.job, &self.member, &self.lease_secs],
            )
            .await
            .context("cannot renew this process's membership")?;
        let mut held: BTreeSet<u32> = client
            .query(
                "UPDATE ratchet_subtask_leases SET expires_at = now() + make_interval(secs => $3)
                 WHERE job = $1 AND member = $2 AND subtask < $4 RETURNING subtask",
                &[&self.job, &self.member, &self.lease_secs, &subtasks],
            )
            .await
            .context("cannot renew this process's subtask leases")?
            .iter()
            .map(|row| row.get::<_, i32>(0) as u32)
            .collect();
        let members: Vec<String> = client
            .query(
                "SELECT member FROM ratchet_worker_members WHERE job = $1 AND expires_at > now() ORDER BY member",
                &[&self.job],
            )
            .await
            .context("cannot list the job's live processes")?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let rank = members
            .iter()
            .position(|m| *m == self.member)
            .unwrap_or(members.len());
        let live = members.len().max(rank + 1);
        let n = self.subtasks as usize;
        let quota = n / live + usize::from(rank < n % live);
        if held.len() < quota {
            let free: Vec<i32> = client
                .query(
                    "SELECT s FROM generate_series(0, $2 - 1) AS s WHERE NOT EXISTS (
                         SELECT 1 FROM ratchet_subtask_leases l
                         WHERE l.job = $1 AND l.subtask = s AND l.expires_at > now())",
                    &[&self.job, &subtasks],
                )
                .await
                .context("cannot list free subtasks")?
                .iter()
                .map(|row| row.get(0))
                .collect();
            for subtask in free {
                if held.len() >= quota {
                    break;
                }
                let taken = client
                    .query_opt(
                        "INSERT INTO ratchet_subtask_leases (job, subtask, member, expires_at)
                         VALUES ($1, $2, $3, now() + make_interval(secs => $4))
                         ON CONFLICT (job, subtask) DO UPDATE
                           SET member = excluded.member, expires_at = excluded.expires_at
                           WHERE ratchet_subtask_leases.expires_at <= now()
                              OR ratchet_subtask_leases.member = excluded.member
                         RETURNING subtask",
                        &[&self.job, &subtask, &self.member, &self.lease_secs],
                    )
                    .await
                    .with_context(|| format!("cannot take the lease of subtask {subtask}"))?;
                if taken.is_some() {
                    held.insert(subtask as u32);
                }
            }
        }
        Ok(Assignment {
            handing: BTreeSet::new(),
            held,
            quota,
            members: live,
        })
    }
}

#[async_trait]
impl Membership for PgLeases {
    async fn renew(&self) -> Result<Assignment> {
        self.session
            .bounded("renewing the leases", async {
                let client = self.session.client().await?;
                self.renew_on(&client).await
            })
            .await
    }

    async fn release(&self, subtask: u32) -> Result<()> {
        self.session
            .bounded("releasing a lease", self.release_now(subtask))
            .await
    }

    async fn leave(&self) -> Result<()> {
        self.session
            .bounded("leaving the job", self.leave_now())
            .await
    }

    fn mode(&self) -> String {
        "leases".into()
    }
}

impl PgLeases {
    async fn release_now(&self, subtask: u32) -> Result<()> {
        let client = self.session.client().await?;
        client
            .execute(
                "DELETE FROM ratchet_subtask_leases WHERE job = $1 AND subtask = $2 AND member = $3",
                &[&self.job, &(subtask as i32), &self.member],
            )
            .await
            .with_context(|| format!("cannot release the lease of subtask {subtask}"))?;
        Ok(())
    }

    async fn leave_now(&self) -> Result<()> {
        let client = self.session.client().await?;
        client
            .batch_execute("BEGIN")
            .await
            .context("cannot leave the job")?;
        for table in ["ratchet_subtask_leases", "ratchet_worker_members"] {
            client
                .execute(
                    &format!("DELETE FROM {table} WHERE job = $1 AND member = $2"),
                    &[&self.job, &self.member],
                )
                .await
                .context("cannot leave the job")?;
        }
        client
            .batch_execute("COMMIT")
            .await
            .context("cannot leave the job")?;
        Ok(())
    }
}
