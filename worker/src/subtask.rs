//! One subtask of a job, run by whichever process holds its lease: claim and recover it through the driver, read
//! its share of the partitions from the restored positions, write every batch to every sink, checkpoint every
//! `checkpoint_interval`, and stop when told, after a last checkpoint. (Stopping at once needs nothing here: the
//! process exits, and the next owner's recovery resolves what was in flight.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use connector_api::{Driver, Error, ErrorKind, Phase, Result, SinkHandle, SinkRegistry, SubtaskId};
use kafka_source::{KafkaConnection, KafkaSource, PartitionShare};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use crate::config::JobConfig;
use crate::store::SubtaskStore;

/// How long the loop waits for a batch before looking at the clock and the stop signal again.
const POLL: Duration = Duration::from_millis(100);

/// How often the consumer lag is measured (one watermark request per partition).
const LAG_EVERY: Duration = Duration::from_secs(5);

/// How a running subtask is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Keep running.
    No,
    /// Checkpoint what was written (commit it), then close: for a graceful shutdown and for handing the subtask
    /// to another process.
    Graceful,
}

/// How a subtask run ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Stopped as asked.
    Stopped,
    /// Another process claimed the subtask (this one's saves were fenced): it is that process's now.
    TakenOver,
}

/// Counters of one subtask run, read by the progress line, the idle check and the restart policy.
#[derive(Debug)]
pub struct Progress {
    /// Records read and written to every sink.
    pub records: AtomicU64,
    /// Checkpoints decided.
    pub checkpoints: AtomicU64,
    /// When a record was last read, or the run started (milliseconds since the process started): for the idle
    /// check.
    pub last_activity_ms: AtomicU64,
    /// When this run read its first record (milliseconds since the process started; `u64::MAX`: none yet).
    pub first_record_ms: AtomicU64,
    /// When this run read its last record so far (milliseconds since the process started; 0: none yet).
    pub last_record_ms: AtomicU64,
}

impl Progress {
    /// The counters of a run starting `now` (milliseconds since the process started).
    pub fn starting_at(now: u64) -> Self {
        Self {
            records: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            last_activity_ms: AtomicU64::new(now),
            first_record_ms: AtomicU64::new(u64::MAX),
            last_record_ms: AtomicU64::new(0),
        }
    }
}

/// What a subtask needs to run.
#[derive(Clone)]
pub struct SubtaskContext {
    /// The job file.
    pub job: Arc<JobConfig>,
    /// The sink factories.
    pub registry: Arc<SinkRegistry>,
    /// The source's Kafka connection.
    pub kafka: KafkaConnection,
    /// This run's counters.
    pub progress: Arc<Progress>,
    /// When the process started (the origin of [`Progress`]'s times).
    pub started: std::time::Instant,
    /// A crash drill ([`crate::drill`]).
    pub drill: Option<connector_api::FaultInjector>,
}

/// Runs subtask `index` until `stop` says so, another process takes it over (a claim or a sink fenced this one:
/// [`Ended::TakenOver`]), or an error.
///
/// # Errors
/// Whatever the store, a sink or the source reports; the driver has then stopped, and running the subtask again
/// recovers what the failure left.
pub async fn run(
    context: &SubtaskContext,
    index: u32,
    stop: watch::Receiver<Stop>,
) -> Result<Ended> {
    match run_until_stopped(context, index, stop).await {
        Err(e) if e.kind() == ErrorKind::Fenced => {
            tracing::warn!(subtask = index, error = %connector_api::Report(&e),
                "another process took this subtask over; stopping it here");
            Ok(Ended::TakenOver)
        }
        outcome => outcome,
    }
}

