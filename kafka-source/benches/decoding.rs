//! Registry-backed Avro decoding against declared-schema Avro decoding, through the Kafka source on the real broker:
//! the same topic of Confluent-framed Avro records (one schema, registered in the test services' registry) read
//! whole with each decoding, alternating, several runs each; the same records as Confluent-framed JSON documents
//! of a registered JSON Schema, read with the JSON Schema decoding (a structural schema, which the strict decoding
//! enforces alone; the same with a `minimum`, a bound checked on the decoded values; with a `pattern`, checked on
//! the decoded value by a validator of that property alone; with a `$ref` into `definitions`, judged written out;
//! and with an `allOf`, which needs each record validated whole first); the same records
//! as Confluent-framed Protobuf messages of a registered `.proto`, read with the Protobuf decoding (a message of
//! scalars, and the same with `customer` a nested message, both read straight from the wire by the decoding's fast
//! path); and the pause a
//! schema change costs the source (a writer schema that adds a field, with an evolving decoding: from the last
//! batch of the old schema to the first of the new, the registry lookup and the decoder rebuild included). Prints
//! a table and the ratios.
//!
//! Run: `scripts/services.sh up && cargo bench -p kafka-source --bench decoding` (see docs/benchmarks.md).
//! `RATCHET_BENCH_RECORDS` (default 2,000,000) and `RATCHET_BENCH_RUNS` (default 3) size it.
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_avro::schema::{FingerprintStrategy, SCHEMA_METADATA_KEY};
use arrow_avro::writer::WriterBuilder;
use arrow_avro::writer::format::AvroSoeFormat;
use arrow_schema::{DataType, Field, Schema};
use kafka_source::{
    AvroDecoding, AvroFraming, Decoding, JsonSchemaDecoding, KafkaConnection, KafkaSource,
    KafkaSourceOptions, ProtobufDecoding, ReaderSchema, UnknownFields,
};
use prost_reflect::prost::Message;
use prost_reflect::{DynamicMessage, MessageDescriptor, Value};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use schema_registry::{RegistrySettings, SchemaRegistry, SchemaType};
use test_support::Services;

const BATCH: usize = 8192;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn avro_schema(extra: bool) -> String {
    let mut fields = vec![
        r#"{"name":"id","type":"long"}"#,
        r#"{"name":"customer","type":"long"}"#,
        r#"{"name":"note","type":["null","string"],"default":null}"#,
    ];
    if extra {
        fields.push(r#"{"name":"qty","type":["null","long"],"default":null}"#);
    }
    format!(
        r#"{{"type":"record","name":"Order","namespace":"ratchet.bench","fields":[{}]}}"#,
        fields.join(",")
    )
}

/// `rows` records from `start`, Confluent-framed with schema id `id`.
fn encode(schema_text: &str, id: u32, start: i64, rows: usize, extra: bool) -> Vec<Vec<u8>> {
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("customer", DataType::Int64, false),
        Field::new("note", DataType::Utf8, true),
    ];
    if extra {
        fields.push(Field::new("qty", DataType::Int64, true));
    }
    let metadata = [(SCHEMA_METADATA_KEY.to_string(), schema_text.to_string())].into();
    let schema = Schema::new_with_metadata(fields, metadata);
    let ids = start..start + rows as i64;
    let mut columns: Vec<arrow_array::ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(ids.clone())),
        Arc::new(Int64Array::from_iter_values(ids.clone().map(|i| i % 9973))),
        Arc::new(StringArray::from_iter_values(
            ids.clone().map(|i| format!("note {i} {}", "x".repeat(40))),
        )),
    ];
    if extra {
        columns.push(Arc::new(Int64Array::from_iter_values(ids)));
    }
    let batch = RecordBatch::try_new(Arc::new(schema.clone()), columns).unwrap();
    let mut encoder = WriterBuilder::new(schema)
        .with_fingerprint_strategy(FingerprintStrategy::Id(id))
        .build_encoder::<AvroSoeFormat>()
        .unwrap();
    encoder.encode(&batch).unwrap();
    encoder.flush().iter().map(|r| r.to_vec()).collect()
}

/// The JSON Schema of the same records.
const JSON_SCHEMA: &str = r#"{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
  "required": ["id", "customer"], "additionalProperties": false,
  "properties": {"id": {"type": "integer"}, "customer": {"type": "integer"},
                 "note": {"anyOf": [{"type": "null"}, {"type": "string"}]}}}"#;

