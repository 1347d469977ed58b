//! `ratchet check-config`: everything `ratchet run` would check at start, without running the job, reported as
//! one line per check and every problem at once. It writes nothing anywhere: no checkpoint directory or table, no
//! sink table, topic, directory or registry entry; each sink is checked by its factory's read-only
//! [`check`](connector_api::SinkFactory::check), which contacts its server.

use std::collections::BTreeSet;

use anyhow::{Result, bail};
use connector_api::{CheckpointStore, SubtaskId};

use crate::cli::CheckArgs;
use crate::config::JobConfig;
use crate::config::KAFKA_REACHABLE_WITHIN;
use crate::jobstore::subtask_store::SubtaskStore;

/// Checks the job file in `args.config`; prints what was checked.
///
/// # Errors
/// The number of problems found, after printing each.
pub async fn run(args: CheckArgs) -> Result<()> {
    let job = JobConfig::load(&args.config)?;
    println!(
        "ok    job file {}: job {:?}, {} subtask(s), {} sink(s), checkpoint every {:?}",
        args.config.display(),
        job.job.name,
        job.job.subtasks,
        job.sinks.len(),
        job.job.checkpoint_interval
    );
    let mut problems = 0;
    let jobs = crate::jobstore::open(&job.store, &job.job.name);
    let recorded = jobs
        .record(job.job.subtasks, false)
        .await
        .and_then(|recorded| {
            let recorded = recorded.unwrap_or(crate::jobstore::JobRecord {
                subtasks: job.job.subtasks,
                identity: crate::jobstore::Identity::Job,
                generation: 0,
            });
            Ok((recorded, recorded.job_id(&job.job.name)?))
        });
    let job_id = recorded.as_ref().ok().and_then(|(_, id)| id.clone());
    let generation = recorded.as_ref().map_or(0, |(record, _)| record.generation);
    let counted = recorded.map(|(recorded, _)| {
        let scope = match recorded.identity {
            crate::jobstore::Identity::Job => "the job's name",
            crate::jobstore::Identity::Sink => "their ids (a job from before job scoping)",
        };
        let count = if recorded.subtasks == job.job.subtasks {
            format!("{} subtask(s), as the store records (or a fresh job)", recorded.subtasks)
        } else {
            format!(
                "the store records {} subtask(s) and the job file says {}: `ratchet run` rescales the job first \
                 (with every other process of it stopped), as `ratchet rescale --to {}` does",
                recorded.subtasks, job.job.subtasks, job.job.subtasks
            )
        };
        format!("{count}; layout generation {}; sinks scoped by {scope}", recorded.generation)
    });
    let mut report = |what: String, outcome: Result<String>| match outcome {
        Ok(detail) => println!("ok    {what}: {detail}"),
        Err(e) => {
            problems += 1;
            println!("FAIL  {what}: {e:#}");
        }
    };
    report(
        format!("Kafka source {}", job.source.bootstrap_servers),
        check_source(&job).await,
    );
    report("job record".into(), counted);
    let layout = match job.selection() {
        Ok(selection) => crate::job::preflight::check_layout(jobs.as_ref(), &selection, false)
            .await
            .map(|()| {
                format!("{selection}, partitions dealt as the store records (or a fresh job)")
            }),
        Err(e) => Err(e),
    };
    report("topics".into(), layout);
    // Read-only: a fresh job stays fresh (no directory, no table is created).
    let store = match SubtaskStore::open_existing(
        &jobs,
        generation,
        SubtaskId(0),
        job.store_limits(),
    )
    .await
    {
        Ok(None) => Ok("no checkpoint of this job yet (a fresh job)".to_string()),
        Ok(Some(store)) => store
            .load()
            .await
            .map(|loaded| {
                format!(
                    "reachable; subtask 0's last checkpoint: {}",
                    loaded
                        .record
                        .map_or("none (a fresh job)".to_string(), |r| r.id.to_string())
                )
            })
            .map_err(anyhow::Error::from),
        Err(e) => Err(anyhow::Error::from(e)),
    };
    report("checkpoint store".into(), store);
    let registry = crate::job::sinks::registry();
    let waiting = crate::cmd::awaiting::missing(&job).await.ok().flatten();
    let shaped = job.resolve_source().await.and_then(|source| {
        // The columns the decoding gives (a registry's schema, declared fields, metadata columns): what the
        // transforms' `input` has, and without transforms what every sink receives.
        println!(
            "ok    source columns: {}",
            crate::job::shaping::describe(&source.schema, &source.hidden)
        );
        Ok(crate::job::shaping::Shaping::of_job(&job, &source)?)
    });
    match shaped {
        Err(_) if waiting.is_some() => println!(
            "wait  source schema: {} does not exist yet: `ratchet run` waits for it; the sinks are checked \
             against the change events' columns once it exists",
            waiting.unwrap_or_default()
        ),
        Err(e) => report("source schema and transforms".into(), Err(e)),
        Ok(shaping) => {
            for stage in shaping.chain().stages() {
                report(
                    format!("transform {}", stage.name()),
                    Ok(crate::job::shaping::describe(stage.output_schema(), &[])),
                );
            }
            let budget = job.driver_config().budget();
            println!("timeout budget (each sink's transaction timeout must cover it):\n{budget}");
            let instances = match crate::job::assemble::instances_of_job(&job).await {
                Ok(instances) => instances,
                Err(e) => {
                    report("sinks routed by topic".into(), Err(e));
                    Vec::new()
                }
            };
            for spec in job
                .sinks
                .iter()
                .filter(|spec| crate::config::routed::is_routed(spec))
            {
                if !instances.iter().any(|i| i.entry == spec.id) {
                    report(
                        format!("sink {} ({}, {})", spec.id, spec.kind, spec.delivery.name()),
                        Ok(
                            "routed by topic; no topic is selected yet, so no instance to check"
                                .into(),
                        ),
                    );
                }
            }
            for instance in &instances {
                let spec = &instance.spec;
                let what = match &instance.route {
                    None => format!("sink {} ({}, {})", spec.id, spec.kind, spec.delivery.name()),
                    Some(topic) => format!(
                        "sink {} ({}, {}) for topic {topic}",
                        spec.id,
                        spec.kind,
                        spec.delivery.name()
                    ),
                };
                let schema = shaping.sink_schema(&instance.entry);
                if job.shapes_rows() {
                    println!(
                        "      {what} receives: {}",
                        crate::job::shaping::describe(&schema, &[])
                    );
                }
                let checked = registry
                    .check(spec, job_id.as_ref(), SubtaskId(0), schema)
                    .await
                    .map_err(anyhow::Error::from);
                let budgeted = checked.and_then(|checked| {
                    budget
                        .check(&spec.id, checked.transaction_timeout)
                        .map(|()| checked.summary)
                        .map_err(anyhow::Error::from)
                });
                report(what, budgeted);
            }
        }
    }
    if problems > 0 {
        bail!("{problems} problem(s) in {}", args.config.display());
    }
    println!("the job file is ready to run");
    Ok(())
}

