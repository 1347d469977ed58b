//! What the broker allows: its `transaction.max.timeout.ms`, read at start so a too-long `transaction_timeout`
//! fails with a message instead of an InitProducerId error at the first checkpoint.

use std::collections::BTreeMap;
use std::time::Duration;

use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

const TIMEOUT: Duration = Duration::from_secs(30);

fn admin_error(message: &str, e: rdkafka::error::KafkaError) -> Error {
    Error::new(ErrorKind::Retryable, Phase::Setup, message.to_string()).with_source(e)
}

/// The broker's `transaction.max.timeout.ms` (read from one broker of the cluster reached with `connection`,
/// [`KafkaSinkConfig::kafka_connection`](crate::KafkaSinkConfig::kafka_connection)).
pub async fn broker_max_transaction_timeout(connection: &ClientConfig) -> Result<Duration> {
    let configs = broker_configs(connection, &["transaction.max.timeout.ms"]).await?;
    let value = configs.get("transaction.max.timeout.ms").ok_or_else(|| {
        Error::new(
            ErrorKind::Fatal,
            Phase::Setup,
            "the broker does not report transaction.max.timeout.ms",
        )
    })?;
    let millis: u64 = value.parse().map_err(|e| {
        Error::new(
            ErrorKind::Fatal,
            Phase::Setup,
            format!("transaction.max.timeout.ms is {value:?}"),
        )
        .with_source(e)
    })?;
    Ok(Duration::from_millis(millis))
}

/// The values of `names` in the configuration of one broker of the cluster reached with `connection` (names the
/// broker does not report are absent).
pub(crate) async fn broker_configs(
    connection: &ClientConfig,
    names: &[&str],
) -> Result<BTreeMap<String, String>> {
    let admin: AdminClient<DefaultClientContext> = connection
        .create()
        .map_err(|e| admin_error("cannot create a Kafka admin client", e))?;
    let metadata = admin
        .inner()
        .fetch_metadata(None, TIMEOUT)
        .map_err(|e| admin_error("cannot read cluster metadata", e))?;
    let broker = metadata
        .brokers()
        .first()
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Setup,
                "the cluster reports no brokers",
            )
        })?
        .id();
    let results = admin
        .describe_configs(
            [&ResourceSpecifier::Broker(broker)],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .map_err(|e| admin_error("cannot describe the broker configuration", e))?;
    let resource = results
        .into_iter()
        .next()
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Setup,
                "DescribeConfigs returned nothing",
            )
        })?
        .map_err(|code| {
            Error::new(
                ErrorKind::Fatal,
                Phase::Setup,
                format!("DescribeConfigs of broker {broker} failed: {code:?}"),
            )
        })?;
    Ok(names
        .iter()
        .filter_map(|name| {
            let value = resource.get(name)?.value.clone()?;
            Some((name.to_string(), value))
        })
        .collect())
}

/// Refuses a `transaction_timeout` above what the broker allows, naming both settings.
pub(crate) fn check_transaction_timeout(configured: Duration, broker_max: Duration) -> Result<()> {
    if configured <= broker_max {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Config,
        Phase::Setup,
        format!(
            "transaction_timeout ({configured:?}) exceeds the broker's transaction.max.timeout.ms ({broker_max:?}): \
             the broker would refuse the producer. Lower transaction_timeout (it must still cover checkpoint \
             interval + restart time) or raise transaction.max.timeout.ms on the brokers"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_above_the_broker_maximum_is_refused_naming_both() {
        let secs = Duration::from_secs;
        assert!(check_transaction_timeout(secs(600), secs(900)).is_ok());
        let err = check_transaction_timeout(secs(3600), secs(900)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(
            err.to_string().contains("transaction.max.timeout.ms"),
            "{err}"
        );
    }
}
