//! The checkpoint store of one subtask, as the job file's `[store]` says: a directory per subtask, or the
//! subtask's rows in the shared PostgreSQL tables.

use async_trait::async_trait;
use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, Claim, Loaded, LocalCheckpointStore,
    OwnerEpoch, PgCheckpointStore, Result, SubtaskId,
};

use crate::config::StoreConfig;

/// Records kept per subtask: the newest and a few before it, to fall back on if the newest is damaged.
const RETAIN: usize = 5;

/// One subtask's checkpoint store, of either kind.
pub enum SubtaskStore {
    /// `<path>/subtask-<n>`.
    Local(LocalCheckpointStore),
    /// The `(job, subtask)` rows of the shared tables.
    Postgres(Box<PgCheckpointStore>),
}

impl SubtaskStore {
    /// Opens the store of `subtask` of `job`.
    ///
    /// # Errors
    /// A directory that cannot be created, or a database that cannot be reached (named).
    pub async fn open(config: &StoreConfig, job: &str, subtask: SubtaskId) -> Result<Self> {
        Ok(match config {
            StoreConfig::Local { path } => Self::Local(LocalCheckpointStore::open(
                path.join(job).join(format!("subtask-{}", subtask.0)),
                RETAIN,
            )?),
            StoreConfig::Postgres { url } => Self::Postgres(Box::new(
                PgCheckpointStore::connect(url, job, subtask, RETAIN).await?,
            )),
        })
    }

    fn inner(&self) -> &dyn CheckpointStore {
        match self {
            Self::Local(store) => store,
            Self::Postgres(store) => store.as_ref(),
        }
    }
}

#[async_trait]
impl CheckpointStore for SubtaskStore {
    async fn claim(&self) -> Result<Claim> {
        self.inner().claim().await
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
}

/// Serializes creation of the job table between processes starting at once.
const CREATE_LOCK: i64 = 0x0072_6174_6a6f_6273; // "ratjobs"

/// Refuses to run `job` with `subtasks` subtasks when its store shows another count: a partition would move to a
/// subtask whose checkpoint records do not hold its position, and be read again from the beginning (duplicates),
/// and the vanished subtasks' pending transactions would never be recovered. A fresh job records its count.
///
/// # Errors
/// The count differs (named, with what to do), or the store cannot be read.
///
/// With `record` off (for `check-config`) nothing is written. Take the job's local lock first: two fresh starts
/// with different counts must not both record theirs.
pub async fn check_subtask_count(
    config: &StoreConfig,
    job: &str,
    subtasks: u32,
    record: bool,
) -> anyhow::Result<()> {
    let recorded = match config {
        StoreConfig::Local { path } => local_subtask_count(&path.join(job), subtasks, record)?,
        StoreConfig::Postgres { url } => pg_subtask_count(url, job, subtasks, record).await?,
    };
    match recorded {
        Some(recorded) if recorded != subtasks => anyhow::bail!(
            "job {job:?} has {recorded} subtasks in its checkpoint store, the job file says {subtasks}: changing a \
             job's subtask count is not supported yet (partitions would move to subtasks that do not hold their \
             positions and be read again). Keep subtasks = {recorded}, or give the job a new name to start over"
        ),
        _ => Ok(()),
    }
}

/// The count recorded in `<dir>/subtasks`, or inferred from the `subtask-<n>` directories of a job that ran before
/// the count was recorded; records `subtasks` for a fresh job.
fn local_subtask_count(
    dir: &std::path::Path,
    subtasks: u32,
    record: bool,
) -> anyhow::Result<Option<u32>> {
    use anyhow::Context;
    let file = dir.join("subtasks");
    if let Some(n) = connector_api::local_fs::read_number(&file)
        .with_context(|| format!("cannot read {}", file.display()))?
    {
        return Ok(Some(u32::try_from(n)?));
    }
    let highest = std::fs::read_dir(dir)
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
        .max();
    // A job from before the count was recorded: its subtask directories say how many it had.
    if let Some(highest) = highest {
        return Ok(Some(highest + 1));
    }
    if !record {
        return Ok(None);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    connector_api::local_fs::replace_file(dir, &file, subtasks.to_string().as_bytes())
        .with_context(|| format!("cannot write {}", file.display()))?;
    Ok(None)
}

/// The same in PostgreSQL: `ratchet_jobs`, or the highest subtask in `ratchet_checkpoint_owners`.
async fn pg_subtask_count(
    url: &str,
    job: &str,
    subtasks: u32,
    record: bool,
) -> anyhow::Result<Option<u32>> {
    use anyhow::Context;
    let client = connector_api::postgres::PgConnectOptions::parse(url)
        .map_err(|e| anyhow::anyhow!("[store] url: {}", connector_api::Report(&e)))?
        .connect(connector_api::Phase::Setup, "the checkpoint store")
        .await
        .map_err(|e| anyhow::anyhow!("{}", connector_api::Report(&e)))?;
    client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({CREATE_LOCK});
             CREATE TABLE IF NOT EXISTS ratchet_jobs (
                 job text PRIMARY KEY, subtasks integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
             COMMIT;"
        ))
        .await
        .context("cannot create ratchet_jobs in the checkpoint store")?;
    if let Some(row) = client
        .query_opt("SELECT subtasks FROM ratchet_jobs WHERE job = $1", &[&job])
        .await
        .context("cannot read ratchet_jobs")?
    {
        return Ok(Some(row.get::<_, i32>(0) as u32));
    }
    // A job from before the count was recorded: its claim rows say how many subtasks it had.
    let highest: Option<i32> = client
        .query_one(
            "SELECT CASE WHEN to_regclass('ratchet_checkpoint_owners') IS NULL THEN NULL
                    ELSE (SELECT max(subtask) FROM ratchet_checkpoint_owners WHERE job = $1) END",
            &[&job],
        )
        .await
        .context("cannot read the job's claim rows")?
        .get(0);
    if let Some(highest) = highest {
        return Ok(Some(highest as u32 + 1));
    }
    if !record {
        return Ok(None);
    }
    client
        .execute(
            "INSERT INTO ratchet_jobs (job, subtasks) VALUES ($1, $2) ON CONFLICT (job) DO NOTHING",
            &[&job, &(subtasks as i32)],
        )
        .await
        .context("cannot record the job's subtask count")?;
    let row = client
        .query_one("SELECT subtasks FROM ratchet_jobs WHERE job = $1", &[&job])
        .await
        .context("cannot read ratchet_jobs")?;
    Ok(Some(row.get::<_, i32>(0) as u32))
}
