//! Operator tools for a job that is down (or, for `inspect`, running): `ratchet inspect` lists what every subtask
//! left in the checkpoint store and in every sink's external system, with what recovery will do; `ratchet resolve`
//! does it (claims and recovers every subtask, then stops) without starting the job.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use connector_api::{Inspection, JobId, Report};

use crate::cli::OperateArgs;
use crate::config::JobConfig;
use crate::job::assemble::driver_for;
use crate::jobstore::JobStore;

/// `ratchet inspect`: prints every subtask's view.
///
/// # Errors
/// The job file, the store or a sink that cannot be built.
pub async fn inspect(args: OperateArgs) -> Result<()> {
    let job = JobConfig::load(&args.config)?;
    println!(
        "job {:?}: {} subtask(s), {} sink(s)",
        job.job.name,
        job.job.subtasks,
        job.sinks.len()
    );
    let jobs = crate::jobstore::open(&job.store, &job.job.name);
    let identity = jobs.identity(job.job.subtasks, false).await?;
    let job_id = identity.job_id(&job.job.name)?;
    let changes = jobs.history().await?;
    if changes.is_empty() {
        println!(
            "layout: {} subtask(s) since the job first ran",
            identity.subtasks
        );
    }
    for change in &changes {
        println!(
            "layout generation {}: {} -> {} subtask(s) at {}",
            change.generation, change.previous, change.subtasks, change.at
        );
    }
    let shaping = crate::job::shaping::Shaping::resolve(&job).await?;
    let (mut commits, mut aborts) = (0, 0);
    for subtask in 0..job.job.subtasks {
        let mut driver = driver_for(
            &job,
            &jobs,
            job_id.as_ref(),
            subtask,
            identity.generation,
            &shaping,
        )
        .await?;
        let inspection = driver
            .inspect()
            .await
            .with_context(|| format!("subtask {subtask}"))?;
        let (c, a) = print_subtask(subtask, &inspection);
        commits += c;
        aborts += a;
    }
    println!(
        "\nrecovery (`ratchet resolve`, or the next start of each subtask) will commit {commits} and abort {aborts} \
         transaction(s)"
    );
    Ok(())
}

/// Prints one subtask; returns (to commit, to abort).
fn print_subtask(subtask: u32, inspection: &Inspection) -> (usize, usize) {
    let store = &inspection.store;
    let decided = match (&store.record, store.committed_through) {
        (None, _) => "no checkpoint yet".to_string(),
        (Some(record), Some(done)) if done >= record.id => {
            format!("last checkpoint {}, committed in every sink", record.id)
        }
        (Some(record), done) => format!(
            "last checkpoint {} is decided and not yet noted committed everywhere (committed through {}): \
             recovery commits it",
            record.id,
            done.map_or("none".to_string(), |d| d.to_string())
        ),
    };
    println!("\nsubtask {subtask}: checkpoint store: {decided}");
    if let Some(refusal) = &inspection.refusal {
        println!("  the next start refuses to recover: {}", Report(refusal));
    }
    let (mut commits, mut aborts) = (0, 0);
    for sink in &inspection.sinks {
        match &sink.plan {
            Err(e) => println!("  sink {}: cannot be read: {}", sink.sink, Report(e)),
            Ok(plan) => {
                print_plan(&sink.sink, plan);
                for txn in &plan.found {
                    let age = match (txn.age, sink.timeout) {
                        (Some(age), Some(timeout)) => format!(
                            "age {} of its {} timeout",
                            humantime::format_duration(round(age)),
                            humantime::format_duration(timeout)
                        ),
                        (Some(age), None) => {
                            format!(
                                "age {} (no timeout)",
                                humantime::format_duration(round(age))
                            )
                        }
                        (None, _) => "age unknown".to_string(),
                    };
                    let checkpoint = txn
                        .checkpoint
                        .map_or(String::new(), |c| format!(", checkpoint {c}"));
                    println!(
                        "    {}: {}{checkpoint}, {age} -> {}",
                        txn.name, txn.state, txn.resolution
                    );
                    match txn.resolution {
                        connector_api::Resolution::Commit => commits += 1,
                        connector_api::Resolution::Abort => aborts += 1,
                    }
                }
            }
        }
    }
    (commits, aborts)
}

/// The plan's head: what recovery commits, how it fences, the sink's notes.
fn print_plan(sink: &connector_api::SinkId, plan: &connector_api::PlanSummary) {
    let commits = match (plan.checkpoint, plan.commits) {
        (None, _) => "no checkpoint to restore".to_string(),
        (Some(checkpoint), 0) => format!(
            "checkpoint {checkpoint}: nothing left to commit ({} committable(s) already visible)",
            plan.already_committed
        ),
        (Some(checkpoint), n) => format!(
            "checkpoint {checkpoint}: commits {n} committable(s) ({} already visible)",
            plan.already_committed
        ),
    };
    let how = &plan.fence.how;
    let fence = match plan.fence.order {
        connector_api::FenceOrder::BeforeCommit => format!("fences before committing: {how}"),
        connector_api::FenceOrder::AfterCommit => format!("fences after committing: {how}"),
        connector_api::FenceOrder::Nothing => how.clone(),
    };
    println!("  sink {sink}: {commits}; {fence}");
    for note in &plan.notes {
        println!("    note: {note}");
    }
    if plan.found.is_empty() {
        println!("    nothing pending");
    }
}

fn round(age: Duration) -> Duration {
    Duration::from_millis(age.as_millis() as u64 / 100 * 100)
}

/// `ratchet resolve`: recovers every subtask of a job that is down, then stops.
///
/// # Errors
/// The job is running (it resolves its own transactions), or a recovery fails (named).
pub async fn resolve(args: OperateArgs) -> Result<()> {
    let job = JobConfig::load(&args.config)?;
    crate::membership::exclusive::holding_every_subtask(
        &job,
        job.job.subtasks,
        "resolve",
        || async {
            let jobs = crate::jobstore::open(&job.store, &job.job.name);
            let identity = jobs.identity(job.job.subtasks, true).await?;
            let job_id = identity.job_id(&job.job.name)?;
            resolve_every_subtask(&job, &jobs, job_id.as_ref(), identity.generation).await
        },
    )
    .await
}

/// Claims and recovers every subtask in turn, then closes it; reports each.
async fn resolve_every_subtask(
    job: &JobConfig,
    jobs: &Arc<dyn JobStore>,
    job_id: Option<&JobId>,
    generation: u64,
) -> Result<()> {
    let shaping = crate::job::shaping::Shaping::resolve(job).await?;
    let mut outcome = Ok(());
    for subtask in 0..job.job.subtasks {
        let mut driver = driver_for(job, jobs, job_id, subtask, generation, &shaping).await?;
        match driver.start().await {
            Ok(restored) => {
                driver
                    .close()
                    .await
                    .with_context(|| format!("subtask {subtask}"))?;
                println!(
                    "subtask {subtask}: recovered (claim epoch {}): {}",
                    restored.owner,
                    restored.checkpoint.map_or(
                        "no checkpoint; every open transaction aborted".to_string(),
                        |c| format!(
                            "checkpoint {c} committed in every sink, every other open transaction aborted"
                        )
                    )
                );
            }
            Err(e) => {
                println!("subtask {subtask}: recovery failed: {}", Report(&e));
                outcome = Err(anyhow::anyhow!(
                    "subtask {subtask} could not be recovered: {}",
                    Report(&e)
                ));
            }
        }
    }
    outcome
}