async fn run_until_stopped(
    context: &SubtaskContext,
    index: u32,
    mut stop: watch::Receiver<Stop>,
) -> Result<Ended> {
    let job = &context.job;
    let subtask = SubtaskId(index);
    let schema = job.schema().map_err(config_error)?;
    let store = SubtaskStore::open(&job.store, &job.job.name, subtask).await?;
    let mut driver = Driver::new(store, job.driver_config());
    if let Some(drill) = &context.drill {
        driver = driver.with_fault_injector(drill.clone());
    }
    let mut sinks: Vec<SinkHandle> = Vec::with_capacity(job.sinks.len());
    for spec in &job.sinks {
        let sink = context
            .registry
            .build(spec, subtask, schema.clone())
            .await?;
        sinks.push(driver.add_dyn_sink(sink)?);
    }
    let restored = driver.start().await?;
    tracing::info!(subtask = index, owner = restored.owner.0, resumed_after = ?restored.checkpoint,
        "subtask claimed and recovered");
    let mut options = job.source_options();
    options.share = Some(PartitionShare {
        index,
        of: job.job.subtasks,
    });
    let mut source = tokio::task::block_in_place(|| {
        KafkaSource::open_with(
            &context.kafka,
            &job.source.topic,
            &restored.positions,
            options,
        )
    })?;
    let interval = job.job.checkpoint_interval;
    let label = index.to_string();
    let sink_labels: Vec<String> = job.sinks.iter().map(|s| s.id.to_string()).collect();
    let mut lag_measured: Option<Instant> = None;
    let mut next_checkpoint = Instant::now() + interval;
    let mut written = false;
    loop {
        let asked = *stop.borrow_and_update();
        match asked {
            Stop::No => {}
            Stop::Graceful => {
                if written {
                    checkpoint(&mut driver, &source, context, &label).await?;
                }
                driver.close().await?;
                tracing::info!(subtask = index, "subtask stopped after its last checkpoint");
                return Ok(Ended::Stopped);
            }
        }
        let pending = driver
            .commit_in_flight()
            .map_or(0.0, |(_, age)| age.as_secs_f64());
        metrics::gauge!(crate::telemetry::PENDING_COMMIT_AGE, "subtask" => label.clone())
            .set(pending);
        tokio::select! {
            _ = stop.changed() => {}
            () = sleep_until(next_checkpoint) => {
                if written {
                    checkpoint(&mut driver, &source, context, &label).await?;
                    written = false;
                }
                if lag_measured.is_none_or(|at| at.elapsed() >= LAG_EVERY) {
                    measure_lag(&source, &label);
                    lag_measured = Some(Instant::now());
                }
                next_checkpoint = Instant::now() + interval;
            }
            batch = source.next_batch(POLL) => {
                if let Some(batch) = batch? {
                    let rows = batch.num_rows() as u64;
                    for (&sink, id) in sinks.iter().zip(&sink_labels) {
                        driver.write(sink, &batch).await?;
                        metrics::counter!(crate::telemetry::RECORDS_OUT, "subtask" => label.clone(), "sink" => id.clone())
                            .increment(rows);
                    }
                    written = true;
                    metrics::counter!(crate::telemetry::RECORDS_IN, "subtask" => label.clone()).increment(rows);
                    metrics::counter!(crate::telemetry::BYTES_IN, "subtask" => label.clone())
                        .increment(batch.get_array_memory_size() as u64);
                    context.progress.records.fetch_add(rows, Ordering::Relaxed);
                    let now = context.started.elapsed().as_millis() as u64;
                    context.progress.last_activity_ms.store(now, Ordering::Relaxed);
                    context.progress.first_record_ms.fetch_min(now, Ordering::Relaxed);
                    context.progress.last_record_ms.store(now, Ordering::Relaxed);
                }
            }
        }
    }
}

async fn checkpoint(
    driver: &mut Driver<SubtaskStore>,
    source: &KafkaSource,
    context: &SubtaskContext,
    label: &str,
) -> Result<()> {
    let started = Instant::now();
    driver.checkpoint(source.positions()).await?;
    metrics::histogram!(crate::telemetry::CHECKPOINT_SECONDS, "subtask" => label.to_string())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(crate::telemetry::CHECKPOINTS, "subtask" => label.to_string()).increment(1);
    context.progress.checkpoints.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Sets the consumer-lag gauge of every partition of the source; a failure only skips this measurement.
fn measure_lag(source: &KafkaSource, label: &str) {
    let highs = match tokio::task::block_in_place(|| source.high_watermarks()) {
        Ok(highs) => highs,
        Err(e) => {
            tracing::debug!(error = %connector_api::Report(&e), "cannot measure the consumer lag");
            return;
        }
    };
    for position in source.positions() {
        if let Some(high) = highs.get(&position.partition) {
            metrics::gauge!(crate::telemetry::CONSUMER_LAG, "subtask" => label.to_string(),
                "partition" => position.partition.to_string())
            .set((high - position.next_offset).max(0) as f64);
        }
    }
}

fn config_error(e: anyhow::Error) -> Error {
    Error::new(ErrorKind::Config, Phase::Setup, format!("{e:#}"))
}
