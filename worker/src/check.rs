//! `ratchet check-config`: everything `ratchet run` would check at start, without running the job, reported as
//! one line per check and every problem at once.

use std::time::Duration;

use anyhow::{Result, bail};
use connector_api::{CheckpointStore, Driver, Report, SubtaskId};
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::cli::CheckArgs;
use crate::config::JobConfig;
use crate::run::KAFKA_REACHABLE_WITHIN;
use crate::store::SubtaskStore;

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
    let identity =
        crate::store::job_identity(&job.store, &job.job.name, job.job.subtasks, false).await;
    let job_id = identity
        .as_ref()
        .ok()
        .and_then(|i| i.job_id(&job.job.name).ok().flatten());
    let counted = identity.map(|_| {
        format!(
            "{} subtask(s), as the store records (or a fresh job)",
            job.job.subtasks
        )
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
    report("subtask count".into(), counted);
    // Read-only: a fresh job stays fresh (no directory, no table is created).
    let store = match SubtaskStore::open_existing(&job.store, &job.job.name, SubtaskId(0)).await {
        Ok(None) => {
            report(
                "checkpoint store".into(),
                Ok("reachable; no checkpoint of this job yet (a fresh job)".into()),
            );
            None
        }
        Ok(Some(store)) => match store.load().await {
            Ok(loaded) => {
                report(
                    "checkpoint store".into(),
                    Ok(format!(
                        "reachable; subtask 0's last checkpoint: {}",
                        loaded
                            .record
                            .map_or("none (a fresh job)".to_string(), |r| r.id.to_string())
                    )),
                );
                Some(store)
            }
            Err(e) => {
                report(
                    "checkpoint store".into(),
                    Err(anyhow::anyhow!("{}", Report(&e))),
                );
                None
            }
        },
        Err(e) => {
            report(
                "checkpoint store".into(),
                Err(anyhow::anyhow!("{}", Report(&e))),
            );
            None
        }
    };
    let registry = crate::sinks::registry();
    match (job.schema(), store) {
        (Err(e), _) => report("source schema".into(), Err(e)),
        (Ok(schema), store) => {
            let mut driver = store.map(|store| Driver::new(store, job.driver_config()));
            for spec in &job.sinks {
                let what = format!("sink {} ({}, {:?})", spec.id, spec.kind, spec.delivery);
                match registry
                    .build(spec, job_id.as_ref(), SubtaskId(0), schema.clone())
                    .await
                {
                    Ok(sink) => {
                        let added = driver.as_mut().map(|d| d.add_dyn_sink(sink)).transpose();
                        report(
                            what,
                            added
                                .map(|_| "settings valid, server reachable".to_string())
                                .map_err(|e| anyhow::anyhow!("{}", Report(&e))),
                        );
                    }
                    Err(e) => report(what, Err(anyhow::anyhow!("{}", Report(&e)))),
                }
            }
            if let Some(driver) = driver {
                report(
                    "transaction-timeout budget".into(),
                    driver
                        .check_budget()
                        .map(|()| {
                            "every sink's transaction outlives the worst-case wait for its commit"
                                .into()
                        })
                        .map_err(|e| anyhow::anyhow!("{}", Report(&e))),
                );
            }
        }
    }
    if problems > 0 {
        bail!("{problems} problem(s) in {}", args.config.display());
    }
    println!("the job file is ready to run");
    Ok(())
}

/// The cluster answers, the topic exists, and how its partitions spread over the subtasks.
async fn check_source(job: &JobConfig) -> Result<String> {
    let kafka = job.kafka()?;
    let brokers = kafka
        .check_reachable(KAFKA_REACHABLE_WITHIN)
        .await
        .map_err(|e| anyhow::anyhow!("{}", Report(&e)))?;
    let topic = job.source.topic.clone();
    let partitions = tokio::task::spawn_blocking(move || -> Result<usize> {
        let consumer: BaseConsumer = kafka.consumer_config().create()?;
        let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(15))?;
        Ok(metadata.topics().iter().map(|t| t.partitions().len()).sum())
    })
    .await??;
    if partitions == 0 {
        bail!(
            "topic {:?} does not exist (or has no partitions): create it first",
            job.source.topic
        );
    }
    let idle = job.job.subtasks as usize > partitions;
    Ok(format!(
        "{brokers} broker(s); topic {:?} has {partitions} partition(s) over {} subtask(s){}",
        job.source.topic,
        job.job.subtasks,
        if idle {
            " (more subtasks than partitions: some subtasks will read nothing)"
        } else {
            ""
        }
    ))
}
