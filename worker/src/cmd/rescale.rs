//! Changing a job's subtask count (`ratchet rescale --to N`, or `ratchet run` with a new `subtasks` and no other
//! process of the job running).
//!
//! A job's checkpoint records and claims live under a *layout generation*: the job's name for its first layout,
//! `<job>@<g>` after the `g`-th change ([`store_key`]). The store's job record (`ratchet_jobs`, or the local
//! `layout.json`) holds the subtask count and the generation; switching both in one atomic write is the change's
//! commit point. The steps, with the job held (every lease, or the local lock; refused while another process of
//! the job is alive):
//!
//! 1. **Discard** what a crashed attempt left of the next generation's records.
//! 2. **Resolve** every old subtask (claim, recover: every decided checkpoint committed in every sink, everything
//!    else aborted, as `ratchet resolve`), keeping its positions and the claim's epoch. The claims fence every
//!    earlier owner, so no old process saves or commits anything from here on.
//! 3. **Write the new layout's records** under the next generation, not yet in effect: subtask `t` of `N` gets
//!    the positions of the partitions in its share (as `run` deals them), and a checkpoint id above every id any
//!    old subtask used, so no sink mistakes a new checkpoint for an old one.
//! 4. **Switch** (one transaction, or one atomic file replace): the count and generation change, and a history row
//!    is added, only if every old subtask's claim is still the one taken in step 2 (compare-and-swap: a process
//!    that claimed one meanwhile makes the change fail, the old layout intact).
//! 5. **Retire** the old generation's records and claims.
//!
//! A crash before step 4 leaves the old layout (its transactions resolved, which the next start would have done);
//! after it, the new one; step 5 is repeated by every later start. Every claim checks the generation under the
//! claim ([`SubtaskStore`]), so a process still running the old layout cannot claim a subtask again and read from
//! redistributed positions. The old subtasks' sink state is resolved in step 2: nothing stays open or prepared,
//! and no staged file stays; what the external systems keep by themselves (Kafka transactional ids until
//! `transactional.id.expiration.ms`, the JDBC commit ledger until its `retention`, Iceberg snapshot summaries) ages
//! out there. A subtask id used again later starts above every checkpoint id it used before.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, OwnerEpoch, SourceOffset, SubtaskId,
};
use kafka_source::PartitionShare;

use crate::config::{JobConfig, StoreConfig};
use crate::jobstore::generations::{LOCAL_LAYOUT, LayoutChange, LocalLayout, local_layout};
use crate::jobstore::store::{JobRecord, SubtaskStore, store_key};
use crate::ops::drill::RescaleStep;

/// How long one statement of the switch or the generation check may take.
const STATEMENT_WITHIN: Duration = Duration::from_secs(15);

/// `ratchet rescale`: changes the subtask count of a job that is down.
///
/// # Errors
/// As [`rescale`].
pub async fn command(args: crate::cli::RescaleArgs) -> Result<()> {
    let job = JobConfig::load(&args.config)?;
    rescale(&job, args.to).await?;
    if job.job.subtasks != args.to {
        println!(
            "the job file still says subtasks = {}: set it to {} before the next `ratchet run`",
            job.job.subtasks, args.to
        );
    }
    Ok(())
}

/// Changes `job`'s subtask count to `to`, holding the job (as `ratchet resolve` does) for the whole change.
///
/// # Errors
/// Another process of the job is alive, a fresh job (nothing to rescale), an old subtask that cannot be
/// resolved, a claim taken meanwhile, or a store that cannot be written: each named; the old layout then stays.
pub async fn rescale(job: &JobConfig, to: u32) -> Result<()> {
    if to == 0 || to > 1024 {
        bail!("--to {to} is out of range: use 1 to 1024");
    }
    let name = &job.job.name;
    // Processes started together with the new count (a rolling update) rescale one at a time: the others wait
    // here, then find the job rescaled.
    let _serialized = RescaleLock::take(job).await?;
    let Some(recorded) = crate::jobstore::store::job_record(&job.store, name, to, false).await?
    else {
        bail!(
            "job {name:?} has never run: there is nothing to rescale; set subtasks = {to} in the job file and run it"
        );
    };
    if recorded.subtasks == to {
        retire_old_generations(&job.store, name, recorded.generation).await?;
        println!(
            "job {name:?} already has {to} subtasks (layout generation {})",
            recorded.generation
        );
        return Ok(());
    }
    let held = recorded.subtasks.max(to);
    crate::membership::exclusive::holding_every_subtask(job, held, "rescale", || {
        rescale_held(job, recorded, to)
    })
    .await
}

