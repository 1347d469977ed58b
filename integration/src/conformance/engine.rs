//! Scenarios and the engine that runs one: the real driver, a durable local checkpoint store, crash injection and
//! replay from restored positions.

use std::sync::{Arc, Mutex};

use connector_api::{
    CheckpointId, Committer, Driver, DriverConfig, FaultPoint, LocalCheckpointStore,
    Report as ErrorReport, RetryPolicy, SinkId, TwoPhaseCommit,
};

use super::source::{Rng, conformance_batch as batch, positions, resume_offset};
use super::{Conformance, ConformanceTarget, ReportRow};

/// Where a scenario crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashAt {
    /// After the checkpoint's batches were written, before `checkpoint` is called.
    AfterWrite,
    /// After sink `a` pre-committed (sink `b` has not).
    AfterFirstPreCommit,
    /// After both sinks pre-committed, before the record is durable.
    AfterLastPreCommit,
    /// After the record is durable, before any commit.
    AfterRecordDurable,
    /// After sink `a` committed, before sink `b` did.
    BetweenCommits,
    /// After both sinks committed.
    AfterCommit,
}

/// One conformance scenario.
#[derive(Debug, Clone)]
pub enum Scenario {
    /// No crash; commits overlap the next checkpoint's writes.
    HappyPath,
    /// One crash at a step of the job's second checkpoint.
    Crash(CrashAt),
    /// A crash after the record is durable, then a restart that recovers and dies again at once: recovery runs
    /// twice over the same record.
    RecoverTwice,
    /// After the job completes, a new instance recovers the last checkpoint (committing it again) and its
    /// committer commits the same committables once more.
    CommitTwice,
    /// An instance that began writing before a new instance recovered keeps writing, pre-committing and
    /// committing: none of it may become visible.
    Zombie,
    /// An instance writes and pre-commits, then aborts: nothing of it may become visible.
    Abort,
    /// A long run with crashes at random steps, from a seed.
    Random {
        /// The seed; the same seed replays the same run.
        seed: u64,
    },
}

impl Scenario {
    /// Every scenario a conformance run covers.
    pub fn all(config: &Conformance) -> Vec<Scenario> {
        let mut all = vec![
            Scenario::HappyPath,
            Scenario::Crash(CrashAt::AfterWrite),
            Scenario::Crash(CrashAt::AfterFirstPreCommit),
            Scenario::Crash(CrashAt::AfterLastPreCommit),
            Scenario::Crash(CrashAt::AfterRecordDurable),
            Scenario::Crash(CrashAt::BetweenCommits),
            Scenario::Crash(CrashAt::AfterCommit),
            Scenario::RecoverTwice,
            Scenario::CommitTwice,
            Scenario::Zombie,
            Scenario::Abort,
        ];
        all.extend((0..config.random_runs).map(|i| Scenario::Random {
            seed: config.seed.wrapping_add(u64::from(i) + 1),
        }));
        all
    }

    /// A short name for reports and destinations.
    pub fn name(&self) -> String {
        match self {
            Scenario::HappyPath => "happy-path".into(),
            Scenario::Crash(at) => format!("crash-{}", crash_name(*at)),
            Scenario::RecoverTwice => "recover-twice".into(),
            Scenario::CommitTwice => "commit-twice".into(),
            Scenario::Zombie => "zombie".into(),
            Scenario::Abort => "abort".into(),
            Scenario::Random { seed } => format!("random-{seed:x}"),
        }
    }
}

fn crash_name(at: CrashAt) -> &'static str {
    match at {
        CrashAt::AfterWrite => "after-write",
        CrashAt::AfterFirstPreCommit => "after-first-pre-commit",
        CrashAt::AfterLastPreCommit => "after-last-pre-commit",
        CrashAt::AfterRecordDurable => "after-record-durable",
        CrashAt::BetweenCommits => "between-commits",
        CrashAt::AfterCommit => "after-commit",
    }
}