/// The JSON Schema cases, each read from a topic of its own: the topic's suffix, what the table says of it, the
/// schema the documents are registered under.
fn json_cases() -> Vec<(&'static str, &'static str, String)> {
    let customer = r#""customer": {"type": "integer"}"#;
    vec![
        (
            "structural",
            "a structural schema: checked by the strict decoding",
            JSON_SCHEMA.to_string(),
        ),
        (
            "minimum",
            "a `minimum`: checked on the decoded values",
            JSON_SCHEMA.replace(customer, r#""customer": {"type": "integer", "minimum": 0}"#),
        ),
        (
            "pattern",
            "a `pattern`: checked on the decoded value by the property's validator",
            JSON_SCHEMA.replace(
                r#"{"type": "string"}"#,
                r#"{"type": "string", "pattern": "^note [0-9]+ x+$"}"#,
            ),
        ),
        (
            "ref",
            "a `$ref` to `definitions`: judged written out, checked by the strict decoding",
            JSON_SCHEMA
                .replace(customer, r##""customer": {"$ref": "#/definitions/customer"}"##)
                .replace(
                    r#""additionalProperties": false,"#,
                    r#""additionalProperties": false, "definitions": {"customer": {"type": "integer"}},"#,
                ),
        ),
        (
            "whole",
            "an `allOf`: each record validated whole, then decoded",
            JSON_SCHEMA.replace(
                customer,
                r#""customer": {"allOf": [{"type": "integer"}, {"minimum": 0}]}"#,
            ),
        ),
    ]
}

/// `rows` records from `start` as JSON documents, Confluent-framed with schema id `id`.
fn encode_json(id: u32, start: i64, rows: usize) -> Vec<Vec<u8>> {
    (start..start + rows as i64)
        .map(|i| {
            let mut value = vec![0];
            value.extend(id.to_be_bytes());
            value.extend(
                format!(
                    r#"{{"id":{i},"customer":{},"note":"note {i} {}"}}"#,
                    i % 9973,
                    "x".repeat(40)
                )
                .into_bytes(),
            );
            value
        })
        .collect()
}

/// The `.proto` of the same records.
const PROTO: &str = r#"syntax = "proto3";
package ratchet.bench;
message Order { int64 id = 1; int64 customer = 2; optional string note = 3; }
"#;

/// The same records with the customer a nested message.
const PROTO_NESTED: &str = r#"syntax = "proto3";
package ratchet.bench;
message Order { int64 id = 1; Customer customer = 2; optional string note = 3; }
message Customer { int64 id = 1; }
"#;

/// `rows` records from `start` as `Order` messages, Confluent-framed with schema id `id` and message index `[0]`.
fn encode_protobuf(order: &MessageDescriptor, id: u32, start: i64, rows: usize) -> Vec<Vec<u8>> {
    let customer = order.get_field(2).unwrap();
    (start..start + rows as i64)
        .map(|i| {
            let mut message = DynamicMessage::new(order.clone());
            message.set_field_by_number(1, Value::I64(i));
            match customer.kind().as_message() {
                Some(nested) => {
                    let mut customer = DynamicMessage::new(nested.clone());
                    customer.set_field_by_number(1, Value::I64(i % 9973));
                    message.set_field_by_number(2, Value::Message(customer));
                }
                None => message.set_field_by_number(2, Value::I64(i % 9973)),
            }
            message.set_field_by_number(3, Value::String(format!("note {i} {}", "x".repeat(40))));
            let mut value = vec![0];
            value.extend(id.to_be_bytes());
            value.push(0);
            message.encode(&mut value).unwrap();
            value
        })
        .collect()
}

fn produce(producer: &ThreadedProducer<DefaultProducerContext>, topic: &str, values: &[Vec<u8>]) {
    for value in values {
        while producer
            .send(BaseRecord::<[u8], [u8]>::to(topic).payload(value))
            .is_err()
        {
            producer.poll(Duration::from_millis(5));
        }
    }
    producer.flush(Duration::from_secs(120)).unwrap();
}

fn options(decoding: Decoding) -> KafkaSourceOptions {
    KafkaSourceOptions {
        decoding,
        batch_rows: BATCH,
        ..KafkaSourceOptions::default()
    }
}

/// Reads `rows` rows of `topic` from the beginning with `decoding`; the time it took.
async fn read_all(
    kafka: &KafkaConnection,
    topic: &str,
    decoding: Decoding,
    rows: usize,
) -> Duration {
    let mut source = KafkaSource::open_with(kafka, topic, &[], options(decoding))
        .await
        .unwrap();
    let started = Instant::now();
    let mut seen = 0;
    while seen < rows {
        if let Some(batch) = source.next_batch(Duration::from_secs(5)).await.unwrap() {
            seen += batch.num_rows();
        }
    }
    started.elapsed()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let records = env("RATCHET_BENCH_RECORDS", 2_000_000);
    let runs = env("RATCHET_BENCH_RUNS", 3);
    let services = Services::get();
    let bootstrap = services.kafka_bootstrap().to_string();
    let endpoint = services.registry();
    let registry = SchemaRegistry::new(&RegistrySettings {
        username: Some(endpoint.user.clone()),
        password: Some(endpoint.password.clone().into()),
        ..RegistrySettings::new(&endpoint.url)
    })
    .unwrap();
    let topic = test_support::unique_name("bench-decoding");
    let subject = format!("{topic}-value");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    let v1 = avro_schema(false);
    let id = registry.register(&subject, &v1).await.unwrap();
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .create()
        .unwrap();
    eprintln!("producing {records} records to {topic}");
    for start in (0..records).step_by(100_000) {
        let rows = 100_000.min(records - start);
        produce(
            &producer,
            &topic,
            &encode(&v1, id, start as i64, rows, false),
        );
    }

    // The same documents under each of the JSON Schema cases.
    let mut json_topics = Vec::new();
    for (suffix, _, schema) in json_cases() {
        let json_topic = format!("{topic}-{suffix}");
        admin
            .create_topics(
                &[NewTopic::new(&json_topic, 1, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await
            .unwrap();
        let json_subject = format!("{json_topic}-value");
        let json_id = registry
            .register_as(&json_subject, &schema, SchemaType::Json)
            .await
            .unwrap();
        eprintln!("producing {records} JSON Schema records to {json_topic}");
        for start in (0..records).step_by(100_000) {
            let rows = 100_000.min(records - start);
            produce(
                &producer,
                &json_topic,
                &encode_json(json_id, start as i64, rows),
            );
        }
        json_topics.push((json_topic, registry.latest(&json_subject).await.unwrap()));
    }

    let mut proto_topics = Vec::new();
    for (suffix, proto) in [("protobuf", PROTO), ("protobuf-nested", PROTO_NESTED)] {
        let proto_topic = format!("{topic}-{suffix}");
        admin
            .create_topics(
                &[NewTopic::new(&proto_topic, 1, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await
            .unwrap();
        let proto_subject = format!("{proto_topic}-value");
        let proto_id = registry
            .register_as(&proto_subject, proto, SchemaType::Protobuf)
            .await
            .unwrap();
        let latest_proto = registry.latest(&proto_subject).await.unwrap();
        let proto_file = schema_registry::protobuf::compile(&registry, &latest_proto)
            .await
            .unwrap();
        let order = proto_file.messages().next().unwrap();
        eprintln!("producing {records} Protobuf records to {proto_topic}");
        for start in (0..records).step_by(100_000) {
            let rows = 100_000.min(records - start);
            produce(
                &producer,
                &proto_topic,
                &encode_protobuf(&order, proto_id, start as i64, rows),
            );
        }
        proto_topics.push((proto_topic, latest_proto, proto_file));
    }

    let kafka = KafkaConnection::plaintext(&bootstrap);
    let latest = registry.latest(&subject).await.unwrap();
    let (mut declared, mut looked_up) = (Vec::new(), Vec::new());
    let mut json = vec![Vec::new(); json_topics.len()];
    let mut proto = [Vec::new(), Vec::new()];
    for run in 0..runs {
        let plain = AvroDecoding::new(&v1, AvroFraming::Confluent { schema_id: id }).unwrap();
        declared.push(read_all(&kafka, &topic, Decoding::Avro(plain), records).await);
        let through = AvroDecoding::from_registry(
            registry.clone(),
            ReaderSchema::latest(&latest),
            connector_api::Evolution::None,
        )
        .unwrap();
        looked_up.push(read_all(&kafka, &topic, Decoding::Avro(through), records).await);
        for ((json_topic, latest_json), times) in json_topics.iter().zip(&mut json) {
            let documents = JsonSchemaDecoding::from_registry(
                registry.clone(),
                ReaderSchema::latest(latest_json),
                UnknownFields::Fail,
                connector_api::Evolution::None,
            )
            .unwrap();
            times
                .push(read_all(&kafka, json_topic, Decoding::JsonSchema(documents), records).await);
        }
        for ((proto_topic, latest_proto, proto_file), times) in proto_topics.iter().zip(&mut proto)
        {
            let messages = ProtobufDecoding::from_registry(
                registry.clone(),
                ReaderSchema::latest(latest_proto),
                proto_file,
                None,
                connector_api::Evolution::None,
            )
            .unwrap();
            times.push(read_all(&kafka, proto_topic, Decoding::Protobuf(messages), records).await);
        }
        let json_runs: Vec<String> = json.iter().map(|t| format!("{:?}", t[run])).collect();
        eprintln!(
            "run {run}: declared {:?}, registry {:?}, JSON Schema {}, Protobuf {:?} (nested {:?})",
            declared[run],
            looked_up[run],
            json_runs.join(" / "),
            proto[0][run],
            proto[1][run]
        );
    }
    let rate = |d: Duration| records as f64 / d.as_secs_f64();
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    // Paired: each run's ratio to the registry Avro read just before it, then the median of the runs (lowest and
    // highest beside it), which a machine slowing down for a while moves less than a ratio of medians.
    let paired = |times: &[Duration]| {
        let mut ratios: Vec<f64> = times
            .iter()
            .zip(&looked_up)
            .map(|(time, avro)| 100.0 * avro.as_secs_f64() / time.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        format!(
            "{:.1}% ({:.1}-{:.1})",
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1]
        )
    };
    let json_ratios: Vec<String> = json_cases()
        .iter()
        .zip(&json)
        .map(|((suffix, _, _), times)| format!("{} {suffix}", paired(times)))
        .collect();
    let proto_ratios = format!(
        "{} scalars, {} a nested message",
        paired(&proto[0]),
        paired(&proto[1])
    );
    let [flat, nested] = proto;
    let json: Vec<Duration> = json.into_iter().map(median).collect();
    let (declared, looked_up, proto, nested) = (
        median(declared),
        median(looked_up),
        median(flat),
        median(nested),
    );

    // The schema change: a version that adds `qty`, read by an evolving decoding after the old records.
    let v2 = avro_schema(true);
    let id2 = registry.register(&subject, &v2).await.unwrap();
    produce(
        &producer,
        &topic,
        &encode(&v2, id2, records as i64, 10_000, true),
    );
    let evolving = AvroDecoding::from_registry(
        registry.clone(),
        ReaderSchema::latest(&latest),
        connector_api::Evolution::AddColumns,
    )
    .unwrap();
    let mut source = KafkaSource::open_with(&kafka, &topic, &[], options(Decoding::Avro(evolving)))
        .await
        .unwrap();
    let mut seen = 0;
    let mut last_old = Instant::now();
    let pause = loop {
        if let Some(batch) = source.next_batch(Duration::from_secs(5)).await.unwrap() {
            seen += batch.num_rows();
            last_old = Instant::now();
        }
        if seen >= records && source.schema_change().is_some() {
            source.accept_schema_change();
            source
                .next_batch(Duration::from_secs(5))
                .await
                .unwrap()
                .expect("the new schema's first batch");
            break last_old.elapsed();
        }
    };

    println!();
    println!("| decoding | records | median time | records/s |");
    println!("|---|---|---|---|");
    println!(
        "| Avro, declared schema | {records} | {:.2} s | {:.0} |",
        declared.as_secs_f64(),
        rate(declared)
    );
    println!(
        "| Avro, schema registry | {records} | {:.2} s | {:.0} |",
        looked_up.as_secs_f64(),
        rate(looked_up)
    );
    for ((_, what, _), time) in json_cases().iter().zip(&json) {
        println!(
            "| JSON Schema, schema registry ({what}) | {records} | {:.2} s | {:.0} |",
            time.as_secs_f64(),
            rate(*time)
        );
    }
    println!(
        "| Protobuf, schema registry (scalars: the fast path) | {records} | {:.2} s | {:.0} |",
        proto.as_secs_f64(),
        rate(proto)
    );
    println!(
        "| Protobuf, schema registry (a nested message: the fast path too) | {records} | {:.2} s | {:.0} |",
        nested.as_secs_f64(),
        rate(nested)
    );
    println!();
    println!(
        "registry / declared: {:.1}%",
        100.0 * rate(looked_up) / rate(declared)
    );
    println!(
        "JSON Schema / Avro through the registry, paired by run (median, lowest-highest): {}",
        json_ratios.join(", ")
    );
    println!("Protobuf / Avro through the registry, paired by run: {proto_ratios}");
    println!(
        "schema change pause at the source (last batch of the old schema to the first of the new, lookup and \
         decoder rebuild included): {:.1} ms",
        pause.as_secs_f64() * 1000.0
    );
}
