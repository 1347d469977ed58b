//! Who uses which transactional-id prefix: a compacted registry topic on the cluster, checked at start, so two jobs
//! configured with the same prefix do not silently fence each other's producers (FLINK-11654).
//!
//! The registry maps prefix → owner (`<job>/<sink>`). A sink claims its prefix at start: if the registry names
//! another owner, the sink refuses to start and says how to resolve it. The check and the claim are two steps, so
//! two jobs started in the same instant with the same prefix can both pass; after that, the second to start is
//! refused.

use std::time::{Duration, Instant};

use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// The registry topic.
pub const PREFIX_REGISTRY_TOPIC: &str = "_ratchet_transactional_id_prefixes";

const TIMEOUT: Duration = Duration::from_secs(30);

fn setup_error(message: &str, e: rdkafka::error::KafkaError) -> Error {
    Error::new(ErrorKind::Retryable, Phase::Setup, message.to_string()).with_source(e)
}

/// Creates the registry topic if it does not exist (compacted, one partition).
async fn ensure_topic(connection: &ClientConfig) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = connection
        .create()
        .map_err(|e| setup_error("cannot create a Kafka admin client", e))?;
    let brokers = admin
        .inner()
        .fetch_metadata(None, TIMEOUT)
        .map_err(|e| setup_error("cannot read cluster metadata", e))?
        .brokers()
        .len()
        .clamp(1, 3) as i32;
    let topic = NewTopic::new(PREFIX_REGISTRY_TOPIC, 1, TopicReplication::Fixed(brokers))
        .set("cleanup.policy", "compact");
    let results = admin
        .create_topics(
            &[topic],
            &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
        )
        .await
        .map_err(|e| setup_error("cannot create the prefix registry topic", e))?;
    match results.into_iter().next() {
        Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) | None => Ok(()),
        Some(Err((_, code))) => Err(Error::new(
            ErrorKind::Retryable,
            Phase::Setup,
            format!("cannot create topic {PREFIX_REGISTRY_TOPIC}: {code}"),
        )),
    }
}

/// The owner registered for `prefix`, reading the whole registry (it is small: one record per prefix).
fn registered_owner(connection: &ClientConfig, prefix: &str) -> Result<Option<String>> {
    let consumer: BaseConsumer = connection
        .clone()
        .set("group.id", "ratchet-prefix-registry-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .map_err(|e| setup_error("cannot create the registry reader", e))?;
    let (_, high) = consumer
        .fetch_watermarks(PREFIX_REGISTRY_TOPIC, 0, TIMEOUT)
        .map_err(|e| setup_error("cannot read the registry's watermarks", e))?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(PREFIX_REGISTRY_TOPIC, 0, Offset::Beginning)
        .map_err(|e| setup_error("cannot assign the registry", e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| setup_error("cannot assign the registry", e))?;
    let mut owner = None;
    let deadline = Instant::now() + TIMEOUT;
    let mut position = 0;
    while position < high {
        if Instant::now() > deadline {
            return Err(Error::new(
                ErrorKind::Retryable,
                Phase::Setup,
                "timed out reading the prefix registry",
            ));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                position = message.offset() + 1;
                if message.key() == Some(prefix.as_bytes()) {
                    owner = message
                        .payload()
                        .map(|p| String::from_utf8_lossy(p).into_owned());
                }
            }
            Some(Err(e)) => return Err(setup_error("cannot read the prefix registry", e)),
            None => {
                if let Ok(positions) = consumer.position()
                    && let Some(Offset::Offset(o)) =
                        positions.elements().first().map(|e| e.offset())
                {
                    position = position.max(o);
                }
            }
        }
    }
    Ok(owner)
}

/// Registers `owner` as the user of `prefix` on the cluster reached with `connection`
/// ([`KafkaSinkConfig::kafka_connection`](crate::KafkaSinkConfig::kafka_connection)), or refuses when another owner holds it.
pub async fn claim_prefix(connection: &ClientConfig, prefix: &str, owner: &str) -> Result<()> {
    ensure_topic(connection).await?;
    let (reader, key) = (connection.clone(), prefix.to_string());
    let current = connector_api::blocking(Phase::Setup, "reading the prefix registry", move || {
        registered_owner(&reader, &key)
    })
    .await??;
    match current {
        Some(holder) if holder == owner => Ok(()),
        Some(holder) => Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "transactional_id_prefix {prefix:?} is already used by {holder:?} (registry topic \
                 {PREFIX_REGISTRY_TOPIC}); two jobs sharing a prefix fence each other's producers and abort each \
                 other's transactions. Choose another prefix for {owner:?}, or, if {holder:?} no longer runs, \
                 delete its registration (produce a record with key {prefix:?} and a null value to \
                 {PREFIX_REGISTRY_TOPIC})"
            ),
        )),
        None => {
            let producer: FutureProducer = connection
                .clone()
                .set("enable.idempotence", "true")
                .create()
                .map_err(|e| setup_error("cannot create the registry writer", e))?;
            producer
                .send(
                    FutureRecord::to(PREFIX_REGISTRY_TOPIC)
                        .key(prefix)
                        .payload(owner),
                    TIMEOUT,
                )
                .await
                .map_err(|(e, _)| setup_error("cannot register the transactional-id prefix", e))?;
            Ok(())
        }
    }
}
