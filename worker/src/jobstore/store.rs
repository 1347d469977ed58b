//! The checkpoint store of one subtask, as the job file's `[store]` says: a directory per subtask, or the
//! subtask's rows in the shared PostgreSQL tables.

use async_trait::async_trait;
use checkpoint_postgres::{PgCheckpointStore, PgStoreLimits};
use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, Claim, JobId, Loaded, LocalCheckpointStore,
    OwnerEpoch, Result, SubtaskId,
};

use crate::config::StoreConfig;

/// Records kept per subtask: the newest and a few before it, to fall back on if the newest is damaged.
const RETAIN: usize = 5;

/// One subtask's checkpoint store, of either kind, in one layout generation of its job
/// ([`crate::cmd::rescale`]): every claim is checked against the generation the job's record holds, so a process that
/// still runs an older layout (a subtask count the job was rescaled from) cannot claim a subtask and run on from
/// positions that were redistributed.
pub struct SubtaskStore {
    inner: StoreKind,
    /// The job, its generation, and the store: what a claim is checked against.
    job: String,
    generation: u64,
    config: StoreConfig,
    /// Whether claims are checked against the job's generation (not while a rescale writes the next one).
    checked: bool,
}

enum StoreKind {
    /// `<path>/<job key>/subtask-<n>`.
    Local(LocalCheckpointStore),
    /// The `(job key, subtask)` rows of the shared tables.
    Postgres(Box<PgCheckpointStore>),
}

/// The name a job's checkpoint records and claims are kept under in layout generation `generation`: the job's
/// name for the first layout, `<job>@<generation>` after each change of its subtask count.
pub fn store_key(job: &str, generation: u64) -> String {
    match generation {
        0 => job.to_string(),
        g => format!("{job}@{g}"),
    }
}

/// The directory of `subtask` of `job` in layout generation `generation` of a local store under `path`.
pub fn local_subtask_dir(
    path: &std::path::Path,
    job: &str,
    generation: u64,
    subtask: SubtaskId,
) -> std::path::PathBuf {
    path.join(store_key(job, generation))
        .join(format!("subtask-{}", subtask.0))
}

impl SubtaskStore {
    /// Opens the store of `subtask` of `job` in layout `generation`; a PostgreSQL store's calls are bounded by
    /// `limits`.
    ///
    /// # Errors
    /// A directory that cannot be created, or a database that cannot be reached (named).
    pub async fn open(
        config: &StoreConfig,
        job: &str,
        generation: u64,
        subtask: SubtaskId,
        limits: PgStoreLimits,
    ) -> Result<Self> {
        let inner = match config {
            StoreConfig::Local { path } => StoreKind::Local(LocalCheckpointStore::open(
                local_subtask_dir(path, job, generation, subtask),
                RETAIN,
            )?),
            StoreConfig::Postgres { url } => StoreKind::Postgres(Box::new(
                PgCheckpointStore::connect(
                    url,
                    &store_key(job, generation),
                    subtask,
                    RETAIN,
                    limits,
                )
                .await?,
            )),
        };
        Ok(Self::of(inner, config, job, generation))
    }

    /// Opens the store of `subtask` of `job` in layout `generation` if it exists, creating nothing (no directory,
    /// no table): `None` when the subtask never ran. For `check-config`.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub async fn open_existing(
        config: &StoreConfig,
        job: &str,
        generation: u64,
        subtask: SubtaskId,
        limits: PgStoreLimits,
    ) -> Result<Option<Self>> {
        let inner = match config {
            StoreConfig::Local { path } => LocalCheckpointStore::open_existing(
                local_subtask_dir(path, job, generation, subtask),
                RETAIN,
            )?
            .map(StoreKind::Local),
            StoreConfig::Postgres { url } => PgCheckpointStore::connect_existing(
                url,
                &store_key(job, generation),
                subtask,
                RETAIN,
                limits,
            )
            .await?
            .map(|store| StoreKind::Postgres(Box::new(store))),
        };
        Ok(inner.map(|inner| Self::of(inner, config, job, generation)))
    }

    /// Opens the store of `subtask` in layout `generation` before the job switches to it: for the rescale writing
    /// the new layout's first records, whose claims are not checked against the job's generation (it is still
    /// the one before).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub async fn open_next_generation(
        config: &StoreConfig,
        job: &str,
        generation: u64,
        subtask: SubtaskId,
        limits: PgStoreLimits,
    ) -> Result<Self> {
        let mut store = Self::open(config, job, generation, subtask, limits).await?;
        store.checked = false;
        Ok(store)
    }

    fn of(inner: StoreKind, config: &StoreConfig, job: &str, generation: u64) -> Self {
        Self {
            inner,
            job: job.to_string(),
            generation,
            config: config.clone(),
            checked: true,
        }
    }

    fn inner(&self) -> &dyn CheckpointStore {
        match &self.inner {
            StoreKind::Local(store) => store,
            StoreKind::Postgres(store) => store.as_ref(),
        }
    }
}

