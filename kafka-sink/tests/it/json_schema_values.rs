//! JSON Schema record values through the schema registry (`records.value_format = "json-schema"`), read back by a
//! read_committed consumer with confluent-kafka's JSONDeserializer, which validates every value against the
//! schema its id names: each row the sink's JSON object behind a registered JSON Schema; when the batches gain a
//! column (evolution) the new schema is registered as the next version before any record of it is sent, and
//! records of both versions decode.

use std::sync::Arc;

use arrow_array::builder::{Decimal128Builder, ListBuilder, StringBuilder};
use arrow_array::{
    ArrayRef, Int64Array, RecordBatch, StringArray, StructArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use connector_api::{CheckpointId, Evolution, SinkId, SubtaskId, TwoPhaseCommit};
use kafka_sink::{KafkaSink, KafkaSinkConfig, ValueFormat};
use schema_registry::RegistrySettings;
use serde_json::json;
use test_support::Services;

fn customer() -> Fields {
    vec![Field::new("email", DataType::Utf8, true)].into()
}

fn schema(qty: bool) -> SchemaRef {
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("note", DataType::Utf8, true),
        Field::new("amount", DataType::Decimal128(12, 2), true),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("customer", DataType::Struct(customer()), true),
        Field::new(
            "tags",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
    ];
    if qty {
        fields.push(Field::new("qty", DataType::Int64, true));
    }
    Arc::new(Schema::new(fields))
}

/// Row `i`: note `n<i>` for even ids (else null), amount `i * 1.25`, at 2023-11-14T22:13:20Z plus `i` seconds,
/// customer `user<i>@example.com`, `i % 3` tags, and qty `i` when the schema has it.
fn rows(schema: &SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
    let mut amounts = Decimal128Builder::new()
        .with_precision_and_scale(12, 2)
        .unwrap();
    let mut tags = ListBuilder::new(StringBuilder::new());
    for i in ids.clone() {
        amounts.append_value(i128::from(i) * 125);
        for t in 0..i % 3 {
            tags.values().append_value(format!("t{t}"));
        }
        tags.append(true);
    }
    let emails: ArrayRef = Arc::new(StringArray::from_iter_values(
        ids.clone().map(|i| format!("user{i}@example.com")),
    ));
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(ids.clone())),
        Arc::new(StringArray::from_iter(
            ids.clone().map(|i| (i % 2 == 0).then(|| format!("n{i}"))),
        )),
        Arc::new(amounts.finish()),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(
                ids.clone().map(|i| 1_700_000_000_000_000 + i * 1_000_000),
            )
            .with_timezone("UTC"),
        ),
        Arc::new(StructArray::new(customer(), vec![emails], None)),
        Arc::new(tags.finish()),
    ];
    if schema.fields().len() == 7 {
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
async fn rows_are_json_documents_of_a_registered_json_schema_and_a_new_column_is_a_new_version() {
    let services = Services::get();
    let bootstrap = services.kafka_bootstrap();
    let registry = services.registry();
    let topic = test_support::unique_name("json-schema-values");
    let mut config = KafkaSinkConfig::new(bootstrap, &topic, &topic);
    config.records.value_format = ValueFormat::JsonSchema;
    config.registry = Some(RegistrySettings {
        username: Some(registry.user.clone()),
        password: Some(registry.password.clone().into()),
        ..RegistrySettings::new(&registry.url)
    });
    let mut sink = KafkaSink::new(config, SinkId::new("json").unwrap(), SubtaskId(0))
        .unwrap()
        .with_evolution(schema(false), Evolution::AddColumns);
    sink.recover(None).await.unwrap();
    checkpoint(&mut sink, 2, &rows(&schema(false), 0..3)).await;
    sink.evolve(schema(true)).await.unwrap();
    checkpoint(&mut sink, 3, &rows(&schema(true), 3..5)).await;

    let seen = services.verify(
        "kafka_read_committed.py",
        &[bootstrap, &topic, "--json-schema"],
    );
    let records = seen["records"].as_array().unwrap();
    assert_eq!(records.len(), 5, "{seen}");
    for (i, record) in (0i64..).zip(records) {
        let value = &record["value"];
        assert_eq!(value["id"], i, "{value}");
        assert_eq!(
            value["note"],
            if i % 2 == 0 {
                json!(format!("n{i}"))
            } else {
                json!(null)
            },
            "{value}"
        );
        assert_eq!(value["amount"].as_f64(), Some(i as f64 * 1.25), "{value}");
        assert_eq!(
            value["at"],
            json!(format!("2023-11-14T22:13:{:02}Z", 20 + i)),
            "{value}"
        );
        assert_eq!(
            value["customer"],
            json!({"email": format!("user{i}@example.com")})
        );
        let tags: Vec<String> = (0..i % 3).map(|t| format!("t{t}")).collect();
        assert_eq!(value["tags"], json!(tags), "{value}");
        assert_eq!(
            value.get("qty").cloned(),
            (i >= 3).then(|| json!(i)),
            "{value}"
        );
    }
    let ids: Vec<u64> = records
        .iter()
        .map(|r| r["schema_id"].as_u64().unwrap())
        .collect();
    assert!(
        ids[0] == ids[2] && ids[3] == ids[4] && ids[0] != ids[3],
        "{ids:?}"
    );

    // Without a registry, JSON Schema values are refused at once, naming the setting.
    let mut config = KafkaSinkConfig::new(bootstrap, &topic, &topic);
    config.records.value_format = ValueFormat::JsonSchema;
    let Err(err) = KafkaSink::new(config, SinkId::new("json").unwrap(), SubtaskId(0)) else {
        panic!("JSON Schema values without a registry were accepted");
    };
    assert!(
        err.to_string().contains("[registry]") && err.to_string().contains("json-schema"),
        "{err}"
    );
}
