//! The driver's own guarantees, on the reference sink: delivery guarantees behave as documented under a crash,
//! a failed checkpoint write aborts everywhere, the timeout budget is enforced, committable versions are checked.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, Claim, DeliveryGuarantee, Driver,
    DriverConfig, Error, ErrorKind, FaultPoint, GuaranteedSink, Loaded, LocalCheckpointStore,
    OwnerEpoch, Phase, RecoveryPlan, Result, RetryPolicy, SinkId, SourceOffset, TwoPhaseCommit,
    committables_in,
};
use ratchet_conformance::conformance_batch;
use ratchet_conformance::reference::{ReferenceSink, ReferenceSystem};

mod restart;

const RUN: &str = "driver-test";

fn sink_id() -> SinkId {
    SinkId::new("s").unwrap()
}

fn rows(ids: std::ops::Range<i64>) -> RecordBatch {
    conformance_batch(ids)
}

fn at(next: i64) -> Vec<SourceOffset> {
    vec![SourceOffset::new("t", 0, next)]
}

fn quick() -> DriverConfig {
    DriverConfig {
        retry: RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
            max_total_backoff: std::time::Duration::from_secs(1),
        },
        ..DriverConfig::default()
    }
}

fn sorted(mut ids: Vec<i64>) -> Vec<i64> {
    ids.sort_unstable();
    ids
}

/// Runs the first checkpoint (id 2: the start consumed id 1) over 0..10 cleanly, then the second (id 3) over
/// 10..20 crashing at `crash`, restarts, replays from
/// the restored position to 30, and returns what is visible.
async fn crash_and_replay(guarantee: DeliveryGuarantee, crash: FaultPoint) -> Vec<i64> {
    crash_and_replay_with(guarantee, crash, guarantee).await
}

/// [`crash_and_replay`], restarting with the sink run under `after` (a job file changed between the runs).
async fn crash_and_replay_with(
    guarantee: DeliveryGuarantee,
    crash: FaultPoint,
    after: DeliveryGuarantee,
) -> Vec<i64> {
    let system = ReferenceSystem::new();
    let dir = tempfile::tempdir().unwrap();
    let store = || LocalCheckpointStore::open(dir.path(), 3).unwrap();
    let fault = crash.clone();
    let mut driver = Driver::new(store(), quick()).with_fault_injector(Arc::new(
        move |cp: CheckpointId, point: &FaultPoint| cp == CheckpointId(3) && *point == fault,
    ));
    let sink = driver
        .add_sink(GuaranteedSink::new(system.sink(RUN, &sink_id()), guarantee))
        .unwrap();
    driver.start().await.unwrap();
    driver.write(sink, &rows(0..10)).await.unwrap();
    driver.checkpoint(at(10)).await.unwrap();
    driver.write(sink, &rows(10..20)).await.unwrap();
    let crashed = match driver.checkpoint(at(20)).await {
        Err(e) => e,
        Ok(_) => driver.finish_commit().await.unwrap_err(),
    };
    assert!(crashed.to_string().contains("injected crash"), "{crashed}");
    drop(driver);

    let mut driver = Driver::new(store(), quick());
    let sink = driver
        .add_sink(GuaranteedSink::new(system.sink(RUN, &sink_id()), after))
        .unwrap();
    let restored = driver.start().await.unwrap();
    let from = restored.positions[0].next_offset;
    driver.write(sink, &rows(from..30)).await.unwrap();
    driver.checkpoint(at(30)).await.unwrap();
    driver.close().await.unwrap();
    sorted(system.visible(RUN, &sink_id()))
}

#[tokio::test]
async fn a_checkpoint_decided_exactly_once_is_committed_whatever_the_sink_runs_with_after() {
    for after in [
        DeliveryGuarantee::AtLeastOnce,
        DeliveryGuarantee::AtMostOnce,
    ] {
        let seen = crash_and_replay_with(
            DeliveryGuarantee::ExactlyOnce,
            FaultPoint::AfterRecordDurable,
            after,
        )
        .await;
        assert_eq!(
            seen,
            (0..30).collect::<Vec<_>>(),
            "checkpoint 3 was decided exactly-once; the restart ran {after:?}"
        );
    }
}