/// The crashes still to inject: (checkpoint, step). Shared with the driver's fault injector.
type Armed = Arc<Mutex<Vec<(u64, CrashAt)>>>;

/// Counters of one scenario run.
#[derive(Default)]
struct Stats {
    crashes: u32,
    starts: u32,
    checkpoints: u64,
}

fn sinks() -> [SinkId; 2] {
    [
        SinkId::new("a").expect("valid"),
        SinkId::new("b").expect("valid"),
    ]
}

fn fault_matches(point: &FaultPoint, at: CrashAt) -> bool {
    let [a, b] = sinks();
    match (point, at) {
        (FaultPoint::AfterPreCommit { sink }, CrashAt::AfterFirstPreCommit) => *sink == a,
        (FaultPoint::AfterPreCommit { sink }, CrashAt::AfterLastPreCommit) => *sink == b,
        (FaultPoint::AfterRecordDurable, CrashAt::AfterRecordDurable) => true,
        (FaultPoint::AfterCommit { sink }, CrashAt::BetweenCommits) => *sink == a,
        (FaultPoint::AfterCommit { sink }, CrashAt::AfterCommit) => *sink == b,
        _ => false,
    }
}

/// Runs one scenario; never panics on the target's misbehaviour, reports it.
pub(super) async fn run<T: ConformanceTarget>(
    target: &T,
    scenario: &Scenario,
    config: &Conformance,
) -> ReportRow {
    let name = scenario.name();
    let run = crate::unique_name(&name);
    let mut stats = Stats::default();
    let outcome = run_scenario(target, scenario, config, &run, &mut stats).await;
    ReportRow {
        scenario: name,
        crashes: stats.crashes,
        starts: stats.starts,
        checkpoints: stats.checkpoints,
        outcome,
    }
}

async fn run_scenario<T: ConformanceTarget>(
    target: &T,
    scenario: &Scenario,
    config: &Conformance,
    run: &str,
    stats: &mut Stats,
) -> Result<(), String> {
    let (records, armed, random) = match scenario {
        // Checkpoint 3 is the second one a fresh job takes (its start consumes id 1): one committed checkpoint
        // precedes the crash.
        Scenario::Crash(at) => (config.records, vec![(3, *at)], None),
        Scenario::RecoverTwice => (config.records, vec![(3, CrashAt::AfterRecordDurable)], None),
        Scenario::Random { seed } => (config.random_records, Vec::new(), Some(Rng::new(*seed))),
        _ => (config.records, Vec::new(), None),
    };
    let store_dir =
        tempfile::tempdir().map_err(|e| format!("cannot create a checkpoint directory: {e}"))?;
    let job = Job {
        target,
        run,
        config,
        records,
        store_dir: store_dir.path().to_path_buf(),
        armed: Arc::new(Mutex::new(armed)),
        random,
        recover_twice: matches!(scenario, Scenario::RecoverTwice),
    };
    match scenario {
        Scenario::Zombie => zombie(&job, stats).await?,
        Scenario::Abort => {
            abort_then_run(&job).await?;
            job.run_to_end(stats).await?;
        }
        Scenario::CommitTwice => {
            job.run_to_end(stats).await?;
            commit_twice(&job).await?;
        }
        _ => job.run_to_end(stats).await?,
    }
    // A final recovery: whatever crashed attempts and zombies left behind must be gone afterwards.
    let (driver, _) = job.start(stats).await?;
    driver
        .close()
        .await
        .map_err(|e| format!("close after the final recovery: {}", ErrorReport(&e)))?;
    for sink in sinks() {
        job.expect_visible(&sink, records, "at the end").await?;
        let leftovers = target
            .leftovers(run, &sink)
            .await
            .map_err(|e| format!("reading leftovers of sink {sink}: {}", ErrorReport(&e)))?;
        if !leftovers.is_empty() {
            return Err(format!(
                "sink {sink} left behind after recovery: {}",
                head_str(&leftovers)
            ));
        }
    }
    Ok(())
}

