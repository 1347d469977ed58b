//! Changing a job's subtask count: `ratchet rescale --to N` ([`crate::job::rescale`]), or `ratchet run` with a new
//! `subtasks` and no other process of the job running ([`crate::cmd::run`]).
//!
//! A job's checkpoint records and claims live under a *layout generation*: the job's name for its first layout,
//! `<job>@<g>` after the `g`-th change ([`store_key`](crate::jobstore::store_key)). The store's job record (`ratchet_jobs`, or the local
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
//! A crash before step 4 leaves the old layout (its transactions resolved, which the next start would have done)
//! and what step 3 wrote of the next generation, which every later start discards under the rescale lock
//! ([`discard_unswitched_generation`](crate::jobstore::JobStore)); after it, the new one; step 5 is repeated by
//! every later start. Every claim checks the generation under the
//! claim ([`SubtaskStore`]), so a process still running the old layout cannot claim a subtask again and read from
//! redistributed positions. The old subtasks' sink state is resolved in step 2: nothing stays open or prepared,
//! and no staged file stays; what the external systems keep by themselves (Kafka transactional ids until
//! `transactional.id.expiration.ms`, the JDBC commit ledger until its `retention`, Iceberg snapshot summaries) ages
//! out there. A subtask id used again later starts above every checkpoint id it used before.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use connector_api::{CheckpointId, CheckpointRecord, SourceOffset, SubtaskId};
use kafka_source::PartitionShare;

use crate::config::JobConfig;
use crate::jobstore::subtask_store::SubtaskStore;
use crate::jobstore::{JobRecord, JobStore};
use crate::ops::drill::RescaleStep;

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
    let jobs = crate::jobstore::open(&job.store, name);
    let _serialized = jobs.lock_rescale(patience(job)).await?;
    let Some(recorded) = jobs.record(to, false).await? else {
        bail!(
            "job {name:?} has never run: there is nothing to rescale; set subtasks = {to} in the job file and run it"
        );
    };
    if recorded.subtasks == to {
        jobs.retire_old_generations(recorded.generation).await?;
        println!(
            "job {name:?} already has {to} subtasks (layout generation {})",
            recorded.generation
        );
        return Ok(());
    }
    let held = recorded.subtasks.max(to);
    crate::membership::exclusive::holding_every_subtask(job, held, "rescale", || {
        rescale_held(job, &jobs, recorded, to)
    })
    .await
}

/// How long a process waits for another one's rescale of `job`: long enough for it to resolve every subtask.
pub fn patience(job: &JobConfig) -> Duration {
    job.job.max_recovery_time * (job.job.subtasks + 1) + Duration::from_secs(60)
}

async fn rescale_held(
    job: &JobConfig,
    jobs: &Arc<dyn JobStore>,
    recorded: JobRecord,
    to: u32,
) -> Result<()> {
    let name = &job.job.name;
    let (from, generation) = (recorded.subtasks, recorded.generation);
    // Recorded by a release from before the count was kept: give it its row first (the switch updates it).
    jobs.record(from, true).await?;
    tracing::info!(job = %name, from, to, generation, "rescaling: resolving every subtask of the old layout");
    let next = generation + 1;
    jobs.purge(next).await?;
    let mut old = job.clone();
    old.job.subtasks = from;
    let job_id = recorded.job_id(name)?;
    let shaping = crate::job::shaping::Shaping::resolve(job).await?;
    let mut positions: Vec<SourceOffset> = Vec::new();
    let mut owners = BTreeMap::new();
    let mut above = CheckpointId(1);
    for subtask in 0..from {
        let (restored, next) = crate::job::assemble::resolve_subtask(
            &old,
            jobs,
            job_id.as_ref(),
            subtask,
            generation,
            &shaping,
        )
        .await
        .context("the old layout")?;
        above = above.max(next);
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
        let store =
            SubtaskStore::open_next_generation(jobs, next, SubtaskId(subtask), job.store_limits())
                .await?;
        store.save_under_new_claim(&record).await?;
    }
    crate::ops::drill::rescale_reached(RescaleStep::NewRecordsWritten);
    jobs.switch(generation, from, to, &owners).await?;
    crate::ops::drill::rescale_reached(RescaleStep::Switched);
    jobs.retire_old_generations(next).await?;
    println!(
        "job {name:?} rescaled from {from} to {to} subtasks (layout generation {next}): every old subtask's last \
         checkpoint committed, {} partition position(s) dealt to the new subtasks, which start after checkpoint {}",
        positions.len(),
        above.0
    );
    Ok(())
}
