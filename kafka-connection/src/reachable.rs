//! Whether the cluster answers at all, within a bound: a job or a tool reports an unreachable or misconfigured
//! broker up front, naming the address, instead of waiting in librdkafka's reconnect loop without a word.

use std::time::Duration;

use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::producer::{BaseProducer, Producer};

use crate::KafkaConnection;

impl KafkaConnection {
    /// Fetches the cluster's metadata (brokers only) with this connection's settings, waiting at most `within`.
    /// Returns the number of brokers the cluster reports.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) naming the bootstrap servers and what to check (the address, that the
    /// broker runs, its listener and the TLS/SASL settings) when no broker answers in time;
    /// [`Config`](ErrorKind::Config) when the settings cannot make a client.
    pub async fn check_reachable(&self, within: Duration) -> Result<usize> {
        let bootstrap = self.bootstrap_servers().to_string();
        let producer: BaseProducer = self.client_config().create().map_err(|e| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("cannot create a Kafka client for {bootstrap}"),
            )
            .with_source(e)
        })?;
        let fetched = connector_api::blocking(Phase::Setup, "the metadata request", move || {
            producer
                .client()
                .fetch_metadata(None, within)
                .map(|metadata| metadata.brokers().len())
        })
        .await?;
        fetched.map_err(|e| {
            Error::new(
                ErrorKind::Retryable,
                Phase::Setup,
                format!(
                    "no Kafka broker at {bootstrap} answered within {within:?}: check the address and port, that \
                     the broker is running (locally: scripts/services.sh up kafka), and that its listener matches \
                     the security.protocol / ssl.* / sasl.* settings"
                ),
            )
            .with_source(e)
        })
    }
}
