//! Membership by Kafka's group protocol (`[job] membership = "kafka-group"`): which process runs which subtask is
//! decided by the Kafka group coordinator, on a coordination topic with one partition per subtask
//! (`ratchet.<job>.subtasks`, created by the first process). A process that holds partition `s` runs subtask `s`.
//! The group (`ratchet.<job>.members`) shows in `kafka-consumer-groups --describe` and Kafka UIs: each member and
//! the subtasks (partitions) it runs. Nothing is ever produced to or committed on the topic.
//!
//! The classic protocol with static membership and the `range` assignor. With `--member <name>` the process is a
//! static member (`group.instance.id`): a restart within the session timeout rejoins with the same subscription
//! and gets its partitions back without a rebalance, so a rolling restart moves nothing; and when a rebalance does
//! happen (a member gone past the session timeout, a new one), `range` deals the partitions by the members'
//! instance ids, so each member gets the same subtasks back whenever the same members are there. Why not
//! `cooperative-sticky`: its subscription carries the partitions a member owns, so a restarted member (owning
//! none yet) rejoins with changed metadata, which triggers a rebalance that moved subtasks in our tests; the
//! eager protocol's price is that a rebalance stops every member's subtasks (each with a final checkpoint) and
//! starts them again. KIP-848's `group.protocol = consumer` would give incremental rebalances and sticky static
//! assignments together, but its session timeout is the broker's `group.consumer.session.timeout.ms` (at least
//! 45 s by default): planned, as an option, once that can be set per job.
//!
//! A partition revoked from a live process is released only after its subtask stopped with a final checkpoint:
//! the revocation waits (in the consumer's rebalance callback) up to the rebalance timeout for it. A partition lost
//! (this process missed the session timeout: a pause, a partition) is not waited for; the process stops the
//! subtask, and the new owner's claim fences anything it still tries to save. Safety is the checkpoint store's
//! claims, as in every mode.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use kafka_source::KafkaConnection;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::types::RDKafkaErrorCode;

use super::{Assignment, Membership};
use crate::config::JobConfig;

/// The broker's default `group.min.session.timeout.ms`: a shorter session is refused by the coordinator.
const MIN_SESSION: Duration = Duration::from_secs(6);

/// How often the group's size is read for the logs.
const DESCRIBE_EVERY: Duration = Duration::from_secs(5);

/// How long leaving waits for the membership consumer to close. A close takes well under a second, also with a
/// JoinGroup held by the coordinator (librdkafka 2.12 abandons it; `tests/it/group.rs`), but a stop in CI once did
/// not end within 60 s right after a rebalance assigned this process subtasks, and the wait that held it was not
/// identified: past this bound the process ends without the close. Its subtasks are already stopped, and the
/// coordinator drops the member after its session timeout (a static member's partitions wait for it that long
/// anyway); the warning says it happened.
const CLOSE_BOUND: Duration = Duration::from_secs(10);

