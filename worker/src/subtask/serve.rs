//! A started subtask's loop: read a batch, deliver it, checkpoint every `checkpoint_interval`, evolve the sinks at
//! a schema change, and end at a stop (after a last checkpoint) or at a topic the routed sinks have no instance
//! for; plus its metrics (gaps, lag) and the idle check's metadata refresh.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use connector_api::{Driver, Result, SinkHandle};
use kafka_source::{KafkaSource, SourceEvent};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use arrow_schema::SchemaRef;

use super::outputs::Outputs;
use super::{Ended, Served, Stop};
use crate::config::config_error;
use crate::job::assemble::SubtaskContext;
use crate::job::shaping::Shaping;
use crate::jobstore::subtask_store::SubtaskStore;

/// How long the loop waits for a batch before looking at the clock and the stop signal again.
const POLL: Duration = Duration::from_millis(100);

/// How often the consumer lag is measured (one watermark request per partition).
const LAG_EVERY: Duration = Duration::from_secs(5);

/// Reads, writes and checkpoints a started subtask until it is stopped (after a last checkpoint; the caller
/// closes the driver) or fails.
pub(super) async fn serve(
    context: &SubtaskContext,
    index: u32,
    driver: &mut Driver<SubtaskStore>,
    outputs: &Outputs,
    restored: &connector_api::Restored,
    mut stop: watch::Receiver<Stop>,
) -> Result<Served> {
    let job = &context.job;
    let options = context
        .source
        .options(job, context.share(index), outputs.dead_letter.is_some());
    let mut source = KafkaSource::open_topics(
        &context.kafka,
        job.selection().map_err(config_error)?,
        &restored.positions,
        options,
    )
    .await?;
    if let Some(topics) = &outputs.routed_topics {
        source.limit_topics(topics.clone());
    }
    // Idle time counts from when the subtask can read, not from its claim and recovery.
    let now = context.started.elapsed().as_millis() as u64;
    context
        .progress
        .last_activity_ms
        .store(now, Ordering::Relaxed);
    context.progress.last_cycle_ms.store(now, Ordering::Relaxed);
    let interval = job.job.checkpoint_interval;
    let label = outputs.label.clone();
    let mut lag_measured: Option<Instant> = None;
    let mut next_checkpoint = Instant::now() + interval;
    let mut written = false;
    // Replanned when the source's schema evolves.
    let mut shaping = context.shaping.clone();
    loop {
        let asked = *stop.borrow_and_update();
        match asked {
            Stop::No => {}
            Stop::Graceful => {
                if written {
                    checkpoint(driver, &source, context).await?;
                }
                return Ok(Served::Ended(Ended::Stopped));
            }
        }
        driver.record_pending_commit_age();
        tokio::select! {
            _ = stop.changed() => {}
            () = sleep_until(next_checkpoint) => {
                // With no new record, a checkpoint still makes deferred data visible (Iceberg's `commit_every`).
                if written || driver.holds_deferred() {
                    checkpoint(driver, &source, context).await?;
                    written = false;
                }
                let now = context.started.elapsed().as_millis() as u64;
                context.progress.last_cycle_ms.store(now, Ordering::Relaxed);
                report_refresh(&source, context);
                // Measured every LAG_EVERY; and, for the idle check, on a quiet subtask (nothing read since its
                // last refresh began) until it is seen caught up with that refresh. A busy one is not idle anyway,
                // so the hot path never reads watermarks more often than LAG_EVERY.
                let refreshed = context.progress.refreshed_ms.load(Ordering::Relaxed);
                let unproven = refreshed > context.progress.caught_up_ms.load(Ordering::Relaxed)
                    && context.progress.last_activity_ms.load(Ordering::Relaxed) <= refreshed;
                if unproven || lag_measured.is_none_or(|at| at.elapsed() >= LAG_EVERY) {
                    let began = context.started.elapsed().as_millis() as u64;
                    if measure_lag(&source, &label) {
                        context.progress.caught_up_ms.store(began.max(1), Ordering::Relaxed);
                    }
                    lag_measured = Some(Instant::now());
                }
                next_checkpoint = Instant::now() + interval;
            }
            event = source.next_event(POLL) => match event? {
                SourceEvent::Idle => {}
                SourceEvent::NewTopic(topic) => {
                    // Held back, and not in the positions: checkpointed without it, read again after the start.
                    if written {
                        checkpoint(driver, &source, context).await?;
                    }
                    return Ok(Served::NewTopic(topic));
                }
                SourceEvent::SchemaChange(schema) => {
                    // The source's schema gained columns: the batches before are checkpointed and committed, the
                    // sinks add the columns, then the batches of the new schema are written.
                    if written {
                        checkpoint(driver, &source, context).await?;
                        written = false;
                    }
                    tracing::info!(subtask = index, columns = schema.fields().len(),
                        "the source's schema changed: the sinks take the new schema");
                    shaping = Arc::new(shaping.replanned(job, &schema, &context.source)?);
                    evolve(driver, outputs, &shaping).await?;
                    source.accept_schema_change();
                }
                SourceEvent::Batch(batch) => {
                    let rows = batch.rows.num_rows() as u64;
                    count_gaps(batch.gaps, &label);
                    let shaped = shaping.shape(&batch.rows)?;
                    outputs.deliver(driver, &shaped, &batch.topic, &batch.rejected, &batch.tombstones).await?;
                    written = true;
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

/// Makes every sink take the schema of what it receives now (`shaping` planned for the source's new schema):
/// the sinks that receive the same schema in one driver call.
async fn evolve(
    driver: &mut Driver<SubtaskStore>,
    outputs: &Outputs,
    shaping: &Shaping,
) -> Result<()> {
    let mut groups: Vec<(SchemaRef, Vec<SinkHandle>)> = Vec::new();
    for output in &outputs.sinks {
        let schema = shaping.sink_schema(&output.entry);
        match groups.iter_mut().find(|(s, _)| *s == schema) {
            Some((_, handles)) => handles.push(output.handle),
            None => groups.push((schema, vec![output.handle])),
        }
    }
    for (schema, handles) in groups {
        driver.evolve(&handles, schema).await?;
    }
    Ok(())
}

/// Checkpoints what was read up to the source's positions (the driver records the protocol's metrics), reports
/// the decided positions to the lag group, and counts it for the progress line.
async fn checkpoint(
    driver: &mut Driver<SubtaskStore>,
    source: &KafkaSource,
    context: &SubtaskContext,
) -> Result<()> {
    let positions = source.positions();
    driver.checkpoint(positions.clone()).await?;
    if let Some(lag) = &context.lag {
        lag.report(positions);
    }
    context.progress.checkpoints.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Counts the records a gap skipped (`on_gap = "earliest"`; the source logged each).
fn count_gaps(gaps: Vec<kafka_source::Gap>, label: &str) {
    for gap in gaps {
        metrics::counter!(crate::ops::telemetry::SOURCE_GAP_RECORDS, "subtask" => label.to_string(),
            "topic" => gap.topic.clone(), "partition" => gap.partition.to_string())
        .increment(gap.skipped().max(0) as u64);
    }
}

/// Sets the consumer-lag gauge of every partition the source reads (partitions added while running included) and
/// the partition count; whether the source has handed out everything up to every partition's end now. A failure
/// only skips this measurement (and says `false`).
fn measure_lag(source: &KafkaSource, label: &str) -> bool {
    metrics::gauge!(crate::ops::telemetry::SOURCE_PARTITIONS, "subtask" => label.to_string())
        .set(source.partitions().len() as f64);
    let marks = match tokio::task::block_in_place(|| source.watermarks()) {
        Ok(marks) => marks,
        Err(e) => {
            tracing::debug!(error = %connector_api::Report(&e), "cannot measure the consumer lag");
            return false;
        }
    };
    for (at, &marks) in &marks {
        metrics::gauge!(crate::ops::telemetry::CONSUMER_LAG, "subtask" => label.to_string(),
            "topic" => at.topic.clone(), "partition" => at.partition.to_string())
        .set(source.lag(at, marks) as f64);
    }
    source.reached(&marks)
}

/// Passes the idle check's wish for a metadata refresh on to the source, and tells it when the last one began.
fn report_refresh(source: &KafkaSource, context: &SubtaskContext) {
    if context
        .progress
        .refresh_wanted
        .swap(false, Ordering::Relaxed)
    {
        source.ask_refresh();
    }
    if let Some(at) = source.refreshed_at() {
        let ms = at.saturating_duration_since(context.started).as_millis() as u64;
        context.progress.refreshed_ms.store(ms, Ordering::Relaxed);
    }
}
