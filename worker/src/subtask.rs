//! One subtask of a job, run by whichever process holds its lease: claim and recover it through the driver, read
//! its share of the partitions from the restored positions, write every batch to every sink, checkpoint every
//! `checkpoint_interval`, and stop when told, after a last checkpoint. (Stopping at once needs nothing here: the
//! process exits, and the next owner's recovery resolves what was in flight.)

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arrow_array::RecordBatch;
use connector_api::{
    Driver, Error, ErrorKind, Phase, Result, SinkHandle, SinkId, SinkRegistry, SinkSpec,
    SinksForRecord, SubtaskId,
};
use kafka_source::{KafkaConnection, KafkaSource, PartitionShare, RejectedRecord, Tombstone};
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
    /// When this run last completed its checkpoint cycle: a checkpoint, or an interval with nothing to checkpoint
    /// (milliseconds since the process started; `u64::MAX`: still recovering). For `/ready`.
    pub last_cycle_ms: AtomicU64,
    /// When the source's last metadata refresh began (milliseconds since the process started; 0: none yet): the
    /// idle check counts a subtask idle only once a refresh began after its idle time was up, so partitions or
    /// topics added meanwhile are found first.
    pub refreshed_ms: AtomicU64,
    /// Set by the idle check: the source should refresh its metadata now.
    pub refresh_wanted: AtomicBool,
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
            last_cycle_ms: AtomicU64::new(u64::MAX),
            refreshed_ms: AtomicU64::new(0),
            refresh_wanted: AtomicBool::new(false),
        }
    }
}

/// What a subtask needs to run.
#[derive(Clone)]
pub struct SubtaskContext {
    /// The job file.
    pub job: Arc<JobConfig>,
    /// What the sinks are scoped by (`None`: the sink ids alone, for a job from before job scoping).
    pub job_id: Option<connector_api::JobId>,
    /// The job's layout generation ([`crate::rescale`]): where its checkpoint records are.
    pub generation: u64,
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
    /// Where decided positions also go, for lag in the usual tools (`None`: `lag_group = ""`).
    pub lag: Option<crate::lag::LagReporter>,
}

/// Runs subtask `index` until `stop` says so, another process takes it over (a claim or a sink fenced this one:
/// [`Ended::TakenOver`]), or an error. A topic that a routed sink has no instance for yet, read while running,
/// starts the subtask again with one ([`crate::routing`]), after a checkpoint of what was read before it.
///
/// # Errors
/// Whatever the store, a sink or the source reports; the driver has then stopped, and running the subtask again
/// recovers what the failure left.
pub async fn run(
    context: &SubtaskContext,
    index: u32,
    stop: watch::Receiver<Stop>,
) -> Result<Ended> {
    let mut new_topics = BTreeSet::new();
    loop {
        match run_until_stopped(context, index, stop.clone(), &new_topics).await {
            Ok(Served::Ended(ended)) => return Ok(ended),
            Ok(Served::NewTopic(topic)) => {
                tracing::info!(subtask = index, %topic,
                    "read a topic the routed sinks have no instance for yet: starting the subtask again with one");
                new_topics.insert(topic);
            }
            Err(e) if e.kind() == ErrorKind::Fenced => {
                tracing::warn!(subtask = index, error = %connector_api::Report(&e),
                    "another process took this subtask over; stopping it here");
                return Ok(Ended::TakenOver);
            }
            Err(e) => return Err(e),
        }
    }
}

/// How serving a subtask ended without an error.
enum Served {
    /// As [`Ended`] says.
    Ended(Ended),
    /// A batch of this topic came, and a routed sink has no instance for it: what was read before it is
    /// checkpointed, and the subtask must start again with the instance.
    NewTopic(String),
}

