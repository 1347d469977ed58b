//! Two subtasks of one sink writing into the same partition, against the real broker: offsets interleave, so each
//! transaction's recorded offset range holds the other's records. Whether a transaction committed must be judged
//! by its own records only: one whose transaction the broker aborted (its timeout expired) is reported LOST even
//! though the other subtask's committed records sit inside its range, and one that committed is recognised as
//! committed after its transactional id moved on, though the other's aborted records sit inside its range.
//! Checked with the independent read_committed verifier.

use std::time::Duration;

use connector_api::{CheckpointId, Committer, ErrorKind, SinkId, SubtaskId, TwoPhaseCommit};
use kafka_sink::{
    KafkaCommittable, KafkaConnection, KafkaSink, KafkaSinkConfig, TransactionState,
    find_transaction,
};
use ratchet_conformance::conformance_batch;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use test_support::Services;

fn sink(topic: &str, prefix: &str, subtask: u32, timeout: Duration) -> KafkaSink {
    let mut config = KafkaSinkConfig::new(Services::get().kafka_bootstrap(), topic, prefix);
    config.transaction_timeout = timeout;
    KafkaSink::new(config, SinkId::new("shared").unwrap(), SubtaskId(subtask)).unwrap()
}

fn visible_ids(topic: &str) -> Vec<i64> {
    Services::get()
        .kafka_ids(Services::get().kafka_bootstrap(), topic)
        .0
}

/// Subtask 0 writes ids 0..5, subtask 1 writes 100..105 and pre-commits, subtask 0 writes 5..10 and pre-commits:
/// subtask 1's records sit inside subtask 0's range on the topic's single partition.
async fn interleaved(
    topic: &str,
    zero: &mut KafkaSink,
    one: &mut KafkaSink,
) -> (KafkaCommittable, KafkaCommittable) {
    zero.recover(None).await.unwrap();
    one.recover(None).await.unwrap();
    zero.begin(CheckpointId(2)).await.unwrap();
    one.begin(CheckpointId(2)).await.unwrap();
    zero.write(&conformance_batch(0..5)).await.unwrap();
    // Subtask 0's first records must be in the log before subtask 1 writes.
    wait_for_log_end(topic, 5).await;
    one.write(&conformance_batch(100..105)).await.unwrap();
    let second = one.pre_commit(CheckpointId(2)).await.unwrap();
    zero.write(&conformance_batch(5..10)).await.unwrap();
    let first = zero.pre_commit(CheckpointId(2)).await.unwrap();
    let (a, b) = (&first.ranges[0], &second.ranges[0]);
    assert!(
        a.first_offset < b.first_offset && b.last_offset < a.last_offset,
        "the ranges do not interleave: {first:?} {second:?}"
    );
    (first, second)
}

/// Waits until partition 0 of `topic` holds at least `records` records (committed or not: the log end, which a
/// read_uncommitted client sees as the high watermark; read_committed would see the last stable offset).
async fn wait_for_log_end(topic: &str, records: i64) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", Services::get().kafka_bootstrap())
        .set("isolation.level", "read_uncommitted")
        .create()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, high) = consumer
            .fetch_watermarks(topic, 0, Duration::from_secs(5))
            .unwrap_or((0, 0));
        if high >= records {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{topic}: the log end stayed at {high}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the broker's timeout sweep has aborted the transaction of `tid`.
async fn wait_until_broker_aborted(tid: &str) {
    let bootstrap = Services::get().kafka_bootstrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = find_transaction(&KafkaConnection::plaintext(bootstrap), tid)
            .await
            .unwrap();
        if now
            .as_ref()
            .is_some_and(|d| d.state == TransactionState::CompleteAbort)
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the broker never aborted the expired transaction: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_transaction_the_broker_aborted_is_lost_though_another_subtask_committed_inside_its_range()
 {
    let topic = test_support::unique_name("shared-aborted");
    let prefix = test_support::unique_name("shared-aborted");
    let mut zero = sink(&topic, &prefix, 0, Duration::from_secs(5));
    let mut one = sink(&topic, &prefix, 1, Duration::from_secs(60));
    let (first, second) = interleaved(&topic, &mut zero, &mut one).await;
    one.committer().commit(vec![second]).await.unwrap();
    // Subtask 0 dies before committing; the broker aborts its transaction after 5 s.
    drop(zero);
    wait_until_broker_aborted(&first.transactional_id).await;

    let mut restarted = sink(&topic, &prefix, 0, Duration::from_secs(5));
    let err = restarted
        .recover(Some((CheckpointId(2), vec![first.clone()])))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fatal, "{err}");
    assert!(err.to_string().contains("LOST"), "{err}");
    assert!(!restarted.committer().is_committed(&first).await.unwrap());
    assert_eq!(visible_ids(&topic), (100..105).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_committed_transaction_is_recognised_though_another_subtask_aborted_inside_its_range() {
    let topic = test_support::unique_name("shared-committed");
    let prefix = test_support::unique_name("shared-committed");
    let timeout = Duration::from_secs(60);
    let mut zero = sink(&topic, &prefix, 0, timeout);
    let mut one = sink(&topic, &prefix, 1, timeout);
    let (first, _second) = interleaved(&topic, &mut zero, &mut one).await;
    one.abort().await.unwrap();
    zero.committer().commit(vec![first.clone()]).await.unwrap();
    // A new instance re-initialises subtask 0's ids: the coordinator can no longer tell, the log must.
    drop(zero);
    let mut restarted = sink(&topic, &prefix, 0, timeout);
    restarted.recover(None).await.unwrap();
    let now = find_transaction(
        &KafkaConnection::plaintext(Services::get().kafka_bootstrap()),
        &first.transactional_id,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        now.producer_epoch != first.producer_epoch || now.producer_id != first.producer_id,
        "the id did not move on: {now:?}"
    );
    assert!(restarted.committer().is_committed(&first).await.unwrap());
    restarted.committer().commit(vec![first]).await.unwrap();
    assert_eq!(visible_ids(&topic), (0..10).collect::<Vec<_>>());
}
