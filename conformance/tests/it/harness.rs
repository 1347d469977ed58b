//! The harness proves itself: the reference sink passes every scenario, and each deliberately broken variant
//! fails at least one, in the scenario that targets its bug.

use async_trait::async_trait;
use connector_api::{Result, SinkId, SubtaskId};
use ratchet_conformance::reference::{Broken, ReferenceSink, ReferenceSystem};
use ratchet_conformance::{Conformance, ConformanceTarget, Report, StoreBug, run_conformance};

struct Reference(ReferenceSystem);

#[async_trait]
impl ConformanceTarget for Reference {
    type Sink = ReferenceSink;

    async fn create_sink(&self, run: &str, sink: &SinkId, _: SubtaskId) -> Result<ReferenceSink> {
        Ok(self.0.sink(run, sink))
    }

    async fn visible_ids(&self, run: &str, sink: &SinkId) -> Result<Vec<i64>> {
        Ok(self.0.visible(run, sink))
    }
}

async fn run(system: ReferenceSystem, name: &str) -> Report {
    let config = Conformance {
        random_runs: 4,
        ..Conformance::default()
    };
    run_conformance(name, &Reference(system), &config).await
}

async fn run_with_store(bug: StoreBug, name: &str) -> Report {
    let config = Conformance {
        random_runs: 0,
        store_bug: Some(bug),
        ..Conformance::default()
    };
    run_conformance(name, &Reference(ReferenceSystem::new()), &config).await
}

fn failed(report: &Report) -> Vec<String> {
    report
        .failures()
        .iter()
        .map(|r| r.scenario.clone())
        .collect()
}

#[tokio::test]
async fn the_reference_sink_passes_every_scenario() {
    let report = run(ReferenceSystem::new(), "reference").await;
    report.assert_passed();
    assert!(
        report.rows.iter().map(|r| r.crashes).sum::<u32>() >= 8,
        "{report}"
    );
}

#[tokio::test]
async fn a_non_idempotent_commit_is_caught() {
    let report = run(
        ReferenceSystem::broken(Broken::NonIdempotentCommit),
        "non-idempotent-commit",
    )
    .await;
    let failed = failed(&report);
    // Recovery commits only what its plan finds not yet committed (`Committer::is_committed`), so a crash after
    // a commit no longer commits again through recovery; the committer's own second commit is what shows it.
    assert!(failed.contains(&"commit-twice".to_string()), "{report}");
}

/// A sink whose `is_committed` never admits a commit plans to commit the restored checkpoint again after every
/// recovery: inspect does not match recover, and the harness says so.
#[tokio::test]
async fn a_plan_that_never_sees_its_commits_is_caught() {
    let report = run(
        ReferenceSystem::broken(Broken::BlindIsCommitted),
        "blind-is-committed",
    )
    .await;
    let failed = failed(&report);
    assert!(
        failed.contains(&"crash-after-record-durable".to_string()),
        "{report}"
    );
    assert!(
        failed.contains(&"foreign-subtask-handover".to_string()),
        "{report}"
    );
}

#[tokio::test]
async fn a_recovery_that_notes_progress_before_committing_is_caught() {
    let report = run(
        ReferenceSystem::broken(Broken::RecoverCommitsOnlyOnce),
        "recover-commits-only-once",
    )
    .await;
    assert_eq!(failed(&report), ["crash-inside-recover"], "{report}");
}

#[tokio::test]
async fn a_store_without_fencing_is_caught() {
    let report = run_with_store(StoreBug::NoFencing, "store-without-fencing").await;
    let failed = failed(&report);
    assert!(failed.contains(&"two-starters".to_string()), "{report}");
    assert!(failed.contains(&"zombie-saves".to_string()), "{report}");
}

#[tokio::test]
async fn a_recovery_that_runs_after_its_claim_lapsed_is_caught() {
    let report = run_with_store(
        StoreBug::LapsedClaimStillPasses,
        "lapsed-claim-still-passes",
    )
    .await;
    assert_eq!(failed(&report), ["lapsed-claim"], "{report}");
}

#[tokio::test]
async fn a_driver_that_aborts_a_checkpoint_whose_save_outcome_is_unknown_is_caught() {
    let report = run_with_store(StoreBug::ReportsStoredAsFailed, "stored-reported-as-failed").await;
    assert_eq!(failed(&report), ["save-in-doubt"], "{report}");
}

#[tokio::test]
async fn a_recovery_that_forgets_lingering_transactions_is_caught() {
    let report = run(
        ReferenceSystem::broken(Broken::RecoverForgetsAbort),
        "recover-forgets-abort",
    )
    .await;
    assert!(
        failed(&report).contains(&"crash-after-first-pre-commit".to_string()),
        "{report}"
    );
}

#[tokio::test]
async fn a_pre_commit_that_does_not_flush_is_caught() {
    let report = run(
        ReferenceSystem::broken(Broken::PreCommitNoFlush),
        "pre-commit-no-flush",
    )
    .await;
    assert!(
        failed(&report).contains(&"happy-path".to_string()),
        "{report}"
    );
}

#[tokio::test]
async fn an_unfenced_zombie_is_caught() {
    let report = run(
        ReferenceSystem::broken(Broken::ZombieNotFenced),
        "zombie-not-fenced",
    )
    .await;
    assert_eq!(failed(&report), ["zombie"], "{report}");
}
