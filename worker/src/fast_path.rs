//! `[job] kafka_to_kafka = true`: a job whose only sink is an exactly-once Kafka topic on the source's cluster runs
//! `kafka_sink::KafkaToKafka` instead of the checkpoint driver: the source offsets are committed inside each
//! transaction (`send_offsets_to_transaction`), so there is no checkpoint store and no second commit round, and
//! records are copied as they are (key, value, headers; no decoding). Positions live in the consumer group
//! `ratchet-<job>`. One process, one subtask: a second process on the same job fences the first through the
//! shared transactional ids (its `init_transactions`), so the first stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Result, bail};
use connector_api::{DeliveryGuarantee, JobId, SinkBuilder, parse_settings};
use kafka_sink::{KafkaSinkConfig, KafkaSinkFactory, KafkaToKafka};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::RunArgs;
use crate::config::JobConfig;

/// Checks that `job` can run on the fast path.
///
/// # Errors
/// What keeps it from it, and what to change.
pub fn check(job: &JobConfig) -> Result<()> {
    let refuse = |why: &str| -> Result<()> {
        bail!(
            "[job] kafka_to_kafka = true needs {why}; remove kafka_to_kafka to run the job through checkpoints"
        )
    };
    let [sink] = job.sinks.as_slice() else {
        return refuse("exactly one [[sinks]] entry");
    };
    if sink.kind != KafkaSinkFactory::KIND || sink.delivery != DeliveryGuarantee::ExactlyOnce {
        return refuse("the sink to be an exactly-once Kafka sink");
    }
    if job.job.subtasks != 1 || job.dead_letter.is_some() {
        return refuse("subtasks = 1 and no [dead_letter] (records are copied undecoded)");
    }
    let config = sink_config(job)?;
    if config.bootstrap_servers != job.source.bootstrap_servers {
        return refuse("the sink on the source's cluster (the same bootstrap_servers)");
    }
    Ok(())
}

/// The sink's settings, with the job-scoped defaults when the job's name can scope them (the fast path keeps no
/// checkpoint store, so no job of it predates job scoping in a way that matters: its prefix was required then).
fn sink_config(job: &JobConfig) -> Result<KafkaSinkConfig> {
    let sink = &job.sinks[0];
    let job_id = JobId::new(&job.job.name).ok();
    let settings = kafka_sink::with_job_defaults(
        serde_json::Value::Object(sink.settings.clone()),
        job_id.as_ref(),
        &sink.id,
    );
    let mut config: KafkaSinkConfig = parse_settings(&sink.id, KafkaSinkFactory::KIND, settings)?;
    config.job.get_or_insert_with(|| job.job.name.clone());
    Ok(config)
}

/// Copies until a signal or `--exit-when-idle`.
///
/// # Errors
/// A failure of the copy (what was not committed is copied again by the next run).
pub async fn run(job: &JobConfig, args: &RunArgs) -> Result<()> {
    check(job)?;
    let stop = Arc::new(AtomicBool::new(false));
    let pipeline = KafkaToKafka {
        source_topic: job.source.topic.clone(),
        group_id: format!("ratchet-{}", job.job.name),
        sink: sink_config(job)?,
        commit_interval: job.job.checkpoint_interval,
        max_records_per_transaction: u64::MAX,
        stop_when_idle: args.exit_when_idle,
        stop_after_records: None,
        hook: None,
        stop: Some(stop.clone()),
    };
    tracing::info!(job = %job.job.name, "Kafka-to-Kafka fast path: offsets committed in each transaction");
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let copying = pipeline.run();
    tokio::pin!(copying);
    let stats = tokio::select! {
        stats = &mut copying => stats,
        _ = terminate.recv() => stop_then(&stop, &mut copying, &mut terminate, &mut interrupt).await,
        _ = interrupt.recv() => stop_then(&stop, &mut copying, &mut terminate, &mut interrupt).await,
    }
    .map_err(anyhow::Error::from)?;
    tracing::info!(
        records = stats.records,
        transactions = stats.transactions,
        "stopped"
    );
    Ok(())
}

async fn stop_then<F: std::future::Future>(
    stop: &AtomicBool,
    copying: &mut std::pin::Pin<&mut F>,
    terminate: &mut tokio::signal::unix::Signal,
    interrupt: &mut tokio::signal::unix::Signal,
) -> F::Output {
    tracing::info!(
        "stopping: committing the open transaction (a second SIGTERM/SIGINT stops at once)"
    );
    stop.store(true, Ordering::Relaxed);
    tokio::select! {
        stats = copying.as_mut() => stats,
        _ = terminate.recv() => crate::run::fast_exit(),
        _ = interrupt.recv() => crate::run::fast_exit(),
    }
}
