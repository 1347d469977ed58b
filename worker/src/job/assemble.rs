//! The one answer to "which sink instances does subtask s run": the job's sink entries (routed ones as their
//! instances for the topics the subtask holds now and those its checkpoint has positions for) and its dead-letter
//! sink, added to a driver over the subtask's checkpoint store. `ratchet run` builds a subtask with it
//! ([`build`], [`instances_for_record`]); `inspect`, `resolve`, `rescale` and `forget-topic` recover with it
//! ([`driver_for`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::Context;
use connector_api::{
    CheckpointStore, Driver, JobId, Result, SinkHandle, SinkRegistry, SinkSpec, SinksForRecord,
    SubtaskId,
};
use kafka_source::{KafkaConnection, KafkaSource, PartitionShare};

use crate::config::{JobConfig, config_error};
use crate::job::shaping::Shaping;
use crate::jobstore::JobStore;
use crate::jobstore::subtask_store::SubtaskStore;
use crate::ops::progress::Progress;

/// What a subtask needs to run.
#[derive(Clone)]
pub struct SubtaskContext {
    /// The job file.
    pub job: Arc<JobConfig>,
    /// What the sinks are scoped by (`None`: the sink ids alone, for a job from before job scoping).
    pub job_id: Option<connector_api::JobId>,
    /// The source, resolved once for the process (every subtask and sink sees the same columns).
    pub source: Arc<crate::config::SourceSetup>,
    /// The job's transforms and selects, planned for the source's schema ([`crate::job::shaping`]).
    pub shaping: Arc<Shaping>,
    /// The job's state in the checkpoint store.
    pub jobs: Arc<dyn JobStore>,
    /// The job's layout generation ([`crate::job::rescale`]): where its checkpoint records are.
    pub generation: u64,
    /// The sink factories.
    pub registry: Arc<SinkRegistry>,
    /// The source's Kafka connection.
    pub kafka: KafkaConnection,
    /// This run's counters.
    pub progress: Arc<Progress>,
    /// When the process started (the origin of [`Progress`]'s times).
    pub started: std::time::Instant,
    /// A crash drill ([`crate::ops::drill`]).
    pub drill: Option<connector_api::FaultInjector>,
    /// Where decided positions also go, for lag in the usual tools (`None`: `lag_group = ""`).
    pub lag: Option<crate::ops::lag::LagReporter>,
}

impl SubtaskContext {
    /// The partitions subtask `index` reads: `p % subtasks == index`.
    pub fn share(&self, index: u32) -> PartitionShare {
        PartitionShare {
            index,
            of: self.job.job.subtasks,
        }
    }
}

/// The topics subtask `index`'s routed sink entries have instances for at its start (none when no entry is
/// routed): those in which its share holds a partition now, plus `new_topics` (read while it ran). Routed names
/// are checked for collisions across the whole job, not only within this share (`x-y` here and `x_y` in another
/// subtask would both write `x_y`).
///
/// # Errors
/// Kafka's metadata cannot be read; two topics' routed names collide.
pub async fn routed_topics_held(
    context: &SubtaskContext,
    index: u32,
    new_topics: &BTreeSet<String>,
) -> Result<BTreeSet<String>> {
    if routed_specs(&context.job).is_empty() {
        return Ok(BTreeSet::new());
    }
    let selection = context.job.selection().map_err(config_error)?;
    let mut held =
        KafkaSource::topics_held(&context.kafka, &selection, Some(context.share(index))).await?;
    held.extend(new_topics.iter().cloned());
    let mut everywhere = KafkaSource::topics_held(&context.kafka, &selection, None).await?;
    everywhere.extend(held.iter().cloned());
    crate::job::routing::instances(&context.job.sinks, &everywhere).map_err(config_error)?;
    Ok(held)
}

/// What [`build`] leaves for after the start: what each sink receives and the dead-letter sink.
pub struct Prepared {
    /// The transforms and selects the sinks were built for.
    pub shaping: Arc<Shaping>,
    /// The dead-letter sink, when the job has one.
    pub dead_letter: Option<SinkHandle>,
}

/// The driver with every sink of the job (routed entries as their instances for `topics`) and the dead-letter
/// sink, not started.
pub async fn build(
    context: &SubtaskContext,
    index: u32,
    topics: &BTreeSet<String>,
) -> Result<(Driver<SubtaskStore>, Prepared)> {
    let job = &context.job;
    let subtask = SubtaskId(index);
    let shaping = context.shaping.clone();
    let store = SubtaskStore::open(
        &context.jobs,
        context.generation,
        subtask,
        job.store_limits(),
    )
    .await?;
    let mut driver = Driver::new(store, job.driver_config())
        .with_metric_labels([("subtask", index.to_string())]);
    if let Some(drill) = &context.drill {
        driver = driver.with_fault_injector(drill.clone());
    }
    let dead_letter = add_job_sinks(
        &mut driver,
        job,
        &context.registry,
        context.job_id.as_ref(),
        subtask,
        topics,
        &shaping,
    )
    .await?;
    Ok((
        driver,
        Prepared {
            shaping,
            dead_letter,
        },
    ))
}

/// Adds every sink of `job` for `subtask` to `driver` (routed entries as their instances for `topics`), then the
/// dead-letter sink when the job has one; returns the dead-letter sink's handle. What a subtask runs, and what
/// `inspect`, `resolve` and `rescale` recover.
///
/// # Errors
/// A sink that cannot be built (named), or two sinks of one id.
pub async fn add_job_sinks(
    driver: &mut Driver<SubtaskStore>,
    job: &JobConfig,
    registry: &SinkRegistry,
    job_id: Option<&connector_api::JobId>,
    subtask: SubtaskId,
    topics: &BTreeSet<String>,
    shaping: &Shaping,
) -> Result<Option<SinkHandle>> {
    for instance in crate::job::routing::instances(&job.sinks, topics).map_err(config_error)? {
        let schema = shaping.sink_schema(&instance.entry);
        let sink = registry
            .build(&instance.spec, job_id, subtask, schema)
            .await?;
        driver.add_dyn_sink(sink)?;
    }
    match &job.dead_letter {
        Some(config) => Ok(Some(
            driver.add_dyn_sink(crate::job::dead_letter::sink(job, config, subtask)?)?,
        )),
        None => Ok(None),
    }
}

