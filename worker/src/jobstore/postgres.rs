//! The PostgreSQL store's job state ([`PgJobStore`]), in the store's database beside the checkpoint tables
//! (`ratchet_checkpoint_records`, `ratchet_checkpoint_owners`, created by `checkpoint-postgres`): the job's row in
//! `ratchet_jobs` (subtask count, identity, generation, partition layout) and its layout history in
//! `ratchet_job_layouts`. Every call opens a bounded session ([`store_session`]); the job record and the layout
//! are retried through an outage ([`retried`]).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use checkpoint_postgres::{PgCheckpointStore, PgStoreLimits};
use connector_api::{CheckpointStore, OwnerEpoch, SubtaskId};

use super::layout::PartitionLayout;
use super::store_calls::{retried, store_session};
use super::{
    Identity, JobRecord, JobStore, LayoutChange, READ_WITHIN, RETAIN, RescaleLock, store_key,
};

/// How long one statement of the switch or a purge may take.
const STATEMENT_WITHIN: Duration = Duration::from_secs(15);

/// Serializes creation of the job table between processes starting at once.
const CREATE_LOCK: i64 = 0x0072_6174_6a6f_6273; // "ratjobs"

/// The job state of one job in a PostgreSQL store.
pub struct PgJobStore {
    url: String,
    job: String,
}

impl PgJobStore {
    /// Job `job` in the store at `url`. Connects at each call.
    pub fn new(url: &str, job: &str) -> Self {
        Self {
            url: url.to_string(),
            job: job.to_string(),
        }
    }
}

#[async_trait]
impl JobStore for PgJobStore {
    fn job(&self) -> &str {
        &self.job
    }

    async fn record(&self, subtasks: u32, write: bool) -> Result<Option<JobRecord>> {
        retried("recording the job in the checkpoint store", || {
            pg_job(&self.url, &self.job, subtasks, write)
        })
        .await
    }

    async fn generation(&self) -> Result<u64> {
        let client = store_session(&self.url).await?;
        pg_generation(&client, &self.job).await
    }

    async fn history(&self) -> Result<Vec<LayoutChange>> {
        tokio::time::timeout(READ_WITHIN, pg_history(&self.url, &self.job))
            .await
            .map_err(|_| {
                anyhow::anyhow!("reading the layout history got no answer within {READ_WITHIN:?}")
            })?
    }

    async fn partition_layout(
        &self,
        layout: PartitionLayout,
        write: bool,
    ) -> Result<Option<PartitionLayout>> {
        retried("recording the job's partition layout", || {
            pg_partition_layout(&self.url, &self.job, layout, write)
        })
        .await
    }

