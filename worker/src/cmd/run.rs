//! `ratchet run --config job.toml`: this process's share of a job's subtasks, kept in line with the leases, until
//! a signal stops it.
//!
//! Every `lease / 5` the process renews its leases ([`crate::membership`]) and reconciles: it starts the subtasks it
//! holds up to its quota, stops gracefully (checkpoint, commit, close) those above its quota and then releases
//! them, and stops those whose lease it lost. A subtask that fails is restarted with a warning (its recovery
//! resolves what the failure left), up to `max_restarts` times in a row without a checkpoint in between; then the
//! job stops with the error. A configuration error (a sink's settings, a gap in the source under `on_gap = "fail"`,
//! a recreated topic) and a record that cannot be decoded or written stop the job at once: a restart would meet
//! them again.
//!
//! SIGTERM or SIGINT: every subtask finishes its checkpoint and commits, the process leaves the job (its leases
//! go to the others at once) and exits 0. A second signal exits at once with status 130: nothing checkpointed is
//! lost (the next owner's recovery commits it), what was written since is replayed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use connector_api::Report;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cli::RunArgs;
use crate::config::{JobConfig, KAFKA_REACHABLE_WITHIN};
use crate::job::assemble::SubtaskContext;
use crate::membership::presence::Presence;
use crate::membership::static_share::StaticShare;
use crate::membership::{Assignment, Membership};
use crate::ops::health::{Health, Status};
use crate::ops::progress::Progress;
use crate::subtask::{self, Ended, Stop};

struct Running {
    stop: watch::Sender<Stop>,
    task: JoinHandle<connector_api::Result<Ended>>,
    progress: Arc<Progress>,
    /// Stopping to give the subtask to another process: release the lease once stopped.
    handing_over: bool,
    /// Aborted because this process's membership lapsed by its own clock: its end is not a failure.
    lapsed: bool,
}

/// The process's subtasks and what it knows about them.
struct Process {
    job: Arc<JobConfig>,
    base: SubtaskContext,
    leases: Box<dyn Membership>,
    /// This process's row among the job's live processes (PostgreSQL store).
    presence: Option<Presence>,
    /// Static membership: the share this process was given (`None` when leases coordinate the processes).
    share: Option<StaticShare>,
    running: BTreeMap<u32, Running>,
    /// Consecutive failures without a checkpoint, when the subtask may start again, and the last error.
    failures: BTreeMap<u32, (u32, Instant, String)>,
    /// Static membership: subtasks another process claimed while this one ran them (a duplicate member), never
    /// started here again, and what `/health` says about them.
    duplicated: BTreeMap<u32, String>,
    /// What `/health` and `/ready` answer from.
    health: Arc<Health>,
    /// Counters of the runs that ended.
    finished: Totals,
    assignment: Assignment,
    /// When the last membership renewal that succeeded was asked (this process's clock): the membership is held
    /// until `lease` after it, and no longer.
    renewed: Instant,
    /// Show a live progress line (text logs on a terminal).
    progress_line: bool,
}

/// A signal arrived before the job started: nothing was claimed or opened yet (a lease being joined is left to
/// expire, an open store transaction is rolled back with its connection).
fn stopped_while_starting(signal: &str) -> Result<()> {
    tracing::info!(signal, "stopped before the job started: nothing to finish");
    Ok(())
}

