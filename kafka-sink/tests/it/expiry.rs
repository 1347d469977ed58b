//! Restarting after the broker forgot the job's transactional ids (`transactional.id.expiration.ms`; 7 days by
//! default, 5 s on the `kafka_expiring` broker that scripts/services.sh starts). A job stopped cleanly restarts
//! with nothing lost or doubled; a checkpoint that was decided but never committed, whose transaction the broker
//! aborted and then forgot, stops recovery loudly, naming the lost offsets. Read back with the independent
//! read_committed verifier.

use std::sync::Arc;
use std::time::Duration;

use connector_api::{
    CheckpointId, Driver, DriverConfig, ErrorKind, FaultPoint, LocalCheckpointStore, Report,
    RetryPolicy, SinkHandle, SinkId, SourceOffset, SubtaskId,
};
use kafka_sink::{
    KafkaConnection, KafkaSink, KafkaSinkConfig, TransactionalIdPool, find_transaction,
};
use ratchet_conformance::conformance_batch;
use test_support::Services;

fn bootstrap() -> &'static str {
    Services::get().kafka_expiring_bootstrap()
}

fn sink(topic: &str, prefix: &str, timeout: Duration) -> KafkaSink {
    let mut config = KafkaSinkConfig::new(bootstrap(), topic, prefix);
    config.transaction_timeout = timeout;
    KafkaSink::new(config, SinkId::new("expiring").unwrap(), SubtaskId(0)).unwrap()
}

fn driver(
    state: &std::path::Path,
    topic: &str,
    prefix: &str,
    timeout: Duration,
) -> Driver<LocalCheckpointStore> {
    let config = DriverConfig {
        checkpoint_interval: Duration::from_millis(100),
        max_restart_time: Duration::ZERO,
        // Enforced: recovery (a few init_transactions) takes well under this.
        max_recovery_time: Duration::from_secs(8),
        // Enforced on each sink call (pre_commit, begin, commit).
        max_call_time: Duration::from_secs(1),
        takeover_time: Duration::ZERO,
        // No retries: the budget (11 s) then fits the 12 s transaction timeout of the lost-checkpoint test.
        retry: RetryPolicy::NEVER,
    };
    let mut driver = Driver::new(LocalCheckpointStore::open(state, 3).unwrap(), config);
    driver.add_sink(sink(topic, prefix, timeout)).unwrap();
    driver
}

/// The handle of the job's only sink.
fn only(driver: &Driver<LocalCheckpointStore>) -> SinkHandle {
    driver.handle_of(&SinkId::new("expiring").unwrap()).unwrap()
}

fn at(next: i64) -> Vec<SourceOffset> {
    vec![SourceOffset::new("source", 0, next)]
}

fn visible_ids(topic: &str) -> Vec<i64> {
    Services::get().kafka_ids(bootstrap(), topic).0
}

/// Waits until the broker has forgotten every transactional id of the pool.
async fn wait_until_expired(prefix: &str) {
    let pool = TransactionalIdPool::new(prefix, 2).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    for id in pool.all(SubtaskId(0)) {
        loop {
            let now = find_transaction(&KafkaConnection::plaintext(bootstrap()), id.as_str())
                .await
                .unwrap();
            if now.is_none() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{id} never expired: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

#[tokio::test]
async fn a_cleanly_stopped_job_restarts_after_its_transactional_ids_expired() {
    let topic = test_support::unique_name("expiry-clean");
    let prefix = test_support::unique_name("expiry-clean");
    let state = tempfile::tempdir().unwrap();
    let timeout = Duration::from_secs(60);

    let mut first = driver(state.path(), &topic, &prefix, timeout);
    first.start().await.unwrap();
    first
        .write(only(&first), &conformance_batch(0..50))
        .await
        .unwrap();
    first.checkpoint(at(50)).await.unwrap();
    first.close().await.unwrap();
    wait_until_expired(&prefix).await;

    let mut second = driver(state.path(), &topic, &prefix, timeout);
    let restored = second
        .start()
        .await
        .unwrap_or_else(|e| panic!("restart after expiry: {}", Report(&e)));
    assert_eq!(restored.positions, at(50));
    second
        .write(only(&second), &conformance_batch(50..80))
        .await
        .unwrap();
    second.checkpoint(at(80)).await.unwrap();
    second.close().await.unwrap();
    assert_eq!(visible_ids(&topic), (0..80).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_decided_checkpoint_whose_transaction_was_aborted_and_forgotten_stops_loudly() {
    let topic = test_support::unique_name("expiry-lost");
    let prefix = test_support::unique_name("expiry-lost");
    let state = tempfile::tempdir().unwrap();
    let timeout = Duration::from_secs(12);

    let mut first = driver(state.path(), &topic, &prefix, timeout).with_fault_injector(Arc::new(
        |checkpoint: CheckpointId, point: &FaultPoint| {
            checkpoint == CheckpointId(3) && *point == FaultPoint::AfterRecordDurable
        },
    ));
    first.start().await.unwrap();
    first
        .write(only(&first), &conformance_batch(0..20))
        .await
        .unwrap();
    first.checkpoint(at(20)).await.unwrap();
    first
        .write(only(&first), &conformance_batch(20..40))
        .await
        .unwrap();
    // Checkpoint 3 is decided, and the process dies before committing it.
    first.checkpoint(at(40)).await.unwrap_err();
    drop(first);
    // The broker aborts the transaction after 12 s and forgets the ids 5 s later.
    wait_until_expired(&prefix).await;

    let mut second = driver(state.path(), &topic, &prefix, timeout);
    let err = second.start().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fatal, "{}", Report(&err));
    let message = err.to_string();
    assert!(
        message.contains("at checkpoint 3")
            && message.contains("LOST")
            && message.contains("expired")
            && message.contains(&format!("{topic}/0 offsets")),
        "{message}"
    );
    assert_eq!(visible_ids(&topic), (0..20).collect::<Vec<_>>());
}
