//! The overlap scenarios: two instances of one job at once, the way production runs overlap (a restart while the
//! old process is paused rather than dead; two starts at once). Each interleaving is forced with pauses at fault
//! points; every pause also ends after a bounded wait, because with correct fencing the other instance is blocked
//! (waiting for the claim) rather than racing ahead.

use std::sync::Arc;
use std::time::Duration;

use connector_api::{FaultPoint, Report as ErrorReport};
use tokio::sync::Notify;

use super::ConformanceTarget;
use super::faults::Pause;
use super::job::Job;
use super::scenario::{Stats, sinks};
use super::source::{Rng, conformance_positions as positions};

/// How long a paused instance waits for the other one.
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// How long a pause whose release always comes (another instance's recovery finishing) may last: bounded only so
/// that a sink whose recovery hangs fails the scenario instead of hanging the suite. A short bound here would let
/// the paused instance go on before the other recovered when recoveries are slow (a loaded machine, TLS, several
/// scenarios at once), and the scenario would no longer test what it names.
const RELEASED_PAUSE: Duration = Duration::from_secs(60);

/// A pause at `point` (of `checkpoint`, or any) that signals `reached` and waits for `release`, at most
/// [`MAX_PAUSE`]: where two instances would otherwise wait for each other (a claim held while paused), the bound
/// is what lets one go on.
fn pause(
    point: FaultPoint,
    checkpoint: Option<u64>,
    reached: &Arc<Notify>,
    release: &Arc<Notify>,
) -> Pause {
    Pause {
        point,
        checkpoint,
        reached: reached.clone(),
        release: release.clone(),
        max_wait: MAX_PAUSE,
    }
}

/// Runs checkpoint 2 to completion and leaves checkpoint 3's commit in flight when the instance dies (dropped):
/// state for the next instances to recover.
async fn first_run<T: ConformanceTarget>(
    job: &Job<'_, T>,
    stats: &mut Stats,
    batches: &mut Rng,
) -> Result<(), String> {
    let (mut driver, mut next) = job.start(stats).await?.ok_or("the first start crashed")?;
    for _ in 0..2 {
        next = job.write_checkpoint(&mut driver, batches, next).await?;
        driver
            .checkpoint(positions(next))
            .await
            .map_err(|e| ErrorReport(&e).to_string())?;
        stats.checkpoints += 1;
    }
    drop(driver);
    stats.crashes += 1;
    Ok(())
}

/// See [`Scenario::TwoStarters`](super::Scenario::TwoStarters).
pub(super) async fn two_starters<T: ConformanceTarget>(
    job: &Job<'_, T>,
    stats: &mut Stats,
) -> Result<(), String> {
    let mut batches = Rng::new(job.config.seed ^ 0x2517);
    first_run(job, stats, &mut batches).await?;

    let first_loaded = Arc::new(Notify::new());
    let second_decided = Arc::new(Notify::new());
    let first_started = Arc::new(Notify::new());
    // The first starter pauses after loading the last record until the second has decided a checkpoint.
    let first = job
        .driver(vec![pause(
            FaultPoint::AfterLoad,
            None,
            &first_loaded,
            &second_decided,
        )])
        .await?;
    // The second holds its decided checkpoint uncommitted until the first's start is over.
    let second = job
        .driver(vec![pause(
            FaultPoint::AfterRecordDurable,
            None,
            &second_decided,
            &first_started,
        )])
        .await?;

    let mut first_stats = Stats::default();
    let mut second_stats = Stats::default();
    let first_run = async {
        let started = job.start_driver(first, &mut first_stats).await;
        first_started.notify_one();
        started
    };
    let second_run = async {
        let _ = tokio::time::timeout(MAX_PAUSE, first_loaded.notified()).await;
        let (mut driver, next) = job
            .start_driver(second, &mut second_stats)
            .await?
            .ok_or("the second start crashed")?;
        let mut batches = batches.clone();
        let next = job
            .write_checkpoint(&mut driver, &mut batches, next)
            .await?;
        let decided = driver.checkpoint(positions(next)).await;
        let committed = driver.finish_commit().await;
        Ok::<_, String>((driver, decided, committed))
    };
    let (first_outcome, second_outcome) = tokio::join!(first_run, second_run);
    stats.starts += first_stats.starts + second_stats.starts;

    // Whichever instance claimed last owns the job; the other may not decide anything from now on.
    if let Ok(Some((mut stale, next))) = first_outcome {
        let mut batches = Rng::new(job.config.seed ^ 0x51A1);
        let written = job.write_checkpoint(&mut stale, &mut batches, next).await;
        if written.is_ok() && stale.checkpoint(positions(job.records)).await.is_ok() {
            // Legitimate only if the second instance lost the claim (its checkpoint was refused).
            if matches!(&second_outcome, Ok((_, Ok(_), _))) {
                return Err(
                    "both instances decided checkpoints after starting at once: the one that lost the claim \
                     was not fenced"
                        .into(),
                );
            }
        }
    }
    drop(second_outcome);
    stats.crashes += 1;
    job.run_to_end(stats).await
}