/// A process's membership in the job's Kafka group.
pub struct KafkaGroup {
    shared: Arc<Shared>,
    /// Answered by the membership thread once it closed its consumer (dropped unanswered if the thread panicked).
    closed_consumer: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

struct Shared {
    state: Mutex<State>,
    released: Condvar,
    closed: AtomicBool,
    members: AtomicUsize,
    /// How long a revocation waits for its subtasks' final checkpoints.
    rebalance_timeout: Duration,
    subtasks: u32,
}

#[derive(Debug, Default)]
struct State {
    /// Subtasks whose partitions this process holds.
    assigned: BTreeSet<u32>,
    /// Of those, the ones being revoked: stop them, then release.
    revoking: BTreeSet<u32>,
    /// Revoked subtasks the process has stopped.
    released: BTreeSet<u32>,
}

/// The names a job's group uses in layout `generation`: its coordination topic (`ratchet.<job>.subtasks` for
/// the first layout, `ratchet.<job>.subtasks-<g>` after the `g`-th change of the subtask count, so each layout's
/// topic has exactly one partition per subtask: Kafka cannot take partitions away) and its group id (the same in
/// every layout).
pub fn names(job: &str, generation: u64) -> (String, String) {
    let topic = match generation {
        0 => format!("ratchet.{job}.subtasks"),
        g => format!("ratchet.{job}.subtasks-{g}"),
    };
    (topic, format!("ratchet.{job}.members"))
}

impl KafkaGroup {
    /// Joins the job's group as `instance` (a static member; `None`: a dynamic one) on the coordination topic of
    /// layout `generation`, creating it (one partition per subtask, the broker's default replication) or adding
    /// partitions up to the subtask count; the topics of earlier layouts are deleted (a rescale stopped every
    /// process first; a failure to delete is logged, nothing more). The session timeout is `[job] lease` (at least 6 s, the broker's minimum); the rebalance timeout
    /// covers a checkpoint and the calls around it.
    ///
    /// # Errors
    /// The cluster does not answer, refuses the topic, or the consumer cannot be created (named).
    pub async fn join(
        kafka: &KafkaConnection,
        job: &JobConfig,
        instance: Option<&str>,
        generation: u64,
    ) -> Result<Self> {
        let (topic, group) = names(&job.job.name, generation);
        let subtasks = job.job.subtasks;
        ensure_topic(kafka, &topic, subtasks).await?;
        retire_old_topics(kafka, &job.job.name, generation).await;
        let session = job.job.lease.max(MIN_SESSION);
        let rebalance_timeout =
            (job.job.checkpoint_interval + job.job.max_call_time * 3 + Duration::from_secs(10))
                .max(Duration::from_secs(30));
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            released: Condvar::new(),
            closed: AtomicBool::new(false),
            members: AtomicUsize::new(0),
            rebalance_timeout,
            subtasks,
        });
        let mut config = kafka.consumer_config();
        config
            .set("group.id", &group)
            .set("partition.assignment.strategy", "range")
            .set("session.timeout.ms", session.as_millis().to_string())
            .set(
                "heartbeat.interval.ms",
                (session / 5).as_millis().to_string(),
            )
            // The rebalance timeout of the classic protocol: a revocation may wait this long for final checkpoints.
            .set(
                "max.poll.interval.ms",
                (rebalance_timeout + Duration::from_secs(10))
                    .as_millis()
                    .to_string(),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "latest");
        if let Some(instance) = instance {
            config.set("group.instance.id", instance);
        }
        let consumer: BaseConsumer<GroupContext> = config
            .create_with_context(GroupContext {
                shared: shared.clone(),
            })
            .context("cannot create the group membership consumer")?;
        consumer
            .subscribe(&[&topic])
            .with_context(|| format!("cannot subscribe to {topic}"))?;
        tracing::info!(%group, %topic, instance = instance.unwrap_or("(dynamic)"), session = ?session,
            rebalance_timeout = ?rebalance_timeout, "joining the job's Kafka group");
        let poller_shared = shared.clone();
        let coordination = Coordination {
            kafka: kafka.clone(),
            topic,
            group,
        };
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("ratchet-group".into())
            .spawn(move || {
                poll(consumer, &poller_shared, &coordination);
                // Nobody waits any more if leaving gave up on the close: nothing to report then.
                let _ = closed_tx.send(());
            })
            .context("cannot start the group membership thread")?;
        Ok(Self {
            shared,
            closed_consumer: Mutex::new(Some(closed_rx)),
        })
    }
}

/// The job's coordination topic and group, watched by the membership thread.
struct Coordination {
    kafka: KafkaConnection,
    topic: String,
    group: String,
}

/// Polls the membership consumer (which runs the rebalance callbacks) until the process leaves; now and then reads
/// the group's size and checks the coordination topic: one deleted (or left with fewer partitions than subtasks) is
/// created again, so the members are assigned subtasks again instead of stalling with none. Dropping the consumer
/// closes it: a dynamic member leaves the group, a static one does not (its partitions wait for it until the
/// session timeout).
fn poll(consumer: BaseConsumer<GroupContext>, shared: &Shared, coordination: &Coordination) {
    let mut described: Option<Instant> = None;
    let mut runtime: Option<tokio::runtime::Runtime> = None;
    while !shared.closed.load(Ordering::Relaxed) {
        if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
            tracing::warn!(error = %e, "the job's Kafka group reported an error");
        }
        if described.is_none_or(|at| at.elapsed() >= DESCRIBE_EVERY) {
            described = Some(Instant::now());
            if let Ok(list) =
                consumer.fetch_group_list(Some(&coordination.group), Duration::from_secs(2))
                && let Some(found) = list.groups().first()
            {
                shared
                    .members
                    .store(found.members().len(), Ordering::Relaxed);
            }
            check_topic(&consumer, shared, coordination, &mut runtime);
        }
    }
}

