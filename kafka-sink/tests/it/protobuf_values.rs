//! Protobuf record values through the schema registry (`records.value_format = "protobuf"`), read back by a
//! read_committed consumer with confluent-kafka's ProtobufDeserializer, value by value in Protobuf's JSON mapping:
//! every type exact (a nanosecond instant as a Timestamp, a duration, a decimal and a date as their text, a
//! nested message, a repeated field, a map), a null kept apart from zero (`optional`); when the batches gain a
//! column the next version is registered before any record of it, the old columns keeping their field numbers.

use std::sync::Arc;

use arrow_array::builder::{
    Decimal128Builder, Int64Builder, ListBuilder, MapBuilder, StringBuilder,
};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, DurationMillisecondArray, Int64Array, RecordBatch,
    StringArray, StructArray, TimestampNanosecondArray,
};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use connector_api::{CheckpointId, Evolution, SinkId, SubtaskId, TwoPhaseCommit};
use kafka_sink::{KafkaSink, KafkaSinkConfig, ValueFormat};
use schema_registry::RegistrySettings;
use serde_json::{Value, json};
use test_support::Services;

fn customer() -> Fields {
    vec![Field::new("email", DataType::Utf8, true)].into()
}

/// The columns; with `qty` the new nullable column of the next version.
fn schema(qty: bool) -> SchemaRef {
    let counts = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new())
        .finish()
        .data_type()
        .clone();
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("note", DataType::Utf8, true),
        Field::new("amount", DataType::Decimal128(12, 2), true),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        ),
        Field::new("took", DataType::Duration(TimeUnit::Millisecond), false),
        Field::new("day", DataType::Date32, false),
        Field::new("paid", DataType::Boolean, true),
        Field::new("customer", DataType::Struct(customer()), true),
        Field::new("tags", DataType::new_list(DataType::Utf8, true), false),
        Field::new("counts", counts, false),
    ];
    if qty {
        fields.push(Field::new("qty", DataType::Int64, true));
    }
    Arc::new(Schema::new(fields))
}

