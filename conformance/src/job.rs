//! One scenario's job: two sinks of the target under the real driver, a durable local checkpoint store (with the
//! harness's faults), crash injection at the armed steps, replay from restored positions, and the oracle that
//! checks what each sink shows after every restart against what was decided.

use std::sync::{Arc, Mutex};

use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, Driver, DriverConfig, ErrorKind, PlanSummary,
    Report as ErrorReport, RetryPolicy, SinkId, SubtaskId, TwoPhaseCommit, committables_in,
};

use super::faults::{Armed, HarnessFaults, Pause};
use super::scenario::{CrashAt, Stats, sinks};
use super::source::{
    Rng, conformance_batch as batch, conformance_positions as positions, resume_offset,
};
use super::store::HarnessStore;
use super::{Conformance, ConformanceTarget};

/// The first few of `items`, and how many there are.
pub(super) fn head_str(items: &[String]) -> String {
    let shown: Vec<&str> = items.iter().take(5).map(String::as_str).collect();
    format!("{} ({} in all)", shown.join(", "), items.len())
}

pub(super) struct Job<'a, T> {
    pub(super) target: &'a T,
    pub(super) run: &'a str,
    pub(super) config: &'a Conformance,
    pub(super) records: i64,
    pub(super) store: HarnessStore,
    pub(super) armed: Armed,
    pub(super) random: Option<Rng>,
}

/// A started driver and the source position it resumes from.
pub(super) type Started = (Driver<HarnessStore>, i64);