#[tokio::test]
async fn a_sink_removed_while_its_decided_checkpoint_is_pending_is_refused_by_name() {
    let system = ReferenceSystem::new();
    let dir = tempfile::tempdir().unwrap();
    let store = || LocalCheckpointStore::open(dir.path(), 3).unwrap();
    let mut driver = Driver::new(store(), quick()).with_fault_injector(Arc::new(
        move |cp: CheckpointId, point: &FaultPoint| {
            cp == CheckpointId(2) && *point == FaultPoint::AfterRecordDurable
        },
    ));
    let sink = driver.add_sink(system.sink(RUN, &sink_id())).unwrap();
    let kept = driver
        .add_sink(system.sink(RUN, &SinkId::new("kept").unwrap()))
        .unwrap();
    driver.start().await.unwrap();
    driver.write(sink, &rows(0..10)).await.unwrap();
    driver.write(kept, &rows(0..10)).await.unwrap();
    assert!(driver.checkpoint(at(10)).await.is_err(), "the crash");
    drop(driver);

    let mut without = Driver::new(store(), quick());
    without
        .add_sink(system.sink(RUN, &SinkId::new("kept").unwrap()))
        .unwrap();
    let refused = without.start().await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Config, "{refused}");
    assert!(
        refused.to_string().contains("sink s") && refused.to_string().contains("no longer has"),
        "{refused}"
    );
    // Nothing was touched: with the sink back, recovery commits the checkpoint in both.
    let mut with = Driver::new(store(), quick());
    with.add_sink(system.sink(RUN, &sink_id())).unwrap();
    with.add_sink(system.sink(RUN, &SinkId::new("kept").unwrap()))
        .unwrap();
    with.start().await.unwrap();
    with.close().await.unwrap();
    assert_eq!(
        sorted(system.visible(RUN, &sink_id())),
        (0..10).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn at_least_once_repeats_but_never_loses() {
    let seen = crash_and_replay(
        DeliveryGuarantee::AtLeastOnce,
        FaultPoint::AfterPreCommit { sink: sink_id() },
    )
    .await;
    let expected: Vec<i64> = sorted((0..30).chain(10..20).collect());
    assert_eq!(
        seen, expected,
        "records 10..20 were committed at pre-commit, then replayed"
    );
}

#[tokio::test]
async fn at_most_once_loses_but_never_repeats() {
    let seen = crash_and_replay(
        DeliveryGuarantee::AtMostOnce,
        FaultPoint::AfterRecordDurable,
    )
    .await;
    let expected: Vec<i64> = (0..10).chain(20..30).collect();
    assert_eq!(
        seen, expected,
        "records 10..20 were decided but never committed"
    );
}

#[tokio::test]
async fn exactly_once_neither_loses_nor_repeats() {
    for crash in [
        FaultPoint::AfterPreCommit { sink: sink_id() },
        FaultPoint::AfterRecordDurable,
    ] {
        let seen = crash_and_replay(DeliveryGuarantee::ExactlyOnce, crash.clone()).await;
        assert_eq!(seen, (0..30).collect::<Vec<_>>(), "crash {crash}");
    }
}

/// A store that fails, non-retryably and without storing, to save any record that decides transactions.
struct BrokenStore(LocalCheckpointStore);

#[async_trait]
impl CheckpointStore for BrokenStore {
    async fn claim(&self) -> Result<Claim> {
        self.0.claim().await
    }
    async fn save(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<()> {
        if record.committables.is_empty() {
            return self.0.save(owner, record).await; // the start record
        }
        Err(Error::new(ErrorKind::Fatal, Phase::Checkpoint, "disk gone").with_checkpoint(record.id))
    }
    async fn mark_committed(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()> {
        self.0.mark_committed(owner, checkpoint).await
    }
    async fn owner(&self) -> Result<Option<OwnerEpoch>> {
        self.0.owner().await
    }
    async fn load(&self) -> Result<Loaded> {
        self.0.load().await
    }
}

#[tokio::test]
async fn a_checkpoint_record_that_cannot_be_written_aborts_the_checkpoint_everywhere() {
    let system = ReferenceSystem::new();
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::new(
        BrokenStore(LocalCheckpointStore::open(dir.path(), 3).unwrap()),
        quick(),
    );
    let a = SinkId::new("a").unwrap();
    let b = SinkId::new("b").unwrap();
    let sink_a = driver.add_sink(system.sink(RUN, &a)).unwrap();
    let sink_b = driver.add_sink(system.sink(RUN, &b)).unwrap();
    driver.start().await.unwrap();
    driver.write(sink_a, &rows(0..5)).await.unwrap();
    driver.write(sink_b, &rows(0..5)).await.unwrap();
    let err = driver.checkpoint(at(5)).await.unwrap_err();
    assert!(
        err.to_string().contains("checkpoint 2") && err.to_string().contains("disk gone"),
        "{err}"
    );
    // Presumed abort: both pre-committed transactions were discarded, and the driver refuses more work.
    let mut recovered = system.sink(RUN, &a);
    connector_api::TwoPhaseCommit::recover(&mut recovered, None)
        .await
        .unwrap();
    assert!(system.visible(RUN, &a).is_empty() && system.visible(RUN, &b).is_empty());
    let refused = driver.write(sink_a, &rows(5..6)).await.unwrap_err();
    assert!(refused.to_string().contains("restart the job"), "{refused}");
}

#[tokio::test]
async fn start_refuses_a_budget_the_transaction_timeout_cannot_cover() {
    let system = ReferenceSystem::new().with_transaction_timeout(Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let config = DriverConfig {
        checkpoint_interval: Duration::from_secs(30),
        max_restart_time: Duration::from_secs(60),
        max_recovery_time: Duration::from_secs(10),
        ..quick()
    };
    let mut driver = Driver::new(LocalCheckpointStore::open(dir.path(), 3).unwrap(), config);
    driver.add_sink(system.sink(RUN, &sink_id())).unwrap();
    let err = driver.start().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(
        err.to_string().contains("sink s") && err.to_string().contains("checkpoint_interval"),
        "{err}"
    );
}

#[tokio::test]
async fn committables_of_a_newer_format_are_refused_with_the_version() {
    let sink: ReferenceSink = ReferenceSystem::new().sink(RUN, &sink_id());
    let record = CheckpointRecord {
        id: CheckpointId(4),
        positions: at(1),
        committables: BTreeMap::from([(
            sink_id(),
            serde_json::json!({"version": 2, "committables": [{"checkpoint": 4}]}),
        )]),
    };
    let err = committables_in(&sink, &record).unwrap_err();
    assert!(err.to_string().contains("format version 2"), "{err}");
    let current = CheckpointRecord {
        committables: BTreeMap::from([(
            sink_id(),
            serde_json::json!({"version": 1, "committables": [{"checkpoint": 4}]}),
        )]),
        ..record
    };
    assert_eq!(committables_in(&sink, &current).unwrap().unwrap().len(), 1);
}

/// A reference sink that records what each `recover` was asked to commit.
struct Recording {
    inner: ReferenceSink,
    seen: Arc<std::sync::Mutex<Vec<Option<CheckpointId>>>>,
}

#[async_trait]
impl TwoPhaseCommit for Recording {
    type Committable = <ReferenceSink as TwoPhaseCommit>::Committable;
    type Committer = <ReferenceSink as TwoPhaseCommit>::Committer;
    fn sink_id(&self) -> &SinkId {
        self.inner.sink_id()
    }
    fn committer(&self) -> Self::Committer {
        self.inner.committer()
    }
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        self.inner.begin(checkpoint).await
    }
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.inner.write(batch).await
    }
    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Self::Committable> {
        self.inner.pre_commit(checkpoint).await
    }
    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<Self::Committable>)>,
    ) -> Result<RecoveryPlan<Self::Committable>> {
        self.seen
            .lock()
            .unwrap()
            .push(restored.as_ref().map(|(id, _)| *id));
        self.inner.plan_recovery(restored).await
    }
    async fn execute_recovery(&mut self, plan: RecoveryPlan<Self::Committable>) -> Result<()> {
        self.inner.execute_recovery(plan).await
    }
}

