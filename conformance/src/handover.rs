//! The foreign-subtask handover: a recovery commits committables another subtask pre-committed, exactly once.
//! Rescaling and taking over a vanished subtask both hand a subtask's last checkpoint to another subtask's
//! recovery; the contract requires every sink to accept them (see `TwoPhaseCommit`, "Contract").

use connector_api::{CheckpointId, Committer, Report as ErrorReport, SubtaskId, TwoPhaseCommit};

use super::ConformanceTarget;
use super::job::Job;
use super::scenario::sinks;
use super::source::conformance_batch as batch;

/// See [`Scenario::ForeignSubtaskHandover`](super::Scenario::ForeignSubtaskHandover). Every record of the run is
/// written by subtask 1 in checkpoint 1, so the engine's final check (every record exactly once, nothing left
/// behind) applies unchanged.
pub(super) async fn foreign_subtask<T: ConformanceTarget>(job: &Job<'_, T>) -> Result<(), String> {
    let step =
        |what: &'static str| move |e: connector_api::Error| format!("{what}: {}", ErrorReport(&e));
    let checkpoint = CheckpointId(1);
    for sink in sinks() {
        let mut writer = job.subtask_sink(&sink, SubtaskId(1)).await?;
        writer
            .recover(None)
            .await
            .map_err(step("subtask 1 recover"))?;
        writer
            .begin(checkpoint)
            .await
            .map_err(step("subtask 1 begin"))?;
        writer
            .write(&batch(0..job.records))
            .await
            .map_err(step("subtask 1 write"))?;
        let committable = writer
            .pre_commit(checkpoint)
            .await
            .map_err(step("subtask 1 pre_commit"))?;
        job.expect_visible(&sink, 0, "after subtask 1 pre-committed")
            .await?;

        // Subtask 0 takes over subtask 1's decided checkpoint.
        let mut taker = job.sink(&sink).await?;
        let plan = taker
            .plan_recovery(Some((checkpoint, vec![committable.clone()])))
            .await
            .map_err(step("subtask 0 plans the takeover"))?;
        // A sink whose rows are visible at pre-commit (an upsert table) may already show it committed.
        if plan.commit.len() + plan.already_committed != 1 {
            return Err(format!(
                "sink {sink}: subtask 0's plan accounts for {} of subtask 1's 1 committable ({} to commit, {} \
                 already committed)",
                plan.commit.len() + plan.already_committed,
                plan.commit.len(),
                plan.already_committed
            ));
        }
        taker
            .execute_recovery(plan)
            .await
            .map_err(step("subtask 0 recovers subtask 1's checkpoint"))?;
        job.expect_exactly(
            &sink,
            job.records,
            "after subtask 0 took over subtask 1's checkpoint",
        )
        .await?;

        // The first subtask-1 instance, still alive, commits again; its errors are expected (it may be fenced).
        if let Err(e) = writer.committer().commit(vec![committable.clone()]).await {
            tracing::info!(error = %ErrorReport(&e), "the old subtask-1 instance's commit refused (expected)");
        }
        job.expect_exactly(
            &sink,
            job.records,
            "after the old subtask-1 instance committed again",
        )
        .await?;

        // Subtask 1's own recovery of the same checkpoint finds it committed.
        let mut successor = job.subtask_sink(&sink, SubtaskId(1)).await?;
        let plan = successor
            .plan_recovery(Some((checkpoint, vec![committable])))
            .await
            .map_err(step("subtask 1 plans its recovery"))?;
        if !plan.commit.is_empty() {
            return Err(format!(
                "sink {sink}: subtask 1's recovery would commit its checkpoint again after subtask 0 committed it"
            ));
        }
        successor
            .execute_recovery(plan)
            .await
            .map_err(step("subtask 1 recovers"))?;
        job.expect_exactly(&sink, job.records, "after subtask 1's own recovery")
            .await?;
    }
    Ok(())
}
