//! What a job keeps in its checkpoint store besides the checkpoint records: its identity and subtask count, its
//! layout generations and their history, its partition layout, the rescale's lock and switch, and each subtask's
//! checkpoint store. The store kind is decided once, in [`open`]: every command then works through one
//! [`JobStore`], with a local ([`local::LocalJobStore`]) and a PostgreSQL ([`postgres::PgJobStore`])
//! implementation side by side.
//!
//! | what | local store (`<path>/<job>/`) | PostgreSQL store |
//! |---|---|---|
//! | subtask count, identity | `subtasks`, `identity` | `ratchet_jobs` (`subtasks`, `identity`) |
//! | layout generation, history | `layout.json` (after the first rescale) | `ratchet_jobs.generation`, `ratchet_job_layouts` |
//! | partition layout | `partition_layout` | `ratchet_jobs.partition_layout` |
//! | checkpoint records, claims | `<job>[@g]/subtask-<n>/` | `ratchet_checkpoint_records`, `ratchet_checkpoint_owners` under `<job>[@g]` |
//! | rescale lock | the job's lock file (`worker.lock`) | a session advisory lock |
//!
//! The membership tables (`ratchet_worker_members`, `ratchet_subtask_leases`, `ratchet_job_processes`) are
//! [`crate::membership`]'s.

pub mod layout;
pub mod local;
pub mod postgres;
pub mod store_calls;
pub mod subtask_store;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use async_trait::async_trait;
use checkpoint_postgres::PgStoreLimits;
use connector_api::{CheckpointStore, JobId, OwnerEpoch, SubtaskId};
use serde::{Deserialize, Serialize};

use crate::config::StoreConfig;
use layout::PartitionLayout;

/// How long reading the generation may take (the check every claim makes, `inspect`'s history).
const READ_WITHIN: Duration = Duration::from_secs(15);

/// Records kept per subtask: the newest and a few before it, to fall back on if the newest is damaged.
const RETAIN: usize = 5;

/// The job store of `job` in the store `config` names: the one place the store kind is decided.
pub fn open(config: &StoreConfig, job: &str) -> Arc<dyn JobStore> {
    match config {
        StoreConfig::Local { path } => Arc::new(local::LocalJobStore::new(path, job)),
        StoreConfig::Postgres { url } => Arc::new(postgres::PgJobStore::new(url, job)),
    }
}

/// A job's state in its checkpoint store, of either kind. Every call is bounded (a PostgreSQL outage is retried
/// for about 30 s, then named; see [`store_calls`]).
#[async_trait]
pub trait JobStore: Send + Sync {
    /// The job's name.
    fn job(&self) -> &str;

    /// What the store records about the job (`None`: a fresh job, nothing recorded), recording a fresh job with
    /// `subtasks` (as job-scoped) when `write` is on; a job from before these were recorded keeps the subtask
    /// count its checkpoints show and is sink-scoped. The count is not checked against anything
    /// (`identity`, on `dyn JobStore`, does). With `write` off (for `check-config`) nothing is written, not even a
    /// table. Take the job's exclusive hold (or the local lock) first: two fresh starts with different counts must
    /// not both record theirs.
    ///
    /// # Errors
    /// The store cannot be read or written.
    async fn record(&self, subtasks: u32, write: bool) -> Result<Option<JobRecord>>;

    /// The job's layout generation now (0 for a job never rescaled).
    ///
    /// # Errors
    /// The store cannot be read.
    async fn generation(&self) -> Result<u64>;

    /// Every change of the job's layout, oldest first (none for a job never rescaled).
    ///
    /// # Errors
    /// The store cannot be read.
    async fn history(&self) -> Result<Vec<LayoutChange>>;

    /// The partition layout the job recorded, recording `layout` (with `write`) when there is none: for a job
    /// that never claimed a subtask, `layout`; for one that ran before layouts were recorded,
    /// [`OneTopic`](PartitionLayout::OneTopic) (the only one there was). Checked by [`layout::check`].
    ///
    /// # Errors
    /// The store cannot be read or written.
    async fn partition_layout(
        &self,
        layout: PartitionLayout,
        write: bool,
    ) -> Result<Option<PartitionLayout>>;

    /// Waits (at most `patience`) until no other process rescales the job, and holds that until the returned
    /// value is dropped (PostgreSQL: a session advisory lock, released with its connection, also when the process
    /// dies; the local store's job lock already admits one process).
    ///
    /// # Errors
    /// Another rescale held it for longer than `patience` (named), or the store cannot be reached.
    async fn lock_rescale(&self, patience: Duration) -> Result<RescaleLock>;

