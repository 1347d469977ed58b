//! Grey failures between the Kafka sink and the real broker, through Toxiproxy (the broker's PROXIED listener
//! advertises the proxy, so every connection the sink opens stays behind it): the broker goes silent while a
//! decided checkpoint commits, for longer than the transaction timeout, so the broker aborts the transaction. The
//! commit is abandoned within the budget's commit term (no hang), and the outcome is reported: the restart names
//! the lost records (LOST), never delivers them silently twice or drops them silently. Then, with the link slow
//! (latency) instead of silent, commits still complete and every record is there once. Checked with the
//! independent read_committed verifier.

use std::time::Duration;

use connector_api::{
    Driver, DriverConfig, ErrorKind, LocalCheckpointStore, Report, RetryPolicy, SinkId,
    SourceOffset, Step, SubtaskId,
};
use kafka_sink::{KafkaSink, KafkaSinkConfig};
use ratchet_conformance::conformance_batch;
use test_support::Services;
use test_support::pause::PauseAt;

/// A driver whose every call may take `call` and recovery `recovery`, no retries, with one Kafka sink whose
/// transaction timeout is `3 * call + recovery` (the budget, exactly: see `TimeoutBudget`).
fn driver(
    state: &std::path::Path,
    bootstrap: &str,
    topic: &str,
    call: Duration,
    recovery: Duration,
) -> Driver<LocalCheckpointStore> {
    let config = DriverConfig {
        checkpoint_interval: Duration::from_millis(100),
        max_restart_time: Duration::ZERO,
        max_recovery_time: recovery,
        max_call_time: call,
        takeover_time: Duration::ZERO,
        retry: RetryPolicy::NEVER,
    };
    let mut driver = Driver::new(LocalCheckpointStore::open(state, 3).unwrap(), config);
    let mut sink = KafkaSinkConfig::new(bootstrap, topic, topic);
    sink.transaction_timeout = call * 3 + recovery;
    driver
        .add_sink(KafkaSink::new(sink, SinkId::new("kafka").unwrap(), SubtaskId(0)).unwrap())
        .unwrap();
    driver
}

fn at(next: i64) -> Vec<SourceOffset> {
    vec![SourceOffset::new("source", 0, next)]
}

/// One test: the broker's proxy is shared, so its scenarios must not run side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grey_failures_of_the_broker_link() {
    the_broker_silent_past_the_transaction_timeout_mid_commit_is_reported_never_silent().await;
    a_slow_broker_link_still_commits_every_checkpoint_once().await;
}

async fn the_broker_silent_past_the_transaction_timeout_mid_commit_is_reported_never_silent() {
    let services = Services::get();
    let (bootstrap, proxy) = services.kafka_proxied().await;
    let topic = test_support::unique_name("grey-commit");
    let state = tempfile::tempdir().unwrap();

    let pause = PauseAt::new(Step::AfterRecordDurable);
    let (call, recovery) = (Duration::from_secs(1), Duration::from_secs(3));
    let mut first =
        driver(state.path(), bootstrap, &topic, call, recovery).with_fault_injector(pause.clone());
    let handle = first.handle_of(&SinkId::new("kafka").unwrap()).unwrap();
    first.start().await.unwrap();
    first
        .write(handle, &conformance_batch(0..50))
        .await
        .unwrap();
    // Checkpoint 2 is decided; the broker goes silent before its commit.
    let deciding = tokio::spawn(async move {
        first.checkpoint(at(50)).await.unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(30), first.finish_commit()).await;
        (first, outcome)
    });
    pause.reached().await;
    proxy.blackhole().await;
    pause.resume();
    let (first, outcome) = deciding.await.unwrap();
    let err = outcome
        .expect(
            "a commit against a silent broker is abandoned within its term, not awaited forever",
        )
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{}", Report(&err));
    drop(first);

    // The broker aborts the transaction once its timeout passed; the link heals afterwards.
    tokio::time::sleep(call * 3 + recovery + Duration::from_secs(3)).await;
    proxy.heal().await;
    let mut second = driver(
        state.path(),
        bootstrap,
        &topic,
        call,
        Duration::from_secs(30),
    );
    let err = second.start().await.expect_err(
        "the decided checkpoint's transaction was aborted by the broker: recovery must say so",
    );
    let report = Report(&err).to_string();
    assert_eq!(err.kind(), ErrorKind::Fatal, "{report}");
    assert!(
        report.contains("LOST") && report.contains("checkpoint 2"),
        "{report}"
    );
    let (ids, partitions) = services.kafka_ids(services.kafka_bootstrap(), &topic);
    assert!(ids.is_empty(), "aborted records became visible: {ids:?}");
    for (partition, offsets) in partitions.as_object().unwrap() {
        assert_eq!(
            offsets["lso"], offsets["high_watermark"],
            "partition {partition} is held by an open transaction"
        );
    }
}

async fn a_slow_broker_link_still_commits_every_checkpoint_once() {
    let services = Services::get();
    let (bootstrap, proxy) = services.kafka_proxied().await;
    let topic = test_support::unique_name("grey-slow");
    let state = tempfile::tempdir().unwrap();
    // 50 ms each way for every reply, jittered: each commit takes several round trips, within max_call_time.
    proxy.latency(50, 20).await;
    // Every round trip is slower: recovery (metadata, broker configs, init_transactions of the pool) more so.
    let mut driver = driver(
        state.path(),
        bootstrap,
        &topic,
        Duration::from_secs(5),
        Duration::from_secs(30),
    );
    let handle = driver.handle_of(&SinkId::new("kafka").unwrap()).unwrap();
    driver.start().await.unwrap();
    for checkpoint in 0..5 {
        let ids = checkpoint * 40..(checkpoint + 1) * 40;
        driver
            .write(handle, &conformance_batch(ids.clone()))
            .await
            .unwrap();
        driver.checkpoint(at(ids.end)).await.unwrap();
    }
    driver.close().await.unwrap();
    proxy.heal().await;
    let (ids, _) = services.kafka_ids(services.kafka_bootstrap(), &topic);
    assert_eq!(ids, (0..200).collect::<Vec<_>>());
}
