//! What a restart finds in the checkpoint store: a job stopped cleanly, a damaged newest record.

use super::*;

/// A job stopped cleanly is noted committed through its last checkpoint, so the next start does not ask the sinks
/// to commit it again (they may have forgotten it: a Kafka transactional id expires); a job that died before its
/// last commit finished is asked to commit.
#[tokio::test]
async fn a_cleanly_stopped_job_is_not_committed_again_on_restart() {
    let system = ReferenceSystem::new();
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let start = |faults: Option<connector_api::FaultInjector>| {
        let mut driver = Driver::new(LocalCheckpointStore::open(dir.path(), 3).unwrap(), quick());
        if let Some(faults) = faults {
            driver = driver.with_fault_injector(faults);
        }
        let sink = driver
            .add_sink(Recording {
                inner: system.sink(RUN, &sink_id()),
                seen: seen.clone(),
            })
            .unwrap();
        (driver, sink)
    };
    let (mut driver, sink) = start(None);
    driver.start().await.unwrap();
    driver.write(sink, &rows(0..10)).await.unwrap();
    let decided = driver.checkpoint(at(10)).await.unwrap();
    driver.close().await.unwrap();
    let loaded = LocalCheckpointStore::open(dir.path(), 3)
        .unwrap()
        .load()
        .await
        .unwrap();
    assert_eq!(loaded.committed_through, Some(decided));

    // Restarted: nothing to commit. Then a crash after the next record is durable, before its commit.
    let (mut driver, sink) = start(Some(Arc::new(|_: CheckpointId, point: &FaultPoint| {
        *point == FaultPoint::AfterRecordDurable
    })));
    driver.start().await.unwrap();
    driver.write(sink, &rows(10..20)).await.unwrap();
    let crashed = driver.checkpoint(at(20)).await.unwrap_err();
    drop(driver);
    let (mut driver, _) = start(None);
    let restored = driver.start().await.unwrap();
    driver.close().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [None, None, restored.checkpoint],
        "recover was asked to commit: {seen:?} ({crashed})"
    );
    assert_eq!(
        sorted(system.visible(RUN, &sink_id())),
        (0..20).collect::<Vec<_>>()
    );
}

/// Runs checkpoint 2 over 0..10 to completion, then decides checkpoint 3 over 10..20 and, if `commit_it`, commits
/// it; otherwise crashes right after its record is durable. Then truncates record 3. Returns the directory.
async fn damaged_newest_record(system: &ReferenceSystem, commit_it: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::new(LocalCheckpointStore::open(dir.path(), 3).unwrap(), quick())
        .with_fault_injector(Arc::new(move |cp: CheckpointId, point: &FaultPoint| {
            !commit_it && cp == CheckpointId(3) && *point == FaultPoint::AfterRecordDurable
        }));
    let sink = driver.add_sink(system.sink(RUN, &sink_id())).unwrap();
    driver.start().await.unwrap();
    driver.write(sink, &rows(0..10)).await.unwrap();
    driver.checkpoint(at(10)).await.unwrap();
    driver.finish_commit().await.unwrap();
    driver.write(sink, &rows(10..20)).await.unwrap();
    let decided = driver.checkpoint(at(20)).await;
    if commit_it {
        decided.unwrap();
        driver.close().await.unwrap();
    } else {
        decided.unwrap_err();
    }
    let path = dir.path().join(format!("checkpoint-{:020}.json", 3));
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    dir
}

/// A damaged newest record that was never committed falls back to the previous one, and the start after it takes
/// an id above the damaged one (reusing the damaged id would be refused as a different decision, forever).
#[tokio::test]
async fn a_start_after_a_damaged_uncommitted_record_resumes_from_the_previous_one() {
    let system = ReferenceSystem::new();
    let dir = damaged_newest_record(&system, false).await;
    for attempt in 0..2 {
        let mut driver = Driver::new(LocalCheckpointStore::open(dir.path(), 3).unwrap(), quick());
        let sink = driver.add_sink(system.sink(RUN, &sink_id())).unwrap();
        let restored = driver.start().await.unwrap();
        assert_eq!(restored.positions, at(10), "attempt {attempt}");
        assert!(driver.current_checkpoint() > CheckpointId(3));
        if attempt == 1 {
            driver.write(sink, &rows(10..20)).await.unwrap();
            driver.checkpoint(at(20)).await.unwrap();
        }
        driver.close().await.unwrap();
    }
    assert_eq!(
        sorted(system.visible(RUN, &sink_id())),
        (0..20).collect::<Vec<_>>()
    );
}

/// A damaged newest record that the store notes as committed is not silently skipped: falling back would write
/// its records a second time.
#[tokio::test]
async fn a_damaged_committed_record_refuses_to_start() {
    let system = ReferenceSystem::new();
    let dir = damaged_newest_record(&system, true).await;
    let mut driver = Driver::new(LocalCheckpointStore::open(dir.path(), 3).unwrap(), quick());
    driver.add_sink(system.sink(RUN, &sink_id())).unwrap();
    let err = driver.start().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fatal, "{err}");
    assert!(err.to_string().contains("checkpoint 3"), "{err}");
    assert_eq!(
        sorted(system.visible(RUN, &sink_id())),
        (0..20).collect::<Vec<_>>()
    );
}
