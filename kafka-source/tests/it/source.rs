//! The Kafka source against the real broker: read_committed (an aborted transaction's records never appear),
//! positions that resume exactly where the handed-out batches end (every record once across a reopen), JSON values
//! decoded into a declared schema, and undecodable records refused by topic, partition and offset without moving
//! the positions past the batch that held them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use connector_api::{ErrorKind, SourceOffset};
use kafka_source::{
    Decoding, KafkaConnection, KafkaSource, KafkaSourceOptions, KeyDecoding, MetadataColumns,
};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use test_support::Services;

const WAIT: Duration = Duration::from_secs(20);

pub(crate) fn bootstrap() -> &'static str {
    Services::get().kafka_bootstrap()
}

pub(crate) async fn topic(prefix: &str, partitions: i32) -> String {
    let name = test_support::unique_name(prefix);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    for result in admin
        .create_topics(
            &[NewTopic::new(&name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        result.unwrap();
    }
    name
}

pub(crate) fn producer(transactional: Option<&str>) -> ThreadedProducer<DefaultProducerContext> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true");
    if let Some(id) = transactional {
        config.set("transactional.id", id);
    }
    config.create().unwrap()
}

pub(crate) fn send(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    partition: i32,
    value: &[u8],
) {
    producer
        .send(
            BaseRecord::<[u8], [u8]>::to(topic)
                .partition(partition)
                .payload(value),
        )
        .map_err(|(e, _)| e)
        .unwrap();
}

/// Reads batches until `rows` rows arrived (or fails after [`WAIT`]).
pub(crate) async fn read_rows(source: &mut KafkaSource, rows: usize) -> Vec<RecordBatch> {
    let started = Instant::now();
    let mut batches = Vec::new();
    while batches.iter().map(RecordBatch::num_rows).sum::<usize>() < rows {
        assert!(started.elapsed() < WAIT, "only {batches:?} arrived");
        if let Some(batch) = source.next_batch(Duration::from_millis(200)).await.unwrap() {
            batches.push(batch);
        }
    }
    batches
}

fn values(batches: &[RecordBatch]) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let values = b.column_by_name("value").unwrap().as_string::<i32>();
            (0..values.len())
                .map(|i| values.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_committed_records_once_across_a_reopen_from_positions() {
    let topic = topic("source-committed", 3).await;
    let transactional = producer(Some(&test_support::unique_name("source-txn")));
    transactional
        .init_transactions(Duration::from_secs(30))
        .unwrap();
    let mut expected = BTreeSet::new();
    for (round, commit) in [(0, true), (1, false), (2, true)] {
        transactional.begin_transaction().unwrap();
        for i in 0..300 {
            let value = format!("r{round}-{i}");
            send(&transactional, &topic, i % 3, value.as_bytes());
            if commit {
                expected.insert(value);
            }
        }
        transactional.flush(Duration::from_secs(30)).unwrap();
        if commit {
            transactional
                .commit_transaction(Duration::from_secs(30))
                .unwrap();
        } else {
            transactional
                .abort_transaction(Duration::from_secs(30))
                .unwrap();
        }
    }

    let kafka = KafkaConnection::plaintext(bootstrap());
    let options = KafkaSourceOptions {
        batch_rows: 100,
        ..KafkaSourceOptions::default()
    };
    let mut first = KafkaSource::open_with(&kafka, &topic, &[], options.clone())
        .await
        .unwrap();
    let head = read_rows(&mut first, 250).await;
    let positions: Vec<SourceOffset> = first.positions();
    drop(first);

    let mut second = KafkaSource::open_with(&kafka, &topic, &positions, options)
        .await
        .unwrap();
    let head_rows: usize = head.iter().map(RecordBatch::num_rows).sum();
    let tail = read_rows(&mut second, expected.len() - head_rows).await;
    // Nothing more: the aborted transaction's records never show (an empty batch may still come, moving the
    // positions past the commit markers and the aborted records).
    let mut more = 0;
    while let Some(batch) = second.next_batch(Duration::from_secs(2)).await.unwrap() {
        more += batch.num_rows();
    }
    assert_eq!(more, 0, "rows after every committed record");
    // The positions stand at each partition's end (past the last commit marker), so the lag is 0.
    let ends = second.watermarks().unwrap();
    assert!(
        second.reached(&ends),
        "positions {:?} short of the ends {ends:?}",
        second.positions()
    );
    let mut seen = values(&head);
    seen.extend(values(&tail));
    let distinct: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(seen.len(), distinct.len(), "a record was handed out twice");
    assert_eq!(distinct, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_values_fill_the_declared_schema_and_a_bad_value_is_named() {
    let topic = topic("source-json", 1).await;
    let plain = producer(None);
    for i in 0..5 {
        let value = format!(r#"{{"order":{i},"note":"n{i}","ignored":true}}"#);
        send(&plain, &topic, 0, value.as_bytes());
    }
    send(&plain, &topic, 0, b"{\"order\": 5, \"note\":");
    plain.flush(Duration::from_secs(30)).unwrap();

    let schema = Arc::new(Schema::new(vec![
        Field::new("order", DataType::Int64, false),
        Field::new("note", DataType::Utf8, true),
    ]));
    let options = KafkaSourceOptions {
        decoding: Decoding::Json(schema.clone().into()),
        batch_rows: 3,
        ..KafkaSourceOptions::default()
    };
    let kafka = KafkaConnection::plaintext(bootstrap());
    let mut source = KafkaSource::open_with(&kafka, &topic, &[], options)
        .await
        .unwrap();
    let batch = source
        .next_batch(WAIT)
        .await
        .unwrap()
        .expect("a first batch");
    assert_eq!(batch.schema(), schema);
    let orders: Vec<i64> = batch
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(orders, [0, 1, 2]);
    assert_eq!(source.positions()[0].next_offset, 3);

    let err = source.next_batch(WAIT).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
    assert!(err.to_string().contains(&format!("{topic}/0@5")), "{err}");
    // The batch holding the bad record was not handed out: a restart resumes at offset 3.
    assert_eq!(source.positions()[0].next_offset, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_utf8_are_refused_as_text_and_kept_as_binary() {
    let topic = topic("source-binary", 1).await;
    let plain = producer(None);
    send(&plain, &topic, 0, b"fine");
    send(&plain, &topic, 0, &[0xff, 0xfe, 0x00]);
    plain.flush(Duration::from_secs(30)).unwrap();
    let kafka = KafkaConnection::plaintext(bootstrap());

    let mut text = KafkaSource::open(&kafka, &topic, &[]).await.unwrap();
    let err = text.next_batch(WAIT).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
    assert!(
        err.to_string().contains(&format!("{topic}/0@1")) && err.to_string().contains("UTF-8"),
        "{err}"
    );
    // Nothing was handed out: no position, so a restart reads the partition from its log start.
    assert!(text.positions().is_empty(), "{:?}", text.positions());

    let options = KafkaSourceOptions {
        decoding: Decoding::Binary,
        ..KafkaSourceOptions::default()
    };
    let mut binary = KafkaSource::open_with(&kafka, &topic, &[], options)
        .await
        .unwrap();
    let batches = {
        let mut batches = Vec::new();
        while batches.iter().map(RecordBatch::num_rows).sum::<usize>() < 2 {
            batches.push(binary.next_batch(WAIT).await.unwrap().expect("records"));
        }
        batches
    };
    let values: Vec<Vec<u8>> = batches
        .iter()
        .flat_map(|b| {
            let values = b.column_by_name("value").unwrap().as_binary::<i32>();
            (0..values.len())
                .map(|i| values.value(i).to_vec())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(values, [b"fine".to_vec(), vec![0xff, 0xfe, 0x00]]);
    assert_eq!(binary.positions()[0].next_offset, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_come_as_a_map_column_when_asked_for() {
    use rdkafka::message::{Header, OwnedHeaders};

    let topic = topic("source-headers", 1).await;
    let plain = producer(None);
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "trace",
            value: Some(&b"abc"[..]),
        })
        .insert(Header::<&[u8]> {
            key: "empty",
            value: None,
        });
    plain
        .send(
            BaseRecord::<[u8], [u8]>::to(&topic)
                .payload(&b"with headers"[..])
                .headers(headers),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    send(&plain, &topic, 0, b"without");
    plain.flush(Duration::from_secs(30)).unwrap();

    let kafka = KafkaConnection::plaintext(bootstrap());
    let options = KafkaSourceOptions {
        metadata: MetadataColumns {
            headers: Some("headers".into()),
            ..MetadataColumns::none()
        },
        ..KafkaSourceOptions::default()
    };
    let mut source = KafkaSource::open_with(&kafka, &topic, &[], options)
        .await
        .unwrap();
    assert_eq!(
        source.schema().field_with_name("headers").unwrap(),
        &kafka_source::headers_field()
    );
    let batches = read_rows(&mut source, 2).await;
    let rows: Vec<Vec<(String, Option<Vec<u8>>)>> = batches
        .iter()
        .flat_map(|batch| {
            let map = batch.column_by_name("headers").unwrap().as_map().clone();
            (0..map.len())
                .map(|row| {
                    let entries = map.value(row);
                    let keys = entries.column(0).as_string::<i32>();
                    let values = entries.column(1).as_binary::<i32>();
                    (0..entries.len())
                        .map(|i| {
                            let value = (!values.is_null(i)).then(|| values.value(i).to_vec());
                            (keys.value(i).to_string(), value)
                        })
                        .collect()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        rows,
        [
            vec![
                ("trace".to_string(), Some(b"abc".to_vec())),
                ("empty".to_string(), None)
            ],
            vec![]
        ]
    );
}

/// JSON values with every metadata column: a JSON key into its field columns (null for a record without a key),
/// the record's own timestamp, topic, partition, offset and headers; a record whose key does not decode is set
/// aside, named, with its headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metadata_column_comes_after_the_json_fields() {
    use arrow_array::types::{Int32Type, TimestampMicrosecondType};
    use rdkafka::message::{Header, OwnedHeaders};

    let topic = topic("source-metadata", 1).await;
    let plain = producer(None);
    let headers = || {
        OwnedHeaders::new().insert(Header {
            key: "trace",
            value: Some(&b"abc"[..]),
        })
    };
    let records: [(Option<&[u8]>, &[u8]); 3] = [
        (Some(br#"{"customer": 7}"#), br#"{"amount": 10}"#),
        (None, br#"{"amount": 20}"#),
        (Some(b"not json"), br#"{"amount": 30}"#),
    ];
    for (i, (key, value)) in records.into_iter().enumerate() {
        let mut record = BaseRecord::<[u8], [u8]>::to(&topic)
            .payload(value)
            .timestamp(1_700_000_000_000 + i as i64)
            .headers(headers());
        if let Some(key) = key {
            record = record.key(key);
        }
        plain.send(record).map_err(|(e, _)| e).unwrap();
    }
    plain.flush(Duration::from_secs(30)).unwrap();

    let kafka = KafkaConnection::plaintext(bootstrap());
    let key_fields = Arc::new(Schema::new(vec![Field::new(
        "customer",
        DataType::Int64,
        false,
    )]));
    let options = KafkaSourceOptions {
        decoding: Decoding::Json(
            Arc::new(Schema::new(vec![Field::new(
                "amount",
                DataType::Int64,
                false,
            )]))
            .into(),
        ),
        metadata: MetadataColumns {
            topic: Some("kafka_topic".into()),
            partition: Some("kafka_partition".into()),
            offset: Some("kafka_offset".into()),
            timestamp: Some("kafka_timestamp".into()),
            key: Some((
                "key".into(),
                KeyDecoding::Declared(Decoding::Json(key_fields.into())),
            )),
            headers: Some("kafka_headers".into()),
        },
        divert_bad_records: true,
        ..KafkaSourceOptions::default()
    };
    let mut source = KafkaSource::open_with(&kafka, &topic, &[], options)
        .await
        .unwrap();
    let names: Vec<String> = source
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        [
            "amount",
            "kafka_topic",
            "kafka_partition",
            "kafka_offset",
            "kafka_timestamp",
            "key_customer",
            "kafka_headers"
        ]
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut batches = Vec::new();
    let mut rejected = Vec::new();
    while Instant::now() < deadline && source.positions().first().is_none_or(|p| p.next_offset < 3)
    {
        if let Some(batch) = source.next_batch(Duration::from_millis(200)).await.unwrap() {
            batches.push(batch);
        }
        rejected.extend(source.take_rejected());
    }
    let batch = arrow_select::concat::concat_batches(&source.schema(), &batches).unwrap();
    assert_eq!(batch.num_rows(), 2);
    let column = |name: &str| batch.column_by_name(name).unwrap().clone();
    assert_eq!(
        column("amount")
            .as_primitive::<Int64Type>()
            .values()
            .to_vec(),
        [10, 20]
    );
    assert_eq!(column("kafka_topic").as_string::<i32>().value(1), topic);
    assert_eq!(
        column("kafka_partition")
            .as_primitive::<Int32Type>()
            .values()
            .to_vec(),
        [0, 0]
    );
    assert_eq!(
        column("kafka_offset")
            .as_primitive::<Int64Type>()
            .values()
            .to_vec(),
        [0, 1]
    );
    assert_eq!(
        column("kafka_timestamp")
            .as_primitive::<TimestampMicrosecondType>()
            .values()
            .to_vec(),
        [1_700_000_000_000_000, 1_700_000_000_001_000]
    );
    let customers = column("key_customer");
    let customers = customers.as_primitive::<Int64Type>();
    assert_eq!(customers.iter().collect::<Vec<_>>(), [Some(7), None]);
    assert_eq!(column("kafka_headers").as_map().value(0).len(), 1);

    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].offset, 2);
    assert!(
        rejected[0].reason.contains("has a key"),
        "{}",
        rejected[0].reason
    );
    assert_eq!(
        rejected[0].headers,
        [("trace".to_string(), Some(b"abc".to_vec()))]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_tombstones_come_beside_the_batches_in_log_order() {
    let topic = topic("source-tombstones", 1).await;
    let plain = producer(None);
    // rows 0, 1; a tombstone of key k1; row 2; tombstones of k2 and k3; row 3.
    let log: [(Option<&str>, Option<&[u8]>); 7] = [
        (Some("k0"), Some(br#"{"order":0}"#)),
        (Some("k1"), Some(br#"{"order":1}"#)),
        (Some("k1"), None),
        (Some("k2"), Some(br#"{"order":2}"#)),
        (Some("k2"), None),
        (Some("k3"), None),
        (Some("k3"), Some(br#"{"order":3}"#)),
    ];
    for (key, value) in log {
        let mut record = BaseRecord::<str, [u8]>::to(&topic).partition(0);
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(value) = value {
            record = record.payload(value);
        }
        plain.send(record).map_err(|(e, _)| e).unwrap();
    }
    plain.flush(Duration::from_secs(30)).unwrap();
    let options = KafkaSourceOptions {
        decoding: Decoding::Json(
            Arc::new(Schema::new(vec![Field::new(
                "order",
                DataType::Int64,
                false,
            )]))
            .into(),
        ),
        ..KafkaSourceOptions::default()
    };
    let kafka = KafkaConnection::plaintext(bootstrap());
    let mut source = KafkaSource::open_with(&kafka, &topic, &[], options)
        .await
        .unwrap();
    // What a sink sees, in order: each batch's rows, then the tombstones taken after it.
    let mut seen = Vec::new();
    let started = Instant::now();
    while seen.len() < log.len() {
        assert!(started.elapsed() < WAIT, "only {seen:?}");
        let Some(batch) = source.next_batch(Duration::from_millis(200)).await.unwrap() else {
            continue;
        };
        let orders = batch.column(0).as_primitive::<Int64Type>();
        seen.extend((0..orders.len()).map(|i| format!("row {}", orders.value(i))));
        seen.extend(
            source
                .take_tombstones()
                .into_iter()
                .map(|t| format!("delete {}", String::from_utf8(t.key.unwrap()).unwrap())),
        );
    }
    assert_eq!(
        seen,
        [
            "row 0",
            "row 1",
            "delete k1",
            "row 2",
            "delete k2",
            "delete k3",
            "row 3"
        ]
    );
    assert_eq!(source.positions()[0].next_offset, 7);
}