/// Everything before the job loop: the registry's reader schemas, the leases, the job's identity.
///
/// # Errors
/// A registry or store that cannot be reached (after retries) or refuses, a job whose identity does not match.
async fn start(
    job: Arc<JobConfig>,
    args: &RunArgs,
    kafka: kafka_source::KafkaConnection,
    health: Arc<Health>,
    progress_line: bool,
) -> Result<Process> {
    // The membership mode, chosen once, before anything is written: a flag combination no mode serves is refused
    // here, not after a rescale.
    let mode = crate::membership::Mode::choose(&job, args.member.as_deref(), args.of)?;
    // A schema registry's reader schemas, looked up once for the process (every subtask and sink uses these).
    let source = Arc::new(job.resolve_source().await?);
    // The transforms and selects, planned (and refused) before anything is written.
    let shaping = Arc::new(crate::job::shaping::Shaping::of_job(&job, &source)?);
    // What the source reads is checked before anything is written (a rescale writes the new layout): never a
    // topic the job writes, and partitions dealt as the store records them.
    let selection = crate::job::preflight::checked_selection(&job, &kafka).await?;
    let jobs = crate::jobstore::open(&job.store, &job.job.name);
    crate::job::preflight::check_layout(jobs.as_ref(), &selection, false).await?;
    // A changed subtask count: the job is rescaled first, when no other process of it is alive.
    if let Some(recorded) = jobs.record(job.job.subtasks, false).await?
        && recorded.subtasks != job.job.subtasks
    {
        tracing::info!(job = %job.job.name, from = recorded.subtasks, to = job.job.subtasks,
            "the job file changes the subtask count: rescaling the job first");
        crate::job::rescale::rescale(&job, job.job.subtasks).await.with_context(|| {
            format!(
                "the job file says subtasks = {}, the store {}: rescaling failed (every other process of the job \
                 must be stopped)",
                job.job.subtasks, recorded.subtasks
            )
        })?;
    }
    // The layout generation the job is in now (after a rescale above): the Kafka group's coordination topic is
    // that layout's.
    let generation = jobs.generation().await?;
    let leases = mode.join(&job, &kafka, generation).await?;
    // Every process of a job on the PostgreSQL store says it is alive, whatever its membership: an operation that
    // changes the layout (resolve, rescale) waits for it or is refused.
    let presence = Presence::of_process(&job, &leases.mode()).await?;
    // Under the local lock, so two fresh starts with different counts cannot both record theirs.
    let identity = jobs.identity(job.job.subtasks, true).await?;
    // What a rescale that stopped after its switch left of the old layout.
    jobs.retire_old_generations(identity.generation).await?;
    // What a rescale killed before its switch wrote of the next layout.
    jobs.discard_unswitched_generation(crate::job::rescale::patience(&job))
        .await?;
    let job_id = identity.job_id(&job.job.name)?;
    crate::job::preflight::check_layout(jobs.as_ref(), &selection, true).await?;
    if identity.identity == crate::jobstore::Identity::Sink {
        tracing::info!(job = %job.job.name,
            "this job ran before sinks were scoped by their job: its sinks keep their sink-id-scoped names");
    }
    let started = std::time::Instant::now();
    let lag = job
        .lag_group()
        .map(|group| crate::ops::lag::LagReporter::start(&kafka, &group))
        .transpose()?;
    let base = SubtaskContext {
        job: job.clone(),
        job_id,
        source,
        shaping,
        jobs,
        generation: identity.generation,
        registry: Arc::new(crate::job::sinks::registry()),
        kafka,
        progress: Arc::new(Progress::starting_at(0)),
        started,
        drill: crate::ops::drill::from_env()?,
        lag,
    };
    Ok(Process {
        job: job.clone(),
        base,
        leases,
        presence,
        share: mode.share().copied(),
        running: BTreeMap::new(),
        failures: BTreeMap::new(),
        duplicated: BTreeMap::new(),
        health,
        finished: Totals::default(),
        assignment: Assignment::default(),
        renewed: Instant::now(),
        progress_line: progress_line && std::io::stderr().is_terminal(),
    })
}

