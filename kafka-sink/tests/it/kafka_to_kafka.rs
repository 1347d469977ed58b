//! The Kafka-to-Kafka fast path against the real broker: a pipeline process is killed with SIGKILL in the middle
//! of a transaction (after producing, after sending the offsets, after committing); a second run finishes the
//! job. An independent read_committed consumer must see every source record exactly once, with no external
//! checkpoint store involved: the consumer group's offsets moved only together with committed output.

use std::sync::Arc;
use std::time::Duration;

use connector_api::Step;
use kafka_sink::{KafkaSinkConfig, KafkaToKafka};
use ratchet_conformance::kill9::{kill_self, run_killed_child};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use test_support::Services;

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
        observer: None,
        stop: None,
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
        let source = test_support::unique_name(&format!("k2k-source-{step}"));
        let target = test_support::unique_name(&format!("k2k-target-{step}"));
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
            "kafka_to_kafka::child_process_entry_point",
            CHILD,
            &format!("{source};{target};{step}"),
        );
        let stats = pipeline(&source, &target).run().await.unwrap();
        assert!(
            stats.records > 0 && stats.records < RECORDS as u64,
            "{step}: the second run resumes, {stats:?}"
        );

        assert_every_record_once(&target, &step.to_string());
    }
}

/// What the independent read_committed verifier sees in `target`: every source value exactly once.
fn assert_every_record_once(target: &str, case: &str) {
    let services = Services::get();
    let seen = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), target],
    );
    let mut values: Vec<String> = seen["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["value"].as_str().unwrap().to_string())
        .collect();
    values.sort();
    let mut expected: Vec<String> = (0..RECORDS).map(|i| format!("v{i}")).collect();
    expected.sort();
    assert_eq!(values, expected, "{case}: every source record exactly once");
}

/// A zombie: the first pipeline stalls after sending transaction 2's offsets (a long GC pause, a stopped VM) while
/// a replacement starts on the same group and prefix. The replacement's `init_transactions` on both ids fences the
/// stalled one: its commit fails, its open transaction is aborted, and the replacement resumes from the offsets of
/// transaction 1. Every source record lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_pipeline_is_fenced_by_its_replacement() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let services = Services::get();
    let bootstrap = services.kafka_bootstrap();
    let source = test_support::unique_name("k2k-zombie-source");
    let target = test_support::unique_name("k2k-zombie-target");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for i in 0..RECORDS {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        producer
            .send(
                FutureRecord::to(&source).key(&key).payload(&value),
                Duration::from_secs(30),
            )
            .await
            .unwrap();
    }

    // The zombie stalls inside transaction 2's commit until the replacement has finished.
    let (stalled_tx, stalled_rx) = std::sync::mpsc::channel::<()>();
    let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
    let resume_rx = std::sync::Mutex::new(resume_rx);
    let mut zombie = pipeline(&source, &target);
    zombie.hook = Some(Arc::new(move |number, at| {
        if number == 2 && at == Step::AfterPreCommit {
            stalled_tx.send(()).unwrap();
            resume_rx.lock().unwrap().recv().unwrap();
        }
    }));
    let zombie_run = tokio::spawn(async move { zombie.run().await });
    tokio::task::spawn_blocking(move || stalled_rx.recv().unwrap())
        .await
        .unwrap();

    let replacement = pipeline(&source, &target).run().await.unwrap();
    resume_tx.send(()).unwrap();
    let zombie_outcome = zombie_run.await.unwrap();
    let err = zombie_outcome.expect_err("the stalled pipeline's commit must be fenced");
    assert_eq!(
        err.kind(),
        connector_api::ErrorKind::Fenced,
        "{}",
        connector_api::Report(&err)
    );
    assert!(replacement.records > 0, "{replacement:?}");

    assert_every_record_once(&target, "zombie");
}