async fn rescale_held(job: &JobConfig, recorded: JobRecord, to: u32) -> Result<()> {
    let name = &job.job.name;
    let (from, generation) = (recorded.subtasks, recorded.generation);
    // Recorded by a release from before the count was kept: give it its row first (the switch updates it).
    crate::jobstore::store::job_record(&job.store, name, from, true).await?;
    tracing::info!(job = %name, from, to, generation, "rescaling: resolving every subtask of the old layout");
    let next = generation + 1;
    purge(&job.store, name, next).await?;
    let mut old = job.clone();
    old.job.subtasks = from;
    let job_id = recorded.job_id(name)?;
    let mut positions: Vec<SourceOffset> = Vec::new();
    let mut owners = BTreeMap::new();
    let mut above = CheckpointId(1);
    for subtask in 0..from {
        let mut driver =
            crate::job::assemble::driver_for(&old, job_id.as_ref(), subtask, generation).await?;
        let restored = driver
            .start()
            .await
            .map_err(anyhow::Error::from)
            .with_context(|| format!("resolving subtask {subtask} of the old layout"))?;
        above = above.max(driver.current_checkpoint().next());
        driver
            .close()
            .await
            .with_context(|| format!("closing subtask {subtask} of the old layout"))?;
        positions.extend(restored.positions);
        owners.insert(subtask, restored.owner);
    }
    crate::ops::drill::rescale_reached(RescaleStep::Resolved);
    let selection = job.selection()?;
    for subtask in 0..to {
        let share = PartitionShare {
            index: subtask,
            of: to,
        };
        let record = CheckpointRecord {
            id: above,
            positions: positions
                .iter()
                .filter(|p| share.holds(&selection, &p.topic, p.partition))
                .cloned()
                .collect(),
            committables: BTreeMap::new(),
        };
        let store = SubtaskStore::open_next_generation(
            &job.store,
            name,
            next,
            SubtaskId(subtask),
            job.store_limits(),
        )
        .await?;
        // The claim's guard is let go before the save: on the local store it is the directory's lock, which
        // the save takes itself. The job stays held (every lease, or the job's lock) for the whole change, so no
        // other claim comes between; one that did would fence the save.
        let claim = store.claim().await?;
        drop(claim.guard);
        store.save(claim.epoch, &record).await?;
    }
    crate::ops::drill::rescale_reached(RescaleStep::NewRecordsWritten);
    switch(&job.store, name, generation, from, to, &owners).await?;
    crate::ops::drill::rescale_reached(RescaleStep::Switched);
    retire_old_generations(&job.store, name, next).await?;
    println!(
        "job {name:?} rescaled from {from} to {to} subtasks (layout generation {next}): every old subtask's last \
         checkpoint committed, {} partition position(s) dealt to the new subtasks, which start after checkpoint {}",
        positions.len(),
        above.0
    );
    Ok(())
}

/// Held while this process rescales a job (PostgreSQL store: a session advisory lock, released with its
/// connection, also when the process dies). The local store needs none: its lock file admits one process.
struct RescaleLock {
    _session: Option<tokio_postgres::Client>,
}

impl RescaleLock {
    /// Waits for another process's rescale of the job to end, at most as long as one may take (a recovery per
    /// subtask, and a minute).
    async fn take(job: &JobConfig) -> Result<Self> {
        let StoreConfig::Postgres { url } = &job.store else {
            return Ok(Self { _session: None });
        };
        let patience = job.job.max_recovery_time * (job.job.subtasks + 1) + Duration::from_secs(60);
        let client = crate::jobstore::store_calls::store_session(url).await?;
        client
            .batch_execute(&format!("SET lock_timeout = {}", patience.as_millis()))
            .await
            .context("cannot set lock_timeout")?;
        let key = format!("ratchet-rescale:{}", job.job.name);
        match client
            .execute("SELECT pg_advisory_lock(hashtext($1))", &[&key])
            .await
        {
            Ok(_) => Ok(Self {
                _session: Some(client),
            }),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                bail!(
                    "another process has been rescaling job {:?} for more than {patience:?}: stop it, or wait for it",
                    job.job.name
                )
            }
            Err(e) => Err(e).context("cannot take the job's rescale lock"),
        }
    }
}