/// Runs the job in `args.config` until a signal, `--exit-when-idle`, or an error that restarts do not cure.
///
/// # Errors
/// A job file or server problem at start (named), or a subtask that keeps failing.
pub async fn run(args: RunArgs, progress_line: bool) -> Result<()> {
    // Watched from the first moment: a stop while the process starts (waiting for a lease, a registry, the
    // store) is a clean exit, not a death by signal.
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let job = Arc::new(JobConfig::load(&args.config)?);
    let health = Arc::new(Health::default());
    if let Some(listen) = args.metrics_listen {
        let metrics = crate::ops::telemetry::install(&job.job.name)?;
        crate::ops::health::serve(listen, metrics, health.clone()).await?;
    }
    let kafka = job.kafka()?;
    kafka
        .check_reachable(KAFKA_REACHABLE_WITHIN)
        .await
        .context("[source]")?;
    if job.job.kafka_to_kafka {
        return crate::cmd::fast_path::run(&job, args.exit_when_idle).await;
    }
    let starting = async {
        crate::cmd::awaiting::source(&job).await?;
        start(job.clone(), &args, kafka, health, progress_line).await
    };
    let mut process = tokio::select! {
        process = starting => process?,
        _ = terminate.recv() => return stopped_while_starting("SIGTERM"),
        _ = interrupt.recv() => return stopped_while_starting("SIGINT"),
    };
    tracing::info!(job = %job.job.name, subtasks = job.job.subtasks, "job starting");
    let mut tick = tokio::time::interval(job.job.lease / 5);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let outcome = loop {
        tokio::select! {
            _ = terminate.recv() => break Ok("SIGTERM"),
            _ = interrupt.recv() => break Ok("SIGINT"),
            _ = tick.tick() => {
                if let Err(e) = process.reconcile().await {
                    break Err(e);
                }
                process.show_progress();
                metrics::gauge!(crate::ops::telemetry::SUBTASKS_RUNNING).set(process.running.len() as f64);
                if let Some(idle) = args.exit_when_idle
                    && process.idle_for(idle)
                {
                    break Ok("--exit-when-idle");
                }
            }
        }
    };
    let why = match &outcome {
        Ok(why) => why.to_string(),
        Err(e) => format!("error: {e:#}"),
    };
    tracing::info!(reason = %why, "stopping: finishing every subtask's checkpoint (a second SIGTERM/SIGINT stops at once)");
    tokio::select! {
        stopped = process.stop_all() => stopped?,
        _ = terminate.recv() => crate::ops::signals::fast_exit(),
        _ = interrupt.recv() => crate::ops::signals::fast_exit(),
    }
    if let Some(lag) = process.base.lag.clone() {
        // Informational: a coordinator that does not answer costs the stop a few seconds, nothing else.
        let _ = connector_api::blocking(
            connector_api::Phase::Commit,
            "flushing the lag group",
            move || lag.flush(Duration::from_secs(5)),
        )
        .await;
    }
    let totals = process.totals();
    let origin = std::time::SystemTime::now() - process.base.started.elapsed();
    let at = |ms: Option<u64>| ms.map(|ms| origin + Duration::from_millis(ms));
    crate::ops::telemetry::log_stopped(
        totals.records,
        totals.checkpoints,
        at(totals.first_record_ms),
        at(totals.last_record_ms),
    );
    outcome.map(|_| ())
}

/// What this process's runs did, summed.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    records: u64,
    checkpoints: u64,
    /// The first record read (ms since the process started).
    first_record_ms: Option<u64>,
    /// The last record read (ms since the process started).
    last_record_ms: Option<u64>,
    /// The last record read or run started (ms since the process started).
    last_activity_ms: u64,
}

impl Totals {
    fn add(&mut self, run: &Progress) {
        self.records += run.records.load(Ordering::Relaxed);
        self.checkpoints += run.checkpoints.load(Ordering::Relaxed);
        self.last_activity_ms = self
            .last_activity_ms
            .max(run.last_activity_ms.load(Ordering::Relaxed));
        let first = run.first_record_ms.load(Ordering::Relaxed);
        if first != u64::MAX {
            self.first_record_ms = Some(self.first_record_ms.map_or(first, |f| f.min(first)));
            let last = run.last_record_ms.load(Ordering::Relaxed);
            self.last_record_ms = Some(self.last_record_ms.map_or(last, |l| l.max(last)));
        }
    }
}