impl<T: ConformanceTarget> Job<'_, T> {
    /// Checks what `sink` shows at an intermediate point (after a restart, after an abort): records `0..upto`,
    /// each exactly once; for a target whose rows become visible at pre-commit
    /// ([`Conformance::visible_at_pre_commit`]), also any later records, each at most once.
    pub(super) async fn expect_visible(
        &self,
        sink: &SinkId,
        upto: i64,
        when: &str,
    ) -> Result<(), String> {
        if !self.config.visible_at_pre_commit {
            return self.expect_exactly(sink, upto, when).await;
        }
        let ids = self.sorted_ids(sink, when).await?;
        let below = ids.partition_point(|id| *id < upto);
        let expected: Vec<i64> = (0..upto).collect();
        let mut duplicates: Vec<i64> = ids
            .windows(2)
            .filter(|p| p[0] == p[1])
            .map(|p| p[0])
            .collect();
        duplicates.dedup();
        let out_of_range: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| *id < 0 || *id >= self.records)
            .collect();
        if ids[..below] == expected[..] && duplicates.is_empty() && out_of_range.is_empty() {
            return Ok(());
        }
        Err(format!(
            "sink {sink} {when}: expected records 0..{upto} once each (and later ones at most once), saw {} rows: \
             duplicates {:?}, not from the source {:?}, {} of 0..{upto} visible",
            ids.len(),
            head(&duplicates),
            head(&out_of_range),
            below
        ))
    }

    /// The ids `sink` shows, sorted.
    async fn sorted_ids(&self, sink: &SinkId, when: &str) -> Result<Vec<i64>, String> {
        let mut ids = self
            .target
            .visible_ids(self.run, sink)
            .await
            .map_err(|e| format!("reading sink {sink} {when}: {}", ErrorReport(&e)))?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// Checks that `sink` shows records `0..upto`, each exactly once.
    pub(super) async fn expect_exactly(
        &self,
        sink: &SinkId,
        upto: i64,
        when: &str,
    ) -> Result<(), String> {
        let ids = self.sorted_ids(sink, when).await?;
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

    /// A driver over the job's store with both sinks added, crashing where armed and pausing at `pauses`.
    pub(super) async fn driver(&self, pauses: Vec<Pause>) -> Result<Driver<HarnessStore>, String> {
        let config = DriverConfig {
            retry: RetryPolicy {
                max_attempts: 3,
                initial_backoff: std::time::Duration::from_millis(10),
                max_backoff: std::time::Duration::from_millis(50),
                max_total_backoff: std::time::Duration::from_secs(1),
            },
            ..DriverConfig::default()
        };
        let faults = HarnessFaults {
            armed: self.armed.clone(),
            pauses: Mutex::new(pauses),
        };
        let mut driver =
            Driver::new(self.store.clone(), config).with_fault_injector(Arc::new(faults));
        for sink in sinks() {
            driver
                .add_sink(self.sink(&sink).await?)
                .map_err(|e| ErrorReport(&e).to_string())?;
        }
        Ok(driver)
    }

    /// Starts `driver` and checks what is visible right after recovery. `None`: an armed crash fired during the
    /// start (the caller restarts).
    pub(super) async fn start_driver(
        &self,
        mut driver: Driver<HarnessStore>,
        stats: &mut Stats,
    ) -> Result<Option<Started>, String> {
        stats.starts += 1;
        let loaded = self
            .store
            .load()
            .await
            .map_err(|e| format!("loading the checkpoint store: {}", ErrorReport(&e)))?;
        stats.restored.push(loaded.record.as_ref().map(|r| r.id));
        // Inspect matches recover: the plan made before a restart is what its recovery does.
        let planned = if stats.starts > 1 {
            Some(self.plans("before a restart").await?)
        } else {
            None
        };
        let crashes_before = self.armed_len();
        let restored = match driver.start().await {
            Ok(restored) => restored,
            Err(_) if self.armed_len() < crashes_before => {
                stats.crashes += 1;
                return Ok(None);
            }
            Err(e) => return Err(format!("start #{}: {}", stats.starts, ErrorReport(&e))),
        };
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
        if let Some(planned) = planned {
            let after = self
                .replans(
                    &planned,
                    loaded.record.as_ref(),
                    driver.current_checkpoint(),
                )
                .await?;
            plans_carried_out(&planned, &after)?;
            stats.plans_checked += 1;
        }
        Ok(Some((driver, offset)))
    }

    /// Starts a driver with fresh instances of both sinks; see [`Job::start_driver`].
    pub(super) async fn start(&self, stats: &mut Stats) -> Result<Option<Started>, String> {
        let driver = self.driver(Vec::new()).await?;
        self.start_driver(driver, stats).await
    }

    /// Writes the next checkpoint's batches (seeded sizes) into both sinks from `next`; returns the new position.
    pub(super) async fn write_checkpoint(
        &self,
        driver: &mut Driver<HarnessStore>,
        batches: &mut Rng,
        mut next: i64,
    ) -> Result<i64, String> {
        let checkpoint = driver.current_checkpoint().0;
        for _ in 0..self.config.batches_per_checkpoint {
            let size = batches.below(self.config.max_batch as u64 + 1) as i64;
            let end = (next + size).min(self.records);
            let rows = batch(next..end);
            for sink in sinks() {
                let handle = driver
                    .handle_of(&sink)
                    .ok_or("a sink of the job is missing")?;
                driver.write(handle, &rows).await.map_err(|e| {
                    format!("write at checkpoint {checkpoint}: {}", ErrorReport(&e))
                })?;
            }
            next = end;
        }
        Ok(next)
    }

    /// Runs the job from its last durable checkpoint to the end of the source, restarting after every crash.
    pub(super) async fn run_to_end(&self, stats: &mut Stats) -> Result<(), String> {
        let mut batches = Rng::new(self.config.seed ^ 0xBA7C);
        let mut random = self.random.clone();
        'attempt: loop {
            let Some((mut driver, mut next)) = self.start(stats).await? else {
                continue 'attempt;
            };
            while next < self.records {
                let checkpoint = driver.current_checkpoint().0;
                next = self
                    .write_checkpoint(&mut driver, &mut batches, next)
                    .await?;
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
                let crashed = self.armed_len() < crashes_before;
                if let Err(e) = outcome {
                    if crashed
                        || (e.kind() == ErrorKind::InDoubt && self.store.take_fired())
                        || (self.config.store_bug.is_some() && self.store.take_fired())
                    {
                        stats.crashes += 1;
                        drop(driver);
                        continue 'attempt;
                    }
                    return Err(format!("checkpoint {checkpoint}: {}", ErrorReport(&e)));
                }
                if crashed {
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

    /// A new instance of subtask 0 of `sink`.
    pub(super) async fn sink(&self, sink: &SinkId) -> Result<T::Sink, String> {
        self.subtask_sink(sink, SubtaskId(0)).await
    }

    /// A new instance of `subtask` of `sink`.
    pub(super) async fn subtask_sink(
        &self,
        sink: &SinkId,
        subtask: SubtaskId,
    ) -> Result<T::Sink, String> {
        self.target
            .create_sink(self.run, sink, subtask)
            .await
            .map_err(|e| {
                format!(
                    "creating subtask {subtask} of sink {sink}: {}",
                    ErrorReport(&e)
                )
            })
    }

    /// Each sink's plan for the same restored checkpoint as `planned` (read from `record`, the record the restart
    /// recovered), made by a fresh instance after the recovery: what the recovery left undone. Items of the
    /// checkpoint the started driver has `begun` since are its own, not leftovers, and are left out.
    async fn replans(
        &self,
        planned: &[(SinkId, PlanSummary)],
        record: Option<&CheckpointRecord>,
        begun: CheckpointId,
    ) -> Result<Vec<(SinkId, PlanSummary)>, String> {
        let mut after = Vec::new();
        for (sink, before) in planned {
            let mut probe = self.sink(sink).await?;
            let restored = match (before.checkpoint, record) {
                (Some(_), Some(record)) => committables_in(&probe, record)
                    .map_err(|e| format!("sink {sink}: {}", ErrorReport(&e)))?
                    .map(|c| (record.id, c)),
                _ => None,
            };
            let mut plan = probe
                .plan_recovery(restored)
                .await
                .map_err(|e| {
                    format!(
                        "planning again after recovery, sink {sink}: {}",
                        ErrorReport(&e)
                    )
                })?
                .summary();
            plan.found.retain(|t| t.checkpoint != Some(begun));
            after.push((sink.clone(), plan));
        }
        Ok(after)
    }

    /// Each sink's recovery plan as `ratchet inspect` computes it: a driver over the job's store with fresh
    /// instances, inspected (read-only, nothing started).
    async fn plans(&self, when: &str) -> Result<Vec<(SinkId, PlanSummary)>, String> {
        let mut driver = Driver::new(self.store.clone(), DriverConfig::default());
        for sink in sinks() {
            driver
                .add_sink(self.sink(&sink).await?)
                .map_err(|e| ErrorReport(&e).to_string())?;
        }
        let inspection = driver
            .inspect()
            .await
            .map_err(|e| format!("inspect {when}: {}", ErrorReport(&e)))?;
        inspection
            .sinks
            .into_iter()
            .map(|s| match s.plan {
                Ok(plan) => Ok((s.sink, plan)),
                Err(e) => Err(format!(
                    "inspect {when}, sink {}: {}",
                    s.sink,
                    ErrorReport(&e)
                )),
            })
            .collect()
    }
}

/// Checks that recovery did what `planned` said, from the plans made right after it (`after`): nothing of the
/// restored checkpoint left to commit, and nothing found open (every planned abort is gone, and every planned
/// commit is no longer pending).
fn plans_carried_out(
    planned: &[(SinkId, PlanSummary)],
    after: &[(SinkId, PlanSummary)],
) -> Result<(), String> {
    for ((sink, before), (_, after)) in planned.iter().zip(after) {
        let left = &after.found;
        if after.commits > 0 {
            return Err(format!(
                "sink {sink}: inspect planned {} commit(s) of checkpoint {:?}; after recovery {} are still not \
                 visible",
                before.commits, before.checkpoint, after.commits
            ));
        }
        if !left.is_empty() {
            let names: Vec<String> = left
                .iter()
                .map(|t| format!("{} ({})", t.name, t.state))
                .collect();
            let planned: Vec<String> = before
                .found
                .iter()
                .map(|t| format!("{} -> {:?}", t.name, t.resolution))
                .collect();
            return Err(format!(
                "sink {sink}: after recovery it still holds {}; inspect had planned {}",
                head_str(&names),
                if planned.is_empty() {
                    "nothing".to_string()
                } else {
                    head_str(&planned)
                }
            ));
        }
    }
    Ok(())
}

fn head(ids: &[i64]) -> Vec<i64> {
    ids.iter().take(8).copied().collect()
}
