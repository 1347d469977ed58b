//! Debezium change events as the real connector writes them (PostgreSQL connector 3.6.1 on Kafka Connect, the
//! `connect` service), with the JSON converter without schemas and with the Avro converter through the schema
//! registry (the JSON converter with schemas is the worker test `cdc`'s): a snapshot of rows, then inserts, updates
//! and deletes; the source reads one row per change event (the tombstones after deletes left out), its change
//! columns say what happened, and applying the rows in order gives the source table as psql reads it.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use kafka_source::{
    AvroDecoding, DebeziumDecoding, Decoding, KafkaConnection, KafkaSource, KafkaSourceOptions,
    ReaderSchema,
};
use schema_registry::{RegistrySettings, SchemaRegistry};
use test_support::Services;
use test_support::cdc::{Converter, DebeziumConnector};

use crate::source::{bootstrap, read_rows};

fn columns() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("qty", DataType::Int64, true),
        Field::new("price", DataType::Float64, true),
        Field::new("active", DataType::Boolean, true),
    ]))
}

async fn decoding(converter: Converter, topic: &str) -> Decoding {
    match converter {
        Converter::Json { schemas } => {
            Decoding::Debezium(DebeziumDecoding::json(columns(), schemas))
        }
        Converter::Avro => {
            let endpoint = Services::get().registry();
            let registry = SchemaRegistry::new(&RegistrySettings {
                username: Some(endpoint.user),
                password: Some(endpoint.password.into()),
                ..RegistrySettings::new(&endpoint.url)
            })
            .unwrap();
            let latest = registry.latest(&format!("{topic}-value")).await.unwrap();
            let avro = AvroDecoding::for_change_events(
                registry,
                ReaderSchema::latest(&latest),
                connector_api::Evolution::None,
            )
            .unwrap();
            Decoding::Debezium(DebeziumDecoding::avro(avro).unwrap())
        }
    }
}