#[async_trait]
impl CheckpointStore for SubtaskStore {
    /// Claims the subtask, then checks (under the claim) that the job is still in this store's layout
    /// generation: a rescale that switched the layout first makes this claim a refusal; one that has not switched
    /// yet sees this claim's newer epoch and gives up (see [`crate::cmd::rescale`]).
    async fn claim(&self) -> Result<Claim> {
        let claim = self.inner().claim().await?;
        if !self.checked {
            return Ok(claim);
        }
        let now = crate::jobstore::generations::generation_now(&self.config, &self.job).await?;
        if now != self.generation {
            return Err(connector_api::Error::new(
                connector_api::ErrorKind::Config,
                connector_api::Phase::Recover,
                format!(
                    "job {:?} was rescaled while this process ran (its layout generation is {now}, this process \
                     started in {}): its subtasks and positions were redistributed. Restart this process with the \
                     job file's subtasks as the store records them (`ratchet inspect` shows the layout)",
                    self.job, self.generation
                ),
            ));
        }
        Ok(claim)
    }

    async fn save(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<()> {
        self.inner().save(owner, record).await
    }

    async fn mark_committed(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()> {
        self.inner().mark_committed(owner, checkpoint).await
    }

    async fn load(&self) -> Result<Loaded> {
        self.inner().load().await
    }

    async fn owner(&self) -> Result<Option<OwnerEpoch>> {
        self.inner().owner().await
    }
}

/// Serializes creation of the job table between processes starting at once.
const CREATE_LOCK: i64 = 0x0072_6174_6a6f_6273; // "ratjobs"

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
    /// ([`crate::cmd::rescale`]).
    pub generation: u64,
}

impl JobRecord {
    /// The job id every sink of `name` is built with ([`Identity::job_id`]).
    ///
    /// # Errors
    /// As [`Identity::job_id`].
    pub fn job_id(&self, name: &str) -> anyhow::Result<Option<JobId>> {
        self.identity.job_id(name)
    }
}

/// What the store records about `job` as a whole, checked against the job file: its subtask count must be the
/// one recorded, and its [`Identity`]. A fresh job is recorded (with `record`) as job-scoped with `subtasks`; a job
/// whose store holds checkpoints from before these were recorded keeps its subtask count (inferred from its
/// checkpoint directories or claim rows) and is sink-scoped, as it was when it ran.
///
/// With `record` off (for `check-config`) nothing is written, not even a table. Take the job's local lock first:
/// two fresh starts with different counts must not both record theirs.
///
/// # Errors
/// The count differs (named, with what to do), or the store cannot be read (a database outage is retried for
/// about 30 s first: see [`crate::jobstore::store_calls`]).
pub async fn job_identity(
    config: &StoreConfig,
    job: &str,
    subtasks: u32,
    record: bool,
) -> anyhow::Result<JobRecord> {
    match job_record(config, job, subtasks, record).await? {
        Some(recorded) if recorded.subtasks != subtasks => anyhow::bail!(
            "job {job:?} has {} subtasks in its checkpoint store, the job file says {subtasks}: run `ratchet \
             rescale --config <job file> --to {subtasks}` (or `ratchet run` with every other process of the job \
             stopped, which rescales first), or keep subtasks = {}",
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

/// What the store records about `job` (`None`: a fresh job, nothing recorded), recording a fresh job with
/// `subtasks` when `record` is on; the count is not checked against anything.
///
/// # Errors
/// The store cannot be read or written (a database outage is retried for about 30 s first).
pub async fn job_record(
    config: &StoreConfig,
    job: &str,
    subtasks: u32,
    record: bool,
) -> anyhow::Result<Option<JobRecord>> {
    match config {
        StoreConfig::Local { path } => local_job(&path.join(job), subtasks, record),
        StoreConfig::Postgres { url } => {
            crate::jobstore::store_calls::retried(
                "recording the job in the checkpoint store",
                || pg_job(url, job, subtasks, record),
            )
            .await
        }
    }
}

/// The local store's record of a job: `<dir>/subtasks` and `<dir>/identity`, or for a job from before they were
/// recorded, its `subtask-<n>` directories (and the sink-id identity). Records a fresh job's.
fn local_job(
    dir: &std::path::Path,
    subtasks: u32,
    record: bool,
) -> anyhow::Result<Option<JobRecord>> {
    use anyhow::Context;
    // After a rescale, the layout file holds the count and generation (written in one atomic replace).
    let layout = crate::jobstore::generations::local_layout(dir)?;
    let count_file = dir.join("subtasks");
    let identity_file = dir.join("identity");
    let counted = connector_common::fs::read_number(&count_file)
        .with_context(|| format!("cannot read {}", count_file.display()))?;
    let identity = match std::fs::read_to_string(&identity_file) {
        Ok(text) => Some(Identity::parse(&text).with_context(|| {
            format!(
                "{} holds {text:?}, not `job` or `sink`",
                identity_file.display()
            )
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read {}", identity_file.display()));
        }
    };
    // A job from before the count was recorded: its subtask directories say how many it had.
    let inferred = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("subtask-")?
                .parse::<u32>()
                .ok()
        })
        .max()
        .map(|highest| highest + 1);
    let count = match (&layout, counted) {
        (Some(layout), _) => Some(layout.subtasks),
        (None, Some(n)) => Some(u32::try_from(n)?),
        (None, None) => inferred,
    };
    let generation = layout.as_ref().map_or(0, |l| l.generation);
    let found = match (count, identity) {
        (None, _) => None,
        (Some(count), Some(identity)) => Some((count, identity)),
        // Ran before identities were recorded: its sinks are sink-scoped.
        (Some(count), None) => Some((count, Identity::Sink)),
    };
    let found = found.map(|(subtasks, identity)| JobRecord {
        subtasks,
        identity,
        generation,
    });
    if !record {
        return Ok(found);
    }
    let (count, identity) = found.map_or((subtasks, Identity::Job), |f| (f.subtasks, f.identity));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if counted.is_none() {
        connector_common::fs::replace_file(dir, &count_file, count.to_string().as_bytes())
            .with_context(|| format!("cannot write {}", count_file.display()))?;
    }
    if identity_file.metadata().is_err() {
        connector_common::fs::replace_file(dir, &identity_file, identity.as_str().as_bytes())
            .with_context(|| format!("cannot write {}", identity_file.display()))?;
    }
    Ok(found)
}

/// The same in PostgreSQL: `ratchet_jobs` (`subtasks`, `identity`: null for rows from before it was recorded),
/// or for a job from before that table, the highest subtask in `ratchet_checkpoint_owners`.
async fn pg_job(
    url: &str,
    job: &str,
    subtasks: u32,
    record: bool,
) -> anyhow::Result<Option<JobRecord>> {
    use anyhow::Context;
    let client = crate::jobstore::store_calls::store_session(url).await?;
    if record {
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({CREATE_LOCK});
                 CREATE TABLE IF NOT EXISTS ratchet_jobs (
                     job text PRIMARY KEY, subtasks integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
                 ALTER TABLE ratchet_jobs ADD COLUMN IF NOT EXISTS identity text;
                 ALTER TABLE ratchet_jobs ADD COLUMN IF NOT EXISTS generation bigint NOT NULL DEFAULT 0;
                 COMMIT;"
            ))
            .await
            .context("cannot create ratchet_jobs in the checkpoint store")?;
    }
    let tables: (bool, bool, bool) = client
        .query_one(
            "SELECT to_regclass('ratchet_jobs') IS NOT NULL,
                    EXISTS (SELECT 1 FROM information_schema.columns
                            WHERE table_name = 'ratchet_jobs' AND column_name = 'identity'
                              AND table_schema = current_schema()),
                    to_regclass('ratchet_checkpoint_owners') IS NOT NULL",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .context("cannot look for the job tables")?;
    let (has_jobs, has_identity, has_owners) = tables;
    let listed = if has_jobs {
        let query = if has_identity {
            "SELECT subtasks, identity FROM ratchet_jobs WHERE job = $1"
        } else {
            "SELECT subtasks, NULL::text FROM ratchet_jobs WHERE job = $1"
        };
        client
            .query_opt(query, &[&job])
            .await
            .context("cannot read ratchet_jobs")?
            .map(|row| (row.get::<_, i32>(0) as u32, row.get::<_, Option<String>>(1)))
    } else {
        None
    };
    // A job from before the count was recorded: its claim rows say how many subtasks it had.
    let inferred = if listed.is_none() && has_owners {
        client
            .query_one(
                "SELECT max(subtask) FROM ratchet_checkpoint_owners WHERE job = $1",
                &[&job],
            )
            .await
            .context("cannot read the job's claim rows")?
            .get::<_, Option<i32>>(0)
            .map(|highest| highest as u32 + 1)
    } else {
        None
    };
    let generation = if has_jobs && listed.is_some() {
        crate::jobstore::generations::pg_generation(&client, job).await?
    } else {
        0
    };
    let found = match (listed, inferred) {
        (Some((count, Some(identity))), _) => Some((
            count,
            Identity::parse(&identity).with_context(|| {
                format!("ratchet_jobs holds identity {identity:?} for job {job:?}")
            })?,
        )),
        // Recorded or ran before identities were: sink-scoped.
        (Some((count, None)), _) | (None, Some(count)) => Some((count, Identity::Sink)),
        (None, None) => None,
    };
    let found = found.map(|(subtasks, identity)| JobRecord {
        subtasks,
        identity,
        generation,
    });
    if !record {
        return Ok(found);
    }
    let (count, identity) = found.map_or((subtasks, Identity::Job), |f| (f.subtasks, f.identity));
    client
        .execute(
            "INSERT INTO ratchet_jobs (job, subtasks, identity) VALUES ($1, $2, $3)
             ON CONFLICT (job) DO UPDATE SET identity = coalesce(ratchet_jobs.identity, excluded.identity)",
            &[&job, &(count as i32), &identity.as_str()],
        )
        .await
        .context("cannot record the job in ratchet_jobs")?;
    // Another process may have recorded a fresh job first: its row is the truth.
    let row = client
        .query_one(
            "SELECT subtasks, identity FROM ratchet_jobs WHERE job = $1",
            &[&job],
        )
        .await
        .context("cannot read ratchet_jobs")?;
    let identity: String = row.get(1);
    Ok(Some(JobRecord {
        subtasks: row.get::<_, i32>(0) as u32,
        identity: Identity::parse(&identity).context("ratchet_jobs holds an unknown identity")?,
        generation: crate::jobstore::generations::pg_generation(&client, job).await?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_local_job_is_recorded_job_scoped_and_a_read_only_look_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("orders");
        assert_eq!(local_job(&job, 3, false).unwrap(), None);
        assert!(
            !job.exists(),
            "a read-only look created the job's directory"
        );
        assert_eq!(local_job(&job, 3, true).unwrap(), None);
        assert_eq!(
            local_job(&job, 3, false).unwrap(),
            Some(JobRecord {
                subtasks: 3,
                identity: Identity::Job,
                generation: 0
            })
        );
    }

    #[test]
    fn a_local_job_from_before_keeps_its_count_and_its_sink_id_scope() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("orders");
        std::fs::create_dir_all(job.join("subtask-0")).unwrap();
        std::fs::create_dir_all(job.join("subtask-1")).unwrap();
        assert_eq!(
            local_job(&job, 2, false).unwrap(),
            Some(JobRecord {
                subtasks: 2,
                identity: Identity::Sink,
                generation: 0
            })
        );
        assert_eq!(
            local_job(&job, 2, true).unwrap(),
            Some(JobRecord {
                subtasks: 2,
                identity: Identity::Sink,
                generation: 0
            })
        );
        assert_eq!(
            std::fs::read_to_string(job.join("identity")).unwrap(),
            "sink"
        );
        // Recorded from now on, whatever directories come later.
        std::fs::create_dir_all(job.join("subtask-2")).unwrap();
        assert_eq!(
            local_job(&job, 2, false).unwrap(),
            Some(JobRecord {
                subtasks: 2,
                identity: Identity::Sink,
                generation: 0
            })
        );
    }

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
