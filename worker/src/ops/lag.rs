//! Consumer lag where operators look: once a checkpoint is decided (its record durable), its source positions are
//! also committed to a Kafka consumer group named after the job (`[source] lag_group`, default `ratchet.<job>`),
//! so `kafka-consumer-groups --describe`, Burrow and Kafka UIs show the job's lag per partition.
//!
//! Informational only: nothing ever reads these offsets back (positions live in the checkpoint record), the group
//! never has members (the offsets are committed by a consumer that joins nothing), and a commit that fails is
//! logged and superseded by the next checkpoint's. It runs on a thread of its own, so a slow or unreachable
//! coordinator never holds a checkpoint up: positions reported while a commit is under way are merged, the newest
//! offset of each partition kept. A graceful stop waits (a few seconds at most) for the last positions.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result};
use connector_api::SourceOffset;
use kafka_source::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

/// The process's committer of informational group offsets; cheap to clone.
#[derive(Clone)]
pub struct LagReporter {
    shared: Arc<Shared>,
    group: String,
}

impl std::fmt::Debug for LagReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagReporter")
            .field("group", &self.group)
            .finish()
    }
}

/// What the committing thread has to do, and whether it is at it.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// The newest position of each partition not committed yet.
    pending: BTreeMap<(String, i32), i64>,
    /// A commit is under way.
    committing: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LagReporter {
    /// Starts the committing thread for `group` on the source's cluster.
    ///
    /// # Errors
    /// The consumer cannot be created (a client setting librdkafka refuses).
    pub fn start(kafka: &KafkaConnection, group: &str) -> Result<Self> {
        let consumer: BaseConsumer = kafka
            .consumer_config()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .create()
            .with_context(|| {
                format!("cannot create the consumer that commits lag to group {group}")
            })?;
        let shared = Arc::new(Shared::default());
        let (thread, name) = (shared.clone(), group.to_string());
        std::thread::Builder::new()
            .name("ratchet-lag".into())
            .spawn(move || commit_loop(&consumer, &name, &thread))
            .context("cannot start the lag thread")?;
        Ok(Self {
            shared,
            group: group.to_string(),
        })
    }

    /// Commits `positions` (a decided checkpoint's) to the group, soon; never waits.
    pub fn report(&self, positions: Vec<SourceOffset>) {
        let mut state = self.shared.lock();
        for p in positions {
            let offset = state
                .pending
                .entry((p.topic, p.partition))
                .or_insert(p.next_offset);
            *offset = (*offset).max(p.next_offset);
        }
        self.shared.changed.notify_all();
    }

    /// Waits until every position reported so far is committed (or failed to be), at most `within`: a process
    /// stopping gracefully shows its final lag.
    pub fn flush(&self, within: Duration) {
        let state = self.shared.lock();
        let (_state, waited) = self
            .shared
            .changed
            .wait_timeout_while(state, within, |s| !s.pending.is_empty() || s.committing)
            .unwrap_or_else(|p| p.into_inner());
        if waited.timed_out() {
            tracing::warn!(group = %self.group, ?within, "the last positions were not committed to the lag group in time");
        }
    }
}

/// Commits what is reported, merged, for the life of the process.
fn commit_loop(consumer: &BaseConsumer, group: &str, shared: &Shared) {
    loop {
        let pending = {
            let mut state = shared
                .changed
                .wait_while(shared.lock(), |s| s.pending.is_empty())
                .unwrap_or_else(|p| p.into_inner());
            state.committing = true;
            std::mem::take(&mut state.pending)
        };
        let mut list = TopicPartitionList::new();
        for ((topic, partition), offset) in &pending {
            if let Err(e) = list.add_partition_offset(topic, *partition, Offset::Offset(*offset)) {
                tracing::warn!(group, error = %e, "cannot list a position for the lag commit");
            }
        }
        // Keeps the client's callbacks (errors, logs) moving; nothing else is polled.
        let _ = consumer.poll(Duration::ZERO);
        if let Err(e) = consumer.commit(&list, CommitMode::Sync) {
            tracing::warn!(group, error = %e,
                "cannot commit the job's positions to its lag group (informational; the next checkpoint tries again)");
        }
        shared.lock().committing = false;
        shared.changed.notify_all();
    }
}
