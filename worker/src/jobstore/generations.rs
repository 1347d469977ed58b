//! A job's layout generations as the store records them ([`crate::cmd::rescale`]): the generation and subtask count
//! in `ratchet_jobs` (PostgreSQL) or `layout.json` (local), and the history of changes, read by the store's claim
//! check, `inspect` and the rescale.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::StoreConfig;

/// How long reading the generation may take.
const READ_WITHIN: Duration = Duration::from_secs(15);

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

/// A local store's `layout.json`: written once a job's subtask count first changes, replaced atomically at each
/// change; its count overrides the `subtasks` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalLayout {
    /// The layout generation.
    pub generation: u64,
    /// The subtask count.
    pub subtasks: u32,
    /// Every change so far, oldest first.
    pub history: Vec<LayoutChange>,
}

/// The local store's layout file, in the job's directory.
pub const LOCAL_LAYOUT: &str = "layout.json";

/// The local store's layout file of the job directory `dir`, if the job was ever rescaled.
///
/// # Errors
/// The file cannot be read or does not parse (named).
pub fn local_layout(dir: &Path) -> Result<Option<LocalLayout>> {
    let file = dir.join(LOCAL_LAYOUT);
    match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("{} does not parse", file.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", file.display())),
    }
}

/// The generation `ratchet_jobs` holds for `job` (0 when the column or the row is not there yet).
///
/// # Errors
/// The database does not answer.
pub async fn pg_generation(client: &tokio_postgres::Client, job: &str) -> Result<u64> {
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

/// The layout generation of `job` now, for the check every claim makes ([`SubtaskStore`](crate::jobstore::store::SubtaskStore)).
///
/// # Errors
/// [`Retryable`](connector_api::ErrorKind::Retryable) when the store cannot be read within its bound.
pub async fn generation_now(config: &StoreConfig, job: &str) -> connector_api::Result<u64> {
    let read = async {
        match config {
            StoreConfig::Local { path } => {
                Ok(local_layout(&path.join(job))?.map_or(0, |l| l.generation))
            }
            StoreConfig::Postgres { url } => {
                let client = crate::jobstore::store_calls::store_session(url).await?;
                pg_generation(&client, job).await
            }
        }
    };
    let unreadable = |why: String| {
        connector_api::Error::new(
            connector_api::ErrorKind::Retryable,
            connector_api::Phase::Recover,
            format!("cannot read the job's layout generation to check the claim: {why}"),
        )
    };
    match tokio::time::timeout(READ_WITHIN, read).await {
        Ok(Ok(generation)) => Ok(generation),
        Ok(Err(e)) => Err(unreadable(format!("{e:#}"))),
        Err(_) => Err(unreadable(format!("no answer within {READ_WITHIN:?}"))),
    }
}

/// Every change of `job`'s layout, oldest first (none for a job never rescaled).
///
/// # Errors
/// The store cannot be read.
pub async fn history(config: &StoreConfig, job: &str) -> Result<Vec<LayoutChange>> {
    match config {
        StoreConfig::Local { path } => {
            Ok(local_layout(&path.join(job))?.map_or_else(Vec::new, |l| l.history))
        }
        StoreConfig::Postgres { url } => tokio::time::timeout(READ_WITHIN, pg_history(url, job))
            .await
            .map_err(|_| {
                anyhow::anyhow!("reading the layout history got no answer within {READ_WITHIN:?}")
            })?,
    }
}

async fn pg_history(url: &str, job: &str) -> Result<Vec<LayoutChange>> {
    let client = crate::jobstore::store_calls::store_session(url).await?;
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
