//! The Kafka-to-Kafka fast path against the real broker: a pipeline process is killed with SIGKILL in the middle
//! of a transaction (after producing, after sending the offsets, after committing); a second run finishes the
//! job. An independent read_committed consumer must see every source record exactly once, with no external
//! checkpoint store involved: the consumer group's offsets moved only together with committed output.

use std::sync::Arc;
use std::time::Duration;

use connector_api::Step;
use integration::Services;
use integration::crash::{kill_self, run_killed_child};
use kafka_sink::{KafkaSinkConfig, KafkaToKafka};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

const CHILD: &str = "RATCHET_K2K_CHILD";
const RECORDS: usize = 3000;

fn pipeline(source: &str, target: &str) -> KafkaToKafka {
    KafkaToKafka {
        source_topic: source.to_string(),
        group_id: format!("{source}-group"),
        sink: KafkaSinkConfig::new(Services::get().kafka_bootstrap(), target, target),
        commit_interval: Duration::from_millis(500),
        max_records_per_transaction: 500,
        stop_when_idle: Some(Duration::from_secs(5)),
        stop_after_records: None,
        hook: None,
    }
}

/// Entry point of the child process (does nothing in a normal test run).
#[tokio::test]
async fn child_process_entry_point() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.splitn(3, ';').collect();
    let step = Step::parse(parts[2]).expect("a kill step");
    let mut pipeline = pipeline(parts[0], parts[1]);
    pipeline.hook = Some(Arc::new(move |number, at| {
        if number == 3 && at == step {
            kill_self();
        }
    }));
    pipeline.run().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_transaction_then_resumed_copies_every_record_once() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let services = Services::get();
    let bootstrap = services.kafka_bootstrap();
    for step in [Step::AfterWrite, Step::AfterPreCommit, Step::AfterCommit] {
        let source = integration::unique_name(&format!("k2k-source-{step}"));
        let target = integration::unique_name(&format!("k2k-target-{step}"));
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .create()
            .unwrap();
        let deliveries: Vec<_> = (0..RECORDS)
            .map(|i| {
                let (key, value) = (format!("k{i}"), format!("v{i}"));
                producer
                    .send_result(FutureRecord::to(&source).key(&key).payload(&value))
                    .map_err(|(e, _)| e)
                    .unwrap()
            })
            .collect();
        for delivery in deliveries {
            delivery.await.unwrap().unwrap();
        }

        run_killed_child(
            "child_process_entry_point",
            CHILD,
            &format!("{source};{target};{step}"),
        );
        let stats = pipeline(&source, &target).run().await.unwrap();
        assert!(
            stats.records > 0 && stats.records < RECORDS as u64,
            "{step}: the second run resumes, {stats:?}"
        );

        let seen = services.verify("kafka_read_committed.py", &[bootstrap, &target]);
        let mut values: Vec<String> = seen["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["value"].as_str().unwrap().to_string())
            .collect();
        values.sort();
        let mut expected: Vec<String> = (0..RECORDS).map(|i| format!("v{i}")).collect();
        expected.sort();
        assert_eq!(
            values.len(),
            RECORDS,
            "{step}: every source record exactly once"
        );
        assert_eq!(values, expected, "{step}");
    }
}
