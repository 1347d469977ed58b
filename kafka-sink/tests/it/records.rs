//! Arrow rows become Kafka records as configured (key, value, partition and header columns), checked with an
//! independent read_committed consumer.

use std::sync::Arc;

use arrow_array::{Int32Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use connector_api::{CheckpointId, SinkId, SubtaskId, TwoPhaseCommit};
use kafka_sink::{KafkaSink, KafkaSinkConfig, RecordMapping};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use test_support::Services;

#[tokio::test]
async fn key_value_partition_and_header_columns_map_to_the_record() {
    let services = Services::get();
    let bootstrap = services.kafka_bootstrap();
    let topic = test_support::unique_name("records-mapping");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    admin
        .create_topics(
            &[NewTopic::new(&topic, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    let mapping = RecordMapping {
        key_column: Some("order".into()),
        value_column: Some("body".into()),
        partition_column: Some("shard".into()),
        header_columns: vec!["source".into()],
        ..RecordMapping::default()
    };
    let mut config = KafkaSinkConfig::new(bootstrap, &topic, &topic);
    config.records = mapping;
    let mut sink = KafkaSink::new(config, SinkId::new("records").unwrap(), SubtaskId(0)).unwrap();
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("order", DataType::Utf8, false),
            Field::new("body", DataType::Utf8, false),
            Field::new("shard", DataType::Int32, false),
            Field::new("source", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["o-1", "o-2"])),
            Arc::new(StringArray::from(vec!["first", "second"])),
            Arc::new(Int32Array::from(vec![2, 1])),
            Arc::new(StringArray::from(vec![Some("web"), None])),
        ],
    )
    .unwrap();
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(2)).await.unwrap();
    sink.write(&batch).await.unwrap();
    let committable = sink.pre_commit(CheckpointId(2)).await.unwrap();
    sink.commit(vec![committable]).await.unwrap();

    let seen = services.verify("kafka_read_committed.py", &[bootstrap, &topic]);
    let mut records: Vec<(String, String, i64, serde_json::Value)> = seen["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_string(),
                r["value"].as_str().unwrap().to_string(),
                r["partition"].as_i64().unwrap(),
                r["headers"].clone(),
            )
        })
        .collect();
    records.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        records,
        vec![
            (
                "o-1".into(),
                "first".into(),
                2,
                serde_json::json!({"source": "web"})
            ),
            ("o-2".into(), "second".into(), 1, serde_json::json!({})),
        ]
    );
}
