//! `ratchet check-config` for a Kafka sink: the cluster answers, the topic is there (or the broker creates topics
//! on first write), the transaction timeout is within what the broker allows. Changes nothing: no producer, no
//! transactional id, no registry entry, no topic.

use std::time::Duration;

use connector_api::{DeliveryGuarantee, Error, ErrorKind, Phase, Result, SinkCheck};

use crate::KafkaSinkConfig;
use crate::broker::{broker_configs, check_transaction_timeout};

/// How long the cluster may take to answer.
const WITHIN: Duration = Duration::from_secs(15);

/// Checks `config` (settings already parsed) run with `delivery`.
///
/// # Errors
/// [`Config`](ErrorKind::Config) for settings that cannot work (a prefix, a pool size, a missing topic on a broker
/// that does not create topics, a transaction timeout above the broker's maximum); retryable when no broker
/// answers within 15 s (naming the address).
pub(crate) async fn check(
    config: KafkaSinkConfig,
    delivery: DeliveryGuarantee,
) -> Result<SinkCheck> {
    let config = config.resolve_env()?;
    config.validate()?;
    let transactional = delivery != DeliveryGuarantee::AtLeastOnce;
    let kafka = config.kafka_connection()?;
    let brokers = kafka.check_reachable(WITHIN).await?;
    let settings = broker_configs(
        &kafka.client_config(),
        &["transaction.max.timeout.ms", "auto.create.topics.enable"],
    )
    .await?;
    let topic = match kafka.topic_metadata(&config.topic, WITHIN).await? {
        Some(topic) => format!(
            "topic {} has {} partition(s)",
            config.topic,
            topic.partitions.len()
        ),
        None if settings
            .get("auto.create.topics.enable")
            .map(String::as_str)
            == Some("true") =>
        {
            format!(
                "topic {} does not exist yet: the broker creates it on the first write (auto.create.topics.enable); \
             create it yourself to choose its partitions and retention",
                config.topic
            )
        }
        None => {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "topic {} does not exist on {}, and the broker does not create topics \
                     (auto.create.topics.enable = false): create it first",
                    config.topic,
                    kafka.bootstrap_servers()
                ),
            ));
        }
    };
    let timeout = if transactional {
        let broker_max = settings
            .get("transaction.max.timeout.ms")
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Fatal,
                    Phase::Setup,
                    "the broker does not report transaction.max.timeout.ms",
                )
            })?;
        check_transaction_timeout(config.transaction_timeout, broker_max)?;
        format!(
            "; transaction timeout {:?} within the broker's {broker_max:?}",
            config.transaction_timeout
        )
    } else {
        String::new()
    };
    Ok(SinkCheck {
        summary: format!(
            "settings valid; {brokers} broker(s) at {} answer; {topic}{timeout}",
            kafka.bootstrap_servers()
        ),
        transaction_timeout: (delivery == DeliveryGuarantee::ExactlyOnce)
            .then_some(config.transaction_timeout),
    })
}
