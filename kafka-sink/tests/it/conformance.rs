//! The conformance harness on the Kafka sink against the real broker, verified with an independent
//! read_committed consumer (confluent-kafka): every record exactly once, and no transaction left open holding
//! the last stable offset once recovery has run.

use std::collections::BTreeMap;

use async_trait::async_trait;
use connector_api::{Result, SinkId, SubtaskId};
use kafka_sink::{KafkaSink, KafkaSinkConfig};
use ratchet_conformance::{Conformance, ConformanceTarget, run_conformance};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use test_support::Services;

struct Kafka {
    /// Where the sink connects, with `client` settings (TLS, SASL).
    bootstrap: String,
    client: BTreeMap<String, String>,
    /// The PLAINTEXT listener of the same broker, for topic creation and the independent verifier.
    plaintext: String,
    admin: AdminClient<DefaultClientContext>,
}

fn topic(run: &str, sink: &SinkId) -> String {
    format!("{run}-{sink}")
}

impl Kafka {
    /// The verifier blocks its thread, so it runs on tokio's blocking pool: the harness runs several scenarios at
    /// once on one task.
    async fn read(&self, topic: &str) -> serde_json::Value {
        let (bootstrap, topic) = (self.plaintext.clone(), topic.to_string());
        tokio::task::spawn_blocking(move || {
            Services::get().verify("kafka_read_committed.py", &[&bootstrap, &topic])
        })
        .await
        .expect("the verifier's thread")
    }
}

#[async_trait]
impl ConformanceTarget for Kafka {
    type Sink = KafkaSink;

    async fn create_sink(&self, run: &str, sink: &SinkId, subtask: SubtaskId) -> Result<KafkaSink> {
        let topic = topic(run, sink);
        // Idempotent: an existing topic is fine.
        let _ = self
            .admin
            .create_topics(
                &[NewTopic::new(&topic, 2, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await;
        let mut config = KafkaSinkConfig::new(&self.bootstrap, &topic, &topic);
        config.client = self.client.clone();
        KafkaSink::new(config, sink.clone(), subtask)
    }

    async fn visible_ids(&self, run: &str, sink: &SinkId) -> Result<Vec<i64>> {
        let seen = self.read(&topic(run, sink)).await;
        Ok(seen["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let row: serde_json::Value =
                    serde_json::from_str(r["value"].as_str().unwrap()).unwrap();
                row["id"].as_i64().unwrap()
            })
            .collect())
    }

    async fn leftovers(&self, run: &str, sink: &SinkId) -> Result<Vec<String>> {
        let seen = self.read(&topic(run, sink)).await;
        Ok(seen["partitions"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, p)| p["lso"] != p["high_watermark"])
            .map(|(partition, p)| {
                format!("partition {partition}: an open transaction holds the LSO ({p})")
            })
            .collect())
    }
}

impl Kafka {
    fn new(bootstrap: &str, client: BTreeMap<String, String>) -> Self {
        let plaintext = Services::get().kafka_bootstrap().to_string();
        let admin = ClientConfig::new()
            .set("bootstrap.servers", &plaintext)
            .create()
            .unwrap();
        Self {
            bootstrap: bootstrap.to_string(),
            client,
            plaintext,
            admin,
        }
    }
}

fn conformance() -> Conformance {
    Conformance {
        records: 200,
        random_records: 500,
        ..Conformance::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_sink_passes_the_conformance_harness() {
    let target = Kafka::new(Services::get().kafka_bootstrap(), BTreeMap::new());
    run_conformance("kafka-sink on Apache Kafka 4.4", &target, &conformance())
        .await
        .assert_passed();
}

/// The whole harness again with every client of the sink (transactional producers, the prefix registry, the log
/// probe, and the protocol-level client that commits a dead process's transaction at recovery) on the broker's
/// SASL_SSL listener: TLS checked against the test CA, a client certificate, SCRAM-SHA-512.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_sink_passes_the_conformance_harness_over_sasl_ssl() {
    let services = Services::get();
    let (bootstrap, mut client) = services.kafka_sasl_ssl("SCRAM-SHA-512");
    let (cert, key) = services.tls_client_identity();
    client.insert("ssl.certificate.location".into(), cert.into());
    client.insert("ssl.key.location".into(), key.into());
    let target = Kafka::new(bootstrap, client);
    run_conformance(
        "kafka-sink on Apache Kafka 4.4 over SASL_SSL (SCRAM-SHA-512, client certificate)",
        &target,
        &conformance(),
    )
    .await
    .assert_passed();
}