/// Builds, once the driver has loaded the restored record under the claim, the routed sinks' instances for the
/// topics it has positions for that `built` lacks: their decided work is committed by recovery, and they take the
/// topics' batches afterwards.
pub fn instances_for_record(
    context: &SubtaskContext,
    index: u32,
    built: &BTreeSet<String>,
    prepared: &Prepared,
) -> SinksForRecord {
    let routed = routed_specs(&context.job);
    let built = built.clone();
    let (registry, job_id, shaping) = (
        context.registry.clone(),
        context.job_id.clone(),
        prepared.shaping.clone(),
    );
    Box::new(move |record| {
        let missing: BTreeSet<String> = record
            .map(|r| topics_of(&r.positions))
            .unwrap_or_default()
            .difference(&built)
            .cloned()
            .collect();
        Box::pin(async move {
            if routed.is_empty() || missing.is_empty() {
                return Ok(Vec::new());
            }
            let mut sinks = Vec::new();
            for instance in
                crate::job::routing::instances(&routed, &missing).map_err(config_error)?
            {
                sinks.push(
                    registry
                        .build(
                            &instance.spec,
                            job_id.as_ref(),
                            SubtaskId(index),
                            shaping.sink_schema(&instance.entry),
                        )
                        .await?,
                );
            }
            Ok(sinks)
        })
    })
}

/// The job's sink entries routed by topic.
fn routed_specs(job: &JobConfig) -> Vec<SinkSpec> {
    job.sinks
        .iter()
        .filter(|spec| crate::config::routed::is_routed(spec))
        .cloned()
        .collect()
}

/// The topics the source positions of `restored` name.
pub fn topics_of(positions: &[connector_api::SourceOffset]) -> BTreeSet<String> {
    positions.iter().map(|p| p.topic.clone()).collect()
}

/// Every sink instance of the job across all its subtasks, for the topics the source selects now (routed entries
/// as one instance per topic): what `check-config` checks.
///
/// # Errors
/// Kafka's metadata cannot be read; two topics' routed names collide.
pub async fn instances_of_job(
    job: &JobConfig,
) -> anyhow::Result<Vec<crate::job::routing::Instance>> {
    let topics = match job.sinks.iter().any(crate::config::routed::is_routed) {
        false => BTreeSet::new(),
        true => KafkaSource::topics_held(&job.kafka()?, &job.selection()?, None).await?,
    };
    crate::job::routing::instances(&job.sinks, &topics)
}

/// A driver for `subtask` (in layout `generation`) with every sink of the job (scoped as `job_id` says) and its
/// dead-letter sink (each built for what `shaping` gives it), not started. A routed entry
/// ([`crate::job::routing`]) is there as the instances the subtask would build on its next start: for the topics its
/// share holds now and those its last checkpoint has positions for.
pub async fn driver_for(
    job: &JobConfig,
    jobs: &Arc<dyn JobStore>,
    job_id: Option<&JobId>,
    subtask: u32,
    generation: u64,
    shaping: &Shaping,
) -> anyhow::Result<Driver<SubtaskStore>> {
    let id = SubtaskId(subtask);
    let store = SubtaskStore::open(jobs, generation, id, job.store_limits())
        .await
        .context("checkpoint store")?;
    let topics = topics_of_subtask(job, &store, subtask).await?;
    let mut driver = Driver::new(store, job.driver_config());
    let registry = crate::job::sinks::registry();
    add_job_sinks(&mut driver, job, &registry, job_id, id, &topics, shaping).await?;
    Ok(driver)
}

/// Resolves `subtask` as `ratchet resolve` does (claim, recover: every decided checkpoint committed in every sink,
/// everything else aborted), then closes it: for the commands that rewrite a subtask's record afterwards
/// (`rescale`, `forget-topic`). Returns what it restored and the checkpoint id a record written next must take
/// (above every id the subtask used).
///
/// # Errors
/// The store or a sink cannot be built, or the recovery fails (named with the subtask).
pub async fn resolve_subtask(
    job: &JobConfig,
    jobs: &Arc<dyn JobStore>,
    job_id: Option<&JobId>,
    subtask: u32,
    generation: u64,
    shaping: &Shaping,
) -> anyhow::Result<(connector_api::Restored, connector_api::CheckpointId)> {
    let mut driver = driver_for(job, jobs, job_id, subtask, generation, shaping).await?;
    let restored = driver
        .start()
        .await
        .map_err(anyhow::Error::from)
        .with_context(|| format!("resolving subtask {subtask}"))?;
    let next = driver.current_checkpoint().next();
    driver
        .close()
        .await
        .with_context(|| format!("closing subtask {subtask}"))?;
    Ok((restored, next))
}

/// The topics a routed entry has instances for in `subtask` (none when no entry is routed): those in which its
/// share holds a partition now, and those of its last checkpoint's positions.
async fn topics_of_subtask(
    job: &JobConfig,
    store: &SubtaskStore,
    subtask: u32,
) -> anyhow::Result<BTreeSet<String>> {
    if !job.sinks.iter().any(crate::config::routed::is_routed) {
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
    topics.extend(loaded.record.iter().flat_map(|r| topics_of(&r.positions)));
    Ok(topics)
}