fn head_str(items: &[String]) -> String {
    let shown: Vec<&str> = items.iter().take(5).map(String::as_str).collect();
    format!("{} ({} in all)", shown.join(", "), items.len())
}

struct Job<'a, T> {
    target: &'a T,
    run: &'a str,
    config: &'a Conformance,
    records: i64,
    store_dir: std::path::PathBuf,
    armed: Armed,
    random: Option<Rng>,
    recover_twice: bool,
}

impl<T: ConformanceTarget> Job<'_, T> {
    /// Checks that `sink` shows records `0..upto`, each exactly once.
    async fn expect_visible(&self, sink: &SinkId, upto: i64, when: &str) -> Result<(), String> {
        let mut ids = self
            .target
            .visible_ids(self.run, sink)
            .await
            .map_err(|e| format!("reading sink {sink} {when}: {}", ErrorReport(&e)))?;
        ids.sort_unstable();
        let expected: Vec<i64> = (0..upto).collect();
        if ids == expected {
            return Ok(());
        }
        let mut duplicates = Vec::new();
        let mut unexpected = Vec::new();
        for pair in ids.windows(2) {
            if pair[0] == pair[1] && duplicates.last() != Some(&pair[0]) {
                duplicates.push(pair[0]);
            }
        }
        for id in &ids {
            if *id < 0 || *id >= upto {
                unexpected.push(*id);
            }
        }
        unexpected.dedup();
        let mut deduped = ids.clone();
        deduped.dedup();
        let missing = expected
            .iter()
            .filter(|i| deduped.binary_search(i).is_err())
            .count();
        Err(format!(
            "sink {sink} {when}: expected records 0..{upto} once each, saw {} rows: {missing} missing, \
             duplicates {:?}, beyond the durable checkpoint {:?}",
            ids.len(),
            head(&duplicates),
            head(&unexpected)
        ))
    }

    fn driver(&self) -> Result<Driver<LocalCheckpointStore>, String> {
        let store = LocalCheckpointStore::open(&self.store_dir, 3)
            .map_err(|e| ErrorReport(&e).to_string())?;
        let armed = self.armed.clone();
        let config = DriverConfig {
            retry: RetryPolicy {
                max_attempts: 3,
                initial_backoff: std::time::Duration::from_millis(10),
                max_backoff: std::time::Duration::from_millis(50),
            },
            ..DriverConfig::default()
        };
        Ok(Driver::new(store, config).with_fault_injector(Arc::new(
            move |checkpoint: CheckpointId, point: &FaultPoint| {
                let mut armed = armed.lock().expect("armed crashes");
                match armed
                    .iter()
                    .position(|(cp, at)| *cp == checkpoint.0 && fault_matches(point, *at))
                {
                    Some(i) => {
                        armed.remove(i);
                        true
                    }
                    None => false,
                }
            },
        )))
    }

    /// Starts a driver with fresh instances of both sinks and checks what is visible right after recovery.
    async fn start(
        &self,
        stats: &mut Stats,
    ) -> Result<(Driver<LocalCheckpointStore>, i64), String> {
        let mut driver = self.driver()?;
        for sink in sinks() {
            let instance = self
                .target
                .create_sink(self.run, &sink)
                .await
                .map_err(|e| format!("creating sink {sink}: {}", ErrorReport(&e)))?;
            driver
                .add_sink(instance)
                .map_err(|e| ErrorReport(&e).to_string())?;
        }
        stats.starts += 1;
        let restored = driver
            .start()
            .await
            .map_err(|e| format!("start #{}: {}", stats.starts, ErrorReport(&e)))?;
        let offset = resume_offset(&restored.positions);
        if stats.starts > 1 {
            let when = format!(
                "after restart #{} from checkpoint {:?}",
                stats.starts - 1,
                restored.checkpoint
            );
            for sink in sinks() {
                self.expect_visible(&sink, offset, &when).await?;
            }
        }
        Ok((driver, offset))
    }

    /// Runs the job from its last durable checkpoint to the end of the source, restarting after every crash.
    async fn run_to_end(&self, stats: &mut Stats) -> Result<(), String> {
        let mut batches = Rng::new(self.config.seed ^ 0xBA7C);
        let mut random = self.random.clone();
        let mut recover_again = self.recover_twice;
        'attempt: loop {
            let (mut driver, mut next) = self.start(stats).await?;
            if stats.crashes > 0 && recover_again {
                // Die right after recovery: the next start recovers the same record again.
                recover_again = false;
                drop(driver);
                continue 'attempt;
            }
            while next < self.records {
                let checkpoint = driver.current_checkpoint().0;
                for _ in 0..self.config.batches_per_checkpoint {
                    let size = batches.below(self.config.max_batch as u64 + 1) as i64;
                    let end = (next + size).min(self.records);
                    let rows = batch(next..end);
                    for index in 0..2 {
                        driver.write(index, &rows).await.map_err(|e| {
                            format!("write at checkpoint {checkpoint}: {}", ErrorReport(&e))
                        })?;
                    }
                    next = end;
                }
                if let Some(rng) = random.as_mut()
                    && rng.below(4) == 0
                {
                    let at = [
                        CrashAt::AfterWrite,
                        CrashAt::AfterFirstPreCommit,
                        CrashAt::AfterLastPreCommit,
                        CrashAt::AfterRecordDurable,
                        CrashAt::BetweenCommits,
                        CrashAt::AfterCommit,
                    ][rng.below(6) as usize];
                    self.armed
                        .lock()
                        .expect("armed crashes")
                        .push((checkpoint, at));
                }
                if self.take_armed(checkpoint, CrashAt::AfterWrite) {
                    stats.crashes += 1;
                    drop(driver);
                    continue 'attempt;
                }
                let crashes_before = self.armed_len();
                let outcome = match driver.checkpoint(positions(next)).await {
                    Ok(_) => {
                        stats.checkpoints += 1;
                        if crashes_before > 0 {
                            // Let the commit finish so commit-side crash points fire at this checkpoint.
                            driver.finish_commit().await
                        } else {
                            // Otherwise the commit overlaps the next checkpoint's writes, as in production.
                            Ok(())
                        }
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = outcome {
                    if self.armed_len() < crashes_before {
                        stats.crashes += 1;
                        drop(driver);
                        continue 'attempt;
                    }
                    return Err(format!("checkpoint {checkpoint}: {}", ErrorReport(&e)));
                }
                if self.armed_len() < crashes_before {
                    // A commit-side crash point fired inside the commit task after it succeeded.
                    stats.crashes += 1;
                    drop(driver);
                    continue 'attempt;
                }
            }
            driver
                .close()
                .await
                .map_err(|e| format!("close: {}", ErrorReport(&e)))?;
            return Ok(());
        }
    }

    fn armed_len(&self) -> usize {
        self.armed.lock().expect("armed crashes").len()
    }

    fn take_armed(&self, checkpoint: u64, at: CrashAt) -> bool {
        let mut armed = self.armed.lock().expect("armed crashes");
        match armed.iter().position(|entry| *entry == (checkpoint, at)) {
            Some(i) => {
                armed.remove(i);
                true
            }
            None => false,
        }
    }

    async fn sink(&self, sink: &SinkId) -> Result<T::Sink, String> {
        self.target
            .create_sink(self.run, sink)
            .await
            .map_err(|e| format!("creating sink {sink}: {}", ErrorReport(&e)))
    }
}

