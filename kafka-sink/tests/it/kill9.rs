//! Real `kill -9` at every protocol step against the real broker, through the conformance kit's runner
//! ([`KillNine`]): a child process runs a job writing to Kafka and sends itself SIGKILL at the step; the parent
//! recovers (a new driver and sink), and an independent read_committed consumer (confluent-kafka) must then see
//! exactly the restored checkpoint's records, each once, with no transaction left open (the last stable offset at
//! the high watermark); then the job goes on and a final recovery leaves every record once.

use async_trait::async_trait;
use connector_api::{Result, SinkId, SubtaskId};
use kafka_sink::{KafkaSink, KafkaSinkConfig};
use ratchet_conformance::kill9::{KillNine, KillTarget, KilledRun};
use test_support::Services;

const KILL9: KillNine = KillNine {
    rows: 500,
    ..KillNine::new("kill9::child", "RATCHET_KAFKA_KILL9_CHILD")
};

/// The Kafka sink writing to a topic named after the run (also its transactional id prefix).
struct Topic;

impl Topic {
    fn read(run: &KilledRun) -> (Vec<i64>, serde_json::Value) {
        let services = Services::get();
        services.kafka_ids(services.kafka_bootstrap(), &run.name)
    }
}

#[async_trait]
impl KillTarget for Topic {
    type Sink = KafkaSink;

    async fn create_sink(&self, run: &KilledRun) -> Result<KafkaSink> {
        let config = KafkaSinkConfig::new(Services::get().kafka_bootstrap(), &run.name, &run.name);
        KafkaSink::new(config, SinkId::new("kafka")?, SubtaskId(0))
    }

    async fn visible_ids(&self, run: &KilledRun) -> Result<Vec<i64>> {
        let run = run.clone();
        Ok(tokio::task::spawn_blocking(move || Topic::read(&run).0)
            .await
            .expect("the verifier's task"))
    }

    /// Partitions held by an open transaction.
    async fn leftovers(&self, run: &KilledRun) -> Result<Vec<String>> {
        let run = run.clone();
        let (_, partitions) = tokio::task::spawn_blocking(move || Topic::read(&run))
            .await
            .expect("the verifier's task");
        Ok(partitions
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, offsets)| offsets["lso"] != offsets["high_watermark"])
            .map(|(partition, offsets)| {
                format!("partition {partition} held by an open transaction: {offsets}")
            })
            .collect())
    }
}

/// The child's entry point (returns at once in a normal test run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    if let Some(run) = KILL9.child_run() {
        KILL9.run_child(&Topic, run).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_every_step_then_recovery_shows_each_record_once() {
    KILL9.every_step(&Topic, "kafka").await;
}
