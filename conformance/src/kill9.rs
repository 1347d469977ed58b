//! Real crashes: a child process (the test binary itself) runs a job and sends itself SIGKILL at a protocol step,
//! so nothing in it gets to clean up; the parent then recovers and checks the external system.
//!
//! [`KillNine`] is the runner every sink's crash test uses: for each step it starts the child, which runs the
//! [`KillTarget`]'s sink through checkpoints until it dies at that step of one checkpoint; then, in the parent, a
//! new driver and sink recover from the checkpoint store the child left; the restored position must be exactly
//! the checkpoints made durable before the kill, and the target's independent reader must show exactly those
//! records, each once; then the job goes on for a few checkpoints, and one more process only recovers and stops,
//! after which every record written is visible once and nothing is left behind.
//!
//! ```no_run
//! use async_trait::async_trait;
//! use connector_api::Result;
//! use ratchet_conformance::kill9::{KillNine, KillTarget, KilledRun};
//! # use ratchet_conformance::reference::{ReferenceSink, ReferenceSystem};
//!
//! struct MyTarget; // how to reach the destination; the run says which one
//!
//! #[async_trait]
//! impl KillTarget for MyTarget {
//!     type Sink = ReferenceSink; // your sink
//!     async fn create_sink(&self, run: &KilledRun) -> Result<ReferenceSink> {
//!         todo!("a sink writing to the topic/table/prefix named {}", run.name)
//!     }
//!     async fn visible_ids(&self, run: &KilledRun) -> Result<Vec<i64>> {
//!         todo!("read {} back with a reader that is not the sink", run.name)
//!     }
//! }
//!
//! const KILL9: KillNine = KillNine::new("kill9::child", "MY_SINK_KILL9_CHILD");
//!
//! /// The child's entry point (returns at once in a normal test run).
//! #[tokio::test(flavor = "multi_thread")]
//! async fn child() {
//!     if let Some(run) = KILL9.child_run() {
//!         KILL9.run_child(&MyTarget, run).await
//!     }
//! }
//!
//! #[tokio::test(flavor = "multi_thread")]
//! async fn kill_9_at_every_step() {
//!     KILL9.every_step(&MyTarget, "default").await;
//! }
//! ```

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::{
    CheckpointId, Driver, DriverConfig, FaultInjector, FaultPoint, LocalCheckpointStore, Result,
    SinkHandle, Step, TwoPhaseCommit,
};

use crate::{conformance_batch, conformance_positions};

/// The steps a child can be killed at: after the checkpoint's batches were written (the job loop's to handle),
/// after pre-commit, after the checkpoint record is durable, after commit (on the commit task, while the job loop
/// already writes the next checkpoint), and while committing (the job loop kills the process right after writing
/// the next checkpoint's first batch, with the commit just started on its task).
pub const KILL_STEPS: [Step; 5] = [
    Step::AfterWrite,
    Step::AfterPreCommit,
    Step::AfterRecordDurable,
    Step::AfterCommit,
    Step::WhileCommitting,
];

/// Sends SIGKILL to this process.
pub fn kill_self() -> ! {
    let _ = Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status();
    loop {
        std::thread::park();
    }
}

/// A fault injector that kills this process at `step` (one of [`KILL_STEPS`] but `after-write` and
/// `while-committing`, which the job loop handles) of checkpoint `checkpoint`.
pub fn kill_at(step: Step, checkpoint: u64) -> FaultInjector {
    Arc::new(move |current: CheckpointId, fault: &FaultPoint| {
        if fault.step() == step && current.0 == checkpoint {
            kill_self();
        }
        false
    })
}

/// Checkpoints a job killed at `step` of checkpoint `crash` has made durable, counting from the first real one
/// (a fresh start consumes checkpoint id 1, so the first real checkpoint is 2).
pub fn durable_before(step: Step, crash: u64) -> u64 {
    let completed = crash - 2;
    match step {
        Step::AfterRecordDurable | Step::AfterCommit | Step::WhileCommitting => completed + 1,
        _ => completed,
    }
}

/// Runs the test `entry_point` of the current test binary with `env_var=spec` and checks that it died by SIGKILL.
pub fn run_killed_child(entry_point: &str, env_var: &str, spec: &str) {
    let status = Command::new(std::env::current_exe().expect("test binary path"))
        .args(["--exact", entry_point, "--nocapture", "--test-threads", "1"])
        .env(env_var, spec)
        .status()
        .expect("cannot start the child test process");
    assert_eq!(
        status.signal(),
        Some(9),
        "the child ({spec}) should have died by SIGKILL, got {status}"
    );
}

