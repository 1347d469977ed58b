//! The engine that runs one scenario: it sets up the job (`job.rs`: the real driver, a durable local checkpoint
//! store, crash injection and replay from restored positions, the visibility checks after every restart) and
//! carries the scenario out. The scenarios themselves are in `scenario.rs` (what they are), `overlap.rs` (two
//! instances at once), `alone.rs` (one sink instance on its own) and `handover.rs`.

use std::sync::{Arc, Mutex};

use connector_api::{LocalCheckpointStore, Report as ErrorReport};

use super::alone::{abort_then_run, commit_twice, zombie};
use super::job::{Job, head_str};
use super::scenario::{CrashAt, Scenario, Stats, sinks};
use super::source::Rng;
use super::store::HarnessStore;
use super::{Conformance, ConformanceTarget, ReportRow};

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
        plans_checked: stats.plans_checked,
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
    // Checkpoint 3 is the second one a fresh job takes (its start consumes id 1): one committed checkpoint
    // precedes the crash. A restart after a crash at 3's durable record takes id 4 for its start record.
    let (records, armed, random) = match scenario {
        Scenario::Crash(
            at @ (CrashAt::BetweenRecoveries | CrashAt::InsideRecover | CrashAt::AfterRecovery),
        ) => (
            config.records,
            vec![(3, CrashAt::AfterRecordDurable), (4, *at)],
            None,
        ),
        Scenario::Crash(at) => (config.records, vec![(3, *at)], None),
        Scenario::RecoverTwice => (
            config.records,
            vec![
                (3, CrashAt::AfterRecordDurable),
                (4, CrashAt::AfterRecovery),
            ],
            None,
        ),
        Scenario::Random { seed } => (config.random_records, Vec::new(), Some(Rng::new(*seed))),
        _ => (config.records, Vec::new(), None),
    };
    let store_dir =
        tempfile::tempdir().map_err(|e| format!("cannot create a checkpoint directory: {e}"))?;
    let local =
        LocalCheckpointStore::open(store_dir.path(), 3).map_err(|e| ErrorReport(&e).to_string())?;
    let job = Job {
        target,
        run,
        config,
        records,
        store: HarnessStore::new(local, config.store_bug),
        armed: Arc::new(Mutex::new(armed)),
        random,
    };
    match scenario {
        Scenario::Zombie => zombie(&job, stats).await?,
        Scenario::ForeignSubtaskHandover => super::handover::foreign_subtask(&job).await?,
        Scenario::Abort => {
            abort_then_run(&job).await?;
            job.run_to_end(stats).await?;
        }
        Scenario::CommitTwice => {
            job.run_to_end(stats).await?;
            commit_twice(&job).await?;
        }
        Scenario::TwoStarters => super::overlap::two_starters(&job, stats).await?,
        Scenario::ZombieSaves => super::overlap::zombie_saves(&job, stats).await?,
        Scenario::LapsedClaim => super::overlap::lapsed_claim(&job, stats).await?,
        Scenario::SaveInDoubt => {
            job.store.in_doubt_at(3);
            job.run_to_end(stats).await?;
        }
        Scenario::RecoverTwice => {
            job.run_to_end(stats).await?;
            let restarts = &stats.restored[1..];
            if restarts.len() < 2 || restarts[0].is_none() || restarts[0] != restarts[1] {
                return Err(format!(
                    "recovery did not run twice over the same record: restarts restored {restarts:?}"
                ));
            }
        }
        _ => job.run_to_end(stats).await?,
    }
    // A final recovery: whatever crashed attempts and zombies left behind must be gone afterwards.
    let (driver, _) = job.start(stats).await?.ok_or("the final start crashed")?;
    driver
        .close()
        .await
        .map_err(|e| format!("close after the final recovery: {}", ErrorReport(&e)))?;
    for sink in sinks() {
        job.expect_exactly(&sink, records, "at the end").await?;
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