    async fn lock_rescale(&self, patience: Duration) -> Result<RescaleLock> {
        let client = store_session(&self.url).await?;
        client
            .batch_execute(&format!("SET lock_timeout = {}", patience.as_millis()))
            .await
            .context("cannot set lock_timeout")?;
        let key = format!("ratchet-rescale:{}", self.job);
        match client
            .execute("SELECT pg_advisory_lock(hashtext($1))", &[&key])
            .await
        {
            Ok(_) => Ok(RescaleLock::holding(Some(Box::new(client)))),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                bail!(
                    "another process has been rescaling job {:?} for more than {patience:?}: stop it, or wait for it",
                    self.job
                )
            }
            Err(e) => Err(e).context("cannot take the job's rescale lock"),
        }
    }

    async fn switch(
        &self,
        generation: u64,
        from: u32,
        to: u32,
        owners: &BTreeMap<u32, OwnerEpoch>,
    ) -> Result<()> {
        let job = self.job.as_str();

        let mut client = store_session(&self.url).await?;
        let switched = async {
            client
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS ratchet_job_layouts (
                     job text NOT NULL, generation bigint NOT NULL, previous integer NOT NULL,
                     subtasks integer NOT NULL, changed_at timestamptz NOT NULL DEFAULT now(),
                     PRIMARY KEY (job, generation));",
                )
                .await?;
            let tx = client.transaction().await?;
            let key = store_key(job, generation);
            let rows = tx
            .query(
                "SELECT subtask, epoch FROM ratchet_checkpoint_owners WHERE job = $1 FOR UPDATE",
                &[&key],
            )
            .await?;
            let now: BTreeMap<u32, u64> = rows
                .iter()
                .map(|row| (row.get::<_, i32>(0) as u32, row.get::<_, i64>(1) as u64))
                .collect();
            if let Some((subtask, _)) = owners
                .iter()
                .find(|(subtask, epoch)| now.get(subtask) != Some(&epoch.0))
            {
                bail!(
                    "another process claimed subtask {subtask} of job {job:?} while it was being rescaled: the \
                 old layout of {from} subtasks stays. Stop every process of the job and rescale again"
                );
            }
            let updated = tx
                .execute(
                    "UPDATE ratchet_jobs SET subtasks = $2, generation = $3
                 WHERE job = $1 AND subtasks = $4 AND generation = $5",
                    &[
                        &job,
                        &(to as i32),
                        &((generation + 1) as i64),
                        &(from as i32),
                        &(generation as i64),
                    ],
                )
                .await?;
            if updated != 1 {
                bail!(
                    "job {job:?} is no longer at {from} subtasks in layout generation {generation}: another \
                 rescale changed it first; the store's layout stays as that one left it"
                );
            }
            tx.execute(
            "INSERT INTO ratchet_job_layouts (job, generation, previous, subtasks) VALUES ($1, $2, $3, $4)",
            &[&job, &((generation + 1) as i64), &(from as i32), &(to as i32)],
        )
        .await?;
            tx.commit().await?;
            Ok(())
        };
        tokio::time::timeout(STATEMENT_WITHIN * 2, switched)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "switching the layout got no answer within {:?}: whether it switched is unknown; \
                 `ratchet inspect` shows the layout, and `ratchet rescale` again finishes either way",
                STATEMENT_WITHIN * 2
            )
        })?
        .context("cannot switch the job's layout in ratchet_jobs")
    }

    async fn purge(&self, generation: u64) -> Result<()> {
        let client = store_session(&self.url).await?;
        let key = store_key(&self.job, generation);
        let purged = async {
            client
                .execute(
                    "DELETE FROM ratchet_checkpoint_records WHERE job = $1",
                    &[&key],
                )
                .await?;
            client
                .execute(
                    "DELETE FROM ratchet_checkpoint_owners WHERE job = $1",
                    &[&key],
                )
                .await
        };
        match tokio::time::timeout(STATEMENT_WITHIN, purged).await {
            Ok(Ok(_)) => Ok(()),
            // No checkpoint table yet: nothing to purge.
            Ok(Err(e)) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                Ok(())
            }
            Ok(Err(e)) => Err(e).context("cannot delete an old layout's checkpoint records"),
            Err(_) => bail!(
                "deleting an old layout's checkpoint records got no answer within {STATEMENT_WITHIN:?}"
            ),
        }
    }

    async fn checkpoints(
        &self,
        generation: u64,
        subtask: SubtaskId,
        limits: PgStoreLimits,
        create: bool,
    ) -> connector_api::Result<Option<Box<dyn CheckpointStore>>> {
        let key = store_key(&self.job, generation);
        Ok(if create {
            Some(Box::new(
                PgCheckpointStore::connect(&self.url, &key, subtask, RETAIN, limits).await?,
            ))
        } else {
            PgCheckpointStore::connect_existing(&self.url, &key, subtask, RETAIN, limits)
                .await?
                .map(|store| Box::new(store) as Box<dyn CheckpointStore>)
        })
    }
}

/// The job's record in PostgreSQL: `ratchet_jobs` (`subtasks`, `identity`: null for rows from before it was recorded),
/// or for a job from before that table, the highest subtask in `ratchet_checkpoint_owners`.
async fn pg_job(
    url: &str,
    job: &str,
    subtasks: u32,
    record: bool,
) -> anyhow::Result<Option<JobRecord>> {
    let client = store_session(url).await?;
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
        pg_generation(&client, job).await?
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
    let found = JobRecord::found(found, generation);
    if !record {
        return Ok(found);
    }
    let (count, identity) = JobRecord::to_record(found, subtasks);
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
        generation: pg_generation(&client, job).await?,
    }))
}

