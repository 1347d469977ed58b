//! `[job] kafka_to_kafka = true`: a job whose only sink is an exactly-once Kafka topic on the source's cluster runs
//! `kafka_sink::KafkaToKafka` instead of the checkpoint driver: the source offsets are committed inside each
//! transaction (`send_offsets_to_transaction`), so there is no checkpoint store and no second commit round, and
//! records are copied as they are (key, value, headers; no decoding). Positions live in the consumer group
//! `ratchet-<job>`. One process, one subtask: a second process on the same job fences the first through the
//! shared transactional ids (its `init_transactions`), so the first stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use kafka_sink::KafkaToKafka;
use tokio::signal::unix::{SignalKind, signal};

use crate::config::JobConfig;

/// Copies until a signal or `--exit-when-idle`.
///
/// # Errors
/// A failure of the copy (what was not committed is copied again by the next run).
pub async fn run(job: &JobConfig, exit_when_idle: Option<std::time::Duration>) -> Result<()> {
    job.check_kafka_to_kafka()?;
    let stop = Arc::new(AtomicBool::new(false));
    let pipeline = KafkaToKafka {
        source_topic: job
            .source
            .single_topic()
            .expect("check_kafka_to_kafka: one topic")
            .to_string(),
        group_id: format!("ratchet-{}", job.job.name),
        sink: job.kafka_to_kafka_sink()?,
        commit_interval: job.job.checkpoint_interval,
        max_records_per_transaction: u64::MAX,
        stop_when_idle: exit_when_idle,
        stop_after_records: None,
        hook: None,
        observer: Some(metrics_of(&job.sinks[0].id)),
        stop: Some(stop.clone()),
    };
    metrics::gauge!(crate::ops::telemetry::SUBTASKS_RUNNING).set(1.0);
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
    metrics::gauge!(crate::ops::telemetry::SUBTASKS_RUNNING).set(0.0);
    crate::ops::telemetry::log_stopped(
        stats.records,
        stats.transactions,
        stats.first_record_at,
        stats.last_record_at,
    );
    Ok(())
}

/// Records the driver path's series for each committed transaction, as subtask 0 with the one sink: records in
/// and out, one checkpoint, and the transaction's closing (flush, offsets, commit) as both the checkpoint's and
/// the sink's commit time (the fast path decides and commits in one step).
fn metrics_of(sink: &connector_api::SinkId) -> kafka_sink::CommitObserver {
    let sink = sink.to_string();
    Arc::new(move |committed: &kafka_sink::CommittedTransaction| {
        let seconds = committed.closing.as_secs_f64();
        metrics::counter!(crate::ops::telemetry::RECORDS_IN, "subtask" => "0")
            .increment(committed.records);
        metrics::counter!(crate::ops::telemetry::RECORDS_OUT, "subtask" => "0", "sink" => sink.clone())
            .increment(committed.records);
        metrics::counter!(connector_api::metrics::CHECKPOINTS, "subtask" => "0").increment(1);
        metrics::histogram!(connector_api::metrics::CHECKPOINT_SECONDS, "subtask" => "0")
            .record(seconds);
        metrics::histogram!(connector_api::metrics::COMMIT_SECONDS, "subtask" => "0", "sink" => sink.clone())
            .record(seconds);
    })
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
        _ = terminate.recv() => crate::ops::signals::fast_exit(),
        _ = interrupt.recv() => crate::ops::signals::fast_exit(),
    }
}