/// See [`Scenario::ZombieSaves`](super::Scenario::ZombieSaves).
pub(super) async fn zombie_saves<T: ConformanceTarget>(
    job: &Job<'_, T>,
    stats: &mut Stats,
) -> Result<(), String> {
    let mut batches = Rng::new(job.config.seed ^ 0x20B1);
    let zombie_paused = Arc::new(Notify::new());
    let replacement_recovered = Arc::new(Notify::new());
    let zombie_done = Arc::new(Notify::new());
    let [_, b] = sinks();
    // The zombie goes on only once the replacement recovered, however long that takes.
    let zombie = job
        .driver(vec![Pause {
            max_wait: RELEASED_PAUSE,
            ..pause(
                FaultPoint::AfterPreCommit { sink: b.clone() },
                Some(3),
                &zombie_paused,
                &replacement_recovered,
            )
        }])
        .await?;
    let (mut zombie, mut next) = job
        .start_driver(zombie, stats)
        .await?
        .ok_or("the zombie's start crashed")?;
    next = job
        .write_checkpoint(&mut zombie, &mut batches, next)
        .await?;
    zombie
        .checkpoint(positions(next))
        .await
        .map_err(|e| ErrorReport(&e).to_string())?;
    stats.checkpoints += 1;
    zombie
        .finish_commit()
        .await
        .map_err(|e| ErrorReport(&e).to_string())?;
    next = job
        .write_checkpoint(&mut zombie, &mut batches, next)
        .await?;

    let replacement = job
        .driver(vec![pause(
            FaultPoint::AfterRecover { sink: b },
            None,
            &replacement_recovered,
            &zombie_done,
        )])
        .await?;
    let mut replacement_stats = Stats {
        starts: 1, // the replacement is a restart: check what is visible after its recovery
        ..Stats::default()
    };
    let zombie_run = async {
        let decided = zombie.checkpoint(positions(next)).await;
        let committed = zombie.finish_commit().await;
        zombie_done.notify_one();
        (decided, committed)
    };
    let replacement_run = async {
        let _ = tokio::time::timeout(MAX_PAUSE, zombie_paused.notified()).await;
        job.start_driver(replacement, &mut replacement_stats).await
    };
    let ((decided, _), replacement) = tokio::join!(zombie_run, replacement_run);
    stats.starts += replacement_stats.starts - 1;
    stats.crashes += 1;
    if let Ok(checkpoint) = decided {
        return Err(format!(
            "the zombie decided checkpoint {checkpoint} after its replacement had recovered"
        ));
    }
    if let Some((driver, _)) = replacement? {
        driver
            .close()
            .await
            .map_err(|e| format!("close of the replacement: {}", ErrorReport(&e)))?;
    }
    job.run_to_end(stats).await
}

/// See [`Scenario::LapsedClaim`](super::Scenario::LapsedClaim).
pub(super) async fn lapsed_claim<T: ConformanceTarget>(
    job: &Job<'_, T>,
    stats: &mut Stats,
) -> Result<(), String> {
    let mut batches = Rng::new(job.config.seed ^ 0x1A95);
    first_run(job, stats, &mut batches).await?;

    let first_loaded = Arc::new(Notify::new());
    let second_decided = Arc::new(Notify::new());
    let first_done = Arc::new(Notify::new());
    let first = job
        .driver(vec![pause(
            FaultPoint::AfterLoad,
            None,
            &first_loaded,
            &second_decided,
        )])
        .await?;
    let second = job
        .driver(vec![pause(
            FaultPoint::AfterRecordDurable,
            None,
            &second_decided,
            &first_done,
        )])
        .await?;
    let mut first_stats = Stats::default();
    let mut second_stats = Stats::default();
    let first_run = async {
        let started = job.start_driver(first, &mut first_stats).await;
        first_done.notify_one();
        started
    };
    let second_run = async {
        tokio::time::timeout(MAX_PAUSE, first_loaded.notified())
            .await
            .map_err(|_| "the first instance never reached its pause after loading".to_string())?;
        // The first instance's claim lapses while it is paused: its lock is released, its checks fail.
        job.store.lapse_claims();
        let (mut driver, next) = job
            .start_driver(second, &mut second_stats)
            .await?
            .ok_or("the second start crashed")?;
        let next = job
            .write_checkpoint(&mut driver, &mut batches, next)
            .await?;
        let decided = driver
            .checkpoint(positions(next))
            .await
            .map_err(|e| format!("the second instance's checkpoint: {}", ErrorReport(&e)))?;
        driver.finish_commit().await.map_err(|e| {
            format!(
                "the second instance's commit of checkpoint {decided}: {}",
                ErrorReport(&e)
            )
        })?;
        driver
            .close()
            .await
            .map_err(|e| format!("close of the second instance: {}", ErrorReport(&e)))?;
        Ok::<_, String>(())
    };
    let (first_outcome, second_outcome) = tokio::join!(first_run, second_run);
    stats.starts += first_stats.starts + second_stats.starts;
    stats.crashes += 1;
    if let Ok(Some(_)) = first_outcome {
        return Err(
            "an instance whose claim lapsed while it was paused recovered anyway (it may have aborted what the \
             next owner decided)"
                .into(),
        );
    }
    second_outcome?;
    job.run_to_end(stats).await
}