/// A job built on `futures` streams forwards batches and checkpoint barriers in one call.
#[tokio::test]
async fn a_stream_of_batches_and_barriers_is_forwarded_in_one_call() {
    use connector_api::StreamEvent;
    let system = ReferenceSystem::new();
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::new(LocalCheckpointStore::open(dir.path(), 3).unwrap(), quick());
    let sink = driver.add_sink(system.sink(RUN, &sink_id())).unwrap();
    driver.start().await.unwrap();
    let events = futures::stream::iter((0..5).flat_map(|i| {
        [
            Ok(StreamEvent::Batch {
                sink,
                batch: rows(i * 10..i * 10 + 10),
            }),
            Ok(StreamEvent::Checkpoint(at(i * 10 + 10))),
        ]
    }));
    let last = driver.forward(events).await.unwrap();
    driver.close().await.unwrap();
    assert_eq!(last, Some(CheckpointId(6)));
    assert_eq!(
        sorted(system.visible(RUN, &sink_id())),
        (0..50).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_commit_that_never_answers_stops_the_driver_within_the_commit_term_and_recovery_commits_it()
 {
    let system = ReferenceSystem::new();
    let dir = tempfile::tempdir().unwrap();
    let config = DriverConfig {
        max_call_time: Duration::from_millis(200),
        ..quick()
    };
    let commit_term = config.retry.worst_case(config.max_call_time);
    let mut driver = Driver::new(
        LocalCheckpointStore::open(dir.path(), 3).unwrap(),
        config.clone(),
    );
    let sink = driver.add_sink(system.sink(RUN, &sink_id())).unwrap();
    driver.start().await.unwrap();
    driver.write(sink, &rows(0..10)).await.unwrap();
    system.silence_commits(true);
    let decided = driver.checkpoint(at(10)).await.unwrap();
    // The commit hangs on its task; waiting for it ends within the commit term instead of forever.
    let err = tokio::time::timeout(commit_term * 10, driver.finish_commit())
        .await
        .expect("the hung commit is abandoned within its term")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert!(err.to_string().contains("did not finish within"), "{err}");
    assert!(system.visible(RUN, &sink_id()).is_empty());
    drop(driver);

    // The server answers again: the next start's recovery commits the decided checkpoint.
    system.silence_commits(false);
    let mut driver = Driver::new(LocalCheckpointStore::open(dir.path(), 3).unwrap(), config);
    driver.add_sink(system.sink(RUN, &sink_id())).unwrap();
    let restored = driver.start().await.unwrap();
    assert_eq!(restored.checkpoint, Some(decided));
    driver.close().await.unwrap();
    assert_eq!(
        sorted(system.visible(RUN, &sink_id())),
        (0..10).collect::<Vec<_>>()
    );
}

/// A store whose first `failures` committed marks fail (a store that drops connections now and then).
struct FlakyMarks {
    inner: LocalCheckpointStore,
    failures: Arc<std::sync::atomic::AtomicU32>,
}

#[async_trait]
impl CheckpointStore for FlakyMarks {
    async fn claim(&self) -> Result<Claim> {
        self.inner.claim().await
    }
    async fn save(&self, owner: OwnerEpoch, record: &CheckpointRecord) -> Result<()> {
        self.inner.save(owner, record).await
    }
    async fn mark_committed(&self, owner: OwnerEpoch, checkpoint: CheckpointId) -> Result<()> {
        let left = self.failures.load(std::sync::atomic::Ordering::SeqCst);
        if left > 0 {
            self.failures
                .store(left - 1, std::sync::atomic::Ordering::SeqCst);
            return Err(Error::new(
                ErrorKind::Retryable,
                Phase::Checkpoint,
                "connection reset",
            ));
        }
        self.inner.mark_committed(owner, checkpoint).await
    }
    async fn owner(&self) -> Result<Option<OwnerEpoch>> {
        self.inner.owner().await
    }
    async fn load(&self) -> Result<Loaded> {
        self.inner.load().await
    }
}

#[tokio::test]
async fn a_clean_stop_retries_noting_its_last_commit_and_reports_when_it_cannot() {
    for (failures, noted) in [(1, true), (100, false)] {
        let system = ReferenceSystem::new();
        let dir = tempfile::tempdir().unwrap();
        let armed = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let store = FlakyMarks {
            inner: LocalCheckpointStore::open(dir.path(), 3).unwrap(),
            failures: armed.clone(),
        };
        let mut driver = Driver::new(store, quick());
        let sink = driver.add_sink(system.sink(RUN, &sink_id())).unwrap();
        driver.start().await.unwrap();
        driver.write(sink, &rows(0..10)).await.unwrap();
        // From here on, marks fail `failures` times.
        armed.store(failures, std::sync::atomic::Ordering::SeqCst);
        let decided = driver.checkpoint(at(10)).await.unwrap();
        let outcome = driver.close().await;
        let loaded = LocalCheckpointStore::open(dir.path(), 3)
            .unwrap()
            .load()
            .await
            .unwrap();
        assert_eq!(
            sorted(system.visible(RUN, &sink_id())),
            (0..10).collect::<Vec<_>>()
        );
        if noted {
            outcome.unwrap();
            assert_eq!(loaded.committed_through, Some(decided));
        } else {
            let err = outcome.unwrap_err();
            assert!(err.to_string().contains("could not note it"), "{err}");
            assert_ne!(loaded.committed_through, Some(decided));
        }
    }
}

#[tokio::test]
async fn a_slow_sink_commit_does_not_hold_up_another_sinks_commit() {
    // Two external systems: `slow` stops answering commits, `fast` does not.
    let slow = ReferenceSystem::new();
    let fast = ReferenceSystem::new();
    let dir = tempfile::tempdir().unwrap();
    let config = DriverConfig {
        max_call_time: Duration::from_secs(30),
        ..quick()
    };
    let mut driver = Driver::new(LocalCheckpointStore::open(dir.path(), 3).unwrap(), config);
    let a = SinkId::new("a").unwrap();
    let b = SinkId::new("b").unwrap();
    // The slow sink comes first: commits one after another would keep the fast one waiting behind it.
    let sink_a = driver.add_sink(slow.sink(RUN, &a)).unwrap();
    let sink_b = driver.add_sink(fast.sink(RUN, &b)).unwrap();
    driver.start().await.unwrap();
    driver.write(sink_a, &rows(0..10)).await.unwrap();
    driver.write(sink_b, &rows(0..10)).await.unwrap();
    slow.silence_commits(true);
    driver.checkpoint(at(10)).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fast.visible(RUN, &b).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the fast sink's commit waited for the slow one"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(slow.visible(RUN, &a).is_empty());
    slow.silence_commits(false);
    // The silenced commit attempt never returns; it is abandoned at the commit term. A restart commits it.
    drop(driver);
    let mut driver = Driver::new(LocalCheckpointStore::open(dir.path(), 3).unwrap(), quick());
    driver.add_sink(slow.sink(RUN, &a)).unwrap();
    driver.add_sink(fast.sink(RUN, &b)).unwrap();
    driver.start().await.unwrap();
    driver.close().await.unwrap();
    assert_eq!(sorted(slow.visible(RUN, &a)), (0..10).collect::<Vec<_>>());
    assert_eq!(sorted(fast.visible(RUN, &b)), (0..10).collect::<Vec<_>>());
}