async fn run_until_stopped(
    context: &SubtaskContext,
    index: u32,
    mut stop: watch::Receiver<Stop>,
    new_topics: &BTreeSet<String>,
) -> Result<Served> {
    let topics = match routed_specs(&context.job).is_empty() {
        true => BTreeSet::new(),
        false => {
            let selection = context.job.selection().map_err(config_error)?;
            let mut held =
                KafkaSource::topics_held(&context.kafka, &selection, Some(share(context, index)))
                    .await?;
            held.extend(new_topics.iter().cloned());
            // Routed names must not collide across the whole job, not only within this subtask's share (`x-y`
            // here and `x_y` in another subtask would both write `x_y`).
            let mut everywhere = KafkaSource::topics_held(&context.kafka, &selection, None).await?;
            everywhere.extend(held.iter().cloned());
            crate::routing::instances(&context.job.sinks, &everywhere).map_err(config_error)?;
            held
        }
    };
    let (mut driver, prepared) = build(context, index, &topics).await?;
    // Claiming can wait for another process's recovery (or an orphaned claim, until the server ends it): a stop
    // asked meanwhile drops the attempt, which is safe at any point (the next owner's recovery resolves it).
    let restored = tokio::select! {
        restored = driver.start_adding(instances_for_record(context, index, &topics, &prepared)) => restored?,
        _ = stop.wait_for(|asked| *asked == Stop::Graceful) => {
            tracing::info!(subtask = index, "stopped while claiming or recovering the subtask");
            return Ok(Served::Ended(Ended::Stopped));
        }
    };
    tracing::info!(subtask = index, owner = restored.owner.0, resumed_after = ?restored.checkpoint,
        "subtask claimed and recovered");
    let outputs = prepared.outputs(&driver, &context.job, index, topics, &restored)?;
    match serve(context, index, &mut driver, &outputs, &restored, stop).await {
        Ok(served @ (Served::Ended(Ended::Stopped) | Served::NewTopic(_))) => {
            driver.close().await?;
            if matches!(served, Served::Ended(_)) {
                tracing::info!(subtask = index, "subtask stopped after its last checkpoint");
            }
            Ok(served)
        }
        Err(e) if e.kind() == ErrorKind::Fenced => {
            Err(fenced_or_expired(driver.taken_over(), e).await)
        }
        Err(e) => Err(taken_over_meanwhile(driver.taken_over(), e).await),
        outcome => outcome,
    }
}

fn share(context: &SubtaskContext, index: u32) -> PartitionShare {
    PartitionShare {
        index,
        of: context.job.job.subtasks,
    }
}

/// The job's sink entries routed by topic.
fn routed_specs(job: &JobConfig) -> Vec<SinkSpec> {
    job.sinks
        .iter()
        .filter(|spec| crate::routing::is_routed(spec))
        .cloned()
        .collect()
}

/// The topics the source positions of `restored` name.
fn topics_of(positions: &[connector_api::SourceOffset]) -> BTreeSet<String> {
    positions.iter().map(|p| p.topic.clone()).collect()
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

/// Builds, once the driver has loaded the restored record under the claim, the routed sinks' instances for the
/// topics it has positions for that `built` lacks: their decided work is committed by recovery, and they take the
/// topics' batches afterwards.
fn instances_for_record(
    context: &SubtaskContext,
    index: u32,
    built: &BTreeSet<String>,
    prepared: &Prepared,
) -> SinksForRecord {
    let routed = routed_specs(&context.job);
    let built = built.clone();
    let (registry, job_id, schema) = (
        context.registry.clone(),
        context.job_id.clone(),
        prepared.schema.clone(),
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
            for instance in crate::routing::instances(&routed, &missing).map_err(config_error)? {
                sinks.push(
                    registry
                        .build(
                            &instance.spec,
                            job_id.as_ref(),
                            SubtaskId(index),
                            schema.clone(),
                        )
                        .await?,
                );
            }
            Ok(sinks)
        })
    })
}

/// A failure that is not a fence, checked against the store: when another process claimed the subtask
/// meanwhile, the failure is the take-over's doing (a sink's fence that surfaced as something else) and is
/// reported as [`Fenced`](ErrorKind::Fenced), so this process does not run the subtask again and fence the new
/// owner in turn. Otherwise, or when the store cannot answer, the failure as it was.
async fn taken_over_meanwhile(taken_over: impl Future<Output = Result<bool>>, e: Error) -> Error {
    match taken_over.await {
        Ok(true) => Error::new(
            ErrorKind::Fenced,
            e.phase(),
            "the subtask failed after another process claimed it: taken over",
        )
        .with_source(e),
        Ok(false) | Err(_) => e,
    }
}

