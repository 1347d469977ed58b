//! Against the real broker: a pooled transactional producer commits, and a second producer on the same id fences
//! the first. Checked with an independent read_committed consumer (test-support/verifiers, confluent-kafka).

use std::time::Duration;

use connector_api::{CheckpointId, ErrorKind, SubtaskId};
use kafka_sink::{KafkaSinkConfig, classify, open_transactional_producer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer};
use test_support::Services;

fn values(topic: &str) -> Vec<String> {
    let services = Services::get();
    let seen = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), topic],
    );
    seen["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["value"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn committed_records_are_visible_and_a_zombie_is_fenced() {
    let services = Services::get();
    let topic = test_support::unique_name("kafka-sink-producer");
    let config = KafkaSinkConfig::new(
        services.kafka_bootstrap(),
        &topic,
        test_support::unique_name("ratchet-test"),
    );
    let id = config
        .id_pool()
        .unwrap()
        .for_checkpoint(SubtaskId(0), CheckpointId(1));

    let zombie = open_transactional_producer(&config, &id, DefaultProducerContext)
        .await
        .unwrap();
    zombie.begin_transaction().unwrap();
    zombie
        .send(BaseRecord::to(&topic).key("k").payload("committed"))
        .map_err(|(e, _)| e)
        .unwrap();
    zombie.commit_transaction(Duration::from_secs(30)).unwrap();

    zombie.begin_transaction().unwrap();
    zombie
        .send(BaseRecord::to(&topic).key("k").payload("zombie"))
        .map_err(|(e, _)| e)
        .unwrap();

    // A new instance on the same id bumps the epoch: the zombie's open transaction is aborted, its commit fenced.
    let successor = open_transactional_producer(&config, &id, DefaultProducerContext)
        .await
        .unwrap();
    let fenced = zombie
        .commit_transaction(Duration::from_secs(30))
        .unwrap_err();
    assert_eq!(classify(&fenced), ErrorKind::Fenced, "{fenced}");

    successor.begin_transaction().unwrap();
    successor
        .send(BaseRecord::to(&topic).key("k").payload("successor"))
        .map_err(|(e, _)| e)
        .unwrap();
    successor
        .commit_transaction(Duration::from_secs(30))
        .unwrap();

    assert_eq!(values(&topic), ["committed", "successor"]);
}

#[tokio::test]
async fn the_broker_maximum_transaction_timeout_is_read_from_the_broker() {
    let connection =
        kafka_sink::KafkaConnection::plaintext(Services::get().kafka_bootstrap()).client_config();
    let max = kafka_sink::broker_max_transaction_timeout(&connection)
        .await
        .unwrap();
    // scripts/services.sh sets transaction.max.timeout.ms=900000.
    assert_eq!(max, Duration::from_secs(900));
}

#[tokio::test]
async fn a_prefix_held_by_another_job_is_refused_at_start() {
    use connector_api::{SinkId, TwoPhaseCommit};
    use kafka_sink::KafkaSink;

    let bootstrap = Services::get().kafka_bootstrap();
    let prefix = test_support::unique_name("shared-prefix");
    let sink_for = |job: &str| {
        let mut config = KafkaSinkConfig::new(bootstrap, &prefix, &prefix);
        config.job = Some(job.to_string());
        KafkaSink::new(config, SinkId::new("out").unwrap(), SubtaskId(0)).unwrap()
    };
    sink_for("billing").recover(None).await.unwrap();
    sink_for("billing").recover(None).await.unwrap(); // the same job restarting is fine
    let err = sink_for("fraud").recover(None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let message = err.to_string();
    assert!(
        message.contains("already used by \"billing/out\""),
        "{message}"
    );
}
