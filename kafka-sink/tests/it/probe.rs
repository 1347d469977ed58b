//! The log probe against the real broker when records of a checkpoint's transaction were removed from the log
//! (issue 20). Each test commits or aborts checkpoint 2 through one sink instance, lets a new instance re-initialise
//! the transactional ids (so the coordinator can no longer tell and recovery must ask the log), then removes records
//! with DeleteRecords (what retention does to old segments, and what compaction does to single records):
//!
//! - the whole committed range removed: the outcome is in doubt, reported as such (never LOST), naming what was
//!   removed and what to check;
//! - only the first record of a committed range removed: the last one still says committed;
//! - only the first record of an aborted range removed: the last one still says aborted (LOST), so the fallback
//!   never claims a commit it cannot see.
//!
//! Meanwhile another application's transactional producer commits a record to the same partition every 100 ms, as
//! on any busy topic: a probe that lost its place (an offset below the log start, reset elsewhere) would read one
//! of those at once and misjudge it, instead of waiting for its timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use connector_api::{CheckpointId, Committer, ErrorKind, Phase, SinkId, SubtaskId, TwoPhaseCommit};
use kafka_sink::{
    KafkaCommittable, KafkaConnection, KafkaSink, KafkaSinkConfig, TransactionState,
    find_transaction,
};
use ratchet_conformance::conformance_batch;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use test_support::Services;

/// The checkpoint each test decides.
const CHECKPOINT: CheckpointId = CheckpointId(2);

/// How long the test waits for anything it waits for.
const WAIT: Duration = Duration::from_secs(30);

fn bootstrap() -> &'static str {
    Services::get().kafka_bootstrap()
}

fn sink(topic: &str, prefix: &str) -> KafkaSink {
    let mut config = KafkaSinkConfig::new(bootstrap(), topic, prefix);
    config.transaction_timeout = Duration::from_secs(60);
    KafkaSink::new(config, SinkId::new("probe").unwrap(), SubtaskId(0)).unwrap()
}