/// The child's job: starts `driver` (whose sink `sink` is the sink under test) with a [`kill_at`] injector for
/// `step` of checkpoint `crash`, then writes checkpoints of `batches` batches made by `batch` from consecutive id
/// ranges of `rows`, until it kills itself (at `after-write`, once checkpoint `crash` is written; at
/// `while-committing`, once the first batch after checkpoint `crash` is written). Commits overlap the next
/// checkpoint's writes, as in production: the loop never waits for them.
pub async fn run_until_killed<S: connector_api::CheckpointStore>(
    driver: connector_api::Driver<S>,
    sink: SinkHandle,
    step: Step,
    crash: u64,
    batches: i64,
    rows: i64,
    batch: impl Fn(std::ops::Range<i64>) -> arrow_array::RecordBatch,
) -> ! {
    let mut driver = driver.with_fault_injector(kill_at(step, crash));
    driver.start().await.expect("child start");
    let mut next = 0;
    loop {
        let checkpoint = driver.current_checkpoint().0;
        for _ in 0..batches {
            driver
                .write(sink, &batch(next..next + rows))
                .await
                .expect("child write");
            next += rows;
        }
        if step == Step::AfterWrite && checkpoint == crash {
            kill_self();
        }
        driver
            .checkpoint(crate::conformance_positions(next))
            .await
            .expect("child checkpoint");
        if step == Step::WhileCommitting && checkpoint == crash {
            driver
                .write(sink, &batch(next..next + rows))
                .await
                .expect("child write");
            kill_self();
        }
    }
}

/// One killed run: the step the child dies at, and the run's name and directory, the same in the child and in the
/// parent (the child gets them through [`KillNine::env_var`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KilledRun {
    /// The step the child dies at.
    pub step: Step,
    /// Which variant of the target the test runs (a place, a database, a mode), as the test named it; the child
    /// builds its target from it.
    pub variant: String,
    /// A name no other run uses, for the run's topic, table, prefix or catalog namespace.
    pub name: String,
    /// A directory of the run shared by the child and the parent: the checkpoint store is its `state`
    /// subdirectory; the target may keep its destination under it too (a local warehouse, an output directory).
    pub dir: PathBuf,
}

impl KilledRun {
    /// The checkpoint store's directory.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    fn encode(&self) -> String {
        format!(
            "{};{};{};{}",
            self.step,
            self.variant,
            self.name,
            self.dir.display()
        )
    }

    fn decode(spec: &str) -> KilledRun {
        let parts: Vec<&str> = spec.splitn(4, ';').collect();
        let [step, variant, name, dir] = parts[..] else {
            panic!("a killed run's spec is `step;variant;name;dir`, got {spec:?}");
        };
        KilledRun {
            step: Step::parse(step).unwrap_or_else(|| panic!("{step:?} is not a step")),
            variant: variant.to_string(),
            name: name.to_string(),
            dir: PathBuf::from(dir),
        }
    }
}

/// A sink under a `kill -9` test, and an independent reader of its destination (a read_committed consumer, a
/// SQL client, pyiceberg: never the sink's own code). Its methods are called in the child process and in the
/// parent, so the destination must follow from the [`KilledRun`] alone.
#[async_trait]
pub trait KillTarget: Send + Sync {
    /// The sink type.
    type Sink: TwoPhaseCommit + 'static;

    /// A new instance of the sink writing into the destination of `run`: the child's, then one per recovery in
    /// the parent. Batches have the schema [`conformance_schema`](crate::conformance_schema).
    async fn create_sink(&self, run: &KilledRun) -> Result<Self::Sink>;

    /// The `id` of every record an ordinary reader sees in that destination, one entry per visible copy.
    async fn visible_ids(&self, run: &KilledRun) -> Result<Vec<i64>>;