/// What [`build`] leaves for after the start: what the source's batches look like and the dead-letter sink.
struct Prepared {
    schema: arrow_schema::SchemaRef,
    dead_letter: Option<SinkHandle>,
}

impl Prepared {
    /// Where the batches go once the driver started: every sink entry of `job`, routed ones as their instances
    /// for the `topics` built before the start and for those of the `restored` positions (built during it).
    fn outputs(
        &self,
        driver: &Driver<SubtaskStore>,
        job: &JobConfig,
        index: u32,
        mut topics: BTreeSet<String>,
        restored: &connector_api::Restored,
    ) -> Result<Outputs> {
        let routed = job.sinks.iter().any(crate::routing::is_routed);
        if routed {
            topics.extend(topics_of(&restored.positions));
        }
        let mut sinks = Vec::new();
        for instance in crate::routing::instances(&job.sinks, &topics).map_err(config_error)? {
            let handle = driver.handle_of(&instance.spec.id).ok_or_else(|| {
                Error::bug(
                    Phase::Setup,
                    format!("sink {} was not added to the driver", instance.spec.id),
                )
            })?;
            sinks.push(Output {
                handle,
                id: instance.spec.id,
                route: instance.route,
            });
        }
        Ok(Outputs {
            sinks,
            routed_topics: routed.then_some(topics),
            dead_letter: self.dead_letter,
            label: index.to_string(),
        })
    }
}

