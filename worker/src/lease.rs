//! Which process runs which subtask: leases in the checkpoint store's database.
//!
//! Leases decide *liveness* only (who should run a subtask now); *safety* comes from the checkpoint store's claims:
//! a process that starts a subtask claims it (raising the owner epoch, fencing every earlier owner's saves) and
//! recovers it, so two processes that both believe they hold a subtask (a paused one woken up after its lease
//! expired) can never both decide a checkpoint. See docs/architecture.md, "Scale-out".
//!
//! PostgreSQL ([`PgLeases`]): every process is a row in `ratchet_worker_members` and holds its subtasks as rows in
//! `ratchet_subtask_leases`, each with an expiry in the database's clock (no clock skew between machines). Every
//! `lease / 5` a process renews its rows, and computes its quota from the live members ordered by id (N subtasks
//! over M members: the first `N % M` get `N / M + 1`, the others `N / M`); it hands over subtasks above its quota
//! (stopping them gracefully first, then deleting the lease) and takes free or expired ones up to it. A killed or
//! paused process stops renewing: its leases expire after `lease`, and the others take its subtasks at their next
//! renewal, so a subtask is picked up again within `lease + lease / 5` plus its recovery.
//!
//! Local directory ([`LocalLease`]): one process runs every subtask, holding an exclusive lock on
//! `<path>/<job>/worker.lock`; a second process is refused at start.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;

use crate::store_calls::BoundedSession;

/// What a process should run now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Assignment {
    /// Subtasks whose lease this process holds (renewed just now).
    pub held: BTreeSet<u32>,
    /// Of those, the ones to hand over now whatever the quota (a Kafka group revoking them): stop each with a
    /// final checkpoint, then [`release`](Leases::release) it.
    pub handing: BTreeSet<u32>,
    /// How many subtasks this process should hold.
    pub quota: usize,
    /// Live processes of the job, this one included.
    pub members: usize,
}

/// A process's view of the job's subtask leases.
#[async_trait]
pub trait Leases: Send + Sync {
    /// Renews this process's membership and leases, takes free subtasks up to its quota, and returns what it
    /// holds. Subtasks above the quota are still held: the caller stops them, then [`release`](Self::release)s.
    ///
    /// # Errors
    /// The database cannot be reached: the caller keeps running what it runs and tries again (its leases expire
    /// if this lasts, and the store's claims fence it when another process takes over).
    async fn renew(&self) -> Result<Assignment>;

    /// Gives up `subtask` (after stopping it).
    async fn release(&self, subtask: u32) -> Result<()>;

    /// Leaves the job: deletes this process's membership and leases so the others take over at once.
    async fn leave(&self) -> Result<()>;

    /// The membership mode, as logs, `/health` and the job's live processes name it.
    fn mode(&self) -> String;
}

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
            .bounded("creating the lease tables", async {
                leases
                    .session
                    .client()
                    .await?
                    .batch_execute(&format!(
                        "BEGIN; SELECT pg_advisory_xact_lock({CREATE_LOCK}); {CREATE_TABLES} COMMIT;"
                    ))
                    .await
                    .context("cannot create the lease tables in the checkpoint store's database")
            })
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

impl PgLeases {}

#[async_trait]
impl Leases for PgLeases {
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

/// The local store's single process: holds every subtask while it holds `<dir>/worker.lock`.
pub struct LocalLease {
    _lock: File,
    subtasks: u32,
}

impl LocalLease {
    /// Takes the job's lock in `dir`.
    ///
    /// # Errors
    /// Another process runs the job on this directory.
    pub fn take(dir: &Path, job: &str, subtasks: u32) -> Result<Self> {
        let dir = dir.join(job);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
        let path = dir.join("worker.lock");
        let lock = connector_common::fs::lock_exclusive(&path, Duration::ZERO).with_context(
            || {
                format!(
                    "another ratchet process runs job {job:?} on the local store {} (it holds {}): the local \
                     store serves one process; stop the other one, or use [store] kind = \"postgres\" to run \
                     several processes",
                    dir.display(),
                    path.display()
                )
            },
        )?;
        Ok(Self {
            _lock: lock,
            subtasks,
        })
    }
}

#[async_trait]
impl Leases for LocalLease {
    async fn renew(&self) -> Result<Assignment> {
        Ok(Assignment {
            handing: BTreeSet::new(),
            held: (0..self.subtasks).collect(),
            quota: self.subtasks as usize,
            members: 1,
        })
    }

    async fn release(&self, _subtask: u32) -> Result<()> {
        Ok(())
    }

    async fn leave(&self) -> Result<()> {
        Ok(())
    }

    fn mode(&self) -> String {
        "local lock".into()
    }
}