/// The cluster answers, the topics exist (named ones) or what a pattern selects now, and how their partitions
/// spread over the subtasks.
async fn check_source(job: &JobConfig) -> Result<String> {
    let kafka = job.kafka()?;
    let brokers = kafka
        .check_reachable(KAFKA_REACHABLE_WITHIN)
        .await
        .map_err(anyhow::Error::from)?;
    let selection = job.selection()?;
    let named = selection.named();
    let metadata = kafka
        .topics_metadata(named.as_deref(), KAFKA_REACHABLE_WITHIN)
        .await
        .map_err(anyhow::Error::from)?;
    let selected: Vec<_> = metadata
        .iter()
        .filter(|(topic, m)| selection.selects(topic) && !m.partitions.is_empty())
        .collect();
    let now: BTreeSet<String> = selected.iter().map(|(t, _)| t.to_string()).collect();
    crate::job::preflight::check_topics(job, &now)?;
    if let Some(missing) = named
        .iter()
        .flatten()
        .find(|topic| !selected.iter().any(|(t, _)| t == topic))
    {
        if let Some(what) = crate::cmd::awaiting::missing(job).await? {
            return Ok(format!(
                "{brokers} broker(s); {what} does not exist yet: `ratchet run` waits for it"
            ));
        }
        bail!("topic {missing:?} does not exist (or has no partitions): create it first");
    }
    let partitions: usize = selected.iter().map(|(_, m)| m.partitions.len()).sum();
    let idle = job.job.subtasks as usize > partitions;
    let topics = match selected.as_slice() {
        [(topic, metadata)] => format!(
            "topic {topic:?} (id {}) has",
            metadata
                .id
                .map_or("unknown".to_string(), |id| id.to_string())
        ),
        many => format!(
            "{selection} ({} now: {}) have",
            many.len(),
            many.iter()
                .map(|(t, _)| t.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Ok(format!(
        "{brokers} broker(s); {topics} {partitions} partition(s) over {} subtask(s){}",
        job.job.subtasks,
        if idle {
            " (more subtasks than partitions: some subtasks will read nothing until partitions are added)"
        } else {
            ""
        }
    ))
}