    /// The rescale's commit point: the job's count and generation change from `from` in `generation` to `to` in
    /// `generation + 1`, with a history entry, in one atomic write, only while every old subtask's claim is still
    /// the one in `owners` (the local store's lock keeps every other process out, so none can have moved).
    ///
    /// # Errors
    /// A claim moved or another rescale changed the record first (the old layout stays), or the store cannot be
    /// written; a switch whose outcome is unknown says so (`ratchet rescale` again finishes either way).
    async fn switch(
        &self,
        generation: u64,
        from: u32,
        to: u32,
        owners: &BTreeMap<u32, OwnerEpoch>,
    ) -> Result<()>;

    /// Deletes every checkpoint record and claim of layout `generation`. Idempotent.
    ///
    /// # Errors
    /// The store cannot be written.
    async fn purge(&self, generation: u64) -> Result<()>;

    /// The checkpoint store of `subtask` in layout `generation`, created when `create` (a directory, the tables);
    /// `None` without `create` when the subtask never ran there. A PostgreSQL store's calls are bounded by
    /// `limits`.
    ///
    /// # Errors
    /// A directory that cannot be created, or a database that cannot be reached (named).
    async fn checkpoints(
        &self,
        generation: u64,
        subtask: SubtaskId,
        limits: PgStoreLimits,
        create: bool,
    ) -> connector_api::Result<Option<Box<dyn CheckpointStore>>>;
}

impl dyn JobStore {
    /// What the store records about the job, checked against the job file's `subtasks`: the count must be the
    /// one recorded. A fresh job is recorded (with `write`) as job-scoped with `subtasks`.
    ///
    /// # Errors
    /// The count differs (named, with what to do), or the store cannot be read.
    pub async fn identity(&self, subtasks: u32, write: bool) -> Result<JobRecord> {
        let job = self.job();
        match self.record(subtasks, write).await? {
            Some(recorded) if recorded.subtasks != subtasks => bail!(
                "job {job:?} has {} subtasks in its checkpoint store, the job file says {subtasks}: run `ratchet \
                 rescale --config <job file> --to {subtasks}` (or `ratchet run` with every other process of the \
                 job stopped, which rescales first), or keep subtasks = {}",
                recorded.subtasks,
                recorded.subtasks
            ),
            Some(recorded) => Ok(recorded),
            None => Ok(JobRecord {
                subtasks,
                identity: Identity::Job,
                generation: 0,
            }),
        }
    }

    /// The layout generation, for the check every claim makes ([`subtask_store::SubtaskStore`]), within
    /// [`READ_WITHIN`].
    ///
    /// # Errors
    /// [`Retryable`](connector_api::ErrorKind::Retryable) when the store cannot be read within its bound.
    pub async fn generation_within_bound(&self) -> connector_api::Result<u64> {
        let unreadable = |why: String| {
            connector_api::Error::new(
                connector_api::ErrorKind::Retryable,
                connector_api::Phase::Recover,
                format!("cannot read the job's layout generation to check the claim: {why}"),
            )
        };
        match tokio::time::timeout(READ_WITHIN, self.generation()).await {
            Ok(Ok(generation)) => Ok(generation),
            Ok(Err(e)) => Err(unreadable(format!("{e:#}"))),
            Err(_) => Err(unreadable(format!("no answer within {READ_WITHIN:?}"))),
        }
    }

    /// Deletes the records and claims of every layout generation before `current` (what a rescale left behind if
    /// it stopped after its switch). Idempotent.
    ///
    /// # Errors
    /// The store cannot be written.
    pub async fn retire_old_generations(&self, current: u64) -> Result<()> {
        for generation in 0..current {
            self.purge(generation).await?;
        }
        Ok(())
    }

    /// Deletes what a rescale killed before its switch (step 4 of [`crate::job::rescale`]) wrote of the next
    /// layout generation: records and claims no layout will use (the next rescale would discard them first too).
    /// Taken under the rescale lock (waiting at most `patience`) with the generation read under it, so a rescale
    /// under way is never cut short: it holds that lock from its discard to its switch. Idempotent.
    ///
    /// # Errors
    /// Another rescale held the lock for longer than `patience` (named), or the store cannot be read or written.
    pub async fn discard_unswitched_generation(&self, patience: Duration) -> Result<()> {
        let _serialized = self.lock_rescale(patience).await?;
        let current = self.generation_within_bound().await?;
        self.purge(current + 1).await
    }
}

