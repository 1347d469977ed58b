//! Operator tools for a job that is down (or, for `inspect`, running): `ratchet inspect` lists what every subtask
//! left in the checkpoint store and in every sink's external system, with what recovery will do; `ratchet resolve`
//! does it (claims and recovers every subtask, then stops) without starting the job.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use connector_api::{CheckpointStore, Driver, Inspection, JobId, Report, SubtaskId};
use kafka_source::{KafkaSource, PartitionShare};

use crate::cli::OperateArgs;
use crate::config::{JobConfig, StoreConfig};
use crate::lease::{Leases, LocalLease, PgLeases};
use crate::presence::Presence;
use crate::store::SubtaskStore;

/// A driver for `subtask` (in layout `generation`) with every sink of the job (scoped as `job_id` says) and its
/// dead-letter sink, not started. A routed entry
/// ([`crate::routing`]) is there as the instances the subtask would build on its next start: for the topics its
/// share holds now and those its last checkpoint has positions for.
pub async fn driver_for(
    job: &JobConfig,
    job_id: Option<&JobId>,
    subtask: u32,
    generation: u64,
) -> Result<Driver<SubtaskStore>> {
    let id = SubtaskId(subtask);
    let store = SubtaskStore::open(
        &job.store,
        &job.job.name,
        generation,
        id,
        job.store_limits(),
    )
    .await
    .context("checkpoint store")?;
    let topics = routed_topics(job, &store, subtask).await?;
    let mut driver = Driver::new(store, job.driver_config());
    let registry = crate::sinks::registry();
    let schema = job.schema().await?;
    crate::subtask::add_job_sinks(&mut driver, job, &registry, job_id, id, &topics, &schema)
        .await?;
    Ok(driver)
}

/// The topics a routed entry has instances for in `subtask` (none when no entry is routed): those in which its
/// share holds a partition now, and those of its last checkpoint's positions.
async fn routed_topics(
    job: &JobConfig,
    store: &SubtaskStore,
    subtask: u32,
) -> Result<BTreeSet<String>> {
    if !job.sinks.iter().any(crate::routing::is_routed) {
        return Ok(BTreeSet::new());
    }
    let share = PartitionShare {
        index: subtask,
        of: job.job.subtasks,
    };
    let mut topics = KafkaSource::topics_held(&job.kafka()?, &job.selection()?, Some(share))
        .await
        .context("the topics of the routed sinks")?;
    let loaded = store.load().await.context("checkpoint store")?;
    topics.extend(
        loaded
            .record
            .iter()
            .flat_map(|r| r.positions.iter().map(|p| p.topic.clone())),
    );
    Ok(topics)
}

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
    let identity =
        crate::store::job_identity(&job.store, &job.job.name, job.job.subtasks, false).await?;
    let job_id = identity.job_id(&job.job.name)?;
    let changes = crate::generations::history(&job.store, &job.job.name).await?;
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
    let (mut commits, mut aborts) = (0, 0);
    for subtask in 0..job.job.subtasks {
        let mut driver = driver_for(&job, job_id.as_ref(), subtask, identity.generation).await?;
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
    holding_every_subtask(&job, job.job.subtasks, "resolve", || async {
        let identity =
            crate::store::job_identity(&job.store, &job.job.name, job.job.subtasks, true).await?;
        let job_id = identity.job_id(&job.job.name)?;
        resolve_every_subtask(&job, job_id.as_ref(), identity.generation).await
    })
    .await
}

/// Runs `work` while holding `job` the way a worker does (the local lock, or the leases of all `subtasks`,
/// renewed every lease / 5 for as long as it takes, so a worker starting meanwhile waits for them), refusing when
/// another process of the job is still alive after a lease and a renewal (a process killed just before counts as
/// alive until its lease expires); `what` names this process in the lease table.
///
/// # Errors
/// Another process of the job is alive (named), the store cannot be reached, or what `work` reports.
pub async fn holding_every_subtask<T, F, Fut>(
    job: &JobConfig,
    subtasks: u32,
    what: &str,
    work: F,
) -> Result<T>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut presence = None;
    let leases: Box<dyn Leases> = match &job.store {
        StoreConfig::Local { path } => Box::new(LocalLease::take(path, &job.job.name, subtasks)?),
        StoreConfig::Postgres { url } => {
            let process = format!("{what}-{}", std::process::id());
            let leases =
                PgLeases::join(url, &job.job.name, process.clone(), subtasks, job.job.lease)
                    .await?;
            let joined = Presence::join(url, &job.job.name, process, what, job.job.lease).await?;
            // A process killed a moment ago stays alive until its presence expires: wait that long, no longer.
            // Every mode's processes are there (leases, static members, the Kafka group, another operation).
            let patience = job.job.lease + job.job.lease / 5;
            let waited = std::time::Instant::now();
            loop {
                let running = joined.others().await?;
                if running.is_empty() {
                    break;
                }
                if waited.elapsed() >= patience {
                    let _ = leases.leave().await;
                    let _ = joined.leave().await;
                    bail!(
                        "job {:?} is running in {} process(es): {}, still alive after {patience:?}: stop every \
                         process of the job first to {what} it (whatever its membership: leases, static members, \
                         the Kafka group)",
                        job.job.name,
                        running.len(),
                        running.join(", ")
                    );
                }
                tracing::info!(processes = ?running,
                    "waiting for the job's other processes to stop or their presence to expire");
                tokio::time::sleep(job.job.lease / 5).await;
            }
            presence = Some(joined);
            Box::new(leases)
        }
    };
    // The only member's quota is every subtask.
    leases.renew().await?;
    let renewing = async {
        let mut tick = tokio::time::interval(job.job.lease / 5);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(e) = leases.renew().await {
                tracing::warn!(error = %format!("{e:#}"),
                    "cannot renew the leases; a worker may start once they expire (its claim then waits for this \
                     process's recovery guard, and a rescale's switch fails if it claimed a subtask)");
            }
            if let Some(presence) = &presence
                && let Err(e) = presence.renew().await
            {
                tracing::warn!(error = %format!("{e:#}"), "cannot renew this operation's presence");
            }
        }
    };
    let outcome = tokio::select! {
        outcome = work() => outcome,
        never = renewing => never,
    };
    if let Err(e) = leases.leave().await {
        tracing::warn!(error = %format!("{e:#}"), "cannot leave the job; its lease rows expire by themselves");
    }
    if let Some(presence) = &presence
        && let Err(e) = presence.leave().await
    {
        tracing::warn!(error = %format!("{e:#}"), "cannot delete this operation's presence; it expires by itself");
    }
    outcome
}

/// Claims and recovers every subtask in turn, then closes it; reports each.
async fn resolve_every_subtask(
    job: &JobConfig,
    job_id: Option<&JobId>,
    generation: u64,
) -> Result<()> {
    let mut outcome = Ok(());
    for subtask in 0..job.job.subtasks {
        let mut driver = driver_for(job, job_id, subtask, generation).await?;
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
