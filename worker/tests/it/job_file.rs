//! A job file with a Kafka sink (exactly-once) and a file sink (at-least-once) becomes a running job through the
//! sink registry, with no code per sink: batches go to both, checkpoints decide them, and the independent readers
//! (a read_committed Kafka consumer, pyarrow) see every record once. The checkpoint record shows each sink's
//! guarantee: the at-least-once sink committed at pre-commit and left nothing to decide.

use connector_api::{
    CheckpointStore, Driver, DriverConfig, LocalCheckpointStore, SinkRegistry, SinkSpec,
    SourceOffset, SubtaskId,
};
use file_sink::FileSinkFactory;
use kafka_sink::KafkaSinkFactory;
use ratchet_conformance::{conformance_batch, conformance_schema};
use serde::Deserialize;
use test_support::Services;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile {
    sinks: Vec<SinkSpec>,
}

fn registry() -> SinkRegistry {
    let mut registry = SinkRegistry::new();
    registry
        .register(KafkaSinkFactory)
        .register(FileSinkFactory);
    registry
}

#[tokio::test]
async fn a_job_file_with_a_kafka_and_a_file_sink_runs_through_the_registry() {
    let services = Services::get();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("archive");
    let topic = test_support::unique_name("job-file");
    let text = format!(
        r#"
[[sinks]]
type = "kafka"
id = "copy"
delivery = "exactly-once"
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
transactional_id_prefix = "{topic}"
client = {{ "linger.ms" = "5" }}

[[sinks]]
type = "file"
id = "archive"
delivery = "at-least-once"
storage = {{ kind = "local", path = "{out}" }}
format = {{ kind = "parquet", compression = "zstd" }}
"#,
        bootstrap = services.kafka_bootstrap(),
        out = out.display(),
    );
    let job: JobFile = toml::from_str(&text).unwrap();
    let registry = registry();
    let store = LocalCheckpointStore::open(dir.path().join("state"), 3).unwrap();
    let mut driver = Driver::new(store.clone(), DriverConfig::default());
    let mut handles = Vec::new();
    for spec in &job.sinks {
        let sink = registry
            .build(spec, None, SubtaskId(0), conformance_schema())
            .await
            .unwrap();
        handles.push(driver.add_dyn_sink(sink).unwrap());
    }
    driver.start().await.unwrap();
    for (range, checkpoint) in [(0..100, 1), (100..250, 2)] {
        let batch = conformance_batch(range.clone());
        for handle in &handles {
            driver.write(*handle, &batch).await.unwrap();
        }
        let positions = vec![SourceOffset::new("source", 0, range.end)];
        let decided = driver.checkpoint(positions).await.unwrap();
        assert!(decided.0 > checkpoint, "{decided}");
    }
    driver.close().await.unwrap();

    let (kafka, _) = services.kafka_ids(services.kafka_bootstrap(), &topic);
    assert_eq!(kafka, (0..250).collect::<Vec<_>>());
    let files = services.verify("visible_ids.py", &["local", out.to_str().unwrap(), "id"]);
    let mut archived: Vec<i64> = files["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    archived.sort_unstable();
    assert_eq!(archived, (0..250).collect::<Vec<_>>());

    // Exactly-once decides the Kafka transaction in the record; at-least-once committed the files before it.
    let record = store.load().await.unwrap().record.unwrap();
    let entry =
        |sink: &str| record.committables[&connector_api::SinkId::new(sink).unwrap()].clone();
    assert!(!entry("copy")["committables"][0].is_null(), "{record:?}");
    assert!(entry("archive")["committables"][0].is_null(), "{record:?}");
}

#[test]
fn a_misspelt_key_is_refused_naming_the_sink_and_the_key() {
    let text = r#"
[[sinks]]
type = "kafka"
id = "copy"
bootstrap_servers = "127.0.0.1:1"
topic = "t"
transactional_id_prefx = "p"
"#;
    let job: JobFile = toml::from_str(text).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let err = runtime
        .block_on(registry().build(&job.sinks[0], None, SubtaskId(0), conformance_schema()))
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("sink copy") && message.contains("transactional_id_prefx"),
        "{message}"
    );
}