/// A process id unique across machines and restarts: host, pid, start time.
impl Process {
    /// Reaps ended subtasks, renews the leases and starts or stops subtasks to match them.
    async fn reconcile(&mut self) -> Result<()> {
        self.reap().await?;
        if let Some(presence) = &self.presence
            && let Err(e) = presence.renew().await
        {
            tracing::warn!(error = %format!("{e:#}"),
                "cannot renew this process's presence; an operator's resolve or rescale may take it for stopped \
                 once it expires (the store's claims still fence whatever that changes)");
        }
        self.abort_if_lapsed();
        let asked = Instant::now();
        let assignment = match self.leases.renew().await {
            Ok(assignment) => {
                self.renewed = asked;
                assignment
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), unrenewed_for = ?self.renewed.elapsed(),
                    lease = ?self.job.job.lease,
                    "cannot renew this process's membership; its subtasks go on until the lease lapses by this \
                     process's clock (the store's claims fence them if another process takes them over), retrying");
                self.abort_if_lapsed();
                return Ok(());
            }
        };
        if assignment.members != self.assignment.members || assignment.held != self.assignment.held
        {
            tracing::info!(membership = %self.leases.mode(), members = assignment.members,
                quota = assignment.quota, held = ?assignment.held, "membership");
        }
        // Lost leases: another process may be taking these over; stop them (a final checkpoint is fenced if it
        // already claimed them).
        for (subtask, running) in &mut self.running {
            if !assignment.held.contains(subtask) && *running.stop.borrow() == Stop::No {
                tracing::warn!(subtask, "lease lost; stopping the subtask here");
                let _ = running.stop.send(Stop::Graceful);
            }
        }
        // Keep the running ones first, then the others, up to the quota; hand over the rest.
        let (running, idle): (Vec<u32>, Vec<u32>) = assignment
            .held
            .difference(&assignment.handing)
            .partition(|s| self.running.contains_key(s));
        let keep: BTreeSet<u32> = running
            .iter()
            .chain(&idle)
            .copied()
            .take(assignment.quota)
            .collect();
        let keep_for_health = keep.clone();
        for subtask in assignment.held.iter().filter(|s| !keep.contains(s)) {
            match self.running.get_mut(subtask) {
                Some(running) if !running.handing_over => {
                    tracing::info!(
                        subtask,
                        "over this process's quota: handing the subtask over"
                    );
                    running.handing_over = true;
                    let _ = running.stop.send(Stop::Graceful);
                }
                Some(_) => {}
                None => self.release(*subtask).await,
            }
        }
        let now = Instant::now();
        let startable: Vec<u32> = keep
            .iter()
            .filter(|s| !self.duplicated.contains_key(s))
            .copied()
            .collect();
        for subtask in startable {
            let waiting = self
                .failures
                .get(&subtask)
                .is_some_and(|(_, after, _)| *after > now);
            if !self.running.contains_key(&subtask) && !waiting {
                self.start(subtask);
            }
        }
        self.assignment = assignment;
        self.publish_health(keep_for_health);
        Ok(())
    }

    /// Aborts every running subtask once the membership went unrenewed for a whole lease by this process's clock:
    /// another process may hold them now (the store expired the lease), so this one stops at once, without a
    /// final checkpoint that would wait on the store it cannot reach; what it left open is the next owner's to
    /// recover, as after a crash. Renewing again later starts what the assignment then gives it.
    fn abort_if_lapsed(&mut self) {
        let unrenewed = self.renewed.elapsed();
        if unrenewed < self.job.job.lease {
            return;
        }
        for (subtask, running) in &mut self.running {
            if !running.lapsed {
                tracing::error!(subtask, ?unrenewed, lease = ?self.job.job.lease,
                    "this process's membership lapsed by its own clock (not renewed for a whole lease): \
                     stopping the subtask at once, without a final checkpoint; the process that takes it over \
                     recovers what it left");
                running.lapsed = true;
                running.task.abort();
            }
        }
        if !self.assignment.held.is_empty() {
            self.assignment = Assignment::default();
            self.publish_health(BTreeSet::new());
        }
    }

    /// Tells `/health` and `/ready` what this round found.
    fn publish_health(&self, should_run: BTreeSet<u32>) {
        self.health.publish(Status {
            should_run,
            running: self
                .running
                .iter()
                .filter(|(_, r)| !r.handing_over)
                .map(|(s, r)| (*s, r.progress.clone()))
                .collect(),
            // A subtask running again that completed a checkpoint cycle since is not failing any more (its count
            // stays for the restart limit until its next checkpoint).
            failing: self
                .failures
                .iter()
                .filter(|(s, _)| {
                    self.running.get(s).is_none_or(|r| {
                        r.progress.last_cycle_ms.load(Ordering::Relaxed) == u64::MAX
                    })
                })
                .map(|(s, (n, _, e))| (*s, (*n, e.clone())))
                .chain(
                    self.duplicated.iter().map(|(s, message)| {
                        (*s, (crate::ops::health::CRASH_LOOP, message.clone()))
                    }),
                )
                .collect(),
            interval: self.job.job.checkpoint_interval,
            started: self.base.started,
        });
    }

    /// Releases `subtask`'s lease; a failure only delays the hand-over until the lease expires.
    async fn release(&self, subtask: u32) {
        if let Err(e) = self.leases.release(subtask).await {
            tracing::warn!(subtask, error = %format!("{e:#}"),
                "cannot release the lease; the other processes take the subtask when it expires");
        }
    }

    fn start(&mut self, subtask: u32) {
        let (stop, stopped) = watch::channel(Stop::No);
        let progress = Arc::new(Progress::starting_at(
            self.base.started.elapsed().as_millis() as u64,
        ));
        let context = SubtaskContext {
            progress: progress.clone(),
            ..self.base.clone()
        };
        let task = tokio::spawn(async move { subtask::run(&context, subtask, stopped).await });
        self.running.insert(
            subtask,
            Running {
                stop,
                task,
                progress,
                handing_over: false,
                lapsed: false,
            },
        );
    }

    /// Collects the subtasks that ended: releases handed-over leases, schedules restarts of failed ones, and fails
    /// the job when one keeps failing.
    async fn reap(&mut self) -> Result<()> {
        let ended: Vec<u32> = self
            .running
            .iter()
            .filter(|(_, r)| r.task.is_finished())
            .map(|(s, _)| *s)
            .collect();
        for subtask in ended {
            let running = self.running.remove(&subtask).expect("listed above");
            let checkpoints = running.progress.checkpoints.load(Ordering::Relaxed);
            self.finished.add(&running.progress);
            let outcome = match running.task.await {
                Err(e) if e.is_cancelled() && running.lapsed => {
                    tracing::info!(subtask, "subtask stopped: this process's membership lapsed");
                    continue;
                }
                outcome => outcome.unwrap_or_else(|e| Err(panicked(subtask, e))),
            };
            match outcome {
                Ok(Ended::Stopped) => {
                    self.failures.remove(&subtask);
                    if running.handing_over {
                        self.release(subtask).await;
                        tracing::info!(subtask, "subtask handed over");
                    }
                }
                Ok(Ended::TakenOver) => {
                    self.failures.remove(&subtask);
                    if self.share.is_some() {
                        // Claiming it back would fence the other in turn, forever. Stop and say who claimed it.
                        let message = format!(
                            "subtask {subtask} was claimed by another process while this one, {}, ran it: {}; \
                             this process leaves the subtask to it until restarted",
                            self.leases.mode(),
                            self.claimed_by().await
                        );
                        tracing::error!("{message}");
                        self.duplicated.insert(subtask, message);
                    }
                }
                Err(e) if e.kind() == connector_api::ErrorKind::BadRecord => {
                    // Deterministic: a restart would read the same record again.
                    return Err(anyhow::Error::from(e).context(format!(
                        "subtask {subtask} stopped on a record it cannot decode or write (configure [dead_letter] \
                         to set such records aside)"
                    )));
                }
                Err(e) if e.kind() == connector_api::ErrorKind::Config => {
                    // A setting, or a state of the source or a sink, that a restart does not change.
                    return Err(
                        anyhow::Error::from(e).context(format!("subtask {subtask} cannot run"))
                    );
                }
                Err(e) => {
                    let previous = if checkpoints > 0 {
                        0
                    } else {
                        self.failures.get(&subtask).map_or(0, |(n, _, _)| *n)
                    };
                    let failures = previous + 1;
                    if failures > self.job.job.max_restarts {
                        anyhow::bail!(
                            "subtask {subtask} failed {failures} times in a row without a checkpoint; the last \
                             error: {}",
                            Report(&e)
                        );
                    }
                    metrics::counter!(crate::ops::telemetry::RESTARTS, "subtask" => subtask.to_string())
                        .increment(1);
                    let backoff = Duration::from_secs(u64::from(failures).min(10));
                    tracing::warn!(subtask, attempt = failures, max = self.job.job.max_restarts,
                        error = %Report(&e), "subtask failed; restarting it in {backoff:?} (recovery resolves what it left)");
                    self.failures.insert(
                        subtask,
                        (failures, Instant::now() + backoff, Report(&e).to_string()),
                    );
                }
            }
        }
        Ok(())
    }

    /// Who took a static member's subtask, as far as the job's live processes tell: a second process of the same
    /// member, members started with another `--of`, or an operation (resolve, rescale).
    async fn claimed_by(&self) -> String {
        let mine = self.leases.mode();
        let others = match &self.presence {
            Some(presence) => presence.others().await.unwrap_or_default(),
            None => Vec::new(),
        };
        let same = others
            .iter()
            .filter(|o| o.ends_with(&format!("({mine})")))
            .count();
        let of = mine.rsplit(' ').next().unwrap_or_default();
        let regrouped: Vec<&String> = others
            .iter()
            .filter(|o| o.contains("(static member ") && !o.ends_with(&format!(" of {of})")))
            .collect();
        let operations: Vec<&String> = others
            .iter()
            .filter(|o| {
                crate::membership::exclusive::OPERATIONS
                    .iter()
                    .any(|op| o.ends_with(&format!("({op})")))
            })
            .collect();
        if same > 0 {
            format!(
                "{same} other process(es) run as {mine} (two pods or instances with one ordinal): give each process \
                 its own --member"
            )
        } else if !regrouped.is_empty() {
            format!(
                "processes run with another --of ({}): the members were changed while this one ran; restart every \
                 member with the same --of",
                regrouped
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else if !operations.is_empty() {
            format!(
                "an operation holds the job ({})",
                operations
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            "no live process claims it now (a process of the same member, or an operator's resolve, rescale or \
             forget-topic, that has ended)"
                .to_string()
        }
    }

    /// Stops every subtask gracefully, waits for them, and leaves the job.
    async fn stop_all(&mut self) -> Result<()> {
        for running in self.running.values() {
            let _ = running.stop.send(Stop::Graceful);
        }
        let mut first_error = None;
        for (subtask, running) in std::mem::take(&mut self.running) {
            self.finished.add(&running.progress);
            let outcome = match running.task.await {
                // Its membership lapsed: it was stopped at once, and the next owner recovers it.
                Err(e) if e.is_cancelled() && running.lapsed => continue,
                outcome => outcome.unwrap_or_else(|e| Err(panicked(subtask, e))),
            };
            if let Err(e) = outcome {
                tracing::error!(subtask, error = %Report(&e), "subtask failed while stopping; the next start recovers it");
                first_error.get_or_insert(anyhow::anyhow!(
                    "subtask {subtask} failed while stopping: {}",
                    Report(&e)
                ));
            }
        }
        if let Err(e) = self.leases.leave().await {
            tracing::warn!(error = %format!("{e:#}"), "cannot leave the job; the leases expire by themselves");
        }
        if let Some(presence) = &self.presence
            && let Err(e) = presence.leave().await
        {
            tracing::warn!(error = %format!("{e:#}"), "cannot delete this process's presence; it expires by itself");
        }
        first_error.map_or(Ok(()), Err)
    }

    fn totals(&self) -> Totals {
        let mut totals = self.finished;
        for run in self.running.values() {
            totals.add(&run.progress);
        }
        totals
    }

    /// Whether every subtask this process should run is running and none read a record for `idle` (or, with a
    /// quota of none, nothing ran here for `idle`).
    fn idle_for(&self, idle: Duration) -> bool {
        let now = self.base.started.elapsed().as_millis() as u64;
        if self.running.is_empty() && self.assignment.members > 0 && self.assignment.quota == 0 {
            return now.saturating_sub(self.finished.last_activity_ms) >= idle.as_millis() as u64;
        }
        // A subtask still claiming or recovering is not idle: stopping then would leave what it recovers (an
        // earlier owner's undecided transactions and files) for a later run.
        let idle_ms = idle.as_millis() as u64;
        let quiet = |r: &Running| {
            r.progress.last_cycle_ms.load(Ordering::Relaxed) != u64::MAX
                && now.saturating_sub(r.progress.last_activity_ms.load(Ordering::Relaxed))
                    >= idle_ms
        };
        if self.running.is_empty()
            || self.running.len() < self.assignment.quota
            || !self.running.values().all(quiet)
        {
            return false;
        }
        // Quiet for `idle`: idle once each source's metadata was read again after that (a partition or topic
        // added meanwhile is found by it), and the source was seen at the end of every partition after that
        // refresh (the records of a partition it added are read before the job says it is done).
        let mut refreshed = true;
        for r in self.running.values() {
            let idle_since = r.progress.last_activity_ms.load(Ordering::Relaxed) + idle_ms;
            let refreshed_ms = r.progress.refreshed_ms.load(Ordering::Relaxed);
            if refreshed_ms < idle_since {
                r.progress.refresh_wanted.store(true, Ordering::Relaxed);
                refreshed = false;
            } else if r.progress.caught_up_ms.load(Ordering::Relaxed) < refreshed_ms {
                refreshed = false;
            }
        }
        refreshed
    }

    /// A live progress line on a terminal.
    fn show_progress(&self) {
        if !self.progress_line {
            return;
        }
        let Totals {
            records,
            checkpoints,
            ..
        } = self.totals();
        eprint!(
            "\r{}: {records} records, {checkpoints} checkpoints, subtasks {:?} of {}, {} process(es)   ",
            self.job.job.name,
            self.running.keys().collect::<Vec<_>>(),
            self.job.job.subtasks,
            self.assignment.members
        );
    }
}

fn panicked(subtask: u32, e: tokio::task::JoinError) -> connector_api::Error {
    connector_api::Error::new(
        connector_api::ErrorKind::Bug,
        connector_api::Phase::Setup,
        format!("subtask {subtask} panicked"),
    )
    .with_source(e)
}
