//! Against the real broker: a transaction whose producer was killed with SIGKILL after flushing is committed by
//! another process at the protocol level (DescribeTransactions + EndTxn), and a read_committed consumer
//! (confluent-kafka, test-support/verifiers) then sees its records; once the broker has aborted a transaction (its
//! timeout expired), committing it is refused loudly.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use connector_api::ErrorKind;
use kafka_sink::{KafkaConnection, TransactionState, describe_transaction, end_transaction};
use test_support::Services;

/// A producer that begins a transaction, sends three records, flushes, says so, and waits to be killed.
const ORPHAN: &str = r#"
import sys
from confluent_kafka import Producer
bootstrap, tid, topic, timeout = sys.argv[1:5]
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "transaction.timeout.ms": int(timeout)})
p.init_transactions(30)
p.begin_transaction()
for i in range(3):
    p.produce(topic, f"orphan-{i}".encode(), partition=0)
p.flush(30)
print("in-transaction", flush=True)
sys.stdin.read()
"#;

/// Starts the orphan producer and kills it with SIGKILL once its records are flushed.
fn orphan_transaction(tid: &str, topic: &str, timeout_ms: u32) {
    let services = Services::get();
    let mut child = Command::new(services.python())
        .args([
            "-c",
            ORPHAN,
            services.kafka_bootstrap(),
            tid,
            topic,
            &timeout_ms.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "in-transaction");
    child.kill().unwrap();
    child.wait().unwrap();
}

fn visible(topic: &str) -> (Vec<String>, serde_json::Value) {
    let services = Services::get();
    let seen = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), topic],
    );
    let values = seen["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["value"].as_str().unwrap().to_string())
        .collect();
    (values, seen["partitions"]["0"].clone())
}

/// A transaction left open by a SIGKILLed producer (timeout `timeout_ms`): its transactional id, topic and
/// description, checked to be `Ongoing`.
async fn orphaned(
    name: &str,
    timeout_ms: u32,
) -> (String, String, kafka_sink::TransactionDescription) {
    let bootstrap = Services::get().kafka_bootstrap();
    let tid = test_support::unique_name(name);
    let topic = test_support::unique_name(name);
    orphan_transaction(&tid, &topic, timeout_ms);
    let described = describe_transaction(&KafkaConnection::plaintext(bootstrap), &tid)
        .await
        .unwrap();
    assert_eq!(described.state, TransactionState::Ongoing, "{described:?}");
    (tid, topic, described)
}

/// Waits until the broker's timeout sweep has aborted the transaction of `tid` (the coordinator says so, not a
/// guess).
async fn wait_until_broker_aborted(bootstrap: &str, tid: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let now = describe_transaction(&KafkaConnection::plaintext(bootstrap), tid)
            .await
            .unwrap();
        if now.state == TransactionState::CompleteAbort {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the broker never aborted the expired transaction: {now:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_dead_producers_transaction_is_committed_from_another_process() {
    let bootstrap = Services::get().kafka_bootstrap();
    let (tid, topic, described) = orphaned("coordinator-commit", 120_000).await;
    assert_eq!(
        described.partitions,
        vec![(topic.clone(), 0)],
        "{described:?}"
    );
    let (values, offsets) = visible(&topic);
    assert!(values.is_empty(), "nothing is visible before the commit");
    assert_eq!(
        offsets["lso"], 0,
        "the open transaction holds the LSO: {offsets}"
    );

    end_transaction(
        &KafkaConnection::plaintext(bootstrap),
        &tid,
        described.producer_id,
        described.producer_epoch,
        true,
    )
    .await
    .unwrap();

    let (values, offsets) = visible(&topic);
    assert_eq!(values, ["orphan-0", "orphan-1", "orphan-2"]);
    assert_eq!(offsets["lso"], offsets["high_watermark"], "{offsets}");
    let after = describe_transaction(&KafkaConnection::plaintext(bootstrap), &tid)
        .await
        .unwrap();
    assert_eq!(after.state, TransactionState::CompleteCommit, "{after:?}");

    // A repeated EndTxn(commit) for the completed transaction (a retried commit) is accepted by the coordinator
    // and changes nothing.
    end_transaction(
        &KafkaConnection::plaintext(bootstrap),
        &tid,
        described.producer_id,
        described.producer_epoch,
        true,
    )
    .await
    .unwrap();
    assert_eq!(visible(&topic).0.len(), 3);
}

#[tokio::test]
async fn a_transaction_the_broker_already_aborted_cannot_be_committed() {
    let bootstrap = Services::get().kafka_bootstrap();
    let (tid, topic, described) = orphaned("coordinator-expired", 2_000).await;

    wait_until_broker_aborted(bootstrap, &tid).await;
    let err = end_transaction(
        &KafkaConnection::plaintext(bootstrap),
        &tid,
        described.producer_id,
        described.producer_epoch,
        true,
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fatal, "{err}");
    assert!(
        visible(&topic).0.is_empty(),
        "aborted records must stay invisible"
    );
}

#[tokio::test]
async fn recovering_a_checkpoint_whose_transaction_the_broker_aborted_names_the_lost_records() {
    use connector_api::{CheckpointId, Committer, SinkId, SubtaskId, TwoPhaseCommit};
    use kafka_sink::{KafkaCommittable, KafkaSink, KafkaSinkConfig, PartitionRange};

    let bootstrap = Services::get().kafka_bootstrap();
    let (tid, topic, described) = orphaned("coordinator-lost", 2_000).await;
    wait_until_broker_aborted(bootstrap, &tid).await;
    // The durable checkpoint 7 says: commit this transaction. It is gone: recovery must say so, loudly.
    let committable = KafkaCommittable {
        checkpoint: CheckpointId(7),
        transactional_id: tid.clone(),
        producer_id: described.producer_id,
        producer_epoch: described.producer_epoch,
        ranges: vec![PartitionRange {
            topic: topic.clone(),
            partition: 0,
            first_offset: 0,
            last_offset: 2,
        }],
    };
    let sink = KafkaSink::new(
        KafkaSinkConfig::new(bootstrap, &topic, test_support::unique_name("lost-prefix")),
        SinkId::new("lost").unwrap(),
        SubtaskId(0),
    )
    .unwrap();
    let committer = sink.committer();
    let err = committer
        .commit(vec![committable.clone()])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fatal, "{err}");
    let message = err.to_string();
    assert!(
        message.contains("at checkpoint 7")
            && message.contains("LOST")
            && message.contains(&format!("{topic}/0 offsets 0..=2")),
        "{message}"
    );
    assert!(!committer.is_committed(&committable).await.unwrap());
}