/// The name a job's checkpoint records and claims are kept under in layout generation `generation`: the job's
/// name for the first layout, `<job>@<generation>` after each change of its subtask count.
pub fn store_key(job: &str, generation: u64) -> String {
    match generation {
        0 => job.to_string(),
        g => format!("{job}@{g}"),
    }
}

/// Held while this process rescales a job ([`JobStore::lock_rescale`]); dropping it lets the next one in.
pub struct RescaleLock {
    _held: Option<Box<dyn Send + Sync>>,
}

impl RescaleLock {
    /// Holds `held` (a session whose lock ends with it), or nothing.
    fn holding(held: Option<Box<dyn Send + Sync>>) -> Self {
        Self { _held: held }
    }
}

/// One change of a job's layout, as `ratchet inspect` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutChange {
    /// The generation it started.
    pub generation: u64,
    /// The subtask count before.
    pub previous: u32,
    /// The subtask count after.
    pub subtasks: u32,
    /// When (RFC 3339, UTC).
    pub at: String,
}

impl LayoutChange {
    /// The change from `from` subtasks in `generation` to `to`, now.
    fn now(generation: u64, from: u32, to: u32) -> Self {
        Self {
            generation: generation + 1,
            previous: from,
            subtasks: to,
            at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        }
    }
}

/// How a job's sinks name what they own in their external systems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// By the job's name and the sink id (`<job>~<sink>`, the Iceberg ledger's job key): two jobs never touch each
    /// other's state, whatever their sinks' ids. Every job first run by a release with job scoping.
    Job,
    /// By the sink id alone, as releases before job scoping named it: kept for jobs whose store holds checkpoints
    /// from before, so their tables, transactional ids, prepared transactions and files stay theirs.
    Sink,
}

impl Identity {
    fn as_str(self) -> &'static str {
        match self {
            Self::Job => "job",
            Self::Sink => "sink",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "job" => Some(Self::Job),
            "sink" => Some(Self::Sink),
            _ => None,
        }
    }

    /// The job id every sink of `name` is built with ([`connector_api::SinkContext::job`]).
    ///
    /// # Errors
    /// A job-scoped job whose name cannot be embedded in the sinks' names.
    pub fn job_id(self, name: &str) -> anyhow::Result<Option<JobId>> {
        match self {
            Self::Sink => Ok(None),
            Self::Job => JobId::new(name).map(Some).map_err(|e| {
                anyhow::anyhow!(
                    "[job] name {name:?} cannot scope what the sinks own (it names their transactional ids, \
                     files and table entries): use letters, digits, '-' and '_' only, at most 64 ({})",
                    connector_api::Report(&e)
                )
            }),
        }
    }
}

/// What the store records about a job as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobRecord {
    /// Its subtask count.
    pub subtasks: u32,
    /// How its sinks name what they own.
    pub identity: Identity,
    /// Its layout generation: 0 until its subtask count first changes, then one more at each change
    /// ([`crate::job::rescale`]).
    pub generation: u64,
}

impl JobRecord {
    /// What a store found: a subtask count and identity (`None`: a fresh job), in layout `generation`.
    fn found(found: Option<(u32, Identity)>, generation: u64) -> Option<Self> {
        found.map(|(subtasks, identity)| Self {
            subtasks,
            identity,
            generation,
        })
    }

    /// The count and identity to record for a job found as `found`: as found, or a fresh job-scoped one of
    /// `subtasks`.
    fn to_record(found: Option<Self>, subtasks: u32) -> (u32, Identity) {
        found.map_or((subtasks, Identity::Job), |f| (f.subtasks, f.identity))
    }

    /// The job id every sink of `name` is built with ([`Identity::job_id`]).
    ///
    /// # Errors
    /// As [`Identity::job_id`].
    pub fn job_id(&self, name: &str) -> anyhow::Result<Option<JobId>> {
        self.identity.job_id(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_name_that_cannot_scope_sinks_is_refused_only_for_job_scoped_jobs() {
        assert!(Identity::Sink.job_id("orders.eu").unwrap().is_none());
        let err = Identity::Job.job_id("orders.eu").unwrap_err().to_string();
        assert!(
            err.contains("orders.eu") && err.contains("letters, digits"),
            "{err}"
        );
        assert_eq!(
            Identity::Job.job_id("orders-eu").unwrap().unwrap().as_str(),
            "orders-eu"
        );
    }
}
