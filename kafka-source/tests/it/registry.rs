//! Avro through the schema registry of the test services (Apicurio, Confluent API), with records written by
//! confluent-kafka's AvroSerializer: writer schemas found by the id each record carries and read as the subject's
//! latest schema, across schema versions mixed in one batch; a writer schema with a field the reader lacks, or an
//! id the registry does not have, refused naming the record and both ids (and set aside with dead letters on); a
//! registry that cannot be reached is an outage, never a bad record; one that does not have an id yet (a replica
//! behind its leader) is asked again before the record is a bad one. Writer schemas whose logical types differ from
//! the reader's (decimal scale, time unit) are read exactly, or refused naming the field and both ids.

use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use connector_api::{ErrorKind, RetryPolicy};
use kafka_source::{
    AvroDecoding, Decoding, KafkaConnection, KafkaSource, KafkaSourceOptions, ReaderSchema,
};
use schema_registry::{RegistrySettings, SchemaRegistry, SubjectStrategy};
use serde_json::json;
use test_support::Services;

use crate::source::{bootstrap, producer, read_rows, send, topic};

const WAIT: Duration = Duration::from_secs(20);

fn schema(extra: &[serde_json::Value]) -> String {
    let mut fields = vec![
        json!({"name": "id", "type": "long"}),
        json!({"name": "note", "type": ["null", "string"], "default": null}),
    ];
    fields.extend_from_slice(extra);
    json!({"type": "record", "name": "Order", "namespace": "ratchet.test", "fields": fields})
        .to_string()
}

fn qty() -> serde_json::Value {
    json!({"name": "qty", "type": ["null", "int"], "default": null})
}

/// Writes `records` with confluent-kafka's AvroSerializer; the schema id they carry.
fn produce(topic: &str, schema: &str, records: serde_json::Value) -> u32 {
    let out = Services::get().produce(
        "confluent_avro.py",
        &[bootstrap(), topic, schema, &records.to_string()],
    );
    u32::try_from(out["schema_id"].as_u64().unwrap()).unwrap()
}

/// [`produce`] under subject compatibility NONE: a new version may change a field's logical type.
fn produce_any(topic: &str, schema: &str, records: serde_json::Value) -> u32 {
    let out = Services::get().produce(
        "confluent_avro.py",
        &[
            bootstrap(),
            topic,
            schema,
            &records.to_string(),
            "topic-name",
            "NONE",
        ],
    );
    u32::try_from(out["schema_id"].as_u64().unwrap()).unwrap()
}

/// An order with an amount `decimal(precision, scale)` and a timestamp in `unit` (`millis` or `micros`).
fn money(precision: u32, scale: u32, unit: &str) -> String {
    json!({"type": "record", "name": "Money", "namespace": "ratchet.test", "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}},
        {"name": "at", "type": {"type": "long", "logicalType": format!("timestamp-{unit}")}},
    ]})
    .to_string()
}

fn registry() -> SchemaRegistry {
    let endpoint = Services::get().registry();
    SchemaRegistry::new(&RegistrySettings {
        username: Some(endpoint.user),
        password: Some(endpoint.password.into()),
        ..RegistrySettings::new(&endpoint.url)
    })
    .unwrap()
}

/// The registry-backed decoding of `topic`'s values, read as the latest schema of `<topic>-value`.
async fn decoding(topic: &str) -> Decoding {
    let registry = registry();
    let subject = SubjectStrategy::TopicName
        .subject(topic, false, None)
        .unwrap();
    let latest = registry.latest(&subject).await.unwrap();
    Decoding::Avro(
        AvroDecoding::from_registry(
            registry,
            ReaderSchema::latest(&latest),
            connector_api::Evolution::None,
        )
        .unwrap(),
    )
}

async fn open(topic: &str, decoding: Decoding, divert: bool) -> KafkaSource {
    let options = KafkaSourceOptions {
        decoding,
        batch_rows: 100,
        divert_bad_records: divert,
        ..KafkaSourceOptions::default()
    };
    KafkaSource::open_with(
        &KafkaConnection::plaintext(bootstrap()),
        topic,
        &[],
        options,
    )
    .await
    .unwrap()
}

