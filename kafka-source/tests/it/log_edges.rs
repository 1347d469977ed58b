//! The source at the edges of a real log, against the real broker: positions that fell below the log start
//! (records removed by DeleteRecords before they were read) stop the source naming topic, partition, offset and log
//! start, or are skipped and reported with `GapPolicy::Earliest`, at open and while running; a partition with no
//! position starts at its log start, never at offset 0; partitions added while the source runs are read from their
//! beginning; a topic deleted and created again under the same name is refused, naming it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use connector_api::{ErrorKind, SourceOffset};
use kafka_source::{
    Gap, GapPolicy, KafkaConnection, KafkaSource, KafkaSourceOptions, TopicPartition,
    TopicSelection,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use test_support::Services;

const WAIT: Duration = Duration::from_secs(30);

fn bootstrap() -> &'static str {
    Services::get().kafka_bootstrap()
}

fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap()
}

async fn create_topic(name: &str, partitions: i32) {
    for result in admin()
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap()
    {
        result.unwrap();
    }
}

/// Produces `values` (as text) to `partition`, acknowledged.
fn produce(topic: &str, partition: i32, values: std::ops::Range<u32>) {
    produce_batched(topic, partition, values, 10_000);
}

/// [`produce`] with at most `per_batch` records per record batch in the log.
fn produce_batched(topic: &str, partition: i32, values: std::ops::Range<u32>, per_batch: u32) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("batch.num.messages", per_batch.to_string())
        .create()
        .unwrap();
    for value in values {
        producer
            .send(
                BaseRecord::<[u8], str>::to(topic)
                    .partition(partition)
                    .payload(&value.to_string()),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// DeleteRecords: removes `partition`'s records below `before`.
async fn delete_before(topic: &str, partition: i32, before: i64) {
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, partition, Offset::Offset(before))
        .unwrap();
    let deleted = admin()
        .delete_records(
            &list,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    for element in deleted.elements() {
        element.error().unwrap();
    }
}

fn values(batches: &[RecordBatch]) -> BTreeSet<u32> {
    batches
        .iter()
        .flat_map(|b| {
            let values = b.column_by_name("value").unwrap().as_string::<i32>();
            (0..values.len())
                .map(|i| values.value(i).parse::<u32>().unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Reads until `wanted` values arrived (or fails after [`WAIT`]), returning every batch.
async fn read_values(source: &mut KafkaSource, wanted: usize) -> Vec<RecordBatch> {
    let started = Instant::now();
    let mut batches = Vec::new();
    while values(&batches).len() < wanted {
        assert!(
            started.elapsed() < WAIT,
            "only {:?} of {wanted} values arrived",
            values(&batches)
        );
        if let Some(batch) = source.next_batch(Duration::from_millis(200)).await.unwrap() {
            batches.push(batch);
        }
    }
    batches
}

/// Waits for the next error of the source (or fails after [`WAIT`]).
async fn next_error(source: &mut KafkaSource) -> connector_api::Error {
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < WAIT, "the source never failed");
        if let Err(e) = source.next_batch(Duration::from_millis(200)).await {
            return e;
        }
    }
}

fn position(source: &KafkaSource, partition: i32) -> Option<i64> {
    source
        .positions()
        .iter()
        .find(|p| p.partition == partition)
        .map(|p| p.next_offset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_without_a_position_starts_at_its_log_start_not_at_offset_0() {
    let topic = test_support::unique_name("edge-unread");
    create_topic(&topic, 2).await;
    produce(&topic, 0, 0..5);
    let kafka = KafkaConnection::plaintext(bootstrap());
    let mut first = KafkaSource::open(&kafka, &topic, &[]).await.unwrap();
    read_values(&mut first, 5).await;
    let saved = first.positions();
    drop(first);
    // Partition 1 was empty and nothing of it was read: no position is saved for it.
    assert_eq!(
        saved.iter().map(|p| p.partition).collect::<Vec<_>>(),
        [0],
        "{saved:?}"
    );
    assert!(saved.iter().all(|p| p.topic_id.is_some()), "{saved:?}");

    // While the job is down, 50 records arrive on partition 1 and retention removes the oldest 10.
    produce(&topic, 1, 100..150);
    delete_before(&topic, 1, 10).await;
    let mut second = KafkaSource::open(&kafka, &topic, &saved).await.unwrap();
    let batches = read_values(&mut second, 40).await;
    assert_eq!(values(&batches), (110..150).collect());
    assert_eq!(position(&second, 1), Some(50));
    assert!(second.take_gaps().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_position_below_the_log_start_stops_the_source_or_skips_with_earliest() {
    let topic = test_support::unique_name("edge-gap");
    create_topic(&topic, 1).await;
    produce(&topic, 0, 0..5);
    let kafka = KafkaConnection::plaintext(bootstrap());
    let mut first = KafkaSource::open(&kafka, &topic, &[]).await.unwrap();
    read_values(&mut first, 5).await;
    let saved = first.positions();
    drop(first);
    produce(&topic, 0, 5..20);
    delete_before(&topic, 0, 12).await;

    let mut failing = KafkaSource::open(&kafka, &topic, &saved).await.unwrap();
    let err = next_error(&mut failing).await;
    let said = err.to_string();
    assert_eq!(err.kind(), ErrorKind::Config, "{said}");
    assert!(
        said.contains(&topic)
            && said.contains("partition 0")
            && said.contains("5")
            && said.contains("log start offset 12")
            && said.contains("on_gap"),
        "{said}"
    );
    drop(failing);

    let options = KafkaSourceOptions {
        on_gap: GapPolicy::Earliest,
        ..KafkaSourceOptions::default()
    };
    let mut earliest = KafkaSource::open_with(&kafka, &topic, &saved, options)
        .await
        .unwrap();
    let batches = read_values(&mut earliest, 8).await;
    assert_eq!(values(&batches), (12..20).collect());
    assert_eq!(
        earliest.take_gaps(),
        [Gap {
            topic: topic.clone(),
            partition: 0,
            next_offset: 5,
            log_start: 12
        }]
    );
    assert_eq!(position(&earliest, 0), Some(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_falls_behind_the_log_start_while_running_is_stopped() {
    let topic = test_support::unique_name("edge-lagging");
    create_topic(&topic, 1).await;
    // One record per record batch, so that a small fetch takes a few records, not the whole log.
    produce_batched(&topic, 0, 0..2000, 1);
    let kafka = KafkaConnection::plaintext(bootstrap());
    // Small fetches and one buffered batch: the consumer thread stays just ahead of what it hands out.
    let options = KafkaSourceOptions {
        batch_rows: 10,
        buffered_batches: 1,
        client: [
            ("message.max.bytes", "1000"),
            ("fetch.max.bytes", "1024"),
            ("max.partition.fetch.bytes", "1024"),
            ("queued.max.messages.kbytes", "1"),
            ("queued.min.messages", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..KafkaSourceOptions::default()
    };
    let mut source = KafkaSource::open_with(&kafka, &topic, &[], options)
        .await
        .unwrap();
    read_values(&mut source, 10).await;
    // Retention overtakes the reader.
    delete_before(&topic, 0, 1900).await;
    let err = next_error(&mut source).await;
    let said = err.to_string();
    assert_eq!(err.kind(), ErrorKind::Config, "{said}");
    assert!(said.contains("log start offset 1900"), "{said}");
    // Nothing past the gap was handed out.
    assert!(position(&source, 0).unwrap() < 1900);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_added_while_running_are_read_from_their_beginning() {
    let topic = test_support::unique_name("edge-grow");
    create_topic(&topic, 1).await;
    produce(&topic, 0, 0..3);
    let kafka = KafkaConnection::plaintext(bootstrap());
    let options = KafkaSourceOptions {
        metadata_refresh: Duration::from_secs(1),
        ..KafkaSourceOptions::default()
    };
    let mut source = KafkaSource::open_with(&kafka, &topic, &[], options)
        .await
        .unwrap();
    let mut batches = read_values(&mut source, 3).await;
    let grown = admin()
        .create_partitions(
            &[NewPartitions::new(&topic, 3)],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    for result in grown {
        result.unwrap();
    }
    produce(&topic, 1, 100..110);
    produce(&topic, 2, 200..205);
    batches.extend(read_values(&mut source, 15).await);
    let expected: BTreeSet<u32> = (0..3).chain(100..110).chain(200..205).collect();
    assert_eq!(values(&batches), expected);
    assert_eq!(
        source.partitions(),
        (0..3)
            .map(|p| TopicPartition::new(topic.clone(), p))
            .collect()
    );
    assert_eq!(
        (position(&source, 1), position(&source, 2)),
        (Some(10), Some(5))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_and_created_again_is_refused_naming_it() {
    let topic = test_support::unique_name("edge-recreated");
    create_topic(&topic, 1).await;
    produce(&topic, 0, 0..5);
    let kafka = KafkaConnection::plaintext(bootstrap());
    let mut first = KafkaSource::open(&kafka, &topic, &[]).await.unwrap();
    read_values(&mut first, 5).await;
    let saved: Vec<SourceOffset> = first.positions();
    drop(first);

    for result in admin()
        .delete_topics(
            &[&topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap()
    {
        result.unwrap();
    }
    // The broker may still be deleting it for a moment.
    let started = Instant::now();
    loop {
        let created = admin()
            .create_topics(
                &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .unwrap();
        if created.iter().all(Result::is_ok) {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "cannot create {topic} again: {created:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    produce(&topic, 0, 0..20);

    let err = match KafkaSource::open(&kafka, &topic, &saved).await {
        Ok(_) => panic!("the recreated topic was opened from the old positions"),
        Err(e) => e,
    };
    let said = err.to_string();
    assert_eq!(err.kind(), ErrorKind::Config, "{said}");
    let old_id = saved[0].topic_id.clone().unwrap();
    assert!(
        said.contains(&topic) && said.contains(&old_id) && said.contains("created again"),
        "{said}"
    );
}

/// The topic of every row of `batches`, per batch (the text decoding's `topic` column).
fn batch_topics(batches: &[RecordBatch]) -> Vec<BTreeSet<String>> {
    batches
        .iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| {
            let topics = b.column_by_name("topic").unwrap().as_string::<i32>();
            (0..topics.len())
                .map(|i| topics.value(i).to_string())
                .collect()
        })
        .collect()
}

/// A pattern selects whole topic names: the topics there at open and one created while reading (found by the
/// metadata refresh); no batch mixes topics; positions are per topic and partition, with each topic's id, and a
/// source reopened from them reads on without repeating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_reads_its_topics_and_one_created_later_in_batches_of_one_topic() {
    let prefix = test_support::unique_name("edge-pattern");
    let (a, b, late, other) = (
        format!("{prefix}-a"),
        format!("{prefix}-b"),
        format!("{prefix}-late"),
        format!("{prefix}x-c"),
    );
    create_topic(&a, 2).await;
    create_topic(&b, 1).await;
    create_topic(&other, 1).await;
    produce(&a, 0, 0..10);
    produce(&a, 1, 10..20);
    produce(&b, 0, 100..110);
    produce(&other, 0, 900..905);
    let kafka = KafkaConnection::plaintext(bootstrap());
    let selection = TopicSelection::pattern(&format!("{prefix}-.*")).unwrap();
    let options = KafkaSourceOptions {
        metadata_refresh: Duration::from_secs(1),
        ..KafkaSourceOptions::default()
    };
    let mut source = KafkaSource::open_topics(&kafka, selection.clone(), &[], options.clone())
        .await
        .unwrap();
    let mut batches = read_values(&mut source, 30).await;
    create_topic(&late, 1).await;
    produce(&late, 0, 200..205);
    batches.extend(read_values(&mut source, 5).await);
    let expected: BTreeSet<u32> = (0..20).chain(100..110).chain(200..205).collect();
    assert_eq!(values(&batches), expected, "{other} must not be read");
    for topics in batch_topics(&batches) {
        assert_eq!(topics.len(), 1, "a batch mixed topics: {topics:?}");
    }
    let positions = source.positions();
    let at = |topic: &str, partition| {
        positions
            .iter()
            .find(|p| p.topic == topic && p.partition == partition)
            .map(|p| (p.next_offset, p.topic_id.is_some()))
    };
    assert_eq!(
        (at(&a, 0), at(&a, 1), at(&b, 0), at(&late, 0)),
        (
            Some((10, true)),
            Some((10, true)),
            Some((10, true)),
            Some((5, true))
        ),
        "{positions:?}"
    );
    drop(source);

    produce(&b, 0, 110..112);
    let mut reopened = KafkaSource::open_topics(&kafka, selection, &positions, options)
        .await
        .unwrap();
    let more = read_values(&mut reopened, 2).await;
    assert_eq!(values(&more), (110..112).collect());
}