fn head(ids: &[i64]) -> Vec<i64> {
    ids.iter().take(8).copied().collect()
}

/// A zombie of sink `a` begins checkpoint 1 and writes; a new job starts (recovering, which must fence it) and
/// runs; the zombie pre-commits and commits in the middle of the job's run and again after it.
async fn zombie<T: ConformanceTarget>(job: &Job<'_, T>, stats: &mut Stats) -> Result<(), String> {
    let [a, _] = sinks();
    let mut zombie = job.sink(&a).await?;
    zombie
        .recover(None)
        .await
        .map_err(|e| format!("zombie recover: {}", ErrorReport(&e)))?;
    zombie
        .begin(CheckpointId(1))
        .await
        .map_err(|e| format!("zombie begin: {}", ErrorReport(&e)))?;
    zombie
        .write(&batch(0..10))
        .await
        .map_err(|e| format!("zombie write: {}", ErrorReport(&e)))?;

    // The new instance recovers; then the zombie tries to finish its transaction while the job writes.
    let (mut driver, next) = job.start(stats).await?;
    zombie_finish(&mut zombie, 1).await;
    let end = (next + 25).min(job.records);
    for index in 0..2 {
        driver
            .write(index, &batch(next..end))
            .await
            .map_err(|e| ErrorReport(&e).to_string())?;
    }
    driver
        .checkpoint(positions(end))
        .await
        .map_err(|e| ErrorReport(&e).to_string())?;
    driver
        .close()
        .await
        .map_err(|e| ErrorReport(&e).to_string())?;
    stats.checkpoints += 1;
    job.run_to_end(stats).await?;

    // And once more after the job has finished.
    if zombie.begin(CheckpointId(2)).await.is_ok() && zombie.write(&batch(0..10)).await.is_ok() {
        zombie_finish(&mut zombie, 2).await;
    }
    Ok(())
}

