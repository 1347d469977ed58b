//! At-least-once through the job-file factory: no Kafka transaction at all (the transactional ids the
//! exactly-once sink would use are never created on the broker), and a crash after pre-commit, before the record
//! is durable, replays that checkpoint's records: duplicates, never loss. Read back with the independent
//! read_committed verifier.

use std::sync::Arc;

use connector_api::{
    CheckpointId, DeliveryGuarantee, Driver, DriverConfig, FaultPoint, LocalCheckpointStore,
    SinkFactory, SinkId, SourceOffset, SubtaskId,
};
use kafka_sink::{KafkaConnection, KafkaSinkFactory, TransactionalIdPool, find_transaction};
use ratchet_conformance::{conformance_batch, conformance_schema};
use test_support::Services;

fn at(next: i64) -> Vec<SourceOffset> {
    vec![SourceOffset::new("source", 0, next)]
}

async fn driver(
    state: &std::path::Path,
    topic: &str,
    crash_at_pre_commit_of: Option<u64>,
) -> (Driver<LocalCheckpointStore>, connector_api::SinkHandle) {
    let settings = serde_json::json!({
        "bootstrap_servers": Services::get().kafka_bootstrap(),
        "topic": topic,
        "transactional_id_prefix": topic,
    });
    let context = connector_api::SinkContext {
        job: None,
        sink: SinkId::new("alo").unwrap(),
        subtask: SubtaskId(0),
        schema: conformance_schema(),
        evolution: connector_api::Evolution::None,
    };
    let sink = KafkaSinkFactory
        .build(settings, DeliveryGuarantee::AtLeastOnce, context)
        .await
        .unwrap();
    let mut driver = Driver::new(
        LocalCheckpointStore::open(state, 3).unwrap(),
        DriverConfig::default(),
    );
    if let Some(checkpoint) = crash_at_pre_commit_of {
        driver =
            driver.with_fault_injector(Arc::new(move |cp: CheckpointId, point: &FaultPoint| {
                cp.0 == checkpoint && matches!(point, FaultPoint::AfterPreCommit { .. })
            }));
    }
    let handle = driver.add_dyn_sink(sink).unwrap();
    (driver, handle)
}

#[tokio::test]
async fn at_least_once_uses_no_transaction_and_replays_but_never_loses() {
    let topic = test_support::unique_name("alo");
    let state = tempfile::tempdir().unwrap();

    let (mut first, sink) = driver(state.path(), &topic, Some(3)).await;
    first.start().await.unwrap();
    first.write(sink, &conformance_batch(0..40)).await.unwrap();
    first.checkpoint(at(40)).await.unwrap();
    first.write(sink, &conformance_batch(40..70)).await.unwrap();
    // Checkpoint 3 is flushed (visible) but its record never becomes durable.
    first.checkpoint(at(70)).await.unwrap_err();
    drop(first);

    let (mut second, sink) = driver(state.path(), &topic, None).await;
    let restored = second.start().await.unwrap();
    assert_eq!(restored.positions, at(40));
    second
        .write(sink, &conformance_batch(40..100))
        .await
        .unwrap();
    second.checkpoint(at(100)).await.unwrap();
    second.close().await.unwrap();

    let services = Services::get();
    let (ids, _) = services.kafka_ids(services.kafka_bootstrap(), &topic);
    let mut expected: Vec<i64> = (0..100).chain(40..70).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected, "checkpoint 3 replayed once, nothing lost");

    // No transaction: the pool's transactional ids were never initialised on the broker.
    for id in TransactionalIdPool::new(topic.as_str(), 2)
        .unwrap()
        .all(SubtaskId(0))
    {
        let described = find_transaction(
            &KafkaConnection::plaintext(services.kafka_bootstrap()),
            id.as_str(),
        )
        .await
        .unwrap();
        assert_eq!(described, None, "{id} exists: a transaction was used");
    }
}
