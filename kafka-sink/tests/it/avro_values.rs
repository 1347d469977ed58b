//! Avro record values through the schema registry (`records.value_format = "avro"`), read back by a read_committed
//! consumer with confluent-kafka's AvroDeserializer: each row a Confluent-framed record of a schema registered
//! under `<topic>-value`; when the batches gain a column (evolution) the new schema is registered as the next
//! version before any record of it is sent, and records of both versions decode.

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::{CheckpointId, Evolution, SinkId, SubtaskId, TwoPhaseCommit};
use kafka_sink::{KafkaSink, KafkaSinkConfig, ValueFormat};
use schema_registry::RegistrySettings;
use serde_json::json;
use test_support::Services;

fn schema(qty: bool) -> SchemaRef {
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("note", DataType::Utf8, true),
    ];
    if qty {
        fields.push(Field::new("qty", DataType::Int64, true));
    }
    Arc::new(Schema::new(fields))
}

fn rows(schema: &SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
    let mut columns: Vec<arrow_array::ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(ids.clone())),
        Arc::new(StringArray::from_iter(
            ids.clone().map(|i| (i % 2 == 0).then(|| format!("n{i}"))),
        )),
    ];
    if schema.fields().len() == 3 {
        columns.push(Arc::new(Int64Array::from_iter_values(ids)));
    }
    RecordBatch::try_new(schema.clone(), columns).unwrap()
}

async fn checkpoint(sink: &mut KafkaSink, checkpoint: u64, batch: &RecordBatch) {
    sink.begin(CheckpointId(checkpoint)).await.unwrap();
    sink.write(batch).await.unwrap();
    let committable = sink.pre_commit(CheckpointId(checkpoint)).await.unwrap();
    sink.commit(vec![committable]).await.unwrap();
}

#[tokio::test]
async fn rows_are_avro_of_a_registered_schema_and_a_new_column_is_a_new_version() {
    let services = Services::get();
    let bootstrap = services.kafka_bootstrap();
    let registry = services.registry();
    let topic = test_support::unique_name("avro-values");
    let mut config = KafkaSinkConfig::new(bootstrap, &topic, &topic);
    config.records.value_format = ValueFormat::Avro;
    config.registry = Some(RegistrySettings {
        username: Some(registry.user.clone()),
        password: Some(registry.password.clone().into()),
        ..RegistrySettings::new(&registry.url)
    });
    let mut sink = KafkaSink::new(config, SinkId::new("avro").unwrap(), SubtaskId(0))
        .unwrap()
        .with_evolution(schema(false), Evolution::AddColumns);
    sink.recover(None).await.unwrap();
    checkpoint(&mut sink, 2, &rows(&schema(false), 0..3)).await;
    sink.evolve(schema(true)).await.unwrap();
    checkpoint(&mut sink, 3, &rows(&schema(true), 3..5)).await;

    let seen = services.verify("kafka_read_committed.py", &[bootstrap, &topic, "--avro"]);
    let records = seen["records"].as_array().unwrap();
    let values: Vec<&serde_json::Value> = records.iter().map(|r| &r["value"]).collect();
    assert_eq!(
        values,
        [
            &json!({"id": 0, "note": "n0"}),
            &json!({"id": 1, "note": null}),
            &json!({"id": 2, "note": "n2"}),
            &json!({"id": 3, "note": null, "qty": 3}),
            &json!({"id": 4, "note": "n4", "qty": 4}),
        ]
    );
    let ids: Vec<u64> = records
        .iter()
        .map(|r| r["schema_id"].as_u64().unwrap())
        .collect();
    assert!(
        ids[0] == ids[2] && ids[3] == ids[4] && ids[0] != ids[3],
        "{ids:?}"
    );

    // Without a registry, Avro values are refused at once, naming the setting.
    let mut config = KafkaSinkConfig::new(bootstrap, &topic, &topic);
    config.records.value_format = ValueFormat::Avro;
    let Err(err) = KafkaSink::new(config, SinkId::new("avro").unwrap(), SubtaskId(0)) else {
        panic!("Avro values without a registry were accepted");
    };
    assert!(err.to_string().contains("[registry]"), "{err}");
}
