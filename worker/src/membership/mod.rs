//! Who runs which subtask of a job, in one of four modes side by side, chosen once at start ([`Mode::choose`]):
//!
//! | mode | store | file |
//! |---|---|---|
//! | the local lock: one process runs every subtask | local | [`local`] |
//! | leases in the store's database (the PostgreSQL default) | PostgreSQL | [`leases`] |
//! | static members (`--member i --of M`) | PostgreSQL | [`static_share`] |
//! | Kafka's group protocol (`[job] membership = "kafka-group"`) | PostgreSQL | [`kafka_group`] |
//!
//! Membership decides *liveness* only (who should run a subtask now); *safety* comes from the checkpoint store's
//! claims: a process that starts a subtask claims it (raising the owner epoch, fencing every earlier owner's
//! saves) and recovers it, so two processes that both believe they hold a subtask (a paused one woken up after its
//! lease expired) can never both decide a checkpoint. See docs/architecture.md, "Scale-out".
//!
//! Whatever the mode, every process of a job on the PostgreSQL store keeps a row among the job's live processes
//! ([`presence`]); the operations that change the layout hold the whole job through [`exclusive`], which asks
//! that one question.

pub mod exclusive;
pub mod kafka_group;
pub mod leases;
pub mod local;
pub mod presence;
pub mod static_share;

use std::collections::BTreeSet;

use anyhow::{Result, bail};
use async_trait::async_trait;

use crate::config::{JobConfig, MembershipConfig, StoreConfig};

/// What a process should run now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Assignment {
    /// Subtasks whose lease this process holds (renewed just now).
    pub held: BTreeSet<u32>,
    /// Of those, the ones to hand over now whatever the quota (a Kafka group revoking them): stop each with a
    /// final checkpoint, then [`release`](Membership::release) it.
    pub handing: BTreeSet<u32>,
    /// How many subtasks this process should hold.
    pub quota: usize,
    /// Live processes of the job, this one included.
    pub members: usize,
}

/// Which subtasks this process runs, in one membership mode: the one trait the supervisor (`ratchet run`) asks.
#[async_trait]
pub trait Membership: Send + Sync {
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

/// The membership mode of this process, chosen once from the store, `[job] membership` and `--member`/`--of`,
/// before anything is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The local store's lock ([`local::LocalLease`]) in the store's directory.
    LocalLock(std::path::PathBuf),
    /// Leases in the PostgreSQL store at this URL ([`leases::PgLeases`]).
    Leases(String),
    /// A static member ([`static_share::StaticShare`]).
    Static(static_share::StaticShare),
    /// A member of the job's Kafka group ([`kafka_group::KafkaGroup`]), with its static group member name.
    KafkaGroup {
        /// `--member`: the group's `group.instance.id` suffix, so a restart keeps the assignment.
        member: Option<String>,
    },
}

impl Mode {
    /// The mode `job` runs in with `--member member --of of`.
    ///
    /// # Errors
    /// A combination no mode serves, named with what to pass instead: `--member` without `--of` outside a Kafka
    /// group, `--of` in a Kafka group, a static member or a Kafka group on the local store (the members' claims
    /// must meet in one store), an ordinal that is not one.
    pub fn choose(job: &JobConfig, member: Option<&str>, of: Option<u32>) -> Result<Self> {
        let group = job.job.membership == MembershipConfig::KafkaGroup;
        let local = matches!(job.store, StoreConfig::Local { .. });
        match (member, of, group) {
            (_, Some(_), true) => bail!(
                "--of is static membership, and [job] membership = \"kafka-group\" takes the members from the job's \
                 Kafka group: drop --of (--member then names this process's static group member)"
            ),
            _ if group && local => bail!(
                "[job] membership = \"kafka-group\" needs [store] kind = \"postgres\": the members' claims must meet \
                 in one store"
            ),
            (member, None, true) => Ok(Self::KafkaGroup {
                member: member.map(str::to_string),
            }),
            (Some(_), None, false) => bail!(
                "--member without --of: static membership needs both (--member 2 --of 3); with [job] membership = \
                 \"kafka-group\", --member names the process's static group member"
            ),
            (_, Some(_), false) if local => bail!(
                "static membership (--member, --of) needs [store] kind = \"postgres\": the members' claims must meet \
                 in one store, so that a duplicate member is fenced"
            ),
            (Some(member), Some(of), false) => Ok(Self::Static(static_share::StaticShare::new(
                member,
                of,
                job.job.subtasks,
            )?)),
            (None, Some(_), false) => {
                bail!("--of without --member: static membership needs both (--member 2 --of 3)")
            }
            (None, None, false) => Ok(match &job.store {
                StoreConfig::Local { path } => Self::LocalLock(path.clone()),
                StoreConfig::Postgres { url } => Self::Leases(url.clone()),
            }),
        }
    }

    /// Joins the job in this mode: takes the local lock, joins the lease tables or the Kafka group (on the
    /// coordination topic of layout `generation`).
    ///
    /// # Errors
    /// Another process holds the local lock; the store or Kafka cannot be reached (after retries).
    pub async fn join(
        &self,
        job: &JobConfig,
        kafka: &kafka_source::KafkaConnection,
        generation: u64,
    ) -> Result<Box<dyn Membership>> {
        Ok(match self {
            Self::LocalLock(path) => Box::new(local::LocalLease::take(
                path,
                &job.job.name,
                job.job.subtasks,
            )?),
            Self::Static(share) => {
                tracing::info!(member = share.index, of = share.of, subtasks = ?share.subtasks(),
                    "static membership: running this member's subtasks");
                Box::new(*share)
            }
            Self::KafkaGroup { member } => Box::new(
                kafka_group::KafkaGroup::join(kafka, job, member.as_deref(), generation).await?,
            ),
            Self::Leases(url) => {
                tracing::info!(
                    "membership by leases (deprecated for new deployments: a rolling restart moves subtasks; use \
                     --member/--of or [job] membership = \"kafka-group\", docs/worker.md \"Scale-out\")"
                );
                let member = member_id();
                Box::new(
                    crate::jobstore::store_calls::retried("joining the job's leases", || {
                        leases::PgLeases::join(
                            url,
                            &job.job.name,
                            member.clone(),
                            job.job.subtasks,
                            job.job.lease,
                        )
                    })
                    .await?,
                )
            }
        })
    }

    /// The static share, when this process is a static member.
    pub fn share(&self) -> Option<&static_share::StaticShare> {
        match self {
            Self::Static(share) => Some(share),
            _ => None,
        }
    }
}

/// This process's name among the job's members: host, process id and start time, unique per start.
pub fn member_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{host}-{}-{nanos}", std::process::id())
}