/// A new topic with a single partition.
async fn topic(prefix: &str) -> String {
    let name = test_support::unique_name(prefix);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    for result in admin
        .create_topics(
            &[NewTopic::new(&name, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        result.unwrap();
    }
    name
}

/// Checkpoint 2 writes ids 0..10 and pre-commits, then commits (`commit`) or aborts; the instance goes away and a
/// new one re-initialises the ids. Returns the checkpoint's committable.
async fn decided_checkpoint(topic: &str, prefix: &str, commit: bool) -> KafkaCommittable {
    let mut first = sink(topic, prefix);
    first.recover(None).await.unwrap();
    first.begin(CHECKPOINT).await.unwrap();
    first.write(&conformance_batch(0..10)).await.unwrap();
    let c = first.pre_commit(CHECKPOINT).await.unwrap();
    assert_eq!(c.ranges.len(), 1, "{c:?}");
    let range = &c.ranges[0];
    assert!(
        range.partition == 0 && range.first_offset < range.last_offset,
        "{c:?}"
    );
    if commit {
        first.committer().commit(vec![c.clone()]).await.unwrap();
    } else {
        first.abort().await.unwrap();
    }
    drop(first);
    move_the_id_on(topic, prefix, &c).await;
    c
}

/// A new instance re-initialises the ids: the coordinator can no longer tell what became of `c`, only the log can.
async fn move_the_id_on(topic: &str, prefix: &str, c: &KafkaCommittable) {
    let mut restarted = sink(topic, prefix);
    restarted.recover(None).await.unwrap();
    let now = find_transaction(
        &KafkaConnection::plaintext(bootstrap()),
        &c.transactional_id,
    )
    .await
    .unwrap()
    .expect("the coordinator forgot the transactional id");
    // Not the same producer at the same epoch, and no CompleteCommit that could be ours (protocol v2 bumps the
    // epoch at the end of a transaction): the sink has to ask the log.
    assert!(
        now.producer_id != c.producer_id
            || (now.producer_epoch != c.producer_epoch
                && now.state != TransactionState::CompleteCommit),
        "the coordinator still tells what became of {c:?}: {now:?}"
    );
}

/// Deletes the records of partition 0 of `topic` below `offset` (DeleteRecords); the log then starts there.
async fn delete_records_before(topic: &str, offset: i64) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset(topic, 0, Offset::Offset(offset))
        .unwrap();
    let deleted = admin
        .delete_records(&offsets, &AdminOptions::new())
        .await
        .unwrap();
    let partition = deleted
        .find_partition(topic, 0)
        .expect("DeleteRecords did not answer for partition 0");
    partition.error().unwrap();
    assert_eq!(
        partition.offset(),
        Offset::Offset(offset),
        "the log start after DeleteRecords"
    );
}

/// Another application's transactional producer committing one record to partition 0 of a topic every 100 ms.
struct Background {
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl Background {
    /// Starts it and waits for its first commit.
    async fn start(topic: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicU64::new(0));
        let thread = std::thread::spawn({
            let (stop, committed) = (stop.clone(), committed.clone());
            let topic = topic.to_string();
            let tid = test_support::unique_name("probe-background");
            move || -> Result<(), String> {
                let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
                    .set("bootstrap.servers", bootstrap())
                    .set("transactional.id", &tid)
                    .create()
                    .map_err(|e| e.to_string())?;
                producer
                    .init_transactions(WAIT)
                    .map_err(|e| e.to_string())?;
                while !stop.load(Ordering::SeqCst) {
                    producer.begin_transaction().map_err(|e| e.to_string())?;
                    producer
                        .send(
                            BaseRecord::<(), str>::to(&topic)
                                .partition(0)
                                .payload("background"),
                        )
                        .map_err(|(e, _)| e.to_string())?;
                    producer
                        .commit_transaction(WAIT)
                        .map_err(|e| e.to_string())?;
                    committed.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ok(())
            }
        });
        let mut background = Self {
            stop,
            committed,
            thread: Some(thread),
        };
        background.wait_for_commits(1).await;
        background
    }

    /// Waits (at most [`WAIT`]) until it committed `more` records more than now; fails the test if it stopped.
    async fn wait_for_commits(&mut self, more: u64) {
        let target = self.committed.load(Ordering::SeqCst) + more;
        let deadline = Instant::now() + WAIT;
        while self.committed.load(Ordering::SeqCst) < target {
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                self.finish();
            }
            assert!(
                Instant::now() < deadline,
                "the background producer did not commit within {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops it; fails the test if it failed.
    fn finish(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("the background producer failed: {e}"),
                Err(_) => panic!("the background producer panicked"),
            }
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[tokio::test]
async fn a_committed_checkpoint_whose_records_were_all_deleted_is_in_doubt_not_lost() {
    let topic = topic("probe-all-deleted").await;
    let prefix = test_support::unique_name("probe-all-deleted");
    let c = decided_checkpoint(&topic, &prefix, true).await;
    let range = c.ranges[0].clone();
    let mut background = Background::start(&topic).await;
    delete_records_before(&topic, range.last_offset + 1).await;
    background.wait_for_commits(1).await;

    let mut restarted = sink(&topic, &prefix);
    let err = restarted
        .recover(Some((CHECKPOINT, vec![c.clone()])))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert_eq!(err.phase(), Phase::Recover, "{err}");
    assert_eq!(err.checkpoint(), Some(CHECKPOINT), "{err}");
    assert_eq!(err.txn(), Some(c.transactional_id.as_str()), "{err}");
    let message = err.to_string();
    assert!(!message.contains("LOST"), "{message}");
    let removed = format!(
        "{topic}/0 offsets {}..={} (log start now {})",
        range.first_offset,
        range.last_offset,
        range.last_offset + 1
    );
    for expected in [
        removed.as_str(),
        "DeleteRecords, retention or compaction",
        "Nothing was committed, aborted or reported lost",
        "kafka-dump-log.sh",
        "committed_through",
    ] {
        assert!(message.contains(expected), "{expected:?} not in: {message}");
    }

    // The committer says the same, and never guesses.
    let committer = restarted.committer();
    let err = committer.is_committed(&c).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert!(!err.to_string().contains("LOST"), "{err}");
    let err = committer.commit(vec![c.clone()]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert_eq!(err.phase(), Phase::Commit, "{err}");
    assert!(err.to_string().contains(&removed), "{err}");
    background.finish();
}

#[tokio::test]
async fn a_committed_checkpoint_whose_first_record_was_deleted_is_recognised_by_its_last() {
    let topic = topic("probe-first-deleted").await;
    let prefix = test_support::unique_name("probe-first-deleted");
    let c = decided_checkpoint(&topic, &prefix, true).await;
    let range = c.ranges[0].clone();
    let mut background = Background::start(&topic).await;
    delete_records_before(&topic, range.first_offset + 1).await;
    background.wait_for_commits(1).await;

    let mut restarted = sink(&topic, &prefix);
    restarted
        .recover(Some((CHECKPOINT, vec![c.clone()])))
        .await
        .unwrap();
    let committer = restarted.committer();
    assert!(committer.is_committed(&c).await.unwrap());
    committer.commit(vec![c]).await.unwrap();
    background.finish();
}

#[tokio::test]
async fn an_aborted_checkpoint_whose_first_record_was_deleted_is_still_lost() {
    let topic = topic("probe-aborted-deleted").await;
    let prefix = test_support::unique_name("probe-aborted-deleted");
    let c = decided_checkpoint(&topic, &prefix, false).await;
    let range = c.ranges[0].clone();
    let mut background = Background::start(&topic).await;
    delete_records_before(&topic, range.first_offset + 1).await;
    background.wait_for_commits(1).await;

    let mut restarted = sink(&topic, &prefix);
    let err = restarted
        .recover(Some((CHECKPOINT, vec![c.clone()])))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fatal, "{err}");
    assert!(err.to_string().contains("LOST"), "{err}");
    assert!(!restarted.committer().is_committed(&c).await.unwrap());
    background.finish();
}