/// The generation `ratchet_jobs` holds for `job` (0 when the column or the row is not there yet).
///
/// # Errors
/// The database does not answer.
async fn pg_generation(client: &tokio_postgres::Client, job: &str) -> Result<u64> {
    let has_column: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 'ratchet_jobs'
                AND column_name = 'generation' AND table_schema = current_schema())",
            &[],
        )
        .await
        .context("cannot look for ratchet_jobs.generation")?
        .get(0);
    if !has_column {
        return Ok(0);
    }
    let row = client
        .query_opt(
            "SELECT generation FROM ratchet_jobs WHERE job = $1",
            &[&job],
        )
        .await
        .context("cannot read ratchet_jobs.generation")?;
    Ok(row.map_or(0, |row| row.get::<_, i64>(0) as u64))
}

async fn pg_history(url: &str, job: &str) -> Result<Vec<LayoutChange>> {
    let client = store_session(url).await?;
    let exists: bool = client
        .query_one("SELECT to_regclass('ratchet_job_layouts') IS NOT NULL", &[])
        .await?
        .get(0);
    if !exists {
        return Ok(Vec::new());
    }
    let rows = client
        .query(
            "SELECT generation, previous, subtasks,
                    to_char(changed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
             FROM ratchet_job_layouts WHERE job = $1 ORDER BY generation",
            &[&job],
        )
        .await
        .context("cannot read ratchet_job_layouts")?;
    Ok(rows
        .iter()
        .map(|row| LayoutChange {
            generation: row.get::<_, i64>(0) as u64,
            previous: row.get::<_, i32>(1) as u32,
            subtasks: row.get::<_, i32>(2) as u32,
            at: row.get(3),
        })
        .collect())
}
/// `ratchet_jobs.partition_layout`; null: [`PartitionLayout::OneTopic`] when the job has claim rows.
async fn pg_partition_layout(
    url: &str,
    job: &str,
    layout: PartitionLayout,
    record: bool,
) -> Result<Option<PartitionLayout>> {
    let client = store_session(url).await?;
    let has_column: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                    WHERE table_name = 'ratchet_jobs' AND column_name = 'partition_layout'
                      AND table_schema = current_schema())",
            &[],
        )
        .await
        .context("cannot look for ratchet_jobs.partition_layout")?
        .get(0);
    if !has_column && !record {
        return Ok(None);
    }
    if !has_column {
        client
            .batch_execute(
                "ALTER TABLE ratchet_jobs ADD COLUMN IF NOT EXISTS partition_layout text",
            )
            .await
            .context("cannot add partition_layout to ratchet_jobs")?;
    }
    // Claim rows mean the job ran (the table is there from its first claim on).
    let has_owners: bool = client
        .query_one(
            "SELECT to_regclass('ratchet_checkpoint_owners') IS NOT NULL",
            &[],
        )
        .await
        .context("cannot look for ratchet_checkpoint_owners")?
        .get(0);
    let ran = has_owners
        && client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM ratchet_checkpoint_owners WHERE job = $1)",
                &[&job],
            )
            .await
            .context("cannot read the job's claim rows")?
            .get::<_, bool>(0);
    if record {
        // A job that ran before layouts were recorded read one topic; a fresh one records its own. Two fresh
        // starts at once: the first update wins, the other finds its row set and compares below.
        let fill = if ran {
            PartitionLayout::OneTopic
        } else {
            layout
        };
        client
            .execute(
                "UPDATE ratchet_jobs SET partition_layout = $2 WHERE job = $1 AND partition_layout IS NULL",
                &[&job, &fill.as_str()],
            )
            .await
            .context("cannot record the partition layout in ratchet_jobs")?;
    }
    let row = client
        .query_opt(
            "SELECT partition_layout FROM ratchet_jobs WHERE job = $1",
            &[&job],
        )
        .await
        .context("cannot read ratchet_jobs")?;
    let recorded = row.and_then(|row| row.get::<_, Option<String>>(0));
    match recorded {
        Some(text) => Ok(Some(PartitionLayout::parse(&text).with_context(|| {
            format!("ratchet_jobs holds partition_layout {text:?} for job {job:?}")
        })?)),
        None => Ok(ran.then_some(PartitionLayout::OneTopic)),
    }
}