/// Deletes the coordination topics of the layouts before `generation` that are still there. Best effort: one left
/// behind only costs its (empty) partitions.
async fn retire_old_topics(kafka: &KafkaConnection, job: &str, generation: u64) {
    if generation == 0 {
        return;
    }
    const WITHIN: Duration = Duration::from_secs(30);
    let old: Vec<String> = (0..generation).map(|g| names(job, g).0).collect();
    let existing = match kafka.topics_metadata(Some(&old), WITHIN).await {
        Ok(metadata) => old
            .into_iter()
            .filter(|t| metadata.get(t).is_some_and(|m| !m.partitions.is_empty()))
            .collect::<Vec<_>>(),
        Err(e) => {
            tracing::warn!(error = %connector_api::Report(&e), "cannot look for earlier layouts' coordination topics");
            return;
        }
    };
    if existing.is_empty() {
        return;
    }
    let deleted = async {
        let admin: AdminClient<DefaultClientContext> = kafka.client_config().create()?;
        let names: Vec<&str> = existing.iter().map(String::as_str).collect();
        let options = AdminOptions::new()
            .operation_timeout(Some(WITHIN))
            .request_timeout(Some(WITHIN));
        admin.delete_topics(&names, &options).await
    };
    match deleted.await {
        Ok(results) => {
            for result in results {
                match result {
                    Ok(topic) => {
                        tracing::info!(%topic, "deleted an earlier layout's coordination topic")
                    }
                    Err((topic, code)) => tracing::warn!(%topic, %code,
                        "cannot delete an earlier layout's coordination topic; it only costs its empty partitions"),
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, topics = ?existing,
            "cannot delete earlier layouts' coordination topics; they only cost their empty partitions"),
    }
}

/// Creates the coordination topic again when it is gone or short of partitions (a consumer's metadata request
/// never creates a topic).
fn check_topic(
    consumer: &BaseConsumer<GroupContext>,
    shared: &Shared,
    coordination: &Coordination,
    runtime: &mut Option<tokio::runtime::Runtime>,
) {
    let Ok(metadata) = consumer.fetch_metadata(Some(&coordination.topic), Duration::from_secs(2))
    else {
        return;
    };
    let partitions = metadata
        .topics()
        .iter()
        .find(|t| t.name() == coordination.topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len());
    if partitions >= shared.subtasks as usize {
        return;
    }
    tracing::warn!(topic = %coordination.topic, partitions, subtasks = shared.subtasks,
        "the job's coordination topic is gone or short of partitions (deleted?): creating it again, so the \
         group assigns every subtask");
    let runtime = match runtime {
        Some(runtime) => runtime,
        None => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(built) => runtime.insert(built),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a runtime to create the coordination topic");
                return;
            }
        },
    };
    if let Err(e) = runtime.block_on(ensure_topic(
        &coordination.kafka,
        &coordination.topic,
        shared.subtasks,
    )) {
        tracing::warn!(error = %format!("{e:#}"), topic = %coordination.topic,
            "cannot create the coordination topic again; trying again later");
    }
}

/// The subtasks of the partitions in `list` (partitions at or above the subtask count, left by a larger layout,
/// run nothing).
fn subtasks_of(list: &rdkafka::TopicPartitionList, subtasks: u32) -> BTreeSet<u32> {
    list.elements()
        .iter()
        .filter_map(|e| u32::try_from(e.partition()).ok())
        .filter(|&p| p < subtasks)
        .collect()
}

struct GroupContext {
    shared: Arc<Shared>,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let shared = &self.shared;
        match rebalance {
            Rebalance::Assign(list) => {
                let added = subtasks_of(list, shared.subtasks);
                tracing::info!(subtasks = ?added, "the job's Kafka group assigned subtasks to this process");
                let mut state = shared.state.lock().expect("not poisoned");
                state.released.retain(|s| !added.contains(s));
                state.assigned.extend(added);
            }
            Rebalance::Revoke(list) => {
                let revoked = subtasks_of(list, shared.subtasks);
                let mut state = shared.state.lock().expect("not poisoned");
                if consumer.assignment_lost() {
                    tracing::warn!(subtasks = ?revoked,
                        "this process lost its subtasks in the job's Kafka group (it missed the session timeout): \
                         stopping them; their new owners' claims fence anything still saved here");
                    state.assigned.retain(|s| !revoked.contains(s));
                    return;
                }
                if shared.closed.load(Ordering::Relaxed) {
                    // Closing: the process stopped its subtasks before leaving; nothing to wait for.
                    state.assigned.retain(|s| !revoked.contains(s));
                    return;
                }
                tracing::info!(subtasks = ?revoked,
                    "the job's Kafka group revokes subtasks: stopping them with a final checkpoint first");
                state.revoking.extend(revoked.iter().copied());
                let deadline = Instant::now() + shared.rebalance_timeout;
                // Until every revoked subtask stopped, or the process closes (it stopped every subtask first).
                while !shared.closed.load(Ordering::Relaxed)
                    && !revoked.iter().all(|s| state.released.contains(s))
                {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        tracing::warn!(subtasks = ?revoked, timeout = ?shared.rebalance_timeout,
                            "revoked subtasks did not stop within the rebalance timeout; releasing them anyway \
                             (their new owners' claims fence this process)");
                        break;
                    }
                    state = shared
                        .released
                        .wait_timeout(state, left)
                        .expect("not poisoned")
                        .0;
                }
                state.assigned.retain(|s| !revoked.contains(s));
                state.revoking.retain(|s| !revoked.contains(s));
                state.released.retain(|s| !revoked.contains(s));
            }
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "the job's Kafka group reported a rebalance error");
            }
        }
    }
}