    /// What should not be there once the job stopped after a final recovery (staged files, open or prepared
    /// transactions, unreferenced data files, a checkpoint committed twice), one description each; the default
    /// reports nothing.
    async fn leftovers(&self, _run: &KilledRun) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// Problems with what the crash itself left, checked before recovery: for instance a file sink killed before
    /// its commit must have left staged data, or the recovery that follows proves nothing. The default checks
    /// nothing.
    async fn crash_problems(&self, _run: &KilledRun) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

/// The `kill -9` runner: see the [module docs](self). Its sizes are public fields with defaults from
/// [`KillNine::new`].
#[derive(Debug, Clone, Copy)]
pub struct KillNine {
    /// The test in the sink's test binary that calls [`run_child`](Self::run_child), as `cargo test --exact`
    /// names it (`kill9::child`).
    pub child_test: &'static str,
    /// The environment variable that carries the run to the child.
    pub env_var: &'static str,
    /// The steps killed at, one run each.
    pub steps: &'static [Step],
    /// The checkpoint the child dies in (a fresh start consumes id 1, so 2 and 3 complete before 4).
    pub crash_checkpoint: u64,
    /// Batches per checkpoint.
    pub batches: i64,
    /// Records per batch.
    pub rows: i64,
    /// The batch of records with ids `range`.
    pub batch: fn(std::ops::Range<i64>) -> RecordBatch,
    /// Checkpoints written after the recovery, before the final one.
    pub finish_checkpoints: i64,
    /// The sink makes rows visible at pre-commit, idempotently (an upsert table): after recovery it may show
    /// records of the checkpoint the child died in too, each once (the replay writes them again with no further
    /// effect). The final state is checked exactly as for every sink.
    pub visible_at_pre_commit: bool,
}

impl KillNine {
    /// A runner over every step of [`KILL_STEPS`], dying in checkpoint 4 of batches of 100 conformance records
    /// (one per checkpoint), finishing with two more checkpoints.
    pub const fn new(child_test: &'static str, env_var: &'static str) -> Self {
        Self {
            child_test,
            env_var,
            steps: &KILL_STEPS,
            crash_checkpoint: 4,
            batches: 1,
            rows: 100,
            batch: conformance_batch,
            finish_checkpoints: 2,
            visible_at_pre_commit: false,
        }
    }

    /// The run this process is the child of, when it is one ([`env_var`](Self::env_var) set).
    #[allow(clippy::disallowed_methods)] // the harness's own variable, set for its child
    pub fn child_run(&self) -> Option<KilledRun> {
        std::env::var(self.env_var)
            .ok()
            .map(|spec| KilledRun::decode(&spec))
    }

    /// The child: runs `target`'s sink through checkpoints until the process kills itself at `run.step` of the
    /// crash checkpoint.
    ///
    /// # Panics
    /// When any protocol step fails before the kill.
    pub async fn run_child<T: KillTarget>(&self, target: &T, run: KilledRun) -> ! {
        let (driver, sink) = self.driver(target, &run).await;
        run_until_killed(
            driver,
            sink,
            run.step,
            self.crash_checkpoint,
            self.batches,
            self.rows,
            self.batch,
        )
        .await
    }

    /// The parent: one killed run per step against `target` (variant `variant`, handed to the child), each
    /// checked as the [module docs](self) say. Returns at once in a child process.
    ///
    /// # Panics
    /// On any check that fails, naming the variant and the step.
    pub async fn every_step<T: KillTarget>(&self, target: &T, variant: &str) {
        if self.child_run().is_some() {
            return;
        }
        for &step in self.steps {
            let dir = tempfile::tempdir().expect("a directory for the run");
            let run = KilledRun {
                step,
                variant: variant.to_string(),
                name: crate::unique_name(&format!("kill9-{step}")),
                dir: dir.path().to_path_buf(),
            };
            self.killed_run(target, &run).await;
        }
    }

    async fn killed_run<T: KillTarget>(&self, target: &T, run: &KilledRun) {
        let label = format!("{} killed at {}", run.variant, run.step);
        let (child_test, env_var, spec) = (self.child_test, self.env_var, run.encode());
        connector_api::blocking(
            connector_api::Phase::Recover,
            "running the killed child",
            move || run_killed_child(child_test, env_var, &spec),
        )
        .await
        .expect("the child's runner");
        let problems = target.crash_problems(run).await.expect("crash_problems");
        assert!(problems.is_empty(), "{label}: {problems:?}");

        let (mut driver, sink) = self.driver(target, run).await;
        let restored = driver.start().await.expect("recovery");
        let mut next = restored.positions.first().map_or(0, |p| p.next_offset);
        let per_checkpoint = self.batches * self.rows;
        let durable = durable_before(run.step, self.crash_checkpoint) as i64;
        assert_eq!(next, durable * per_checkpoint, "{label}: restored position");
        // The end of what the child wrote: the crash checkpoint's records (the first real checkpoint is 2), and
        // when it died on the commit task, possibly the next checkpoint's too (pre-committed while the crash
        // checkpoint's commit ran).
        let written = match run.step {
            Step::AfterCommit | Step::WhileCommitting => self.crash_checkpoint,
            _ => self.crash_checkpoint - 1,
        };
        let reached = written as i64 * per_checkpoint;
        self.check_visible(
            target,
            run,
            next,
            reached,
            &format!("{label}, after recovery"),
        )
        .await;

        for _ in 0..self.finish_checkpoints {
            for _ in 0..self.batches {
                let batch = (self.batch)(next..next + self.rows);
                driver.write(sink, &batch).await.expect("write");
                next += self.rows;
            }
            driver
                .checkpoint(conformance_positions(next))
                .await
                .expect("checkpoint");
        }
        driver.close().await.expect("close");

        let (mut driver, _) = self.driver(target, run).await;
        driver.start().await.expect("the final recovery");
        driver.close().await.expect("close");
        let label = format!("{label}, at the end");
        self.check_visible(target, run, next, next, &label).await;
        self.check_leftovers(target, run, &label).await;
    }