/// Row `i`: note `n<i>` for even ids, "" for ids divisible by 3 among the odd, else null; amount `i * 1.25`; at
/// 2023-11-14T22:13:20Z plus `i` seconds and `i` nanoseconds; took `i * 1500` ms negated for odd ids; day `i`
/// days after the epoch; paid false for even ids, else null; customer `user<i>@example.com`; `i % 3` tags; counts
/// {"a": i}; qty `i` when the schema has it.
fn rows(schema: &SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
    let mut amounts = Decimal128Builder::new()
        .with_precision_and_scale(12, 2)
        .unwrap();
    let mut tags = ListBuilder::new(StringBuilder::new());
    let mut counts = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
    for i in ids.clone() {
        amounts.append_value(i128::from(i) * 125);
        for t in 0..i % 3 {
            tags.values().append_value(format!("t{t}"));
        }
        tags.append(true);
        counts.keys().append_value("a");
        counts.values().append_value(i);
        counts.append(true).unwrap();
    }
    let note = |i: i64| match (i % 2, i % 3) {
        (0, _) => Some(format!("n{i}")),
        (_, 0) => Some(String::new()),
        _ => None,
    };
    let emails: ArrayRef = Arc::new(StringArray::from_iter_values(
        ids.clone().map(|i| format!("user{i}@example.com")),
    ));
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(ids.clone())),
        Arc::new(StringArray::from_iter(ids.clone().map(note))),
        Arc::new(amounts.finish()),
        Arc::new(
            TimestampNanosecondArray::from_iter_values(
                ids.clone()
                    .map(|i| 1_700_000_000_000_000_000 + i * 1_000_000_001),
            )
            .with_timezone("UTC"),
        ),
        Arc::new(DurationMillisecondArray::from_iter_values(
            ids.clone()
                .map(|i| if i % 2 == 0 { i * 1500 } else { -i * 1500 }),
        )),
        Arc::new(Date32Array::from_iter_values(ids.clone().map(|i| i as i32))),
        Arc::new(BooleanArray::from_iter(
            ids.clone().map(|i| (i % 2 == 0).then_some(false)),
        )),
        Arc::new(StructArray::new(customer(), vec![emails], None)),
        Arc::new(tags.finish()),
        Arc::new(counts.finish()),
    ];
    if schema.fields().len() == 11 {
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

/// A fraction of a second as Protobuf's JSON mapping prints it: none, or 3, 6 or 9 digits.
fn fraction(nanos: i64) -> String {
    match nanos {
        0 => String::new(),
        n if n % 1_000_000 == 0 => format!(".{:03}", n / 1_000_000),
        n if n % 1_000 == 0 => format!(".{:06}", n / 1_000),
        n => format!(".{n:09}"),
    }
}

/// Row `i` as Protobuf's JSON mapping prints it.
fn expected(i: i64) -> Value {
    let took_ms = i * 1500;
    let sign = if i % 2 == 0 { "" } else { "-" };
    let mut want = json!({
        "id": i.to_string(),
        "amount": format!("{}.{:02}", i * 125 / 100, i * 125 % 100),
        "at": format!("2023-11-14T22:13:{:02}{}Z", 20 + i, fraction(i)),
        "took": format!("{sign}{}{}s", took_ms / 1000, fraction(took_ms % 1000 * 1_000_000)),
        "day": format!("1970-01-{:02}", 1 + i),
        "customer": {"email": format!("user{i}@example.com")},
        "tags": (0..i % 3).map(|t| format!("t{t}")).collect::<Vec<_>>(),
        "counts": {"a": i.to_string()},
    });
    match (i % 2, i % 3) {
        (0, _) => want["note"] = json!(format!("n{i}")),
        (_, 0) => want["note"] = json!(""),
        _ => {}
    }
    if i % 2 == 0 {
        want["paid"] = json!(false);
    }
    if i >= 3 {
        want["qty"] = json!(i.to_string());
    }
    want
}

#[tokio::test]
async fn rows_are_protobuf_messages_of_a_registered_schema_and_a_new_column_is_a_new_version() {
    let services = Services::get();
    let bootstrap = services.kafka_bootstrap();
    let registry = services.registry();
    let topic = test_support::unique_name("protobuf-values");
    let mut config = KafkaSinkConfig::new(bootstrap, &topic, &topic);
    config.records.value_format = ValueFormat::Protobuf;
    config.registry = Some(RegistrySettings {
        username: Some(registry.user.clone()),
        password: Some(registry.password.clone().into()),
        ..RegistrySettings::new(&registry.url)
    });
    let mut sink = KafkaSink::new(config, SinkId::new("proto").unwrap(), SubtaskId(0))
        .unwrap()
        .with_evolution(schema(false), Evolution::AddColumns);
    sink.recover(None).await.unwrap();
    checkpoint(&mut sink, 2, &rows(&schema(false), 0..3)).await;
    sink.evolve(schema(true)).await.unwrap();
    checkpoint(&mut sink, 3, &rows(&schema(true), 3..6)).await;

    let seen = services.verify(
        "kafka_read_committed.py",
        &[bootstrap, &topic, "--protobuf"],
    );
    let records = seen["records"].as_array().unwrap();
    assert_eq!(records.len(), 6, "{seen}");
    for (i, record) in (0i64..).zip(records) {
        // Fields without presence print even when zero or empty; the optional ones only when set.
        let value = &record["value"];
        let want = expected(i);
        for (name, wanted) in want.as_object().unwrap() {
            assert_eq!(&value[name], wanted, "row {i} field {name}: {value}");
        }
        for absent in ["note", "paid", "qty"] {
            if want.get(absent).is_none() {
                assert!(
                    value.get(absent).is_none(),
                    "row {i}: {absent} set in {value}"
                );
            }
        }
    }
    let ids: Vec<u64> = records
        .iter()
        .map(|r| r["schema_id"].as_u64().unwrap())
        .collect();
    assert!(
        ids[0] == ids[2] && ids[3] == ids[5] && ids[0] != ids[3],
        "{ids:?}"
    );

    // The next version keeps every field's number and gives qty the next one.
    let subject = format!("{topic}-value");
    let client = schema_registry::SchemaRegistry::new(&RegistrySettings {
        username: Some(registry.user.clone()),
        password: Some(registry.password.clone().into()),
        ..RegistrySettings::new(&registry.url)
    })
    .unwrap();
    let latest = client.latest(&subject).await.unwrap();
    let file = schema_registry::protobuf::compile(&client, &latest)
        .await
        .unwrap();
    let row = file.messages().next().unwrap();
    let numbers: Vec<(String, u32)> = row
        .fields()
        .map(|f| (f.name().to_string(), f.number()))
        .collect();
    let evolved = schema(true);
    let names: Vec<&str> = evolved.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        numbers,
        names
            .iter()
            .zip(1..)
            .map(|(n, i)| (n.to_string(), i))
            .collect::<Vec<_>>()
    );

    // Without a registry, Protobuf values are refused at once, naming the setting.
    let mut config = KafkaSinkConfig::new(bootstrap, &topic, &topic);
    config.records.value_format = ValueFormat::Protobuf;
    let Err(err) = KafkaSink::new(config, SinkId::new("proto").unwrap(), SubtaskId(0)) else {
        panic!("Protobuf values without a registry were accepted");
    };
    assert!(
        err.to_string().contains("[registry]") && err.to_string().contains("protobuf"),
        "{err}"
    );
}