/// The driver with every sink of the job (routed entries as their instances for `topics`) and the dead-letter
/// sink, not started.
async fn build(
    context: &SubtaskContext,
    index: u32,
    topics: &BTreeSet<String>,
) -> Result<(Driver<SubtaskStore>, Prepared)> {
    let job = &context.job;
    let subtask = SubtaskId(index);
    let schema = job.schema().await.map_err(config_error)?;
    let store = SubtaskStore::open(
        &job.store,
        &job.job.name,
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
        &schema,
    )
    .await?;
    Ok((
        driver,
        Prepared {
            schema,
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
    schema: &arrow_schema::SchemaRef,
) -> Result<Option<SinkHandle>> {
    for instance in crate::routing::instances(&job.sinks, topics).map_err(config_error)? {
        let sink = registry
            .build(&instance.spec, job_id, subtask, schema.clone())
            .await?;
        driver.add_dyn_sink(sink)?;
    }
    match &job.dead_letter {
        Some(config) => Ok(Some(
            driver.add_dyn_sink(crate::dead_letter::sink(job, config, subtask)?)?,
        )),
        None => Ok(None),
    }
}

/// A sink or the store reported this instance fenced: a take-over (the store's owner epoch is newer), returned
/// as it is; or, when the store says this process still owns the subtask, the sink's own transaction expired or
/// was fenced by something else (a Kafka transaction the broker aborted after `transaction_timeout`): a failure,
/// counted toward `max_restarts`, whose restart recovers it.
async fn fenced_or_expired(taken_over: impl Future<Output = Result<bool>>, e: Error) -> Error {
    match taken_over.await {
        Ok(false) => Error::new(
            ErrorKind::Fatal,
            e.phase(),
            "a sink reported this instance fenced, but the checkpoint store says this process still owns the \
             subtask: nobody took it over, so the sink's transaction expired or was fenced by something else \
             (for Kafka: the broker aborts a transaction open longer than transaction_timeout); restarting, and \
             recovery resolves what was decided",
        )
        .with_source(e),
        Ok(true) => e,
        Err(store) => {
            tracing::warn!(error = %connector_api::Report(&store),
                "cannot ask the checkpoint store who owns the subtask; treating the fence as a take-over");
            e
        }
    }
}

/// Reads, writes and checkpoints a started subtask until it is stopped (after a last checkpoint; the caller
/// closes the driver) or fails.
async fn serve(
    context: &SubtaskContext,
    index: u32,
    driver: &mut Driver<SubtaskStore>,
    outputs: &Outputs,
    restored: &connector_api::Restored,
    mut stop: watch::Receiver<Stop>,
) -> Result<Served> {
    let job = &context.job;
    let mut options = job.source_options().await.map_err(config_error)?;
    options.share = Some(share(context, index));
    options.divert_bad_records = outputs.dead_letter.is_some();
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
                if lag_measured.is_none_or(|at| at.elapsed() >= LAG_EVERY) {
                    measure_lag(&source, &label);
                    lag_measured = Some(Instant::now());
                }
                next_checkpoint = Instant::now() + interval;
            }
            batch = source.next_batch(POLL) => {
                let batch = batch?;
                if let Some(topic) = source.unexpected_topic() {
                    // Held back, and not in the positions: checkpointed without it, read again after the start.
                    let topic = topic.to_string();
                    if written {
                        checkpoint(driver, &source, context).await?;
                    }
                    return Ok(Served::NewTopic(topic));
                }
                if let Some(schema) = source.schema_change() {
                    // The source's schema gained columns: the batches before are checkpointed and committed, the
                    // sinks add the columns, then the batches of the new schema are written.
                    if written {
                        checkpoint(driver, &source, context).await?;
                        written = false;
                    }
                    tracing::info!(subtask = index, columns = schema.fields().len(),
                        "the source's schema changed: the sinks take the new columns");
                    let sinks: Vec<SinkHandle> = outputs.sinks.iter().map(|output| output.handle).collect();
                    driver.evolve(&sinks, schema).await?;
                    source.accept_schema_change();
                }
                if let Some(batch) = batch {
                    let rows = batch.num_rows() as u64;
                    count_gaps(source.take_gaps(), &label);
                    let rejected = source.take_rejected();
                    let tombstones = source.take_tombstones();
                    outputs.deliver(driver, &batch, source.batch_topic(), &rejected, &tombstones).await?;
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

/// One sink a subtask writes to.
struct Output {
    handle: SinkHandle,
    id: SinkId,
    /// The topic whose batches it takes (a routed sink's instance); `None`: every batch.
    route: Option<String>,
}

impl Output {
    fn takes(&self, topic: &str) -> bool {
        self.route.as_deref().is_none_or(|route| route == topic)
    }
}

/// Where a subtask's batches go.
struct Outputs {
    /// The job's sinks (routed entries as their instances).
    sinks: Vec<Output>,
    /// The topics the routed sinks have instances for (`None`: no sink is routed).
    routed_topics: Option<BTreeSet<String>>,
    /// The dead-letter sink, when the job has one.
    dead_letter: Option<SinkHandle>,
    /// The subtask, as a metrics label.
    label: String,
}

impl Outputs {
    /// Writes `batch` to every sink, then the source's `tombstones` (which came after the batch's rows) to every
    /// sink that can express a deletion (the others skip them, counted), and the source's `rejected` records and
    /// the rows a sink refuses to the dead-letter sink (when there is one; otherwise a refused batch stops the
    /// subtask, the record named).
    async fn deliver(
        &self,
        driver: &mut Driver<SubtaskStore>,
        batch: &RecordBatch,
        topic: &str,
        rejected: &[RejectedRecord],
        tombstones: &[Tombstone],
    ) -> Result<()> {
        self.deliver_rows(driver, batch, topic, rejected).await?;
        if tombstones.is_empty() {
            return Ok(());
        }
        let keys: Vec<Option<Vec<u8>>> = tombstones.iter().map(|t| t.key.clone()).collect();
        for Output {
            handle: sink, id, ..
        } in self.sinks.iter().filter(|o| o.takes(topic))
        {
            let (outcome, refused) = match driver.write_tombstones(*sink, &keys).await {
                Ok(true) => ("written", 0),
                Ok(false) => ("skipped", 0),
                Err(e) if e.kind() == ErrorKind::BadRecord && self.dead_letter.is_some() => (
                    "written",
                    self.refuse_tombstones(driver, *sink, id, tombstones)
                        .await?,
                ),
                Err(e) => return Err(e),
            };
            metrics::counter!(crate::telemetry::TOMBSTONES, "subtask" => self.label.clone(),
                "sink" => id.to_string(), "outcome" => outcome)
            .increment((keys.len() - refused) as u64);
        }
        Ok(())
    }

    /// A sink refused some of `tombstones` (a key it cannot read): writes them one by one, and each it refuses
    /// goes to the dead-letter topic, naming the sink and why. Returns how many went there.
    async fn refuse_tombstones(
        &self,
        driver: &mut Driver<SubtaskStore>,
        sink: SinkHandle,
        id: &SinkId,
        tombstones: &[Tombstone],
    ) -> Result<usize> {
        let Some(dead_letter) = self.dead_letter else {
            return Ok(0);
        };
        let mut refused = Vec::new();
        for tombstone in tombstones {
            match driver
                .write_tombstones(sink, std::slice::from_ref(&tombstone.key))
                .await
            {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::BadRecord => {
                    refused.push((tombstone.clone(), connector_api::Report(&e).to_string()));
                }
                Err(e) => return Err(e),
            }
        }
        let letters = crate::dead_letter::from_refused_tombstones(&refused, id)?;
        driver
            .write(dead_letter, &letters)
            .await
            .map_err(refused_dead_letter)?;
        self.count_dead_letters(refused.len());
        Ok(refused.len())
    }

    async fn deliver_rows(
        &self,
        driver: &mut Driver<SubtaskStore>,
        batch: &RecordBatch,
        topic: &str,
        rejected: &[RejectedRecord],
    ) -> Result<()> {
        if let Some(dead_letter) = self.dead_letter
            && !rejected.is_empty()
        {
            let letters = crate::dead_letter::from_rejected(rejected)?;
            driver
                .write(dead_letter, &letters)
                .await
                .map_err(refused_dead_letter)?;
            self.count_dead_letters(rejected.len());
        }
        let rows = batch.num_rows() as u64;
        if rows == 0 {
            return Ok(());
        }
        for Output {
            handle: sink, id, ..
        } in self.sinks.iter().filter(|o| o.takes(topic))
        {
            match self.dead_letter {
                None => driver.write(*sink, batch).await?,
                Some(dead_letter) => {
                    let mut refused = Vec::new();
                    write_or_refuse(driver, *sink, batch.clone(), &mut refused).await?;
                    if !refused.is_empty() {
                        let letters = crate::dead_letter::from_refused_rows(&refused, id, topic)?;
                        driver
                            .write(dead_letter, &letters)
                            .await
                            .map_err(refused_dead_letter)?;
                        self.count_dead_letters(refused.len());
                    }
                }
            }
            metrics::counter!(crate::telemetry::RECORDS_OUT, "subtask" => self.label.clone(), "sink" => id.to_string())
                .increment(rows);
        }
        metrics::counter!(crate::telemetry::RECORDS_IN, "subtask" => self.label.clone())
            .increment(rows);
        metrics::counter!(crate::telemetry::BYTES_IN, "subtask" => self.label.clone())
            .increment(batch.get_array_memory_size() as u64);
        Ok(())
    }

    fn count_dead_letters(&self, letters: usize) {
        tracing::warn!(subtask = %self.label, letters, "records sent to the dead-letter topic");
        metrics::counter!(crate::telemetry::DEAD_LETTERS, "subtask" => self.label.clone())
            .increment(letters as u64);
    }
}

/// A dead letter the dead-letter topic refuses (too large for `message.max.bytes`, ...: the cause says) stops the
/// job: it is not the bad input's fault, and there is nowhere else to put it.
fn refused_dead_letter(e: Error) -> Error {
    if e.kind() != ErrorKind::BadRecord {
        return e;
    }
    Error::new(
        ErrorKind::Fatal,
        Phase::Write,
        "the dead-letter topic refused a dead letter",
    )
    .with_source(e)
}

/// Writes `batch` to `sink`; when the sink refuses it ([`BadRecord`](ErrorKind::BadRecord): refused whole, the
/// transaction unchanged), splits it in halves until the refused rows are single, writes the rest, and collects
/// the refused rows with why in `refused`.
fn write_or_refuse<'a>(
    driver: &'a mut Driver<SubtaskStore>,
    sink: SinkHandle,
    batch: RecordBatch,
    refused: &'a mut Vec<(RecordBatch, String)>,
) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
    Box::pin(async move {
        match driver.write(sink, &batch).await {
            Err(e) if e.kind() == ErrorKind::BadRecord => {
                let rows = batch.num_rows();
                if rows == 1 {
                    refused.push((batch, connector_api::Report(&e).to_string()));
                    return Ok(());
                }
                let half = rows / 2;
                write_or_refuse(driver, sink, batch.slice(0, half), refused).await?;
                write_or_refuse(driver, sink, batch.slice(half, rows - half), refused).await
            }
            outcome => outcome,
        }
    })
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
        metrics::counter!(crate::telemetry::SOURCE_GAP_RECORDS, "subtask" => label.to_string(),
            "topic" => gap.topic.clone(), "partition" => gap.partition.to_string())
        .increment(gap.skipped().max(0) as u64);
    }
}

/// Sets the consumer-lag gauge of every partition the source reads (partitions added while running included) and
/// the partition count; a failure only skips this measurement.
fn measure_lag(source: &KafkaSource, label: &str) {
    metrics::gauge!(crate::telemetry::SOURCE_PARTITIONS, "subtask" => label.to_string())
        .set(source.partitions().len() as f64);
    let marks = match tokio::task::block_in_place(|| source.watermarks()) {
        Ok(marks) => marks,
        Err(e) => {
            tracing::debug!(error = %connector_api::Report(&e), "cannot measure the consumer lag");
            return;
        }
    };
    for (at, marks) in marks {
        metrics::gauge!(crate::telemetry::CONSUMER_LAG, "subtask" => label.to_string(),
            "topic" => at.topic.clone(), "partition" => at.partition.to_string())
        .set(source.lag(&at, marks) as f64);
    }
}

fn config_error(e: anyhow::Error) -> Error {
    Error::new(ErrorKind::Config, Phase::Setup, format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fenced() -> Error {
        Error::new(
            ErrorKind::Fenced,
            Phase::Commit,
            "producer fenced: a newer epoch",
        )
    }

    #[tokio::test]
    async fn a_fence_is_a_take_over_only_when_the_store_names_another_owner() {
        let taken = fenced_or_expired(async { Ok(true) }, fenced()).await;
        assert_eq!(taken.kind(), ErrorKind::Fenced);

        // Still the owner: the sink's own transaction expired; a counted failure, restarted.
        let expired = fenced_or_expired(async { Ok(false) }, fenced()).await;
        assert_eq!(expired.kind(), ErrorKind::Fatal);
        assert_eq!(expired.phase(), Phase::Commit);
        let report = connector_api::Report(&expired).to_string();
        assert!(
            report.contains("still owns the subtask") && report.contains("producer fenced"),
            "{report}"
        );

        // Unknown: treated as a take-over (the store is what fences saves anyway).
        let unknown = fenced_or_expired(
            async {
                Err(Error::new(
                    ErrorKind::Retryable,
                    Phase::Checkpoint,
                    "store down",
                ))
            },
            fenced(),
        )
        .await;
        assert_eq!(unknown.kind(), ErrorKind::Fenced);
    }

    #[tokio::test]
    async fn any_failure_after_another_process_claimed_the_subtask_is_a_take_over() {
        let purged = || {
            Error::new(
                ErrorKind::MustAbort,
                Phase::PreCommit,
                "a record was not delivered: Purged in queue",
            )
        };
        let taken = taken_over_meanwhile(async { Ok(true) }, purged()).await;
        assert_eq!(taken.kind(), ErrorKind::Fenced);
        assert_eq!(taken.phase(), Phase::PreCommit);
        assert!(
            connector_api::Report(&taken)
                .to_string()
                .contains("Purged in queue")
        );

        let own = taken_over_meanwhile(async { Ok(false) }, purged()).await;
        assert_eq!(own.kind(), ErrorKind::MustAbort);
        let unknown = taken_over_meanwhile(
            async {
                Err(Error::new(
                    ErrorKind::Retryable,
                    Phase::Checkpoint,
                    "store down",
                ))
            },
            purged(),
        )
        .await;
        assert_eq!(unknown.kind(), ErrorKind::MustAbort);
    }
}