#[async_trait]
impl Membership for KafkaGroup {
    async fn renew(&self) -> Result<Assignment> {
        let state = self.shared.state.lock().expect("not poisoned");
        Ok(Assignment {
            held: state.assigned.clone(),
            handing: state.revoking.clone(),
            quota: state.assigned.len() - state.revoking.len(),
            members: self.shared.members.load(Ordering::Relaxed).max(1),
        })
    }

    async fn release(&self, subtask: u32) -> Result<()> {
        let mut state = self.shared.state.lock().expect("not poisoned");
        state.released.insert(subtask);
        self.shared.released.notify_all();
        Ok(())
    }

    async fn leave(&self) -> Result<()> {
        {
            // Under the state lock, so a revocation waiting for its subtasks sees it (they are stopped: the
            // process stops every subtask before it leaves) and lets the membership thread end at once.
            let _state = self.shared.state.lock().expect("not poisoned");
            self.shared.closed.store(true, Ordering::Relaxed);
            self.shared.released.notify_all();
        }
        let closed = self.closed_consumer.lock().expect("not poisoned").take();
        if let Some(closed) = closed {
            let leaving = Instant::now();
            match tokio::time::timeout(CLOSE_BOUND, closed).await {
                Ok(Ok(())) => {
                    tracing::info!(took = ?leaving.elapsed(), "left the job's Kafka group")
                }
                Ok(Err(_)) => bail!("the group membership thread panicked"),
                Err(_) => tracing::warn!(bound = ?CLOSE_BOUND,
                    "the job's Kafka group did not let this member's consumer close within the bound (a rebalance \
                     is waiting for a member that has not rejoined); leaving without it: every subtask here is \
                     stopped, and the group drops this member after its session timeout"),
            }
        }
        Ok(())
    }

    fn mode(&self) -> String {
        "kafka group".into()
    }
}

/// Creates the coordination topic with `subtasks` partitions, or adds partitions up to `subtasks`.
async fn ensure_topic(kafka: &KafkaConnection, topic: &str, subtasks: u32) -> Result<()> {
    const WITHIN: Duration = Duration::from_secs(30);
    let partitions = i32::try_from(subtasks).context("subtasks out of range")?;
    let admin: AdminClient<DefaultClientContext> = kafka
        .client_config()
        .create()
        .context("cannot create a Kafka admin client")?;
    let options = AdminOptions::new()
        .operation_timeout(Some(WITHIN))
        .request_timeout(Some(WITHIN));
    let created = admin
        .create_topics(
            &[NewTopic::new(
                topic,
                partitions,
                TopicReplication::Fixed(-1),
            )],
            &options,
        )
        .await
        .with_context(|| format!("cannot create the coordination topic {topic}"))?;
    match created.into_iter().next() {
        Some(Ok(_)) => return Ok(()),
        Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => {}
        Some(Err((_, code))) => bail!("cannot create the coordination topic {topic}: {code}"),
        None => bail!("the cluster did not answer the creation of {topic}"),
    }
    let metadata = kafka
        .topics_metadata(Some(&[topic.to_string()]), WITHIN)
        .await?;
    let now = metadata.get(topic).map_or(0, |m| m.partitions.len());
    if now >= subtasks as usize {
        return Ok(());
    }
    let grown = admin
        .create_partitions(&[NewPartitions::new(topic, subtasks as usize)], &options)
        .await
        .with_context(|| format!("cannot add partitions to {topic}"))?;
    match grown.into_iter().next() {
        Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::InvalidPartitions))) => Ok(()),
        Some(Err((_, code))) => {
            bail!("cannot add partitions to {topic} (it has {now}, the job {subtasks}): {code}")
        }
        None => bail!("the cluster did not answer adding partitions to {topic}"),
    }
}