    /// Checks that the target shows every record below `upto` once and, when the sink shows rows at pre-commit,
    /// at most the records below `reached` (the end of what the child wrote) beyond them, once each. (Not what
    /// is left behind: the recovered job has begun its next checkpoint's transaction, which is no leftover.)
    async fn check_visible<T: KillTarget>(
        &self,
        target: &T,
        run: &KilledRun,
        upto: i64,
        reached: i64,
        label: &str,
    ) {
        let mut ids = target.visible_ids(run).await.expect("visible_ids");
        ids.sort_unstable();
        let expected: Vec<i64> = (0..upto).collect();
        if self.visible_at_pre_commit && ids.len() > expected.len() {
            let mut unique = ids.clone();
            unique.dedup();
            assert_eq!(
                unique.len(),
                ids.len(),
                "{label}: a record is visible twice"
            );
            assert!(
                ids.starts_with(&expected) && ids.iter().all(|id| *id < reached.max(upto)),
                "{label}: {} records visible, expected 0..{upto} (and at most up to {reached})",
                ids.len()
            );
        } else {
            assert!(
                ids == expected,
                "{label}: {} records visible (first differences: {:?}), expected 0..{upto} each once",
                ids.len(),
                first_differences(&ids, &expected)
            );
        }
    }

    /// Checks that nothing is left behind, once the job stopped.
    async fn check_leftovers<T: KillTarget>(&self, target: &T, run: &KilledRun, label: &str) {
        let leftovers = target.leftovers(run).await.expect("leftovers");
        assert!(leftovers.is_empty(), "{label}: left behind: {leftovers:?}");
    }

    async fn driver<T: KillTarget>(
        &self,
        target: &T,
        run: &KilledRun,
    ) -> (Driver<LocalCheckpointStore>, SinkHandle) {
        let store =
            LocalCheckpointStore::open(run.state_dir(), 3).expect("the run's checkpoint store");
        let mut driver = Driver::new(store, DriverConfig::default());
        let sink = target.create_sink(run).await.expect("create_sink");
        let handle = driver.add_sink(sink).expect("add the sink");
        (driver, handle)
    }
}

/// Up to five ids that are in one list and not the other, for a readable failure.
fn first_differences(seen: &[i64], expected: &[i64]) -> Vec<String> {
    let seen_set: std::collections::BTreeSet<_> = seen.iter().collect();
    let expected_set: std::collections::BTreeSet<_> = expected.iter().collect();
    let missing = expected_set
        .difference(&seen_set)
        .map(|id| format!("missing {id}"));
    let mut counts = std::collections::BTreeMap::new();
    for id in seen {
        *counts.entry(id).or_insert(0) += 1;
    }
    let extra = counts
        .iter()
        .filter(|&(id, n)| *n > 1 || !expected_set.contains(id))
        .map(|(id, n)| format!("{id} seen {n}x"));
    missing.chain(extra).take(5).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_reaches_the_child_unchanged() {
        let run = KilledRun {
            step: Step::AfterRecordDurable,
            variant: "pg-xa".into(),
            name: "kill9-after-record-durable-1-2".into(),
            dir: PathBuf::from("/tmp/a;b"),
        };
        assert_eq!(KilledRun::decode(&run.encode()), run);
    }

    #[test]
    fn differences_name_missing_and_doubled_records() {
        assert_eq!(
            first_differences(&[0, 1, 1, 3], &[0, 1, 2]),
            vec!["missing 2", "1 seen 2x", "3 seen 1x"]
        );
    }
}