/// The commit point: the job record's count and generation change (with a history entry) only while every old
/// subtask's claim is still the one the rescale took.
async fn switch(
    config: &StoreConfig,
    job: &str,
    generation: u64,
    from: u32,
    to: u32,
    owners: &BTreeMap<u32, OwnerEpoch>,
) -> Result<()> {
    let change = LayoutChange {
        generation: generation + 1,
        previous: from,
        subtasks: to,
        at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    };
    match config {
        StoreConfig::Local { path } => {
            // The local lock keeps every other process out: no claim can have moved.
            let dir = path.join(job);
            let mut history = local_layout(&dir)?.map_or_else(Vec::new, |l| l.history);
            history.push(change);
            let layout = LocalLayout {
                generation: generation + 1,
                subtasks: to,
                history,
            };
            connector_common::fs::replace_file(
                &dir,
                &dir.join(LOCAL_LAYOUT),
                &serde_json::to_vec_pretty(&layout)?,
            )
            .with_context(|| format!("cannot write {}", dir.join(LOCAL_LAYOUT).display()))?;
            Ok(())
        }
        StoreConfig::Postgres { url } => {
            let mut client = crate::jobstore::store_calls::store_session(url).await?;
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
    }
}

/// Deletes the records and claims of every layout generation of `job` before `current` (what a change left
/// behind if it stopped after its switch). Idempotent.
///
/// # Errors
/// The store cannot be written.
pub async fn retire_old_generations(config: &StoreConfig, job: &str, current: u64) -> Result<()> {
    for generation in 0..current {
        purge(config, job, generation).await?;
    }
    Ok(())
}

/// Deletes every record and claim of `job` in layout `generation`.
async fn purge(config: &StoreConfig, job: &str, generation: u64) -> Result<()> {
    match config {
        StoreConfig::Local { path } => {
            let dir = path.join(store_key(job, generation));
            if generation > 0 {
                return match std::fs::remove_dir_all(&dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        Err(e).with_context(|| format!("cannot remove {}", dir.display()))
                    }
                    _ => Ok(()),
                };
            }
            // The first layout's records share the job's directory with its identity files.
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
            };
            for entry in entries {
                let entry = entry?;
                if entry.file_name().to_string_lossy().starts_with("subtask-") {
                    std::fs::remove_dir_all(entry.path())
                        .with_context(|| format!("cannot remove {}", entry.path().display()))?;
                }
            }
            Ok(())
        }
        StoreConfig::Postgres { url } => {
            let client = crate::jobstore::store_calls::store_session(url).await?;
            let key = store_key(job, generation);
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
                Ok(Err(e))
                    if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) =>
                {
                    Ok(())
                }
                Ok(Err(e)) => Err(e).context("cannot delete an old layout's checkpoint records"),
                Err(_) => bail!(
                    "deleting an old layout's checkpoint records got no answer within {STATEMENT_WITHIN:?}"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn local(dir: &Path) -> StoreConfig {
        StoreConfig::Local {
            path: dir.to_path_buf(),
        }
    }

    fn limits() -> checkpoint_postgres::PgStoreLimits {
        checkpoint_postgres::PgStoreLimits::default()
    }

    #[tokio::test]
    async fn a_claim_in_a_layout_the_job_has_left_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = local(dir.path());
        let old = SubtaskStore::open(&config, "orders", 0, SubtaskId(1), limits())
            .await
            .unwrap();
        old.claim().await.unwrap();
        switch(&config, "orders", 0, 2, 3, &BTreeMap::new())
            .await
            .unwrap();
        let refused = old.claim().await.unwrap_err();
        assert_eq!(refused.kind(), connector_api::ErrorKind::Config);
        assert!(
            refused
                .to_string()
                .contains("was rescaled while this process ran"),
            "{refused}"
        );
        let new = SubtaskStore::open(&config, "orders", 1, SubtaskId(1), limits())
            .await
            .unwrap();
        new.claim().await.unwrap();
        let layout = local_layout(&dir.path().join("orders")).unwrap().unwrap();
        assert_eq!((layout.generation, layout.subtasks), (1, 3));
        assert_eq!(layout.history.len(), 1);
    }

    #[tokio::test]
    async fn retiring_removes_only_older_layouts_records() {
        let dir = tempfile::tempdir().unwrap();
        let config = local(dir.path());
        for generation in [0, 1, 2] {
            let store = SubtaskStore::open_next_generation(
                &config,
                "orders",
                generation,
                SubtaskId(0),
                limits(),
            )
            .await
            .unwrap();
            store.claim().await.unwrap();
        }
        std::fs::write(dir.path().join("orders").join("identity"), "job").unwrap();
        retire_old_generations(&config, "orders", 2).await.unwrap();
        assert!(!dir.path().join("orders").join("subtask-0").exists());
        assert!(dir.path().join("orders").join("identity").exists());
        assert!(!dir.path().join("orders@1").exists());
        assert!(dir.path().join("orders@2").join("subtask-0").exists());
    }
}