/// The zombie pre-commits and commits checkpoint `checkpoint`; its errors are expected (it should be fenced).
async fn zombie_finish<S: TwoPhaseCommit>(zombie: &mut S, checkpoint: u64) {
    match zombie.pre_commit(CheckpointId(checkpoint)).await {
        Ok(committable) => {
            if let Err(e) = zombie.committer().commit(vec![committable]).await {
                tracing::info!(error = %ErrorReport(&e), "zombie commit refused (expected)");
            }
        }
        Err(e) => tracing::info!(error = %ErrorReport(&e), "zombie pre_commit refused (expected)"),
    }
}

/// An instance writes and pre-commits records, then aborts; nothing may become visible.
async fn abort_then_run<T: ConformanceTarget>(job: &Job<'_, T>) -> Result<(), String> {
    for sink in sinks() {
        let mut instance = job.sink(&sink).await?;
        let step = |what: &'static str| {
            move |e: connector_api::Error| format!("{what}: {}", ErrorReport(&e))
        };
        instance.recover(None).await.map_err(step("recover"))?;
        instance
            .begin(CheckpointId(1))
            .await
            .map_err(step("begin"))?;
        instance.write(&batch(0..30)).await.map_err(step("write"))?;
        instance
            .pre_commit(CheckpointId(1))
            .await
            .map_err(step("pre_commit"))?;
        instance.abort().await.map_err(step("abort"))?;
        job.expect_visible(&sink, 0, "after abort").await?;
    }
    Ok(())
}

/// A new instance recovers the last durable checkpoint (committing it again), then its committer commits the same
/// committables once more: both must be no-ops.
async fn commit_twice<T: ConformanceTarget>(job: &Job<'_, T>) -> Result<(), String> {
    use connector_api::CheckpointStore;
    let store =
        LocalCheckpointStore::open(&job.store_dir, 3).map_err(|e| ErrorReport(&e).to_string())?;
    let record = store
        .load_latest()
        .await
        .map_err(|e| ErrorReport(&e).to_string())?
        .ok_or("no durable checkpoint after a completed run")?;
    for sink in sinks() {
        let mut instance = job.sink(&sink).await?;
        let committables = connector_api::committables_in(&instance, &record)
            .map_err(|e| ErrorReport(&e).to_string())?
            .ok_or_else(|| format!("the last record has no entry for sink {sink}"))?;
        instance
            .recover(Some((record.id, committables.clone())))
            .await
            .map_err(|e| format!("recover: {}", ErrorReport(&e)))?;
        instance
            .committer()
            .commit(committables)
            .await
            .map_err(|e| {
                format!(
                    "second commit of checkpoint {}: {}",
                    record.id,
                    ErrorReport(&e)
                )
            })?;
    }
    Ok(())
}