fn column<T: arrow_array::types::ArrowPrimitiveType>(
    batches: &[RecordBatch],
    name: &str,
) -> Vec<Option<T::Native>> {
    batches
        .iter()
        .flat_map(|b| {
            let column = b.column_by_name(name).unwrap().as_primitive::<T>().clone();
            (0..column.len())
                .map(|i| column.is_valid(i).then(|| column.value(i)))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_mixed_in_one_batch_are_read_as_the_latest_schema() {
    let topic = topic("registry-mixed", 1).await;
    let v1 = schema(&[]);
    let v2 = schema(&[qty()]);
    let first = produce(
        &topic,
        &v1,
        json!([{"id": 0, "note": "a"}, {"id": 1, "note": null}]),
    );
    let second = produce(&topic, &v2, json!([{"id": 2, "note": null, "qty": 7}]));
    assert_ne!(first, second, "a new version, a new id");
    produce(&topic, &v1, json!([{"id": 3, "note": "d"}]));
    produce(&topic, &v2, json!([{"id": 4, "note": "e", "qty": 9}]));

    let mut source = open(&topic, decoding(&topic).await, false).await;
    let batches = read_rows(&mut source, 5).await;
    let names: Vec<String> = batches[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["id", "note", "qty"]);
    assert_eq!(
        column::<Int64Type>(&batches, "id"),
        [0, 1, 2, 3, 4].map(Some)
    );
    // A v1 record has no qty: the reader schema's default.
    assert_eq!(
        column::<Int32Type>(&batches, "qty"),
        [None, None, Some(7), None, Some(9)]
    );
    let notes: Vec<Option<String>> = batches
        .iter()
        .flat_map(|b| {
            let notes = b.column_by_name("note").unwrap().as_string::<i32>().clone();
            (0..notes.len())
                .map(|i| notes.is_valid(i).then(|| notes.value(i).to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        notes,
        [Some("a"), None, None, Some("d"), Some("e")].map(|n| n.map(str::to_string))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_the_reader_lacks_stops_the_source_naming_it_and_both_ids() {
    let topic = topic("registry-added", 1).await;
    let v1 = produce(&topic, &schema(&[]), json!([{"id": 0}, {"id": 1}]));
    let mut source = open(&topic, decoding(&topic).await, false).await;
    read_rows(&mut source, 2).await;

    let v2 = produce(&topic, &schema(&[qty()]), json!([{"id": 2, "qty": 5}]));
    let err = source.next_batch(WAIT).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
    let text = err.to_string();
    for expected in [
        format!("{topic}/0@2"),
        format!("schema id {v2}"),
        "`qty`".to_string(),
        format!("reader schema id {v1}"),
    ] {
        assert!(text.contains(&expected), "{expected:?} in {text}");
    }
    assert_eq!(
        source.positions()[0].next_offset,
        2,
        "nothing past it handed out"
    );

    // Read as version 1 with dead letters on, the record is set aside with that reason and the source goes on.
    produce(&topic, &schema(&[]), json!([{"id": 3}]));
    let version_1 = ReaderSchema {
        schema: schema(&[]),
        id: Some(v1),
        origin: "version 1".to_string(),
    };
    let as_v1 = Decoding::Avro(
        AvroDecoding::from_registry(registry(), version_1, connector_api::Evolution::None).unwrap(),
    );
    let mut source = open(&topic, as_v1, true).await;
    let batches = read_rows(&mut source, 3).await;
    assert_eq!(column::<Int64Type>(&batches, "id"), [0, 1, 3].map(Some));
    let rejected = source.take_rejected();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].offset, 2);
    assert!(
        rejected[0].reason.contains("`qty`"),
        "{}",
        rejected[0].reason
    );

    // Reopened, the reader is the latest version (2), which has qty: every record reads.
    let mut source = open(&topic, decoding(&topic).await, false).await;
    let batches = read_rows(&mut source, 4).await;
    assert_eq!(column::<Int64Type>(&batches, "id"), [0, 1, 2, 3].map(Some));
    assert_eq!(
        column::<Int32Type>(&batches, "qty"),
        [None, None, Some(5), None]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_id_is_a_bad_record_and_an_unreachable_registry_is_not() {
    let topic = topic("registry-unknown", 1).await;
    produce(&topic, &schema(&[]), json!([{"id": 0}]));
    // A record framed with an id no schema has (hand-framed: no serializer writes one).
    let plain = producer(None);
    send(&plain, &topic, 0, &[0, 0x7f, 0xff, 0xff, 0xf0, 2]);
    rdkafka::producer::Producer::flush(&plain, Duration::from_secs(30)).unwrap();

    let mut source = open(&topic, decoding(&topic).await, true).await;
    let batches = read_rows(&mut source, 1).await;
    assert_eq!(column::<Int64Type>(&batches, "id"), [Some(0)]);
    let mut rejected = source.take_rejected();
    let started = std::time::Instant::now();
    while rejected.is_empty() && started.elapsed() < WAIT {
        source.next_batch(Duration::from_millis(200)).await.unwrap();
        rejected = source.take_rejected();
    }
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(
        rejected[0]
            .reason
            .contains("schema id 2147483632, which the schema registry"),
        "{}",
        rejected[0].reason
    );

    // The same record with no registry to ask: an outage, never set aside, though dead letters are on.
    let latest = registry().latest(&format!("{topic}-value")).await.unwrap();
    let dead = SchemaRegistry::new(&RegistrySettings {
        request_timeout: Duration::from_millis(300),
        ..RegistrySettings::new("http://127.0.0.1:1")
    })
    .unwrap()
    .with_retry(RetryPolicy::NEVER);
    let decoding = Decoding::Avro(
        AvroDecoding::from_registry(
            dead,
            ReaderSchema::latest(&latest),
            connector_api::Evolution::None,
        )
        .unwrap(),
    );
    let mut source = open(&topic, decoding, true).await;
    let err = loop {
        match source.next_batch(WAIT).await {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Retryable, "{err}");
    assert!(
        err.to_string()
            .contains("cannot look up schema id 2147483632"),
        "{err}"
    );
    assert!(source.take_rejected().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evolving_decoding_widens_its_reader_at_a_batch_boundary_held_until_accepted() {
    let topic = topic("registry-evolve", 1).await;
    let v1 = produce(&topic, &schema(&[]), json!([{"id": 0}, {"id": 1}]));
    let registry = registry();
    let latest = registry.latest(&format!("{topic}-value")).await.unwrap();
    assert_eq!(latest.id, v1);
    let decoding = Decoding::Avro(
        AvroDecoding::from_registry(
            registry,
            ReaderSchema::latest(&latest),
            connector_api::Evolution::AddColumns,
        )
        .unwrap(),
    );
    let mut source = open(&topic, decoding, false).await;
    let before = read_rows(&mut source, 2).await;
    assert_eq!(column::<Int64Type>(&before, "id"), [Some(0), Some(1)]);

    produce(
        &topic,
        &schema(&[qty()]),
        json!([{"id": 2, "qty": 5}, {"id": 3, "qty": 6}]),
    );
    produce(&topic, &schema(&[]), json!([{"id": 4}]));
    let started = std::time::Instant::now();
    let widened = loop {
        assert!(started.elapsed() < WAIT, "no schema change");
        assert!(
            source
                .next_batch(Duration::from_millis(200))
                .await
                .unwrap()
                .is_none(),
            "no batch of the old schema is left"
        );
        if let Some(schema) = source.schema_change() {
            break schema;
        }
    };
    let names: Vec<&str> = widened.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "note", "qty"]);
    assert!(widened.field(2).is_nullable());
    // Held: nothing of the new schema is handed out, the positions end before it.
    assert!(
        source
            .next_batch(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(source.positions()[0].next_offset, 2);

    source.accept_schema_change();
    assert_eq!(source.schema(), widened);
    let after = read_rows(&mut source, 3).await;
    assert!(
        after
            .iter()
            .all(|b| b.schema().fields() == widened.fields())
    );
    assert_eq!(column::<Int64Type>(&after, "id"), [2, 3, 4].map(Some));
    // The version-1 record after the change reads with the new column's default.
    assert_eq!(column::<Int32Type>(&after, "qty"), [Some(5), Some(6), None]);
    assert_eq!(source.positions()[0].next_offset, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incompatible_change_is_refused_naming_the_field_and_both_ids_even_when_evolving() {
    let topic = topic("registry-incompatible", 1).await;
    let v1 = produce(&topic, &schema(&[]), json!([{"id": 0}]));
    let registry = registry();
    let latest = registry.latest(&format!("{topic}-value")).await.unwrap();
    // Changes the registry's BACKWARD default would refuse, registered with compatibility NONE.
    let produce_incompatible = |schema: &str, records: serde_json::Value| {
        let out = Services::get().produce(
            "confluent_avro.py",
            &[
                bootstrap(),
                &topic,
                schema,
                &records.to_string(),
                "topic-name",
                "NONE",
            ],
        );
        u32::try_from(out["schema_id"].as_u64().unwrap()).unwrap()
    };
    let required = schema(&[json!({"name": "qty", "type": "long"})]);
    let v2 = produce_incompatible(&required, json!([{"id": 1, "qty": 5}]));
    let retyped = json!({"type": "record", "name": "Order", "namespace": "ratchet.test", "fields": [
        {"name": "id", "type": "long"}, {"name": "note", "type": ["null", "long"], "default": null}]})
    .to_string();
    let v3 = produce_incompatible(&retyped, json!([{"id": 2, "note": 7}]));
    produce(&topic, &schema(&[]), json!([{"id": 3}]));

    let decoding = Decoding::Avro(
        AvroDecoding::from_registry(
            registry,
            ReaderSchema::latest(&latest),
            connector_api::Evolution::AddColumns,
        )
        .unwrap(),
    );
    let mut source = open(&topic, decoding, true).await;
    let batches = read_rows(&mut source, 2).await;
    assert_eq!(column::<Int64Type>(&batches, "id"), [Some(0), Some(3)]);
    assert!(
        source.schema_change().is_none(),
        "nothing widened the reader"
    );
    let mut rejected = source.take_rejected();
    rejected.sort_by_key(|r| r.offset);
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    let (required, retyped) = (&rejected[0].reason, &rejected[1].reason);
    assert!(
        required.contains(&format!("schema id {v2}"))
            && required.contains("`qty` without a default")
            && required.contains(&format!("reader schema id {v1}")),
        "{required}"
    );
    assert!(
        retyped.contains(&format!("schema id {v3}"))
            && retyped.contains(&format!("cannot be read as reader schema id {v1}"))
            && retyped.contains("field `note` changed type"),
        "{retyped}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_with_other_decimal_scales_or_time_units_are_read_exactly_or_refused() {
    // A backlog of decimal(10,2) and timestamp-millis, read as the latest version: decimal(12,4), timestamp-micros.
    let backlog = topic("registry-logical", 1).await;
    let v1 = produce_any(
        &backlog,
        &money(10, 2, "millis"),
        json!([{"id": 1, "amount": "12345678.91", "at": 1_700_000_000_123_i64},
               {"id": 2, "amount": "-0.05", "at": -86_400_001_i64}]),
    );
    let v2 = produce_any(
        &backlog,
        &money(12, 4, "micros"),
        json!([{"id": 3, "amount": "99999999.9999", "at": 1_700_000_000_123_456_i64}]),
    );
    assert_ne!(v1, v2);
    let mut source = open(&backlog, decoding(&backlog).await, false).await;
    let batches = read_rows(&mut source, 3).await;
    assert_eq!(
        batches[0]
            .schema()
            .field_with_name("amount")
            .unwrap()
            .data_type(),
        &arrow_schema::DataType::Decimal128(12, 4)
    );
    // Rescaled, not reinterpreted: 12345678.91 is 123456789100 at scale 4 (read as scale 4 without converting,
    // its unscaled 1234567891 would be 123456.7891).
    assert_eq!(
        column::<Decimal128Type>(&batches, "amount"),
        [Some(123_456_789_100), Some(-500), Some(999_999_999_999)]
    );
    assert_eq!(
        column::<TimestampMicrosecondType>(&batches, "at"),
        [
            Some(1_700_000_000_123_000),
            Some(-86_400_001_000),
            Some(1_700_000_000_123_456)
        ]
    );

    // A writer with more fractional digits than the reader keeps is refused, naming the field and both ids.
    let narrowed = topic("registry-narrowed", 1).await;
    let wide = produce_any(
        &narrowed,
        &money(10, 4, "micros"),
        json!([{"id": 1, "amount": "1.2345", "at": 1_i64}]),
    );
    let narrow = produce_any(
        &narrowed,
        &money(10, 2, "micros"),
        json!([{"id": 2, "amount": "1.23", "at": 2_i64}]),
    );
    let mut source = open(&narrowed, decoding(&narrowed).await, false).await;
    let err = loop {
        match source.next_batch(WAIT).await {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
    let text = err.to_string();
    for expected in [
        format!("schema id {wide}"),
        "`amount`".to_string(),
        format!("schema id {narrow}"),
        format!("{narrowed}/0@0"),
    ] {
        assert!(text.contains(&expected), "{expected:?} in {text}");
    }
}

/// A schema registry replica behind its leader: `GET /schemas/ids/{id}` answers 404 `misses` times, then the
/// schema (each answer on its own connection). The number of lookups so far.
fn lagging_registry(
    schema: String,
    misses: usize,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = asked.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 2 {
                request.push_str(&line);
                line.clear();
            }
            let (status, body) = if !request.contains("/schemas/ids/") {
                (
                    "404 Not Found",
                    json!({"error_code": 40401, "message": "not served"}),
                )
            } else if counter.fetch_add(1, Ordering::SeqCst) < misses {
                (
                    "404 Not Found",
                    json!({"error_code": 40403, "message": "Schema not found"}),
                )
            } else {
                ("200 OK", json!({"schema": schema}))
            };
            let body = body.to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, asked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_id_the_registry_does_not_have_yet_is_asked_again_before_the_record_is_bad() {
    let topic = topic("registry-lagging", 1).await;
    // The record's writer schema is not the reader's (the latest version): it is looked up by its id.
    let v1 = schema(&[]);
    let id = produce(&topic, &v1, json!([{"id": 7, "note": "late"}]));
    produce(&topic, &schema(&[qty()]), json!([{"id": 8, "qty": 1}]));
    let latest = registry().latest(&format!("{topic}-value")).await.unwrap();
    assert_ne!(latest.id, id);
    let (url, asked) = lagging_registry(v1, 2);
    let lagging = SchemaRegistry::new(&RegistrySettings::new(&url)).unwrap();
    let decoding = Decoding::Avro(
        AvroDecoding::from_registry(
            lagging,
            ReaderSchema::latest(&latest),
            connector_api::Evolution::None,
        )
        .unwrap(),
    );
    let mut source = open(&topic, decoding, true).await;
    let batches = read_rows(&mut source, 2).await;
    assert_eq!(column::<Int64Type>(&batches, "id"), [Some(7), Some(8)]);
    assert!(
        source.take_rejected().is_empty(),
        "schema id {id} was refused on the registry's first 404"
    );
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "asked until found"
    );
}

/// A `Measure` record: `id`, then `qty`, `ratio` and `price` as each version types them.
fn measure(qty: serde_json::Value, ratio: &str, precision: u32) -> String {
    json!({"type": "record", "name": "Measure", "namespace": "ratchet.test", "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": qty},
        {"name": "ratio", "type": ratio},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": 2}},
    ]})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn widened_and_optional_fields_widen_the_reader_only_with_evolve() {
    let topic = topic("registry-widen", 1).await;
    let v1 = produce(
        &topic,
        &measure(json!("int"), "float", 9),
        json!([{"id": 0, "qty": 7, "ratio": 0.25, "price": "1234567.89"}]),
    );
    let registry = registry();
    let latest = registry.latest(&format!("{topic}-value")).await.unwrap();
    let v2 = produce(
        &topic,
        &measure(json!(["null", "long"]), "double", 12),
        json!([
            {"id": 1, "qty": 100_000_000_000_i64, "ratio": 0.1, "price": "1234567890.12"},
            {"id": 2, "qty": null, "ratio": 2.5, "price": "-0.01"}
        ]),
    );
    produce(
        &topic,
        &measure(json!("int"), "float", 9),
        json!([{"id": 3, "qty": -8, "ratio": 1.5, "price": "-9999999.99"}]),
    );

    // add-columns: the widened writer is refused, naming the field, both ids and the setting that takes it.
    let decoding = Decoding::Avro(
        AvroDecoding::from_registry(
            registry.clone(),
            ReaderSchema::latest(&latest),
            connector_api::Evolution::AddColumns,
        )
        .unwrap(),
    );
    let mut source = open(&topic, decoding, true).await;
    let batches = read_rows(&mut source, 2).await;
    assert_eq!(column::<Int64Type>(&batches, "id"), [Some(0), Some(3)]);
    let rejected = source.take_rejected();
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    let reason = &rejected[0].reason;
    for expected in [
        format!("schema id {v2}"),
        format!("reader schema id {v1}"),
        "`qty`".to_string(),
        "evolution = \"evolve\"".to_string(),
    ] {
        assert!(reason.contains(&expected), "{expected} in {reason}");
    }

    // evolve: a new generation with the writer's types; the older writer's values read into it exactly.
    let decoding = Decoding::Avro(
        AvroDecoding::from_registry(
            registry,
            ReaderSchema::latest(&latest),
            connector_api::Evolution::Evolve,
        )
        .unwrap(),
    );
    let mut source = open(&topic, decoding, false).await;
    let before = read_rows(&mut source, 1).await;
    assert_eq!(column::<Int32Type>(&before, "qty"), [Some(7)]);
    let started = std::time::Instant::now();
    let widened = loop {
        assert!(started.elapsed() < WAIT, "no schema change");
        assert!(
            source
                .next_batch(Duration::from_millis(200))
                .await
                .unwrap()
                .is_none()
        );
        if let Some(schema) = source.schema_change() {
            break schema;
        }
    };
    let types: Vec<(String, String, bool)> = widened
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().to_string(), f.is_nullable()))
        .collect();
    let expected: Vec<(String, String, bool)> = [
        ("id", "Int64", false),
        ("qty", "Int64", true),
        ("ratio", "Float64", false),
        ("price", "Decimal128(12, 2)", false),
    ]
    .map(|(n, t, null)| (n.to_string(), t.to_string(), null))
    .to_vec();
    assert_eq!(types, expected);
    source.accept_schema_change();
    let after = read_rows(&mut source, 3).await;
    assert_eq!(column::<Int64Type>(&after, "id"), [1, 2, 3].map(Some));
    assert_eq!(
        column::<Int64Type>(&after, "qty"),
        [Some(100_000_000_000), None, Some(-8)]
    );
    assert_eq!(
        column::<arrow_array::types::Float64Type>(&after, "ratio"),
        [Some(0.1), Some(2.5), Some(1.5)]
    );
    assert_eq!(
        column::<Decimal128Type>(&after, "price"),
        [Some(123_456_789_012), Some(-1), Some(-999_999_999)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_added_inside_a_nested_record_is_taken_only_with_evolve() {
    let topic = topic("registry-nested", 1).await;
    let customer = |email: bool| {
        let mut fields = vec![json!({"name": "name", "type": "string"})];
        if email {
            fields.push(json!({"name": "email", "type": ["null", "string"], "default": null}));
        }
        schema(&[
            json!({"name": "customer", "type": {"type": "record", "name": "Customer", "fields": fields}}),
        ])
    };
    let v1 = produce(
        &topic,
        &customer(false),
        json!([{"id": 0, "customer": {"name": "a"}}]),
    );
    let registry = registry();
    let latest = registry.latest(&format!("{topic}-value")).await.unwrap();
    let v2 = produce(
        &topic,
        &customer(true),
        json!([{"id": 1, "customer": {"name": "b", "email": "b@x"}}]),
    );
    produce(
        &topic,
        &customer(false),
        json!([{"id": 2, "customer": {"name": "c"}}]),
    );

    let decoding = |evolution| {
        Decoding::Avro(
            AvroDecoding::from_registry(registry.clone(), ReaderSchema::latest(&latest), evolution)
                .unwrap(),
        )
    };
    let mut source = open(&topic, decoding(connector_api::Evolution::AddColumns), true).await;
    let batches = read_rows(&mut source, 2).await;
    assert_eq!(column::<Int64Type>(&batches, "id"), [Some(0), Some(2)]);
    let rejected = source.take_rejected();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    let reason = &rejected[0].reason;
    for expected in [
        format!("schema id {v2}"),
        format!("reader schema id {v1}"),
        "nested field `customer.email`".to_string(),
        "evolution = \"evolve\"".to_string(),
    ] {
        assert!(reason.contains(&expected), "{expected} in {reason}");
    }

    let mut source = open(&topic, decoding(connector_api::Evolution::Evolve), false).await;
    read_rows(&mut source, 1).await;
    let started = std::time::Instant::now();
    let widened = loop {
        assert!(started.elapsed() < WAIT, "no schema change");
        assert!(
            source
                .next_batch(Duration::from_millis(200))
                .await
                .unwrap()
                .is_none()
        );
        if let Some(schema) = source.schema_change() {
            break schema;
        }
    };
    let arrow_schema::DataType::Struct(fields) =
        widened.field_with_name("customer").unwrap().data_type()
    else {
        panic!("{widened:?}")
    };
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["name", "email"]);
    source.accept_schema_change();
    let after = read_rows(&mut source, 2).await;
    let emails: Vec<Option<String>> = after
        .iter()
        .flat_map(|b| {
            let customer = b.column_by_name("customer").unwrap().as_struct().clone();
            let email = customer
                .column_by_name("email")
                .unwrap()
                .as_string::<i32>()
                .clone();
            (0..email.len())
                .map(|i| email.is_valid(i).then(|| email.value(i).to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(emails, [Some("b@x".to_string()), None]);
}

/// A JSON Schema whose only non-structural keywords are bounds on top-level properties: the records are not run
/// through the validator, the bounds are checked on each decoded value, and a record out of bounds is refused
/// naming the schema id, the property and the bound, as the validator would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_bounds_are_checked_on_decoded_values() {
    let topic = topic("registry-bounds", 1).await;
    let schema =
        json!({"type": "object", "required": ["id", "code"], "additionalProperties": false,
        "properties": {"id": {"type": "integer", "minimum": 0},
                       "code": {"type": "string", "maxLength": 3},
                       "ratio": {"type": ["number", "null"], "exclusiveMaximum": 1}}})
        .to_string();
    let produce = |records: serde_json::Value, flags: &[&str]| {
        let records = records.to_string();
        let mut args = vec![
            bootstrap(),
            topic.as_str(),
            schema.as_str(),
            records.as_str(),
        ];
        args.extend(flags);
        let out = Services::get().produce("confluent_json.py", &args);
        u32::try_from(out["schema_id"].as_u64().unwrap()).unwrap()
    };
    let id = produce(
        json!([{"id": 0, "code": "abc", "ratio": 0.5}, {"id": 1, "code": "日本語", "ratio": null}]),
        &[],
    );
    produce(
        json!([{"id": -1, "code": "a"}, {"id": 2, "code": "abcd"}, {"id": 3, "code": "a", "ratio": 1},
               {"id": 4, "code": "ok"}]),
        &["--no-validate"],
    );
    let registry = registry();
    let latest = registry.latest(&format!("{topic}-value")).await.unwrap();
    let decoding = Decoding::JsonSchema(
        kafka_source::JsonSchemaDecoding::from_registry(
            registry,
            ReaderSchema::latest(&latest),
            kafka_source::UnknownFields::Fail,
            connector_api::Evolution::None,
        )
        .unwrap(),
    );
    let mut source = open(&topic, decoding, true).await;
    let batches = read_rows(&mut source, 3).await;
    assert_eq!(
        column::<Int64Type>(&batches, "id"),
        [Some(0), Some(1), Some(4)]
    );
    let mut rejected = source.take_rejected();
    rejected.sort_by_key(|r| r.offset);
    let reasons: Vec<&str> = rejected.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    for (reason, expected) in reasons.iter().zip([
        "at `/id`: -1 is less than the minimum of 0",
        "at `/code`: \"abcd\" is longer than 3 characters",
        "at `/ratio`: 1 is greater than or equal to the maximum of 1",
    ]) {
        assert!(
            reason.contains(&format!("violates JSON Schema id {id}")) && reason.contains(expected),
            "{expected} in {reason}"
        );
    }
}
