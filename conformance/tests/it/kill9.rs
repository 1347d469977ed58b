//! The `kill -9` runner proves itself: on the reference sink whose system lives in a file (so it outlives the
//! killed child), the correct sink passes at every step, and a sink that loses records at pre-commit or leaves a
//! transaction open at recovery makes the runner fail. (A commit that is not idempotent is not among them: a
//! recovery plan asks `is_committed` first and never repeats a commit the sink reports done; the harness's
//! commit-twice scenario catches that bug by calling commit twice itself.)

use async_trait::async_trait;
use connector_api::{Result, SinkId};
use ratchet_conformance::kill9::{KillNine, KillTarget, KilledRun};
use ratchet_conformance::reference::{Broken, ReferenceSink, ReferenceSystem};

const KILL9: KillNine = KillNine::new("kill9::child", "RATCHET_REFERENCE_KILL9_CHILD");

/// The reference sink, correct or with the bug the variant names, its system in the run's directory.
struct Reference {
    bug: Option<Broken>,
}

impl Reference {
    fn of(variant: &str) -> Reference {
        let bug = match variant {
            "correct" => None,
            "pre-commit-no-flush" => Some(Broken::PreCommitNoFlush),
            "recover-forgets-abort" => Some(Broken::RecoverForgetsAbort),
            other => panic!("no reference variant {other:?}"),
        };
        Reference { bug }
    }

    fn system(&self, run: &KilledRun) -> ReferenceSystem {
        ReferenceSystem::persistent(run.dir.join("system.json"), self.bug)
    }
}

fn sink_id() -> SinkId {
    SinkId::new("reference").unwrap()
}

#[async_trait]
impl KillTarget for Reference {
    type Sink = ReferenceSink;

    async fn create_sink(&self, run: &KilledRun) -> Result<ReferenceSink> {
        Ok(self.system(run).sink(&run.name, &sink_id()))
    }

    async fn visible_ids(&self, run: &KilledRun) -> Result<Vec<i64>> {
        Ok(self.system(run).visible(&run.name, &sink_id()))
    }

    async fn leftovers(&self, run: &KilledRun) -> Result<Vec<String>> {
        Ok(self.system(run).open_transactions(&run.name, &sink_id()))
    }
}

/// The child's entry point (returns at once in a normal test run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    if let Some(run) = KILL9.child_run() {
        KILL9.run_child(&Reference::of(&run.variant), run).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_sink_survives_kill_9_at_every_step() {
    KILL9.every_step(&Reference::of("correct"), "correct").await;
}

/// Runs the runner on a broken variant in a task of its own and returns its failure message (`None` if it
/// passed).
async fn runner_failure(variant: &'static str) -> Option<String> {
    let outcome =
        tokio::spawn(async move { KILL9.every_step(&Reference::of(variant), variant).await }).await;
    let panic = outcome.err()?.into_panic();
    Some(
        panic
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic without a message".into()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_a_pre_commit_loses_are_caught() {
    if KILL9.child_run().is_none() {
        let failure = runner_failure("pre-commit-no-flush").await;
        let failure = failure.expect("the runner passed a sink whose pre-commit loses records");
        assert!(failure.contains("missing 0"), "{failure}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_recovery_leaves_open_is_caught() {
    if KILL9.child_run().is_none() {
        let failure = runner_failure("recover-forgets-abort").await;
        let failure =
            failure.expect("the runner passed a sink whose recovery leaves a transaction open");
        assert!(
            failure.contains("seen 2x") || failure.contains("left behind"),
            "{failure}"
        );
    }
}