/// The change events (records with a value) in `topic`, as the read_committed verifier sees them.
fn events_in(topic: &str) -> usize {
    let seen = Services::get().verify("kafka_read_committed.py", &[bootstrap(), topic]);
    seen["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["value"].is_null())
        .count()
}

async fn changes_reach_the_source_as_rows(converter: Converter) {
    let services = Services::get();
    let name = test_support::unique_name("dbz").replace('-', "_");
    let table = format!("public.{name}");
    services.cdc(&[
        "workload", "--table", &table, "--ops", "20", "--seed", "7", "--create",
    ]);
    let connector = DebeziumConnector::register(&name, &table, converter);
    let done = services.cdc(&["workload", "--table", &table, "--ops", "60", "--seed", "8"]);
    assert!(done["delete"].as_u64().unwrap() > 0, "{done}");

    // Every change event of the workload is in the topic once the last one is: wait for the row count the
    // workload left to show up in the events, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let expected = services.psql(&format!("SELECT count(*) FROM {table}"));
    let mut source: Option<KafkaSource> = None;
    let mut batches: Vec<RecordBatch> = Vec::new();
    let mut state: BTreeMap<i32, (String, i64)> = BTreeMap::new();
    loop {
        let events = events_in(connector.topic());
        let read: usize = batches.iter().map(RecordBatch::num_rows).sum();
        if events > read {
            let source = match &mut source {
                Some(source) => source,
                None => source.insert(
                    KafkaSource::open_with(
                        &KafkaConnection::plaintext(bootstrap()),
                        connector.topic(),
                        &[],
                        KafkaSourceOptions {
                            decoding: decoding(converter, connector.topic()).await,
                            ..KafkaSourceOptions::default()
                        },
                    )
                    .await
                    .unwrap(),
                ),
            };
            batches.extend(read_rows(source, events - read).await);
        }
        state.clear();
        for batch in &batches {
            let ids = batch
                .column_by_name("id")
                .unwrap()
                .as_primitive::<Int32Type>();
            let names = batch.column_by_name("name").unwrap().as_string::<i32>();
            let qty = batch
                .column_by_name("qty")
                .unwrap()
                .as_primitive::<Int64Type>();
            let ops = batch.column_by_name("__op").unwrap().as_string::<i32>();
            for i in 0..batch.num_rows() {
                match ops.value(i) {
                    "d" => {
                        state.remove(&ids.value(i));
                    }
                    "c" | "u" | "r" => {
                        state.insert(ids.value(i), (names.value(i).to_string(), qty.value(i)));
                    }
                    other => panic!("{converter:?}: operation {other:?}"),
                }
            }
        }
        if state.len().to_string() == expected {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{converter:?}: {} rows applied, the table has {expected}",
            state.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let ops: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            let ops = b.column_by_name("__op").unwrap().as_string::<i32>().clone();
            (0..ops.len()).map(move |i| ops.value(i).to_string())
        })
        .collect();
    for op in ["r", "c", "u", "d"] {
        assert!(
            ops.iter().any(|o| o == op),
            "{converter:?}: no {op:?} in {ops:?}"
        );
    }
    let lsn = batches[0]
        .column_by_name("__source_lsn")
        .unwrap()
        .as_primitive::<Int64Type>();
    assert!(
        lsn.value(0) > 0,
        "{converter:?}: the source position is read"
    );
    let in_table = services.psql(&format!(
        "SELECT id || ',' || name || ',' || qty FROM {table} ORDER BY id"
    ));
    let applied: Vec<String> = state
        .iter()
        .map(|(id, (name, qty))| format!("{id},{name},{qty}"))
        .collect();
    assert_eq!(applied.join("\n"), in_table, "{converter:?}");
    drop(connector);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_json_without_schemas_reads_one_row_per_change() {
    changes_reach_the_source_as_rows(Converter::Json { schemas: false }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_avro_through_the_registry_reads_one_row_per_change() {
    changes_reach_the_source_as_rows(Converter::Avro).await;
}

/// A column the source dropped: the connector registers a new version without it, the job reads as that latest
/// version, and the backlog's older events (whose row images still carry the column) are read with it left out,
/// not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_avro_events_written_before_a_column_was_dropped_still_read() {
    let services = Services::get();
    let name = test_support::unique_name("dbzdrop").replace('-', "_");
    let table = format!("public.{name}");
    services.psql(&format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, name text, legacy text); \
         INSERT INTO {table} VALUES (1, 'a', 'old'), (2, 'b', 'old')"
    ));
    let connector = DebeziumConnector::register(&name, &table, Converter::Avro);
    services.psql(&format!(
        "UPDATE {table} SET name = 'b2' WHERE id = 2; ALTER TABLE {table} DROP COLUMN legacy; \
         INSERT INTO {table} VALUES (3, 'c')"
    ));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while events_in(connector.topic()) < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the connector did not write 4 events within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let mut source = KafkaSource::open_with(
        &KafkaConnection::plaintext(bootstrap()),
        connector.topic(),
        &[],
        KafkaSourceOptions {
            decoding: decoding(Converter::Avro, connector.topic()).await,
            ..KafkaSourceOptions::default()
        },
    )
    .await
    .unwrap();
    let batches = read_rows(&mut source, 4).await;
    let schema = batches[0].schema();
    assert!(
        schema.field_with_name("legacy").is_err(),
        "read as the latest version: {schema:?}"
    );
    let mut rows = Vec::new();
    for batch in &batches {
        let ids = batch
            .column_by_name("id")
            .unwrap()
            .as_primitive::<Int32Type>();
        let names = batch.column_by_name("name").unwrap().as_string::<i32>();
        let ops = batch.column_by_name("__op").unwrap().as_string::<i32>();
        for i in 0..batch.num_rows() {
            rows.push(format!(
                "{} {} {}",
                ops.value(i),
                ids.value(i),
                names.value(i)
            ));
        }
    }
    assert_eq!(rows, ["r 1 a", "r 2 b", "u 2 b2", "c 3 c"]);
    drop(connector);
}

/// A column the source added while the job runs: the connector registers a new version with it, and a source
/// that evolves (`add-columns`) widens its reader at that event, holding the first batch of the new schema until
/// the job takes it: the column is a nullable column of the rows after the table's own, before the change
/// columns; the events before it read as before. Without evolving, the event is refused naming the column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_avro_takes_a_column_added_while_running() {
    let services = Services::get();
    let name = test_support::unique_name("dbzadd").replace('-', "_");
    let table = format!("public.{name}");
    services.psql(&format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, name text); INSERT INTO {table} VALUES (1, 'a'), (2, 'b')"
    ));
    let connector = DebeziumConnector::register(&name, &table, Converter::Avro);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while events_in(connector.topic()) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let open = |evolution| {
        let topic = connector.topic().to_string();
        async move {
            let endpoint = Services::get().registry();
            let registry = SchemaRegistry::new(&RegistrySettings {
                username: Some(endpoint.user),
                password: Some(endpoint.password.into()),
                ..RegistrySettings::new(&endpoint.url)
            })
            .unwrap();
            let latest = registry.latest(&format!("{topic}-value")).await.unwrap();
            let avro =
                AvroDecoding::for_change_events(registry, ReaderSchema::latest(&latest), evolution)
                    .unwrap();
            KafkaSource::open_with(
                &KafkaConnection::plaintext(bootstrap()),
                &topic,
                &[],
                KafkaSourceOptions {
                    decoding: Decoding::Debezium(DebeziumDecoding::avro(avro).unwrap()),
                    divert_bad_records: true,
                    ..KafkaSourceOptions::default()
                },
            )
            .await
            .unwrap()
        }
    };
    // Both sources start on the version without `qty`.
    let mut evolving = open(connector_api::Evolution::AddColumns).await;
    let mut fixed = open(connector_api::Evolution::None).await;
    let before = read_rows(&mut evolving, 2).await;
    assert!(before[0].schema().field_with_name("qty").is_err());
    services.psql(&format!(
        "ALTER TABLE {table} ADD COLUMN qty bigint; INSERT INTO {table} VALUES (3, 'c', 30); \
         UPDATE {table} SET qty = 10 WHERE id = 1"
    ));
    while events_in(connector.topic()) < 4 {
        assert!(std::time::Instant::now() < deadline + std::time::Duration::from_secs(60));
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let started = std::time::Instant::now();
    let widened = loop {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no schema change"
        );
        let batch = evolving
            .next_batch(std::time::Duration::from_millis(200))
            .await
            .unwrap();
        // Nothing of the old schema is left but, perhaps, an empty batch moving the positions.
        assert!(
            batch.as_ref().is_none_or(|b| b.num_rows() == 0),
            "{batch:?}"
        );
        if let Some(schema) = evolving.schema_change() {
            break schema;
        }
    };
    let names: Vec<&str> = widened.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(&names[..4], ["id", "name", "qty", "__op"], "{names:?}");
    assert!(widened.field_with_name("qty").unwrap().is_nullable());
    evolving.accept_schema_change();
    let after = read_rows(&mut evolving, 2).await;
    let mut rows = Vec::new();
    for batch in &after {
        let ids = batch
            .column_by_name("id")
            .unwrap()
            .as_primitive::<Int32Type>();
        let qty = batch
            .column_by_name("qty")
            .unwrap()
            .as_primitive::<Int64Type>();
        let ops = batch.column_by_name("__op").unwrap().as_string::<i32>();
        for i in 0..batch.num_rows() {
            rows.push(format!(
                "{} {} {}",
                ops.value(i),
                ids.value(i),
                qty.value(i)
            ));
        }
    }
    assert_eq!(rows, ["c 3 30", "u 1 10"]);

    // A second column in the same run widens the reader again (it is newer than the widened reader, not an older
    // writer's leftover to leave out).
    services.psql(&format!(
        "ALTER TABLE {table} ADD COLUMN tag text; INSERT INTO {table} VALUES (4, 'd', 40, 't4')"
    ));
    let started = std::time::Instant::now();
    let grown = loop {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no second schema change"
        );
        let batch = evolving
            .next_batch(std::time::Duration::from_millis(200))
            .await
            .unwrap();
        assert!(
            batch.as_ref().is_none_or(|b| b.num_rows() == 0),
            "{batch:?}"
        );
        if let Some(schema) = evolving.schema_change() {
            break schema;
        }
    };
    assert!(grown.field_with_name("tag").is_ok(), "{grown:?}");
    evolving.accept_schema_change();
    let last = read_rows(&mut evolving, 1).await;
    let tag = last[0].column_by_name("tag").unwrap().as_string::<i32>();
    assert_eq!(tag.value(0), "t4");

    // Without evolving, the events with the column are refused, naming it.
    read_rows(&mut fixed, 2).await;
    let started = std::time::Instant::now();
    let rejected = loop {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "nothing refused"
        );
        let batch = fixed
            .next_batch(std::time::Duration::from_millis(200))
            .await
            .unwrap();
        assert!(
            batch.as_ref().is_none_or(|b| b.num_rows() == 0),
            "{batch:?}"
        );
        let rejected = fixed.take_rejected();
        if rejected.len() >= 2 {
            break rejected;
        }
    };
    assert!(
        rejected[0].reason.contains("`before.qty`") || rejected[0].reason.contains("qty"),
        "{rejected:?}"
    );
    drop(connector);
}
