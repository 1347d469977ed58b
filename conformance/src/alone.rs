//! Scenarios about one sink instance on its own, beside the job: a zombie that keeps writing after a new instance
//! recovered, an aborted checkpoint, a commit repeated after recovery.

use connector_api::{
    CheckpointId, CheckpointStore, Committer, Report as ErrorReport, TwoPhaseCommit,
};

use super::ConformanceTarget;
use super::job::Job;
use super::scenario::{Stats, sinks};
use super::source::{conformance_batch as batch, conformance_positions as positions};

/// A zombie of sink `a` begins checkpoint 1 and writes; a new job starts (recovering, which must fence it) and
/// runs; the zombie pre-commits and commits in the middle of the job's run and again after it.
pub(super) async fn zombie<T: ConformanceTarget>(
    job: &Job<'_, T>,
    stats: &mut Stats,
) -> Result<(), String> {
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
    let (mut driver, next) = job.start(stats).await?.ok_or("the start crashed")?;
    zombie_finish(&mut zombie, 1).await;
    let end = (next + 25).min(job.records);
    for sink in sinks() {
        let handle = driver
            .handle_of(&sink)
            .ok_or("a sink of the job is missing")?;
        driver
            .write(handle, &batch(next..end))
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
pub(super) async fn zombie_finish<S: TwoPhaseCommit>(zombie: &mut S, checkpoint: u64) {
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
pub(super) async fn abort_then_run<T: ConformanceTarget>(job: &Job<'_, T>) -> Result<(), String> {
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
pub(super) async fn commit_twice<T: ConformanceTarget>(job: &Job<'_, T>) -> Result<(), String> {
    let record = job
        .store
        .load()
        .await
        .map_err(|e| ErrorReport(&e).to_string())?
        .record
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
